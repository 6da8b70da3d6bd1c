"""What kind of array an argument is, and moving arrays between libraries by DLPack.

CPU arrays (NumPy, or any DLPack array on the CPU) run on the NumPy backend, CUDA
arrays on cuDNN; results go back to the library of the call's first array.
"""

from __future__ import annotations

import numpy as np

# DLPack device types (dlpack.h): kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13.
_DLPACK_CPU = 1
_DLPACK_CUDA = (2, 13)


def device_kind(name, array, strict=True):
    """"cpu" or "cuda", from the array's ``__dlpack_device__`` (NumPy arrays are "cpu").

    Anything that is neither a NumPy array nor a DLPack array on the CPU or a CUDA device
    is a TypeError (or "other" when not `strict`).
    """
    dlpack_device = getattr(array, "__dlpack_device__", None)
    if dlpack_device is not None:
        try:
            device_type = int(dlpack_device()[0])
        except Exception:  # a __dlpack_device__ that fails says nothing useful
            device_type = None
        if device_type in _DLPACK_CUDA:
            return "cuda"
        if device_type == _DLPACK_CPU and hasattr(array, "__dlpack__"):
            return "cpu"
    if isinstance(array, np.ndarray):
        return "cpu"
    if not strict:
        return "other"
    raise TypeError(f"{name}: expected a NumPy array, a CUDA array (CuPy, or any array with "
                    f"__dlpack__ on a CUDA device) or a DLPack array on the CPU, got "
                    f"{type(array).__module__}.{type(array).__qualname__}")



def from_dlpack_like(template):
    """A function making arrays of `template`'s library from DLPack.

    PyTorch and JAX are known; for anything else results stay the backend's own arrays
    (NumPy or CuPy).
    """
    library = type(template).__module__.split(".")[0]
    if library == "torch":
        import torch
        return torch.from_dlpack
    if library in ("jax", "jaxlib"):
        import jax.numpy as jnp
        return jnp.from_dlpack
    return lambda array: array


def host_lengths(sequence_lengths):
    """sequence_lengths as a host array (they steer the computation, so they live on the CPU)."""
    if sequence_lengths is None or isinstance(sequence_lengths, (list, tuple, np.ndarray)):
        return None if sequence_lengths is None else np.asarray(sequence_lengths)
    if hasattr(sequence_lengths, "__dlpack_device__") and \
            device_kind("sequence_lengths", sequence_lengths, strict=False) == "cuda":
        from .gpu import cupy
        return cupy().asnumpy(cupy().from_dlpack(sequence_lengths))
    return np.asarray(sequence_lengths)
