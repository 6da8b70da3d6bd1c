"""What kind of array an argument is, and moving arrays between libraries by DLPack.

CPU arrays (NumPy, or any DLPack array on the CPU) run on the NumPy backend, CUDA
arrays on cuDNN; results go back to the library of the call's first array. An adapter
whose buffers another library allocated may pass their device addresses instead
(``ForwardAddresses``, ``BackpropAddresses``).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np

from . import dtypes

# DLPack device types (dlpack.h): kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13.
_DLPACK_CPU = 1
_DLPACK_CUDA = (2, 13)


def device_kind(name, array, strict=True):
    """"cpu" or "cuda", from the array's ``__dlpack_device__`` (NumPy arrays are "cpu").

    Anything that is neither a NumPy array nor a DLPack array on the CPU or a CUDA device
    is a TypeError (or "other" when not `strict`).
    """
    refuse_masked(name, array)
    kind = _torch_kind(array)
    if kind is not None:
        return kind
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
                    f"{type(array).__module__}.{type(array).__qualname__}{_on_device(array)}")


def _torch_kind(array):
    """"cpu" or "cuda" for a plain PyTorch tensor (or Parameter) on one, read from its
    device: PyTorch's ``__dlpack_device__`` is Python and costs ~5 us, asked per tensor
    of every call. None for anything else (subclasses, which may answer otherwise, and
    ROCm builds, whose DLPack device is not CUDA's), which takes the DLPack way."""
    kind = type(array)
    if kind.__module__ not in _TORCH_TENSOR_MODULES:
        return None
    torch = sys.modules["torch"]
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        return None
    device = array.device.type
    if device == "cpu":
        return "cpu"
    if device == "cuda" and torch.version.cuda is not None and torch.version.hip is None:
        return "cuda"
    return None


_TORCH_TENSOR_MODULES = frozenset({"torch", "torch.nn.parameter"})


def _tensorflow_readable(name, array):
    """A TensorFlow tensor's value (a variable's too); a TypeError naming
    ``pycudnnrnn.tensorflow`` for a tensor that a ``tf.function`` traces or that a
    ``GradientTape`` watches. The functional API computes on values and records nothing:
    a gradient would be None, silently."""
    tf = sys.modules["tensorflow"]
    if not tf.executing_eagerly() or not hasattr(array, "numpy"):
        why = "a symbolic TensorFlow tensor (a tf.function or a Keras model is tracing)"
    elif _tape_watches(array):
        why = "a TensorFlow tensor that a GradientTape watches (it would record nothing)"
    else:
        return tf.convert_to_tensor(array)  # a variable's value; a tensor as it is
    raise TypeError(f"{name}: got {why}; this function computes on values: call "
                    f"pycudnnrnn.tensorflow.rnn (or its cudnn_rnn_v3), which TensorFlow "
                    f"traces and differentiates")


def _tape_watches(array) -> bool:
    from tensorflow.python.eager import record  # (TensorFlow's own, what its ops ask)
    if not record.could_possibly_record():
        return False
    if getattr(array, "trainable", False):  # a variable: a tape watches it when it is read
        return True
    return hasattr(array, "_id") and record.should_record_backprop([array])


def refuse_masked(name, array):
    """A NumPy masked array is an ndarray whose mask every computation here would ignore:
    a TypeError, rather than a result computed from the masked values. (NumPy imports
    numpy.ma lazily: where it is not imported, no masked array exists, and we do not pay
    for the import.)"""
    ma = sys.modules.get("numpy.ma")
    if ma is not None and isinstance(array, ma.MaskedArray):
        steps = ", and sequence_lengths to leave padded steps out" if name == "input" else ""
        raise TypeError(f"{name}: got a NumPy masked array, whose mask would be ignored; "
                        f"pass plain data (for example a.filled(0)){steps}")


def _on_device(array) -> str:
    device = getattr(array, "device", None)
    return "" if device is None or callable(device) else f" on device {device}"


def readable(name, array):
    """A PyTorch or TensorFlow tensor as DLPack can export it; anything else as it is.

    We only read the caller's arrays, so a tensor that requires grad is detached, and
    lazy conjugate or negative views are resolved (DLPack refuses the first and exports
    the second's memory without its sign: silently wrong). A TensorFlow variable gives
    its value; a tensor that TensorFlow traces or a tape watches is refused.
    """
    library = type(array).__module__.split(".")[0]
    if library == "tensorflow":
        return _tensorflow_readable(name, array)
    if library != "torch":
        return array
    if array.requires_grad:
        array = array.detach()
    if array.is_conj():
        array = array.resolve_conj()
    if array.is_neg():
        array = array.resolve_neg()
    return array


class ForwardAddresses(NamedTuple):
    """The device addresses of a forward's arrays (``RNNPlan.forward_at``); 0 for none:
    a cell state other than an LSTM's, an inference reserve space, a workspace left to
    CuPy's allocator."""

    input: int
    input_h: int
    input_c: int
    params: int
    output: int
    output_h: int
    output_c: int
    workspace: int
    reserve_space: int


class BackpropAddresses(NamedTuple):
    """The device addresses of a backprop's arrays (``RNNPlan.backprop_at``), 0 for none
    (`params_backprop` 0: no weight gradients), and the sizes of the two buffers whose
    size the plan does not fix."""

    input: int
    input_h: int
    input_c: int
    params: int
    output: int
    output_backprop: int
    output_h_backprop: int
    output_c_backprop: int
    input_backprop: int
    input_h_backprop: int
    input_c_backprop: int
    params_backprop: int
    workspace: int
    workspace_nbytes: int
    reserve_space: int
    reserve_nbytes: int


def readable_kind(name, array):
    """`array` (argument `name`) as DLPack can export it (``readable``), and where it
    lives (``device_kind``): the first half of taking a caller's array in."""
    array = readable(name, array)
    return array, device_kind(name, array)


def to_backend(xp, name, array):
    """A readable array (see ``readable_kind``) as an array of `xp`, the backend of its
    kind (NumPy for "cpu", CuPy for "cuda"), without a copy: the second half."""
    if xp is not np:
        return dtypes.cupy_array(xp, name, array)
    if type(array) is np.ndarray:  # the common case: no call
        return array
    return np.asarray(array) if isinstance(array, np.ndarray) else \
        dtypes.numpy_from_dlpack(name, array)


def from_dlpack_like(template):
    """A function making arrays of `template`'s library from DLPack.

    PyTorch, JAX and TensorFlow are known; for anything else results stay the backend's own arrays
    (NumPy or CuPy; bfloat16 that a CuPy older than 14 holds as its bits stays bits).
    """
    library = type(template).__module__.split(".")[0]
    if library == "torch":
        return dtypes.torch_from_dlpack  # bfloat16 too
    if library in ("jax", "jaxlib"):
        return dtypes.jax_from_dlpack  # bfloat16 too
    if library == "tensorflow":
        return dtypes.tensorflow_from_dlpack  # bfloat16 too
    return lambda array: dtypes.cupy_result(array, None)  # bfloat16 bits stay bits


def results_like(template, xp, results) -> tuple:
    """Backend results (`xp`'s arrays, None stays None) in the library of `template`."""
    if isinstance(template, xp.ndarray):
        return tuple(dtypes.cupy_result(r, template) for r in results)
    wrap = from_dlpack_like(template)
    return tuple(None if r is None else wrap(r) for r in results)


def host_lengths(sequence_lengths):
    """sequence_lengths as a host array (they steer the computation, so they live on the CPU)."""
    if sequence_lengths is None:
        return None
    refuse_masked("sequence_lengths", sequence_lengths)
    if isinstance(sequence_lengths, (list, tuple)):
        for b, value in enumerate(sequence_lengths):  # NumPy would read True as 1
            if isinstance(value, (bool, np.bool_)):
                raise TypeError(f"sequence_lengths: expected integers, got {bool(value)} "
                                f"(a bool) at index {b}")
        if any(isinstance(v, int) and not -2 ** 63 <= v < 2 ** 63 for v in sequence_lengths):
            # NumPy reads [2**63, 1] as float64: keep Python's integers (out of range)
            return np.array(sequence_lengths, dtype=object)
    if isinstance(sequence_lengths, (list, tuple, np.ndarray)):
        return np.asarray(sequence_lengths)
    if hasattr(sequence_lengths, "__dlpack_device__"):
        kind = device_kind("sequence_lengths", sequence_lengths, strict=False)
        if kind == "cuda":
            from .gpu import cupy
            return cupy().asnumpy(cupy().from_dlpack(sequence_lengths))
        if kind == "other":  # e.g. PyTorch's meta device: no data to read
            raise TypeError(f"sequence_lengths: expected integers on the CPU or a CUDA device "
                            f"(a list, a NumPy array or a DLPack array), got "
                            f"{type(sequence_lengths).__module__}."
                            f"{type(sequence_lengths).__qualname__}"
                            f"{_on_device(sequence_lengths)}")
    return np.asarray(sequence_lengths)
