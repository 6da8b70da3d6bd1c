"""Derivatives of the custom calls: first order by ``jax.custom_vjp``, second by
``jax.custom_jvp``, and inference's refusal.

First order: ``training`` is a ``jax.custom_vjp`` onto backprop's custom call, with
respect to input, input_h, input_c and params (lengths are integers, not
differentiable).

Second order: cuDNN (and the CPU handler) give a forward and a first-order backprop, no
derivative of either. Each custom call is a ``jax.custom_jvp`` whose primal is the call
and whose tangent comes from ``scan.rnn``, the same function in JAX's own operations: so
the first order stays the custom calls' (the tangent rules run only when a gradient is
differentiated again), and ``jvp`` of ``grad``, ``grad`` of ``grad`` and ``jax.hessian``
work, reverse over reverse too (the tangent rules are JAX operations, which JAX
transposes). Forward mode through the forward alone (``jax.jvp`` of ``rnn``) stays
refused: ``training`` is a ``custom_vjp``. Backprop's tangent is taken with respect to
the forward's inputs and the output gradients alone: its other operands (the forward's
results, reserve_space) are functions of those inputs. Tangents that are symbolic zeros
stay so (what does not move is a constant to the rules).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from ..core.config import Attributes
from . import scan, targets
from .calls import backprop_call, call_operands, checked_problem, forward_call
from .targets import BACKPROP, FORWARD


def not_differentiable(function):
    """`function`, whose gradient is refused with our message: inference keeps no
    reserve_space, on every platform (the CPU's ``scan`` could differentiate it, but a
    program that does would then fail on a GPU)."""
    wrapped = jax.custom_vjp(lambda *operands: function(*operands))

    def cannot_differentiate(*operands):
        raise ValueError("is_training: rnn(..., is_training=False) cannot be differentiated "
                         "(inference keeps no reserve_space for backprop); use "
                         "is_training=True, the default")

    def unreachable(residuals, cotangents):  # the forward rule has raised already
        raise AssertionError("unreachable")

    wrapped.defvjp(cannot_differentiate, unreachable)
    return wrapped


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def training(op: Attributes, input, input_h, input_c, params, sequence_lengths):
    """The training forward's results (output, output_h, output_c if LSTM), whose
    gradient is backprop's custom call."""
    return tuple(_forward(op, *call_operands(input, input_h, input_c, params,
                                             sequence_lengths))[:-1])


def _training_fwd(op, input, input_h, input_c, params, sequence_lengths):
    results = _forward(op, *call_operands(input, input_h, input_c, params, sequence_lengths))
    output, output_h = results[:2]
    output_c = results[2] if op.lstm else None
    reserve = results[-1]
    residuals = (input, input_h, input_c, params, sequence_lengths, output, output_h,
                 output_c, reserve)
    return tuple(r for r in (output, output_h, output_c) if r is not None), residuals


def _training_bwd(op, residuals, cotangents):
    input, input_h, input_c, params, lengths, output, output_h, output_c, reserve = residuals
    if op.lstm:
        d_output, d_output_h, d_output_c = cotangents
    else:
        (d_output, d_output_h), d_output_c = cotangents, None
    operands = call_operands(input, input_h, input_c, params, lengths)
    operands += [a for a in (output, output_h, output_c, d_output, d_output_h, d_output_c,
                             reserve) if a is not None]
    grads = _backprop(op, lengths is not None, *operands)
    d_input, d_input_h = grads[:2]
    d_input_c = grads[2] if op.lstm else None
    return d_input, d_input_h, d_input_c, grads[-1], None


training.defvjp(_training_fwd, _training_bwd)


#: The operands the tangent rules differentiate the forward with respect to.
_DIFFERENTIABLE = ("input", "input_h", "input_c", "params")


def _differentiable(op, operands):
    """``scan.rnn`` for the problem of a custom call's `operands` (by name) as a function
    of ``_DIFFERENTIABLE`` (input_c None unless LSTM): what the tangent rules
    differentiate. Refuses dropout masks, which only the custom call draws."""
    problem = checked_problem(op, *(operands[k] for k in _DIFFERENTIABLE))
    lengths = operands["sequence_lengths"]
    if problem.dropout_layers:
        raise NotImplementedError(
            "pycudnnrnn.jax: a second derivative (jax.hessian, jvp or grad of a gradient, a "
            "gradient penalty) through dropout between layers is not available: the masks "
            "are drawn inside the custom call (by cuDNN, or the NumPy backend on the CPU) "
            "and cannot be read back, and other masks would differentiate another function. "
            "Differentiate twice a call with dropout=0.0, or one-layer calls with masks drawn "
            "between them by JAX (what pycudnnrnn.flax's modules do)")
    lengths = None if lengths is None else lengths.astype(jnp.int32)
    return lambda input, input_h, input_c, params: scan.rnn(
        problem, input, input_h, input_c, params, lengths)


def _split_operands(names, operands):
    """``{name: operand}`` for the custom call's operand `names`, input_c None unless LSTM."""
    found = dict(zip(names, operands))
    found.setdefault("input_c", None)
    found.setdefault("sequence_lengths", None)
    return found


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _forward(op: Attributes, *operands):
    """The forward custom call, differentiable in forward mode (see above)."""
    return tuple(forward_call(op, *operands))


def _forward_jvp(op, primals, tangents):
    results = tuple(forward_call(op, *primals))
    names = targets.operand_names(FORWARD, op.lstm, len(primals) == (5 if op.lstm else 4))
    a, t = _split_operands(names, primals), _split_operands(names, tangents)
    keys = _DIFFERENTIABLE
    moving = _moving(a, t, keys)
    if not moving:
        return results, _symbolic_zeros(results)
    function = _differentiable(op, a)

    def forward(*values):
        given = {**a, **dict(zip(moving, values))}
        return function(*(given[k] for k in keys))[:len(results) - 1]
    _, found = jax.jvp(forward, tuple(a[k] for k in moving), tuple(t[k] for k in moving))
    # reserve_space (bytes) has no tangent: a symbolic zero, which carries its type (a
    # float0 array made here would not vary over shard_map's axes as the bytes do)
    return results, (*found, *_symbolic_zeros(results[-1:]))


_forward.defjvp(_forward_jvp, symbolic_zeros=True)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _backprop(op: Attributes, has_lengths: bool, *operands):
    """The backprop custom call, differentiable in forward mode (see above)."""
    return tuple(backprop_call(op, has_lengths, *operands))


def _backprop_jvp(op, has_lengths, primals, tangents):
    results = tuple(backprop_call(op, has_lengths, *primals))
    names = targets.operand_names(BACKPROP, op.lstm, has_lengths)
    a, t = _split_operands(names, primals), _split_operands(names, tangents)
    keys = _DIFFERENTIABLE
    grads = ("output_backprop", "output_h_backprop", "output_c_backprop")
    moving = _moving(a, t, keys + grads)
    if not moving:
        return results, _symbolic_zeros(results)
    function = _differentiable(op, a)

    def gradient(*values):
        given = {**a, **dict(zip(moving, values))}
        inputs = [k for k in keys if given[k] is not None]
        outputs, pullback = jax.vjp(
            lambda *v: function(*(dict(zip(inputs, v)).get(k) for k in keys)),
            *(given[k] for k in inputs))
        cotangents = [jnp.zeros_like(o) if given.get(g) is None else given[g]
                      for g, o in zip(grads, outputs)]
        return pullback(tuple(cotangents))
    _, found = jax.jvp(gradient, tuple(a[k] for k in moving), tuple(t[k] for k in moving))
    return results, tuple(found)


_backprop.defjvp(_backprop_jvp, symbolic_zeros=True)


def _moving(operands, tangents, keys):
    """The `keys` whose operand is there and whose tangent is not a symbolic zero: what
    a tangent rule differentiates (the others are constants to it)."""
    return [k for k in keys if operands.get(k) is not None
            and not isinstance(tangents.get(k), SymbolicZero)]


def _symbolic_zeros(results):
    """A symbolic zero tangent for each of `results`."""
    return tuple(SymbolicZero(jax.typeof(r).to_tangent_aval()) for r in results)
