"""What ``pycudnnrnn info`` reports: versions, cuDNN, GPUs, and which backend runs where."""

from __future__ import annotations

import importlib.util
import os
import platform
from importlib import metadata

import numpy as np

from .. import __version__
from ..core import driver


def gpu_status():
    """(usable, detail): whether CUDA arrays can run on cuDNN here, and why not if not."""
    try:
        from ..core.gpu import cupy as find_cupy
        cupy = find_cupy()
        from ..cudnn import loader
        loader.load()
        from ..cudnn.descriptors import Handle
        Handle().close()
    except Exception as exc:
        return False, _reason(exc)
    return True, f"{cupy.cuda.runtime.getDeviceCount()} GPU(s)"


def _reason(exc) -> str:
    """One line: our own unavailability messages as they are, anything else with its type."""
    from ..errors import CudnnUnavailableError
    text = str(exc) if isinstance(exc, CudnnUnavailableError) else f"{type(exc).__name__}: {exc}"
    return text.splitlines()[0]


#: Environment variables that steer BLAS and OpenMP thread pools (and OpenBLAS's kernel
#: choice: OPENBLAS_CORETYPE): every one set is reported.
_THREAD_PREFIXES = ("OPENBLAS_", "GOTO_", "OMP_", "KMP_", "MKL_", "BLIS_", "NUMEXPR_")


def collect() -> dict:
    """Everything a bug report needs, as plain strings (as ``torch.utils.collect_env``)."""
    settings = _thread_settings()  # before threadpoolctl's import sets KMP_DUPLICATE_LIB_OK
    info = {"pycudnnrnn": __version__, "python": platform.python_version(),
            "platform": platform.platform(), "numpy": np.__version__,
            "blas": _blas(), "blas threads": _blas_threads(), "cpus": _cpus(),
            "thread settings": settings}
    try:
        import cupy
        info["cupy"] = cupy.__version__
        info["cuda runtime (cupy)"] = _cuda_version(cupy.cuda.runtime.runtimeGetVersion())
    except ImportError as exc:
        info["cupy"] = f"not importable ({exc})"
        info["cuda runtime (cupy)"] = "none (no CuPy)"
    except Exception as exc:
        info["cuda runtime (cupy)"] = f"unknown ({_reason(exc)})"
    info["nvidia driver"] = _nvidia_driver()
    info["cuda driver api"] = _cuda_driver_api()
    try:
        from ..cudnn import loader
        info["cudnn"] = ".".join(map(str, loader.version()))
        info["cudnn library"] = loader.library_path()
    except Exception as exc:  # the loader's message lists every path tried, then the fix
        info["cudnn"] = "not loadable"
        lines = str(exc).splitlines()
        info["cudnn library"] = f"none found. {lines[-1]}" if len(lines) > 2 else lines[0]
    info["gpus"] = _gpus()
    info["torch"] = _torch()
    info["jax"] = _jax()
    usable, detail = gpu_status()
    info["backend for NumPy arrays"] = "NumPy (CPU)"
    info["backend for CUDA arrays"] = f"cuDNN ({detail})" if usable else f"unavailable: {detail}"
    info["default backend (check, bench)"] = "gpu" if usable else "cpu"
    return info


def _cuda_version(number: int) -> str:
    """CUDA's 12090 as "12.9"."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _blas() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # older NumPy: no machine-readable configuration
        return "unknown"


def _cpus() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    text = f"{os.cpu_count()}"
    if usable is not None and usable != os.cpu_count():
        text += f" ({usable} usable by this process)"
    try:
        from threadpoolctl import threadpool_info
        pools = [f"{p['internal_api']} {p['num_threads']}" for p in threadpool_info()]
        text += f"; thread pools: {', '.join(pools)}"
    except ImportError:
        pass
    return text


def _thread_settings() -> str:
    settings = sorted(f"{name}={value}" for name, value in os.environ.items()
                      if name.startswith(_THREAD_PREFIXES))
    return ", ".join(settings) or f"no {'*, '.join(_THREAD_PREFIXES)}* variable set"


def _blas_threads() -> str:
    """Each BLAS library loaded, with the thread count it uses now (threadpoolctl)."""
    from ..core import blas
    try:
        counts = blas.thread_counts()
    except Exception as exc:  # threadpoolctl missing or failing: say so, do not fail
        return f"unknown ({_reason(exc)})"
    return "; ".join(f"{c['library']} {c['version']} ({c['threading']}): {c['threads']} "
                     f"thread{'s' if c['threads'] != 1 else ''}, {c['path']}"
                     for c in counts) or "none found"


def _nvidia_driver(path="/proc/driver/nvidia/version") -> str:
    """The kernel driver's version, from /proc (no CUDA call needed)."""
    try:
        with open(path) as f:
            first = f.readline()
    except OSError:
        return f"none found (no {path})"
    words = first.split()
    versions = [w for w in words if w.count(".") >= 1 and w.replace(".", "").isdigit()]
    return versions[0] if versions else first.strip()


def _cuda_driver_api() -> str:
    """The CUDA version libcuda supports (cuDriverGetVersion)."""
    try:
        version = driver.cuda_version()
    except OSError as exc:
        return f"unknown ({exc})"
    if version is None:
        return "none (libcuda.so.1 does not load: no NVIDIA driver)"
    return _cuda_version(version)


def _gpus() -> str:
    try:
        from ..core.gpu import cupy as find_cupy
        cupy = find_cupy()
        names = []
        for i in range(cupy.cuda.runtime.getDeviceCount()):
            props = cupy.cuda.runtime.getDeviceProperties(i)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            names.append(f"{name} ({props['totalGlobalMem'] / 2**30:.0f} GiB, "
                         f"sm_{props['major']}{props['minor']})")
        return ", ".join(names) or "none"
    except Exception as exc:
        return f"none ({_reason(exc)})"


def _torch() -> str:
    if importlib.util.find_spec("torch") is None:
        return "not installed"
    try:
        import torch
    except Exception as exc:
        return f"not importable ({_reason(exc)})"
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    cudnn = torch.backends.cudnn.version() if torch.version.cuda else None
    parts = [build] + ([f"cuDNN {cudnn}"] if cudnn else [])
    if torch.version.cuda:
        parts.append(f"CUDA available: {torch.cuda.is_available()}")
    parts.append(f"{torch.get_num_threads()} threads")
    return f"{torch.__version__} ({', '.join(parts)})"


def _jax() -> str:
    """Versions from package metadata: importing JAX would start its backends."""
    try:
        versions = [f"jax {metadata.version('jax')}"]
    except metadata.PackageNotFoundError:
        return "not installed"
    for plugin in ("jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin"):
        try:
            versions.append(f"{plugin} {metadata.version(plugin)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(versions)
