"""Find and load ``libcudnn.so.9``.

Order: the file named by ``$PYCUDNNRNN_CUDNN_LIBRARY``; the ``nvidia`` wheels
(``nvidia-cudnn-cu12`` keeps it in ``nvidia/cudnn/lib``, CUDA 13 wheels may use
``nvidia/cu13/lib``); then the system loader. cuBLASLt and NVRTC are loaded first, from
their wheels where present and with ``RTLD_GLOBAL``, because cuDNN's sub-libraries open
them by name and would not look inside site-packages.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

from ..errors import CudnnUnavailableError

ENV_VAR = "PYCUDNNRNN_CUDNN_LIBRARY"
SONAME = "libcudnn.so.9"
_WHEEL_DIRS = ("cudnn/lib", "cu13/lib", "cu12/lib")
_DEPENDENCIES = {  # wheel-relative candidates of what cuDNN's sub-libraries dlopen
    "cuBLASLt": ("cu13/lib/libcublasLt.so.13", "cublas/lib/libcublasLt.so.12"),
    "NVRTC": ("cu13/lib/libnvrtc.so.13", "cuda_nvrtc/lib/libnvrtc.so.12"),
}
INSTALL_HINT = ("install the GPU extra from the root of pycudnnrnn's checkout, "
                "`pip install '.[cuda12]'` (CUDA 12 and 13 drivers) or "
                "`pip install '.[cuda13]'` (CUDA 13), or cuDNN 9 alone with "
                "`pip install nvidia-cudnn-cu12` (or -cu13), or set "
                f"{ENV_VAR} to the path of {SONAME}")


def nvidia_wheel_roots() -> list[str]:
    """The folders of the ``nvidia`` namespace package (where NVIDIA's wheels install)."""
    spec = importlib.util.find_spec("nvidia")
    return list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []


def candidates() -> list[str]:
    """Every path or name tried for libcudnn, in order."""
    found = []
    if os.environ.get(ENV_VAR):
        found.append(os.environ[ENV_VAR])
    for root in nvidia_wheel_roots():
        found += [os.path.join(root, d, SONAME) for d in _WHEEL_DIRS]
    found.append(SONAME)  # the system loader: LD_LIBRARY_PATH, ldconfig cache
    return found


def _preload_dependencies():
    for root in nvidia_wheel_roots():
        for relatives in _DEPENDENCIES.values():
            for relative in relatives:
                path = os.path.join(root, relative)
                if os.path.exists(path):
                    try:
                        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    except OSError:
                        pass  # cuDNN will say what it misses, if it misses it


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL:
    """Load cuDNN 9 once; raise ``CudnnUnavailableError`` listing what was tried."""
    _preload_dependencies()
    tried = []
    for path in candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (no such file)")
            continue
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            tried.append(f"{path} ({exc})")
            continue
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        lib.cudnnGetVersion.argtypes = []
        version = int(lib.cudnnGetVersion())
        if version // 10000 != 9:
            tried.append(f"{path} (cuDNN version {version}, need 9.x)")
            continue
        lib._pycudnnrnn_path = path
        return lib
    raise CudnnUnavailableError("could not load cuDNN 9; tried:\n  " + "\n  ".join(tried)
                                + "\nTo fix: " + INSTALL_HINT)


def library_path() -> str:
    """The path (or name) the loaded library came from."""
    return load()._pycudnnrnn_path


def version() -> tuple[int, int, int]:
    """cuDNN's (major, minor, patch), from ``cudnnGetVersion``."""
    v = int(load().cudnnGetVersion())
    return v // 10000, (v % 10000) // 100, v % 100
