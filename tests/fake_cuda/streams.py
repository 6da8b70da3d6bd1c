"""Time: streams and their queues, events, capture modes, stream capture and graphs.

cuDNN's compute calls and host→device copies are queued on their stream and run when
that stream, an event recorded on it or the device is synchronized; an upload's event is
queried at once, as CuPy's pinned-memory watcher does (``_upload``). Every other device
operation runs at once on the current stream, after that stream's queued work (``_now``).
Nothing orders two streams but events and syncs. Capture follows CUDA's rules for each
mode (see the package's docstring); a graph replays what its stream captured, by address.

A stream handle names a stream only at the call, as CUDA's special handles do (``_key``):
pointer 0 and 1 (``cudaStreamLegacy``) name the legacy stream of the device current at
the call, and pointer 2 (``cudaStreamPerThread``) the calling thread's own stream on that
device. Every other pointer is a stream of its own. Queues, events, captures and the pool
hold what the handle named then.
"""

import collections
import ctypes
import threading
import weakref

from pycudnnrnn.cuda import waiter

from .devices import current_device
from .state import (CALLS, CAPTURE_GLOBAL, CAPTURE_RELAXED, CAPTURING, COUNTS,
                    EVENT_WAIT_EXTERNAL, PER_THREAD_DEFAULT_STREAM, STRICT, _count, _local,
                    _lock, _progress)

#: cudaStreamLegacy and cudaStreamPerThread (pointer 0 names the legacy stream too).
LEGACY, PER_THREAD = 1, 2


def _key(ptr):
    """The stream that handle `ptr` names here and now: ``("legacy", device)`` for pointer
    0 or 1 (the current device's legacy stream), ``("per-thread", device, thread id)``
    for pointer 2 (this thread's own stream on the current device), else `ptr` itself.
    A key is its own key: what was resolved once names the same stream on any thread."""
    if type(ptr) is tuple or ptr > PER_THREAD:
        return ptr
    if ptr == PER_THREAD:
        return ("per-thread", current_device(), threading.get_ident())
    return ("legacy", current_device())


def _capture_of(ptr):
    """The graph the stream `ptr` names here captures into, or None."""
    return _CAPTURES.get(_key(ptr))


class _Queue:
    """A stream's queued work; `submitted` and `executed` count its operations."""

    __slots__ = ("ops", "submitted", "executed", "running")

    def __init__(self):
        self.ops, self.submitted, self.executed, self.running = collections.deque(), 0, 0, False


_QUEUES: dict = {}    # stream key (``_key``) → _Queue
_CAPTURES: dict = {}  # stream key → the FakeGraph it is capturing into


def _queue(ptr) -> _Queue:
    key = _key(ptr)
    q = _QUEUES.get(key)
    if q is None:
        q = _QUEUES[key] = _Queue()
    return q


def _submit(ptr, op, captured=True):
    """Queue `op` on stream `ptr` (or record it, while that stream captures and
    `captured`: the pool's own bookkeeping is never part of a graph)."""
    with _lock:
        graph = _capture_of(ptr) if captured else None
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


def _stream_stack(device):
    stacks = getattr(_local, "streams", None)
    if stacks is None:
        stacks = _local.streams = {}
    return stacks.setdefault(device, [])


def current_stream():
    """The current device's current stream on this thread (CuPy keeps one per device):
    by default its null stream, or with ``PER_THREAD_DEFAULT_STREAM[0]`` set (CuPy's
    ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``) the per-thread stream, pointer 2."""
    device = current_device()
    stack = _stream_stack(device)
    if stack:
        return stack[-1]
    return per_thread_stream(device) if PER_THREAD_DEFAULT_STREAM[0] else null_stream(device)


def _now(compute):
    """A device operation on the current stream: after its queued work, run now; while
    the stream captures, also recorded for replays. Returns what `compute()` returns."""
    ptr = current_stream().ptr
    _drain(ptr)
    value = compute()
    graph = _capture_of(ptr)
    if graph is not None:
        graph.ops.append(compute)
    return value


_EVENTS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()  # ptr → FakeEvent


class FakeEvent:
    """A CUDA event: a point in one stream's work, or (recorded in a capture) a node of
    a graph, which CUDA lets no one outside that capture query, sync or wait on."""

    _next = [0x9000]

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self._at = None  # (stream key, operations submitted before it)
        self.captured = False  # last recorded in a capture
        self._graph = None  # the graph of that capture
        self.ptr = FakeEvent._next[0]
        FakeEvent._next[0] += 0x10
        self.device = current_device()  # CUDA makes an event on the current device
        _EVENTS[self.ptr] = self

    def record(self, stream=None):
        stream = stream if stream is not None else current_stream()
        key = _key(stream.ptr)  # an event names its point in the stream named now
        device = key[1] if type(key) is tuple else stream.device_id
        if device != self.device:  # cudaEventRecord: "must be on the same device"
            raise RuntimeError(f"cudaErrorInvalidResourceHandle: an event of device "
                               f"{self.device} recorded on a stream of device {device}")
        with _lock:
            graph = _CAPTURES.get(key)
            self.captured, self._graph = graph is not None, graph
            if graph is not None:  # replayed: the event marks the replay's point
                graph.ops.append(lambda: None)
                self._at = (key, None)
                return
            self._at = (key, _queue(key).submitted)

    def _refuse_captured(self, what):
        if self.captured:
            raise RuntimeError(f"cudaErrorCapturedEvent: {what} on an event recorded in a "
                               f"stream capture")

    @property
    def done(self):
        """cudaEventQuery: refused on a captured event (which invalidates its capture
        unless that captures in relaxed mode), and as an unsafe call."""
        graph = self._graph
        if self.captured and graph is not None and graph.mode != CAPTURE_RELAXED:
            graph.invalid = graph.invalid or "cudaEventQuery on an event of the capture"
        self._refuse_captured("cudaEventQuery")
        _refuse_unsafe("cudaEventQuery")
        if self._at is None:
            return True
        ptr, upto = self._at
        return _queue(ptr).executed >= upto

    def synchronize(self):
        self._refuse_captured("cudaEventSynchronize")
        _refuse_unsafe("cudaEventSynchronize")
        if threading.current_thread().name == waiter.WAITER_NAME:
            at = self._at  # a background wait: until a test's thread has run the work
            with _progress:
                _progress.wait_for(lambda: at is None or _queue(at[0]).executed >= at[1])
            return
        _count("sync")
        if self._at is not None:
            _drain(*self._at)


_WATCHED = collections.deque()  # events after uploads, as CuPy's pinned-memory watcher's


def _upload(copy):
    """A host→device copy on the current stream, as CuPy makes one: `copy` is queued
    (on a capturing stream: a graph node, run at each replay and not now), then an
    event is recorded after it and watched as CuPy's pinned-memory watcher does
    (``_EventWatcher.add``): the events watched are queried in order while done, then
    the new one at once. So an upload on a capturing stream queries an event recorded
    in the capture: refused, and in global or thread-local mode the capture is lost."""
    COUNTS["host_to_device"] += 1
    stream = current_stream()
    _submit(stream.ptr, copy)
    event = stream.record()
    while _WATCHED and _WATCHED[0].done:
        _WATCHED.popleft()
    if not event.done:
        _WATCHED.append(event)


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
    ptr = _key(ptr)
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
        if _capture_of(self.ptr) is not None:
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
        key = _key(self.ptr)
        CAPTURING.append(key)
        _CAPTURES[key] = FakeGraph(len(CALLS), CAPTURE_RELAXED if mode is None else mode)

    def is_capturing(self):
        return _capture_of(self.ptr) is not None

    def end_capture(self):
        key = _key(self.ptr)
        CAPTURING.remove(key)
        graph = _CAPTURES.pop(key)
        graph.calls = CALLS[graph.start:]
        if graph.invalid:
            raise RuntimeError(f"cudaErrorStreamCaptureInvalidated: {graph.invalid}")
        return graph


NULL_STREAM = FakeStream(null=True, device_id=0)
_NULL_STREAMS = {0: NULL_STREAM}
_PER_THREAD_STREAMS: dict = {}


def null_stream(device: int) -> FakeStream:
    """Device `device`'s null stream: pointer 0, which names the legacy stream of the
    device current at each call (``_key``), as in CUDA."""
    stream = _NULL_STREAMS.get(device)
    if stream is None:
        stream = _NULL_STREAMS[device] = FakeStream(null=True, device_id=device)
    return stream


def per_thread_stream(device: int) -> FakeStream:
    """CuPy's per-thread default stream on `device` (``cupy.cuda.Stream.ptds``): pointer
    2, which names the calling thread's own stream on the current device (``_key``)."""
    stream = _PER_THREAD_STREAMS.get(device)
    if stream is None:
        stream = _PER_THREAD_STREAMS[device] = FakeStream(ptr=PER_THREAD, device_id=device)
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


def synchronize_all():
    """Run every stream's queued work (uncounted: the stand-in's own, not the library's)."""
    with _lock:
        ptrs = list(_QUEUES)
        for ptr in (reversed(ptrs) if STRICT[0] else ptrs):
            _drain(ptr)
        if any(q.ops for q in _QUEUES.values()):  # work queued while draining
            synchronize_all()

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


def device_synchronize():
    _count("sync")
    synchronize_all()
