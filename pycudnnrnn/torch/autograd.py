"""Gradients of the forward ops: one backward behind three doors.

``_backward_core`` calls the backprop op for just the gradients needed. It serves the
autograd formulas of ``forward`` and ``forward_weights`` (what ``torch.compile`` and
``torch.export`` trace, and what direct callers of the ops get) and ``_RNN``, an
``autograd.Function`` with ``setup_context`` that eager calls go through: torch.func's
transforms (``grad``, ``vjp``, ``jacrev``) need one, a custom op's autograd formula does
not compose with them, and Dynamo does not trace this kind of Function. ``apply`` picks
the door. Where backward records a graph (``create_graph=True``, torch.func), its results
are differentiable once more through ``second_order.first_order``.
"""

from __future__ import annotations

import math

import torch

from . import flat_weights, second_order
from .ops import (autocast, autocast_dtype, call_backprop, call_forward, forward,
                  forward_weights, import_dynamo, schema_attributes)


# One backward (``_backward_core``) behind three doors: the autograd formulas of the two
# forward ops (what torch.compile and torch.export trace, and direct callers of the ops
# get), and ``_RNN``, an autograd.Function for eager calls, which torch.func's transforms
# need (a custom op's autograd formula does not compose with them, and Dynamo does not
# trace this kind of Function).

class _Saved:
    """What backward needs of one forward call: its ``Attributes`` and `has_biases` (see
    ``ops``), and where each of torch.nn's weights lies in the flat gradient."""

    def __init__(self, attributes, has_biases, tensors, output, weights):
        self.attributes, self.has_biases = attributes, has_biases
        self.slots = None
        if has_biases is not None:  # where each weight's gradient lies in the flat one
            shapes = [tuple(w.shape) for w in weights]
            offsets = flat_weights.weight_offsets(shapes, has_biases, attributes.num_proj > 0)
            self.slots = list(zip(offsets, shapes))
        self.num_weights = len(weights)
        self.tensors = (*tensors, *output, *weights)


def _save(ctx, attributes, has_biases, tensors, output, weights):
    saved = _Saved(attributes, has_biases, tensors, output, weights)
    ctx.save_for_backward(*saved.tensors)
    saved.tensors = None
    ctx.pycudnnrnn = saved


def _backward_core(ctx, needs_data, needs_weights, d_output, d_output_h, d_output_c):
    """``(dx, dh, dc, weight gradients)`` for the forward saved by ``_save``:
    the backprop op's, differentiable once more (``second_order``)."""
    s = ctx.pycudnnrnn
    if not s.attributes.is_training:
        raise RuntimeError("pycudnnrnn: backward needs forward with is_training=True (the "
                           "modules do this by themselves when a gradient is needed)")
    saved = ctx.saved_tensors
    input, input_h, input_c, sequence_lengths, seed, out, out_h, out_c, reserve = saved[:9]
    weights = list(saved[9:])
    lstm = s.attributes.lstm
    gradients = "all" if needs_data and needs_weights else "data" if needs_data else "weights"

    def run(input, input_h, input_c, weights, d_output, d_output_h, d_output_c, extras):
        sequence_lengths, seed, out, out_h, out_c, reserve = extras
        zeros = lambda grad, like: torch.zeros_like(like) if grad is None else grad.contiguous()
        grads = (zeros(d_output, out), zeros(d_output_h, out_h),
                 zeros(d_output_c, out_c) if lstm else out_c)
        # The reserve is this forward's own by construction: the ops trust it (True below),
        # so CUDA reads no header back (a sync, and an error under CUDA-graph capture).
        with torch.no_grad():
            dx, dh, dc, dparams = call_backprop(
                input, input_h, input_c, weights, s.has_biases, sequence_lengths, seed,
                (out, out_h, out_c), grads, reserve, s.attributes, gradients)
            if s.has_biases is None:
                weight_grads = [dparams if needs_weights else None]
            else:
                # Views of the one flat gradient, so that each weight's .grad is one too.
                weight_grads = [dparams[o:o + math.prod(shape)].view(shape)
                                for o, shape in s.slots] if needs_weights \
                    else [None] * s.num_weights
        # The gradients not asked for are None (the ops give them empty).
        data = [dx, dh, dc if lstm else None] if needs_data else [None] * 3
        return [*data, *weight_grads]

    dx, dh, dc, *weight_grads = second_order.first_order(
        run, s.attributes, s.has_biases, (input, input_h, input_c if lstm else None), weights,
        (d_output, d_output_h, d_output_c if lstm else None),
        (sequence_lengths, seed, out, out_h, out_c, reserve))
    return dx, dh, dc, weight_grads


def _keep(grads, needs):
    return [g if need else None for g, need in zip(grads, needs)]


def _forward_setup(ctx, inputs, output):
    input, input_h, input_c, params, sequence_lengths, seed = inputs[:6]
    _save(ctx, schema_attributes(*inputs[6:]), None,
          (input, input_h, input_c, sequence_lengths, seed), output, [params])


def _forward_backward(ctx, d_output, d_output_h, d_output_c, d_reserve):
    needs = ctx.needs_input_grad
    dx, dh, dc, (dparams,) = _backward_core(ctx, any(needs[:3]), needs[3], d_output, d_output_h,
                                            d_output_c)
    return (*_keep([dx, dh, dc, dparams], needs[:4]),) + (None,) * 9


def _forward_weights_setup(ctx, inputs, output):
    (input, input_h, input_c, weights, has_biases, sequence_lengths, seed, rnn_mode, direction,
     dropout, num_proj, time_major, is_training) = inputs
    attributes = schema_attributes(rnn_mode, "linear_input", direction, dropout, num_proj,
                                   time_major, is_training)
    _save(ctx, attributes, has_biases, (input, input_h, input_c, sequence_lengths, seed), output,
          weights)


def _forward_weights_backward(ctx, d_output, d_output_h, d_output_c, d_reserve):
    needs = ctx.needs_input_grad  # needs[3]: one flag per weight
    weights_needed = list(needs[3]) if isinstance(needs[3], (list, tuple)) else \
        [needs[3]] * ctx.pycudnnrnn.num_weights
    dx, dh, dc, weight_grads = _backward_core(ctx, any(needs[:3]), any(weights_needed),
                                              d_output, d_output_h, d_output_c)
    return (*_keep([dx, dh, dc], needs[:3]), _keep(weight_grads, weights_needed)) + (None,) * 9


forward.register_autograd(_forward_backward, setup_context=_forward_setup)
forward_weights.register_autograd(_forward_weights_backward, setup_context=_forward_weights_setup)


class _RNN(torch.autograd.Function):
    """Either forward op as an autograd.Function with ``setup_context``, for torch.func.

    ``vmap`` runs the ops once per batch element (``generate_vmap_rule``). `attributes`
    (an ``Attributes``) and `has_biases` as for ``ops.call_forward``, constants to
    autograd and torch.func; `weights` ``(params,)`` with `has_biases` None, or torch.nn's
    ``_flat_weights``.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(attributes, has_biases, input, input_h, input_c, sequence_lengths, seed,
                *weights):
        return call_forward(input, input_h, input_c, weights, has_biases, sequence_lengths,
                            seed, attributes)

    @staticmethod
    def setup_context(ctx, inputs, output):
        attributes, has_biases, input, input_h, input_c, sequence_lengths, seed = inputs[:7]
        weights = inputs[7:]
        _save(ctx, attributes, has_biases, (input, input_h, input_c, sequence_lengths, seed),
              output, weights)
        ctx.save_for_forward(input, input_h, input_c, sequence_lengths, *weights)

    @staticmethod
    def backward(ctx, d_output, d_output_h, d_output_c, d_reserve):
        # attributes, has_biases, input, input_h, input_c, lengths, seed, weights
        needs = ctx.needs_input_grad
        dx, dh, dc, weight_grads = _backward_core(ctx, any(needs[2:5]), any(needs[7:]),
                                                  d_output, d_output_h, d_output_c)
        return (None, None, *_keep([dx, dh, dc], needs[2:5]), None, None,
                *_keep(weight_grads, needs[7:]))

    @staticmethod
    def jvp(ctx, _, __, d_input, d_input_h, d_input_c, d_lengths, d_seed, *d_weights):
        input, input_h, input_c, sequence_lengths, *weights = ctx.saved_tensors
        saved = ctx.pycudnnrnn
        return (*second_order.forward_jvp(saved.attributes, saved.has_biases,
                                          (input, input_h, input_c), sequence_lengths, weights,
                                          (d_input, d_input_h, d_input_c, *d_weights)), None)


def apply(input, input_h, input_c, weights, has_biases, sequence_lengths, seed, attributes):
    """The differentiable forward op on checked arguments: ``(output, output_h, output_c)``.

    Under autocast every floating argument is cast to autocast's dtype first (the casts
    are differentiable, so gradients reach float32 weights). `weights`, `has_biases` and
    `attributes` (an ``Attributes``) as for ``_RNN``.
    """
    input, input_h, input_c, weights = autocast_all(input, input_h, input_c, weights)
    return _differentiable_op(input, input_h, input_c, weights, has_biases, sequence_lengths,
                              seed, attributes)


def autocast_all(input, input_h, input_c, weights):
    """The forward's floating arguments as autocast casts them (as they are when it is
    off): ``(input, input_h, input_c, weights)``."""
    dtype = autocast_dtype(input.device.type)
    if dtype is None:
        return input, input_h, input_c, weights
    input, input_h, input_c = (autocast(t, dtype) for t in (input, input_h, input_c))
    return input, input_h, input_c, [autocast(w, dtype) for w in weights]


def _differentiable_op(input, input_h, input_c, weights, has_biases, sequence_lengths, seed,
                       attributes):
    """The forward op through the door for the caller: its own autograd formula when
    Dynamo traces, else ``_RNN``."""
    if torch.compiler.is_compiling():  # the ops' own autograd formulas: Dynamo traces them
        output, output_h, output_c, _ = call_forward(input, input_h, input_c, weights,
                                                     has_biases, sequence_lengths, seed,
                                                     attributes)
    else:
        import_dynamo()  # what the op's first call imports, on a stack of its own (ops.py)
        output, output_h, output_c, _ = _RNN.apply(attributes, has_biases, input, input_h,
                                                   input_c, sequence_lengths, seed, *weights)
    return output, output_h, output_c
