"""The RNN as PyTorch operators: ``torch.ops.pycudnnrnn.forward`` and ``.backprop``.

Both are ``torch.library.custom_op`` s, so ``torch.compile(fullgraph=True)``, ``torch.export``
and CUDA graphs see one opaque node per call rather than Python they cannot trace. Each
has a fake (shapes, dtypes and the reserve space's size without running anything) and the
forward has an autograd formula that calls the backprop op for just the gradients needed.

Arguments are the functional API's, with two changes for tracing: the dropout seed is a
0-d int64 tensor (a Python int would be baked into a compiled graph, so a fresh seed per
step would recompile), and ``sequence_lengths`` is an optional integer tensor.
Outputs are always fresh tensors (never views of the inputs).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch._dynamo  # noqa: F401  (see below)
from torch import Tensor

from ..checks import dropout_seed
from . import kernels

_LIB = "pycudnnrnn"

# Why torch._dynamo above: a custom op imports it on its first call, and that import (its
# torch.fx.wrap calls keep their frames) puts every caller's frame in a reference cycle, the
# user's module with them. The module then outlives its last reference until the next
# garbage collection; under DistributedDataParallel that kept the process group alive into
# interpreter exit, where gloo aborted. Imported here, the cost (about a second) moves from
# the first call to this import, with no user frames on the stack (when this package is
# imported at module level, as usual).


@torch.library.custom_op(f"{_LIB}::forward", mutates_args=())
def forward(input: Tensor, input_h: Tensor, input_c: Optional[Tensor], params: Tensor,
            sequence_lengths: Optional[Tensor], seed: Tensor, rnn_mode: str, input_mode: str,
            direction: str, dropout: float, num_proj: int, time_major: bool,
            is_training: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``pycudnnrnn.forward``: (output, output_h, output_c, reserve_space)."""
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, num_proj, time_major)
    outputs = kernels.run_forward(input, input_h, input_c, params, sequence_lengths, seed, attrs,
                                  is_training)
    return tuple(_fresh(o, list(_tensors(input, input_h, input_c, params))) for o in outputs)


@forward.register_fake
def _forward_fake(input, input_h, input_c, params, sequence_lengths, seed, rnn_mode, input_mode,
                  direction, dropout, num_proj, time_major, is_training):
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, num_proj, time_major)
    problem = kernels.problem(input, input_h, input_c, params, attrs, is_training)
    c = problem.config
    output = input.new_empty(problem.data_shape(c.num_dirs * c.state_size))
    output_c = input_c.new_empty(input_c.shape) if c.is_lstm else input.new_empty((0,))
    nbytes = kernels.reserve_nbytes(problem, input.device)
    if nbytes is None:  # only the device knows (cuDNN): a size the graph learns at run time
        nbytes = torch.library.get_ctx().new_dynamic_size()
    reserve = input.new_empty((nbytes,), dtype=torch.uint8)
    return output, input_h.new_empty(input_h.shape), output_c, reserve


@torch.library.custom_op(f"{_LIB}::backprop", mutates_args=())
def backprop(input: Tensor, input_h: Tensor, input_c: Optional[Tensor], params: Tensor,
             sequence_lengths: Optional[Tensor], seed: Tensor, output: Tensor, output_h: Tensor,
             output_c: Tensor, output_backprop: Tensor, output_h_backprop: Tensor,
             output_c_backprop: Tensor, reserve_space: Tensor, rnn_mode: str, input_mode: str,
             direction: str, dropout: float, num_proj: int, time_major: bool,
             gradients: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``pycudnnrnn.backprop``; the gradients `gradients` leaves out are empty ``(0,)``."""
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, num_proj, time_major)
    lstm = rnn_mode == "lstm"
    grads = kernels.run_backprop(input, input_h, input_c if lstm else None, params,
                                 sequence_lengths, seed, output, output_h,
                                 output_c if lstm else None, output_backprop, output_h_backprop,
                                 output_c_backprop if lstm else None, reserve_space, attrs,
                                 gradients)
    given = list(_tensors(input, input_h, input_c, params, output, output_h, output_c,
                          output_backprop, output_h_backprop, output_c_backprop, reserve_space))
    return tuple(input.new_empty((0,)) if g is None else _fresh(g, given) for g in grads)


@backprop.register_fake
def _backprop_fake(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                   output_c, output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                   rnn_mode, input_mode, direction, dropout, num_proj, time_major, gradients):
    data, weights = gradients in ("all", "data"), gradients in ("all", "weights")
    lstm = rnn_mode == "lstm"
    like = lambda t, wanted: t.new_empty(t.shape) if wanted else input.new_empty((0,))
    return (like(input, data), like(input_h, data),
            like(input_c, data) if lstm else input.new_empty((0,)), like(params, weights))


def _attrs(rnn_mode, input_mode, direction, dropout, num_proj, time_major):
    return dict(rnn_mode=rnn_mode, input_mode=input_mode, direction=direction, dropout=dropout,
                num_proj=num_proj, time_major=time_major)


def _tensors(*tensors):
    return (t for t in tensors if t is not None)


def _fresh(result, inputs):
    # A custom op may not return an input or a view of one. The backends return new
    # arrays today; this keeps the op's contract whatever a backend or plan returns.
    if any(result.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
           for t in inputs if t.numel() and result.numel()):
        return result.clone()
    return result


# --------------------------------------------------------------------------- autograd

_INPUTS = ("input", "input_h", "input_c", "params")


def _setup_context(ctx, inputs, output):
    (input, input_h, input_c, params, sequence_lengths, seed, rnn_mode, input_mode, direction,
     dropout, num_proj, time_major, is_training) = inputs
    out, out_h, out_c, reserve = output
    ctx.attrs = _attrs(rnn_mode, input_mode, direction, dropout, num_proj, time_major)
    ctx.is_training = is_training
    ctx.lstm = rnn_mode == "lstm"
    ctx.save_for_backward(input, input_h, input_c, params, sequence_lengths, seed, out, out_h,
                          out_c, reserve)


def _backward(ctx, d_output, d_output_h, d_output_c, d_reserve):
    (input, input_h, input_c, params, sequence_lengths, seed, out, out_h, out_c,
     reserve) = ctx.saved_tensors
    if not ctx.is_training:
        raise RuntimeError("pycudnnrnn: backward needs forward with is_training=True (the "
                           "modules do this by themselves when a gradient is needed)")
    needs = dict(zip(_INPUTS, ctx.needs_input_grad[:4]))
    data = needs["input"] or needs["input_h"] or needs["input_c"]
    gradients = "all" if data and needs["params"] else "data" if data else "weights"
    zeros = lambda grad, like: torch.zeros_like(like) if grad is None else grad.contiguous()
    d_output_c = zeros(d_output_c, out_c) if ctx.lstm else out_c
    dx, dh, dc, dparams = backprop(input, input_h, input_c, params, sequence_lengths, seed, out,
                                   out_h, out_c, zeros(d_output, out), zeros(d_output_h, out_h),
                                   d_output_c, reserve, **ctx.attrs, gradients=gradients)
    keep = lambda grad, name: grad if needs[name] else None
    return (keep(dx, "input"), keep(dh, "input_h"), keep(dc, "input_c") if ctx.lstm else None,
            keep(dparams, "params")) + (None,) * 9


forward.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------- one call

def rnn(input, input_h, input_c, params, sequence_lengths=None, *, rnn_mode="lstm",
        input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0,
        num_proj=0, time_major=True, is_training=True, num_layers=None, num_units=None,
        input_size=None):
    """Differentiable ``pycudnnrnn.forward`` on tensors: ``(output, output_h, output_c)``.

    Parameters
    ----------
    input, input_h, input_c, params : torch.Tensor
        As for ``pycudnnrnn.forward`` (input_c None unless LSTM).
    sequence_lengths : tensor or list of int, optional
    rnn_mode, input_mode, direction, dropout, num_proj, time_major
        The op's attributes, see ``pycudnnrnn.forward``.
    seed, seed2 : int
        The dropout seed, as for ``pycudnnrnn.forward``; or `seed` a 0-d int64 tensor
        holding the combined 64-bit seed (what the modules pass: a traced graph then
        takes a new seed per call without recompiling).
    is_training : bool
        False runs inference: no reserve space, and no backward.
    num_layers, num_units, input_size : int, optional
        As for ``pycudnnrnn.forward``: checked against the shapes when given (the
        attribute dicts of ``pycudnnrnn.convert`` carry them).

    Returns
    -------
    output, output_h, output_c : torch.Tensor
        output_c is empty ``(0,)`` unless LSTM. Gradients flow to every tensor argument,
        computed only for those that require them.
    """
    sizes = {name: value for name, value in (("num_layers", num_layers), ("num_units", num_units),
                                             ("input_size", input_size)) if value is not None}
    if sizes:
        attrs = _attrs(rnn_mode, input_mode, direction, dropout, num_proj, time_major)
        kernels.problem(input, input_h, input_c, params, {**attrs, **sizes}, is_training)
    if sequence_lengths is not None and not isinstance(sequence_lengths, torch.Tensor):
        sequence_lengths = torch.as_tensor(sequence_lengths, dtype=torch.int64)
    if not isinstance(seed, torch.Tensor):
        combined = dropout_seed(seed, seed2)
        seed = torch.tensor(combined - (1 << 64) if combined >> 63 else combined, dtype=torch.int64)
    output, output_h, output_c, _ = forward(
        input, input_h, input_c if rnn_mode == "lstm" else None, params, sequence_lengths, seed,
        rnn_mode, input_mode, direction, float(dropout), int(num_proj), bool(time_major),
        bool(is_training))
    return output, output_h, output_c
