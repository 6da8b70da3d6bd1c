"""Finding CuPy and the GPU, and the GPU settings: the one place that imports CuPy.

``cupy()`` is what every module that needs CuPy calls (the API's routing, the CUDA
backend, the framework adapters' device glue, ``info``, ``check``, ``bench``); the CI
stand-in GPU replaces it (and ``pycudnnrnn.cudnn.capi.api``) to run the CUDA backend's
code without a GPU. Finding a device is not running on it: this module is shared by every
layer (``core``), the backend that runs cuDNN on CuPy is ``pycudnnrnn.cuda``.
"""

from __future__ import annotations

import numbers

from ..errors import CudnnUnavailableError
from . import driver

_settings = {"allow_tf32": False}


def set_allow_tf32(enabled: bool) -> None:
    """Let float32 RNNs use TF32 tensor cores (faster, ~1e-3 relative error).

    Off by default: float32 runs strict FP32 (``CUDNN_FMA_MATH``). Plans take the setting
    when they are built.
    """
    _settings["allow_tf32"] = bool(enabled)


def get_allow_tf32() -> bool:
    """Whether float32 RNNs may use TF32 tensor cores."""
    return _settings["allow_tf32"]


def cupy():
    """The CuPy module, once it is known to see a GPU; else ``CudnnUnavailableError``."""
    try:
        import cupy
    except ImportError as exc:
        raise CudnnUnavailableError(
            "CuPy is not installed, so the cuDNN backend has no usable GPU: CUDA arrays need the "
            "GPU extra (CuPy and cuDNN), `pip install '.[cuda12]'` (CUDA 12 and 13 "
            f"drivers) or `pip install '.[cuda13]'` (CUDA 13), from the root of a checkout "
            f"({exc})") from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver (CUDA then calls it "insufficient"), or no device
        found = "CUDA cannot use an NVIDIA GPU with the driver found" if driver.found() \
            else "no NVIDIA GPU or driver was found"
        raise CudnnUnavailableError(f"{found}, so the cuDNN backend has no usable GPU (NumPy "
                                    f"arrays run on the CPU backend). CUDA says: {exc}") from exc
    if count == 0:
        raise CudnnUnavailableError("no NVIDIA GPU was found, so the cuDNN backend has no usable "
                                    "GPU (NumPy arrays run on the CPU backend)")
    return cupy


def device_index(device) -> int | None:
    """None for ``"cpu"``; the CUDA device number for ``"cuda"`` (the current one),
    ``"cuda:N"`` or an int N."""
    if isinstance(device, str):
        if device == "cpu":
            return None
        if device == "cuda":
            return cupy().cuda.Device().id
        if device.startswith("cuda:") and device[5:].isdigit():
            return int(device[5:])
        raise ValueError(f"device: expected 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}")
    if isinstance(device, numbers.Integral) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"device: expected a CUDA device number >= 0, got {device}")
        return int(device)
    raise TypeError(f"device: expected 'cpu', 'cuda', 'cuda:N' or an int, got "
                    f"{type(device).__name__} {device!r}")


class _StreamHandle:
    """A bare ``cudaStream_t`` in the CUDA stream protocol, as ``Stream.from_external``
    takes it."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


_external_streams: dict = {}  # (id of CuPy, device, pointer) → (CuPy, its view of the stream)
_MAX_EXTERNAL_STREAMS = 256   # PyTorch's and XLA's streams come from pools: few


def external_stream(cupy, ptr: int, device: int):
    """CuPy's view of another library's stream `ptr` on CUDA device `device` (PyTorch's
    or XLA's), to enter with ``with``: ``cupy.cuda.Stream.from_external`` where CuPy has
    it (14 and later, which deprecates ``ExternalStream`` and warns at each one made),
    else ``cupy.cuda.ExternalStream``.

    Made once per (device, pointer): a call per op would cost a construction each (and a
    warning filter lookup with CuPy 14). The view owns nothing, so a pointer CUDA reuses
    for a new stream is the same view. Kept per CuPy module too: the test suite's
    stand-in replaces it.
    """
    entry = _external_streams.get((id(cupy), device, ptr))
    if entry is not None and entry[0] is cupy:
        return entry[1]
    from_external = getattr(getattr(cupy.cuda, "Stream", None), "from_external", None)
    if from_external is None:
        stream = cupy.cuda.ExternalStream(ptr, device)
    else:
        with cupy.cuda.Device(device):  # from_external takes the current device's id
            stream = from_external(_StreamHandle(ptr))
    if len(_external_streams) >= _MAX_EXTERNAL_STREAMS:
        _external_streams.clear()
    _external_streams[id(cupy), device, ptr] = (cupy, stream)
    return stream


def exchange_capture_mode(cupy, mode: int) -> int | None:
    """This thread's capture interaction mode → `mode`; the previous one, or None without
    a driver. CuPy has no binding for it: the driver's ``cuThreadExchangeStreamCaptureMode``
    (the runtime's forwards to it), unless `cupy`'s runtime has one."""
    exchange = getattr(cupy.cuda.runtime, "threadExchangeStreamCaptureMode", None)
    if exchange is not None:
        return exchange(mode)
    return driver.exchange_stream_capture_mode(mode)
