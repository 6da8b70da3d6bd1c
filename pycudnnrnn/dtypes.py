"""The dtypes the library takes, what each computes in, and bfloat16 across DLPack.

float16, bfloat16, float32 and float64. bfloat16 is ``ml_dtypes.bfloat16``, the NumPy
dtype JAX, TensorFlow and CuPy 14 use (``ml_dtypes`` is a dependency). The dtype is
recognised by name, so the package is imported only when this library has to make the
dtype itself (from a PyTorch tensor, or from the name "bfloat16"); an array that already
has the dtype has already imported it.

The 16-bit types compute in float32, as cuDNN does. NumPy's ``from_dlpack`` cannot
import bfloat16 (DLPack's ``kDLBfloat`` is not among its types), and PyTorch cannot
import ml_dtypes' dtype, so bfloat16 crosses between them as its bits: a tensor is
viewed as int16, imported, and viewed as bfloat16 again, without a copy.
"""

from __future__ import annotations

import numpy as np

#: Names of the floating dtypes every backend takes, in the order errors list them.
NAMES = ("float16", "bfloat16", "float32", "float64")
_MINIMUM_ML_DTYPES = "ml_dtypes>=0.4"


def is_supported(dtype) -> bool:
    """Whether arrays of `dtype` can be computed with."""
    dtype = np.dtype(dtype)
    return is_bfloat16(dtype) or (dtype.kind == "f" and dtype.name in NAMES)


def is_bfloat16(dtype) -> bool:
    """Whether `dtype` (a NumPy dtype, or a library's dtype object) is bfloat16."""
    if dtype is None:
        return False
    try:
        dtype = np.dtype(dtype)
    except TypeError:  # e.g. torch.bfloat16 is not a NumPy dtype
        return str(dtype).rpartition(".")[2] == "bfloat16"
    return dtype.name == "bfloat16" and dtype.itemsize == 2


def compute_dtype(dtype) -> np.dtype:
    """The dtype arithmetic runs in: float32 for the 16-bit types, else the dtype itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize == 2 else dtype


def bfloat16(name: str = "input") -> np.dtype:
    """``ml_dtypes.bfloat16`` as a NumPy dtype.

    Raises TypeError naming argument `name` and the package when ml_dtypes is missing.
    """
    try:
        import ml_dtypes
    except ImportError as exc:
        raise TypeError(f"{name}: bfloat16 needs the ml_dtypes package (NumPy's bfloat16), "
                        f"a dependency of pycudnnrnn that is not installed: `pip install "
                        f"'{_MINIMUM_ML_DTYPES}'`; or use float32 ({exc})") from exc
    return np.dtype(ml_dtypes.bfloat16)


def by_name(name: str) -> np.dtype:
    """The NumPy dtype called `name` (one of ``NAMES``); bfloat16 imports ml_dtypes."""
    return bfloat16("dtype") if name == "bfloat16" else np.dtype(name)


def _is_torch(array) -> bool:
    return type(array).__module__.split(".")[0] == "torch"


def from_dlpack(xp, name: str, array):
    """`array` (argument `name`) as an array of `xp`, NumPy or CuPy, without a copy."""
    return numpy_from_dlpack(name, array) if xp is np else cupy_from_dlpack(xp, name, array)


def numpy_from_dlpack(name: str, array) -> np.ndarray:
    """A CPU DLPack array as a NumPy array without a copy, bfloat16 included."""
    if not is_bfloat16(getattr(array, "dtype", None)):
        return np.from_dlpack(array)
    if _is_torch(array):
        import torch
        bits = np.from_dlpack(array.detach().view(torch.int16))
        return bits.view(bfloat16(name))
    host = np.asarray(array)  # JAX and others hand out ml_dtypes arrays through __array__
    if not is_bfloat16(host.dtype):
        raise TypeError(f"{name}: expected a bfloat16 array NumPy can read, got "
                        f"{type(array).__module__}.{type(array).__qualname__} read as {host.dtype}")
    return host


def jax_from_dlpack(array):
    """A JAX array of a NumPy or CuPy array, bfloat16 included (as its bits, then a bitcast)."""
    import jax.numpy as jnp
    if isinstance(array, np.ndarray) and not array.flags.writeable:
        return jnp.asarray(array)  # NumPy will not export a read-only array through DLPack
    if is_bfloat16(array.dtype):
        return jnp.from_dlpack(array.view(np.int16)).view(jnp.bfloat16)
    return jnp.from_dlpack(array)


def torch_from_dlpack(array):
    """A PyTorch tensor of a NumPy or CuPy array without a copy, bfloat16 included."""
    import torch
    if is_bfloat16(array.dtype):
        return torch.from_dlpack(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(array)


#: The first CuPy whose ``from_dlpack`` keeps bfloat16 (older ones refuse DLPack's kDLBfloat).
CUPY_BFLOAT16_SINCE = 14


def cupy_from_dlpack(cupy, name: str, array):
    """A CUDA DLPack array as a CuPy array without a copy; bfloat16 needs CuPy 14."""
    if is_bfloat16(getattr(array, "dtype", None)):
        bfloat16(name)  # CuPy makes bfloat16 arrays with ml_dtypes' dtype
        major = int(str(cupy.__version__).split(".")[0])
        if major < CUPY_BFLOAT16_SINCE:
            raise TypeError(f"{name}: a bfloat16 CUDA array needs CuPy >= "
                            f"{CUPY_BFLOAT16_SINCE} (found CuPy {cupy.__version__}); upgrade "
                            f"CuPy, or pass float16 or float32")
    return cupy.from_dlpack(array)
