"""What runs inside the PyTorch ops: one backend call on the tensors' device.

The ops in ``pycudnnrnn.torch.ops`` know nothing of backends; they call the three
functions here. ``run_forward`` and ``run_backprop`` take real tensors and return fresh
ones; ``reserve_nbytes`` answers, without running anything, how large the reserve space
of a call will be on a device type (``None`` when only the device can tell).

On CUDA the functional API runs on PyTorch's current stream, with CuPy allocating
through PyTorch's caching allocator, so that outputs, workspace and reserve space are
PyTorch memory (seen by ``torch.cuda.memory`` statistics and by graph pools).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from .. import api, checks, numpy_backend

_NUMPY_DTYPES = {torch.float16: np.dtype(np.float16), torch.float32: np.dtype(np.float32),
                 torch.float64: np.dtype(np.float64)}


def _numpy_dtype(dtype: torch.dtype):
    if dtype == torch.bfloat16:
        try:
            import ml_dtypes
        except ImportError:  # the checks then name the dtype as unsupported
            return dtype
        return np.dtype(ml_dtypes.bfloat16)
    return _NUMPY_DTYPES.get(dtype, dtype)


class _Shape:
    """What the argument checks read of an array (shape, ndim, dtype), for fake tensors.

    The sizes at `static` axes fix the configuration (layers, widths, params length):
    a traced graph specialises on them. Time and batch may stay symbolic.
    """

    def __init__(self, tensor, static=()):
        self.shape = tuple(int(d) if axis in static else d for axis, d in enumerate(tensor.shape))
        self.ndim, self.dtype = tensor.dim(), _numpy_dtype(tensor.dtype)


def problem(input, input_h, input_c, params, attrs, is_training):
    """The validated ``Problem`` of a forward call, from shapes and dtypes alone.

    Works on fake tensors (it reads no data, and no sequence lengths: nothing the sizes
    depend on), and raises the functional API's own errors.
    """
    lstm = attrs["rnn_mode"] == "lstm"
    state_axes = (0 if attrs["time_major"] else 1, 2)
    shapes = [_Shape(input, (2,)), _Shape(input_h, state_axes),
              _Shape(input_c, state_axes) if lstm and input_c is not None else None,
              _Shape(params, (0,))]
    return checks.check_forward(*shapes, None, seed=0, seed2=0, is_training=is_training, **attrs)


def reserve_nbytes(problem, device: torch.device):
    """Bytes of the reserve space forward returns for `problem` on `device`'s type.

    Returns None when the size cannot be known without the device: cuDNN's size comes
    from a descriptor built on the GPU (the caller then declares it data-dependent).
    """
    if not problem.is_training:
        return 0
    if device.type == "cpu":
        return numpy_backend.reserve_nbytes(problem)
    return None


def split_seed(seed: torch.Tensor) -> dict:
    """A 0-d int64 seed tensor as the API's ``seed`` (high 32 bits) and ``seed2`` (low)."""
    value = int(seed) & 0xFFFFFFFFFFFFFFFF
    return dict(seed=value >> 32, seed2=value & 0xFFFFFFFF)


@contextlib.contextmanager
def _on_device(tensor):
    """Run CuPy on PyTorch's current stream and allocator when `tensor` is on CUDA."""
    if tensor.device.type != "cuda":
        yield
        return
    from ..cudnn_backend import _cupy
    cupy = _cupy()
    device = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(device)
    allocator = cupy.cuda.memory.PythonFunctionAllocator(
        lambda size, device_id: torch.cuda.caching_allocator_alloc(size, device_id, stream),
        lambda pointer, device_id: torch.cuda.caching_allocator_delete(pointer))
    with cupy.cuda.Device(device), cupy.cuda.ExternalStream(stream.cuda_stream, device), \
            cupy.cuda.using_allocator(allocator.malloc):
        yield


def run_forward(input, input_h, input_c, params, sequence_lengths, seed, attrs, is_training):
    """``pycudnnrnn.forward`` on tensors; returns (output, output_h, output_c, reserve)."""
    input, input_h, input_c, params = _detached(input, input_h, input_c, params)
    with _on_device(input):
        return api.forward(input, input_h, input_c, params, _lengths(sequence_lengths),
                           **split_seed(seed), **attrs, is_training=is_training)


def run_backprop(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                 output_c, output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                 attrs, gradients):
    """``pycudnnrnn.backprop`` on tensors; skipped gradients come back as None."""
    (input, input_h, input_c, params, output, output_h, output_c, output_backprop,
     output_h_backprop, output_c_backprop) = _detached(
        input, input_h, input_c, params, output, output_h, output_c, output_backprop,
        output_h_backprop, output_c_backprop)
    with _on_device(input):
        return api.backprop(input, input_h, input_c, params, _lengths(sequence_lengths), output,
                            output_h, output_c, output_backprop, output_h_backprop,
                            output_c_backprop, reserve_space, **split_seed(seed), **attrs,
                            gradients=gradients)


def _detached(*tensors):
    # An op's kernel still sees requires_grad on its arguments, and DLPack refuses those.
    return [None if t is None else t.detach() for t in tensors]


def _lengths(sequence_lengths):
    return None if sequence_lengths is None else api.host_lengths(sequence_lengths)
