"""Python objects that own cuDNN handles and descriptors.

After llvmlite's ``ObjectRef``: each object holds one C handle, passes straight to ctypes
through ``_as_parameter_``, frees it exactly once in ``close()`` (also by ``with`` or
when collected), and counts itself in ``LIVE`` so tests can see nothing leaks.
Builders turn an ``pycudnnrnn.core.config.RNNConfig`` and a dtype into cuDNN's enums in
one place, ``rnn_descriptor_values``.
"""

from __future__ import annotations

import collections
import ctypes
import math
import sys
import threading

import numpy as np

from ..core import dtypes
from ..core.config import RNNConfig
from ..errors import CudnnUnavailableError
from . import capi, loader

#: Live objects per class name (created minus freed).
LIVE: collections.Counter = collections.Counter()
_LIVE_LOCK = threading.Lock()

_CELL_MODES = {"lstm": capi.CUDNN_LSTM, "gru": capi.CUDNN_GRU,
               "rnn_tanh": capi.CUDNN_RNN_TANH, "rnn_relu": capi.CUDNN_RNN_RELU}
_DATA_TYPES = {np.dtype(np.float16): capi.CUDNN_DATA_HALF,
               np.dtype(np.float32): capi.CUDNN_DATA_FLOAT,
               np.dtype(np.float64): capi.CUDNN_DATA_DOUBLE}


#: The first cuDNN whose RNNs take bfloat16 data.
BFLOAT16_SINCE = (9, 13, 0)


def require_bfloat16_rnns():
    """Raise CudnnUnavailableError, naming both versions, if cuDNN predates bfloat16 RNNs."""
    found = loader.version()
    if tuple(found) < BFLOAT16_SINCE:
        need, have = ".".join(map(str, BFLOAT16_SINCE)), ".".join(map(str, found))
        raise CudnnUnavailableError(
            f"bfloat16 RNNs need cuDNN >= {need}, found cuDNN {have}: upgrade it (`pip install "
            f"-U nvidia-cudnn-cu12` or `-cu13`), or use float16 or float32")


def data_type(dtype) -> int:
    """cudnnDataType_t of a NumPy dtype (bfloat16 only where cuDNN's RNNs take it)."""
    if dtypes.is_bfloat16(dtype):
        require_bfloat16_rnns()
        return capi.CUDNN_DATA_BFLOAT16
    return _DATA_TYPES[np.dtype(dtype)]


def math_settings(dtype, allow_tf32: bool = False) -> tuple[int, int]:
    """(mathPrec, mathType) for data of `dtype`.

    float16 and bfloat16 compute in float32 on tensor cores; float32 is strict FMA math
    unless TF32 is allowed; float64 computes in double.
    """
    dtype = np.dtype(dtype)
    if dtype.itemsize == 2:  # float16, bfloat16
        return capi.CUDNN_DATA_FLOAT, capi.CUDNN_TENSOR_OP_MATH
    if dtype == np.float32:
        return capi.CUDNN_DATA_FLOAT, capi.CUDNN_DEFAULT_MATH if allow_tf32 else capi.CUDNN_FMA_MATH
    return capi.CUDNN_DATA_DOUBLE, capi.CUDNN_DEFAULT_MATH


def rnn_descriptor_values(config: RNNConfig, dtype, allow_tf32: bool = False) -> dict:
    """The values ``cudnnSetRNNDescriptor_v8`` takes (less the dropout descriptor)."""
    math_prec, math_type = math_settings(dtype, allow_tf32)
    return dict(
        algo=capi.CUDNN_RNN_ALGO_STANDARD,
        cellMode=_CELL_MODES[config.rnn_mode],
        biasMode=capi.CUDNN_RNN_DOUBLE_BIAS,
        dirMode=capi.CUDNN_BIDIRECTIONAL if config.bidirectional else capi.CUDNN_UNIDIRECTIONAL,
        inputMode=capi.CUDNN_SKIP_INPUT if config.skip_input else capi.CUDNN_LINEAR_INPUT,
        dataType=data_type(dtype),
        mathPrec=math_prec,
        mathType=math_type,
        inputSize=config.input_size,
        hiddenSize=config.num_units,
        projSize=config.state_size,  # cuDNN wants hiddenSize here when there is no projection
        numLayers=config.num_layers,
        auxFlags=capi.CUDNN_RNN_PADDED_IO_ENABLED,
    )


class Owned:
    """A cuDNN handle or descriptor owned by this object.

    ``_handle`` is its ``c_void_p`` (None once closed). ``_as_parameter_`` hands it to
    ctypes, refusing a closed object; the compute calls of ``rnn.Calls``, made at every
    run, pass ``_handle`` itself (ctypes takes a ``c_void_p`` fastest), where a closed
    object's None reaches cuDNN as NULL, which it refuses.
    """

    _create: str
    _destroy: str

    def __init__(self):
        handle = ctypes.c_void_p()
        # Freed by the library that made it (the CI stand-in GPU replaces capi.api() for
        # a while; a handle it made must not reach the real cudnnDestroy later).
        self._api = capi.api()
        getattr(self._api, self._create)(ctypes.byref(handle))
        self._handle = handle
        with _LIVE_LOCK:
            LIVE[type(self).__name__] += 1

    @property
    def _as_parameter_(self):
        if self._handle is None:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self):
        """Free the C object now (idempotent)."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            with _LIVE_LOCK:
                LIVE[type(self).__name__] -= 1
            getattr(self._api, self._destroy)(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self, _is_finalizing=sys.is_finalizing):
        # Bound at definition: at interpreter exit module globals (sys) may be gone.
        if _is_finalizing():
            return  # the library may already be gone
        try:
            self.close()
        except Exception:  # never raise from a finaliser
            pass


class Handle(Owned):
    """A cuDNN library context (``cudnnHandle_t``); needs a GPU."""

    _create, _destroy = "cudnnCreate", "cudnnDestroy"

    _stream = None  # the stream last set: a run on the same one sets nothing

    def set_stream(self, stream_ptr: int):
        """Bind the handle to a CUDA stream (``cudnnSetStream``), unless it is bound to it
        already (cuDNN keeps the value; a handle is one thread's, so nothing else sets it)."""
        if stream_ptr != self._stream:
            capi.api().cudnnSetStream(self, ctypes.c_void_p(stream_ptr))
            self._stream = stream_ptr


#: The most elements, and the largest stride, a cuDNN tensor descriptor takes: 32-bit ints
#: (cuDNN 9 refuses a larger tensor with CUDNN_STATUS_NOT_SUPPORTED).
TENSOR_ELEMENTS_MAX = 2 ** 31 - 1


def _contiguous_strides(dims) -> list:
    """`dims`' row-major strides, refused where cuDNN's 32-bit ints cannot hold them (a
    ctypes c_int array would wrap them silently)."""
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    elements = math.prod(dims)
    if max(elements, *strides) > TENSOR_ELEMENTS_MAX:
        raise ValueError(
            f"a state tensor of shape {list(dims)} has {elements} elements and strides "
            f"{strides}: cuDNN's tensor descriptors take at most {TENSOR_ELEMENTS_MAX} "
            f"(2**31 - 1, 32-bit ints). The states [L·D, B, P] must have "
            f"L·D·B·P <= {TENSOR_ELEMENTS_MAX}: split the batch, or use fewer layers or "
            f"a smaller state size")
    return strides


class TensorDescriptor(Owned):
    """An N-d tensor descriptor (hx/cx states: ``[L·D, B, width]``, contiguous)."""

    _create, _destroy = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"

    def __init__(self, dtype=None, dims=None):
        strides = None if dims is None else _contiguous_strides(dims)  # before any handle
        super().__init__()
        if dims is not None:
            n = len(dims)
            capi.api().cudnnSetTensorNdDescriptor(self, data_type(dtype), n, (ctypes.c_int * n)(*dims),
                                             (ctypes.c_int * n)(*strides))

    def read(self, max_dims: int = 8) -> dict:
        """dataType, dims and strides, from ``cudnnGetTensorNdDescriptor``."""
        dtype, n = ctypes.c_int(), ctypes.c_int()
        dims, strides = (ctypes.c_int * max_dims)(), (ctypes.c_int * max_dims)()
        capi.api().cudnnGetTensorNdDescriptor(self, max_dims, ctypes.byref(dtype), ctypes.byref(n),
                                         dims, strides)
        return dict(dataType=dtype.value, dims=list(dims[:n.value]), strides=list(strides[:n.value]))


class DropoutDescriptor(Owned):
    """A dropout descriptor; set (slow: initialises RNG states) or restored (cheap)."""

    _create, _destroy = "cudnnCreateDropoutDescriptor", "cudnnDestroyDropoutDescriptor"

    def set(self, handle, dropout: float, states_ptr: int, states_size: int, seed: int):
        capi.api().cudnnSetDropoutDescriptor(self, handle, dropout, ctypes.c_void_p(states_ptr or None),
                                        states_size, seed)

    def restore(self, handle, dropout: float, states_ptr: int, states_size: int, seed: int):
        capi.api().cudnnRestoreDropoutDescriptor(self, handle, dropout, ctypes.c_void_p(states_ptr),
                                            states_size, seed)


class RNNDescriptor(Owned):
    """An RNN descriptor for one configuration and dtype.

    It keeps its dropout descriptor alive, since cuDNN only stores the pointer.
    """

    _create, _destroy = "cudnnCreateRNNDescriptor", "cudnnDestroyRNNDescriptor"

    def __init__(self, config: RNNConfig, dtype, dropout: DropoutDescriptor,
                 allow_tf32: bool = False):
        super().__init__()
        self.config, self.dtype, self.dropout = config, np.dtype(dtype), dropout
        v = rnn_descriptor_values(config, dtype, allow_tf32)
        capi.api().cudnnSetRNNDescriptor_v8(
            self, v["algo"], v["cellMode"], v["biasMode"], v["dirMode"], v["inputMode"],
            v["dataType"], v["mathPrec"], v["mathType"], v["inputSize"], v["hiddenSize"],
            v["projSize"], v["numLayers"], dropout, v["auxFlags"])

    def read(self) -> dict:
        """Every value, from ``cudnnGetRNNDescriptor_v8``, keyed as in rnn_descriptor_values."""
        names = ["algo", "cellMode", "biasMode", "dirMode", "inputMode", "dataType", "mathPrec",
                 "mathType", "inputSize", "hiddenSize", "projSize", "numLayers"]
        values = [ctypes.c_int() for _ in names]
        dropout, aux = ctypes.c_void_p(), ctypes.c_uint32()
        capi.api().cudnnGetRNNDescriptor_v8(self, *map(ctypes.byref, values), ctypes.byref(dropout),
                                       ctypes.byref(aux))
        result = {n: v.value for n, v in zip(names, values)}
        result["auxFlags"] = aux.value
        result["dropoutDesc"] = dropout.value
        return result


class RNNDataDescriptor(Owned):
    """Padded (unpacked) sequence data: ``[T, B, width]`` or ``[B, T, width]``.

    The padding fill is a zero of the data's own width, so a float64 model reads eight
    zero bytes, not four.
    """

    _create, _destroy = "cudnnCreateRNNDataDescriptor", "cudnnDestroyRNNDataDescriptor"

    def __init__(self, dtype, time_major: bool, max_time: int, batch: int, width: int, lengths):
        super().__init__()
        self.lengths = (ctypes.c_int * batch)(*[int(n) for n in lengths])
        self._fill = ctypes.create_string_buffer(np.dtype(dtype).itemsize)  # zeroed
        layout = (capi.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED if time_major
                  else capi.CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED)
        capi.api().cudnnSetRNNDataDescriptor(self, data_type(dtype), layout, max_time, batch, width,
                                        self.lengths, ctypes.cast(self._fill, ctypes.c_void_p))

    def read(self, batch: int) -> dict:
        """Everything back from ``cudnnGetRNNDataDescriptor``.

        ``paddingFill`` is the raw 8 bytes of a 0xff-filled buffer cuDNN wrote the fill
        into, so the number of bytes it wrote shows.
        """
        dtype, layout, T, B, W = (ctypes.c_int() for _ in range(5))
        lengths = (ctypes.c_int * batch)()
        fill = ctypes.create_string_buffer(b"\xff" * 8, 8)
        capi.api().cudnnGetRNNDataDescriptor(self, *map(ctypes.byref, (dtype, layout, T, B, W)), batch,
                                        lengths, ctypes.cast(fill, ctypes.c_void_p))
        return dict(dataType=dtype.value, layout=layout.value, maxSeqLength=T.value,
                    batchSize=B.value, vectorSize=W.value, seqLengthArray=list(lengths),
                    paddingFill=fill.raw)
