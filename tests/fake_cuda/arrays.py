"""Device arrays: NumPy arrays over pool blocks whose work runs in stream order.

Reading one on the host counts (``COUNTS``); an operation on one runs on the current
stream after its queued work, and while that stream captures it is recorded for replays.
"""

import ctypes
import math
import types

import numpy as np

from .devices import current_device
from .memory import FakeMemoryPool, _PoolRoot, _allocator
from .state import COUNTS, _count
from .streams import _capture_of, _drain, _key, _now, _upload, current_stream

def _empty(shape, dtype):
    """A FakeDeviceArray over a pool block (poison: NaN for floats, as garbage would be)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in shape) if isinstance(shape, (tuple, list)) else (int(shape),)
    nbytes = math.prod(shape) * dtype.itemsize
    pool = _allocator()
    if not isinstance(pool, FakeMemoryPool):  # its owner frees it, not the last array
        root = np.frombuffer(pool(nbytes), np.uint8, nbytes)
        flat = root.view(FakeDeviceArray)
        flat.device_id = current_device()
        return flat.view(dtype).reshape(shape)
    block = pool.take(nbytes)
    # The root's base is the block, and NumPy collapses a view's base only through
    # arrays of the view's own type: every view keeps the root, and so the block.
    root = np.ndarray.__new__(_PoolRoot, (block.size,), np.uint8, block)
    root.release = (pool, block, _key(current_stream().ptr))  # CuPy frees on that stream too
    root.device_id = current_device()
    flat = np.ndarray.__getitem__(root.view(FakeDeviceArray), slice(0, nbytes))
    return flat.view(dtype).reshape(shape)


def _root(a):
    """The array owning `a`'s device memory: a pool root, or where the chain of device
    arrays ends (a pool root's own base is the pool's block)."""
    while isinstance(a.base, (FakeDeviceArray, _PoolRoot)):
        a = a.base
    return a


def _pooled(value):
    """A NumPy result as a pool-backed device array (a copy of it)."""
    if not isinstance(value, np.ndarray):
        value = np.asarray(value)
    out = _empty(value.shape, value.dtype)
    np.copyto(out.view(np.ndarray), value.view(np.ndarray) if isinstance(value, FakeDeviceArray)
              else value)
    return out


_KEPT = []  # arrays outside the pool whose pointers cuDNN got (kept: no use after free)

class _Pointer:
    __slots__ = ("ptr",)


def _plain(a):
    """A device array's memory as a NumPy array; while the current stream captures, one
    that does not keep the memory alive (what a graph holds of it: its address)."""
    if not isinstance(a, FakeDeviceArray):
        return a
    return _unowned(a) if current_stream().is_capturing() else a.view(np.ndarray)


def _unowned(a):
    """A NumPy view of `a`'s memory by address, owning nothing: a replay through it reads
    and writes whatever owns that memory by then (pool blocks are never unmapped)."""
    a = a.view(np.ndarray)
    if a.size == 0:
        return a
    low, high = np.lib.array_utils.byte_bounds(a)
    memory = (ctypes.c_char * (high - low)).from_address(low)
    start = a.__array_interface__["data"][0]
    return np.ndarray(a.shape, a.dtype, buffer=memory, offset=start - low, strides=a.strides)


def _new(compute):
    """A device operation making a new array on the current stream: run now, after the
    stream's queued work, into a pool block; while capturing, recorded into that block."""
    ptr = current_stream().ptr
    _drain(ptr)
    value = compute()
    out = _pooled(value)
    graph = _capture_of(ptr)
    if graph is not None:
        target = _unowned(out)
        graph.ops.append(lambda: np.copyto(target, compute(), casting="unsafe"))
    return out


class FakeDeviceArray(np.ndarray):
    """Memory that says it lives on CUDA device 0; reading it on the host counts."""

    def __dlpack_device__(self):
        return (2, self.device.id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """CuPy's export: the consumer's `stream` waits for CuPy's current stream where
        they differ (``dlpack.export_array``)."""
        from .dlpack import export_array  # DLPack sits on arrays: imported late
        return export_array(self, stream)

    def __setitem__(self, key, value):
        plain = _plain(self)
        if isinstance(value, np.ndarray) and not isinstance(value, FakeDeviceArray) \
                and value.size > 1:
            value = np.array(value)  # pageable host memory is read before the call returns
            _upload(lambda: plain.__setitem__(key, value))
            return
        value = _plain(value)
        _now(lambda: plain.__setitem__(key, value))

    def __getitem__(self, key):
        ptr = current_stream().ptr
        _drain(ptr)
        item = super().__getitem__(key)
        if isinstance(item, np.ndarray) and item.base is not None and \
                _root(item) is _root(self):
            return item  # a view: no device work
        out = _pooled(item)  # a gather (or one element): a new device array
        graph = _capture_of(ptr)
        if graph is not None:
            plain, target = _unowned(self), _unowned(out)
            graph.ops.append(lambda: np.copyto(target, plain[key]))
        return out

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        args = tuple(_plain(a) for a in inputs)
        function = getattr(ufunc, method)
        if out is not None:
            outs = tuple(_plain(o) for o in out)
            _now(lambda: function(*args, out=outs, **kwargs))
            return out[0] if len(out) == 1 else out
        if method == "at":
            _now(lambda: function(*args, **kwargs))
            return None
        return _new(lambda: function(*args, **kwargs))

    def __array_wrap__(self, array, context=None, return_scalar=False):
        return array.view(FakeDeviceArray)  # results stay on the device, even 0-d ones

    def astype(self, dtype, *args, **kwargs):
        plain = _plain(self)
        return _new(lambda: plain.astype(dtype, *args, **kwargs))

    def _read(self, convert):
        _count("device_to_host")
        _count("sync")
        _drain(current_stream().ptr)
        return convert(np.asarray(self).view(np.ndarray))

    def __bool__(self):
        return self._read(bool)

    def __float__(self):
        return self._read(float)

    def __int__(self):
        return self._read(int)

    def item(self, *args):
        return self._read(lambda a: a.item(*args))

    def tolist(self):
        return self._read(lambda a: a.tolist())

    def get(self):
        return self._read(np.array)

    def copy(self, order="C"):
        COUNTS["device_copy"] += 1
        plain = _plain(self)
        return _new(lambda: plain.copy(order))

    @property
    def data(self):
        if type(_root(self)) is not _PoolRoot:
            _KEPT.append(self)  # memory not from the pool (a framework's): never freed under cuDNN
        pointer = _Pointer()
        pointer.ptr = self.__array_interface__["data"][0]
        return pointer

    @property
    def device(self):
        root = _root(self)
        return types.SimpleNamespace(id=root.__dict__.get("device_id", 0)
                                     if hasattr(root, "__dict__") else 0)


def _device(a):
    """A copy of host array `a` on the stand-in, its axis order kept (as if uploaded and
    synchronized: a test's inputs are there at once)."""
    a = np.asarray(a)
    order = np.argsort([-s for s in a.strides], kind="stable") if a.ndim > 1 else np.arange(a.ndim)
    out = _empty(tuple(a.shape[i] for i in order), a.dtype)
    target, source = _plain(out), a.transpose(order).copy()
    _now(lambda: np.copyto(target, source))
    return out.transpose(np.argsort(order))
