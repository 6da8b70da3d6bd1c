"""The identity header both backends put at the start of ``reserve_space``.

32 bytes: a 16-byte magic naming the backend, then a 16-byte fingerprint of the forward
call (configuration with dropout seed, T, B, dtype, lengths, and anything else the
backend adds). backprop checks them, in this order, before any computation: the array is
the backend's own (not foreign), it comes from the same call, it has the right size.
"""

from __future__ import annotations

import hashlib

from .checks import Problem

HEADER_BYTES = 32


def header(problem: Problem, magic: bytes, *extra) -> bytes:
    """The 32 header bytes for a reserve space of `problem`."""
    key = repr((problem.config, problem.max_time, problem.batch_size, str(problem.dtype),
                problem.full_lengths.tolist()) + extra).encode()
    return magic + hashlib.blake2b(key, digest_size=16).digest()


def check(head: bytes | None, dtype, size: int, expected_size: int, problem: Problem,
          magic: bytes, backend: str, *extra):
    """Raise ValueError unless `head` (None if unreadable) marks this call's reserve space."""
    if head is None or str(dtype) != "uint8" or head[:16] != magic:
        raise ValueError(f"reserve_space: expected the uint8 array made by the {backend} "
                         f"backend's forward, got a foreign {dtype} array of {size} elements")
    if head != header(problem, magic, *extra):
        raise ValueError("reserve_space: made by a forward call with a different configuration, "
                         "dropout, dtype or sequence_lengths than this backprop")
    if size != expected_size:
        raise ValueError(f"reserve_space: expected {expected_size} bytes for this configuration "
                         f"and these shapes, got {size}")
