"""Typed wrappers of cuDNN's RNN calls: Python ints in, Python ints out, no ctypes outside.

Device pointers are ints (0 for none; ctypes passes an int as a ``void *`` argument, so no
wrapper is built per pointer); descriptors and handles are the objects of
``pycudnnrnn.cudnn.descriptors``. Each function (and each method of
``Calls``, the compute calls a plan makes) is one cuDNN call, looked up through
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


class Calls:
    """cuDNN's three compute calls for one plan (``cudnnRNNForward``,
    ``cudnnRNNBackwardData_v8``, ``cudnnRNNBackwardWeights_v8``), with what the plan fixes
    bound once: the RNN, data and state descriptors, the device lengths (as the ctypes
    pointer cuDNN takes), the forward mode and the byte sizes. A call then takes the handle
    and the data pointers (ints, 0 for none), positionally: a plan's run pays for no
    keyword parsing, no pointer cast and no property per descriptor.

    Descriptors reach ctypes as their ``c_void_p`` handle, read at each call: a closed
    one's is None, so cuDNN gets NULL (an error status, raised as ``CudnnError``), never
    a freed handle.
    """

    def __init__(self, rnn, *, training: bool, dev_lengths: int, x_desc, y_desc, h_desc,
                 c_desc, weight_bytes: int, work_bytes: int, reserve_bytes: int):
        self.rnn, self.x_desc, self.y_desc = rnn, x_desc, y_desc
        self.h_desc, self.c_desc = h_desc, c_desc
        self.mode = capi.CUDNN_FWD_MODE_TRAINING if training else capi.CUDNN_FWD_MODE_INFERENCE
        self.lengths = _lengths(dev_lengths)
        self.weight_bytes, self.work_bytes, self.reserve_bytes = (weight_bytes, work_bytes,
                                                                  reserve_bytes)
        self.forward_reserve_bytes = reserve_bytes if training else 0

    def forward(self, handle, x: int, y: int, hx: int, hy: int, cx: int, cy: int,
                weights: int, work: int, reserve: int):
        """``cudnnRNNForward``: y, hy, cy from x, hx, cx (reserve filled in training)."""
        capi.api().cudnnRNNForward(
            handle._handle, self.rnn._handle, self.mode, self.lengths, self.x_desc._handle, x,
            self.y_desc._handle, y, self.h_desc._handle, hx, hy, self.c_desc._handle, cx, cy,
            self.weight_bytes, weights, self.work_bytes, work, self.forward_reserve_bytes,
            reserve)

    def backward_data(self, handle, y: int, dy: int, dx: int, hx: int, dhy: int, dhx: int,
                      cx: int, dcy: int, dcx: int, weights: int, work: int, reserve: int):
        """``cudnnRNNBackwardData_v8``: dx, dhx, dcx."""
        capi.api().cudnnRNNBackwardData_v8(
            handle._handle, self.rnn._handle, self.lengths, self.y_desc._handle, y, dy,
            self.x_desc._handle, dx, self.h_desc._handle, hx, dhy, dhx, self.c_desc._handle,
            cx, dcy, dcx, self.weight_bytes, weights, self.work_bytes, work,
            self.reserve_bytes, reserve)

    def backward_weights(self, handle, x: int, hx: int, y: int, dweights: int, work: int,
                         reserve: int):
        """``cudnnRNNBackwardWeights_v8``, adding the weight gradients into `dweights`."""
        capi.api().cudnnRNNBackwardWeights_v8(
            handle._handle, self.rnn._handle, capi.CUDNN_WGRAD_MODE_ADD, self.lengths,
            self.x_desc._handle, x, self.h_desc._handle, hx, self.y_desc._handle, y,
            self.weight_bytes, dweights, self.work_bytes, work, self.reserve_bytes, reserve)
