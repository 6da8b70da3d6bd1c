"""``FakeCupy``: the slice of CuPy the backend and the API use, over the stand-in."""

import ctypes
import types
import warnings

import numpy as np

from pycudnnrnn.core import dtypes

from . import dlpack, streams
from .arrays import FakeDeviceArray, _empty, _new, _plain
from .devices import DEVICES, Device, current_device
from .dlpack import FakeFrameworkArray
from .memory import _DEVICE_POOL, FakeMemoryPool, _allocator, _UsingAllocator
from .state import CAPTURE_GLOBAL, CAPTURE_RELAXED, CAPTURE_THREAD_LOCAL, COUNTS, _count
from .streams import (MEMCPY_DEVICE_TO_DEVICE, _EVENTS, FakeEvent, FakeStream, _drain,
                      _exchange_capture_mode, _memcpy_async, _memset_async, _now,
                      _upload, current_stream, device_synchronize)


class _NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _memory_pointer(memory, offset):
    assert offset == 0, "the stand-in's MemoryPointer takes offset 0 only"
    return memory


def _major(version: str) -> int:
    return int(version.split(".")[0])


class _SinceCupy14:
    """A classmethod CuPy 14 added: absent (an AttributeError, so ``getattr(..., None)``
    finds none) while the stand-in plays an older CuPy."""

    def __init__(self, function):
        self.function = function

    def __get__(self, instance, owner):
        version = owner._cupy.__version__
        if _major(version) < 14:
            raise AttributeError(f"type object 'Stream' has no attribute "
                                 f"'{self.function.__name__}' (CuPy {version}; added in 14)")
        return self.function.__get__(owner)


def _from_external(cls, obj):
    """CuPy 14's ``Stream.from_external(obj)`` (``cupy/cuda/stream.pyx``): a view of the
    stream of `obj`, an object of the CUDA stream protocol (``obj.__cuda_stream__()``
    is ``(0, pointer)``), on the current device (the protocol names none); it holds
    `obj`."""
    try:
        result = obj.__cuda_stream__()
    except AttributeError:
        raise AttributeError(f"Object of type {type(obj).__name__} does not implement the "
                             f"CUDA stream protocol (__cuda_stream__ method)") from None
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError(f"__cuda_stream__() must return a 2-tuple of (version, stream_ptr), "
                        f"got {type(result).__name__}")
    version, ptr = result
    if not isinstance(version, int) or not isinstance(ptr, int):
        raise TypeError(f"__cuda_stream__() must return (int, int), got "
                        f"({type(version).__name__}, {type(ptr).__name__})")
    if version != 0:
        raise ValueError(f"__cuda_stream__() returned unsupported version {version}, only "
                         f"version 0 is supported")
    stream = cls(ptr=ptr, device_id=current_device())
    stream._foreign_stream_ref = obj
    cls._cupy.external_streams.append((ptr, stream.device_id))
    return stream

class FakeCupy(types.ModuleType):
    """The CuPy functions and attributes the backend and the API use.

    ``__version__`` says which CuPy it plays: 14 (the default) holds bfloat16; set it to
    "13.6.0" and, as CuPy 13 does, its DLPack import, allocations and kernels refuse
    bfloat16 (so the library must carry bfloat16 as its bits). CuPy 14 has
    ``cuda.Stream.from_external`` and deprecates ``cuda.ExternalStream``, which warns
    (``DeprecationWarning``) at each one made; CuPy 13 has no ``from_external``.
    ``external_streams`` holds the ``(pointer, device)`` of each view of another's
    stream made by either.
    """

    ndarray = FakeDeviceArray
    __version__ = "14.2.0"

    def _refuse_bfloat16(self, *dtypes_or_arrays):
        if int(self.__version__.split(".")[0]) >= 14:
            return
        for d in dtypes_or_arrays:
            d = getattr(d, "dtype", d)
            if d is not None and dtypes.is_bfloat16(d):
                raise TypeError(f"CuPy {self.__version__}: unsupported dtype bfloat16")
    uint8, int32, float16, float32, float64 = np.uint8, np.int32, np.float16, np.float32, np.float64

    def __init__(self):
        super().__init__("fake_cupy")
        self.external_streams = []
        # This CuPy's Stream: FakeStream, with CuPy 14's from_external on this version.
        stream_class = type("Stream", (FakeStream,), {
            "_cupy": self, "from_external": _SinceCupy14(_from_external),
            "__module__": __name__, "__doc__": FakeStream.__doc__})

        def external_stream(ptr, device_id=-1):  # -1: unknown, taken as the current one
            if _major(self.__version__) >= 14:
                warnings.warn("ExternalStream is deprecated. Use Stream.from_external() "
                              "instead to interoperate with external streams that implement "
                              "the CUDA stream protocol.", DeprecationWarning, stacklevel=2)
            stream = FakeStream(ptr=ptr, device_id=None if device_id == -1 else device_id)
            self.external_streams.append((ptr, stream.device_id))
            return stream

        def stream_wait_event(stream, event, flags=0):
            streams._wait(stream, _EVENTS[event], flags)  # streams' own: a test may count it

        self.cuda = types.SimpleNamespace(
            runtime=types.SimpleNamespace(getDeviceCount=lambda: DEVICES[0],
                                          getDevice=current_device,
                                          deviceSynchronize=device_synchronize,
                                          memcpyAsync=_memcpy_async,
                                          memsetAsync=_memset_async,
                                          memcpyDeviceToDevice=MEMCPY_DEVICE_TO_DEVICE,
                                          streamWaitEvent=stream_wait_event,
                                          threadExchangeStreamCaptureMode=_exchange_capture_mode,
                                          streamCaptureModeGlobal=CAPTURE_GLOBAL,
                                          streamCaptureModeThreadLocal=CAPTURE_THREAD_LOCAL,
                                          streamCaptureModeRelaxed=CAPTURE_RELAXED),
            Device=Device, get_current_stream=current_stream, Stream=stream_class,
            ExternalStream=external_stream, Event=FakeEvent, MemoryPool=FakeMemoryPool,
            using_allocator=_UsingAllocator, get_allocator=_allocator,
            # views of memory others own (XLA's buffers), as the CUDA handlers make them
            UnownedMemory=lambda ptr, size, owner, device_id=0:
                (ctypes.c_char * size).from_address(ptr),
            MemoryPointer=_memory_pointer)

    @staticmethod
    def get_default_memory_pool():
        return _DEVICE_POOL[0]

    def empty(self, shape, dtype=np.float32):
        # Poison, as garbage on a GPU: NaN for floats, so a read of unwritten memory shows.
        self._refuse_bfloat16(dtype)
        out = _empty(shape, dtype)
        COUNTS["device_alloc"] += 1
        COUNTS["device_alloc_bytes"] += out.nbytes
        return out

    def zeros(self, shape, dtype=np.float32):
        out = self.empty(shape, dtype)
        plain = _plain(out)
        _now(lambda: plain.fill(0))
        return out

    def empty_like(self, a):
        return self.empty(a.shape, a.dtype)

    def asarray(self, a, dtype=None):
        self._refuse_bfloat16(dtype, a)
        if isinstance(a, FakeDeviceArray):
            return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
        host = np.array(a, dtype=dtype)  # read before the call returns, copied later
        out = _empty(host.shape, host.dtype)
        target = out.view(np.ndarray)
        _upload(lambda: np.copyto(target, host))
        return out

    def ascontiguousarray(self, a):
        self._refuse_bfloat16(a)
        if a.flags.c_contiguous:
            return a
        COUNTS["device_copy"] += 1
        plain = _plain(a)
        return _new(lambda: np.ascontiguousarray(plain))

    def where(self, *args):
        self._refuse_bfloat16(*args)
        for a in args:  # CuPy's bfloat16 support is minimal: its kernels take no such scalar
            if isinstance(a, np.generic) and dtypes.is_bfloat16(a.dtype):
                raise TypeError(f"Unsupported type {type(a)}")
        COUNTS["device_alloc"] += 1
        plain = [_plain(a) for a in args]
        return _new(lambda: np.where(*plain))

    def copyto(self, dst, src, casting="same_kind", where=True):
        self._refuse_bfloat16(dst, src)
        target, source, mask = _plain(dst), _plain(src), _plain(where)
        _now(lambda: np.copyto(target, source, casting=casting, where=mask))

    def arange(self, *args, **kwargs):
        return _new(lambda: np.arange(*args, **kwargs))

    def asnumpy(self, a):
        _count("device_to_host")
        _count("sync")
        _drain(current_stream().ptr)
        return np.asarray(a).view(np.ndarray).copy()

    def concatenate(self, arrays):
        plain = [_plain(a) for a in arrays]
        return _new(lambda: np.concatenate(plain))

    def from_dlpack(self, a):
        if isinstance(a, FakeFrameworkArray):
            self._refuse_bfloat16(a.array)
        return dlpack.import_array(a)
