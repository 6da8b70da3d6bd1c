"""Drop-in ``torch.nn.LSTM``, ``GRU`` and ``RNN``: same constructor, same call, one flat param.

``LSTM(10, 20, num_layers=2, batch_first=True)`` is called as ``model(input, hx)`` and
returns ``(output, (h_n, c_n))`` (``(output, h_n)`` for GRU and RNN), exactly as
PyTorch's, PackedSequence in giving PackedSequence out. Underneath is one parameter,
``params``, in cuDNN's layout; ``from_torch`` and ``to_torch`` convert exactly both ways.

As in PyTorch, ``h_0``/``c_0`` and ``h_n``/``c_n`` are ``[num_layers·D, batch, ·]`` even
when ``batch_first=True`` (the module transposes them for the batch-major op).
"""

from __future__ import annotations

import warnings

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .. import convert
from .base import FlatRNN


class _DropIn(FlatRNN):
    """What LSTM, GRU and RNN share; `_kind` is the ``torch.nn`` class name."""

    _kind = ""

    def __init__(self, rnn_mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0,
                 device=None, dtype=None):
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or \
                not 0 <= dropout <= 1:
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             f"probability of an element being zeroed, got {dropout!r}")
        if dropout == 1:
            raise ValueError("dropout: cuDNN needs dropout < 1, got 1")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          "non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=3)
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable "
                             f"projections, got {proj_size}")
        if proj_size >= hidden_size:
            raise ValueError(f"proj_size has to be smaller than hidden_size, got proj_size="
                             f"{proj_size} and hidden_size={hidden_size}")
        super().__init__(rnn_mode, input_size, hidden_size, num_layers,
                         bidirectional=bidirectional, num_proj=proj_size, dropout=dropout,
                         bias=bias, device=device, dtype=dtype)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.batch_first, self.bidirectional, self.proj_size = batch_first, bidirectional, proj_size

    # ------------------------------------------------------------------ conversion

    @classmethod
    def from_torch(cls, module):
        """The same network as PyTorch `module` (its weights copied exactly).

        Parameters
        ----------
        module : torch.nn.LSTM, GRU or RNN
            Of the class this one replaces.
        """
        if type(module).__name__ != cls._kind or not isinstance(module, torch.nn.RNNBase):
            raise TypeError(f"module: expected torch.nn.{cls._kind}, got "
                            f"{type(module).__module__}.{type(module).__qualname__}")
        params, _ = convert.from_torch(module)
        first = next(module.parameters())
        ours = cls(*cls._constructor_args(module), device=first.device, dtype=first.dtype)
        with torch.no_grad():
            ours.params.copy_(params)
        return ours.train(module.training)

    def to_torch(self):
        """The PyTorch module computing the same function (weights copied exactly)."""
        reference = convert.to_torch(self.params.detach(), **self.attrs)
        first = self.params
        module = getattr(torch.nn, self._kind)(*self._constructor_args(self), device=first.device,
                                               dtype=first.dtype)
        state = {k: v for k, v in reference.state_dict().items() if self.bias or "bias" not in k}
        module.load_state_dict(state)
        return module.train(self.training)

    @staticmethod
    def _constructor_args(module):
        return (module.input_size, module.hidden_size, module.num_layers, module.bias,
                module.batch_first, float(module.dropout), module.bidirectional)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A checkpoint of the torch.nn module (weight_ih_l0, ...) loads too: converted here.
        names = [k for k in state_dict if k.startswith(prefix)
                 and k[len(prefix):].startswith(("weight_ih_l", "weight_hh_l", "weight_hr_l",
                                                 "bias_ih_l", "bias_hh_l"))]
        if names and prefix + "params" not in state_dict:
            reference = getattr(torch.nn, self._kind)(*self._constructor_args(self),
                                                      dtype=self.params.dtype)
            reference.load_state_dict({k[len(prefix):]: state_dict.pop(k) for k in names})
            state_dict[prefix + "params"] = convert.from_torch(reference)[0]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def flatten_parameters(self):
        """Nothing to do: the weights are one flat buffer already (for nn.LSTM code)."""

    # ------------------------------------------------------------------ the call

    def forward(self, input, hx=None, *, sequence_lengths=None):
        """Run the RNN, as ``torch.nn.{LSTM,GRU,RNN}.forward``.

        One addition: `sequence_lengths` (``[B]`` integers, a CPU tensor or a list) with a
        padded 3-D input does what packing does — output zero past each length, ``h_n``
        the state after each sequence's last step — without ``PackedSequence``, whose
        packing ``torch.compile(fullgraph=True)`` cannot trace.
        """
        if isinstance(input, PackedSequence):
            if sequence_lengths is not None:
                raise TypeError("sequence_lengths: a PackedSequence carries its lengths; "
                                "give one or the other")
            return self._forward_packed(input, hx)
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a torch.Tensor or PackedSequence, got "
                            f"{type(input).__qualname__}")
        if input.dim() not in (2, 3):
            raise ValueError(f"input: expected a 2-D (unbatched) or 3-D tensor, got "
                             f"{input.dim()}-D of shape {tuple(input.shape)}")
        batched = input.dim() == 3
        if not batched:  # [T, I]: a batch of one, states without a batch axis
            input = input.unsqueeze(1)
            hx = None if hx is None else _map_states(hx, _unbatched_state)
        time_major = not (self.batch_first and batched)
        batch = input.shape[1] if time_major else input.shape[0]
        if sequence_lengths is not None:
            if not batched:
                raise ValueError("sequence_lengths: expected with 3-D (batched) input only, "
                                 "got unbatched 2-D input")
            if not isinstance(sequence_lengths, torch.Tensor):
                sequence_lengths = torch.as_tensor(sequence_lengths, dtype=torch.int64)
        output, h_n, c_n = self._call(input, hx, batch, sequence_lengths, time_major, batched)
        if not batched:
            output, h_n, c_n = output.squeeze(1), h_n.squeeze(1), c_n.squeeze(1)
        return output, self._state_result(h_n, c_n)

    def _forward_packed(self, packed, hx):
        padded, lengths = pad_packed_sequence(packed)  # time-major, the caller's batch order
        output, h_n, c_n = self._call(padded, hx, padded.shape[1], lengths, True, True)
        # Pack in the input's own order, so that its sorted/unsorted indices stay valid.
        order = packed.sorted_indices
        if order is not None:
            output, lengths = output.index_select(1, order), lengths[order.cpu()]
        data = pack_padded_sequence(output, lengths, enforce_sorted=True).data
        result = PackedSequence(data, packed.batch_sizes, packed.sorted_indices,
                                packed.unsorted_indices)
        return result, self._state_result(h_n, c_n)

    def _call(self, data, hx, batch, lengths, time_major, batched):
        self._check_data(data)
        h0, c0 = self._initial_states(data, hx, batch, batched)
        if not time_major:  # the op's batch-major states are [B, L·D, ·]
            h0, c0 = h0.transpose(0, 1), None if c0 is None else c0.transpose(0, 1)
        output, h_n, c_n = self.run(data, h0, c0, lengths, time_major)
        if not time_major:
            h_n = h_n.transpose(0, 1).contiguous()
            c_n = c_n.transpose(0, 1).contiguous() if c0 is not None else c_n
        return output, h_n, c_n

    def _check_data(self, data):
        if data.shape[-1] != self.input_size:
            raise ValueError(f"input: expected size(-1) == input_size={self.input_size}, got "
                             f"shape {tuple(data.shape)}")
        _same_kind("input", data, self.params, "the module's parameters")

    def _initial_states(self, data, hx, batch, batched):
        LD, H = self.num_layers * self.num_directions, self.hidden_size
        P = self.proj_size or H
        lstm = self._kind == "LSTM"
        if hx is None:
            zeros = lambda width: torch.zeros(LD, batch, width, dtype=data.dtype,
                                              device=data.device)
            return zeros(P), zeros(H) if lstm else None
        if lstm and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
            raise TypeError(f"hx: expected a tuple (h_0, c_0) of tensors for an LSTM, got "
                            f"{type(hx).__qualname__}")
        if not lstm and not isinstance(hx, torch.Tensor):
            raise TypeError(f"hx: expected a tensor for {self._kind}, got {type(hx).__qualname__}")
        states = list(hx) if lstm else [hx]
        names = ["hx[0] (h_0)", "hx[1] (c_0)"] if lstm else ["hx"]
        for name, state, width in zip(names, states, [P, H]):
            if not isinstance(state, torch.Tensor):
                raise TypeError(f"{name}: expected a tensor, got {type(state).__qualname__}")
            if tuple(state.shape) != (LD, batch, width):
                shown = lambda shape: tuple(shape) if batched else tuple(shape)[::2]
                raise ValueError(
                    f"{name}: expected shape {shown((LD, batch, width))} ([num_layers·"
                    f"num_directions, {'batch, ' if batched else ''}"
                    f"{'proj_size' if width != H else 'hidden_size'}]"
                    f"{'; not batch-first even with batch_first=True' if self.batch_first else ''}"
                    f"), got {shown(state.shape)}")
            _same_kind(name, state, data, "input")
        return states[0], states[1] if lstm else None

    def _state_result(self, h_n, c_n):
        return (h_n, c_n) if self._kind == "LSTM" else h_n

    def extra_repr(self):
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0),
                              ("bidirectional", False), ("proj_size", 0)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        return text


def _map_states(hx, function):
    if isinstance(hx, (tuple, list)):
        return type(hx)(function(s) if isinstance(s, torch.Tensor) else s for s in hx)
    return function(hx) if isinstance(hx, torch.Tensor) else hx


def _unbatched_state(state):
    if state.dim() != 2:
        raise ValueError(f"hx: for unbatched (2-D) input, expected 2-D states [num_layers·"
                         f"num_directions, hidden_size], got shape {tuple(state.shape)}")
    return state.unsqueeze(1)


def _same_kind(name, tensor, reference, what):
    if tensor.dtype != reference.dtype:
        raise TypeError(f"{name}: expected dtype {reference.dtype} (that of {what}), got "
                        f"{tensor.dtype}")
    if tensor.device != reference.device:
        raise TypeError(f"{name}: expected device {reference.device} (that of {what}), got "
                        f"{tensor.device}")


class LSTM(_DropIn):
    """Drop-in ``torch.nn.LSTM`` (same arguments, same call and results).

    Parameters
    ----------
    input_size, hidden_size : int
    num_layers : int, default 1
    bias : bool, default True
        False keeps every bias at zero (cuDNN always has biases; they get no gradient).
    batch_first : bool, default False
        ``[B, T, ·]`` input and output; states stay ``[num_layers·D, B, ·]``.
    dropout : float, default 0.0
        Between layers in training mode; a fresh mask each call.
    bidirectional : bool, default False
    proj_size : int, default 0
    device, dtype
    """

    _kind = "LSTM"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("lstm", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, proj_size, device, dtype)

    @staticmethod
    def _constructor_args(module):
        return _DropIn._constructor_args(module) + (module.proj_size,)


class GRU(_DropIn):
    """Drop-in ``torch.nn.GRU``; arguments as ``LSTM``'s, without ``proj_size``."""

    _kind = "GRU"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None):
        super().__init__("gru", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 0, device, dtype)


class RNN(_DropIn):
    """Drop-in ``torch.nn.RNN``: ``nonlinearity`` "tanh" or "relu", else as ``GRU``."""

    _kind = "RNN"

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nonlinearity: expected 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__("rnn_" + nonlinearity, input_size, hidden_size, num_layers, bias,
                         batch_first, dropout, bidirectional, 0, device, dtype)
        self.nonlinearity = nonlinearity

    @staticmethod
    def _constructor_args(module):
        args = _DropIn._constructor_args(module)
        return args[:3] + (module.nonlinearity,) + args[3:]
