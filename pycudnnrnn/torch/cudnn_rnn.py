"""``CudnnRNN``: the RNN as an ``nn.Module`` with TensorFlow's attributes and call.

For ``torch.nn``'s constructor and call convention use ``pycudnnrnn.torch.LSTM``, ``GRU``
or ``RNN``; both share ``pycudnnrnn.torch.base.FlatRNN`` (dropout, eval backward, only
the gradients needed).
"""

from __future__ import annotations

import torch

from .base import FlatRNN
from .functional import rnn


class CudnnRNN(FlatRNN):
    """A multi-layer RNN (LSTM, GRU, tanh/relu) with one flat ``params`` parameter.

    Parameters
    ----------
    input_size, hidden_size : int
    num_layers : int
    rnn_mode : {"lstm", "gru", "rnn_tanh", "rnn_relu"}
    bidirectional : bool
    input_mode : {"linear_input", "skip_input", "auto_select"}
    dropout : float
        Between layers, in training mode only; a fresh mask every call.
    num_proj : int
        LSTM projection size (0 = none).
    time_major : bool
        ``[T, B, ·]`` (default) or ``[B, T, ·]`` input and output, and states
        ``[L·D, B, ·]`` or ``[B, L·D, ·]``.
    seed : int or None
        Seed of the module's cuDNN dropout state on CUDA (None: drawn from PyTorch's
        generator). CPU masks always come from PyTorch's generator, one per call.
    device, dtype
        Of ``params``.

    Notes
    -----
    ``params`` is initialised like PyTorch's RNNs, uniformly in ±1/√hidden_size; its
    layout is cuDNN's (see ``pycudnnrnn.params_to_canonical``). In eval mode a backward
    still works when a gradient is needed (the forward then keeps what backward reads,
    without dropout).
    """

    def __init__(self, input_size, hidden_size, num_layers=1, *, rnn_mode="lstm",
                 bidirectional=False, input_mode="linear_input", dropout=0.0, num_proj=0,
                 time_major=True, seed=None, device=None, dtype=None):
        super().__init__(rnn_mode, input_size, hidden_size, num_layers,
                         bidirectional=bidirectional, input_mode=input_mode, num_proj=num_proj,
                         dropout=dropout, seed=seed, device=device, dtype=dtype)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.time_major = time_major

    def _zero_state(self, input, width):
        LD = self.num_layers * self.num_directions
        B = input.shape[1] if self.time_major else input.shape[0]
        shape = (LD, B, width) if self.time_major else (B, LD, width)
        return torch.zeros(shape, dtype=input.dtype, device=input.device)

    def forward(self, input, hx=None, sequence_lengths=None):
        """Run the RNN.

        Parameters
        ----------
        input : torch.Tensor
        hx : tensor, or (h0, c0) for an LSTM, optional
            Initial states; zeros when None.
        sequence_lengths : tensor or list of int, optional

        Returns
        -------
        (output, h_n, c_n) for an LSTM, (output, h_n) otherwise.
        """
        lstm = self.config.is_lstm
        P = self.config.state_size
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a torch.Tensor, got {type(input).__qualname__}")
        if input.dim() != 3:
            axes = "[T, B, input_size]" if self.time_major else "[B, T, input_size]"
            raise ValueError(f"input: expected a 3-D tensor {axes}, got shape "
                             f"{tuple(input.shape)}")
        if hx is None:
            h0 = self._zero_state(input, P)
            c0 = self._zero_state(input, self.hidden_size) if lstm else None
        elif lstm:
            if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                raise TypeError(f"hx: expected a pair (h0, c0) of tensors for an LSTM, got "
                                f"{type(hx).__qualname__}")
            h0, c0 = hx
        else:
            h0, c0 = hx, None
        output, h_n, c_n = self.run(input, h0, c0, sequence_lengths, self.time_major)
        return (output, h_n, c_n) if lstm else (output, h_n)

    def extra_repr(self):
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                + ", ".join(f"{k}={v!r}" for k, v in self.layer_attrs.items()))


class CudnnRNNFunction:
    """The earlier autograd Function's interface, now over the ``pycudnnrnn`` ops.

    ``apply(input, input_h, input_c, params, sequence_lengths, attrs, is_training)``
    returns ``(output, output_h, output_c)``; `attrs` is a dict of the op's attributes.
    New code calls ``pycudnnrnn.torch.rnn``.
    """

    @staticmethod
    def apply(input, input_h, input_c, params, sequence_lengths, attrs, is_training):
        return rnn(input, input_h, input_c, params, sequence_lengths, is_training=is_training,
                   **attrs)
