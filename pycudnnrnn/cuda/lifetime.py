"""When a plan's device memory may go: which streams and graphs still use it.

A plan's buffers (device lengths, row index, padding mask, reserve header and, through
its descriptor, the dropout states) are read by the work each run queues, and by every
replay of a graph that captured a run. CuPy frees them, once the plan is gone, in the
order of the stream they were made on (the plan's home stream). ``Lifetime`` holds what
that order needs, and nothing else:

* the uploads' event: a run on another stream waits for it. It is never queried: CUDA
  refuses an event query while a stream captures in global or thread-local mode (the
  default of ``torch.cuda.graph``), and a capture waits on it as an external event;
* for each stream the plan ran on besides home, an event after its latest run there:
  when the plan dies, home waits for all of them, so no buffer is reused under work
  still queued on any stream;
* graphs: a graph captured by ``pycudnnrnn.graphs.capture`` keeps the plans it ran (see
  there). A graph captured by anyone else (``torch.cuda.graph``, ``torch.compile``'s
  CUDA graph trees, CuPy's ``Stream.begin_capture``) keeps nothing, and we cannot see
  when it dies: a plan run under such a capture is pinned for the life of the process
  (``pinned``). Its cost is the plan's own memory (lengths, masks, header: bytes to
  kilobytes) and, with dropout, its seed's dropout states (~6 MiB per seed and device),
  once per plan captured; see ``docs/gpu.md``.
"""

from __future__ import annotations

import threading
import weakref

from . import graphs

#: cudaEventWaitExternal: a capturing stream's wait on an event recorded outside it.
EVENT_WAIT_EXTERNAL = 1

_pinned: dict = {}  # id → plan executor run under a capture we do not own: kept for good
_waited_in_graphs: dict = {}  # id → event a captured graph waits on as external
_pinned_lock = threading.Lock()


def pinned() -> int:
    """How many plans are pinned by graphs captured outside ``pycudnnrnn.graphs``."""
    return len(_pinned)


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


class Lifetime:
    """Who still uses one plan's memory: its uploads, the streams it ran on, graphs.

    Parameters
    ----------
    cupy
        The CuPy module.
    owner
        The plan's executor: when it is collected, home waits for every stream's last
        run (its buffers are freed in home's order right after).
    stream
        The home stream, on which the plan's uploads were just queued.
    """

    def __init__(self, cupy, owner, stream):
        self.cupy = cupy
        self.home = stream.ptr
        self.ready = stream.record()  # after the uploads
        self.settled = False  # the caller synchronized since: no wait needed
        self._last_use: dict = {}  # stream pointer → event after the plan's latest run there
        weakref.finalize(owner, _fence, stream, self._last_use, self.ready)

    def enter(self, stream) -> None:
        """Before a run on `stream`: order it after the plan's uploads (home needs not)."""
        if not self.settled and stream.ptr != self.home:
            wait(self.cupy, stream, self.ready)

    def leave(self, stream, owner) -> None:
        """After a run's work is queued on `stream`: note who uses `owner`'s memory now."""
        held = graphs.holding()
        if held is not None:  # pycudnnrnn.graphs.capture: that graph keeps the plan
            held.append(owner)
        elif stream.is_capturing():  # someone else's graph: it will replay this work
            with _pinned_lock:
                _pinned[id(owner)] = owner
        elif stream.ptr != self.home:
            self._last_use[stream.ptr] = stream.record()

    def settle(self) -> None:
        """The caller synchronized after the uploads: runs need not wait for them."""
        self.settled = True


def _fence(home, last_use, ready):
    """A dead plan's home stream waits for the plan's latest run on every other stream
    (its buffers are freed in home's order, right after this). `ready` is kept alive to
    here: a graph's external wait may name it."""
    for event in list(last_use.values()):
        try:
            home.wait_event(event)
        except Exception:  # never raise from a finaliser (at exit, CUDA may be gone)
            pass
