"""``vmap`` of inference: the mapped axis folded into the batch, one call for all.

Training maps the call sequentially (XLA's ``vmap_method="sequential"``), because under
``vmap(grad(...))`` every mapped element needs its own params gradient, which a folded
call (one sum over the whole batch) cannot give. A mapped ``params`` is always mapped
sequentially.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from ..core.config import Attributes
from . import targets
from .calls import forward_call
from .derivatives import not_differentiable
from .targets import FORWARD


def _batch_axis(name: str, time_major: bool) -> int:
    """The batch axis of an unmapped operand or result."""
    return 1 if time_major else 0


def _fold(x, axis):
    """[N, ...] with the batch at `axis` of the rest → the N rows next to the batch, merged."""
    x = jnp.moveaxis(x, 0, axis)
    shape = x.shape
    return x.reshape(shape[:axis] + (shape[axis] * shape[axis + 1],) + shape[axis + 2:])


def _unfold(x, axis, n):
    shape = x.shape
    x = x.reshape(shape[:axis] + (n, shape[axis] // n) + shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)


@functools.lru_cache(maxsize=256)
def inference(op: Attributes, has_lengths: bool):
    """The inference forward of `op` as a ``custom_vmap`` function that folds."""
    names = targets.operand_names(FORWARD, op.lstm, has_lengths)

    @custom_vmap
    def forward(*operands):
        return tuple(forward_call(op, *operands)[:-1])

    @forward.def_vmap
    def rule(axis_size, in_batched, *operands):
        params_mapped = in_batched[names.index("params")]
        if params_mapped:  # different weights per element: one call each
            axes = [0 if b else None for b in in_batched]
            outputs = jax.vmap(lambda *o: forward_call(op, *o)[:-1], in_axes=axes)(*operands)
            return tuple(outputs), (True,) * len(outputs)
        folded = []
        for name, x, mapped in zip(names, operands, in_batched):
            if name == "params":
                folded.append(x)
                continue
            if not mapped:
                x = jnp.broadcast_to(x, (axis_size,) + x.shape)
            # Lengths keep their mapped axes ([N, ..., B]; the handler reads them flat), so
            # that an error names the element and the index the caller wrote.
            folded.append(x if name == "sequence_lengths" else
                          _fold(x, _batch_axis(name, op.time_major)))
        outputs = forward(*folded)  # itself: a vmap of a vmap folds twice
        outputs = tuple(_unfold(y, _batch_axis("output", op.time_major), axis_size)
                        for y in outputs)
        return outputs, (True,) * len(outputs)

    # custom_vmap functions cannot be differentiated; say why in our words, not JAX's.
    return not_differentiable(forward)
