"""When device memory the GPU path hands to cuDNN may go: one owner, ``Lifetime``.

The blocks are a plan's buffers (device lengths, row index, padding masks, reserve
header), a seed's dropout states (the buffer, its initial copy, the copies kept for
keyed forwards) and, under a CUDA graph captured by someone else, a call's temporaries
(cuDNN's workspace, padded and gathered copies, the reserve copy). Each kind is released
through one ``Lifetime``, made with the object that owns the blocks (a plan's executor,
a ``DropoutStates``). It knows:

* the blocks' homes: the streams they were allocated on. CuPy's pool frees a block into
  the arena of its allocation stream, where the next allocation on that stream takes it
  at once, ordered only after that stream's work;
* their uses: for every stream that ran work on them, other than their one home, an
  event after the latest such work. Streams are told apart by CUDA's identity
  (``stream_key``), not by pointer: pointer 0 (and 1) is the legacy stream of a device,
  and pointer 2 (``cudaStreamPerThread``, CuPy's per-thread default stream) is a
  different stream on every thread;
* the graphs that replay work on them. A graph of ``pycudnnrnn.graphs.capture`` keeps the
  owners it ran; when it goes, it records one event on its own stream, after every replay
  it queued, and hands it to each owner as a use (``Lifetime.used_on``): nothing per
  replay. A graph captured by anyone else (``torch.cuda.graph``, CUDA-graph trees, CuPy's
  ``Stream.begin_capture``) keeps nothing, and we cannot see it die: a plan run under
  such a capture is pinned for the process, and so are the call's temporaries: they come
  from a private pool made for that call, pinned with the plan, unless the current
  allocator keeps its blocks for graphs itself (``keeps_blocks_for_graphs``: PyTorch's,
  whose blocks ``torch.cuda.graph`` takes from the graph's pool). ``pinned()`` and
  ``pinned_bytes()`` count what is pinned.

The release rule, one for every kind: when the owner dies, its blocks go at once if
every use was on their one home (CuPy frees them in that stream's order, after the work:
no cost). Otherwise they go, with the use events, to the background waiter
(``cuda.waiter``), which waits for the events (in relaxed capture mode, so legal while
any thread captures) and then lets go of them.

Why the waiter, rather than making each home wait for the events: a fence must name the
home stream from the thread and device the garbage collector happens to run on, and it
cannot always. Pointer 0 there is the *current* device's legacy stream, not the home's
device's; pointer 2 is the collecting thread's own per-thread stream, not the home
thread's; and a home that is another library's stream (a PyTorch side stream) may have
been destroyed by then. The waiter needs none of them: an event names its point in its
stream whatever thread waits on it, and after the events the blocks are free to reuse
on any stream. So the finaliser makes no CUDA call at all (a collection may come at any
point, inside a capture too). What it costs: blocks used on another stream live until
the waiter has seen their work done, a moment after it is.

Events recorded inside a capture are never waited on outside it: nothing is recorded
while the run's stream captures.
"""

from __future__ import annotations

import threading
import weakref

from ..core import gpu
from . import graphs, waiter

#: cudaEventWaitExternal: a capturing stream's wait on an event recorded outside it.
EVENT_WAIT_EXTERNAL = 1
#: cudaStreamLegacy and cudaStreamPerThread, the special stream handles besides 0.
LEGACY_STREAM, PER_THREAD_STREAM = 1, 2
#: cudaStreamCaptureModeRelaxed, for a thread's capture interaction mode.
CAPTURE_MODE_RELAXED = 2

_pinned: dict = {}  # id → plan executor run under a capture we do not own: kept for good
_pinned_pools: list = []  # private pools of calls' temporaries under such captures
_waited_in_graphs: dict = {}  # id → event a captured graph waits on as external
_pinned_lock = threading.Lock()


def stream_key(stream, device: int) -> tuple:
    """CUDA's identity of `stream` (a CuPy stream) on `device`: ``(device, pointer)``
    for a stream of its own; ``(device, 0)`` for the legacy stream (pointer 0 or 1); and
    ``(device, 2, thread id)`` for the per-thread default stream, which pointer 2 names
    on every thread (CuPy's pool keys it by thread too)."""
    ptr = stream.ptr
    if ptr > PER_THREAD_STREAM:
        return (device, ptr)
    if ptr == PER_THREAD_STREAM:
        return (device, ptr, threading.get_ident())
    return (device, 0)


def pinned() -> int:
    """How many plans are pinned by graphs captured outside ``pycudnnrnn.graphs``."""
    return len(_pinned)


def pinned_bytes() -> int:
    """Bytes of the private pools pinned for calls' temporaries under such graphs."""
    with _pinned_lock:
        return sum(pool.total_bytes() for pool in _pinned_pools)


def wait(cupy, stream, event) -> None:
    """`stream` waits for `event` (recorded outside any capture), also while `stream`
    captures: then as an external event, which each replay waits for (the graph names
    the event's handle, so the event is kept for the process's life)."""
    if stream.is_capturing():
        cupy.cuda.runtime.streamWaitEvent(stream.ptr, event.ptr, EVENT_WAIT_EXTERNAL)
        with _pinned_lock:
            _waited_in_graphs[id(event)] = event
    else:
        stream.wait_event(event)


def use_event(cupy, stream):
    """An event recorded on `stream` now, after the work queued there: a blocking-sync
    one without timing (the waiter sleeps on it rather than spinning)."""
    return stream.record(cupy.cuda.Event(block=True, disable_timing=True))


class Lifetime:
    """Who still uses one owner's device blocks: streams, graphs; released at its death.

    Parameters
    ----------
    cupy
        The CuPy module.
    owner
        What holds the blocks (a plan's executor, a seed's dropout states). When it is
        collected, `keep` is released by the module's rule.
    stream
        The home stream: the blocks were just allocated on it (uploads queued there).
    device : int
        The blocks' device.
    keep
        What holds the blocks (arrays, or objects holding them; a list may still grow):
        kept from the owner's death until its release.
    parts
        Lifetimes of blocks the owner's runs also use (its dropout states): a graph's
        release event is theirs too.
    uploads : bool
        Whether work on other streams must wait for what was queued on home so far (an
        event, ``ready``).
    """

    def __init__(self, cupy, owner, stream, device: int, keep=(), parts=(), uploads=False):
        self.cupy, self.device = cupy, device
        self.home = stream_key(stream, device)
        self._homes = {self.home}
        self.ready = stream.record() if uploads else None
        self.settled = not uploads  # no uploads to wait for, or the caller synchronized
        self._uses: dict = {}  # stream key → event after the latest use there
        self._parts = tuple(parts)
        release = weakref.finalize(owner, _release, cupy, self._homes, self._uses, keep)
        release.atexit = False  # at exit nothing needs freeing, and CUDA may be gone

    def allocated_on(self, stream) -> None:
        """Note that more blocks were just allocated on `stream`: another home."""
        self._homes.add(stream_key(stream, self.device))

    def used(self, key, event) -> None:
        """Note `event` as after the latest use on the stream of `key`."""
        self._uses[key] = event

    def used_on(self, stream, event) -> None:
        """Note `event`, recorded on `stream`, as after the latest use there, of these
        blocks and of those of ``parts`` (a graph's release: see ``cuda.graphs``)."""
        key = stream_key(stream, self.device)
        self._uses[key] = event
        for part in self._parts:
            part.used(key, event)

    def enter(self, stream):
        """Before a run on `stream`: order it after the uploads (home needs not). Returns
        what ``leave`` takes: the stream's key, or, under a capture we do not own, a
        ``_Pinning`` (the call's temporaries then come from a private pool)."""
        key = stream_key(stream, self.device)
        if not self.settled and key != self.home:
            wait(self.cupy, stream, self.ready)
        if graphs.holding() is None and stream.is_capturing():
            return _Pinning(self.cupy)
        return key

    def leave(self, stream, token, owner) -> None:
        """After a run's work is queued on `stream`: note who uses `owner`'s blocks now.
        `token` is what ``enter`` returned."""
        if type(token) is not tuple:  # someone else's graph: it will replay this work
            token.close(owner)
            return
        held = graphs.holding()
        if held is not None:  # pycudnnrnn.graphs.capture: that graph keeps the plan
            held.append(owner)
            if stream.is_capturing():  # the graph's release event covers the replays
                return
            # The eager warm-up is a use like any other: the capture may fail after it,
            # and then no graph records a release event.
        if token != self.home:
            self._uses[token] = use_event(self.cupy, stream)

    def settle(self) -> None:
        """The caller synchronized after the uploads: runs need not wait for them."""
        self.settled = True


def _release(cupy, homes, uses, keep):
    """The owner is gone: let go of `keep` now when every use was on the one home (freed
    in its order), else once the waiter has seen every use's event."""
    events = [event for key, event in list(uses.items()) if len(homes) > 1 or key not in homes]
    if events:
        waiter.release_after(cupy, events, keep)


_graph_safe_allocators: list = []  # predicates: allocator → whether a graph's owner keeps its blocks


def keeps_blocks_for_graphs(predicate) -> None:
    """Register `predicate(allocator) -> bool`: True for an allocator whose blocks a
    graph's owner keeps as long as the graph (PyTorch's caching allocator, whose blocks
    ``torch.cuda.graph`` takes from the graph's private pool). Under a capture we do not
    own, a call's temporaries come from such an allocator as they are; from any other,
    they come from a private pool pinned with the plan."""
    _graph_safe_allocators.append(predicate)


def _keeps_blocks_for_graphs(cupy, allocator) -> bool:
    pool = getattr(allocator, "__self__", None)
    stream_ordered = getattr(cupy.cuda, "MemoryAsyncPool", None)  # cudaMallocAsync: graph nodes
    if stream_ordered is not None and isinstance(pool, stream_ordered):
        return True
    return any(keeps(allocator) for keeps in _graph_safe_allocators)


class _Pinning:
    """One run under a capture we do not own: the plan is pinned, and so are the call's
    temporaries. Unless the current allocator keeps its blocks for the graph
    (``keeps_blocks_for_graphs``), they come from a private pool for the call, pinned
    too: CuPy's default pool, or any pool of the application's (RMM's, a ``MemoryPool``
    of its own), would hand them to the next allocation, under the replays. The private
    pool allocates in relaxed capture mode: CUDA refuses ``cudaMalloc`` to a thread in
    global mode while it captures, PyTorch's default."""

    __slots__ = ("cupy", "pool", "allocating", "mode")

    def __init__(self, cupy):
        self.cupy = cupy
        self.pool = self.allocating = self.mode = None
        if not _keeps_blocks_for_graphs(cupy, cupy.cuda.get_allocator()):
            self.mode = gpu.exchange_capture_mode(cupy, CAPTURE_MODE_RELAXED)
            self.pool = cupy.cuda.MemoryPool()
            self.allocating = cupy.cuda.using_allocator(self.pool.malloc)
            self.allocating.__enter__()

    def close(self, owner) -> None:
        if self.allocating is not None:
            self.allocating.__exit__(None, None, None)
            if self.mode is not None:
                gpu.exchange_capture_mode(self.cupy, self.mode)
        with _pinned_lock:
            _pinned[id(owner)] = owner
            if self.pool is not None:
                _pinned_pools.append(self.pool)
