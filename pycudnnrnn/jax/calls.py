"""The forward and backprop custom calls as a JAX program makes them.

The handlers live in ``pycudnnrnn.jax.targets``; this module registers them with XLA
once, types the call's attributes as they read them, and sizes the results at trace
time: ``reserve_space`` is a result of the forward call and the workspace a result of
each call, so XLA allocates them, for the platform of JAX's default device (cuDNN's
sizes on a GPU, the NumPy backend's otherwise). Shapes, dtypes and attributes are
checked here too, by ``pycudnnrnn.core.checks``.
"""

from __future__ import annotations

import ctypes
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..core import checks
from ..core.config import Attributes
from ..errors import CudnnUnavailableError
from . import targets
from .sharding import result_type
from .targets import BACKPROP, FORWARD


@functools.lru_cache(maxsize=None)
def register() -> None:
    """Register the FFI targets with XLA, once per process (``rnn`` calls this)."""
    for (platform, target), handler in targets.handlers().items():
        address = ctypes.cast(handler, ctypes.c_void_p).value
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(address), platform=platform,
                                    api_version=1)


@functools.lru_cache(maxsize=None)
def has_cuda() -> bool:
    """Whether JAX sees a CUDA device."""
    try:
        return bool(jax.devices("cuda"))
    except RuntimeError:
        return False


def default_platform() -> str:
    """The platform of JAX's default device (``jax.default_device`` if set)."""
    device = jax.config.jax_default_device
    if device is None:
        return jax.default_backend()
    return device if isinstance(device, str) else device.platform


def ffi_attributes(op: Attributes, has_lengths: bool) -> dict:
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


def checked_problem(op: Attributes, input, input_h, input_c, params):
    """Check shapes, dtypes and attributes (lengths apart); the ``Problem``."""
    return checks.check_forward(input, input_h, input_c, params, None, **op.keywords())


def buffer_sizes(problem, forward=False) -> tuple[int, int]:
    """reserve_space and workspace bytes for JAX's default device (on a GPU, cuDNN's on
    that GPU: the CPU's may be twice as large, another kind of GPU's differ); with
    `forward`, the forward call's workspace (without the room backprop needs for its
    copy of the reserve space).

    The default device is JAX's: ``jax.default_device`` (a device, or a platform whose
    first local device it means), else the first local device; its CUDA ordinal in this
    process is ``local_hardware_id`` (what the handler's ``device_ordinal`` gives)."""
    if default_platform() in ("gpu", "cuda") and has_cuda():
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


def call_operands(input, input_h, input_c, params, sequence_lengths):
    """The forward call's operands, in ``targets.operand_names`` order: those given."""
    return [a for a in (input, input_h, input_c, params, sequence_lengths) if a is not None]


def forward_call(op: Attributes, *operands):
    """The forward custom call on operands in ``targets.operand_names`` order.

    Under ``vmap`` XLA makes one call per element (``pycudnnrnn.jax.batching`` folds
    inference's).
    """
    input, input_h = operands[:2]
    input_c = operands[2] if op.lstm else None
    params = operands[3 if op.lstm else 2]
    has_lengths = len(operands) == (5 if op.lstm else 4)
    problem = checked_problem(op, input, input_h, input_c, params)
    c = problem.config
    dtype = problem.dtype
    result = result_type(operands)
    results = [result(problem.data_shape(c.num_dirs * c.state_size), dtype),
               result(problem.state_shape(c.state_size), dtype)]
    if op.lstm:
        results.append(result(problem.state_shape(c.num_units), dtype))
    reserve_nbytes, workspace_nbytes = buffer_sizes(problem, forward=True)
    results += [result((reserve_nbytes,), jnp.uint8), result((workspace_nbytes,), jnp.uint8)]
    register()
    return jax.ffi.ffi_call(FORWARD, results, vmap_method="sequential")(
        *operands, **ffi_attributes(op, has_lengths))[:-1]  # the workspace is scratch


def backprop_call(op: Attributes, has_lengths: bool, *operands):
    """The backprop custom call on operands in ``targets.operand_names`` order."""
    names = targets.operand_names(BACKPROP, op.lstm, has_lengths)
    a = dict(zip(names, operands))
    result = result_type(operands)
    results = [result(a[n].shape, a[n].dtype)
               for n in ("input", "input_h") + (("input_c",) if op.lstm else ()) + ("params",)]
    problem = checked_problem(op, a["input"], a["input_h"], a.get("input_c"), a["params"])
    results.append(result((buffer_sizes(problem)[1],), jnp.uint8))
    register()
    return jax.ffi.ffi_call(BACKPROP, results, vmap_method="sequential")(
        *operands, **ffi_attributes(op.replace(is_training=True), has_lengths))[:-1]
