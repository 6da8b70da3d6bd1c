"""CUDA graphs of plan runs: ``capture(function)`` once, ``replay()`` many times.

The public face of ``pycudnnrnn.cuda.graphs``, where the capture lives beside the CUDA
backend it drives (see there, and ``docs/gpu.md``).
"""

from .cuda.graphs import CapturedGraph, capture

__all__ = ["capture", "CapturedGraph"]
