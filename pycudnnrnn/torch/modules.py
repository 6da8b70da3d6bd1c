"""Drop-in ``torch.nn.LSTM``, ``GRU`` and ``RNN``, subclasses of ``torch.nn.RNNBase``.

``LSTM(10, 20, num_layers=2, batch_first=True)`` is built and called as PyTorch's and
carries exactly its parameters (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``, …, in
``_flat_weights`` order), so state dicts go both ways, name-based initialisation,
parameter groups, parametrizations and pruning apply, and ``isinstance(m, RNNBase)``
holds. Only ``forward`` is ours: one ``pycudnnrnn`` op per call (``torch.compile`` with
``fullgraph=True`` traces it; ``torch.nn``'s own RNNs graph-break there).

The weights are views of one flat buffer in cuDNN's layout (``flatten_parameters``, on
every device, as PyTorch does on CUDA only), so a call passes that buffer to the op
without a copy and each weight's ``.grad`` is a view of one flat gradient. ``params`` is
that buffer (read and write) and ``params_grad`` the flat gradient, for work in
TensorFlow's layout; ``from_torch`` and ``to_torch`` convert exactly both ways.

As in PyTorch, ``h_0``/``c_0`` and ``h_n``/``c_n`` are ``[num_layers·D, batch, ·]`` even
when ``batch_first=True`` (the module transposes them for the batch-major op).
"""

from __future__ import annotations

import math
import warnings

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..core import layout
from ..core.checks import make_config
from ..core.config import Attributes
from . import flat_weights
from .errors import InputTypeError, InputValueError
from .functional import check_devices, lengths_tensor
from .ops import autocast_dtype
from .base import SeededRNN


class _DropIn(SeededRNN, torch.nn.RNNBase):
    """What LSTM, GRU and RNN share; `_kind` is the ``torch.nn`` class name."""

    _kind = ""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0,
                 device=None, dtype=None):
        # RNNBase checks the arguments as torch.nn does, makes the named parameters, lays
        # them out in one buffer (our flatten_parameters) and initialises them.
        super().__init__(mode, input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)
        self._init_seed(None)
        self.register_load_state_dict_post_hook(_flatten_after_load)

    # ------------------------------------------------------------------ the flat buffer

    @property
    def rnn_mode(self) -> str:
        """The op's ``rnn_mode``: "lstm", "gru", "rnn_tanh" or "rnn_relu"."""
        return self.mode.lower()

    @property
    def attrs(self) -> dict:
        """``rnn_mode, num_layers, num_units, input_size, direction, num_proj`` of
        ``params``, as ``pycudnnrnn.params_to_canonical`` and ``convert`` take them."""
        return dict(rnn_mode=self.rnn_mode, num_layers=self.num_layers,
                    num_units=self.hidden_size, input_size=self.input_size,
                    direction="bidirectional" if self.bidirectional else "unidirectional",
                    num_proj=self.proj_size)

    def _layout(self):
        """((offset, shape) of each weight, size) of the flat params, in cuDNN's layout."""
        # From the configuration, not the weights' shapes: under torch.jit.trace those are
        # traced tensors, and offsets summed from them would be recorded, not computed.
        config = make_config(input_mode="linear_input", **self.attrs)
        return flat_weights.layout_slots(config, self.bias), layout.params_size(config)

    def _weights(self):
        # Looked up at each call: torch.func.functional_call, parametrizations and
        # weight_norm give other tensors than the registered parameters.
        return [getattr(self, name) for name in self._flat_weights_names]

    def flatten_parameters(self):
        """Make the weights views of one flat buffer in cuDNN's layout (any device).

        As PyTorch's ``flatten_parameters`` does on CUDA; here on every device. A call
        then passes the buffer to the op without a copy. Nothing to do when the weights
        are such views already, or are not all plain parameters of one dtype and device
        (a parametrization: each call then concatenates them once).
        """
        names = getattr(self, "_flat_weights_names", ())
        weights = [self._parameters.get(name) for name in names]
        # Plain parameters only: a tensor subclass (FSDP2's sharded DTensor) is not ours to
        # re-point into a buffer; each call then concatenates the weights it is given.
        if not weights or not all(type(w) is torch.nn.Parameter for w in weights):
            return
        first = weights[0]
        if any(w.dtype != first.dtype or w.device != first.device for w in weights):
            return
        slots, size = self._layout()
        on_meta = first.device.type == "meta"  # no storage to compare: lay out again
        flat = None if on_meta else flat_weights.one_buffer(weights, slots, size)
        if flat is not None:
            self._flat_buffer = flat
            return
        # Zeros: with bias=False the biases cuDNN always has stay zero.
        buffer = torch.zeros(size, dtype=first.dtype, device=first.device)
        with torch.no_grad():
            for w, (offset, shape) in zip(weights, slots):
                view = buffer[offset:offset + w.numel()].view(shape)
                view.copy_(w)
                # The view's strides, not the weight's own: a transposed weight (a TF or
                # Keras kernel, `.data = w.t()`) would read the buffer permuted.
                w.set_(buffer.untyped_storage(), offset, shape, view.stride())
        self._flat_buffer = buffer

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        # A weight replaced by a new Parameter (m.weight_hh_l0 = Parameter(...)) joins the
        # buffer again, while the others still are its views. Not the parameters that FSDP2
        # sets in and out around each call (its unsharded weights are views of its own
        # all-gather buffer, which it refills: re-pointed into ours, they would go stale);
        # functional_call swaps _parameters directly and is not caught here.
        if type(value) is torch.nn.Parameter and "_flat_buffer" in self.__dict__ and \
                name in self._flat_weights_names and self._others_in_buffer(name):
            self.flatten_parameters()

    def _others_in_buffer(self, name) -> bool:
        """Whether every weight but `name` is still a view of the module's flat buffer."""
        slots, size = self._layout()
        others = [(self._parameters.get(n), slot)
                  for n, slot in zip(self._flat_weights_names, slots) if n != name]
        if not others:
            return True
        if any(type(w) is not torch.nn.Parameter for w, _ in others):
            return False
        base = flat_weights.one_buffer(*map(list, zip(*others)), size)
        return base is not None and base.data_ptr() == self._flat_buffer.data_ptr()

    def _init_flat_weights(self):
        super()._init_flat_weights()
        self._forget_weight_refs()

    def _forget_weight_refs(self):
        # torch.nn keeps weak references to the weights, to notice replaced ones at each
        # call; ours looks them up at each call (_weights). A weak reference makes
        # torch.utils.swap_tensors refuse a weight: load_state_dict and from_torch in the
        # mode FSDP2 and to_empty use (torch.__future__.set_swap_module_params_on_conversion).
        self._flat_weight_refs = [None] * len(self._flat_weights_names)

    def __setstate__(self, state):
        super().__setstate__(state)
        self._forget_weight_refs()
        self.flatten_parameters()

    @property
    def params(self) -> torch.Tensor:
        """The weights as one flat tensor in cuDNN's (and TensorFlow's) params layout.

        The weights are views of it: writing into it (under ``torch.no_grad()``) writes
        the weights. With ``bias=False`` its bias slots are zero (and a call zeroes them
        again). When the weights cannot be views (a parametrization) this is a copy.
        """
        self.flatten_parameters()
        slots, size = self._layout()
        return flat_weights.flat_params([w.detach() for w in self._weights()], slots, size)

    @property
    def params_grad(self):
        """The weights' gradients as one flat tensor laid out as ``params``, or None.

        The ``.grad`` of each weight is a view of one flat gradient after a backward, and
        this is that tensor (without a copy); split it per gate with
        ``pycudnnrnn.params_to_canonical(module.params_grad, **module.attrs)``.
        """
        grads = [getattr(w, "grad", None) for w in self._weights()]
        if any(g is None for g in grads):
            return None
        slots, size = self._layout()
        return flat_weights.flat_params(grads, slots, size)

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
        first = next(module.parameters())
        ours = _built_empty(cls, cls._constructor_args(module), first)
        _copy_weights(module, ours)
        return ours.train(module.training)

    def to_torch(self):
        """The PyTorch module computing the same function (weights copied exactly)."""
        first = self._weights()[0]
        module = _built_empty(getattr(torch.nn, self._kind), self._constructor_args(self), first)
        _copy_weights(self, module)
        return module.train(self.training)

    @staticmethod
    def _constructor_args(module):
        return (module.input_size, module.hidden_size, module.num_layers, module.bias,
                module.batch_first, float(module.dropout), module.bidirectional)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A checkpoint of an earlier pycudnnrnn (one flat `params`) loads too: split here.
        flat = state_dict.get(prefix + "params")
        if flat is not None and prefix + self._flat_weights_names[0] not in state_dict:
            del state_dict[prefix + "params"]
            slots, size = self._layout()
            if flat.shape != (size,):
                raise RuntimeError(f"size mismatch for {prefix}params: expected ({size},) "
                                   f"(params_size for this configuration), got "
                                   f"{tuple(flat.shape)}")
            for name, (offset, shape) in zip(self._flat_weights_names, slots):
                state_dict[prefix + name] = flat[offset:offset + math.prod(shape)].view(shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __prepare_scriptable__(self):
        # torch.jit.script asks every module this first: refuse with what works instead.
        raise RuntimeError(
            f"pycudnnrnn.torch.{self._kind}: torch.jit.script cannot compile its forward, "
            f"which calls the pycudnnrnn operators from Python. Use torch.jit.trace, "
            f"torch.compile or torch.export instead; each runs it as one operator.")

    # ------------------------------------------------------------------ the call

    def forward(self, input, hx=None, sequence_lengths=None):
        """Run the RNN, as ``torch.nn.{LSTM,GRU,RNN}.forward``.

        One addition: `sequence_lengths` (``[B]`` integers, a CPU tensor or a list) with a
        padded 3-D input does what packing does — output zero past each length, ``h_n``
        the state after each sequence's last step — without ``PackedSequence``, whose
        packing ``torch.compile(fullgraph=True)`` cannot trace.
        """
        if torch.jit.is_tracing():
            # torch.jit.trace warns of every size read as a Python value; PyTorch silences
            # it for its own modules (torch.nn's checks read sizes as ours do, and a trace
            # computes its shapes from the input's), and this does for ours: for this call,
            # as a filter set at import would not survive a warnings.catch_warnings block.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=torch.jit.TracerWarning,
                                        module=r"pycudnnrnn\.")
                return self._forward(input, hx, sequence_lengths)
        return self._forward(input, hx, sequence_lengths)

    def _forward(self, input, hx, sequence_lengths):
        if isinstance(input, PackedSequence):
            if sequence_lengths is not None:
                raise TypeError("sequence_lengths: a PackedSequence carries its lengths; "
                                "give one or the other")
            return self._forward_packed(input, hx)
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a torch.Tensor or PackedSequence, got "
                            f"{type(input).__qualname__}")
        if input.dim() not in (2, 3):
            tensor = " tensor" if self._kind == "RNN" else ""  # torch.nn's words, each its own
            raise ValueError(f"{self._kind}: Expected input to be 2D or 3D, got {input.dim()}D"
                             f"{tensor} instead; input has shape {tuple(input.shape)}")
        batched = input.dim() == 3
        if not batched:  # [T, I]: a batch of one, states without a batch axis
            if sequence_lengths is not None:
                raise InputValueError("sequence_lengths: expected with 3-D (batched) input "
                                      "only, got unbatched 2-D input")
            input = input.unsqueeze(1)
        time_major = not (self.batch_first and batched)
        batch = input.shape[1] if time_major else input.shape[0]
        output, h_n, c_n = self._call(input, hx, batch, lengths_tensor(sequence_lengths),
                                      time_major, batched)
        if not batched:
            output, h_n = output.squeeze(1), h_n.squeeze(1)
            c_n = c_n.squeeze(1) if self._kind == "LSTM" else c_n
        return output, self._state_result(h_n, c_n)

    def _forward_packed(self, packed, hx):
        try:
            padded, lengths = pad_packed_sequence(packed)  # time-major, the caller's order
        except RuntimeError as error:
            if torch._C._functorch.maybe_current_level() is None:
                raise
            # torch.nn fails here too (its kernel for packed rows), with these words
            raise RuntimeError(
                f"{error}: PyTorch's packed sequences do not run under torch.func's "
                f"transforms (pycudnnrnn.torch.{self._kind} got a PackedSequence). Pass the "
                f"padded input and its lengths instead: module(padded, "
                f"sequence_lengths=lengths), which they take") from error
        output, h_n, c_n = self._call(padded, hx, padded.shape[1], lengths, True, True, packed)
        if isinstance(output, PackedSequence):  # torch.nn's own call on it (torch_kernels.packed)
            return output, self._state_result(h_n, c_n)
        # Pack in the input's own order, so that its sorted/unsorted indices stay valid.
        order = packed.sorted_indices
        if order is not None:
            output, lengths = output.index_select(1, order), lengths[order.cpu()]
        # (Its own batch_sizes, equal to the input's: ONNX's TorchScript exporter removes a
        # pad of a pack only when the pad reads both of that pack's results.)
        repacked = pack_padded_sequence(output, lengths, enforce_sorted=True)
        result = PackedSequence(repacked.data, repacked.batch_sizes, packed.sorted_indices,
                                packed.unsorted_indices)
        return result, self._state_result(h_n, c_n)

    def _call(self, data, hx, batch, lengths, time_major, batched, packed=None):
        if type(self.bidirectional) is not bool:  # torch.nn builds such a module, then its
            raise InputTypeError(                 # forward refuses it: so does ours
                f"bidirectional should be of type bool, got: "
                f"{type(self.bidirectional).__name__} (torch.nn.{self._kind} is built with it "
                f"too, and its forward refuses it)")
        weights = self._weights()
        states = self._given_states(hx, batched)  # torch.nn's order of checks
        self._check_data(data, weights, batched)
        h0, c0 = self._initial_states(data, states, batch)
        if data.shape[0 if time_major else 1] == 0:
            raise InputValueError(f"Expected sequence length to be larger than 0 in RNN; input "
                                  f"has shape {_shown(data, batched)}")
        attributes = Attributes(
            rnn_mode=self.rnn_mode,
            direction="bidirectional" if self.bidirectional else "unidirectional",
            num_proj=self.proj_size, time_major=time_major)
        # A packed batch's rows run in its own order, as torch.nn runs them: tied lengths
        # summed into the weights' gradients in another order would round otherwise.
        return self._run(data, h0, c0, weights, bool(self.bias), lengths, attributes,
                         self.num_layers, zero_states=hx is None, torch_states=True,
                         packed=packed)

    def _num_directions(self):
        return 2 if self.bidirectional else 1

    # The errors begin with torch.nn's own words, which other people's code and tests match
    # (PyTorch's among them), then say more.

    def _check_data(self, data, weights, batched):
        device = data.device
        if any(w.device != device for w in weights):  # the names only to say which
            check_devices(device, [("input", data)] + [
                (name, w) for name, w in zip(self._flat_weights_names, weights)])
        if data.is_meta:
            raise InputTypeError("input: expected a tensor with data, got a tensor on the "
                                 "meta device (it has no values to compute with)")
        if data.dtype != weights[0].dtype and autocast_dtype(device.type) is None:
            raise InputTypeError(
                f"RNN input dtype ({data.dtype}) does not match weight dtype "
                f"({weights[0].dtype}). Convert input: input.to({weights[0].dtype}), or "
                f"convert model: model.to({data.dtype})")
        if data.shape[-1] != self.input_size:
            raise InputValueError(f"input.size(-1) must be equal to input_size. Expected "
                                  f"{self.input_size}, got {data.shape[-1]}; input has shape "
                                  f"{_shown(data, batched)}")

    def _given_states(self, hx, batched):
        """`hx` as a list of tensors (h_0, and c_0 for an LSTM), their kind and number of
        dimensions checked, batched (``[L·D, 1, ·]``) for unbatched input; None for None."""
        if hx is None:
            return None
        lstm = self._kind == "LSTM"
        if lstm and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
            raise InputTypeError(f"hx: expected a tuple (h_0, c_0) of tensors for an LSTM, "
                                 f"got {type(hx).__qualname__}")
        if not lstm and not isinstance(hx, torch.Tensor):
            raise InputTypeError(f"hx: expected a tensor for {self._kind}, got "
                                 f"{type(hx).__qualname__}")
        states = list(hx) if lstm else [hx]
        for name, state in zip(_STATE_NAMES[lstm], states):
            if not isinstance(state, torch.Tensor):
                raise InputTypeError(f"{name}: expected a tensor, got "
                                     f"{type(state).__qualname__}")
        self._check_state_dims(states, batched)
        return states if batched else [s.unsqueeze(1) for s in states]

    def _initial_states(self, data, states, batch):
        """``(h_0, c_0)`` for checked `data` from ``_given_states``'s `states` (zeros for
        None), their sizes, devices and dtypes checked; c_0 None unless LSTM."""
        LD, H = self.num_layers * self._num_directions(), self.hidden_size
        P = self.proj_size or H
        lstm = self._kind == "LSTM"
        if states is None:
            zeros = lambda width: torch.zeros(LD, batch, width, dtype=data.dtype,
                                              device=data.device)
            return zeros(P), zeros(H) if lstm else None
        names = _STATE_NAMES[lstm]
        autocasting = autocast_dtype(data.device.type) is not None
        for k, (name, state, width) in enumerate(zip(names, states, [P, H])):
            try:  # torch.nn's own check and words (its unbatched sizes too), then ours
                self.check_hidden_size(state, (LD, batch, width),
                                       f"Expected hidden{f'[{k}]' if lstm else ''} size {{}}, "
                                       f"got {{}}")
            except RuntimeError as error:
                raise InputValueError(
                    f"{error}; {('h_0', 'c_0')[k]} is [num_layers·num_directions, batch, "
                    f"{'proj_size' if width != H else 'hidden_size'}]"
                    f"{', not batch-first even with batch_first=True' if self.batch_first else ''}"
                ) from None
            check_devices(data.device, [(name, state)])
            if not autocasting and state.dtype != data.dtype:
                raise InputTypeError(f"{name}: expected dtype {data.dtype} (that of input), "
                                     f"got {state.dtype}")
        return states[0], states[1] if lstm else None

    def _check_state_dims(self, states, batched):
        dims = [s.dim() for s in states]
        want = 3 if batched else 2
        if any(d != want for d in dims):
            kind = "batched 3-D" if batched else "unbatched 2-D"
            got = (f"({dims[0]}-D, {dims[1]}-D) tensors" if len(dims) == 2 else
                   f"{dims[0]}-D tensor")
            raise InputValueError(f"For {kind} input, hx{' and cx' if len(dims) == 2 else ''} "
                                  f"should also be {want}-D but got {got}")

    def _state_result(self, h_n, c_n):
        return (h_n, c_n) if self._kind == "LSTM" else h_n


_STATE_NAMES = {True: ["hx[0] (h_0)", "hx[1] (c_0)"], False: ["hx"]}  # by "is an LSTM"


def _shown(data, batched):
    """The input's shape as the caller gave it (unbatched input runs as a batch of one)."""
    return tuple(data.shape) if batched else (data.shape[0], data.shape[2])


def _built_empty(cls, args, like):
    """`cls(*args)` on the device and dtype of tensor `like`, its weights uninitialised:
    built on the meta device, so that no initialiser draws from PyTorch's generator (the
    weights are copied in next, as a deepcopy draws nothing)."""
    return cls(*args, device="meta", dtype=like.dtype).to_empty(device=like.device)


def _copy_weights(source, target):
    """`source`'s weights into `target`'s, in place (not load_state_dict: torch.nn's RNNs
    keep weak references to their weights, which the swap mode FSDP2 and to_empty use
    refuses to swap)."""
    with torch.no_grad():
        for name in source._flat_weights_names:
            getattr(target, name).copy_(getattr(source, name))


def _flatten_after_load(module, incompatible_keys):
    # load_state_dict(assign=True) puts new parameters in: one buffer again.
    module.flatten_parameters()


class LSTM(_DropIn):
    """Drop-in ``torch.nn.LSTM`` (same arguments, parameters, call and results).

    Parameters
    ----------
    input_size, hidden_size : int
    num_layers : int, default 1
    bias : bool, default True
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
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)

    @staticmethod
    def _constructor_args(module):
        return _DropIn._constructor_args(module) + (module.proj_size,)


def _no_projection(kind, options):
    if "proj_size" in options:
        raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
    if options:
        raise TypeError(f"{kind}.__init__() got an unexpected keyword argument "
                        f"{next(iter(options))!r}")


class GRU(_DropIn):
    """Drop-in ``torch.nn.GRU``; arguments as ``LSTM``'s, without ``proj_size``."""

    _kind = "GRU"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None, **unsupported):
        _no_projection("GRU", unsupported)
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, 0, device, dtype)


class RNN(_DropIn):
    """Drop-in ``torch.nn.RNN``: ``nonlinearity`` "tanh" or "relu", else as ``GRU``."""

    _kind = "RNN"

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None,
                 **unsupported):
        _no_projection("RNN", unsupported)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                             f"'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__("RNN_" + nonlinearity.upper(), input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, 0, device, dtype)

    @staticmethod
    def _constructor_args(module):
        args = _DropIn._constructor_args(module)
        return args[:3] + (module.nonlinearity,) + args[3:]
