"""The NVIDIA driver's CUDA library, probed without CuPy: is it there, which CUDA it runs.

Both answers serve messages and bug reports (a machine without a GPU, or with an old
driver); nothing computes with them.
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
