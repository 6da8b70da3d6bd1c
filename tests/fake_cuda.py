"""A stand-in GPU for CI: runs the cuDNN backend's own code with host memory, in time.

* ``FakeCupy`` is the slice of CuPy the backend uses, over NumPy arrays whose
  ``__dlpack_device__`` says CUDA, so the public API routes them to the cuDNN backend.
* ``FakeCudnn`` replaces the handful of cuDNN calls that need a GPU. Every call still
  goes through a ctypes function built from the project's prototype table, so argument
  marshalling is exercised for real; descriptors are real cuDNN objects (they need no
  GPU) and are read back through cuDNN. The RNN itself is computed by the NumPy backend
  on the rows cuDNN is handed, and the fake refuses what cuDNN refuses (zero lengths).

It lives in time, as a GPU does (STYLE.md, "a test double that lives in time"):

* **streams**: cuDNN's compute calls and host→device copies are queued on their stream
  (cuDNN's: the one ``cudnnSetStream`` gave the handle) and run when that stream, an
  event recorded on it or the device is synchronized. Every other device operation (the
  NumPy work on device arrays: copies, gathers, fills) runs at once on the current
  stream, after that stream's queued work: a stream runs in order, but nothing orders
  two streams except events (``stream.wait_event``) and syncs. Every stream is
  non-blocking (no legacy default-stream sync), the strictest CUDA allows. With
  ``STRICT[0]`` set (the ``strict_gpu`` fixture, or ``FAKE_CUDA_STRICT=1`` for a whole
  run), a device sync runs the streams' queues newest stream first, an order that
  differs from submission across streams.
* **memory**: device arrays are blocks of one pool (CuPy's, or a private
  ``MemoryPool``). A block freed (its last array gone) is poisoned (0xFF bytes: NaN in
  every float dtype) in the order of the stream it was allocated on, and handed to the
  next request of its size on that stream at once, and on any stream once that stream
  got past the free (as CuPy's and PyTorch's pools do): work still queued on another
  stream that reads freed memory reads poison, or what the block's next owner wrote.
  Fresh memory is poison too.
* **dropout** is applied: ``cudnnSetDropoutDescriptor`` initialises the state bytes from
  the seed (a queued kernel), and every training forward draws its masks (the NumPy
  backend's, seeded by those bytes) and advances the state, as cuDNN's RNG does.
* **the reserve space**: forward writes its record into it; ``cudnnRNNBackwardData_v8``
  overwrites that record with its own (``reserveSpace`` is ``[in,out]`` there, so cuDNN
  may), which ``cudnnRNNBackwardWeights_v8`` reads: a second backprop handed the same
  reserve space finds no forward in it and returns NaN.
* **sizes** of the workspace and reserve space scale with the problem, and cuDNN's
  calls fill the workspace with poison (it is theirs while they run).
* ``cudnnDestroy`` synchronizes the device (as cuDNN's does); during a capture that
  invalidates it, and ``end_capture`` raises, as CUDA's does.
* graphs capture what runs on the capturing stream and replay it for real
  (``FakeGraph.launch`` queues it on the launch stream): a replay reads and writes the
  same memory as the capture, by address, whoever owns it by then (a graph keeps no
  memory alive, as CUDA's keep none).
* capture modes, as CUDA has them (``begin_capture(mode)``; CuPy's default is relaxed):
  while a thread captures in global or thread-local mode, or any thread in global mode,
  that thread's event queries, event and stream syncs are refused and invalidate those
  captures; an event recorded in a capture cannot be queried, synced or waited on from
  outside it; a capturing stream may wait on an event recorded outside the capture only
  with ``cudaEventWaitExternal`` (``runtime.streamWaitEvent(s, e, 1)``), which each
  replay then honours.
* a thread's capture interaction mode (``runtime.threadExchangeStreamCaptureMode``, as
  CUDA's ``cudaThreadExchangeStreamCaptureMode``; global by default): a thread in relaxed
  mode may query and sync while others capture, a thread-local one while others capture
  in global mode.
* a thread of the library's that only waits in the background (``pycudnnrnn.cuda.
  foreign``'s, by its name) waits for an event passively, uncounted: the stand-in's GPU
  runs queued work only when a test's thread syncs, so the test says when work is done.
* devices: ``DEVICES[0]`` of them (1 unless a test sets more). Each thread has a current
  device (``cuda.Device(n)``), each device its own null stream and current stream, each
  array and stream the device it was made on; entering a stream of another device than
  the current one is refused, as CuPy refuses it. Devices are GPUs of different kinds:
  cuDNN on device n asks for a larger workspace and reserve space than on device 0
  (``temp_space_bytes``), so sizes taken on the wrong device show.

What it adds besides, to catch GPU bugs a CPU test would miss:

* its own weight-slot table in cuDNN's documented order (all matrices, then all biases;
  per pseudo-layer, by linLayerID), not ``pycudnnrnn.core.layout``'s; ``test_fake_cuda.py``
  holds it against the table cuDNN 9.19 gave on an H200 (``tests/data/gpu-layout.json``);
* padding behaves as in cuDNN's products over every (t, b) slot: a NaN in the padding of
  x or dy handed to cuDNN spreads into the gradients (0 · NaN = NaN), so the backend must
  zero it;
* counters (``COUNTS``) of host↔device copies and syncs (host data turned into device
  arrays, device data read back, scalars read from device arrays, synchronize), of
  device allocations and copies, and of blocks taken from a pool (``pool_alloc``: none
  where ``using_allocator`` put another allocator in place); while a stream captures a
  graph, transfers and syncs raise, as CUDA refuses them.

``install(monkeypatch)`` is the one way in: it replaces ``pycudnnrnn.core.gpu.cupy`` and
``pycudnnrnn.cudnn.capi.api``, the only two places the library finds CuPy and cuDNN.
``to_host(a)`` is how a test reads a result (after the current stream's work, as
``cupy.asnumpy`` does; not counted). What this cannot show is cuDNN's own arithmetic:
the ``gpu`` tests do.
"""

import collections
import ctypes
import hashlib
import math
import os
import threading
import types
import weakref

import ml_dtypes
import numpy as np

from pycudnnrnn import plan
from pycudnnrnn.core import dtypes, gpu
from pycudnnrnn.cpu import rnn as cpu_rnn
from pycudnnrnn.cuda import foreign, resources
from pycudnnrnn.core.config import GATES, Problem, RNNConfig
from pycudnnrnn.cudnn import capi
from pycudnnrnn.cudnn.capi import api as real_api

#: Host↔device traffic of the stand-in GPU since the last ``reset_counts()``.
COUNTS: collections.Counter = collections.Counter()

#: The streams capturing a graph now: transfers and syncs then fail, as in CUDA.
CAPTURING = []

#: Set STRICT[0] to run streams out of submission order at device syncs.
STRICT = [False]

#: How many devices the stand-in has (a test may set more; ``install`` puts back 1).
DEVICES = [1]

#: cudaStreamCaptureMode (CuPy's ``runtime.streamCaptureMode*``), and cudaEventWaitExternal.
CAPTURE_GLOBAL, CAPTURE_THREAD_LOCAL, CAPTURE_RELAXED = 0, 1, 2
EVENT_WAIT_EXTERNAL = 1

POISON = 0xFF  # every byte of freed or fresh memory: NaN in float16/32/64 and bfloat16


def reset_counts():
    COUNTS.clear()


def _count(kind):
    if CAPTURING:
        raise RuntimeError(f"the current stream is capturing, so {kind} is disallowed")
    COUNTS[kind] += 1


def install(monkeypatch):
    """Put the stand-in GPU in place of CuPy and cuDNN's GPU calls; returns the FakeCudnn."""
    fake_cupy, fake_api = FakeCupy(), FakeCudnn()
    monkeypatch.setattr(gpu, "cupy", lambda: fake_cupy)
    monkeypatch.setattr(capi, "api", lambda: fake_api)
    # cuDNN handles live as long as the process: the stand-in's, as long as it is in place
    monkeypatch.setattr(resources, "_handles", {}, raising=False)
    plan.clear_caches()  # nothing built on another GPU (or this one, earlier) is reused
    synchronize_all()  # what an earlier stand-in queued runs before its memory is reused
    _KEPT.clear()
    reset_counts()
    CALLS.clear()
    CAPTURING.clear()
    _CAPTURES.clear()
    STRICT[0] = os.environ.get("FAKE_CUDA_STRICT") == "1"  # a whole run in strict mode
    DEVICES[0] = 1
    _local.__dict__.clear()
    return fake_api


def release_foreign_views():
    """Run every stream's queued work, then let go of the views of foreign memory whose
    pointers cuDNN got (kept against a use after free while work on them may be queued):
    dead, as CuPy's views are once the call that made them returns, with whatever a weak
    reference ties to them. Not during a capture, nor before replaying a graph that
    captured work on them."""
    synchronize_all()
    if _CAPTURES:
        raise RuntimeError("a captured graph may replay work on these views")
    _KEPT.clear()


def to_host(a):
    """A host copy of device array `a` once the current stream's work is done (uncounted)."""
    _drain(current_stream().ptr)
    return np.array(np.asarray(a).view(np.ndarray))


def synchronize_all():
    """Run every stream's queued work (uncounted: the stand-in's own, not the library's)."""
    with _lock:
        ptrs = list(_QUEUES)
        for ptr in (reversed(ptrs) if STRICT[0] else ptrs):
            _drain(ptr)
        if any(q.ops for q in _QUEUES.values()):  # work queued while draining
            synchronize_all()


# ----------------------------------------------------------------- time: streams

_lock = threading.RLock()
_local = threading.local()
_progress = threading.Condition(_lock)  # notified when a stream's queued work has run


class _Queue:
    """A stream's queued work; `submitted` and `executed` count its operations."""

    __slots__ = ("ops", "submitted", "executed", "running")

    def __init__(self):
        self.ops, self.submitted, self.executed, self.running = collections.deque(), 0, 0, False


_QUEUES: dict = {}    # stream pointer → _Queue
_CAPTURES: dict = {}  # stream pointer → the FakeGraph it is capturing into


def _queue(ptr) -> _Queue:
    q = _QUEUES.get(ptr)
    if q is None:
        q = _QUEUES[ptr] = _Queue()
    return q


def _submit(ptr, op, captured=True):
    """Queue `op` on stream `ptr` (or record it, while that stream captures and
    `captured`: the pool's own bookkeeping is never part of a graph)."""
    with _lock:
        graph = _CAPTURES.get(ptr) if captured else None
        if graph is not None:
            graph.ops.append(op)
            return
        q = _queue(ptr)
        q.ops.append(op)
        q.submitted += 1


def _drain(ptr, upto=None):
    """Run stream `ptr`'s queued operations, all or up to the `upto`-th submitted."""
    with _lock:
        q = _queue(ptr)
        if q.running:  # re-entered from its own work: that runs in order already
            return
        q.running = True
        try:
            while q.ops and (upto is None or q.executed < upto):
                op = q.ops.popleft()
                q.executed += 1
                op()
        finally:
            q.running = False
            _progress.notify_all()


def _thread_capture_mode() -> int:
    return getattr(_local, "capture_mode", CAPTURE_GLOBAL)


def _exchange_capture_mode(mode: int) -> int:
    """cudaThreadExchangeStreamCaptureMode: this thread's mode becomes `mode`; the old one
    is returned."""
    old, _local.capture_mode = _thread_capture_mode(), int(mode)
    return old


def current_device() -> int:
    """This thread's current device (``cuda.Device(n)`` changes it)."""
    return getattr(_local, "device", 0)


def _stream_stack(device):
    stacks = getattr(_local, "streams", None)
    if stacks is None:
        stacks = _local.streams = {}
    return stacks.setdefault(device, [])


def current_stream():
    """The current device's current stream on this thread (CuPy keeps one per device)."""
    device = current_device()
    stack = _stream_stack(device)
    return stack[-1] if stack else null_stream(device)


def _now(compute):
    """A device operation on the current stream: after its queued work, run now; while
    the stream captures, also recorded for replays. Returns what `compute()` returns."""
    ptr = current_stream().ptr
    _drain(ptr)
    value = compute()
    graph = _CAPTURES.get(ptr)
    if graph is not None:
        graph.ops.append(compute)
    return value


_EVENTS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()  # ptr → FakeEvent


class FakeEvent:
    """A CUDA event: a point in one stream's work, or (recorded in a capture) a node of
    a graph, which CUDA lets no one outside that capture query, sync or wait on."""

    _next = [0x9000]

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self._at = None  # (stream pointer, operations submitted before it)
        self.captured = False  # last recorded in a capture
        self.ptr = FakeEvent._next[0]
        FakeEvent._next[0] += 0x10
        _EVENTS[self.ptr] = self

    def record(self, stream=None):
        stream = stream if stream is not None else current_stream()
        with _lock:
            graph = _CAPTURES.get(stream.ptr)
            self.captured = graph is not None
            if graph is not None:  # replayed: the event marks the replay's point
                graph.ops.append(lambda: None)
                self._at = (stream.ptr, None)
                return
            self._at = (stream.ptr, _queue(stream.ptr).submitted)

    def _refuse_captured(self, what):
        if self.captured:
            raise RuntimeError(f"cudaErrorCapturedEvent: {what} on an event recorded in a "
                               f"stream capture")

    @property
    def done(self):
        """cudaEventQuery: refused on a captured event, and as an unsafe call."""
        self._refuse_captured("cudaEventQuery")
        _refuse_unsafe("cudaEventQuery")
        if self._at is None:
            return True
        ptr, upto = self._at
        return _queue(ptr).executed >= upto

    def synchronize(self):
        self._refuse_captured("cudaEventSynchronize")
        _refuse_unsafe("cudaEventSynchronize")
        if threading.current_thread().name == getattr(foreign, "WAITER_NAME", None):
            at = self._at  # a background wait: until a test's thread has run the work
            with _progress:
                _progress.wait_for(lambda: at is None or _queue(at[0]).executed >= at[1])
            return
        _count("sync")
        if self._at is not None:
            _drain(*self._at)


def _refuse_unsafe(what):
    """CUDA's rule for "potentially unsafe" calls (queries and syncs): refused while this
    thread captures in global or thread-local mode, or (unless this thread's interaction
    mode is thread-local or relaxed) another thread in global mode; none is refused in a
    thread whose mode is relaxed. The refusal invalidates those captures."""
    me = threading.get_ident()
    mode = _thread_capture_mode()
    if mode == CAPTURE_RELAXED:
        return
    with _lock:
        blocking = [g for g in _CAPTURES.values() if g.mode != CAPTURE_RELAXED and (
            g.thread == me or g.mode == CAPTURE_GLOBAL and mode == CAPTURE_GLOBAL)]
        for graph in blocking:
            graph.invalid = graph.invalid or f"{what} during a capture"
    if blocking:
        raise RuntimeError(f"cudaErrorStreamCaptureUnsupported: {what} while a stream "
                           f"captures in {('global', 'thread-local')[blocking[0].mode]} mode")


def _wait(ptr, event, flags=0):
    """cudaStreamWaitEvent(stream `ptr`, `event`, `flags`), as CUDA takes it in and out of
    capture: a capturing stream may wait on an event of its own capture, or (with
    cudaEventWaitExternal) on one recorded outside it, which each replay waits for; the
    rest is refused (and invalidates the capture)."""
    graph = _CAPTURES.get(ptr)
    at = event._at
    if graph is None:
        event._refuse_captured("cudaStreamWaitEvent from a stream not capturing")
        if at is not None and at[0] != ptr:
            _submit(ptr, lambda: _drain(*at))
        return
    if event.captured:
        if at[0] != ptr and _CAPTURES.get(at[0]) is not graph:
            graph.invalid = graph.invalid or "a wait on another capture's event"
            raise RuntimeError("cudaErrorStreamCaptureIsolation: a wait on an event of "
                               "another capture")
        return
    if not flags & EVENT_WAIT_EXTERNAL:
        graph.invalid = graph.invalid or "a wait on an event recorded outside the capture"
        raise RuntimeError("cudaErrorStreamCaptureIsolation: a capturing stream waits on an "
                           "event recorded outside the capture without cudaEventWaitExternal")
    held = weakref.ref(event)  # a graph holds the event's handle, not the event

    def external():  # the event's latest record when the replay runs
        alive = held()
        if alive is None:
            raise RuntimeError("a replay waits on an event destroyed since its capture")
        if alive._at is not None and not alive.captured:
            _drain(*alive._at)
    external()  # the eager run of the capture waits too
    graph.ops.append(external)


class FakeStream:
    """A CUDA stream: its own queue; ``with stream:`` makes it current on this thread."""

    _next = [0x5000]

    def __init__(self, null=False, non_blocking=False, ptr=None, device_id=None):
        if ptr is None:
            ptr = 0 if null else FakeStream._next[0]
            FakeStream._next[0] += 0x10
        self.ptr = ptr
        self.device_id = current_device() if device_id is None else device_id

    def __enter__(self):
        if self.device_id != current_device():
            raise RuntimeError(f"the stream was created on device {self.device_id}, while "
                               f"the current device is {current_device()}")
        _stream_stack(self.device_id).append(self)
        return self

    def __exit__(self, *exc):
        _stream_stack(self.device_id).pop()

    def synchronize(self):
        if self.ptr in _CAPTURES:
            raise RuntimeError("cudaErrorStreamCaptureUnsupported: a sync of a capturing stream")
        _refuse_unsafe("cudaStreamSynchronize")
        _count("sync")
        _drain(self.ptr)

    def record(self, event=None):
        event = event if event is not None else FakeEvent()
        event.record(self)
        return event

    def wait_event(self, event):
        """Later work on this stream waits for `event`'s point in its stream."""
        _wait(self.ptr, event)

    def begin_capture(self, mode=None):
        CAPTURING.append(self.ptr)
        _CAPTURES[self.ptr] = FakeGraph(len(CALLS), CAPTURE_RELAXED if mode is None else mode)

    def is_capturing(self):
        return self.ptr in _CAPTURES

    def end_capture(self):
        CAPTURING.remove(self.ptr)
        graph = _CAPTURES.pop(self.ptr)
        graph.calls = CALLS[graph.start:]
        if graph.invalid:
            raise RuntimeError(f"cudaErrorStreamCaptureInvalidated: {graph.invalid}")
        return graph


NULL_STREAM = FakeStream(null=True, device_id=0)
_NULL_STREAMS = {0: NULL_STREAM}


def null_stream(device: int) -> FakeStream:
    """Device `device`'s null stream (device 0's has pointer 0; the others a pointer of
    their own here, so that the stand-in keeps their queues apart)."""
    stream = _NULL_STREAMS.get(device)
    if stream is None:
        stream = _NULL_STREAMS[device] = FakeStream(device_id=device)
    return stream


class FakeGraph:
    """What a stream captured: the operations to replay, and the cuDNN calls made."""

    def __init__(self, start, mode=CAPTURE_RELAXED):
        self.start, self.ops, self.calls, self.launches, self.invalid = start, [], [], 0, None
        self.mode, self.thread = mode, threading.get_ident()

    def launch(self, stream=None):
        """Queue the captured work on `stream` (the current one if None)."""
        stream = stream if stream is not None else current_stream()
        self.launches += 1
        for op in self.ops:
            _submit(stream.ptr, op)


def _invalidate_captures(why):
    for graph in _CAPTURES.values():
        graph.invalid = graph.invalid or why


# ----------------------------------------------------------------- memory: the pool

_BLOCK = 512  # CuPy's allocation unit


class FakeMemoryPool:
    """Blocks by size; a freed one is poisoned in its stream's order, then reused.

    As CuPy's pool (and PyTorch's), a freed block goes at once to the next request on
    the stream it was used on (ordered after that stream's work), and to a request on
    any stream once that stream has got past the free: work still queued that reads a
    freed block reads poison, or whatever its next owner wrote.
    """

    def __init__(self, counter="pool_alloc"):
        self.free = collections.defaultdict(list)  # bytes → [[block, stream, poisoned]]
        self.blocks = []  # every block, kept: queued work may still read freed ones
        self.malloc = self  # ``using_allocator(pool.malloc)`` names this pool
        self.counter = counter  # the COUNTS entry of its blocks (CuPy's: "pool_alloc")

    def take(self, nbytes):
        COUNTS[self.counter] += 1
        size = max(_BLOCK, -(-int(nbytes) // _BLOCK) * _BLOCK)
        stream = current_stream().ptr
        with _lock:
            free = self.free[size]
            for i in range(len(free) - 1, -1, -1):  # the most recently freed first
                block, freed_on, poisoned = free[i]
                if freed_on == stream or poisoned[0]:
                    del free[i]
                    return block
        block = np.full(size, POISON, np.uint8)
        self.blocks.append(block)
        return block

    def give_back(self, block, stream_ptr):
        """`block`'s last array is gone: poison it after its stream's work, reuse it."""
        poisoned = [False]

        def poison():
            block.fill(POISON)
            poisoned[0] = True
        _submit(stream_ptr, poison, captured=False)
        with _lock:
            self.free[block.size].append([block, stream_ptr, poisoned])


_DEVICE_POOL = [FakeMemoryPool()]


class _PoolRoot(np.ndarray):
    """The array over a whole pool block; when its last view is gone, the block goes
    back to its pool (``__del__``: cheaper than a weakref finaliser per allocation)."""

    def __del__(self):
        release = self.__dict__.pop("release", None)
        if release is not None:
            release[0].give_back(release[1], release[2])


def _allocator():
    """The current thread's: a stand-in pool, or a CuPy allocator function (bytes →
    ``MemoryPointer``; the stand-in's MemoryPointer is the memory itself)."""
    stack = getattr(_local, "allocators", None)
    return stack[-1] if stack else _DEVICE_POOL[0]


class _UsingAllocator:
    def __init__(self, malloc):
        # a pool's malloc names the pool; any other callable allocates by itself
        self.pool = malloc if isinstance(malloc, FakeMemoryPool) or callable(malloc) \
            else None

    def __enter__(self):
        stack = getattr(_local, "allocators", None)
        if stack is None:
            stack = _local.allocators = []
        stack.append(self.pool or _DEVICE_POOL[0])
        return self

    def __exit__(self, *exc):
        _local.allocators.pop()


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
    root.release = (pool, block, current_stream().ptr)  # CuPy frees on that stream too
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


# ----------------------------------------------------------------- device arrays

class _Pointer:
    __slots__ = ("ptr",)


def _plain(a):
    """A device array's memory as a NumPy array; while the current stream captures, one
    that does not keep the memory alive (what a graph holds of it: its address)."""
    if not isinstance(a, FakeDeviceArray):
        return a
    return _unowned(a) if current_stream().ptr in _CAPTURES else a.view(np.ndarray)


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
    graph = _CAPTURES.get(ptr)
    if graph is not None:
        target = _unowned(out)
        graph.ops.append(lambda: np.copyto(target, compute(), casting="unsafe"))
    return out


class FakeDeviceArray(np.ndarray):
    """Memory that says it lives on CUDA device 0; reading it on the host counts."""

    def __dlpack_device__(self):
        return (2, self.device.id)

    def __setitem__(self, key, value):
        plain = _plain(self)
        if isinstance(value, np.ndarray) and not isinstance(value, FakeDeviceArray) \
                and value.size > 1:
            _count("host_to_device")
            value = np.array(value)  # pageable host memory is read before the call returns
            _submit(current_stream().ptr, lambda: plain.__setitem__(key, value))  # queued
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
        graph = _CAPTURES.get(ptr)
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


class _NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


#: Every stand-in cuDNN GPU call, in order (FakeCudnn.calls is per instance).
CALLS = []


def _memory_pointer(memory, offset):
    assert offset == 0, "the stand-in's MemoryPointer takes offset 0 only"
    return memory


MEMCPY_DEVICE_TO_DEVICE = 3  # cudaMemcpyDeviceToDevice


def _memcpy_async(dst, src, size, kind, stream):
    """``cudaMemcpyAsync`` between device addresses, queued on stream `stream`."""
    assert kind == MEMCPY_DEVICE_TO_DEVICE, f"the stand-in copies device to device, got {kind}"
    assert dst and src, "cudaMemcpyAsync on a null address"
    _submit(stream, lambda: ctypes.memmove(dst, src, size))


def _memset_async(ptr, value, size, stream):
    """``cudaMemsetAsync``: `size` bytes at device address `ptr` set to `value`, queued."""
    assert ptr, "cudaMemsetAsync on a null address"
    _submit(stream, lambda: ctypes.memset(ptr, value, size))


def _device_synchronize():
    _count("sync")
    synchronize_all()


class FakeCupy(types.ModuleType):
    """The CuPy functions and attributes the backend and the API use.

    ``__version__`` says which CuPy it plays: 14 (the default) holds bfloat16; set it to
    "13.6.0" and, as CuPy 13 does, its DLPack import, allocations and kernels refuse
    bfloat16 (so the library must carry bfloat16 as its bits).
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

        class Device:
            """``with Device(n):`` makes device n current on this thread."""

            def __init__(self, id=None):
                self.id = current_device() if id is None else int(id)
                if not 0 <= self.id < DEVICES[0]:
                    raise RuntimeError(f"cudaErrorInvalidDevice: device {self.id} of "
                                       f"{DEVICES[0]}")
                self._before = []

            def __enter__(self):
                self._before.append(current_device())
                _local.device = self.id
                return self

            def __exit__(self, *exc):
                _local.device = self._before.pop()

            synchronize = staticmethod(_device_synchronize)

        def external_stream(ptr, device_id=-1):  # -1: unknown, taken as the current one
            return FakeStream(ptr=ptr, device_id=None if device_id == -1 else device_id)

        def stream_wait_event(stream, event, flags=0):
            _wait(stream, _EVENTS[event], flags)

        self.cuda = types.SimpleNamespace(
            runtime=types.SimpleNamespace(getDeviceCount=lambda: DEVICES[0],
                                          getDevice=current_device,
                                          deviceSynchronize=_device_synchronize,
                                          memcpyAsync=_memcpy_async,
                                          memsetAsync=_memset_async,
                                          memcpyDeviceToDevice=MEMCPY_DEVICE_TO_DEVICE,
                                          streamWaitEvent=stream_wait_event,
                                          threadExchangeStreamCaptureMode=_exchange_capture_mode,
                                          streamCaptureModeGlobal=CAPTURE_GLOBAL,
                                          streamCaptureModeThreadLocal=CAPTURE_THREAD_LOCAL,
                                          streamCaptureModeRelaxed=CAPTURE_RELAXED),
            Device=Device, get_current_stream=current_stream, Stream=FakeStream,
            ExternalStream=external_stream, Event=FakeEvent, MemoryPool=FakeMemoryPool,
            using_allocator=_UsingAllocator,
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
        _count("host_to_device")
        host = np.array(a, dtype=dtype)  # read before the call returns, copied later
        out = _empty(host.shape, host.dtype)
        target = out.view(np.ndarray)
        _submit(current_stream().ptr, lambda: np.copyto(target, host))  # queued
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
        if isinstance(a, FakeFrameworkArray):  # a fresh view, as CuPy's import makes
            self._refuse_bfloat16(a.array)
            return a.array.view(FakeDeviceArray)
        raise AssertionError("the fake GPU only takes FakeDeviceArray or FakeFrameworkArray")


class FakeFrameworkArray:
    """Another library's array on the stand-in GPU, taken in through DLPack."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (2, self.array.device.id)

    def __dlpack__(self, stream=None):
        raise AssertionError("the stand-in imports it through FakeCupy.from_dlpack")

    @property
    def dtype(self):
        return self.array.dtype

    def view(self, dtype):
        """A view as another dtype of the same size, as PyTorch's and JAX's ``view``."""
        return FakeFrameworkArray(self.array.view(dtype))


def _array(ptr, dtype, shape):
    """A NumPy view of host memory at `ptr`."""
    count = int(np.prod(shape))
    buffer = (ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(ptr)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


_DTYPES = {capi.CUDNN_DATA_HALF: np.float16, capi.CUDNN_DATA_FLOAT: np.float32,
           capi.CUDNN_DATA_DOUBLE: np.float64, capi.CUDNN_DATA_BFLOAT16: ml_dtypes.bfloat16}
_MODES = {capi.CUDNN_LSTM: "lstm", capi.CUDNN_GRU: "gru", capi.CUDNN_RNN_TANH: "rnn_tanh",
          capi.CUDNN_RNN_RELU: "rnn_relu"}
DROPOUT_STATES_BYTES = 64


def temp_space_bytes(config: RNNConfig, dtype, max_time: int, batch: int, training: bool,
                     device: int = 0):
    """(workspace, reserve) bytes the stand-in's cuDNN asks for on `device`: growing with
    the problem, as cuDNN's do (the reserve holds every gate of every step and layer),
    and with the device number (GPUs of different kinds ask for different sizes)."""
    cells = max_time * batch * config.num_pseudo_layers * config.num_units
    itemsize = np.dtype(dtype).itemsize
    work = 1024 * (1 + device) + cells * itemsize
    reserve = 64 * (1 + device) + cells * config.num_gates * itemsize if training else 0
    return work, reserve


class FakeCudnn:
    """Real cuDNN for descriptors; stand-ins, marshalled through ctypes, for GPU calls."""

    def __init__(self):
        self.calls = []
        self.state = {}     # token in the reserve space → what forward (or backward data) left
        self.streams = {}   # handle → the stream cudnnSetStream gave it
        self.devices = {}   # handle → the device current when it was created
        self.dropouts = {}  # dropout descriptor → (dropout, states pointer, states bytes)
        self._tokens = iter(range(1, 1 << 62))
        self._handles = iter(range(0x1000, 1 << 40, 0x10))
        self._functions = {}
        self._failure = None

    def __getattr__(self, name):
        if name not in _GPU_CALLS:
            return getattr(real_api(), name)
        if name not in self._functions:
            restype, argtypes = capi.PROTOTYPES[name]

            def callback(*args):
                self.calls.append(name)
                CALLS.append(name)
                try:
                    getattr(self, "_" + name)(*args)  # looked up per call: tests may patch it
                except Exception as exc:  # ctypes would swallow it: raise it after the call
                    self._failure = exc
                    return 4000  # CUDNN_STATUS_INTERNAL_ERROR
                return 0

            # Built from the project's prototype: ctypes converts every argument exactly
            # as it would for the real function, and rejects what it would reject.
            prototype = ctypes.CFUNCTYPE(restype, *argtypes)
            function = prototype(callback)

            def call(*args):
                status = function(*args)
                if self._failure is not None:
                    failure, self._failure = self._failure, None
                    raise failure
                return status

            self._functions[name] = (call, function)
        return self._functions[name][0]

    # --- descriptors, read back through real cuDNN
    def _rnn(self, desc):
        """(RNNConfig without dropout, dtype, (dropout, states pointer) or None)."""
        names = ["algo", "cellMode", "biasMode", "dirMode", "inputMode", "dataType", "mathPrec",
                 "mathType", "inputSize", "hiddenSize", "projSize", "numLayers"]
        values = [ctypes.c_int() for _ in names]
        dropout, aux = ctypes.c_void_p(), ctypes.c_uint32()
        real_api().cudnnGetRNNDescriptor_v8(ctypes.c_void_p(desc), *map(ctypes.byref, values),
                                            ctypes.byref(dropout), ctypes.byref(aux))
        v = {n: x.value for n, x in zip(names, values)}
        assert v["biasMode"] == capi.CUDNN_RNN_DOUBLE_BIAS and aux.value == 1
        H, P = v["hiddenSize"], v["projSize"]
        config = RNNConfig(rnn_mode=_MODES[v["cellMode"]], skip_input=v["inputMode"] == 1,
                           bidirectional=v["dirMode"] == 1, num_layers=v["numLayers"],
                           num_units=H, input_size=v["inputSize"], num_proj=0 if P == H else P)
        return config, _DTYPES[v["dataType"]], self.dropouts.get(dropout.value)

    @staticmethod
    def _data(desc, batch_hint=4096):
        dtype, layout_, T, B, W = (ctypes.c_int() for _ in range(5))
        lengths = (ctypes.c_int * batch_hint)()
        fill = ctypes.create_string_buffer(8)
        real_api().cudnnGetRNNDataDescriptor(ctypes.c_void_p(desc), *map(ctypes.byref, (dtype, layout_, T, B, W)),
                                             batch_hint, lengths, ctypes.cast(fill, ctypes.c_void_p))
        return dict(dtype=_DTYPES[dtype.value], time_major=layout_.value == 0, T=T.value,
                    B=B.value, W=W.value, lengths=np.array(lengths[:B.value]))

    def _stream(self, handle):
        return self.streams.get(handle, 0)

    # --- the calls that need a GPU
    def _cudnnCreate(self, handle_ptr):
        handle_ptr[0] = next(self._handles)
        self.devices[handle_ptr[0]] = current_device()

    def _cudnnDestroy(self, handle):
        # cuDNN's cudnnDestroy calls cudaDeviceSynchronize: illegal while a stream
        # captures (CUDA then invalidates the capture), a sync otherwise.
        if CAPTURING:
            _invalidate_captures("cudnnDestroy synchronized the device during a capture")
        else:
            COUNTS["sync"] += 1
            synchronize_all()
        self.streams.pop(handle, None)

    def _cudnnSetStream(self, handle, stream):
        self.streams[handle] = stream or 0

    def _cudnnDropoutGetStatesSize(self, handle, size):
        size[0] = DROPOUT_STATES_BYTES

    def _cudnnSetDropoutDescriptor(self, desc, handle, dropout, states, size, seed):
        self.dropouts[desc] = (dropout, states) if states and dropout else None
        if states and size:
            def initialise():  # a kernel: the RNG's seed and its position
                _array(states, np.uint8, (size,))[...] = 0
                _array(states, np.uint64, (2,))[...] = (seed, 0)
            _submit(self._stream(handle), initialise)

    def _cudnnRestoreDropoutDescriptor(self, desc, handle, dropout, states, size, seed):
        self.dropouts[desc] = (dropout, states) if states and dropout else None  # states as they are

    def _cudnnGetRNNWeightSpaceSize(self, handle, desc, size):
        config, dtype, _ = self._rnn(desc)
        size[0] = weight_space_elements(config) * np.dtype(dtype).itemsize

    def _cudnnGetRNNWeightParams(self, handle, desc, k, size, space, lin, m_desc, m_addr, b_desc, b_addr):
        config, dtype, _ = self._rnn(desc)
        itemsize = np.dtype(dtype).itemsize
        m_addr[0] = b_addr[0] = None
        for slot in weight_slots(config):
            if slot.pseudo_layer != k or slot.lin_layer_id != lin:
                continue
            tensor = m_desc if slot.kind == "weight" else b_desc
            dims = (1,) * (3 - len(slot.shape)) + slot.shape
            strides = [int(np.prod(dims[i + 1:])) for i in range(3)]
            real_api().cudnnSetTensorNdDescriptor(ctypes.c_void_p(tensor), capi.CUDNN_DATA_FLOAT, 3,
                                                  (ctypes.c_int * 3)(*dims), (ctypes.c_int * 3)(*strides))
            address = space + slot.offset * itemsize
            if slot.kind == "weight":
                m_addr[0] = address
            else:
                b_addr[0] = address

    def _cudnnGetRNNTempSpaceSizes(self, handle, desc, mode, x_desc, work, reserve):
        config, dtype, _ = self._rnn(desc)
        x = self._data(x_desc)
        work[0], reserve[0] = temp_space_bytes(config, dtype, x["T"], x["B"],
                                               mode == capi.CUDNN_FWD_MODE_TRAINING,
                                               self.devices.get(handle, 0))

    def _call(self, handle, desc, x_desc, dev_lengths, training, work_size, reserve_size):
        """What a compute call reads on the host when it is made: the descriptors."""
        config, dtype, dropout = self._rnn(desc)
        x = self._data(x_desc)
        assert (x["lengths"] > 0).all(), "cuDNN rejects zero-length sequences"
        work, reserve = temp_space_bytes(config, dtype, x["T"], x["B"], training,
                                         self.devices.get(handle, 0))
        assert work_size >= work, f"workspace of {work_size} bytes, cuDNN needs {work}"
        assert reserve_size >= reserve, f"reserve of {reserve_size} bytes, cuDNN needs {reserve}"
        return config, np.dtype(dtype), dropout, x, ctypes.cast(dev_lengths, ctypes.c_void_p).value

    @staticmethod
    def _problem(config, dtype, x, lengths_ptr, training):
        """The problem a queued call computes, reading devSeqLengths now (cuDNN reads them
        from the device while it runs)."""
        device_lengths = _array(lengths_ptr, np.int32, (x["B"],))
        np.testing.assert_array_equal(device_lengths, x["lengths"],
                                      err_msg="devSeqLengths, read when cuDNN ran")
        return Problem(config, x["T"], x["B"], x["time_major"], dtype, x["lengths"],
                       is_training=training)

    def _views(self, problem, config, dtype, x, hx, cx, w):
        data = lambda ptr, width: ptr and _array(ptr, dtype, problem.data_shape(width))
        LD, B = config.num_pseudo_layers, problem.batch_size
        state = lambda ptr, width: None if not ptr else _array(ptr, dtype, (LD, B, width))
        return (data(x, config.input_size), state(hx, config.state_size),
                state(cx, config.num_units), _array(w, dtype, (weight_space_elements(config),)))

    @staticmethod
    def _states(problem, *states):
        """cuDNN's [L·D, B, ·] states in the layout the NumPy backend expects, and back."""
        return [s if s is None or problem.time_major else s.swapaxes(0, 1) for s in states]

    @staticmethod
    def _scribble(work, work_size):
        if work and work_size:
            _array(work, np.uint8, (work_size,)).fill(POISON)

    def _cudnnRNNForward(self, handle, desc, mode, dev_lengths, x_desc, x, y_desc, y, h_desc, hx, hy,
                         c_desc, cx, cy, w_size, w, work_size, work, reserve_size, reserve):
        training = mode == capi.CUDNN_FWD_MODE_TRAINING
        config, dtype, dropout, xd, lengths_ptr = self._call(handle, desc, x_desc, dev_lengths, training,
                                                             work_size, reserve_size)

        def run():
            problem = self._problem(config, dtype, xd, lengths_ptr, training)
            if training and dropout is not None:  # masks from the RNG's state, which advances
                rate, states = dropout
                position = _array(states, np.uint64, (2,))
                seed = int.from_bytes(hashlib.blake2b(position.tobytes(), digest_size=8).digest(),
                                      "little")
                position[1] += 1
                problem = Problem(config.with_dropout(rate, seed), xd["T"], xd["B"],
                                  xd["time_major"], dtype, xd["lengths"], is_training=True)
            X, HX, CX, W = self._views(problem, config, dtype, x, hx, cx, w)
            assert w_size == W.nbytes
            self._scribble(work, work_size)
            out = cpu_rnn.forward(problem, X, *self._states(problem, HX, CX), W)
            out_h, out_c = self._states(problem, out[1], out[2] if config.is_lstm else None)
            width = config.num_dirs * config.state_size
            _array(y, dtype, problem.data_shape(width))[...] = out[0]
            _array(hy, dtype, HX.shape)[...] = out_h
            if cy:
                _array(cy, dtype, CX.shape)[...] = out_c
            if training:  # keep copies: the backend's temporaries may be freed after the call
                copy = lambda a: None if a is None else a.copy()
                token = next(self._tokens)  # in the reserve space, so a copy of it works too
                _array(reserve, np.int64, (1,))[0] = token
                self.state[token] = ("forward", problem, copy(X), copy(HX), copy(CX), copy(W),
                                     out)

        _submit(self._stream(handle), run)

    def _cudnnRNNBackwardData_v8(self, handle, desc, dev_lengths, y_desc, y, dy, x_desc, dx, h_desc,
                                 hx, dhy, dhx, c_desc, cx, dcy, dcx, w_size, w, work_size, work,
                                 reserve_size, reserve):
        config, dtype, _, xd, lengths_ptr = self._call(handle, desc, x_desc, dev_lengths, True,
                                                       work_size, reserve_size)

        def run():
            self._problem(config, dtype, xd, lengths_ptr, True)
            token = int(_array(reserve, np.int64, (1,))[0])
            record = self.state.get(token)
            self._scribble(work, work_size)
            if record is None or record[0] != "forward":
                # No forward's record in this reserve space (BackwardData overwrote it): what
                # cuDNN would compute from it is garbage.
                problem = Problem(config, xd["T"], xd["B"], xd["time_major"], dtype,
                                  xd["lengths"], is_training=True)
                for ptr, shape in ((dx, problem.data_shape(config.input_size)),
                                   (dhx, (config.num_pseudo_layers, xd["B"], config.state_size)),
                                   (dcx, (config.num_pseudo_layers, xd["B"], config.num_units))):
                    if ptr:
                        _array(ptr, dtype, shape)[...] = np.nan
                return
            problem, X, HX, CX, W, out = record[1:]
            width = config.num_dirs * config.state_size
            # the backend hands backward the same inputs and outputs forward saw and made
            np.testing.assert_array_equal(_array(y, dtype, problem.data_shape(width)), out[0],
                                          err_msg="y handed to backward data")
            np.testing.assert_array_equal(self._views(problem, config, dtype, 0, hx, cx, w)[1], HX,
                                          err_msg="hx handed to backward data")
            np.testing.assert_array_equal(_array(w, dtype, W.shape), W,
                                          err_msg="weights handed to backward data")
            DY = _array(dy, dtype, problem.data_shape(width))
            DHY = _array(dhy, dtype, HX.shape)
            DCY = _array(dcy, dtype, CX.shape) if dcy else None
            grads = cpu_rnn.backprop(problem, X, *self._states(problem, HX, CX), W, *out[:3], DY,
                                           *self._states(problem, DHY, DCY), out[3])
            g_h, g_c = self._states(problem, grads[1], grads[2] if config.is_lstm else None)
            # dx at the valid steps only: nothing in cuDNN's documentation says it
            # writes dx past each length, so the stand-in leaves that as it was.
            valid = _valid_steps(problem)
            _array(dx, dtype, X.shape)[valid] = (grads[0] + _padding_poison(problem, DY))[valid]
            _array(dhx, dtype, HX.shape)[...] = g_h
            if dcx:
                _array(dcx, dtype, CX.shape)[...] = g_c
            # reserveSpace is [in,out] here: its gate activations become gate gradients,
            # which is what the weight pass reads.
            after = next(self._tokens)
            _array(reserve, np.int64, (1,))[0] = after
            self.state[after] = ("data", problem, X, grads[3])

        _submit(self._stream(handle), run)

    def _cudnnRNNBackwardWeights_v8(self, handle, desc, add, dev_lengths, x_desc, x, h_desc, hx,
                                    y_desc, y, w_size, dw, work_size, work, reserve_size, reserve):
        assert add == capi.CUDNN_WGRAD_MODE_ADD
        config, dtype, _, xd, lengths_ptr = self._call(handle, desc, x_desc, dev_lengths, True,
                                                       work_size, reserve_size)

        def run():
            self._problem(config, dtype, xd, lengths_ptr, True)
            token = int(_array(reserve, np.int64, (1,))[0])
            record = self.state.get(token)
            self._scribble(work, work_size)
            target = _array(dw, dtype, (weight_space_elements(config),))
            if record is None or record[0] != "data":  # no backward data ran on this reserve
                target[...] = np.nan
                return
            problem, X, dparams = record[1:]
            np.testing.assert_array_equal(_array(x, problem.dtype, X.shape), X,
                                          err_msg="x handed to backward weights")
            target[...] += dparams + _padding_poison(problem, X)

        _submit(self._stream(handle), run)


def _valid_steps(problem):
    """[T, B] (or [B, T]) True at the steps before each sequence's length."""
    steps = np.arange(problem.max_time)[:, None] < problem.full_lengths[None, :]
    return steps if problem.time_major else steps.T


def _padding_poison(problem, data):
    """What the padding of `data` adds to a product over every (t, b) slot with zero
    gradients there: 0, or NaN when the padding holds NaN or Inf (as cuDNN's GEMMs do)."""
    lengths = problem.full_lengths
    steps = np.arange(problem.max_time)[:, None] >= lengths[None, :]  # [T, B] padding
    padding = steps if problem.time_major else steps.T
    return data.dtype.type(0) * np.asarray(data)[padding].sum(dtype=data.dtype)


# ----------------------------------------------------------------- cuDNN's weight slots

WeightSlot = collections.namedtuple("WeightSlot", "pseudo_layer lin_layer_id kind offset shape")


def weight_slots(config: RNNConfig) -> list:
    """cuDNN's weight space as its documentation orders it, independent of layout.py.

    Every matrix first, pseudo-layer by pseudo-layer and by linLayerID within one (input
    matrices of the gates 0..G-1, recurrent ones G..2G-1, the LSTM projection 2G; skip
    input has no layer-0 input matrices), then every bias likewise (no projection bias).
    Gate order (GATES): LSTM i, f, c, o; GRU r, z, h. Offsets in elements.
    """
    G, H, P, D = len(GATES[config.rnn_mode]), config.num_units, config.state_size, config.num_dirs
    slots, offset = [], 0
    for kind in ("weight", "bias"):
        for k in range(config.num_layers * D):
            layer = k // D
            width = config.input_size if layer == 0 else D * P
            for lin in range(2 * G + (1 if config.num_proj else 0)):
                if lin == 2 * G:
                    shape = (P, H) if kind == "weight" else None
                elif lin < G:
                    absent = kind == "weight" and config.skip_input and layer == 0
                    shape = None if absent else ((H, width) if kind == "weight" else (H,))
                else:
                    shape = (H, P) if kind == "weight" else (H,)
                if shape is None:
                    continue
                slots.append(WeightSlot(k, lin, kind, offset, shape))
                offset += int(np.prod(shape))
    return slots


def weight_space_elements(config: RNNConfig) -> int:
    last = weight_slots(config)[-1]
    return last.offset + int(np.prod(last.shape))


_GPU_CALLS = {"cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnDropoutGetStatesSize",
              "cudnnSetDropoutDescriptor", "cudnnRestoreDropoutDescriptor",
              "cudnnGetRNNWeightSpaceSize", "cudnnGetRNNWeightParams", "cudnnGetRNNTempSpaceSizes",
              "cudnnRNNForward", "cudnnRNNBackwardData_v8", "cudnnRNNBackwardWeights_v8"}


# ----------------------------------------------------------------- the light stand-in

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
