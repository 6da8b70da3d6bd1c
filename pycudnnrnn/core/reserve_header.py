"""The identity header both backends put at the start of ``reserve_space``.

``HEADER_BYTES`` (256) bytes, so that the backend's own part stays 256-byte aligned (as
cuDNN wants): a 16-byte magic naming the backend, a 16-byte fingerprint of the forward
call, then zeros. The fingerprint covers every field of its ``Problem`` (the whole
``RNNConfig``: mode, input mode, direction, layers, units, input size, projection,
dropout and seed; T, B, time_major, dtype) and its sequence lengths (``None`` counts as
all T), plus anything the backend adds. backprop checks them, in this order, before any
computation: the array is the backend's own (not foreign), it comes from a call with the
same identity, it has the right size. The data (input, states, params) is not part of
the identity: a reserve space from another forward call on other data of the same
identity is accepted.

Reading a header back from a GPU costs a device→host copy and a sync, so ``remember``
notes on the host the header of each reserve space this process made, weakly keyed by
the buffer's memory: ``identity`` reads a header only for a buffer it does not know.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import weakref

import numpy as np

from .config import Problem
from .lru import LRU

HEADER_BYTES = 256
IDENTITY_BYTES = 32


def _fingerprint(problem: Problem, extra) -> bytes:
    """16 bytes that differ between calls differing in any field of `problem` or `extra`.

    Fields are taken from the dataclass itself, so one added to ``Problem`` or
    ``RNNConfig`` later joins the identity without a change here.
    """
    digest = hashlib.blake2b(digest_size=16)
    for field in dataclasses.fields(problem):
        if field.name != "lengths":
            digest.update(repr((field.name, getattr(problem, field.name))).encode())
    digest.update(repr(extra).encode())
    digest.update(np.ascontiguousarray(problem.full_lengths, dtype=np.int64).tobytes())
    return digest.digest()


def header(problem: Problem, magic: bytes, *extra) -> bytes:
    """The 32 identity bytes for a reserve space of `problem`.

    Remembered for problems without lengths (hashable): a CPU call asks twice per step
    (forward writes it, backprop checks it), and hashing every field costs tens of µs.
    """
    if problem.lengths is None:
        return _headers.get((problem, magic, extra),
                            lambda: magic + _fingerprint(problem, extra))
    return magic + _fingerprint(problem, extra)


_headers = LRU(64)


def check(head: bytes | None, dtype, size: int, expected_size: int, problem: Problem,
          magic: bytes, backend: str, *extra):
    """Raise ValueError unless `head` (None if unreadable) marks this call's reserve space."""
    if head is None or str(dtype) != "uint8" or head[:16] != magic:
        raise ValueError(f"reserve_space: expected the uint8 array made by the {backend} "
                         f"backend's forward, got a foreign {dtype} array of {size} elements")
    if head != header(problem, magic, *extra):
        raise ValueError("reserve_space: made by a forward call with a different identity "
                         "than this backprop: an attribute (rnn_mode, input_mode, direction, "
                         "num_proj, dropout, seed, seed2, time_major), the dtype, a shape or "
                         "sequence_lengths differ")
    if size != expected_size:
        raise ValueError(f"reserve_space: expected {expected_size} bytes for this configuration "
                         f"and these shapes, got {size}")


# ----------------------------------------------------------------- headers made here

_known: dict = {}   # data pointer → (its identity bytes, (weak references to its buffers,))
# Reentrant: a collection that runs while the lock is held may free a noted buffer, whose
# callback then takes the lock on this same thread. Entries are replaced, never changed,
# so that known() reads one without the lock.
_known_lock = threading.RLock()


def remember(buffer, pointer: int, head: bytes):
    """Note that `buffer` (whose memory starts at `pointer`) holds identity `head`.

    The note lasts while any buffer noted with that identity lives (forward's own, and
    a view a trusted backprop noted); another identity at `pointer` replaces them.
    """

    def forget(ref, pointer=pointer):
        with _known_lock:
            entry = _known.get(pointer)
            if entry is not None and any(r is ref for r in entry[1]):
                refs = tuple(r for r in entry[1] if r is not ref)
                if refs:
                    _known[pointer] = (entry[0], refs)
                else:
                    del _known[pointer]

    ref = weakref.ref(buffer, forget)
    with _known_lock:
        entry = _known.get(pointer)
        if entry is None or entry[0] != head:
            _known[pointer] = (head, (ref,))
        elif not any(r() is buffer for r in entry[1]):
            _known[pointer] = (head, tuple(r for r in entry[1] if r() is not None) + (ref,))


def known(pointer: int) -> bytes | None:
    """The identity of the reserve space made here whose memory starts at `pointer`, if
    a buffer noted with it is still alive (so the memory is still its own); else None."""
    entry = _known.get(pointer)
    if entry is not None:
        for ref in entry[1]:
            if ref() is not None:
                return entry[0]
    return None


def identity(buffer, pointer: int, read) -> bytes | None:
    """`buffer`'s identity bytes: remembered, else ``read()`` (None if unreadable)."""
    head = known(pointer)
    return head if head is not None else read()
