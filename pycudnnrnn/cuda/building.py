"""Device memory built while CuPy's current stream captures a CUDA graph.

A plan's construction uploads host data (lengths, row index, padding masks, reserve
header), allocates, and records the event its runs on other streams wait for; a seed's
new dropout states are initialised by a cuDNN kernel, copied, and an event recorded
after them. On a capturing stream none of that would run: the uploads would become
graph nodes, run at each replay and not now; the events would be recorded in the
capture, so that no one outside it could wait on them; and CuPy's ``asarray`` queries
the event of its staging copy at once, which CUDA refuses for an event recorded in a
capture, and refuses for any event while this thread captures in global or
thread-local mode (``torch.cuda.graph``'s default), invalidating that capture.

So a build that finds CuPy's current stream capturing (a cache miss during a capture:
no warm-up, an eviction or ``clear_caches()`` since) runs outside the capture
(``outside_capture``):

* on a private stream of the device, never captured: one per device, kept for the
  process;
* with this thread's capture interaction mode relaxed meanwhile (CUDA's
  ``cudaThreadExchangeStreamCaptureMode``, as NCCL does for its uncaptured work), so
  that CuPy's allocations, its staging copies and their event query are legal while
  this thread captures in any mode; the previous mode is put back after.

The build's work is then real, queued on the private stream, and its events are
ordinary ones. The capturing stream waits for them as external events
(``lifetime.wait``), a wait every replay honours. The private stream is the home of
the plan and of the states (``lifetime.Lifetime``): their blocks were allocated in that
stream's arena of CuPy's pool, and go back there. So every eager run of such a plan is
on a stream other than home, and records one event, as a run on a side stream does;
when the plan dies, its blocks are let go only once the GPU is past those runs
(``lifetime``'s rule). Runs captured by a graph we do not own pin the plan for good.
"""

from __future__ import annotations

import contextlib
import threading

from ..core import driver, gpu

#: What to do instead, said by every error of a build during a capture.
WARM_UP = ("call it once with the same configuration, lengths and seed before the "
           "capture (a warm-up, outside it), so that its plan and dropout states exist "
           "when the capture starts")

_streams: dict = {}  # device → the private stream builds run on while a stream captures
_streams_lock = threading.Lock()


@contextlib.contextmanager
def outside_capture(cupy, device: int):
    """Build device memory that outlives the call, never inside a capture.

    Enter it with `device` current. Yields the stream to build on: CuPy's current one,
    unless it captures a graph; then the device's private stream, made current, with
    this thread's capture interaction mode relaxed until the block ends. Building
    inside needs nothing else: allocate, upload and record on CuPy's current stream.

    Raises
    ------
    RuntimeError
        While a stream captures, when this thread's capture mode cannot be relaxed (no
        CUDA driver library): the message names the warm-up. An error raised inside
        the block while a stream captures is raised as it is, with a note naming it.
    """
    stream = cupy.cuda.get_current_stream()
    if not stream.is_capturing():
        yield stream
        return
    previous = gpu.exchange_capture_mode(cupy, driver.CAPTURE_MODE_RELAXED)
    if previous is None:
        raise RuntimeError(
            "pycudnnrnn: a new plan (or a new seed's dropout states) would be built while "
            "CuPy's current stream captures a CUDA graph, and this thread's capture mode "
            "cannot be relaxed to build it outside the capture (the CUDA driver's "
            f"{driver._LIBCUDA} does not load): {WARM_UP}")
    try:
        with _private_stream(cupy, device) as private:
            yield private
    except BaseException as error:
        if hasattr(error, "add_note"):  # Python 3.11 on; 3.10 raises the error as it is
            error.add_note(f"pycudnnrnn: this happened while building a new plan (or "
                           f"dropout states) outside a CUDA-graph capture in progress; "
                           f"{WARM_UP}")
        raise
    finally:
        gpu.exchange_capture_mode(cupy, previous)


def _private_stream(cupy, device: int):
    """The device's stream for builds during a capture (made once, kept)."""
    stream = _streams.get(device)
    if stream is None:
        with _streams_lock:
            stream = _streams.get(device)
            if stream is None:
                with cupy.cuda.Device(device):
                    stream = _streams[device] = cupy.cuda.Stream(non_blocking=True)
    return stream

