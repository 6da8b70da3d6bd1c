"""The NVIDIA driver's CUDA library, reached without CuPy.

Two probes (is it there, which CUDA it runs) serve messages and bug reports (a machine
without a GPU, or with an old driver). One call sets a thread's stream-capture mode,
which CuPy does not bind (``cuda.foreign``'s waiter needs it).
"""

from __future__ import annotations

import ctypes

_LIBCUDA = "libcuda.so.1"


def _load():
    try:
        return ctypes.CDLL(_LIBCUDA)
    except OSError:
        return None


def found() -> bool:
    """Whether the driver's ``libcuda.so.1`` loads."""
    return _load() is not None


def cuda_version() -> int | None:
    """``cuDriverGetVersion`` (e.g. 12080 for CUDA 12.8), or None without a driver.

    Raises OSError carrying the CUresult when the driver answers with an error.
    """
    libcuda = _load()
    if libcuda is None:
        return None
    # int cuDriverGetVersion(int *driverVersion)
    version = ctypes.c_int(0)
    status = libcuda.cuDriverGetVersion(ctypes.byref(version))
    if status != 0:
        raise OSError(f"CUresult {status}")
    return version.value


#: CUstreamCaptureMode's CU_STREAM_CAPTURE_MODE_RELAXED (cudaStreamCaptureModeRelaxed).
CAPTURE_MODE_RELAXED = 2


def exchange_stream_capture_mode(mode: int) -> int | None:
    """``cuThreadExchangeStreamCaptureMode``: this thread's capture interaction mode set
    to `mode`; the previous one, or None without a driver.

    Raises OSError carrying the CUresult when the driver answers with an error.
    """
    libcuda = _load()
    if libcuda is None:
        return None
    # CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
    exchanged = ctypes.c_int(mode)
    status = libcuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(exchanged))
    if status != 0:
        raise OSError(f"CUresult {status}")
    return exchanged.value
