"""CUDA graphs of plan runs: capture once with CuPy's stream capture, replay many times.

A plan's run makes no host↔device copy and no sync, so it can be captured. What a
graph must not do is use memory that is freed and reused after the capture: so the
capture runs on a private CuPy memory pool that lives as long as the graph, and runs
the function once eagerly first (the plan's "second call on"), so that the capture
finds every block it needs in that pool and allocates nothing new.
"""

from __future__ import annotations

from . import gpu


class CapturedGraph:
    """A captured function: ``replay()`` reruns its GPU work on the same buffers.

    Attributes
    ----------
    outputs
        What the function returned during the capture; each replay rewrites them.
    stream
        The CuPy stream the graph replays on.
    """

    def __init__(self, graph, stream, pool, outputs):
        self.graph, self.stream, self._pool, self.outputs = graph, stream, pool, outputs

    def replay(self):
        """Launch the graph on its stream (asynchronously); returns ``outputs``."""
        self.graph.launch(self.stream)
        return self.outputs


def capture(function) -> CapturedGraph:
    """Capture ``function()`` (plan runs on CuPy arrays) into a CUDA graph.

    The arrays the function reads are read in place at every replay: write new values
    into them (``x[...] = new_x``), then ``replay()``. The function runs twice here:
    once eagerly (its results are discarded), once under capture.
    """
    cupy = gpu.cupy()
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        function()  # warm-up: the pool now holds every block a run needs
        stream.synchronize()
        stream.begin_capture()
        try:
            outputs = function()
        finally:
            graph = stream.end_capture()
    return CapturedGraph(graph, stream, pool, outputs)
