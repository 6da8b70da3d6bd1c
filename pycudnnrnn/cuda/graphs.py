"""CUDA graphs of plan runs: capture once with CuPy's stream capture, replay many times.

A plan's run makes no host↔device copy and no sync, so it can be captured. What a
graph must not do is use memory that is freed and reused after the capture: so the
capture runs on a private CuPy memory pool that lives as long as the graph, and runs
the function once eagerly first (the plan's "second call on"), so that the capture
finds every block it needs in that pool and allocates nothing new.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref

from ..core import gpu

class _Capturing(threading.local):
    held = None  # the default every thread sees: asked at every run, kept cheap


_capturing = _Capturing()


def holding():
    """The list a capture on this thread collects the plans its runs use in (the graph
    keeps them: its replays use their buffers), or None when no capture runs."""
    return _capturing.held


class CapturedGraph:
    """A captured function: ``replay()`` reruns its GPU work on the same buffers.

    Attributes
    ----------
    outputs
        What the function returned during the capture; each replay rewrites them.
    stream
        The CuPy stream the graph replays on.
    """

    def __init__(self, graph, stream, pool, outputs, held=()):
        self.graph, self.stream, self._pool, self.outputs = graph, stream, pool, outputs
        # What a replay reads and writes besides the pool's blocks and the caller's
        # arrays: the plans' device lengths, row index, padding mask, header and dropout
        # state (and so their descriptors), kept alive by the graph, not by the caches.
        self._held = tuple({id(h): h for h in held}.values())
        # A replay may still be queued when the graph goes: the plans are let go of then
        # with an event on this stream (after every replay) as their latest use, so they
        # are freed only once it is passed. Nothing is recorded per replay.
        weakref.finalize(self, _released, stream, self._held).atexit = False

    def replay(self):
        """Launch the graph on its stream (asynchronously); returns ``outputs``."""
        self.graph.launch(self.stream)
        return self.outputs


_never_released: list = []  # plans of graphs whose release event failed: kept for good


def _released(stream, held) -> None:
    """A ``CapturedGraph`` is gone: every replay it queued on `stream` comes before an
    event recorded there now, which becomes the latest use of each plan it `held` (see
    ``cuda.lifetime``): they are freed only once it is passed."""
    if not held:
        return
    try:
        cupy = gpu.cupy()
        # An event is made on the current device and recorded only on a stream of its
        # own device: the collection may run with any device current.
        with cupy.cuda.Device(stream.device_id):
            event = stream.record(cupy.cuda.Event(block=True, disable_timing=True))
    except Exception:  # CUDA failing: never free under a replay, keep them (a leak)
        _never_released.append(held)
        return
    for plan in held:
        plan.lifetime.used_on(stream, event)


def capture(function) -> CapturedGraph:
    """Capture ``function()`` (plan runs on CuPy arrays) into a CUDA graph.

    The arrays the function reads are read in place at every replay: write new values
    into them (``x[...] = new_x``), then ``replay()``. The function runs twice here:
    once eagerly (its results are discarded), once under capture, on the current
    device: arrays on another device are a ``ValueError`` (their work would run outside
    the capture). PyTorch's current stream is the capturing stream meanwhile.
    """
    cupy = gpu.cupy()
    device = cupy.cuda.runtime.getDevice()
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    held = _capturing.held = []
    try:
        # The warm-up reads what the caller queued on its stream (its inputs' values).
        stream.wait_event(cupy.cuda.get_current_stream().record())
        with cupy.cuda.using_allocator(pool.malloc), stream, _torch_on(stream, device):
            function()  # warm-up: the pool now holds every block a run needs
            _refuse_other_devices(held, device)
            stream.synchronize()
            for plan in held:
                plan.settle()  # the sync above: the capture need not query their uploads
            stream.begin_capture()
            try:
                outputs = function()
            finally:
                graph = stream.end_capture()
    finally:
        _capturing.held = None
    return CapturedGraph(graph, stream, pool, outputs, held)


def _torch_on(stream, device: int):
    """PyTorch's current stream on `device` made `stream` too, where PyTorch uses CUDA.

    A PyTorch tensor's DLPack import makes the importer's stream wait on PyTorch's
    current stream when they differ, and an export to PyTorch the reverse: across the
    capture's boundary, which CUDA refuses. On `stream` alone no event is made. `stream`
    first waits for PyTorch's current stream: the warm-up reads what the caller queued
    there.
    """
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():  # no PyTorch tensor on a GPU exists
        return contextlib.nullcontext()
    ours = cuda.ExternalStream(stream.ptr, device=device)
    ours.wait_stream(cuda.current_stream(device))
    return cuda.stream(ours)


def _refuse_other_devices(held, device: int) -> None:
    """A ValueError if the warm-up ran a plan on another device than the capture's: its
    work runs on that device's current stream, outside the capture, and replays would
    leave its outputs stale."""
    others = sorted({plan.device for plan in held} - {device})
    if others:
        raise ValueError(f"graphs.capture: the function ran on cuda:{others[0]}, but the "
                         f"capture runs on cuda:{device} (the current device), so its "
                         f"work would not be captured; capture inside "
                         f"`with cupy.cuda.Device({others[0]}):`")
