"""DLPack: other libraries' arrays on the stand-in GPU, and the stream handshake of an
exchange, as the DLPack spec, PyTorch and CuPy make it.

The consumer passes its current stream on the array's device to the producer's
``__dlpack__(stream=...)``: an int, 1 for the legacy default stream (the spec's; CUDA's
2, the per-thread default stream, the stand-in has none), -1 for "no order", None for
"unspecified" (taken as the legacy stream). Unless it is -1, the producer compares it
with its library's current stream and, where they differ, records an event on its own
and makes the consumer's stream wait on it (``streams._wait``, which enforces CUDA's
capture rules: across a capture's boundary the wait is refused). Each such wait is
noted in ``WAITS``.

* ``FakeFrameworkArray.__dlpack__`` is PyTorch's (``torch/_tensor.py``): the tensor's
  device must be the current one (else ``BufferError``), 0 is refused, 2 too.
* ``import_array`` is CuPy's ``from_dlpack`` (``cupy/_core/dlpack.pyx``): the array's
  device made current, CuPy's current stream there passed (1 for the null stream).
* ``export_array`` is CuPy's ``ndarray.__dlpack__`` (``cupy/_core/core.pyx``): an event
  on CuPy's current stream, waited on by the consumer's; 0 is taken as the legacy
  stream, with a warning.
* ``torch_from_dlpack`` is ``torch.from_dlpack`` (``torch/utils/dlpack.py``): PyTorch's
  current stream on the array's device passed (1 for its default stream).

Each kind of framework array names its library (``FakeFrameworkArray.library``;
``FakeTorchTensor``'s is "torch"; None orders nothing). A library's current stream on each device is this thread's (as PyTorch's is): the device's
null stream (its default stream) unless a test sets one (``set_library_stream``, as
``torch.cuda.set_stream``) or enters one (``library_stream_entered``, as
``torch.cuda.stream``). ``FakeTorchCuda`` is the slice of ``torch.cuda`` the library
uses, over these streams; ``install_torch`` puts it in place.
"""

import contextlib
import types
import warnings

from .arrays import FakeDeviceArray
from .devices import Device, current_device
from .state import _local
from .streams import FakeStream, _wait, current_stream, null_stream

#: Each cross-stream wait a DLPack exchange made: (producer's library, waiting stream's
#: pointer, the producer's stream's pointer). Cleared by ``install``.
WAITS = []

LEGACY_STREAM, PER_THREAD_STREAM, NO_ORDER = 1, 2, -1  # DLPack's stream values on CUDA


def _stacks(library):
    libraries = getattr(_local, "library_streams", None)
    if libraries is None:
        libraries = _local.library_streams = {}
    return libraries.setdefault(library, {})


def library_stream(library, device=None) -> FakeStream:
    """`library`'s current stream on `device` (the current device if None) on this
    thread: the device's null stream unless a test set or entered another."""
    device = current_device() if device is None else device
    stack = _stacks(library).get(device)
    return stack[-1] if stack else null_stream(device)


def set_library_stream(library, stream: FakeStream) -> None:
    """Make `stream` `library`'s current stream on its device, on this thread (as
    ``torch.cuda.set_stream``): the one it returns to after any entered one."""
    stack = _stacks(library).setdefault(stream.device_id, [])
    stack[:1] = [stream]


@contextlib.contextmanager
def library_stream_entered(library, stream: FakeStream):
    """`library`'s current stream on `stream`'s device is `stream` inside (as
    ``torch.cuda.stream``)."""
    stack = _stacks(library).setdefault(stream.device_id, [])
    if not stack:
        stack.append(null_stream(stream.device_id))
    stack.append(stream)
    try:
        yield stream
    finally:
        stack.pop()


def _consumer_stream(device) -> int:
    """The DLPack stream value of the current stream on `device`: 1 for its null stream
    (the stand-in's null streams of other devices than 0 have pointers of their own)."""
    ptr = current_stream().ptr
    return LEGACY_STREAM if ptr == null_stream(device).ptr else ptr


def _handshake(library, waiting: int, producer: FakeStream) -> None:
    """The consumer's stream `waiting` (a stand-in pointer) waits for the work queued so
    far on the producer's stream `producer`, unless they are one stream."""
    if waiting == producer.ptr:
        return
    WAITS.append((library, waiting, producer.ptr))
    _wait(waiting, producer.record())


def _waiting(stream, device) -> int:
    """The stand-in pointer of DLPack stream value `stream` on `device`."""
    return null_stream(device).ptr if stream in (None, LEGACY_STREAM) else stream


class FakeFrameworkArray:
    """Another library's array on the stand-in GPU, taken in through DLPack; its export
    follows PyTorch's rules, on its library's current stream (``library_stream``).

    `library` names that library; None (the default) is one that orders nothing at an
    export: its arrays are ready when handed over. (JAX's export instead makes the
    consumer's stream wait for the buffer's definition event: not modelled.)
    """

    library = None

    def __init__(self, array, library=None):
        self.array = array
        if library is not None:
            self.library = library

    def __dlpack_device__(self):
        return (2, self.array.device.id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """PyTorch's export (``torch/_tensor.py``): the consumer's `stream` waits for the
        library's current stream where they differ. Returns the stand-in's capsule: the
        array itself."""
        device = self.array.device.id
        if device != current_device():
            raise BufferError(f"Can't export tensors on a different CUDA device index. "
                              f"Expected: {device}. Current device: {current_device()}.")
        if stream is not None and type(stream) is not int:
            raise TypeError("stream must be ``int`` or ``none``")
        if stream != NO_ORDER:
            if stream == PER_THREAD_STREAM:
                raise BufferError("per-thread default stream is not supported.")
            if stream == 0:
                raise AssertionError("unsupported stream on CUDA: 0.")
            if self.library is not None:
                _handshake(self.library, _waiting(stream, device),
                           library_stream(self.library, device))
        return self.array

    @property
    def dtype(self):
        return self.array.dtype

    def view(self, dtype):
        """A view as another dtype of the same size, as PyTorch's and JAX's ``view``."""
        return type(self)(self.array.view(dtype), self.library)


def import_array(a):
    """``cupy.from_dlpack(a)``: `a`'s device made current, CuPy's current stream there
    passed to ``a.__dlpack__``; a fresh view of `a`'s memory, as CuPy's import makes."""
    if not isinstance(a, FakeFrameworkArray):
        raise AssertionError("the fake GPU only takes FakeDeviceArray or FakeFrameworkArray")
    device = a.__dlpack_device__()[1]
    with Device(device):
        capsule = a.__dlpack__(stream=_consumer_stream(device))
    return capsule.view(FakeDeviceArray)


def export_array(a, stream=None):
    """``a.__dlpack__(stream=...)`` of a CuPy array ``a`` (``cupy/_core/core.pyx``): the
    consumer's `stream` waits for CuPy's current stream where they differ. Returns the
    stand-in's capsule: the array itself."""
    if stream is None:
        stream = LEGACY_STREAM
    elif not isinstance(stream, int) or stream < NO_ORDER:
        raise ValueError(f"On CUDA, the valid stream for the DLPack protocol is -1, 1, 2, or "
                         f"any larger value, but {stream} was provided")
    if stream == 0:
        warnings.warn("Stream 0 is passed from a library that you are converting to; CuPy "
                      "assumes 0 as a legacy default stream. Please report this problem to "
                      "the library as this violates the DLPack protocol.")
        stream = LEGACY_STREAM
    if stream == PER_THREAD_STREAM:
        raise AssertionError("the stand-in has no per-thread default stream")
    if stream != NO_ORDER:
        _handshake("cupy", _waiting(stream, current_device()), current_stream())
    return a


def torch_from_dlpack(array):
    """``torch.from_dlpack(array)``: PyTorch's current stream on the array's device passed
    to ``array.__dlpack__`` (1 for its default stream), on the current device (PyTorch
    sets none). The result stays a stand-in device array (there are no torch tensors)."""
    device = array.__dlpack_device__()[1]
    ptr = library_stream("torch", device).ptr
    return array.__dlpack__(stream=LEGACY_STREAM if ptr == null_stream(device).ptr else ptr)


class FakeTorchTensor(FakeFrameworkArray):
    """Stands for a PyTorch CUDA tensor: the library knows one by its module's name and
    runs it on PyTorch's current stream (``library_stream("torch")``)."""

    library = "torch"
    requires_grad = False

    def is_conj(self):
        return False

    def is_neg(self):
        return False

    @property
    def device(self):
        return types.SimpleNamespace(type="cuda", index=self.array.device.id)


FakeTorchTensor.__module__ = "torch"


class _TorchStream:
    """A PyTorch stream on the stand-in: a pointer (``cuda_stream``) and a device."""

    def __init__(self, ptr, device):
        self.cuda_stream, self.device_index = ptr, device

    def stand_in(self) -> FakeStream:
        return FakeStream(ptr=self.cuda_stream, device_id=self.device_index)

    def wait_stream(self, other):
        """PyTorch's: an event recorded on `other`, waited on here."""
        _wait(self.cuda_stream, other.stand_in().record())


def _device_index(device):
    if device is None:
        return current_device()
    index = getattr(device, "index", device)
    return int(str(index).rpartition(":")[2]) if index is not None else current_device()


class FakeTorchCuda:
    """The slice of ``torch.cuda``'s streams the library uses, over the stand-in: PyTorch's
    current stream is ``library_stream("torch", device)``, its default stream the
    device's null stream."""

    def current_stream(self, device=None):
        device = _device_index(device)
        return _TorchStream(library_stream("torch", device).ptr, device)

    def default_stream(self, device=None):
        device = _device_index(device)
        return _TorchStream(null_stream(device).ptr, device)

    def ExternalStream(self, ptr, device=None):  # noqa: N802 (PyTorch's name)
        return _TorchStream(ptr, _device_index(device))

    def stream(self, stream):
        return library_stream_entered("torch", stream.stand_in())

    def set_stream(self, stream):
        set_library_stream("torch", stream.stand_in())

    @staticmethod
    def current_device():
        return current_device()

    @staticmethod
    def is_initialized():
        return True


def install_torch(monkeypatch, torch):
    """PyTorch's streams and DLPack import on the stand-in: `torch`'s ``cuda`` streams are
    ``FakeTorchCuda``'s, its ``from_dlpack`` is ``torch_from_dlpack``. Returns the
    ``FakeTorchCuda``."""
    cuda = FakeTorchCuda()
    for name in ("current_stream", "default_stream", "ExternalStream", "stream",
                 "set_stream", "current_device", "is_initialized"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    monkeypatch.setattr(torch, "from_dlpack", torch_from_dlpack)
    return cuda
