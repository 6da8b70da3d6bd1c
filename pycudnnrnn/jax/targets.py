"""The handlers XLA calls for pycudnnrnn's FFI targets, on the CPU and on CUDA.

``pycudnnrnn.jax`` lowers ``rnn`` to two custom calls whose contract is fixed here
(brackets: only for LSTM, or only when ``has_lengths``):

``pycudnnrnn_forward``
    operands ``input, input_h, [input_c], params, [sequence_lengths]``;
    results ``output, output_h, [output_c], reserve_space, workspace``.
``pycudnnrnn_backprop``
    operands ``input, input_h, [input_c], params, [sequence_lengths], output, output_h,
    [output_c], output_backprop, output_h_backprop, [output_c_backprop], reserve_space``;
    results ``input_backprop, input_h_backprop, [input_c_backprop], params_backprop,
    workspace``.

Attributes of both: the op's ``rnn_mode, input_mode, direction`` (strings), ``dropout``
(f64), ``seed, seed2, num_proj`` (i64), ``time_major, is_training, has_lengths`` (pred).

A handler reads the call frame (``pycudnnrnn.jax.xla_ffi``), views XLA's buffers as arrays
without a copy (NumPy on the host; CuPy on XLA's device, with XLA's stream current, on
CUDA) and runs the cached ``RNNPlan`` for them (``pycudnnrnn.plan.for_call``, the
functional API's cache) with XLA's result buffers as ``out=`` and XLA's workspace: the
results are written in place. ``reserve_space`` and ``workspace`` are sized at trace
time by ``buffer_sizes`` for JAX's default device (its platform, and on CUDA its GPU); a
plan uses their first bytes (backprop's copy of the reserve space lives in the
workspace). A CUDA plan
that runs in place (time-major, every row full) takes XLA's buffers by address instead
(``RNNPlan.forward_at`` and ``backprop_at``), with no view, once their shapes and dtype
are found to be the plan's (``RNNPlan.describes``). On the GPU,
every temporary the run needs beyond these (ragged padding, rows of length 0,
batch-major states, a workspace where XLA's is too small) comes from XLA's allocator
(``xla_ffi.Scratch``) and goes back to it when the call ends: none from CuPy's pool,
behind the back of an XLA that preallocates most of the GPU. (A plan built on a cache
miss keeps its own few buffers, from CuPy's pool: they outlive the call.) Errors (for
example lengths out of range, known only when a traced ``sequence_lengths`` arrives)
become XLA errors with our message.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math

import numpy as np

from ..core import blas, dtypes
from ..core.arrays import BackpropAddresses, ForwardAddresses
from ..core.config import Attributes
from . import xla_ffi
from .xla_ffi import DataType

FORWARD = "pycudnnrnn_forward"
BACKPROP = "pycudnnrnn_backprop"
CHECK_LENGTHS = "pycudnnrnn_check_lengths"
WARN_LENGTHS = "pycudnnrnn_warn_lengths"

#: The op attributes every call carries, with the types they are lowered as.
OP_ATTRIBUTES = ("rnn_mode", "input_mode", "direction", "dropout", "seed", "seed2",
                 "num_proj", "time_major")


def operand_names(target: str, lstm: bool, has_lengths: bool) -> list:
    """Names of a target's operands, in call order."""
    names = ["input", "input_h"] + (["input_c"] if lstm else []) + ["params"]
    names += ["sequence_lengths"] if has_lengths else []
    if target == BACKPROP:
        names += ["output", "output_h"] + (["output_c"] if lstm else [])
        names += ["output_backprop", "output_h_backprop"]
        names += (["output_c_backprop"] if lstm else []) + ["reserve_space"]
    return names


def result_names(target: str, lstm: bool) -> list:
    """Names of a target's results, in call order."""
    if target == FORWARD:
        return ["output", "output_h"] + (["output_c"] if lstm else []) + \
            ["reserve_space", "workspace"]
    return ["input_backprop", "input_h_backprop"] + (["input_c_backprop"] if lstm else []) + \
        ["params_backprop", "workspace"]


#: XLA's data types as NumPy dtypes (a function for the ones NumPy lacks; ml_dtypes, which
#: holds bfloat16, is a dependency of jax, so present wherever XLA calls us).
_DTYPES = {DataType.F16: np.dtype(np.float16), DataType.F32: np.dtype(np.float32),
           DataType.F64: np.dtype(np.float64), DataType.BF16: dtypes.bfloat16,
           DataType.S32: np.dtype(np.int32), DataType.S64: np.dtype(np.int64),
           DataType.U32: np.dtype(np.uint32), DataType.U64: np.dtype(np.uint64),
           DataType.U8: np.dtype(np.uint8)}


def numpy_dtype(data_type: DataType) -> np.dtype:
    """The NumPy dtype of an XLA data type this library handles (TypeError otherwise)."""
    dtype = _DTYPES.get(data_type)
    if dtype is None:
        raise TypeError(f"XLA data type {data_type.name} is not one pycudnnrnn handles")
    return dtype() if callable(dtype) else dtype


class _Call:
    """One call frame, read: op attributes, operands and results by name."""

    def __init__(self, call_frame, target: str):
        attrs = xla_ffi.attributes(call_frame)
        self.op = {name: attrs[name] for name in OP_ATTRIBUTES}
        self.lstm = self.op["rnn_mode"] == "lstm"
        self.is_training = attrs["is_training"]
        operands, results = xla_ffi.buffers(call_frame)
        names = operand_names(target, self.lstm, attrs["has_lengths"])
        outs = result_names(target, self.lstm)
        if len(operands) != len(names) or len(results) != len(outs):
            raise ValueError(f"{target}: expected {len(names)} operands and {len(outs)} "
                             f"results, got {len(operands)} and {len(results)}")
        self.operands = dict(zip(names, operands))
        self.results = dict(zip(outs, results))


def _flat_lengths(lengths, max_time):
    """Lengths as the plan takes them, ``[B]``. Under ``vmap`` they arrive ``[N, ..., B]``
    (the other operands fold N into the batch): checked first, so that an error names the
    vmapped element and the index within it, not an index into the folded batch."""
    if lengths is None or lengths.ndim == 1:
        return lengths
    from ..core import checks
    flat = lengths.reshape(-1)
    try:
        return checks.check_lengths(flat, flat.shape[0], max_time)
    except ValueError:
        bad = np.flatnonzero((flat < 0) | (flat > max_time))[0]
        *element, b = np.unravel_index(bad, lengths.shape)
        element = tuple(map(int, element))
        raise ValueError(f"sequence_lengths: expected values in [0, {max_time}] (max_time), "
                         f"got {int(flat[bad])} at index {b} of vmapped element "
                         f"{element[0] if len(element) == 1 else element}") from None


def _prefix(buffer, nbytes, name):
    """The first `nbytes` of an XLA byte buffer sized for every platform."""
    if nbytes > buffer.shape[0]:
        raise ValueError(f"{name}: this call needs {nbytes} bytes, XLA allocated "
                         f"{buffer.shape[0]} (sized at trace time for the platform of "
                         f"JAX's default device: run the call there, or trace it under "
                         f"jax.default_device for the device it runs on)")
    return buffer[:nbytes]


def buffer_sizes(problem, cuda: bool, forward=False, device: int = 0) -> tuple[int, int]:
    """``(reserve_space, workspace)`` bytes to allocate at trace time for `problem`, on
    CUDA (the cuDNN plan on CUDA device `device`: the one the call will run on, JAX's
    default device, whose GPU may ask for other sizes than another's) or the CPU; with
    `forward`, the workspace of the forward call alone (cuDNN's forward workspace,
    without backprop's reserve copy).

    Lengths are unknown then (``problem`` has none: every row runs, the most a plan can
    need); a handler uses the first bytes its plan needs. Sized for one platform, not
    the larger of both: the NumPy backend keeps 16-bit data's reserve in float32, twice
    cuDNN's, and XLA preallocates most of the GPU.
    """
    from ..plan import buffer_nbytes
    return buffer_nbytes(problem, device if cuda else None, forward)


class _Described:
    """What a plan's checks and cache key read of an XLA buffer: shape, ndim and dtype."""

    __slots__ = ("shape", "ndim", "dtype")

    def __init__(self, buffer: xla_ffi.Buffer):
        self.shape, self.ndim = buffer.shape, len(buffer.shape)
        self.dtype = numpy_dtype(buffer.dtype)


def _run(call_frame, target: str, place):
    """Run one call frame through the cached plan for its arrays, on `place`'s device,
    writing straight into XLA's result buffers."""
    from .. import plan as plans
    call = _Call(call_frame, target)
    with place:
        operands = dict(call.operands)
        lengths = operands.pop("sequence_lengths", None)
        lengths = _flat_lengths(
            None if lengths is None else place.host_lengths(place.array(lengths)),
            operands["input"].shape[0 if call.op["time_major"] else 1])
        described = {n: _Described(b) for n, b in (*operands.items(), *call.results.items())}
        for name in ("input_c", "output_c", "output_c_backprop"):
            described.setdefault(name, None)  # not LSTM
        plan = plans.for_call(described, lengths,
                              Attributes(**call.op, is_training=call.is_training), place.device)
        with place.temporaries():  # not the plan's build: its buffers outlive the call
            if not (place.device is not None and plan.runs_in_place and
                    (target == FORWARD or plan.is_training) and
                    plan.describes(described, target == BACKPROP) and
                    _at_addresses(plan, call.operands, call.results, target)):
                _checked(plan, call, target, place)


def _at_addresses(plan, operands: dict, results: dict, target: str) -> bool:
    """Run `plan` on XLA's buffers' addresses (no CuPy view of them: each costs several
    microseconds, most of a tiny call's host time). False, having run nothing, where a
    reserve space is too small: the checked run says so."""
    workspace = results["workspace"]

    def at(name, buffers):
        return buffers[name].data if name in buffers else 0  # (a cell state: LSTM only)

    if target == FORWARD:
        reserve, training = results["reserve_space"], plan.is_training
        if training and reserve.shape[0] < plan.reserve_nbytes:
            return False
        # As in _checked: masks depend on the seed alone, for XLA's rematerialisation.
        plan.forward_at(ForwardAddresses(
            operands["input"].data, operands["input_h"].data, at("input_c", operands),
            operands["params"].data, results["output"].data, results["output_h"].data,
            at("output_c", results),
            workspace.data if workspace.shape[0] >= plan.forward_workspace_nbytes else 0,
            reserve.data if training else 0), restart_dropout=True)
        return True
    reserve = operands["reserve_space"]
    if reserve.shape[0] < plan.reserve_nbytes:
        return False
    # custom_vjp hands backprop the residual of our own forward (see _checked): trusted.
    return plan.backprop_at(BackpropAddresses(
        operands["input"].data, operands["input_h"].data, at("input_c", operands),
        operands["params"].data, operands["output"].data, operands["output_backprop"].data,
        operands["output_h_backprop"].data, at("output_c_backprop", operands),
        results["input_backprop"].data, results["input_h_backprop"].data,
        at("input_c_backprop", results), results["params_backprop"].data,
        workspace.data, workspace.shape[0], reserve.data, plan.reserve_nbytes), trusted=True)


def _checked(plan, call: _Call, target: str, place):
    """Run `plan` on views of XLA's buffers, through the plan's checks."""
    a = {n: place.array(b) for n, b in call.operands.items() if n != "sequence_lengths"}
    out = {n: place.array(b) for n, b in call.results.items()}
    for name in ("input_c", "output_c", "output_c_backprop"):
        a.setdefault(name, None)  # not LSTM
    workspace = out.pop("workspace")
    # The forward's workspace is traced for the forward alone (buffer_sizes' forward):
    # compared with backprop's larger size it never fits, and the run took a second one.
    need = plan.forward_workspace_nbytes if target == FORWARD else plan.workspace_nbytes
    workspace = workspace[:need] if workspace.shape[0] >= need else None  # None: a temporary
    if target == FORWARD:
        reserve = _prefix(out["reserve_space"], plan.reserve_nbytes, "reserve_space") \
            if call.is_training else None
        # XLA may run a forward again (remat, jax.checkpoint) and pair its residuals
        # with the first run's results: masks depend on the seed alone, as on the CPU.
        plan.run_forward(a, out=(out["output"], out["output_h"], out.get("output_c"), reserve),
                         workspace=workspace, restart_dropout=True)
        return
    a["reserve_space"] = _prefix(a["reserve_space"], plan.reserve_nbytes, "reserve_space")
    # custom_vjp hands backprop the residual of our own forward call, so the
    # reserve space is this plan's by construction: reading its header back
    # would sync XLA's stream at every training step.
    plan.trust_reserve(a["reserve_space"])
    plan.run_backprop(a, out=(out["input_backprop"], out["input_h_backprop"],
                              out.get("input_c_backprop"), out["params_backprop"]),
                      workspace=workspace)


# --------------------------------------------------------------------------- the CPU

def host_array(buffer: xla_ffi.Buffer) -> np.ndarray:
    """A NumPy view of a host buffer (no copy)."""
    dtype = numpy_dtype(buffer.dtype)
    count = math.prod(buffer.shape)  # Python ints: np.prod costs ~10 us a buffer per call
    if count == 0 or not buffer.data:
        return np.empty(buffer.shape, dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(buffer.data)
    return np.frombuffer(raw, dtype=dtype).reshape(buffer.shape)


class _Host:
    """The CPU: XLA's host buffers as NumPy arrays; the NumPy backend's plans, run with
    one BLAS thread.

    XLA runs the call on a thread of its own CPU pool, whose other threads spin while they
    wait for work: BLAS threads of ours would contend with them for the cores and stall at
    every product they split (a jitted training step 12-19 times slower on 2 cores, with
    a spread of 10x between runs). XLA's own ops run on its pool alone; so do we.
    """

    device = None

    def __enter__(self):
        self._blas = blas.single_threaded()
        self._blas.__enter__()
        return self

    def __exit__(self, *exc):
        return self._blas.__exit__(*exc)

    array = staticmethod(host_array)

    @staticmethod
    def host_lengths(lengths):
        return lengths

    @staticmethod
    def temporaries():
        return contextlib.nullcontext()  # the NumPy backend's are host memory


def cpu_forward(call_frame):
    """``pycudnnrnn_forward`` on host buffers, with the NumPy backend."""
    _run(call_frame, FORWARD, _Host())


def cpu_backprop(call_frame):
    """``pycudnnrnn_backprop`` on host buffers, with the NumPy backend."""
    _run(call_frame, BACKPROP, _Host())


def cpu_check_lengths(call_frame):
    """``pycudnnrnn_check_lengths``: traced lengths range-checked, then copied to the
    result (which the computation reads, so XLA cannot leave the check out).

    The call of ``pycudnnrnn.jax.scan``, whose RNN is XLA's own; operand and result
    ``sequence_lengths`` (any integer type; ``[N, ..., B]`` under ``vmap``), attribute
    ``max_time`` (i64).
    """
    from ..core import checks
    max_time = xla_ffi.attributes(call_frame)["max_time"]
    (lengths,), (result,) = xla_ffi.buffers(call_frame)
    lengths = host_array(lengths)
    if lengths.ndim == 1:
        checks.check_lengths(lengths, lengths.shape[0], max_time)
    else:
        _flat_lengths(lengths, max_time)
    host_array(result)[...] = lengths


def cpu_warn_lengths(call_frame):
    """``pycudnnrnn_warn_lengths``: ``checks.warn_out_of_range_lengths`` on traced lengths
    (operand ``sequence_lengths`` [B], any integer type, ``[N, ..., B]`` under ``vmap``;
    attribute ``max_time``; no results). ``pycudnnrnn.flax`` calls it only when a length
    is out of range; a host callback there instead, even one never called, put every call
    of the program on JAX's slower dispatch (~0.6 ms a small training step)."""
    from ..core import checks
    (lengths,), _ = xla_ffi.buffers(call_frame)
    checks.warn_out_of_range_lengths(host_array(lengths),
                                     xla_ffi.attributes(call_frame)["max_time"])


# --------------------------------------------------------------------------- CUDA

#: Where a temporary from XLA starts: cudaMalloc's alignment (CuPy's pool's blocks have
#: it), which CUDA libraries and CuPy's kernels may assume; XLA promises 16 bytes at most.
_ALIGNMENT = 256


class _Device:
    """XLA's device and stream for this call, made current for CuPy (and so for cuDNN,
    whose handle follows CuPy's current stream); XLA's buffers as CuPy views; XLA's
    allocator as CuPy's for the run's temporaries."""

    def __init__(self, call_frame):
        from ..core import gpu
        self.cupy = cp = gpu.cupy()
        self.device = xla_ffi.device_ordinal(call_frame)
        self._device = cp.cuda.Device(self.device)
        self._stream = gpu.external_stream(cp, xla_ffi.stream(call_frame), self.device)
        self._scratch = xla_ffi.Scratch(call_frame)

    def __enter__(self):
        self._device.__enter__()
        self._stream.__enter__()
        return self

    def __exit__(self, *exc):
        self._stream.__exit__(*exc)
        self._device.__exit__(*exc)

    def array(self, buffer: xla_ffi.Buffer):
        """A CuPy view of a device buffer (no copy; XLA owns the memory); bfloat16 with a
        CuPy older than 14 as its bits (``dtypes.Bfloat16Bits``)."""
        cp = self.cupy
        dtype = numpy_dtype(buffer.dtype)
        storage = dtypes.storage_dtype(dtype, cp)
        nbytes = math.prod(buffer.shape) * dtype.itemsize
        array = cp.ndarray(buffer.shape, storage, self._memory(buffer.data, nbytes))
        return array if storage == dtype else dtypes.Bfloat16Bits(array)

    def _memory(self, ptr, nbytes):
        cp = self.cupy  # an empty buffer's may be null: no memory, no pool block either
        memory = cp.cuda.UnownedMemory(ptr if nbytes else 0, nbytes, None, self.device)
        return cp.cuda.MemoryPointer(memory, 0)

    def host_lengths(self, lengths):
        """Lengths steer cuDNN's descriptors, so they come to the host (a stream sync)."""
        return None if lengths is None else self.cupy.asnumpy(lengths)

    @contextlib.contextmanager
    def temporaries(self):
        """CuPy allocating from XLA (``cupy.cuda.using_allocator``, this thread only):
        whatever the run makes, in the plan or in CuPy's kernels, is XLA's memory; all of
        it goes back to XLA when the call ends, after its work is queued on XLA's stream
        (see ``xla_ffi.Scratch`` for why that is safe)."""
        try:
            with self.cupy.cuda.using_allocator(self._allocate):
                yield
        finally:
            self._scratch.free_all()

    def _allocate(self, nbytes):
        """CuPy's allocator: `nbytes` from XLA's, aligned to ``_ALIGNMENT``."""
        if not nbytes:
            return self._memory(0, 0)
        alignment = xla_ffi.Scratch.MAX_ALIGNMENT
        ptr = self._scratch.allocate(nbytes + _ALIGNMENT - alignment, alignment)
        return self._memory(-(-ptr // _ALIGNMENT) * _ALIGNMENT, nbytes)


def cuda_forward(call_frame):
    """``pycudnnrnn_forward`` on XLA's CUDA buffers, with cuDNN on XLA's stream."""
    _run(call_frame, FORWARD, _Device(call_frame))


def cuda_backprop(call_frame):
    """``pycudnnrnn_backprop`` on XLA's CUDA buffers, with cuDNN on XLA's stream."""
    _run(call_frame, BACKPROP, _Device(call_frame))


@functools.lru_cache(maxsize=None)
def handlers() -> dict:
    """``{(platform, target): handler}``; cached, so the ctypes callbacks live as long as
    the process (XLA keeps their addresses)."""
    return {("cpu", FORWARD): xla_ffi.make_handler(cpu_forward),
            ("cpu", BACKPROP): xla_ffi.make_handler(cpu_backprop),
            ("cpu", CHECK_LENGTHS): xla_ffi.make_handler(cpu_check_lengths),
            ("cpu", WARN_LENGTHS): xla_ffi.make_handler(cpu_warn_lengths),
            ("CUDA", FORWARD): xla_ffi.make_handler(cuda_forward),
            ("CUDA", BACKPROP): xla_ffi.make_handler(cuda_backprop)}
