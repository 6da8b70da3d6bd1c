"""``shard_map``: the custom calls' operands and results vary over the same mesh axes.

Inside ``shard_map`` JAX checks which manual mesh axes each value varies over. XLA's
custom call says nothing of them, so ``vary_alike`` aligns the operands before the call
(a replicated ``params`` is cast to varying, so its gradient is summed over the axes, as
for JAX's own operations) and ``result_type`` gives the results the same axes.
"""

from __future__ import annotations

import functools

import jax


def varying(x) -> frozenset:
    """The manual mesh axes (inside ``shard_map``) over which `x` varies."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)  # JAX >= 0.10; before, aval.vma
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()))


def vary_alike(*arrays):
    """`arrays` (None kept) cast to vary over the union of their manual mesh axes.

    A custom call has no rule for mixing a replicated operand with varying ones, so it
    gets them aligned: the cast of a replicated ``params`` transposes to a sum over the
    axes in the gradient, which is what JAX's own operations give.
    """
    present = [a for a in arrays if a is not None]
    axes = frozenset().union(*map(varying, present))
    if not axes:
        return arrays
    cast = (lambda x, names: jax.lax.pcast(x, names, to="varying")) \
        if hasattr(jax.lax, "pcast") else jax.lax.pvary  # pvary before JAX 0.10
    return tuple(None if a is None else a if varying(a) == axes
                 else cast(a, tuple(sorted(axes - varying(a)))) for a in arrays)


def result_type(operands):
    """``jax.ShapeDtypeStruct`` for a custom call's results: varying like its operands
    (XLA's custom call says nothing of mesh axes, and ``shard_map`` checks them)."""
    axes = frozenset().union(*map(varying, operands))
    if not axes:
        return jax.ShapeDtypeStruct
    if not hasattr(jax.sharding, "ManualAxisType"):  # before JAX 0.10
        return functools.partial(jax.ShapeDtypeStruct, vma=axes)
    mesh = next(jax.typeof(x).sharding.mesh for x in operands if varying(x))
    return functools.partial(
        jax.ShapeDtypeStruct, manual_axis_type=jax.sharding.ManualAxisType(varying=axes),
        sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
