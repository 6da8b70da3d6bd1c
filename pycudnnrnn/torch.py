"""PyTorch autograd over pycudnnrnn: a Function and an ``nn.Module`` with one flat params.

CPU tensors run on the NumPy backend and CUDA tensors on cuDNN, both through DLPack,
without copies. Gradients flow to the input, the initial
states and the params. Importing this module imports torch.
"""

from __future__ import annotations

import math

import torch

from . import api

__all__ = ["CudnnRNNFunction", "CudnnRNN", "rnn"]


def _detached(tensor):
    # Tensors that require grad cannot leave through DLPack; the graph is ours to manage.
    return None if tensor is None else tensor.detach()


class CudnnRNNFunction(torch.autograd.Function):
    """``forward``/``backprop`` as one differentiable op.

    ``apply(input, input_h, input_c, params, sequence_lengths, attrs, is_training)``
    returns ``(output, output_h, output_c)``; `attrs` is a dict of the op's attributes.
    Differentiable in input, input_h, input_c (LSTM) and params, once.
    """

    @staticmethod
    def forward(ctx, input, input_h, input_c, params, sequence_lengths, attrs, is_training):
        lengths = api.host_lengths(sequence_lengths)  # once: backward reuses them
        args = [_detached(t) for t in (input, input_h, input_c, params)]
        y, hy, cy, reserve = api.forward(*args, lengths, **attrs, is_training=is_training)
        outputs = (y, hy, cy)
        ctx.lengths, ctx.attrs, ctx.reserve = lengths, attrs, reserve
        # Kept detached: the returned tensors become part of the graph.
        ctx.backend_args, ctx.backend_outputs = args, tuple(o.detach() for o in outputs)
        ctx.lstm = input_c is not None and attrs.get("rnn_mode", "lstm") == "lstm"
        for t in outputs[2:] if not ctx.lstm else ():
            ctx.mark_non_differentiable(t)
        return outputs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, dhy, dcy):
        if ctx.reserve.shape[0] == 0:
            raise RuntimeError("CudnnRNNFunction: backward needs forward with is_training=True")
        grads = [dy.contiguous(), dhy.contiguous(), dcy.contiguous() if ctx.lstm else None]
        dx, dh, dc, dparams = api.backprop(*ctx.backend_args, ctx.lengths, *ctx.backend_outputs,
                                           *grads, ctx.reserve, **ctx.attrs)
        return dx, dh, dc if ctx.lstm else None, dparams, None, None, None


def rnn(input, input_h, input_c, params, sequence_lengths=None, *, is_training=True, **attrs):
    """Differentiable ``pycudnnrnn.forward`` on tensors: ``(output, output_h, output_c)``."""
    return CudnnRNNFunction.apply(input, input_h, input_c, params, sequence_lengths, attrs,
                                  is_training)


class CudnnRNN(torch.nn.Module):
    """A multi-layer RNN (LSTM, GRU, tanh/relu) with one flat ``params`` parameter.

    Parameters
    ----------
    input_size, hidden_size : int
    num_layers : int
    rnn_mode : {"lstm", "gru", "rnn_tanh", "rnn_relu"}
    bidirectional : bool
    input_mode : {"linear_input", "skip_input", "auto_select"}
    dropout : float
        Between layers, in training mode only.
    num_proj : int
        LSTM projection size (0 = none).
    time_major : bool
        ``[T, B, ·]`` (default) or ``[B, T, ·]`` input and output, and states
        ``[L·D, B, ·]`` or ``[B, L·D, ·]``.
    seed : int
        Dropout seed.
    device, dtype
        Of ``params``.

    Notes
    -----
    ``params`` is initialised like PyTorch's RNNs, uniformly in ±1/√hidden_size; its
    layout is cuDNN's (see ``pycudnnrnn.params_to_canonical``).
    """

    def __init__(self, input_size, hidden_size, num_layers=1, *, rnn_mode="lstm",
                 bidirectional=False, input_mode="linear_input", dropout=0.0, num_proj=0,
                 time_major=True, seed=0, device=None, dtype=None):
        super().__init__()
        self.attrs = dict(rnn_mode=rnn_mode, input_mode=input_mode,
                          direction="bidirectional" if bidirectional else "unidirectional",
                          num_proj=num_proj)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.dropout, self.time_major, self.seed = dropout, time_major, seed
        n = api.params_size(num_layers=num_layers, num_units=hidden_size, input_size=input_size,
                            **self.attrs)
        self.params = torch.nn.Parameter(torch.empty(n, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            self.params.uniform_(-bound, bound)

    @property
    def num_directions(self):
        return 2 if self.attrs["direction"] == "bidirectional" else 1

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
        lstm = self.attrs["rnn_mode"] == "lstm"
        P = self.attrs["num_proj"] or self.hidden_size
        if hx is None:
            h0 = self._zero_state(input, P)
            c0 = self._zero_state(input, self.hidden_size) if lstm else None
        elif lstm:
            h0, c0 = hx
        else:
            h0, c0 = hx, None
        attrs = dict(self.attrs, dropout=self.dropout, seed=self.seed, time_major=self.time_major)
        output, h_n, c_n = rnn(input, h0, c0, self.params, sequence_lengths,
                               is_training=self.training, **attrs)
        return (output, h_n, c_n) if lstm else (output, h_n)

    def extra_repr(self):
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                + ", ".join(f"{k}={v!r}" for k, v in self.attrs.items()))
