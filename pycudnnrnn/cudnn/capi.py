"""The C-mirror layer: one prototype table for every cuDNN function the project calls.

Each entry sits under the C declaration it mirrors (from cuDNN 9's headers); the table
is the documentation of the ABI, and ``tests/test_cudnn_capi.py`` holds it against the
installed wheel's ``cudnn*.h``. Functions are bound on first use. Every one that returns
``cudnnStatus_t`` is checked: a failure raises the ``pycudnnrnn.CudnnError``
subclass of its status family, carrying the status name, the function and cuDNN's
``cudnnGetLastErrorString`` text.
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import POINTER, c_char_p, c_float, c_int, c_int32, c_size_t, c_uint32, c_ulonglong, c_void_p

from ..errors import error_class
from . import loader

# C types by the names the headers use. Opaque handles and device pointers are void*;
# enums are int.
cudnnStatus_t = c_int
cudnnHandle_t = c_void_p
cudnnRNNDescriptor_t = c_void_p
cudnnRNNDataDescriptor_t = c_void_p
cudnnTensorDescriptor_t = c_void_p
cudnnDropoutDescriptor_t = c_void_p
cudaStream_t = c_void_p
enum = c_int

PROTOTYPES: dict[str, tuple] = {
    # size_t cudnnGetVersion(void);
    "cudnnGetVersion": (c_size_t, ()),
    # const char *cudnnGetErrorString(cudnnStatus_t status);
    "cudnnGetErrorString": (c_char_p, (cudnnStatus_t,)),
    # void cudnnGetLastErrorString(char *message, size_t max_size);
    "cudnnGetLastErrorString": (None, (c_char_p, c_size_t)),
    # cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
    "cudnnCreate": (cudnnStatus_t, (POINTER(cudnnHandle_t),)),
    # cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
    "cudnnDestroy": (cudnnStatus_t, (cudnnHandle_t,)),
    # cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId);
    "cudnnSetStream": (cudnnStatus_t, (cudnnHandle_t, cudaStream_t)),

    # cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc);
    "cudnnCreateTensorDescriptor": (cudnnStatus_t, (POINTER(cudnnTensorDescriptor_t),)),
    # cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc);
    "cudnnDestroyTensorDescriptor": (cudnnStatus_t, (cudnnTensorDescriptor_t,)),
    # cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc,
    #     cudnnDataType_t dataType, int nbDims, const int dimA[], const int strideA[]);
    "cudnnSetTensorNdDescriptor": (cudnnStatus_t, (cudnnTensorDescriptor_t, enum, c_int,
                                                   POINTER(c_int), POINTER(c_int))),
    # cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc,
    #     int nbDimsRequested, cudnnDataType_t *dataType, int *nbDims, int dimA[], int strideA[]);
    "cudnnGetTensorNdDescriptor": (cudnnStatus_t, (cudnnTensorDescriptor_t, c_int, POINTER(enum),
                                                   POINTER(c_int), POINTER(c_int), POINTER(c_int))),

    # cudnnStatus_t cudnnCreateDropoutDescriptor(cudnnDropoutDescriptor_t *dropoutDesc);
    "cudnnCreateDropoutDescriptor": (cudnnStatus_t, (POINTER(cudnnDropoutDescriptor_t),)),
    # cudnnStatus_t cudnnDestroyDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc);
    "cudnnDestroyDropoutDescriptor": (cudnnStatus_t, (cudnnDropoutDescriptor_t,)),
    # cudnnStatus_t cudnnDropoutGetStatesSize(cudnnHandle_t handle, size_t *sizeInBytes);
    "cudnnDropoutGetStatesSize": (cudnnStatus_t, (cudnnHandle_t, POINTER(c_size_t))),
    # cudnnStatus_t cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc,
    #     cudnnHandle_t handle, float dropout, void *states, size_t stateSizeInBytes,
    #     unsigned long long seed);
    "cudnnSetDropoutDescriptor": (cudnnStatus_t, (cudnnDropoutDescriptor_t, cudnnHandle_t, c_float,
                                                  c_void_p, c_size_t, c_ulonglong)),
    # cudnnStatus_t cudnnRestoreDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc,
    #     cudnnHandle_t handle, float dropout, void *states, size_t stateSizeInBytes,
    #     unsigned long long seed);
    "cudnnRestoreDropoutDescriptor": (cudnnStatus_t, (cudnnDropoutDescriptor_t, cudnnHandle_t,
                                                      c_float, c_void_p, c_size_t, c_ulonglong)),

    # cudnnStatus_t cudnnCreateRNNDescriptor(cudnnRNNDescriptor_t *rnnDesc);
    "cudnnCreateRNNDescriptor": (cudnnStatus_t, (POINTER(cudnnRNNDescriptor_t),)),
    # cudnnStatus_t cudnnDestroyRNNDescriptor(cudnnRNNDescriptor_t rnnDesc);
    "cudnnDestroyRNNDescriptor": (cudnnStatus_t, (cudnnRNNDescriptor_t,)),
    # cudnnStatus_t cudnnSetRNNDescriptor_v8(cudnnRNNDescriptor_t rnnDesc, cudnnRNNAlgo_t algo,
    #     cudnnRNNMode_t cellMode, cudnnRNNBiasMode_t biasMode, cudnnDirectionMode_t dirMode,
    #     cudnnRNNInputMode_t inputMode, cudnnDataType_t dataType, cudnnDataType_t mathPrec,
    #     cudnnMathType_t mathType, int32_t inputSize, int32_t hiddenSize, int32_t projSize,
    #     int32_t numLayers, cudnnDropoutDescriptor_t dropoutDesc, uint32_t auxFlags);
    "cudnnSetRNNDescriptor_v8": (cudnnStatus_t, (cudnnRNNDescriptor_t, enum, enum, enum, enum,
                                                 enum, enum, enum, enum, c_int32, c_int32, c_int32,
                                                 c_int32, cudnnDropoutDescriptor_t, c_uint32)),
    # cudnnStatus_t cudnnGetRNNDescriptor_v8(cudnnRNNDescriptor_t rnnDesc, cudnnRNNAlgo_t *algo,
    #     cudnnRNNMode_t *cellMode, cudnnRNNBiasMode_t *biasMode, cudnnDirectionMode_t *dirMode,
    #     cudnnRNNInputMode_t *inputMode, cudnnDataType_t *dataType, cudnnDataType_t *mathPrec,
    #     cudnnMathType_t *mathType, int32_t *inputSize, int32_t *hiddenSize, int32_t *projSize,
    #     int32_t *numLayers, cudnnDropoutDescriptor_t *dropoutDesc, uint32_t *auxFlags);
    "cudnnGetRNNDescriptor_v8": (cudnnStatus_t, (cudnnRNNDescriptor_t,) + (POINTER(enum),) * 8
                                 + (POINTER(c_int32),) * 4
                                 + (POINTER(cudnnDropoutDescriptor_t), POINTER(c_uint32))),

    # cudnnStatus_t cudnnCreateRNNDataDescriptor(cudnnRNNDataDescriptor_t *rnnDataDesc);
    "cudnnCreateRNNDataDescriptor": (cudnnStatus_t, (POINTER(cudnnRNNDataDescriptor_t),)),
    # cudnnStatus_t cudnnDestroyRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc);
    "cudnnDestroyRNNDataDescriptor": (cudnnStatus_t, (cudnnRNNDataDescriptor_t,)),
    # cudnnStatus_t cudnnSetRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc,
    #     cudnnDataType_t dataType, cudnnRNNDataLayout_t layout, int maxSeqLength, int batchSize,
    #     int vectorSize, const int seqLengthArray[], void *paddingFill);
    "cudnnSetRNNDataDescriptor": (cudnnStatus_t, (cudnnRNNDataDescriptor_t, enum, enum, c_int,
                                                  c_int, c_int, POINTER(c_int), c_void_p)),
    # cudnnStatus_t cudnnGetRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc,
    #     cudnnDataType_t *dataType, cudnnRNNDataLayout_t *layout, int *maxSeqLength,
    #     int *batchSize, int *vectorSize, int arrayLengthRequested, int seqLengthArray[],
    #     void *paddingFill);
    "cudnnGetRNNDataDescriptor": (cudnnStatus_t, (cudnnRNNDataDescriptor_t, POINTER(enum),
                                                  POINTER(enum), POINTER(c_int), POINTER(c_int),
                                                  POINTER(c_int), c_int, POINTER(c_int), c_void_p)),

    # cudnnStatus_t cudnnGetRNNWeightSpaceSize(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     size_t *weightSpaceSize);
    "cudnnGetRNNWeightSpaceSize": (cudnnStatus_t, (cudnnHandle_t, cudnnRNNDescriptor_t,
                                                   POINTER(c_size_t))),
    # cudnnStatus_t cudnnGetRNNWeightParams(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     int32_t pseudoLayer, size_t weightSpaceSize, const void *weightSpace, int32_t linLayerID,
    #     cudnnTensorDescriptor_t mDesc, void **mAddr, cudnnTensorDescriptor_t bDesc, void **bAddr);
    "cudnnGetRNNWeightParams": (cudnnStatus_t, (cudnnHandle_t, cudnnRNNDescriptor_t, c_int32,
                                                c_size_t, c_void_p, c_int32, cudnnTensorDescriptor_t,
                                                POINTER(c_void_p), cudnnTensorDescriptor_t,
                                                POINTER(c_void_p))),
    # cudnnStatus_t cudnnGetRNNTempSpaceSizes(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     cudnnForwardMode_t fwdMode, cudnnRNNDataDescriptor_t xDesc, size_t *workSpaceSize,
    #     size_t *reserveSpaceSize);
    "cudnnGetRNNTempSpaceSizes": (cudnnStatus_t, (cudnnHandle_t, cudnnRNNDescriptor_t, enum,
                                                  cudnnRNNDataDescriptor_t, POINTER(c_size_t),
                                                  POINTER(c_size_t))),
    # cudnnStatus_t cudnnRNNForward(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     cudnnForwardMode_t fwdMode, const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t xDesc,
    #     const void *x, cudnnRNNDataDescriptor_t yDesc, void *y, cudnnTensorDescriptor_t hDesc,
    #     const void *hx, void *hy, cudnnTensorDescriptor_t cDesc, const void *cx, void *cy,
    #     size_t weightSpaceSize, const void *weightSpace, size_t workSpaceSize, void *workSpace,
    #     size_t reserveSpaceSize, void *reserveSpace);
    "cudnnRNNForward": (cudnnStatus_t, (cudnnHandle_t, cudnnRNNDescriptor_t, enum, POINTER(c_int32),
                                        cudnnRNNDataDescriptor_t, c_void_p, cudnnRNNDataDescriptor_t,
                                        c_void_p, cudnnTensorDescriptor_t, c_void_p, c_void_p,
                                        cudnnTensorDescriptor_t, c_void_p, c_void_p, c_size_t,
                                        c_void_p, c_size_t, c_void_p, c_size_t, c_void_p)),
    # cudnnStatus_t cudnnRNNBackwardData_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t yDesc, const void *y,
    #     const void *dy, cudnnRNNDataDescriptor_t xDesc, void *dx, cudnnTensorDescriptor_t hDesc,
    #     const void *hx, const void *dhy, void *dhx, cudnnTensorDescriptor_t cDesc,
    #     const void *cx, const void *dcy, void *dcx, size_t weightSpaceSize,
    #     const void *weightSpace, size_t workSpaceSize, void *workSpace, size_t reserveSpaceSize,
    #     void *reserveSpace);
    "cudnnRNNBackwardData_v8": (cudnnStatus_t, (cudnnHandle_t, cudnnRNNDescriptor_t,
                                                POINTER(c_int32), cudnnRNNDataDescriptor_t, c_void_p,
                                                c_void_p, cudnnRNNDataDescriptor_t, c_void_p,
                                                cudnnTensorDescriptor_t, c_void_p, c_void_p, c_void_p,
                                                cudnnTensorDescriptor_t, c_void_p, c_void_p, c_void_p,
                                                c_size_t, c_void_p, c_size_t, c_void_p, c_size_t,
                                                c_void_p)),
    # cudnnStatus_t cudnnRNNBackwardWeights_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     cudnnWgradMode_t addGrad, const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t xDesc,
    #     const void *x, cudnnTensorDescriptor_t hDesc, const void *hx,
    #     cudnnRNNDataDescriptor_t yDesc, const void *y, size_t weightSpaceSize,
    #     void *dweightSpace, size_t workSpaceSize, void *workSpace, size_t reserveSpaceSize,
    #     void *reserveSpace);
    "cudnnRNNBackwardWeights_v8": (cudnnStatus_t, (cudnnHandle_t, cudnnRNNDescriptor_t, enum,
                                                   POINTER(c_int32), cudnnRNNDataDescriptor_t,
                                                   c_void_p, cudnnTensorDescriptor_t, c_void_p,
                                                   cudnnRNNDataDescriptor_t, c_void_p, c_size_t,
                                                   c_void_p, c_size_t, c_void_p, c_size_t, c_void_p)),
}

# Enum values used by the project (cudnn_graph.h, cudnn_adv.h).
CUDNN_DATA_FLOAT, CUDNN_DATA_DOUBLE, CUDNN_DATA_HALF = 0, 1, 2
CUDNN_DATA_BFLOAT16 = 9  # in the enum since 9.0; RNNs take it since 9.13
CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, CUDNN_FMA_MATH = 0, 1, 2, 3
CUDNN_RNN_ALGO_STANDARD = 0
CUDNN_RNN_RELU, CUDNN_RNN_TANH, CUDNN_LSTM, CUDNN_GRU = 0, 1, 2, 3
CUDNN_RNN_DOUBLE_BIAS = 2
CUDNN_UNIDIRECTIONAL, CUDNN_BIDIRECTIONAL = 0, 1
CUDNN_LINEAR_INPUT, CUDNN_SKIP_INPUT = 0, 1
CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED = 0, 2
CUDNN_RNN_PADDED_IO_ENABLED = 1
CUDNN_FWD_MODE_INFERENCE, CUDNN_FWD_MODE_TRAINING = 0, 1
CUDNN_WGRAD_MODE_ADD = 0


class CudnnAPI:
    """The bound functions of one loaded library, as attributes (bound on first use)."""

    def __init__(self, cdll: ctypes.CDLL):
        self._cdll = cdll

    def __getattr__(self, name):
        try:
            restype, argtypes = PROTOTYPES[name]
        except KeyError:
            raise AttributeError(f"{name} is not in pycudnnrnn's prototype table") from None
        function = getattr(self._cdll, name)
        function.restype, function.argtypes = restype, list(argtypes)
        bound = _checked(self, name, function) if restype is cudnnStatus_t else function
        setattr(self, name, bound)
        return bound

    def last_error(self) -> str:
        """cuDNN's text for the last error on this thread."""
        buffer = ctypes.create_string_buffer(2048)
        self.cudnnGetLastErrorString(buffer, len(buffer))
        return buffer.value.decode(errors="replace").strip()

    def status_name(self, status: int) -> str:
        name = self.cudnnGetErrorString(status)
        return name.decode() if name else f"cudnnStatus_t {status}"


def _checked(api: CudnnAPI, name: str, function):
    def call(*args):
        status = function(*args)
        if status != 0:
            raise error_class(status)(status, api.status_name(status), name, api.last_error())
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{name}, raising CudnnError on failure."
    return call


@functools.lru_cache(maxsize=None)
def api() -> CudnnAPI:
    """The process-wide binding of the loaded cuDNN 9 library."""
    return CudnnAPI(loader.load())
