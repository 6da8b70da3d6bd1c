"""What ``pycudnnrnn info`` reports: versions, cuDNN, GPUs, and which backend runs where."""

from __future__ import annotations

import platform

import numpy as np

from . import __version__


def gpu_status():
    """(usable, detail): whether CUDA arrays can run on cuDNN here, and why not if not."""
    try:
        from .gpu import cupy as find_cupy
        cupy = find_cupy()
        from .cudnn import loader
        loader.load()
        from .cudnn.descriptors import Handle
        Handle().close()
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return True, f"{cupy.cuda.runtime.getDeviceCount()} GPU(s)"


def collect() -> dict:
    """Everything a bug report needs, as plain strings."""
    info = {"pycudnnrnn": __version__, "python": platform.python_version(),
            "platform": platform.platform(), "numpy": np.__version__}
    try:
        import cupy
        info["cupy"] = cupy.__version__
    except ImportError as exc:
        info["cupy"] = f"not importable ({exc})"
    try:
        from .cudnn import loader
        info["cudnn"] = ".".join(map(str, loader.version()))
        info["cudnn library"] = loader.library_path()
    except Exception as exc:
        info["cudnn"] = "not loadable"
        info["cudnn library"] = str(exc).splitlines()[0]
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
        names = []
        for i in range(count):
            name = cupy.cuda.runtime.getDeviceProperties(i)["name"]
            names.append(name.decode() if isinstance(name, bytes) else name)
        info["gpus"] = ", ".join(names) or "none"
    except Exception as exc:
        info["gpus"] = f"none ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    usable, detail = gpu_status()
    info["backend for NumPy arrays"] = "NumPy (CPU)"
    info["backend for CUDA arrays"] = f"cuDNN ({detail})" if usable else f"unavailable: {detail}"
    info["default backend (check, bench)"] = "gpu" if usable else "cpu"
    return info
