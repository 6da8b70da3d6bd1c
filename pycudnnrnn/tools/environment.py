"""What ``pycudnnrnn info`` reports: versions, cuDNN, GPUs, and which backend runs where."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
from importlib import metadata

import numpy as np

from .. import __version__
from ..core import driver
from ..core.extras import FRAMEWORKS, install


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
        # The advice to install the GPU extra, once: the lines below refer to it.
        info["cupy"] = (f"not installed: CUDA arrays need the GPU extra, {install('cuda12')} "
                        f"(CUDA 12 and 13 drivers) or {install('cuda13')} (CUDA 13)"
                        if isinstance(exc, ModuleNotFoundError) and exc.name == "cupy"
                        else f"not importable ({exc})")
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
        if "cuda runtime (cupy)" in info and info["cuda runtime (cupy)"] == "none (no CuPy)" \
                and len(lines) > 2:
            info["cudnn library"] = "none found (the GPU extra on the cupy line brings it)"
        else:
            info["cudnn library"] = f"none found. {lines[-1]}" if len(lines) > 2 else lines[0]
    info["gpus"] = _gpus()
    info["torch"] = _torch()
    info["jax"] = _jax()
    for name in ("flax", "optax", "orbax"):
        info[name] = _version(name)
    info["tensorflow"] = _tensorflow()
    info["keras"] = _keras()
    usable, detail = gpu_status()
    info["backend for NumPy arrays"] = "NumPy (CPU)"
    info["backend for CUDA arrays"] = f"cuDNN ({detail})" if usable else \
        f"unavailable: {_short(detail)} (see above)"
    info["default backend (check, bench)"] = "gpu" if usable else "cpu"
    return info


def _short(reason: str) -> str:
    """The first clause of an unavailability reason given in full on a line above."""
    return reason.split(", so the cuDNN backend")[0].split("; tried:")[0]


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
        if isinstance(exc.__cause__, ImportError):  # no CuPy: the cupy line says what to do
            return "unknown (no CuPy)"
        return f"none ({_reason(exc)})"


def _not_installed(name: str) -> str:
    return f"not installed ({install(FRAMEWORKS[name][1])})"


def _version(name: str) -> str:
    """A framework's version from package metadata (importing it would cost seconds)."""
    try:
        return metadata.version(FRAMEWORKS[name][0])
    except metadata.PackageNotFoundError:
        return _not_installed(name)


def _keras() -> str:
    """Keras's version and the backend it would load, told without importing it."""
    version = _version("keras")
    if version.startswith("not installed"):
        return version
    backend = os.environ.get("KERAS_BACKEND")
    source = "KERAS_BACKEND"
    if not backend:
        home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
        try:
            with open(os.path.join(home, "keras.json")) as f:
                backend, source = json.load(f).get("backend"), os.path.join(home, "keras.json")
        except (OSError, ValueError, AttributeError):
            backend = None
        if not backend:
            backend, source = "tensorflow", "Keras's default"
    module = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}.get(backend)
    text = f"{version} (backend {backend}, from {source}"
    if module is not None and importlib.util.find_spec(module) is None:
        text += f"; {backend} is not installed: set KERAS_BACKEND=jax, torch or tensorflow " \
                "and install that extra"
    runs = "runs" if module is not None else "does not run"
    return text + f"); pycudnnrnn.keras {runs} the op on this backend (it does on jax, " \
        f"torch and tensorflow)"


def _tensorflow() -> str:
    """TensorFlow's version from package metadata (either wheel: tensorflow or
    tensorflow-cpu); importing it would cost seconds."""
    for distribution in ("tensorflow", "tensorflow-cpu"):
        try:
            return f"{metadata.version(distribution)} (pycudnnrnn.tensorflow)"
        except metadata.PackageNotFoundError:
            pass
    return _not_installed("tensorflow")


def _torch() -> str:
    if importlib.util.find_spec("torch") is None:
        return _not_installed("torch")
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
        return _not_installed("jax")
    for plugin in ("jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin"):
        try:
            versions.append(f"{plugin} {metadata.version(plugin)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(versions)
