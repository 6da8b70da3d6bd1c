"""The handlers XLA calls for pycudnnrnn's FFI targets, on the CPU and on CUDA.

``pycudnnrnn.jax`` lowers ``rnn`` to two custom calls whose contract is fixed here
(brackets: only for LSTM, or only when ``has_lengths``):

``pycudnnrnn_forward``
    operands ``input, input_h, [input_c], params, [sequence_lengths]``;
    results ``output, output_h, [output_c], reserve_space``.
``pycudnnrnn_backprop``
    operands ``input, input_h, [input_c], params, [sequence_lengths], output, output_h,
    [output_c], output_backprop, output_h_backprop, [output_c_backprop], reserve_space``;
    results ``input_backprop, input_h_backprop, [input_c_backprop], params_backprop``.

Attributes of both: the op's ``rnn_mode, input_mode, direction`` (strings), ``dropout``
(f64), ``seed, seed2, num_proj`` (i64), ``time_major, is_training, has_lengths`` (pred).

A handler reads the call frame (``pycudnnrnn.xla_ffi``), views XLA's buffers as arrays
without a copy (NumPy on the host; CuPy on XLA's device and stream on CUDA), runs the
same checks and backend as ``pycudnnrnn.forward``/``backprop``, and writes the results
into XLA's result buffers. ``reserve_space`` is allocated by XLA at the size
``pycudnnrnn.jax`` computed at trace time (the largest any registered platform needs);
a backend uses its first bytes. Errors (for example lengths out of range, known only
when a traced ``sequence_lengths`` arrives) become XLA errors with our message.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from . import checks, numpy_backend, xla_ffi
from .xla_ffi import DataType

FORWARD = "pycudnnrnn_forward"
BACKPROP = "pycudnnrnn_backprop"

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
        return ["output", "output_h"] + (["output_c"] if lstm else []) + ["reserve_space"]
    return ["input_backprop", "input_h_backprop"] + (["input_c_backprop"] if lstm else []) + \
        ["params_backprop"]


def _ml_dtypes_bfloat16():
    import ml_dtypes  # a dependency of jax, so present wherever XLA calls us
    return np.dtype(ml_dtypes.bfloat16)


#: XLA's data types as NumPy dtypes (a function for the ones NumPy lacks).
_DTYPES = {DataType.F16: np.dtype(np.float16), DataType.F32: np.dtype(np.float32),
           DataType.F64: np.dtype(np.float64), DataType.BF16: _ml_dtypes_bfloat16,
           DataType.S32: np.dtype(np.int32), DataType.S64: np.dtype(np.int64),
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

    def forward_problem(self, arrays, host_lengths):
        return checks.check_forward(arrays["input"], arrays["input_h"], arrays.get("input_c"),
                                    arrays["params"], host_lengths, **self.op,
                                    is_training=self.is_training)


def _store(name, destination, value):
    """Copy a backend result into XLA's buffer (reserve_space into its first bytes)."""
    if name == "reserve_space":
        if value.shape[0] > destination.shape[0]:
            raise ValueError(f"reserve_space: the backend needs {value.shape[0]} bytes, XLA "
                             f"allocated {destination.shape[0]}")
        destination[:value.shape[0]] = value
    elif value.size:  # non-LSTM output_c and input_c_backprop are empty: nothing to write
        destination[...] = value


def _reserve_prefix(reserve, nbytes):
    if nbytes > reserve.shape[0]:
        raise ValueError(f"reserve_space: expected at least {nbytes} bytes for this call, got "
                         f"{reserve.shape[0]}")
    return reserve[:nbytes]


# --------------------------------------------------------------------------- the CPU

def host_array(buffer: xla_ffi.Buffer) -> np.ndarray:
    """A NumPy view of a host buffer (no copy)."""
    dtype = numpy_dtype(buffer.dtype)
    count = int(np.prod(buffer.shape, dtype=np.int64))
    if count == 0 or not buffer.data:
        return np.empty(buffer.shape, dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(buffer.data)
    return np.frombuffer(raw, dtype=dtype).reshape(buffer.shape)


def cpu_forward(call_frame):
    """``pycudnnrnn_forward`` on host buffers, with the NumPy backend."""
    call = _Call(call_frame, FORWARD)
    a = {n: host_array(b) for n, b in call.operands.items()}
    problem = call.forward_problem(a, a.get("sequence_lengths"))
    results = numpy_backend.forward(problem, a["input"], a["input_h"], a.get("input_c"),
                                    a["params"])
    _store_all(call, dict(zip(("output", "output_h", "output_c", "reserve_space"), results)),
               host_array)


def cpu_backprop(call_frame):
    """``pycudnnrnn_backprop`` on host buffers, with the NumPy backend."""
    call = _Call(call_frame, BACKPROP)
    a = {n: host_array(b) for n, b in call.operands.items()}
    problem = call.forward_problem(a, a.get("sequence_lengths"))
    reserve = _reserve_prefix(a["reserve_space"], numpy_backend.reserve_nbytes(problem))
    grads = _backprop(numpy_backend.backprop, problem, a, reserve)
    _store_all(call, grads, host_array)


def _backprop(backend_backprop, problem, a, reserve):
    """Check and run a backend's backprop on named arrays; results by name."""
    empty = a["input"][:0].reshape(0)  # an empty array of the right type for non-LSTM
    args = [a["output"], a["output_h"], a.get("output_c", empty), a["output_backprop"],
            a["output_h_backprop"], a.get("output_c_backprop", empty)]
    checks.check_backprop(problem, *args, reserve)
    results = backend_backprop(problem, a["input"], a["input_h"], a.get("input_c"),
                               a["params"], *args, reserve)
    return dict(zip(("input_backprop", "input_h_backprop", "input_c_backprop",
                     "params_backprop"), results))


def _store_all(call, values, view):
    for name, buffer in call.results.items():
        _store(name, view(buffer), values[name])


# --------------------------------------------------------------------------- CUDA

def cuda_sizes(problem) -> int:
    """Bytes of the cuDNN backend's reserve_space for `problem` (0 when not training).

    The one place that asks the cuDNN backend for sizes: at trace time (lengths unknown,
    so every row counts: the most cuDNN can need) and in the backprop handler (lengths
    known). Needs a GPU.
    """
    if not problem.is_training:
        return 0
    from . import cudnn_backend
    cupy = cudnn_backend._cupy()
    call = cudnn_backend._Call(cupy, problem, training=True)
    return cudnn_backend._HEADER_BYTES + (call.reserve_bytes if call.batch else 0)


class _Device:
    """XLA's device and stream for this call, made current for CuPy (and so for cuDNN,
    whose handle follows CuPy's current stream)."""

    def __init__(self, call_frame):
        from . import cudnn_backend
        self.cupy = cp = cudnn_backend._cupy()
        self.ordinal = xla_ffi.device_ordinal(call_frame)
        self.device = cp.cuda.Device(self.ordinal)
        self.stream = cp.cuda.ExternalStream(xla_ffi.stream(call_frame), self.ordinal)

    def __enter__(self):
        self.device.__enter__()
        self.stream.__enter__()
        return self

    def __exit__(self, *exc):
        self.stream.__exit__(*exc)
        self.device.__exit__(*exc)

    def array(self, buffer: xla_ffi.Buffer):
        """A CuPy view of a device buffer (no copy; XLA owns the memory)."""
        cp = self.cupy
        dtype = numpy_dtype(buffer.dtype)
        count = int(np.prod(buffer.shape, dtype=np.int64))
        if count == 0 or not buffer.data:
            return cp.empty(buffer.shape, dtype)
        memory = cp.cuda.UnownedMemory(buffer.data, count * dtype.itemsize, None, self.ordinal)
        return cp.ndarray(buffer.shape, dtype, cp.cuda.MemoryPointer(memory, 0))

    def host_lengths(self, lengths):
        """Lengths steer cuDNN's descriptors, so they come to the host (a stream sync)."""
        return None if lengths is None else self.cupy.asnumpy(lengths)


def cuda_forward(call_frame):
    """``pycudnnrnn_forward`` on XLA's CUDA buffers, with the cuDNN backend on XLA's stream."""
    from . import cudnn_backend
    call = _Call(call_frame, FORWARD)
    with _Device(call_frame) as device:
        a = {n: device.array(b) for n, b in call.operands.items()}
        problem = call.forward_problem(a, device.host_lengths(a.get("sequence_lengths")))
        results = cudnn_backend.forward(problem, a["input"], a["input_h"], a.get("input_c"),
                                        a["params"])
        _store_all(call, dict(zip(("output", "output_h", "output_c", "reserve_space"),
                                  results)), device.array)


def cuda_backprop(call_frame):
    """``pycudnnrnn_backprop`` on XLA's CUDA buffers, with the cuDNN backend on XLA's stream."""
    from . import cudnn_backend
    call = _Call(call_frame, BACKPROP)
    with _Device(call_frame) as device:
        a = {n: device.array(b) for n, b in call.operands.items()}
        problem = call.forward_problem(a, device.host_lengths(a.get("sequence_lengths")))
        reserve = _reserve_prefix(a["reserve_space"], cuda_sizes(problem))
        grads = _backprop(cudnn_backend.backprop, problem, a, reserve)
        _store_all(call, grads, device.array)


@functools.lru_cache(maxsize=None)
def handlers() -> dict:
    """``{(platform, target): handler}``; cached, so the ctypes callbacks live as long as
    the process (XLA keeps their addresses)."""
    return {("cpu", FORWARD): xla_ffi.make_handler(cpu_forward),
            ("cpu", BACKPROP): xla_ffi.make_handler(cpu_backprop),
            ("CUDA", FORWARD): xla_ffi.make_handler(cuda_forward),
            ("CUDA", BACKPROP): xla_ffi.make_handler(cuda_backprop)}
