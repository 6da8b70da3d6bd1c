"""CUDA graphs of plan runs: ``capture(function)`` once, ``replay()`` many times.

The public face of ``pycudnnrnn.cuda.graphs``, where the capture lives beside the CUDA
backend it drives (see there, and ``docs/gpu.md``).
"""

from .cuda.graphs import CapturedGraph, capture
from .cuda.lifetime import keeps_blocks_for_graphs, pinned, pinned_bytes

__all__ = ["capture", "CapturedGraph", "keeps_blocks_for_graphs", "pinned", "pinned_bytes"]
