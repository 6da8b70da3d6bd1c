"""Typed wrappers of cuDNN's RNN calls: Python ints in, Python ints out, no ctypes outside.

Device pointers are ints (0 for none; ctypes passes an int as a ``void *`` argument, so no
wrapper is built per pointer); descriptors and handles are the objects of
``pycudnnrnn.cudnn.descriptors``. Each function is one cuDNN call, looked up through
``capi.api()`` at call time (the one place the CI stand-in GPU replaces).
"""

from __future__ import annotations

import ctypes

from . import capi


def _lengths(ptr: int):
    return ctypes.cast(ctypes.c_void_p(ptr), ctypes.POINTER(ctypes.c_int32))


def dropout_states_size(handle) -> int:
    """Bytes of the RNG states a dropout descriptor needs (``cudnnDropoutGetStatesSize``)."""
    size = ctypes.c_size_t()
    capi.api().cudnnDropoutGetStatesSize(handle, ctypes.byref(size))
    return size.value


def weight_space_size(handle, rnn) -> int:
    """Bytes of the weight space of `rnn` (``cudnnGetRNNWeightSpaceSize``)."""
    size = ctypes.c_size_t()
    capi.api().cudnnGetRNNWeightSpaceSize(handle, rnn, ctypes.byref(size))
    return size.value


def weight_params(handle, rnn, pseudo_layer: int, space_bytes: int, space: int,
                  lin_layer_id: int, m_desc, b_desc) -> tuple[int, int]:
    """Addresses of one matrix and its bias in `space` (0 where cuDNN has none);
    their shapes are written into `m_desc` and `b_desc` (``cudnnGetRNNWeightParams``)."""
    m_addr, b_addr = ctypes.c_void_p(), ctypes.c_void_p()
    capi.api().cudnnGetRNNWeightParams(handle, rnn, pseudo_layer, space_bytes, space,
                                       lin_layer_id, m_desc, ctypes.byref(m_addr), b_desc,
                                       ctypes.byref(b_addr))
    return m_addr.value or 0, b_addr.value or 0


def temp_space_sizes(handle, rnn, training: bool, x_desc) -> tuple[int, int]:
    """(workspace, reserve) bytes of a call (``cudnnGetRNNTempSpaceSizes``)."""
    work, reserve = ctypes.c_size_t(), ctypes.c_size_t()
    mode = capi.CUDNN_FWD_MODE_TRAINING if training else capi.CUDNN_FWD_MODE_INFERENCE
    capi.api().cudnnGetRNNTempSpaceSizes(handle, rnn, mode, x_desc, ctypes.byref(work),
                                         ctypes.byref(reserve))
    return work.value, reserve.value


def forward(handle, rnn, *, training: bool, dev_lengths: int, x_desc, x: int, y_desc, y: int,
            h_desc, hx: int, hy: int, c_desc, cx: int, cy: int, weight_bytes: int,
            weights: int, work_bytes: int, work: int, reserve_bytes: int, reserve: int):
    """``cudnnRNNForward``: y, hy, cy from x, hx, cx (reserve filled in training)."""
    mode = capi.CUDNN_FWD_MODE_TRAINING if training else capi.CUDNN_FWD_MODE_INFERENCE
    capi.api().cudnnRNNForward(handle, rnn, mode, _lengths(dev_lengths), x_desc, x, y_desc,
                               y, h_desc, hx, hy, c_desc, cx, cy,
                               weight_bytes, weights, work_bytes, work, reserve_bytes,
                               reserve)


def backward_data(handle, rnn, *, dev_lengths: int, y_desc, y: int, dy: int, x_desc, dx: int,
                  h_desc, hx: int, dhy: int, dhx: int, c_desc, cx: int, dcy: int, dcx: int,
                  weight_bytes: int, weights: int, work_bytes: int, work: int,
                  reserve_bytes: int, reserve: int):
    """``cudnnRNNBackwardData_v8``: dx, dhx, dcx."""
    capi.api().cudnnRNNBackwardData_v8(handle, rnn, _lengths(dev_lengths), y_desc, y, dy,
                                       x_desc, dx, h_desc, hx, dhy, dhx, c_desc,
                                       cx, dcy, dcx, weight_bytes, weights,
                                       work_bytes, work, reserve_bytes, reserve)


def backward_weights(handle, rnn, *, dev_lengths: int, x_desc, x: int, h_desc, hx: int, y_desc,
                     y: int, weight_bytes: int, dweights: int, work_bytes: int, work: int,
                     reserve_bytes: int, reserve: int):
    """``cudnnRNNBackwardWeights_v8``, adding the weight gradients into `dweights`."""
    capi.api().cudnnRNNBackwardWeights_v8(handle, rnn, capi.CUDNN_WGRAD_MODE_ADD,
                                          _lengths(dev_lengths), x_desc, x, h_desc, hx,
                                          y_desc, y, weight_bytes, dweights, work_bytes,
                                          work, reserve_bytes, reserve)
