"""What every layer shares: the problem's description and checks, the params layout,
dtypes, what kind of array an argument is, finding the GPU, and the host's resources
(memory, BLAS threads, bounded caches).

``core`` imports nothing of the package but ``errors`` and ``results``; every other layer
may import it. See ``docs/architecture.md``.
"""
