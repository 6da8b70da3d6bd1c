"""One background thread that lets go of device memory once the GPU is past its work.

What it takes (``release_after``): objects holding device blocks, and the events after
the last work that uses them. It waits for the events, in the order they were handed
over, and then drops the objects, so their blocks are freed. It serves:

* ``cuda.foreign``: other libraries' arrays a call read, kept until its work is done;
* ``cuda.lifetime``: a dead plan's or dropout states' blocks used on another stream than
  their home;
* ``cuda.graphs``: a dropped graph's plans and private pool, after its last replay.

How it waits:

* a blocking sync of a blocking-sync event: the thread sleeps, no spinning;
* in relaxed capture interaction mode (CUDA's ``cudaThreadExchangeStreamCaptureMode``,
  as NCCL does for its uncaptured work), set once per CuPy it serves. So its syncs, and
  the ``cudaFree`` of a dropped pool, are legal while another thread captures a graph
  in global mode (``torch.cuda.graph``'s default), and never invalidate that capture;
* never in a CUDA host callback (which may call no CUDA function: a library's free
  may; and a Python callback would hold the stream until it got the GIL).

Where a wait fails (a CUDA error), the objects are kept for the process's life: a leak,
never a use after free. Finalisers hand it objects during a garbage collection, so
nothing here blocks on a lock a collection could find held on its own thread.
"""

from __future__ import annotations

import queue
import threading

from ..core import driver, gpu

#: The name of the thread that waits for work to be done and then releases its memory.
WAITER_NAME = "pycudnnrnn-foreign-waiter"

# (cupy, events, arrays) in call order. A SimpleQueue: its put is reentrant, and ``cuda.lifetime``'s finalisers put from a garbage
# collection, which may come inside another put on the same thread.
_pending: queue.SimpleQueue = queue.SimpleQueue()
_never_released: list = []  # arrays whose wait failed: kept for the process's life
_waiter = None
_waiter_lock = threading.Lock()
# How many handed to the waiter are not released yet (``wait_released`` waits for 0).
# Re-entrant: a finaliser may hand the waiter more from inside a collection that comes
# while this thread holds it.
_released = threading.Condition(threading.RLock())
_unreleased = 0


def release_after(cupy, events, kept) -> None:
    """Let go of `kept` on the waiter, once every one of `events` (recorded outside any
    capture) is passed."""
    global _unreleased
    with _released:
        _unreleased += 1
    _pending.put((cupy, tuple(events), kept))
    _start_waiter()


def never_release(kept) -> None:
    """Keep `kept` for the process's life (a wait that cannot be made: a leak, never a
    use after free)."""
    _never_released.append(kept)


def wait_released() -> None:
    """Block until everything handed to the waiter is released (each once its work is
    done), what their release hands it in turn included (a plan's dropout states): a
    test's or a shutdown's wait, never a call's."""
    _start_waiter()
    with _released:
        _released.wait_for(lambda: _unreleased == 0)


def _start_waiter() -> None:
    global _waiter
    if _waiter is not None and _waiter.is_alive():
        return
    # Not blocking: a collection on this very thread, inside the block below (making a
    # thread allocates), may run a finaliser that lands here. Whoever holds the lock
    # starts the waiter, which then takes everything queued.
    if not _waiter_lock.acquire(blocking=False):
        return
    try:
        if _waiter is None or not _waiter.is_alive():  # none yet, or gone with a fork
            _waiter = threading.Thread(target=_wait_and_release, name=WAITER_NAME,
                                       daemon=True)
            _waiter.start()
    finally:
        _waiter_lock.release()


def _wait_and_release() -> None:
    relaxed_for = None  # the CuPy whose runtime relaxed this thread (tests swap CuPys)
    while True:
        item = _pending.get()
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
            del cupy, events, arrays, item  # released here: their finalisers may queue more
            event = None  # the loop's last one too
            _count_released()


def _count_released() -> None:
    global _unreleased
    with _released:
        _unreleased -= 1
        if not _unreleased:
            _released.notify_all()


def _relax_capture_mode(cupy) -> bool:
    """This thread's capture interaction mode → relaxed: its syncs are then legal while
    another thread captures in global mode. True once done."""
    return gpu.exchange_capture_mode(cupy, driver.CAPTURE_MODE_RELAXED) is not None
