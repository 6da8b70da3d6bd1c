"""A stand-in GPU for CI: runs the cuDNN backend's own code with host memory, in time.

* ``FakeCupy`` is the slice of CuPy the backend uses, over NumPy arrays whose
  ``__dlpack_device__`` says CUDA, so the public API routes them to the cuDNN backend.
* ``FakeCudnn`` replaces the handful of cuDNN calls that need a GPU. Every call still
  goes through a ctypes function built from the project's prototype table, so argument
  marshalling is exercised for real; descriptors are real cuDNN objects (they need no
  GPU) and are read back through cuDNN. The RNN itself is computed by the NumPy backend
  on the rows cuDNN is handed, and the fake refuses what cuDNN refuses (zero lengths).

One module per thing it fakes, each to be read against CUDA's rules for that thing:
``state`` (counters, the lock its time runs under), ``devices``, ``streams`` (queues,
events, capture modes, capture and graphs), ``memory`` (pools), ``arrays`` (device arrays
over pool blocks), ``dlpack`` (other libraries' arrays, PyTorch's streams, the DLPack
stream handshake), ``cupy`` (``FakeCupy``),
``cudnn`` (``FakeCudnn`` and cuDNN's weight slots) and ``light`` (the light stand-in).
This module puts them in place and re-exports what tests use.

It lives in time, as a GPU does (STYLE.md, "a test double that lives in time"):

* **streams**: cuDNN's compute calls and host→device copies are queued on their stream
  (cuDNN's: the one ``cudnnSetStream`` gave the handle) and run when that stream, an
  event recorded on it or the device is synchronized. Every other device operation (the
  NumPy work on device arrays: copies, gathers, fills) runs at once on the current
  stream, after that stream's queued work: a stream runs in order, but nothing orders
  two streams except events (``stream.wait_event``) and syncs. Every stream is
  non-blocking (no legacy default-stream sync), the strictest CUDA allows. With
  ``STRICT[0]`` set (the ``strict_gpu`` fixture, or ``FAKE_CUDA_STRICT=1`` for a whole
  run), a device sync runs the streams' queues newest stream first, an order that
  differs from submission across streams.
* **memory**: device arrays are blocks of one pool (CuPy's, or a private
  ``MemoryPool``). A block freed (its last array gone) is poisoned (0xFF bytes: NaN in
  every float dtype) in the order of the stream it was allocated on, and handed to the
  next request of its size on that stream at once, and on any stream once that stream
  got past the free (as CuPy's and PyTorch's pools do): work still queued on another
  stream that reads freed memory reads poison, or what the block's next owner wrote.
  Fresh memory is poison too.
* **dropout** is applied: ``cudnnSetDropoutDescriptor`` initialises the state bytes from
  the seed (a queued kernel), and every training forward draws its masks (the NumPy
  backend's, seeded by those bytes) and advances the state, as cuDNN's RNG does.
* **the reserve space**: forward writes its record into it; ``cudnnRNNBackwardData_v8``
  overwrites that record with its own (``reserveSpace`` is ``[in,out]`` there, so cuDNN
  may), which ``cudnnRNNBackwardWeights_v8`` reads: a second backprop handed the same
  reserve space finds no forward in it and returns NaN.
* **sizes** of the workspace and reserve space scale with the problem, and cuDNN's
  calls fill the workspace with poison (it is theirs while they run).
* ``cudnnDestroy`` synchronizes the device (as cuDNN's does); during a capture that
  invalidates it, and ``end_capture`` raises, as CUDA's does.
* graphs capture what runs on the capturing stream and replay it for real
  (``FakeGraph.launch`` queues it on the launch stream): a replay reads and writes the
  same memory as the capture, by address, whoever owns it by then (a graph keeps no
  memory alive, as CUDA's keep none).
* capture modes, as CUDA has them (``begin_capture(mode)``; CuPy's default is relaxed):
  while a thread captures in global or thread-local mode, or any thread in global mode,
  that thread's event queries, event and stream syncs are refused and invalidate those
  captures; an event recorded in a capture cannot be queried, synced or waited on from
  outside it (a query of one also invalidates its capture, unless that is relaxed); a
  capturing stream may wait on an event recorded outside the capture only
  with ``cudaEventWaitExternal`` (``runtime.streamWaitEvent(s, e, 1)``), which each
  replay then honours.
* CuPy's version (``FakeCupy.__version__``, 14.2 unless a test sets another): CuPy 14
  holds bfloat16, has ``cuda.Stream.from_external`` and deprecates
  ``cuda.ExternalStream``, which warns (``DeprecationWarning``) at each one made; CuPy 13
  refuses bfloat16 and has no ``from_external``. ``FakeCupy.external_streams`` lists the
  views of others' streams made.
* DLPack's stream handshake, as PyTorch and CuPy make it (``dlpack``): an importer
  passes its current stream to the exporter's ``__dlpack__(stream=...)`` (CuPy's
  ``from_dlpack``; ``torch.from_dlpack``, with ``install_torch``), and where that stream
  differs from the exporter library's current one the exporter records an event on its
  own and makes the importer's wait on it, under CUDA's capture rules: across a
  capture's boundary the wait is refused. Another library's current stream per device
  (``library_stream``) is its null stream unless a test sets one (``set_library_stream``,
  ``library_stream_entered``); ``FakeTorchTensor`` and ``FakeTorchCuda`` are PyTorch's
  tensors and streams on the stand-in. Each such wait is noted in ``DLPACK_WAITS``.
* a thread's capture interaction mode (``runtime.threadExchangeStreamCaptureMode``, as
  CUDA's ``cudaThreadExchangeStreamCaptureMode``; global by default): a thread in relaxed
  mode may query and sync while others capture, a thread-local one while others capture
  in global mode.
* a thread of the library's that only waits in the background (``pycudnnrnn.cuda.
  foreign``'s, by its name) waits for an event passively, uncounted: the stand-in's GPU
  runs queued work only when a test's thread syncs, so the test says when work is done.
* devices: ``DEVICES[0]`` of them (1 unless a test sets more). Each thread has a current
  device (``cuda.Device(n)``), each device its own null stream and current stream, each
  array and stream the device it was made on; entering a stream of another device than
  the current one is refused, as CuPy refuses it. Devices are GPUs of different kinds:
  cuDNN on device n asks for a larger workspace and reserve space than on device 0
  (``temp_space_bytes``), so sizes taken on the wrong device show.
* CUDA's special stream handles, resolved at each call: pointer 0 (and 1,
  ``cudaStreamLegacy``) is the legacy stream of the device current then, every device's
  null stream; pointer 2 (``cudaStreamPerThread``) is the calling thread's own stream.
  ``PER_THREAD_DEFAULT_STREAM[0]`` (the ``per_thread_gpu`` fixture) makes it every
  thread's default stream, as ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` does in CuPy.
  An event is made on the current device and recorded only on a stream of its device.

What it adds besides, to catch GPU bugs a CPU test would miss:

* its own weight-slot table in cuDNN's documented order (all matrices, then all biases;
  per pseudo-layer, by linLayerID), not ``pycudnnrnn.core.layout``'s; ``test_fake_cuda.py``
  holds it against the table cuDNN 9.19 gave on an H200 (``tests/data/gpu-layout.json``);
* padding behaves as in cuDNN's products over every (t, b) slot: a NaN in the padding of
  x or dy handed to cuDNN spreads into the gradients (0 · NaN = NaN), so the backend must
  zero it;
* counters (``COUNTS``) of host↔device copies and syncs (host data turned into device
  arrays, device data read back, scalars read from device arrays, synchronize), of
  device allocations and copies, and of blocks taken from a pool (``pool_alloc``: none
  where ``using_allocator`` put another allocator in place); while a stream captures a
  graph, device→host transfers and syncs raise, as CUDA refuses them.
* host→device copies are queued, as CuPy queues them through pinned memory (on a
  capturing stream: a graph node, run at each replay and not now), and the event
  recorded after each is queried at once, with those of earlier copies, as CuPy's
  pinned-memory watcher does: so an upload on a capturing stream is refused.

``install(monkeypatch)`` is the one way in: it replaces ``pycudnnrnn.core.gpu.cupy`` and
``pycudnnrnn.cudnn.capi.api``, the only two places the library finds CuPy and cuDNN.
``to_host(a)`` is how a test reads a result (after the current stream's work, as
``cupy.asnumpy`` does; not counted). What this cannot show is cuDNN's own arithmetic:
the ``gpu`` tests do.
"""
import os

import numpy as np

from pycudnnrnn import plan
from pycudnnrnn.core import gpu
from pycudnnrnn.cuda import building, resources
from pycudnnrnn.cudnn import capi

from .arrays import FakeDeviceArray, _device, _KEPT, _root  # noqa: F401
from .cudnn import (DROPOUT_STATES_BYTES, FakeCudnn, WeightSlot, _array,  # noqa: F401
                    temp_space_bytes, weight_slots, weight_space_elements)
from .cupy import FakeCupy  # noqa: F401
from .devices import DEVICES, Device, current_device  # noqa: F401
from .dlpack import (WAITS as DLPACK_WAITS, FakeFrameworkArray, FakeTorchCuda,  # noqa: F401
                     FakeTorchTensor, install_torch, library_stream, library_stream_entered,
                     set_library_stream, torch_from_dlpack)
from .light import LightCupy, LightDeviceArray, install_light  # noqa: F401
from .memory import FakeMemoryPool  # noqa: F401
from .state import (CALLS, CAPTURE_GLOBAL, CAPTURE_RELAXED, CAPTURE_THREAD_LOCAL,  # noqa: F401
                    CAPTURING, COUNTS, EVENT_WAIT_EXTERNAL, PER_THREAD_DEFAULT_STREAM, POISON,
                    STRICT, _local, reset_counts)
from .streams import (NULL_STREAM, _CAPTURES, FakeEvent, FakeGraph, FakeStream,  # noqa: F401
                      _WATCHED, _drain, _queue, _submit, _wait, current_stream, null_stream,
                      per_thread_stream, synchronize_all)


def install(monkeypatch):
    """Put the stand-in GPU in place of CuPy and cuDNN's GPU calls; returns the FakeCudnn."""
    fake_cupy, fake_api = FakeCupy(), FakeCudnn()
    monkeypatch.setattr(gpu, "cupy", lambda: fake_cupy)
    monkeypatch.setattr(capi, "api", lambda: fake_api)
    # cuDNN handles live as long as the process: the stand-in's, as long as it is in place
    monkeypatch.setattr(resources, "_handles", {}, raising=False)
    monkeypatch.setattr(building, "_streams", {})  # private build streams: this stand-in's
    plan.clear_caches()  # nothing built on another GPU (or this one, earlier) is reused
    synchronize_all()  # what an earlier stand-in queued runs before its memory is reused
    _KEPT.clear()
    _WATCHED.clear()
    DLPACK_WAITS.clear()
    reset_counts()
    CALLS.clear()
    CAPTURING.clear()
    _CAPTURES.clear()
    STRICT[0] = os.environ.get("FAKE_CUDA_STRICT") == "1"  # a whole run in strict mode
    # CuPy's per-thread default stream, for a whole run as CuPy's variable turns it on
    PER_THREAD_DEFAULT_STREAM[0] = os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM") == "1"
    DEVICES[0] = 1
    _local.__dict__.clear()
    return fake_api


def release_foreign_views():
    """Run every stream's queued work, then let go of the views of foreign memory whose
    pointers cuDNN got (kept against a use after free while work on them may be queued):
    dead, as CuPy's views are once the call that made them returns, with whatever a weak
    reference ties to them. Not during a capture, nor before replaying a graph that
    captured work on them."""
    synchronize_all()
    if _CAPTURES:
        raise RuntimeError("a captured graph may replay work on these views")
    _KEPT.clear()


def to_host(a):
    """A host copy of device array `a` once the current stream's work is done (uncounted)."""
    _drain(current_stream().ptr)
    return np.array(np.asarray(a).view(np.ndarray))
