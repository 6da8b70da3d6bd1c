"""The GPU backend: TensorFlow's CudnnRNNV3 / CudnnRNNBackpropV3 on CuPy arrays via cuDNN 9.

Receives a validated ``pycudnnrnn.checks.Problem`` and CuPy arrays on one device
(the public API converts DLPack arrays and converts results back). Per call:

* descriptors come from per-device caches (the RNN descriptor by configuration, dtype and
  math mode; data and state descriptors by shape and lengths), and the weight-space
  layout of each RNN descriptor is checked once against ``pycudnnrnn.layout``;
* one cuDNN handle per (thread, device), bound to CuPy's current stream on every call;
* workspace comes from CuPy's memory pool; reserve_space is a CuPy uint8 array that
  starts with a 256-byte header identifying the call (alignment is kept for cuDNN);
* sequences of length zero, which cuDNN rejects, are left out of the cuDNN call: it runs
  on the other rows, and the library fills in zeros and passed-through states;
* batch-major states are made contiguous ``[L·D, B, P]`` for cuDNN and put back;
* padding of x and dy is zeroed when lengths are ragged, so that (as on the CPU) padding
  may hold anything, even NaN.
"""

from __future__ import annotations

import collections
import ctypes
import threading

import numpy as np

from . import layout, reserve_header
from .checks import Problem
from .config import GATES
from .cudnn import capi
from .cudnn.capi import api
from .cudnn.descriptors import (DropoutDescriptor, Handle, RNNDataDescriptor, RNNDescriptor,
                                TensorDescriptor)
from .errors import CudnnUnavailableError

_MAGIC = b"pycudnnrnn-gpu\x00\x01"
_HEADER_BYTES = 256  # keeps cuDNN's part of the reserve space 256-byte aligned

_settings = {"allow_tf32": False}


def set_allow_tf32(enabled: bool) -> None:
    """Let float32 RNNs use TF32 tensor cores (faster, ~1e-3 relative error).

    Off by default: float32 runs strict FP32 (``CUDNN_FMA_MATH``).
    """
    _settings["allow_tf32"] = bool(enabled)


def get_allow_tf32() -> bool:
    """Whether float32 RNNs may use TF32 tensor cores."""
    return _settings["allow_tf32"]


def _cupy():
    try:
        import cupy
    except ImportError as exc:
        raise CudnnUnavailableError(
            "CUDA arrays need CuPy: install `cupy-cuda12x` (CUDA 12) or `cupy-cuda13x` "
            f"(CUDA 13) ({exc})") from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, or no device
        raise CudnnUnavailableError(f"CUDA reports no usable GPU ({exc}); the cuDNN backend "
                                    "needs an NVIDIA GPU and driver (NumPy arrays run on the "
                                    "CPU backend)") from exc
    if count == 0:
        raise CudnnUnavailableError("CUDA reports no GPU; the cuDNN backend needs one (NumPy "
                                    "arrays run on the CPU backend)")
    return cupy


# --------------------------------------------------------------------------- caches

class _LRU:
    """A small thread-safe LRU cache; evicted objects are freed when no call holds them."""

    def __init__(self, maxsize: int):
        self.maxsize, self._items, self._lock = maxsize, collections.OrderedDict(), threading.Lock()

    def get(self, key, factory):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = factory()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)
        return value

    def clear(self):
        with self._lock:
            self._items.clear()

    def __len__(self):
        return len(self._items)


_rnn_descriptors = _LRU(64)     # (device, config, dtype, tf32)
_data_descriptors = _LRU(256)   # (device, dtype, time_major, T, B, width, lengths)
_state_descriptors = _LRU(256)  # (device, dtype, dims)
_dropout = _LRU(64)             # (device, dropout, seed) → DropoutDescriptor
_dropout_states = {}            # (device, seed) → CuPy buffer of RNG states
_dropout_lock = threading.Lock()
_local = threading.local()


def _handle(cupy):
    """This thread's handle for the current device, bound to CuPy's current stream."""
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    device = cupy.cuda.Device().id
    if device not in handles:
        handles[device] = Handle()
    handle = handles[device]
    handle.set_stream(cupy.cuda.get_current_stream().ptr)
    return handle


def _dropout_descriptor(cupy, handle, dropout: float, seed: int):
    """A dropout descriptor; RNG states are initialised once per device and seed."""
    device = cupy.cuda.Device().id

    def build():
        desc = DropoutDescriptor()
        if dropout == 0:
            desc.set(handle, 0.0, 0, 0, seed)  # no states needed, nothing to draw
            return desc
        with _dropout_lock:
            states = _dropout_states.get((device, seed))
            if states is None:
                size = ctypes.c_size_t()
                api().cudnnDropoutGetStatesSize(handle, ctypes.byref(size))
                states = cupy.empty(size.value, dtype=cupy.uint8)
                desc.set(handle, dropout, states.data.ptr, size.value, seed)  # slow, once
                _dropout_states[(device, seed)] = states
            else:
                desc.restore(handle, dropout, states.data.ptr, states.size, seed)
        desc.states = states  # keep the states alive as long as the descriptor
        return desc

    return _dropout.get((device, dropout, seed), build)


def _rnn_descriptor(cupy, handle, problem: Problem):
    c, dtype, tf32 = problem.config, problem.dtype, get_allow_tf32()
    device = cupy.cuda.Device().id

    def build():
        dropout = _dropout_descriptor(cupy, handle, c.dropout, c.seed)
        desc = RNNDescriptor(c, dtype, dropout, tf32)
        check_layout(cupy, handle, desc)
        return desc

    return _rnn_descriptors.get((device, c, dtype, tf32), build)


def _data_descriptor(cupy, dtype, time_major, T, B, width, lengths):
    key = (cupy.cuda.Device().id, dtype, time_major, T, B, width, tuple(lengths))
    return _data_descriptors.get(
        key, lambda: RNNDataDescriptor(dtype, time_major, T, B, width, lengths))


def _state_descriptor(cupy, dtype, dims):
    key = (cupy.cuda.Device().id, dtype, tuple(dims))
    return _state_descriptors.get(key, lambda: TensorDescriptor(dtype, dims))


def clear_caches():
    """Drop every cached descriptor and dropout state (they are freed once unused)."""
    for cache in (_rnn_descriptors, _data_descriptors, _state_descriptors, _dropout):
        cache.clear()
    with _dropout_lock:
        _dropout_states.clear()


# --------------------------------------------------------------------------- layout check

def weight_params(cupy, handle, desc: RNNDescriptor):
    """Offsets (in elements) and shapes of every matrix and bias, from cuDNN.

    Returns the weight-space size in bytes and a list of
    ``(pseudo_layer, lin_layer_id, kind, offset, size)``; pieces cuDNN reports as absent
    (skip input's layer-0 matrices, the projection's bias) are left out. Sizes, not
    shapes, are compared: the dims cuDNN reports are metadata and may carry unit axes.
    """
    c, itemsize = desc.config, desc.dtype.itemsize
    size = ctypes.c_size_t()
    api().cudnnGetRNNWeightSpaceSize(handle, desc, ctypes.byref(size))
    space = cupy.empty(max(size.value, 1), dtype=cupy.uint8)
    base = space.data.ptr
    lin_layers = 2 * c.num_gates + (1 if c.num_proj else 0)
    table = []
    with TensorDescriptor() as m_desc, TensorDescriptor() as b_desc:
        for k in range(c.num_pseudo_layers):
            for lin in range(lin_layers):
                m_addr, b_addr = ctypes.c_void_p(), ctypes.c_void_p()
                api().cudnnGetRNNWeightParams(handle, desc, k, size.value, ctypes.c_void_p(base),
                                              lin, m_desc, ctypes.byref(m_addr), b_desc,
                                              ctypes.byref(b_addr))
                for kind, addr, tensor in (("weight", m_addr, m_desc), ("bias", b_addr, b_desc)):
                    if addr.value:
                        count = int(np.prod(tensor.read()["dims"]))
                        table.append((k, lin, kind, (addr.value - base) // itemsize, count))
    return size.value, table


def cudnn_weight_table(config, dtype=np.float32):
    """cuDNN's weight space for `config` on the current GPU, as ``weight_params`` gives it.

    Builds a throwaway descriptor (no dropout); for the layout tests and diagnosis.
    """
    cupy = _cupy()
    handle = _handle(cupy)
    with DropoutDescriptor() as dropout:
        dropout.set(handle, 0.0, 0, 0, 0)
        with RNNDescriptor(config, np.dtype(dtype), dropout) as desc:
            return weight_params(cupy, handle, desc)


def _expected_table(config):
    """Our layout as (pseudo_layer, lin_layer_id, kind, offset, size), in cuDNN's IDs."""
    G = config.num_gates
    gate_index = {g: i for i, g in enumerate(GATES[config.rnn_mode])}
    rows = []
    for p in layout.pieces(config):
        if p.role == "projection":
            lin = 2 * G
        else:
            lin = gate_index[p.gate] + (G if p.role == "recurrent" else 0)
        rows.append((p.pseudo_layer, lin, p.kind, p.offset, p.size))
    return sorted(rows)


def check_layout(cupy, handle, desc: RNNDescriptor):
    """Raise if cuDNN's weight space disagrees with ``pycudnnrnn.layout`` (a bug there)."""
    nbytes, table = weight_params(cupy, handle, desc)
    expected_nbytes = layout.params_size(desc.config) * desc.dtype.itemsize
    problems = []
    if nbytes != expected_nbytes:
        problems.append(f"weight space is {nbytes} bytes, layout says {expected_nbytes}")
    expected = _expected_table(desc.config)
    if sorted(table) != expected:
        diff = sorted(set(table) ^ set(expected))[:6]
        problems.append(f"pieces differ (pseudo_layer, linLayerID, kind, offset, size): {diff}")
    if problems:
        raise RuntimeError(f"pycudnnrnn's params layout disagrees with cuDNN for {desc.config} "
                           f"({desc.dtype}): " + "; ".join(problems) + ". Please report this.")


# --------------------------------------------------------------------------- reserve space

def _open_reserve(cupy, reserve_space, problem, cudnn_bytes):
    n = reserve_header.HEADER_BYTES
    readable = reserve_space.dtype == cupy.uint8 and reserve_space.size >= n
    head = bytes(cupy.asnumpy(reserve_space[:n])) if readable else None  # 32 bytes to the host
    reserve_header.check(head, reserve_space.dtype, reserve_space.size,
                         _HEADER_BYTES + cudnn_bytes, problem, _MAGIC, "cuDNN", get_allow_tf32())
    return cupy.ascontiguousarray(reserve_space)


# --------------------------------------------------------------------------- the passes

class _Call:
    """What one forward or backprop call needs: rows that run, descriptors, sizes."""

    def __init__(self, cupy, problem: Problem, training: bool):
        c = problem.config
        self.cupy, self.problem, self.config = cupy, problem, c
        lengths = problem.full_lengths
        rows = np.flatnonzero(lengths > 0)  # zero-length rows stay out of cuDNN
        self.all_rows = rows.size == problem.batch_size
        self.rows = cupy.asarray(rows)
        self.lengths = lengths[rows].astype(np.int32)
        self.ragged = bool((self.lengths < problem.max_time).any())
        self.handle = _handle(cupy)
        self.rnn = _rnn_descriptor(cupy, self.handle, problem)
        dtype, T, B = problem.dtype, problem.max_time, int(rows.size)
        self.batch = B
        if B == 0:
            return
        tm = problem.time_major
        self.x_desc = _data_descriptor(cupy, dtype, tm, T, B, c.input_size, self.lengths)
        self.y_desc = _data_descriptor(cupy, dtype, tm, T, B, c.num_dirs * c.state_size, self.lengths)
        LD = c.num_pseudo_layers
        self.h_desc = _state_descriptor(cupy, dtype, (LD, B, c.state_size))
        self.c_desc = _state_descriptor(cupy, dtype, (LD, B, c.num_units))
        self.dev_lengths = cupy.asarray(self.lengths)
        work, reserve = ctypes.c_size_t(), ctypes.c_size_t()
        mode = capi.CUDNN_FWD_MODE_TRAINING if training else capi.CUDNN_FWD_MODE_INFERENCE
        api().cudnnGetRNNTempSpaceSizes(self.handle, self.rnn, mode, self.x_desc,
                                        ctypes.byref(work), ctypes.byref(reserve))
        self.work_bytes, self.reserve_bytes = work.value, reserve.value
        self.weight_bytes = layout.params_size(c) * dtype.itemsize

    def run_shape(self, width):
        """Shape of data of the rows that run."""
        T, B = self.problem.max_time, self.batch
        return (T, B, width) if self.problem.time_major else (B, T, width)

    @property
    def seq_lengths(self):
        return ctypes.cast(ctypes.c_void_p(self.dev_lengths.data.ptr), ctypes.POINTER(ctypes.c_int32))

    def workspace(self):
        return self.cupy.empty(max(self.work_bytes, 1), dtype=self.cupy.uint8)

    # data [T, B, w] or [B, T, w]; states [L·D, B, w] or [B, L·D, w]
    def data_in(self, x, zero_padding=False):
        cp, tm = self.cupy, self.problem.time_major
        if not self.all_rows:
            x = x[:, self.rows] if tm else x[self.rows]
        x = cp.ascontiguousarray(x)
        if zero_padding and self.ragged:
            T = self.problem.max_time
            steps = cp.arange(T, dtype=cp.int32)
            valid = steps[:, None] < self.dev_lengths[None, :] if tm else \
                steps[None, :] < self.dev_lengths[:, None]
            x = cp.where(valid[..., None], x, x.dtype.type(0))
        return x

    def state_in(self, s):
        cp = self.cupy
        s = s if self.problem.time_major else s.swapaxes(0, 1)
        return cp.ascontiguousarray(s if self.all_rows else s[:, self.rows])

    def data_out(self, x_run, width):
        if self.all_rows:
            return x_run
        full = self.cupy.zeros(self.problem.data_shape(width), dtype=x_run.dtype)
        if self.problem.time_major:
            full[:, self.rows] = x_run
        else:
            full[self.rows] = x_run
        return full

    def state_out(self, s_run, passthrough):
        """Rows that ran take cuDNN's result; the others keep `passthrough` (caller's layout)."""
        cp = self.cupy
        if self.all_rows:
            full = s_run
        else:  # an explicit copy: the caller's array must not change
            full = (passthrough if self.problem.time_major else passthrough.swapaxes(0, 1)).copy()
            full[:, self.rows] = s_run
        return full if self.problem.time_major else cp.ascontiguousarray(full.swapaxes(0, 1))


def _ptr(array):
    return ctypes.c_void_p(array.data.ptr) if array is not None else ctypes.c_void_p()


def forward(problem: Problem, input, input_h, input_c, params):
    """Forward on CuPy arrays; see ``pycudnnrnn.forward``."""
    cp = _cupy()
    c, dtype = problem.config, problem.dtype
    call = _Call(cp, problem, problem.is_training)
    lstm = c.is_lstm
    empty_c = cp.zeros((0,), dtype=dtype)
    if call.batch == 0:  # every sequence is empty: nothing for cuDNN to do
        output = cp.zeros(problem.data_shape(c.num_dirs * c.state_size), dtype=dtype)
        reserve = _new_reserve(cp, problem, 0) if problem.is_training else cp.zeros((0,), cp.uint8)
        return output, input_h.copy(), input_c.copy() if lstm else empty_c, reserve

    x = call.data_in(input, zero_padding=True)
    hx = call.state_in(input_h)
    cx = call.state_in(input_c) if lstm else None
    y = cp.empty(call.run_shape(c.num_dirs * c.state_size), dtype=dtype)
    hy = cp.empty_like(hx)
    cy = cp.empty_like(cx) if lstm else None
    weights = cp.ascontiguousarray(params)
    reserve = _new_reserve(cp, problem, call.reserve_bytes) if problem.is_training else None
    work = call.workspace()
    mode = capi.CUDNN_FWD_MODE_TRAINING if problem.is_training else capi.CUDNN_FWD_MODE_INFERENCE
    api().cudnnRNNForward(
        call.handle, call.rnn, mode, call.seq_lengths, call.x_desc, _ptr(x), call.y_desc, _ptr(y),
        call.h_desc, _ptr(hx), _ptr(hy), call.c_desc, _ptr(cx), _ptr(cy),
        call.weight_bytes, _ptr(weights), call.work_bytes, _ptr(work),
        call.reserve_bytes if reserve is not None else 0,
        _ptr(reserve[_HEADER_BYTES:]) if reserve is not None and call.reserve_bytes else ctypes.c_void_p())
    output = call.data_out(y, c.num_dirs * c.state_size)
    output_h = call.state_out(hy, input_h)
    output_c = call.state_out(cy, input_c) if lstm else empty_c
    if reserve is None:
        reserve = cp.zeros((0,), dtype=cp.uint8)
    return output, output_h, output_c, reserve


def _new_reserve(cp, problem, cudnn_bytes):
    buffer = cp.empty(_HEADER_BYTES + cudnn_bytes, dtype=cp.uint8)
    head = reserve_header.header(problem, _MAGIC, get_allow_tf32())
    buffer[:reserve_header.HEADER_BYTES] = cp.asarray(np.frombuffer(head, dtype=np.uint8))
    return buffer


def backprop(problem: Problem, input, input_h, input_c, params, output, output_h, output_c,
             output_backprop, output_h_backprop, output_c_backprop, reserve_space,
             gradients="all"):
    """Backprop of data, then weights, on CuPy arrays; see ``pycudnnrnn.backprop``.

    `gradients="data"` skips cudnnRNNBackwardWeights; "weights" still runs the data pass
    (the weight pass reads what it leaves in the reserve space). Left out: None.
    """
    grads = _backprop(problem, input, input_h, input_c, params, output, output_h, output_c,
                      output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                      want_weights=gradients != "data")
    return grads if gradients != "weights" else (None, None, None, grads[3])


def _backprop(problem: Problem, input, input_h, input_c, params, output, output_h, output_c,
              output_backprop, output_h_backprop, output_c_backprop, reserve_space, want_weights):
    cp = _cupy()
    c, dtype = problem.config, problem.dtype
    lstm = c.is_lstm
    call = _Call(cp, problem, training=True)
    reserve = _open_reserve(cp, reserve_space, problem, call.reserve_bytes if call.batch else 0)
    empty_c = cp.zeros((0,), dtype=dtype)
    dparams = cp.zeros(layout.params_size(c), dtype=dtype) if want_weights else None
    if call.batch == 0:
        return (cp.zeros(input.shape, dtype=dtype), output_h_backprop.copy(),
                output_c_backprop.copy() if lstm else empty_c, dparams)

    x = call.data_in(input, zero_padding=True)
    y = call.data_in(output, zero_padding=True)
    dy = call.data_in(output_backprop, zero_padding=True)
    hx, dhy = call.state_in(input_h), call.state_in(output_h_backprop)
    cx = call.state_in(input_c) if lstm else None
    dcy = call.state_in(output_c_backprop) if lstm else None
    dx = cp.empty_like(x)
    dhx = cp.empty_like(hx)
    dcx = cp.empty_like(cx) if lstm else None
    weights = cp.ascontiguousarray(params)
    work = call.workspace()
    cudnn_reserve = reserve[_HEADER_BYTES:]
    api().cudnnRNNBackwardData_v8(
        call.handle, call.rnn, call.seq_lengths, call.y_desc, _ptr(y), _ptr(dy), call.x_desc,
        _ptr(dx), call.h_desc, _ptr(hx), _ptr(dhy), _ptr(dhx), call.c_desc, _ptr(cx), _ptr(dcy),
        _ptr(dcx), call.weight_bytes, _ptr(weights), call.work_bytes, _ptr(work),
        call.reserve_bytes, _ptr(cudnn_reserve))
    if want_weights:
        api().cudnnRNNBackwardWeights_v8(
            call.handle, call.rnn, capi.CUDNN_WGRAD_MODE_ADD, call.seq_lengths, call.x_desc,
            _ptr(x), call.h_desc, _ptr(hx), call.y_desc, _ptr(y), call.weight_bytes,
            _ptr(dparams), call.work_bytes, _ptr(work), call.reserve_bytes, _ptr(cudnn_reserve))
    return (call.data_out(dx, c.input_size),
            call.state_out(dhx, output_h_backprop),
            call.state_out(dcx, output_c_backprop) if lstm else empty_c,
            dparams)
