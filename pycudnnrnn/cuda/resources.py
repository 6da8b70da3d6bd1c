"""What the cuDNN backend keeps between calls: handles, descriptors, dropout states.

* one cuDNN handle per (thread, device), kept as long as the process: ``cudnnDestroy``
  synchronizes the device, which would stall every stream and invalidate a CUDA-graph
  capture in progress on any thread, so no handle is destroyed at a thread's exit or
  by ``clear_caches`` (a thread that ends leaves its handle to the next thread that
  gets its id; there are at most as many as threads alive at once);
* descriptors in per-device LRU caches: RNN descriptors by configuration, dtype and math
  mode, data and state descriptors by shape and lengths;
* dropout RNG states. cuDNN needs one buffer per seed (``cudnnDropoutGetStatesSize``:
  6.19 MiB on an H200), initialised by a kernel when a seed is first seen; restoring a
  known seed's states is cheap. The caches keep the states of at most
  ``DROPOUT_SEEDS_KEPT`` seeds per device (a loop over seeds keeps the most recent
  ones); a plan the caller holds keeps its own seed's states alive as long as it lives,
  and they are freed by ``pycudnnrnn.cuda.lifetime``'s rule (after every forward that
  drew from them, on any stream, and every replay of a graph that captured one).
  Each seed's states are kept twice: as they advance, and as the seed made them (so a
  forward can draw the seed's first masks again, as XLA's recomputations need); and,
  for forwards run under a key (``DropoutStates.replaying``), as they were before each
  of the last ``DROPOUT_REPLAYS_KEPT`` keys (so a forward run again with its key draws
  its masks again, as PyTorch's recomputations need).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import warnings
import weakref

from ..core import gpu
from ..cudnn import rnn
from ..cudnn.descriptors import (DropoutDescriptor, Handle, RNNDataDescriptor, RNNDescriptor,
                                TensorDescriptor)
from ..core.lru import LRU
from . import building, lifetime

#: Seeds whose dropout states the caches keep per device (each ~6 MiB on current GPUs).
DROPOUT_SEEDS_KEPT = 4
#: Keyed forwards per seed whose starting states are kept, to be drawn again (~6 MiB each).
DROPOUT_REPLAYS_KEPT = 4
_FORGOTTEN_KEYS = 1024  # keys whose starting states were dropped: a cheap record, to warn

_rnn_descriptors = LRU(64)                           # (device, config, dtype, tf32), no dropout
_dropout_rnn_descriptors = LRU(DROPOUT_SEEDS_KEPT)   # the same, with dropout
_data_descriptors = LRU(256)    # (device, dtype, time_major, T, B, width, lengths)
_state_descriptors = LRU(256)   # (device, dtype, dims)
_dropout = LRU(DROPOUT_SEEDS_KEPT)          # (device, dropout, seed) → DropoutDescriptor
_dropout_states = LRU(DROPOUT_SEEDS_KEPT)   # (device, seed) → DropoutStates
_dropout_lock = threading.Lock()
_handles: dict = {}  # (thread id, device) → Handle, never destroyed (see above)

#: Dropout state buffers alive now, anywhere (for tests and diagnosis).
LIVE_DROPOUT_STATES: "weakref.WeakSet" = weakref.WeakSet()


class DropoutStates:
    """One device buffer of cuDNN dropout RNG states, initialised for one seed.

    ``initial`` is a copy of the states as the seed initialised them: copying it back
    (``restart``) makes the next forward draw the masks of the seed's first forward.
    Made on CuPy's current stream, with its buffer (``initial`` and the kept starting
    states too), which is their home; ``lifetime`` releases them all by
    ``pycudnnrnn.cuda.lifetime``'s rule (cuDNN writes them at every training forward,
    on whatever stream it runs).
    """

    def __init__(self, buffer, seed: int, device: int | None = None):
        self.buffer, self.seed, self.device = buffer, seed, device
        self._initial = None
        # Every plan of the seed, on every stream and thread, draws from this buffer:
        # one forward at a time on the host (``_starts`` is host bookkeeping), and each
        # after the latest one on another stream on the GPU (``ordered``).
        self.lock = threading.RLock()
        self._last = None  # (stream key, event after the latest forward's use)
        self._starts = collections.OrderedDict()     # key → the states before its forward
        self._forgotten = collections.OrderedDict()  # keys whose starts were dropped
        self._blocks = [buffer, self._starts]  # all the states' device memory
        cupy = gpu.cupy()
        self.lifetime = lifetime.Lifetime(cupy, self, cupy.cuda.get_current_stream(),
                                          device, keep=self._blocks)
        LIVE_DROPOUT_STATES.add(self)

    @property
    def initial(self):
        return self._initial

    @initial.setter
    def initial(self, copy):  # made on the buffer's stream, right after its kernel
        self._initial = copy
        self._blocks.append(copy)

    @contextlib.contextmanager
    def ordered(self, cupy, stream):
        """One forward's use of the states (restart, replaying, cuDNN's draw) on
        `stream`: after the latest use on another stream, one thread at a time."""
        with self.lock:
            key = lifetime.stream_key(stream, self.device)
            last = self._last
            if last is not None and last[0] != key:
                lifetime.wait(cupy, stream, last[1])
            yield
            if not stream.is_capturing():  # a captured event could not be waited on
                event = lifetime.use_event(cupy, stream)
                self._last = (key, event)
                self.lifetime.used(key, event)

    def restart(self):
        """Put the states back as the seed made them (a device copy, current stream)."""
        self.buffer[...] = self.initial

    @contextlib.contextmanager
    def replaying(self, key):
        """Run one training forward as the forward named `key` (hashable).

        A new key keeps the states as they are (a device copy) under it, and the forward
        continues them: fresh masks. A kept key (the forward run again: a recomputation)
        starts the forward from the states kept under it, so it draws the same masks,
        and puts the states back afterwards, so that later forwards draw masks of their
        own. The last ``DROPOUT_REPLAYS_KEPT`` keys are kept (their copies are reused, not
        freed); an older one draws new masks, with a warning. Device copies on the
        current stream, in order with the forward; the kept copies come from CuPy's own
        pool, as they outlive the call (a framework's allocator may be a CUDA graph's).
        """
        start = self._starts.get(key)
        if start is None:
            if len(self._starts) >= DROPOUT_REPLAYS_KEPT:
                old, start = self._starts.popitem(last=False)
                self._forget(old)
                start[...] = self.buffer
            else:
                cupy = gpu.cupy()
                with cupy.cuda.using_allocator(cupy.get_default_memory_pool().malloc):
                    start = self.buffer.copy()
                self.lifetime.allocated_on(cupy.cuda.get_current_stream())
            self._starts[key] = start
            if key in self._forgotten:
                warnings.warn(
                    f"pycudnnrnn: a training forward with dropout ran again under the key of "
                    f"a forward more than {DROPOUT_REPLAYS_KEPT} keyed forwards of its seed "
                    f"ago, whose dropout states are no longer kept: it draws new masks, not "
                    f"that forward's (a recomputation then pairs them with the first run's "
                    f"results); recompute sooner, or raise pycudnnrnn.cuda.resources."
                    f"DROPOUT_REPLAYS_KEPT", RuntimeWarning, stacklevel=3)
            yield
            return
        self._starts.move_to_end(key)
        current = self.buffer.copy()
        self.buffer[...] = start
        try:
            yield
        finally:
            self.buffer[...] = current

    def _forget(self, key):
        self._forgotten[key] = None
        while len(self._forgotten) > _FORGOTTEN_KEYS:
            self._forgotten.popitem(last=False)


def _live_states(device: int, seed: int):
    """States of (device, seed) still alive though the cache dropped them (a plan holds
    them): reused, since initialising them again would restart their random sequence."""
    return next((s for s in list(LIVE_DROPOUT_STATES) if (s.device, s.seed) == (device, seed)),
                None)


def handle(cupy, device: int | None = None) -> Handle:
    """This thread's handle for `device` (None: the current one, which it must be),
    bound to CuPy's current stream."""
    key = (threading.get_ident(), cupy.cuda.Device().id if device is None else device)
    h = _handles.get(key)
    if h is None:  # only this thread makes its key's handle: no race
        h = _handles[key] = Handle()
    h.set_stream(cupy.cuda.get_current_stream().ptr)
    return h


def dropout_descriptor(cupy, handle, device: int, dropout: float, seed: int):
    """A dropout descriptor; RNG states are initialised once per kept (device, seed)."""

    def build():
        desc = DropoutDescriptor()
        if dropout == 0:
            desc.set(handle, 0.0, 0, 0, seed)  # no states needed, nothing to draw
            return desc
        with _dropout_lock:
            fresh = []

            def new_states():
                alive = _live_states(device, seed)
                if alive is not None:
                    return alive
                # Never inside a capture: the kernel and the copy must run now, and the
                # event after them be one every stream can wait on (see ``building``).
                with building.outside_capture(cupy, device) as stream:
                    handle.set_stream(stream.ptr)  # the kernel runs on the handle's stream
                    size = rnn.dropout_states_size(handle)
                    states = DropoutStates(cupy.empty(size, dtype=cupy.uint8), seed, device)
                    desc.set(handle, dropout, states.buffer.data.ptr, size, seed)  # slow, once
                    states.initial = states.buffer.copy()  # after the kernel, same stream
                    states._last = (lifetime.stream_key(stream, device),  # the kernel, the copy
                                    lifetime.use_event(cupy, stream))
                handle.set_stream(cupy.cuda.get_current_stream().ptr)  # the caller's again
                fresh.append(states)
                return states

            states = _dropout_states.get((device, seed), new_states)
            if not fresh:
                desc.restore(handle, dropout, states.buffer.data.ptr, states.buffer.size, seed)
        desc.states = states  # keep the states alive as long as the descriptor
        return desc

    return _dropout.get((device, dropout, seed), build)


def rnn_descriptor(cupy, handle, device: int, config, dtype, tf32: bool) -> RNNDescriptor:
    """The RNN descriptor of a configuration (``layout_checked`` False when new)."""

    def build():
        dropout = dropout_descriptor(cupy, handle, device, config.dropout, config.seed)
        desc = RNNDescriptor(config, dtype, dropout, tf32)
        desc.layout_checked = False
        return desc

    cache = _dropout_rnn_descriptors if config.dropout else _rnn_descriptors
    return cache.get((device, config, dtype, tf32), build)


def data_descriptor(device: int, dtype, time_major, T, B, width, lengths) -> RNNDataDescriptor:
    key = (device, dtype, time_major, T, B, width, tuple(lengths))
    return _data_descriptors.get(
        key, lambda: RNNDataDescriptor(dtype, time_major, T, B, width, lengths))


def state_descriptor(device: int, dtype, dims) -> TensorDescriptor:
    key = (device, dtype, tuple(dims))
    return _state_descriptors.get(key, lambda: TensorDescriptor(dtype, dims))


def clear_caches():
    """Drop every cached descriptor and dropout state (each is freed once no plan holds
    it); handles stay (see above)."""
    for cache in (_rnn_descriptors, _dropout_rnn_descriptors, _data_descriptors,
                  _state_descriptors, _dropout, _dropout_states):
        cache.clear()
