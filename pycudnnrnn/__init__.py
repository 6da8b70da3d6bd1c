"""pycudnnrnn: cuDNN's recurrent networks for any array library, with a NumPy twin.

The functional API mirrors TensorFlow's ``CudnnRNNV3`` / ``CudnnRNNBackpropV3`` op pair:
``forward`` and ``backprop`` over an opaque ``params_size``-long buffer,
which ``canonical_to_params`` and ``params_to_canonical`` convert. NumPy arrays
run on the CPU backend; CuPy arrays, and any DLPack array on a CUDA device, on cuDNN.
``RNNPlan`` builds once what calls share, so that each call only checks its arrays and runs.
``pycudnnrnn.convert`` (weights across frameworks) and ``pycudnnrnn.graphs`` (CUDA graphs)
are imported on first use, so ``import pycudnnrnn`` stays as light as the functional API.
"""

import importlib

from .api import backprop, canonical_to_params, forward, params_size, params_to_canonical
from .plan import RNNPlan
from .errors import (CudnnAllocationError, CudnnBadParamError, CudnnError,
                     CudnnExecutionFailedError, CudnnInternalError, CudnnNotInitializedError,
                     CudnnNotSupportedError, CudnnUnavailableError, InsufficientMemoryError)
from .results import BackpropResult, ForwardResult


def set_allow_tf32(enabled: bool) -> None:
    """Let float32 RNNs on the GPU use TF32 tensor cores (off by default: strict FP32)."""
    from .core import gpu
    gpu.set_allow_tf32(enabled)


#: Submodules read as attributes (``pycudnnrnn.convert.from_torch``) without importing
#: them first; loaded on first access, so ``import pycudnnrnn`` does not pay for them.
_LAZY_SUBMODULES = ("convert", "graphs")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))


__version__ = "0.1.0"

__all__ = ["params_size", "canonical_to_params", "params_to_canonical", "forward", "backprop",
           "ForwardResult", "BackpropResult", "RNNPlan",
           "set_allow_tf32", "CudnnError", "CudnnBadParamError", "CudnnNotSupportedError",
           "CudnnNotInitializedError", "CudnnInternalError", "CudnnAllocationError",
           "CudnnExecutionFailedError",
           "CudnnUnavailableError", "InsufficientMemoryError", "__version__"]
