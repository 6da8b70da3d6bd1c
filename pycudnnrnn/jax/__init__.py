"""pycudnnrnn as a native JAX operation: ``jit``, ``grad``, ``vmap`` and ``lax.scan``.

On the CPU, ``rnn`` is written in JAX's own operations (``pycudnnrnn.jax.scan``), which
XLA compiles with the rest of the program; JAX differentiates, batches and shards them.
Elsewhere, and on the CPU when dropout draws masks (which only the NumPy backend's
generator gives), it lowers to two XLA custom calls (``pycudnnrnn.jax.targets``) whose
handlers are ctypes callbacks, registered with ``jax.ffi.register_ffi_target`` for the
CPU (NumPy backend on host buffers) and for CUDA (cuDNN on XLA's stream); what follows
is about them. Nothing is compiled.

* Shapes, dtypes and attributes are checked at trace time by ``pycudnnrnn.core.checks``
  (``ValueError``/``TypeError`` naming the argument); ``sequence_lengths`` is an
  operand, so it may be traced: its values are checked by the handler, and a bad one
  raises the handler's message from the computation.
* ``reserve_space`` is a result of the forward call, and the workspace a result of each
  call, so XLA allocates them. Both are sized at trace time for the platform of JAX's
  default device: cuDNN's sizes on a GPU, the NumPy backend's otherwise.
* Gradients: ``jax.custom_vjp`` onto ``pycudnnrnn.backprop``'s target, with respect to
  input, input_h, input_c and params (lengths are integers, not differentiable). Second
  derivatives (``jax.hessian``, ``jvp`` or ``grad`` of ``grad``): each custom call is a
  ``jax.custom_jvp`` whose tangent comes from ``scan`` (see "second order" below).
* ``shard_map``: the operands are made to vary over the same manual mesh axes (a
  replicated ``params`` is cast to varying, so its gradient is summed over the axes, as
  for JAX's own operations) and the results vary over them too.
* ``vmap``: inference (``is_training=False``) folds the mapped axis into the batch, one
  call for all; training maps the call sequentially, because under ``vmap(grad(...))``
  every mapped element needs its own params gradient, which a folded call (one sum over
  the whole batch) cannot give. A mapped ``params`` is always mapped sequentially.

``import pycudnnrnn`` does not import this module (nor JAX). Without JAX, importing it
raises an ``ImportError`` naming the extra, ``pip install '.[jax]'``.
"""

from __future__ import annotations

import ctypes
import functools

from ..core.extras import require as _require

_require("pycudnnrnn.jax", "jax", "jax")  # missing: an ImportError naming the extra

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.custom_derivatives import SymbolicZero

from ..core import checks
from ..core.config import Attributes
from . import scan, targets
from ..errors import CudnnUnavailableError
from .targets import BACKPROP, CHECK_LENGTHS, FORWARD

__all__ = ["rnn"]


@functools.lru_cache(maxsize=None)
def register() -> None:
    """Register the FFI targets with XLA, once per process (``rnn`` calls this)."""
    for (platform, target), handler in targets.handlers().items():
        address = ctypes.cast(handler, ctypes.c_void_p).value
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(address), platform=platform,
                                    api_version=1)


@functools.lru_cache(maxsize=None)
def _has_cuda() -> bool:
    try:
        return bool(jax.devices("cuda"))
    except RuntimeError:
        return False


def _ffi_attributes(op: Attributes, has_lengths: bool) -> dict:
    """The custom call's attributes, typed as the handlers read them.

    Only the low 32 bits of each seed reach the dropout seed
    (``(seed << 32) | (seed2 & 0xffffffff)`` in 64 bits), so only they are passed:
    any Python int fits an i64 attribute that way.
    """
    return dict(rnn_mode=op.rnn_mode, input_mode=op.input_mode,
                direction=op.direction, dropout=np.float64(op.dropout),
                seed=np.int64(op.seed & 0xFFFFFFFF), seed2=np.int64(op.seed2 & 0xFFFFFFFF),
                num_proj=np.int64(op.num_proj), time_major=np.bool_(op.time_major),
                is_training=np.bool_(op.is_training), has_lengths=np.bool_(has_lengths))


def _problem(op: Attributes, input, input_h, input_c, params):
    """Check shapes, dtypes and attributes (lengths apart); the ``Problem``."""
    return checks.check_forward(input, input_h, input_c, params, None, **op.keywords())


def _default_platform() -> str:
    """The platform of JAX's default device (``jax.default_device`` if set)."""
    device = jax.config.jax_default_device
    if device is None:
        return jax.default_backend()
    return device if isinstance(device, str) else device.platform


def _buffer_sizes(problem, forward=False) -> tuple[int, int]:
    """reserve_space and workspace bytes for JAX's default device (on a GPU, cuDNN's on
    that GPU: the CPU's may be twice as large, another kind of GPU's differ); with
    `forward`, the forward call's workspace (without the room backprop needs for its
    copy of the reserve space).

    The default device is JAX's: ``jax.default_device`` (a device, or a platform whose
    first local device it means), else the first local device; its CUDA ordinal in this
    process is ``local_hardware_id`` (what the handler's ``device_ordinal`` gives)."""
    if _default_platform() in ("gpu", "cuda") and _has_cuda():
        device = jax.config.jax_default_device
        if device is None or isinstance(device, str):
            device = jax.local_devices(backend=device)[0]
        ordinal = getattr(device, "local_hardware_id", None)
        try:
            return targets.buffer_sizes(problem, cuda=True, forward=forward,
                                        device=device.id if ordinal is None else ordinal)
        except CudnnUnavailableError:
            pass  # JAX has a GPU but we cannot use it: the CUDA handler will say why
    return targets.buffer_sizes(problem, cuda=False, forward=forward)


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


# --------------------------------------------------------------------------- the two calls

def _forward_call(op: Attributes, *operands):
    """The forward custom call on operands in ``targets.operand_names`` order.

    Under ``vmap`` XLA makes one call per element (see ``_inference`` for the fold).
    """
    input, input_h = operands[:2]
    input_c = operands[2] if op.lstm else None
    params = operands[3 if op.lstm else 2]
    has_lengths = len(operands) == (5 if op.lstm else 4)
    problem = _problem(op, input, input_h, input_c, params)
    c = problem.config
    dtype = problem.dtype
    result = _result_type(operands)
    results = [result(problem.data_shape(c.num_dirs * c.state_size), dtype),
               result(problem.state_shape(c.state_size), dtype)]
    if op.lstm:
        results.append(result(problem.state_shape(c.num_units), dtype))
    reserve_nbytes, workspace_nbytes = _buffer_sizes(problem, forward=True)
    results += [result((reserve_nbytes,), jnp.uint8), result((workspace_nbytes,), jnp.uint8)]
    register()
    return jax.ffi.ffi_call(FORWARD, results, vmap_method="sequential")(
        *operands, **_ffi_attributes(op, has_lengths))[:-1]  # the workspace is scratch


def _backprop_call(op: Attributes, has_lengths: bool, *operands):
    """The backprop custom call on operands in ``targets.operand_names`` order."""
    names = targets.operand_names(BACKPROP, op.lstm, has_lengths)
    a = dict(zip(names, operands))
    result = _result_type(operands)
    results = [result(a[n].shape, a[n].dtype)
               for n in ("input", "input_h") + (("input_c",) if op.lstm else ()) + ("params",)]
    problem = _problem(op, a["input"], a["input_h"], a.get("input_c"), a["params"])
    results.append(result((_buffer_sizes(problem)[1],), jnp.uint8))
    register()
    return jax.ffi.ffi_call(BACKPROP, results, vmap_method="sequential")(
        *operands, **_ffi_attributes(op.replace(is_training=True), has_lengths))[:-1]


# --------------------------------------------------------------------------- shard_map

def _varying(x) -> frozenset:
    """The manual mesh axes (inside ``shard_map``) over which `x` varies."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)  # JAX >= 0.10; before, aval.vma
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()))


def _vary_alike(*arrays):
    """`arrays` (None kept) cast to vary over the union of their manual mesh axes.

    A custom call has no rule for mixing a replicated operand with varying ones, so it
    gets them aligned: the cast of a replicated ``params`` transposes to a sum over the
    axes in the gradient, which is what JAX's own operations give.
    """
    present = [a for a in arrays if a is not None]
    axes = frozenset().union(*map(_varying, present))
    if not axes:
        return arrays
    cast = (lambda x, names: jax.lax.pcast(x, names, to="varying")) \
        if hasattr(jax.lax, "pcast") else jax.lax.pvary  # pvary before JAX 0.10
    return tuple(None if a is None else a if _varying(a) == axes
                 else cast(a, tuple(sorted(axes - _varying(a)))) for a in arrays)


def _result_type(operands):
    """``jax.ShapeDtypeStruct`` for a custom call's results: varying like its operands
    (XLA's custom call says nothing of mesh axes, and ``shard_map`` checks them)."""
    axes = frozenset().union(*map(_varying, operands))
    if not axes:
        return jax.ShapeDtypeStruct
    if not hasattr(jax.sharding, "ManualAxisType"):  # before JAX 0.10
        return functools.partial(jax.ShapeDtypeStruct, vma=axes)
    mesh = next(jax.typeof(x).sharding.mesh for x in operands if _varying(x))
    return functools.partial(
        jax.ShapeDtypeStruct, manual_axis_type=jax.sharding.ManualAxisType(varying=axes),
        sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


# --------------------------------------------------------------------------- vmap: folding

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
def _inference(op: Attributes, has_lengths: bool):
    """The inference forward of `op` as a ``custom_vmap`` function that folds."""
    names = targets.operand_names(FORWARD, op.lstm, has_lengths)

    @custom_vmap
    def forward(*operands):
        return tuple(_forward_call(op, *operands)[:-1])

    @forward.def_vmap
    def rule(axis_size, in_batched, *operands):
        params_mapped = in_batched[names.index("params")]
        if params_mapped:  # different weights per element: one call each
            axes = [0 if b else None for b in in_batched]
            outputs = jax.vmap(lambda *o: _forward_call(op, *o)[:-1], in_axes=axes)(*operands)
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
    return _not_differentiable(forward)


def _not_differentiable(function):
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


# --------------------------------------------------------------------------- the CPU: scan

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
        register()
        lengths = jax.ffi.ffi_call(
            CHECK_LENGTHS, _result_type([lengths])(lengths.shape, lengths.dtype),
            vmap_method="broadcast_all")(lengths, max_time=np.int64(problem.max_time))
        lengths = lengths.astype(jnp.int32)  # in [0, max_time] now
    run = functools.partial(scan.rnn, problem)
    if not op.is_training:
        run = _not_differentiable(run)
    return run(input, input_h, input_c, params, lengths)


# --------------------------------------------------------------------------- gradients

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _training(op: Attributes, input, input_h, input_c, params, sequence_lengths):
    return tuple(_forward(op, *_operands(input, input_h, input_c, params,
                                         sequence_lengths))[:-1])


def _operands(input, input_h, input_c, params, sequence_lengths):
    return [a for a in (input, input_h, input_c, params, sequence_lengths) if a is not None]


def _training_fwd(op, input, input_h, input_c, params, sequence_lengths):
    results = _forward(op, *_operands(input, input_h, input_c, params, sequence_lengths))
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
    operands = _operands(input, input_h, input_c, params, lengths)
    operands += [a for a in (output, output_h, output_c, d_output, d_output_h, d_output_c,
                             reserve) if a is not None]
    grads = _backprop(op, lengths is not None, *operands)
    d_input, d_input_h = grads[:2]
    d_input_c = grads[2] if op.lstm else None
    return d_input, d_input_h, d_input_c, grads[-1], None


_training.defvjp(_training_fwd, _training_bwd)


# --------------------------------------------------------------------------- second order
#
# cuDNN (and the CPU handler) give a forward and a first-order backprop, no derivative of
# either. Each custom call is a ``jax.custom_jvp`` whose primal is the call and whose
# tangent comes from ``scan.rnn``, the same function in JAX's own operations: so the
# first order stays the custom calls' (the tangent rules run only when a gradient is
# differentiated again), and ``jvp`` of ``grad``, ``grad`` of ``grad`` and
# ``jax.hessian`` work, reverse over reverse too (the tangent rules are JAX operations,
# which JAX transposes). Forward mode through the forward alone (``jax.jvp`` of ``rnn``)
# stays refused: ``_training`` is a ``custom_vjp``. Backprop's tangent is taken with
# respect to the forward's inputs and the output gradients alone: its other operands
# (the forward's results, reserve_space) are functions of those inputs. Tangents that
# are symbolic zeros stay so (what does not move is a constant to the rules).

#: The operands the tangent rules differentiate the forward with respect to.
_DIFFERENTIABLE = ("input", "input_h", "input_c", "params")


def _differentiable(op, operands):
    """``scan.rnn`` for the problem of a custom call's `operands` (by name) as a function
    of ``_DIFFERENTIABLE`` (input_c None unless LSTM): what the tangent rules
    differentiate. Refuses dropout masks, which only the custom call draws."""
    problem = _problem(op, *(operands[k] for k in _DIFFERENTIABLE))
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
    return tuple(_forward_call(op, *operands))


def _forward_jvp(op, primals, tangents):
    results = tuple(_forward_call(op, *primals))
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
    return tuple(_backprop_call(op, has_lengths, *operands))


def _backprop_jvp(op, has_lengths, primals, tangents):
    results = tuple(_backprop_call(op, has_lengths, *primals))
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


# --------------------------------------------------------------------------- the public op

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
    problem = _problem(op, input, input_h, input_c, params)
    op = checks.check_attributes(op)  # (valid by now: plain Python values, hashable)
    lengths = _check_lengths(sequence_lengths, problem.batch_size, problem.max_time)
    input, input_h, input_c, params, lengths = _vary_alike(input, input_h, input_c, params,
                                                           lengths)
    empty_c = jnp.zeros((0,), problem.dtype)
    if _default_platform() == "cpu" and scan.applies(problem):
        return _on_the_cpu(op, problem, input, input_h, input_c, params, lengths,
                           sequence_lengths, check_lengths)
    if op.is_training:
        results = _training(op, input, input_h, input_c, params, lengths)
    else:  # inference draws no masks: one cached function whatever the dropout and seeds
        op = op.without_dropout()
        results = _inference(op, lengths is not None)(
            *_operands(input, input_h, input_c, params, lengths))
    return tuple(results) if lstm else (results[0], results[1], empty_c)
