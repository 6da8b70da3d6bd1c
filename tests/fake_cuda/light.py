"""The light stand-in: the library's host code timed with the emulation made cheap."""

import ctypes
import types

import numpy as np

from pycudnnrnn.core import gpu
from pycudnnrnn.cudnn import capi

from .arrays import _Pointer
from .cupy import _memory_pointer, _NoContext
from .dlpack import FakeFrameworkArray
from .streams import MEMCPY_DEVICE_TO_DEVICE


def install_light(monkeypatch):
    """The stand-in GPU with its emulation made as cheap as it can be, for timing the
    library's own host code (``benchmarks/gpu_host_bench.py``); returns the FakeCudnn.

    What a plan is built from is the full stand-in's (real cuDNN descriptors, its sizes
    and weight slots); what a run pays for is not: device arrays are plain host memory
    (``LightDeviceArray``: no pool, no poison, no counters; device work is NumPy's, at
    once), streams and events are trivial (nothing queued, every event done), and
    cuDNN's compute calls and ``cudnnSetStream`` are ctypes functions built from the
    project's prototypes, bound as ``capi`` binds the real ones, over a C function that
    does nothing (``_no_op_function``): every argument is still marshalled by ctypes as
    it would be for cuDNN, and nothing is computed. Results are garbage: time, do not
    test, with it. No graph capture.
    """
    from . import install  # the full stand-in first: plans are built on it
    fake_api = install(monkeypatch)
    light = LightCupy()
    monkeypatch.setattr(gpu, "cupy", lambda: light)
    address = _no_op_function()
    for name in _LIGHT_CALLS:  # instance attributes: FakeCudnn.__getattr__ is not asked
        restype, argtypes = capi.PROTOTYPES[name]
        function = ctypes.CFUNCTYPE(restype, *argtypes)(address)
        setattr(fake_api, name, capi._checked(fake_api, name, function))
    return fake_api


_LIGHT_CALLS = ("cudnnSetStream", "cudnnRNNForward", "cudnnRNNBackwardData_v8",
                "cudnnRNNBackwardWeights_v8")


def _no_op_function() -> int:
    """The address of a C function that returns 0 and touches nothing: libm's
    ``fegetround`` (FE_TONEAREST, 0 on x86-64 and AArch64, in the default rounding
    mode). Called through a cuDNN prototype, its extra arguments are ignored (the C
    calling conventions there leave them to the caller). Else a Python callback,
    which costs more (its arguments are converted back into Python objects)."""
    import ctypes.util
    name = ctypes.util.find_library("m")
    if name:
        function = ctypes.CDLL(name).fegetround
        function.restype = ctypes.c_int
        if function() == 0:
            return ctypes.cast(function, ctypes.c_void_p).value
    _NO_OP_CALLBACKS.append(ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0))
    return ctypes.cast(_NO_OP_CALLBACKS[-1], ctypes.c_void_p).value


_NO_OP_CALLBACKS = []  # kept alive: ctypes frees a callback with its object


class _LightPointer:
    """``array.data`` of a light array: its address, read once (a non-data descriptor,
    so the instance's own ``data`` entry answers later reads)."""

    def __get__(self, array, owner=None):
        if array is None:
            return self
        pointer = _Pointer()
        try:
            pointer.ptr = ctypes.addressof(ctypes.c_char.from_buffer(array))
        except (TypeError, ValueError):  # empty, read-only or not contiguous
            pointer.ptr = array.__array_interface__["data"][0]
        array.__dict__["data"] = pointer
        return pointer


_DEVICE_0 = types.SimpleNamespace(id=0)


class LightDeviceArray(np.ndarray):
    """Host memory that says it lives on CUDA device 0: NumPy's arithmetic, at once."""

    data = _LightPointer()
    device = _DEVICE_0

    def __dlpack_device__(self):
        return (2, 0)


def _light(a):
    return a.view(LightDeviceArray) if type(a) is not LightDeviceArray else a


class _LightEvent:
    done = True

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


_DONE = _LightEvent()


class _LightStream:
    """A stream that queues nothing (work on light arrays runs at once)."""

    _next = [0x9000]

    def __init__(self, null=False, non_blocking=False, ptr=None):
        if ptr is None:
            ptr = 0 if null else _LightStream._next[0]
            _LightStream._next[0] += 0x10
        self.ptr = ptr

    def __enter__(self):
        _LIGHT_STREAMS.append(self)
        return self

    def __exit__(self, *exc):
        _LIGHT_STREAMS.pop()

    def record(self, event=None):
        return event if event is not None else _DONE

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass

    def is_capturing(self):
        return False

    def begin_capture(self, mode=None):
        raise RuntimeError("the light stand-in captures no graphs")


_LIGHT_STREAMS = [_LightStream(null=True)]


class _LightDevice:
    def __init__(self, id=0):
        self.id = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    @staticmethod
    def synchronize():
        pass


class _LightPool:
    def __init__(self):
        self.malloc = self


_LIGHT_POOL = _LightPool()


class LightCupy(types.ModuleType):
    """The CuPy slice of ``FakeCupy`` over ``LightDeviceArray`` (CuPy 14: bfloat16 held)."""

    ndarray = LightDeviceArray
    __version__ = "14.2.0"
    uint8, int32, float16, float32, float64 = np.uint8, np.int32, np.float16, np.float32, np.float64

    def __init__(self):
        super().__init__("light_cupy")
        self.cuda = types.SimpleNamespace(
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, getDevice=lambda: 0,
                                          deviceSynchronize=lambda: None,
                                          memcpyAsync=lambda dst, src, size, kind, stream:
                                              ctypes.memmove(dst, src, size),
                                          memsetAsync=lambda ptr, value, size, stream:
                                              ctypes.memset(ptr, value, size),
                                          memcpyDeviceToDevice=MEMCPY_DEVICE_TO_DEVICE),
            Device=_LightDevice, get_current_stream=lambda: _LIGHT_STREAMS[-1],
            Stream=_LightStream, ExternalStream=lambda ptr, device_id=0: _LightStream(ptr=ptr),
            Event=_LightEvent, MemoryPool=_LightPool, using_allocator=lambda malloc: _NoContext(),
            UnownedMemory=lambda ptr, size, owner, device_id=0:
                (ctypes.c_char * size).from_address(ptr),
            MemoryPointer=_memory_pointer)

    @staticmethod
    def get_default_memory_pool():
        return _LIGHT_POOL

    @staticmethod
    def empty(shape, dtype=np.float32):
        return np.ndarray.__new__(LightDeviceArray, shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return _light(np.zeros(shape, dtype))

    def empty_like(self, a):
        return np.ndarray.__new__(LightDeviceArray, a.shape, a.dtype)

    def asarray(self, a, dtype=None):
        if type(a) is LightDeviceArray and (dtype is None or np.dtype(dtype) == a.dtype):
            return a
        return _light(np.array(a, dtype=dtype))

    @staticmethod
    def ascontiguousarray(a):
        return a if a.flags.c_contiguous else _light(np.ascontiguousarray(a))

    def where(self, *args):
        return _light(np.where(*args))

    def copyto(self, dst, src, casting="same_kind", where=True):
        np.copyto(dst, src, casting=casting, where=where)

    def arange(self, *args, **kwargs):
        return _light(np.arange(*args, **kwargs))

    def asnumpy(self, a):
        return np.asarray(a).view(np.ndarray).copy()

    def concatenate(self, arrays):
        return _light(np.concatenate(arrays))

    def from_dlpack(self, a):
        if isinstance(a, FakeFrameworkArray):
            return _light(a.array)
        raise AssertionError("the light stand-in takes LightDeviceArray or FakeFrameworkArray")
