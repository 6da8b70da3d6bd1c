"""``rnn``, the public call: it checks its arguments, then picks the route.

On the CPU (unless dropout draws masks) the route is ``scan.rnn``, JAX's own
operations; elsewhere the custom calls, through ``derivatives.training`` (training) or
``batching.inference`` (inference, which folds under ``vmap``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..core import checks
from ..core.config import Attributes
from . import calls, scan
from .batching import inference
from .derivatives import not_differentiable, training
from .sharding import result_type, vary_alike
from .targets import CHECK_LENGTHS


def _check_lengths(sequence_lengths, batch_size, max_time):
    """Dtype and shape at trace time; values too when they are known (not traced)."""
    if sequence_lengths is None:
        return None
    if not isinstance(sequence_lengths, jax.core.Tracer):
        checks.check_lengths(np.asarray(sequence_lengths), batch_size, max_time)
    lengths = jnp.asarray(sequence_lengths)
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise TypeError(f"sequence_lengths: expected integers, got dtype {lengths.dtype}")
    if lengths.shape != (batch_size,):
        raise ValueError(f"sequence_lengths: expected shape ({batch_size},) (the batch size), "
                         f"got {lengths.shape}")
    # Traced values are range-checked by the handler: in their own integer type, so that
    # 2**32 + 3 is refused rather than wrapped to 3 (narrower types widen exactly).
    return lengths if lengths.dtype.itemsize >= 4 else lengths.astype(jnp.int32)


def _on_the_cpu(op: Attributes, problem, input, input_h, input_c, params, lengths, given,
                check_lengths=True):
    """``rnn`` in JAX's own operations (``pycudnnrnn.jax.scan``), which XLA compiles for
    the CPU. `lengths` are as ``_check_lengths`` made them, `given` as the caller passed
    them: known ones were checked at trace time, traced ones pass a custom call that
    range-checks them (unless `check_lengths` is False: the caller vouches for them)."""
    if not isinstance(given, jax.core.Tracer):  # (a constant is a tracer under jit now)
        lengths = scan.constant_lengths(given, problem.max_time)
    elif not check_lengths:
        lengths = lengths.astype(jnp.int32)
    else:
        calls.register()
        lengths = jax.ffi.ffi_call(
            CHECK_LENGTHS, result_type([lengths])(lengths.shape, lengths.dtype),
            vmap_method="broadcast_all")(lengths, max_time=np.int64(problem.max_time))
        lengths = lengths.astype(jnp.int32)  # in [0, max_time] now
    run = functools.partial(scan.rnn, problem)
    if not op.is_training:
        run = not_differentiable(run)
    return run(input, input_h, input_c, params, lengths)


def rnn(input, input_h, input_c, params, sequence_lengths=None, *, rnn_mode="lstm",
        input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0,
        num_proj=0, time_major=True, is_training=True, check_lengths=True):
    """The RNN forward as a JAX operation (TensorFlow's ``CudnnRNNV3``, minus reserve_space).

    Usable under ``jax.jit``, ``jax.grad`` (with respect to input, input_h, input_c and
    params), ``jax.vmap`` and ``jax.lax.scan``. Runs on the CPU (JAX's own operations,
    or the NumPy backend when dropout draws masks) and on CUDA GPUs (cuDNN on XLA's
    stream).

    Parameters
    ----------
    input, input_h, input_c, params, sequence_lengths
        As for ``pycudnnrnn.forward``, as JAX (or NumPy) arrays; `input_c` is ignored
        (and may be None) unless ``rnn_mode="lstm"``. `sequence_lengths` may be traced.
    rnn_mode : str, default "lstm"
        The op's attributes, with ``pycudnnrnn.forward``'s meanings and defaults.
    input_mode : str, default "linear_input"
    direction : str, default "unidirectional"
    dropout : float, default 0.0
    seed : int, default 0
    seed2 : int, default 0
    num_proj : int, default 0
    time_major : bool, default True
    is_training : bool, default True
        False: inference (no dropout; the result cannot be differentiated, and under
        ``vmap`` the mapped axis is folded into the batch: one call for all).
    check_lengths : bool, default True
        False: the caller vouches that traced `sequence_lengths` are in ``[0, max_time]``
        (lengths out of range then give unspecified results), and on the CPU the host
        callback that checks them when the computation runs (about 0.3 ms a call) is left
        out. Known lengths are checked at trace time either way.

    Returns
    -------
    output, output_h, output_c : jax.Array
        As ``pycudnnrnn.forward`` returns them; output_c is empty ``(0,)`` unless LSTM.
    """
    op = Attributes(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj,
                    time_major, is_training)
    lstm = rnn_mode == "lstm"
    input, input_h, params = (jnp.asarray(a) if a is not None else None
                              for a in (input, input_h, params))
    input_c = jnp.asarray(input_c) if lstm and input_c is not None else None
    problem = calls.checked_problem(op, input, input_h, input_c, params)
    op = checks.check_attributes(op)  # (valid by now: plain Python values, hashable)
    lengths = _check_lengths(sequence_lengths, problem.batch_size, problem.max_time)
    input, input_h, input_c, params, lengths = vary_alike(input, input_h, input_c, params,
                                                          lengths)
    empty_c = jnp.zeros((0,), problem.dtype)
    if calls.default_platform() == "cpu" and scan.applies(problem):
        return _on_the_cpu(op, problem, input, input_h, input_c, params, lengths,
                           sequence_lengths, check_lengths)
    if op.is_training:
        results = training(op, input, input_h, input_c, params, lengths)
    else:  # inference draws no masks: one cached function whatever the dropout and seeds
        op = op.without_dropout()
        results = inference(op, lengths is not None)(
            *calls.call_operands(input, input_h, input_c, params, lengths))
    return tuple(results) if lstm else (results[0], results[1], empty_c)
