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

CuPy 13 has no bfloat16 either: there a bfloat16 CUDA array crosses as its int16 bits
too, marked as bfloat16 (``Bfloat16Bits``) so the checks see the caller's dtype; the
cuDNN backend allocates with ``storage_dtype`` and computes on ``storage``; results
leave as bfloat16. CuPy 14 holds bfloat16 itself, and nothing of this applies.
"""

from __future__ import annotations

import functools

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
    if isinstance(dtype, np.dtype):  # the common case, asked per array of a call (the
        # itemsize first: NumPy computes a dtype's name in Python)
        return dtype.itemsize == 2 and dtype.name == "bfloat16"
    if dtype is None:
        return False
    try:
        return _is_bfloat16_other(dtype)
    except TypeError:  # unhashable: not remembered
        return _is_bfloat16_other.__wrapped__(dtype)


@functools.lru_cache(maxsize=64)
def _is_bfloat16_other(dtype) -> bool:
    """is_bfloat16 of a dtype that is not a NumPy dtype object (a type, a name, another
    library's dtype), remembered: torch.float32 takes an exception to tell."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:  # e.g. torch.bfloat16 (or TensorFlow's) is not a NumPy dtype
        return str(dtype).rpartition(".")[2] == "bfloat16" or \
            getattr(dtype, "name", None) == "bfloat16"
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
    if type(array) is Bfloat16Bits:
        return jnp.from_dlpack(array.bits).view(jnp.bfloat16)
    if isinstance(array, np.ndarray) and not array.flags.writeable:
        return jnp.asarray(array)  # NumPy will not export a read-only array through DLPack
    if is_bfloat16(array.dtype):
        return jnp.from_dlpack(array.view(np.int16)).view(jnp.bfloat16)
    return jnp.from_dlpack(array)


def torch_from_dlpack(array):
    """A PyTorch tensor of a NumPy or CuPy array without a copy, bfloat16 included."""
    import torch
    if type(array) is Bfloat16Bits:
        return torch.from_dlpack(array.bits).view(torch.bfloat16)
    if is_bfloat16(array.dtype):
        return torch.from_dlpack(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(array)


def tensorflow_from_dlpack(array):
    """A TensorFlow tensor of a NumPy or CuPy array, bfloat16 included."""
    import tensorflow as tf
    if type(array) is Bfloat16Bits:
        return tf.bitcast(tf.experimental.dlpack.from_dlpack(array.bits.__dlpack__()),
                          tf.bfloat16)
    if isinstance(array, np.ndarray):
        return tf.convert_to_tensor(array)  # (TensorFlow takes ml_dtypes' bfloat16 as its own)
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


#: The first CuPy whose ``from_dlpack`` keeps bfloat16 (older ones refuse DLPack's kDLBfloat).
CUPY_BFLOAT16_SINCE = 14

#: What a CuPy older than 14 holds bfloat16 data as: its bits. int16, as on the CPU
#: crossings above (PyTorch's uint16 is a dtype with limited support).
BITS = np.dtype(np.int16)


def cupy_holds_bfloat16(cupy) -> bool:
    """Whether this CuPy imports and computes with bfloat16 arrays (CuPy >= 14)."""
    return _major(str(cupy.__version__)) >= CUPY_BFLOAT16_SINCE


@functools.lru_cache(maxsize=8)
def _major(version: str) -> int:  # cached: asked on every CUDA call's 16-bit arrays
    return int(version.split(".")[0])


def storage_dtype(dtype, xp) -> np.dtype:
    """The dtype `xp` (NumPy or CuPy) keeps data of `dtype` in: `dtype` itself, except
    bfloat16 in a CuPy older than 14, kept as its bits (``BITS``). cuDNN only sees
    pointers, and its descriptors still say bfloat16."""
    dtype = np.dtype(dtype)
    if xp is np or not is_bfloat16(dtype) or cupy_holds_bfloat16(xp):
        return dtype
    return BITS


class Bfloat16Bits:
    """bfloat16 data that a CuPy older than 14 holds as its bits (`bits`, an int16 CuPy
    array): the checks read it as bfloat16 (shape, ndim, dtype), the backend computes on
    the bits, and results leave as bfloat16 again. A CuPy int16 array is not bfloat16."""

    __slots__ = ("bits",)

    def __init__(self, bits):
        self.bits = bits

    @property
    def dtype(self):
        return bfloat16()

    shape = property(lambda self: self.bits.shape)
    ndim = property(lambda self: self.bits.ndim)
    size = property(lambda self: self.bits.size)
    flags = property(lambda self: self.bits.flags)
    device = property(lambda self: self.bits.device)

    def __getitem__(self, key):
        return Bfloat16Bits(self.bits[key])

    def reshape(self, *shape):
        return Bfloat16Bits(self.bits.reshape(*shape))

    def __repr__(self):
        return f"Bfloat16Bits({self.bits!r})"


def storage(array):
    """What the backend computes on: the bits of bfloat16 data a CuPy older than 14 holds
    (a ``Bfloat16Bits``, or a CuPy array made with the bfloat16 dtype, e.g. over XLA's
    buffers); any other array as it is."""
    if type(array) is Bfloat16Bits:
        return array.bits
    if array is not None and is_bfloat16(array.dtype):
        return array.view(BITS)
    return array


def _bits_of(name, array):
    """A bfloat16 array of another library as int16 of that library, without a copy where
    the library can (PyTorch views; JAX bitcasts, which XLA may copy)."""
    library = type(array).__module__.split(".")[0]
    if library == "torch":
        import torch
        return array.detach().view(torch.int16)
    if library in ("jax", "jaxlib"):
        import jax
        return jax.lax.bitcast_convert_type(array, BITS)
    try:
        return array.view(BITS)  # NumPy-like arrays (CuPy, and the stand-in GPU's)
    except Exception as exc:
        raise TypeError(f"{name}: cannot read the bits of a bfloat16 "
                        f"{type(array).__module__}.{type(array).__qualname__} for a CuPy "
                        f"older than {CUPY_BFLOAT16_SINCE}: pass a PyTorch or JAX array, or "
                        f"upgrade CuPy ({exc})") from exc


def cupy_from_dlpack(cupy, name: str, array):
    """A CUDA DLPack array as a CuPy array without a copy.

    bfloat16 with a CuPy older than 14 (whose import refuses it) crosses as its bits: a
    ``Bfloat16Bits`` over an int16 CuPy array.
    """
    if is_bfloat16(getattr(array, "dtype", None)):
        bfloat16(name)  # CuPy makes bfloat16 arrays with ml_dtypes' dtype
        if not cupy_holds_bfloat16(cupy):
            bits = array if isinstance(array, cupy.ndarray) else cupy.from_dlpack(
                _bits_of(name, array))
            return Bfloat16Bits(bits.view(BITS))
    return cupy.from_dlpack(array)


def cupy_array(cupy, name: str, array):
    """`array` (a CUDA array) as the cuDNN backend takes it: CuPy arrays as they are,
    except bfloat16 ones with a CuPy older than 14, and others through DLPack."""
    if isinstance(array, cupy.ndarray) and (array.dtype.itemsize != 2 or
                                            cupy_holds_bfloat16(cupy) or
                                            not is_bfloat16(array.dtype)):
        return array
    return cupy_from_dlpack(cupy, name, array)


def cupy_result(array, like):
    """A backend result for a caller whose arrays are CuPy's (or a library's we do not
    know): bfloat16 bits as bfloat16 when `like`, a CuPy array (None for other
    libraries), is bfloat16 (so CuPy can hold the dtype), else the bits."""
    if type(array) is not Bfloat16Bits:
        return array
    dtype = getattr(like, "dtype", None)
    return array.bits.view(dtype) if is_bfloat16(dtype) else array.bits
