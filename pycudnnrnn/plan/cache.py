"""The plans the functional API and the framework adapters reuse, and the buffer sizes
framework traces ask for.

A plan costs checks, and on the GPU descriptors and a dropout state, to build; a call
costs a key. Each cache is a bounded ``LRU``; ``clear_caches`` empties them all.
"""

from __future__ import annotations

import dataclasses
import numbers

from ..core import checks, gpu
from ..core.config import Attributes, Problem
from ..core.lru import LRU
from .backend import clear_backend_caches, executor_type
from .rnn_plan import FORWARD_NAMES, RNNPlan

_plans = LRU(64)
_dropout_plans = LRU(4)  # each may hold a seed's GPU dropout states (~6 MiB)


def for_call(arrays: dict, lengths, attributes: Attributes, device, *, num_layers=None,
             num_units=None, input_size=None) -> RNNPlan:
    """The cached plan for a functional call (its arrays checked in full on a miss).

    `attributes` as the caller gave them (checked with the arrays, on a miss);
    `num_layers`, `num_units` and `input_size`, when given, are checked against the
    shapes. Where the backend reseeds a plan (the CPU's), the dropout seeds are left out
    of the key (a hit is reseeded), so training with a fresh seed per step finds its plan.
    """
    dropout = attributes.dropout
    plain = isinstance(dropout, numbers.Real) and dropout == 0
    reseed = not plain and executor_type(device).reseeds
    # The fields' values, not the dataclass: its own hash costs more, for every lookup.
    values = tuple(vars(attributes).values())
    keyed = tuple(vars(attributes.replace(seed=None, seed2=None)).values()) if reseed \
        else values
    sizes = (num_layers, num_units, input_size)
    try:  # the values' types too: True and 1 are one key, not one argument
        key = (device, arrays["input"].dtype, _shapes(arrays), lengths_key(lengths),
               gpu.get_allow_tf32(), keyed, sizes, tuple(map(type, values + sizes)))
        hash(key)
    except (TypeError, AttributeError):  # not an array, or an unhashable attribute:
        key = None                        # the checks say what is wrong

    def build():
        problem = checks.check_forward(arrays["input"], arrays["input_h"], arrays["input_c"],
                                       arrays["params"], lengths, **attributes.keywords(),
                                       num_layers=num_layers, num_units=num_units,
                                       input_size=input_size)
        return RNNPlan.from_problem(problem, device)

    if key is None:
        return build()
    cached = (_plans if plain else _dropout_plans).get(key, build)
    if not reseed:
        return cached
    return cached._with_seed(checks.dropout_seed(attributes.seed, attributes.seed2))


_adapter_plans = LRU(64)  # the same plans, by a framework adapter's own key


def for_adapter(key, build) -> RNNPlan:
    """The plan a framework adapter remembered under `key`, else ``build()`` (its call
    of ``for_call``) remembered under it: a key of the framework's own values (a
    tensor's shape and dtype objects) costs less to make per call than ``for_call``'s.
    `key` must fix everything ``for_call``'s key does (device, dtype, shapes, lengths,
    TF32, and every attribute's name, type and value). Bounded, and cleared by
    ``clear_caches`` like the functional API's plans."""
    return _adapter_plans.get(key, build)


_buffer_sizes = LRU(64)  # three ints each: no plan is kept


def buffer_nbytes(problem: Problem, device: int | None, forward=False) -> tuple[int, int]:
    """``(reserve_nbytes, workspace_nbytes)`` of a plan for `problem` on `device` (None: the
    CPU), remembered: a framework sizes its buffers at every trace, and a cuDNN plan
    costs descriptors (and, with dropout, a dropout state) to build. With `forward`,
    the workspace is ``forward_workspace_nbytes``: what a forward call alone needs."""
    def build():
        built = RNNPlan.from_problem(problem, device)
        return built.reserve_nbytes, built.workspace_nbytes, built.forward_workspace_nbytes

    if problem.lengths is not None:  # an array: not a key (framework traces have none)
        sizes = build()
    else:  # the seed fixes no size
        config = problem.config.with_dropout(problem.config.dropout, 0)
        key = (dataclasses.replace(problem, config=config), device, gpu.get_allow_tf32())
        sizes = _buffer_sizes.get(key, build)
    return sizes[0], sizes[2 if forward else 1]


def reserve_nbytes(problem: Problem, device: int | None) -> int | None:
    """Bytes of the reserve space forward returns for `problem` on `device` (None: the
    CPU) when every row runs, the most any lengths need: what a framework allocates
    when it traces a call, before any lengths are known.

    On the CPU, the NumPy backend's size: arithmetic on the shapes, so a trace's symbolic
    sizes give a symbolic answer. On CUDA, cuDNN's (``buffer_nbytes``), which it tells
    for numbers only: None while time or batch are symbolic.
    """
    if not problem.is_training:
        return 0
    traced = executor_type(device).traced_reserve_nbytes(problem)
    if traced is not None:
        return traced
    if not all(isinstance(n, int) for n in (problem.max_time, problem.batch_size)):
        return None
    return buffer_nbytes(problem, device)[0]


def _shapes(arrays):
    return tuple(None if arrays[n] is None else arrays[n].shape for n in FORWARD_NAMES)


def lengths_key(lengths):
    if lengths is None:
        return None
    return (lengths.dtype.str, lengths.shape, lengths.tobytes())


def clear_caches():
    """Drop the functional API's cached plans, the buffer sizes remembered for framework
    traces, and the cuDNN backend's cached descriptors and dropout states (freed once no
    plan you hold uses them)."""
    _plans.clear()
    _dropout_plans.clear()
    _adapter_plans.clear()
    _buffer_sizes.clear()
    clear_backend_caches()
