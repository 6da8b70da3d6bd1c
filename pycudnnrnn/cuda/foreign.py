"""Another library's CUDA arrays: the stream to run on, and keeping them alive.

A PyTorch tensor's work runs on PyTorch's current stream (its allocator reuses freed
memory in that stream's order). Arrays of any other library than CuPy (JAX's, or any
DLPack array) are kept until the work that reads them is done, and no longer: their
library may reuse their memory at once on its own stream, unordered with ours.

The rule (``keep_until_done``):

* after a call's work is queued, an event is recorded on the call's stream, and the
  call's arrays go with it to one background thread of ours (``WAITER_NAME``), which
  waits for the event (a blocking sync of a blocking-sync event: no spinning) and then
  lets go of them. So they are released once the GPU is past the work that reads them,
  whether or not another call follows: a process that makes one call and then waits
  holds nothing. Calls are released in the order they were made (a call whose work
  ends early on one stream waits for an earlier call's on another);
* the waiter sets its thread's capture interaction mode to relaxed (CUDA's
  ``cudaThreadExchangeStreamCaptureMode``, as NCCL does for its uncaptured work), so
  its syncs are legal while another thread captures a graph in global mode
  (``torch.cuda.graph``'s default), and never invalidate that capture.
  No event of ours is ever queried, on any thread;
* under a capture (``pycudnnrnn.graphs.capture``, or a stream capturing for anyone
  else) nothing is recorded or kept: an event recorded in a capture cannot be waited
  on outside it, and every replay reads the arrays again, long after: whoever keeps
  the graph keeps the arrays it reads (``docs/gpu.md``);
* the same waiter releases what ``cuda.lifetime`` hands it (``release_after``): the
  blocks of a plan or of dropout states used on another stream than their home, once
  the events after those uses are passed;
* the arrays are released on the waiter, never in a CUDA host callback (which may call
  no CUDA function: their library's free may; and a Python callback would hold the
  stream until it got the GIL). Where the wait fails (a CUDA error), they are kept for
  the process's life: a leak, never a use after free.
"""

from __future__ import annotations

import queue
import threading

from ..core import driver, gpu
from . import graphs

#: The name of the thread that waits for calls' work and then releases their arrays.
WAITER_NAME = "pycudnnrnn-foreign-waiter"

# (cupy, events, arrays) in call order, or a threading.Event to set when reached. A
# SimpleQueue: its put is reentrant, and ``cuda.lifetime``'s finalisers put from a garbage
# collection, which may come inside another put on the same thread.
_pending: queue.SimpleQueue = queue.SimpleQueue()
_never_released: list = []  # arrays whose wait failed: kept for the process's life
_waiter = None
_waiter_lock = threading.Lock()


def caller_stream(cupy, array, device: int):
    """CuPy's view of the stream `array`'s library works on, to run the call there: a
    PyTorch CUDA tensor's current stream; None for other arrays (CuPy's current stream
    then, and ``keep_until_done`` for those from another library), and inside
    ``pycudnnrnn.graphs.capture``, whose stream is the one to capture on."""
    if type(array).__module__.split(".")[0] != "torch" or graphs.holding() is not None:
        return None
    import torch
    return gpu.external_stream(cupy, torch.cuda.current_stream(device).cuda_stream, device)


def keep_until_done(cupy, arrays) -> None:
    """Keep another library's `arrays` alive until the work just queued on CuPy's
    current stream (which reads them) is done, then release them (see the module's
    rule). Not while that stream captures a graph: the caller keeps what a graph reads.
    """
    stream = cupy.cuda.get_current_stream()
    if graphs.holding() is not None or stream.is_capturing():
        return
    event = cupy.cuda.Event(block=True, disable_timing=True)  # its sync sleeps, not spins
    event.record(stream)
    release_after(cupy, (event,), tuple(arrays))


def release_after(cupy, events, kept) -> None:
    """Let go of `kept` on the waiter, once every one of `events` (recorded outside any
    capture) is passed."""
    _pending.put((cupy, tuple(events), kept))
    _start_waiter()


def never_release(kept) -> None:
    """Keep `kept` for the process's life (a wait that cannot be made: a leak, never a
    use after free)."""
    _never_released.append(kept)


def wait_released() -> None:
    """Block until every call's arrays handed to the waiter so far are released (each
    once its work is done: a test's or a shutdown's wait, never a call's)."""
    reached = threading.Event()
    _pending.put(reached)
    _start_waiter()
    reached.wait()


def _start_waiter() -> None:
    global _waiter
    if _waiter is not None and _waiter.is_alive():
        return
    with _waiter_lock:
        if _waiter is None or not _waiter.is_alive():  # none yet, or gone with a fork
            _waiter = threading.Thread(target=_wait_and_release, name=WAITER_NAME,
                                       daemon=True)
            _waiter.start()


def _wait_and_release() -> None:
    relaxed_for = None  # the CuPy whose runtime relaxed this thread (tests swap CuPys)
    while True:
        item = _pending.get()
        if isinstance(item, threading.Event):  # wait_released's mark
            item.set()
            continue
        cupy, events, arrays = item
        try:
            if relaxed_for is not cupy:
                relaxed_for = cupy  # tried once: without it, syncs as any thread's
                _relax_capture_mode(cupy)
            for event in events:
                event.synchronize()
        except Exception:  # a wait refused or failed: the work may still read them
            _never_released.append(arrays)  # a leak, never a use after free
        finally:
            del cupy, events, arrays, item
            event = None  # the loop's last one too


def _relax_capture_mode(cupy) -> bool:
    """This thread's capture interaction mode → relaxed: its syncs are then legal while
    another thread captures in global mode. True once done."""
    return exchange_capture_mode(cupy, driver.CAPTURE_MODE_RELAXED) is not None


def exchange_capture_mode(cupy, mode: int) -> int | None:
    """This thread's capture interaction mode → `mode`; the previous one, or None without
    a driver. CuPy has no binding for it: the driver's ``cuThreadExchangeStreamCaptureMode``
    (the runtime's forwards to it), unless `cupy`'s runtime has one."""
    exchange = getattr(cupy.cuda.runtime, "threadExchangeStreamCaptureMode", None)
    if exchange is not None:
        return exchange(mode)
    return driver.exchange_stream_capture_mode(mode)
