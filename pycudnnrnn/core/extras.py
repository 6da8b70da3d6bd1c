"""Which extra installs which framework, and the ImportError that says so.

Each adapter (``pycudnnrnn.torch``, ``.jax``, ``.flax``, ``.keras``) imports its framework
through ``require``: a framework that is missing raises an ``ImportError`` that names the
extra to install, as a CUDA array without CuPy names the GPU extra.
"""

from __future__ import annotations

import importlib
import os

#: Frameworks the adapters and the examples import: import name -> (the distribution,
#: the extra that installs it, its name in prose).
FRAMEWORKS = {
    "torch": ("torch", "torch", "PyTorch"),
    "jax": ("jax", "jax", "JAX"),
    "optax": ("optax", "jax", "Optax"),
    "flax": ("flax", "flax", "Flax"),
    "orbax": ("orbax-checkpoint", "flax", "Orbax"),
    "keras": ("keras", "keras", "Keras"),
    "tensorflow": ("tensorflow", "tensorflow", "TensorFlow"),
}

_KERAS_INSTALL = ("`pip install '.[keras,jax]'` or `pip install '.[keras,torch]'` or "
                  "`pip install '.[keras,tensorflow]'` (from the root of a checkout)")


def install(extra: str) -> str:
    return f"`pip install '.[{extra}]'` (from the root of a checkout)"


def _missing(exc: ImportError) -> str | None:
    """The top-level module that is not installed, when that is why `exc` was raised."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return exc.name.split(".")[0]
    return None


def _error(exc: ImportError, message: str) -> ImportError:
    cls = ModuleNotFoundError if isinstance(exc, ModuleNotFoundError) else ImportError
    return cls(f"{message} ({exc})", name=exc.name)


def _cause(exc: ImportError) -> ImportError | None:
    """A missing module is said in full by our message; any other failure keeps its
    traceback."""
    return None if _missing(exc) in FRAMEWORKS or _missing(exc) == "tensorflow" else exc


def require(adapter: str, extra: str, *modules: str) -> None:
    """Import `modules`; if one fails, raise an ImportError naming `extra`."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            needs = " and ".join(FRAMEWORKS[m][2] for m in modules)
            missing = _missing(exc)
            if missing in FRAMEWORKS:
                why = f"{FRAMEWORKS[missing][2]} is not installed"
            else:
                why = f"importing {FRAMEWORKS[module][2]} failed"
            raise _error(exc, f"{adapter} needs {needs}, but {why}: install the "
                              f"{extra} extra, {install(extra)}") from _cause(exc)


def require_keras() -> None:
    """Import Keras; if it or its backend is missing, say which extra to install, and
    that a backend without its framework needs KERAS_BACKEND=jax or torch."""
    try:
        importlib.import_module("keras")
    except ImportError as exc:
        missing = _missing(exc)
        chosen = os.environ.get("KERAS_BACKEND")
        if missing == "keras":
            message = (f"pycudnnrnn.keras needs Keras 3, but Keras is not installed: "
                       f"{_KERAS_INSTALL}, and set KERAS_BACKEND=jax or torch")
        elif missing in ("tensorflow", "jax", "jaxlib", "torch"):
            name = {"tensorflow": "TensorFlow", "torch": "PyTorch"}.get(missing, "JAX")
            how = (f"KERAS_BACKEND={chosen}" if chosen else
                   "KERAS_BACKEND is not set: Keras's default, or the one keras.json names")
            message = (f"Keras's backend is {name} ({how}), but {name} is not installed: "
                       f"set KERAS_BACKEND=jax or torch and install that extra, "
                       f"{_KERAS_INSTALL}")
        else:
            message = (f"pycudnnrnn.keras needs Keras 3 on the JAX or PyTorch backend, but "
                       f"importing Keras failed: {_KERAS_INSTALL}, with KERAS_BACKEND=jax "
                       f"or torch")
        raise _error(exc, message) from _cause(exc)
