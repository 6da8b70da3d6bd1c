"""Finding CuPy and the GPU, and the GPU settings: the one place that imports CuPy.

``cupy()`` is what every module that needs CuPy calls (the API's routing, the cuDNN
backend, ``info``, ``check``, ``bench``); the CI stand-in GPU replaces it (and
``pycudnnrnn.cudnn.capi.api``) to run the cuDNN backend's code without a GPU.
"""

from __future__ import annotations

import collections
import numbers
import threading

from .cudnn import driver
from .errors import CudnnUnavailableError

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
            "GPU extra (CuPy and cuDNN), `pip install 'pycudnnrnn[cuda12]'` (CUDA 12 and 13 "
            f"drivers) or `pip install 'pycudnnrnn[cuda13]'` (CUDA 13) ({exc})") from exc
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


# ----------------------------------------------------------------- other libraries' arrays

_in_flight: collections.deque = collections.deque()  # (event, arrays), oldest first
_in_flight_lock = threading.Lock()


def caller_stream(cupy, array, device: int):
    """CuPy's view of the stream `array`'s library works on, to run the call there: a
    PyTorch CUDA tensor's current stream; None for other arrays (CuPy's current stream
    then, and ``keep_until_done`` for those from another library)."""
    if type(array).__module__.split(".")[0] != "torch":
        return None
    import torch
    return cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream, device)


def keep_until_done(cupy, arrays) -> None:
    """Keep another library's `arrays` alive until the work just queued on CuPy's
    current stream (which reads them) is done.

    That library frees their memory when the caller drops them and may hand it out
    again on its own stream at once, unordered with CuPy's: an event recorded now
    marks the work, and the arrays are released by a later call once it has
    completed (a query, never a sync). Not while a graph is captured: the caller keeps
    what a graph reads.
    """
    from . import graphs
    if graphs.holding() is not None:
        return
    event = cupy.cuda.get_current_stream().record()
    with _in_flight_lock:
        while _in_flight and _in_flight[0][0].done:
            _in_flight.popleft()
        _in_flight.append((event, tuple(arrays)))
