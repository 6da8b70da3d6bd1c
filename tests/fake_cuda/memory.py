"""Memory: pools of blocks that are poisoned when freed and handed out again.

A block freed (its last array gone) is poisoned (0xFF bytes: NaN in every float dtype) in
the order of the stream it was allocated on, and handed to the next request of its size
on that stream at once, and on any stream once that stream got past the free, as CuPy's
and PyTorch's pools do. Fresh memory is poison too.
"""

import collections
import sys

import numpy as np

from .state import COUNTS, POISON, _local, _lock
from .streams import _key, _submit, current_stream

_BLOCK = 512  # CuPy's allocation unit


class FakeMemoryPool:
    """Blocks by size; a freed one is poisoned in its stream's order, then reused.

    As CuPy's pool (and PyTorch's), a freed block goes at once to the next request on
    the stream it was used on (ordered after that stream's work), and to a request on
    any stream once that stream has got past the free: work still queued that reads a
    freed block reads poison, or whatever its next owner wrote.
    """

    def __init__(self, counter="pool_alloc"):
        self.free = collections.defaultdict(list)  # bytes → [[block, stream, poisoned]]
        self.blocks = []  # every block, kept: queued work may still read freed ones
        self.malloc = self  # ``using_allocator(pool.malloc)`` names this pool
        self.counter = counter  # the COUNTS entry of its blocks (CuPy's: "pool_alloc")

    def take(self, nbytes):
        COUNTS[self.counter] += 1
        size = max(_BLOCK, -(-int(nbytes) // _BLOCK) * _BLOCK)
        stream = _key(current_stream().ptr)  # the per-thread stream: this thread's
        with _lock:
            free = self.free[size]
            for i in range(len(free) - 1, -1, -1):  # the most recently freed first
                block, freed_on, poisoned = free[i]
                if freed_on == stream or poisoned[0]:
                    del free[i]
                    return block
        block = np.full(size, POISON, np.uint8)
        self.blocks.append(block)
        return block

    def total_bytes(self):
        """Bytes of every block this pool holds, in use or free (CuPy's ``total_bytes``)."""
        return sum(b.size for b in self.blocks)

    def give_back(self, block, stream_ptr):
        """`block`'s last array is gone: poison it after its stream's work, reuse it.
        `stream_ptr` is the stream's key (``streams._key``) taken at the allocation, as
        CuPy's pool keys the per-thread stream by the allocating thread (#5069)."""
        poisoned = [False]

        def poison():
            block.fill(POISON)
            poisoned[0] = True
        _submit(stream_ptr, poison, captured=False)
        with _lock:
            self.free[block.size].append([block, stream_ptr, poisoned])


_DEVICE_POOL = [FakeMemoryPool()]


class _PoolRoot(np.ndarray):
    """The array over a whole pool block; when its last view is gone, the block goes
    back to its pool (``__del__``: cheaper than a weakref finaliser per allocation)."""

    def __del__(self, _finalizing=sys.is_finalizing):
        if _finalizing():  # at exit the stand-in's modules are emptied: nothing reads on
            return
        release = self.__dict__.pop("release", None)
        if release is not None:
            release[0].give_back(release[1], release[2])


def _allocator():
    """The current thread's: a stand-in pool, or a CuPy allocator function (bytes →
    ``MemoryPointer``; the stand-in's MemoryPointer is the memory itself)."""
    stack = getattr(_local, "allocators", None)
    return stack[-1] if stack else _DEVICE_POOL[0]


class _UsingAllocator:
    def __init__(self, malloc):
        # a pool's malloc names the pool; any other callable allocates by itself
        self.pool = malloc if isinstance(malloc, FakeMemoryPool) or callable(malloc) \
            else None

    def __enter__(self):
        stack = getattr(_local, "allocators", None)
        if stack is None:
            stack = _local.allocators = []
        stack.append(self.pool or _DEVICE_POOL[0])
        return self

    def __exit__(self, *exc):
        _local.allocators.pop()
