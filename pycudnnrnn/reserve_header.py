"""The identity header both backends put at the start of ``reserve_space``.

``HEADER_BYTES`` (256) bytes, so that the backend's own part stays 256-byte aligned (as
cuDNN wants): a 16-byte magic naming the backend, a 16-byte fingerprint of the forward
call (configuration with dropout seed, T, B, dtype, lengths, and anything else the
backend adds), then zeros. backprop checks them, in this order, before any computation:
the array is the backend's own (not foreign), it comes from the same call, it has the
right size.

Reading a header back from a GPU costs a device→host copy and a sync, so ``remember``
notes on the host the header of each reserve space this process made, weakly keyed by
the buffer's memory: ``identity`` reads a header only for a buffer it does not know.
"""

from __future__ import annotations

import hashlib
import threading
import weakref

from .config import Problem

HEADER_BYTES = 256
IDENTITY_BYTES = 32


def header(problem: Problem, magic: bytes, *extra) -> bytes:
    """The 32 identity bytes for a reserve space of `problem`."""
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


# ----------------------------------------------------------------- headers made here

_known: dict = {}   # data pointer → (weak reference to the buffer, its identity bytes)
_known_lock = threading.Lock()


def remember(buffer, pointer: int, head: bytes):
    """Note that `buffer` (whose memory starts at `pointer`) holds identity `head`."""

    def forget(ref, pointer=pointer):
        with _known_lock:
            if _known.get(pointer, (None,))[0] is ref:
                del _known[pointer]

    with _known_lock:
        _known[pointer] = (weakref.ref(buffer, forget), head)


def known(pointer: int) -> bytes | None:
    """The identity of the reserve space made here whose memory starts at `pointer`, if
    that buffer is still alive (so the memory is still its own); else None."""
    entry = _known.get(pointer)
    if entry is None or entry[0]() is None:
        return None
    return entry[1]


def identity(buffer, pointer: int, read) -> bytes | None:
    """`buffer`'s identity bytes: remembered, else ``read()`` (None if unreadable)."""
    head = known(pointer)
    return head if head is not None else read()
