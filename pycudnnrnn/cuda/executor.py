"""The GPU backend: TensorFlow's CudnnRNNV3 / CudnnRNNBackpropV3 on CuPy arrays via cuDNN 9.

``Executor`` is the GPU half of a ``pycudnnrnn.RNNPlan``: built once for a validated
``pycudnnrnn.core.config.Problem`` on one device, it holds the descriptors (from
``pycudnnrnn.cuda.resources``; a new RNN descriptor's weight layout is checked against
ours by ``pycudnnrnn.cuda.weight_space``), the workspace and reserve sizes, the device copies of
the lengths, of the running rows' index and of the padding mask, and the reserve
header. Building one makes no host sync either: its uploads are queued, and an event
orders them before runs on other streams. A run is then pointers and cuDNN calls on
CuPy's current stream: no host↔device copy, no sync, no size query. Per run:

* sequences of length zero, which cuDNN rejects, are left out of the cuDNN call: it runs
  on the other rows, and the run fills in zeros and passed-through states;
* batch-major states are made contiguous ``[L·D, B, P]`` for cuDNN and put back;
* padding of x, y and dy is zeroed when lengths are ragged, so that (as on the CPU)
  padding may hold anything, even NaN (cuDNN need not ignore it), and so is dx's
  (cuDNN need not write it);
* arrays already contiguous are used in place; results go into caller buffers (``out``)
  when given; reserve_space starts with the 256-byte header of
  ``pycudnnrnn.core.reserve_header`` (remembered on the host, so backprop reads it back only
  for a buffer this process did not make).
"""

from __future__ import annotations

import contextlib

import numpy as np

from ..core import dtypes, gpu, layout, reserve_header
from ..core.config import Problem
from ..cudnn import rnn
from . import lifetime, resources, weight_space

MAGIC = b"pycudnnrnn-gpu\x00\x01"
_HEADER = reserve_header.HEADER_BYTES


class Executor:
    """One problem on one device, with everything a run needs that the data does not."""

    def __init__(self, problem: Problem, device: int):
        self.cupy = cp = gpu.cupy()
        self.problem, self.device = problem, device
        c, dtype, T = problem.config, problem.dtype, problem.max_time
        self.tf32 = gpu.get_allow_tf32()
        # What buffers are made of: the dtype, or bfloat16's bits with a CuPy older than
        # 14 (cuDNN sees pointers; the descriptors say bfloat16).
        self.storage = dtypes.storage_dtype(dtype, cp)
        lengths = problem.full_lengths
        rows = np.flatnonzero(lengths > 0)  # zero-length rows stay out of cuDNN
        self.batch = B = int(rows.size)
        self.all_rows = B == problem.batch_size
        run_lengths = lengths[rows].astype(np.int32)
        self.ragged = bool((run_lengths < T).any())
        self.params_size = layout.params_size(c)
        self.weight_bytes = self.params_size * dtype.itemsize
        self.head = reserve_header.header(problem, MAGIC, self.tf32)
        self.work_bytes = self.reserve_bytes = 0
        self.reserve_offset = None  # of cuDNN's part in reserve_space, when it has one
        # Fixed for every run, read there as plain attributes.
        self.lstm, self.training, self.time_major = c.is_lstm, problem.is_training, \
            problem.time_major
        self.width = c.num_dirs * c.state_size  # of y
        # States go to cuDNN as the caller gave them, and come back as cuDNN made them
        # (contiguous, [L·D, B, ·]), when every row runs and they are time-major.
        self.direct_states = self.all_rows and self.time_major
        # The caller's buffers are cuDNN's, as they are: time-major, every row running
        # its full length (nothing to pad, gather or transpose). See ``forward_at``.
        self.in_place = self.direct_states and not self.ragged and B > 0
        self.y_shape = self._run_shape(self.width)
        # The plan's buffers outlive the call that builds it: CuPy's own pool, never the
        # caller's allocator (a framework's, or a CUDA graph's private pool).
        with cp.cuda.Device(device), cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
            handle = resources.handle(cp)
            self.rnn = resources.rnn_descriptor(cp, handle, device, c, dtype, self.tf32)
            if not self.rnn.layout_checked:  # once per descriptor: a bug in layout.py if not
                weight_space.check_layout(cp, handle, self.rnn)
                self.rnn.layout_checked = True
            self.rows = None if self.all_rows else cp.asarray(rows)
            self.head_device = cp.asarray(np.frombuffer(self.head, dtype=np.uint8))
            self._head_ptr = self.head_device.data.ptr
            self.empty = cp.zeros((0,), self.storage)  # output_c of other cells: never written
            # Padding's zero: a device array of the data's dtype, not a host scalar (CuPy's
            # bfloat16 support is minimal: its kernels need not take an ml_dtypes scalar).
            self.zero = cp.zeros((), self.storage)
            self.no_reserve = cp.zeros((0,), dtype=cp.uint8)  # inference's reserve_space
            if B:
                self._describe(handle, run_lengths)
            # The uploads above are queued on this stream: no host sync here. Who uses
            # the plan's memory after (streams, graphs) is the lifetime's to know.
            self.lifetime = lifetime.Lifetime(cp, self, cp.cuda.get_current_stream())

    def _describe(self, handle, run_lengths):
        """Descriptors, temp-space sizes and device lengths and mask of the running rows."""
        cp, problem, device = self.cupy, self.problem, self.device
        c, dtype, T, B = problem.config, problem.dtype, problem.max_time, self.batch
        tm = problem.time_major
        self.x_desc = resources.data_descriptor(device, dtype, tm, T, B, c.input_size,
                                                      run_lengths)
        self.y_desc = resources.data_descriptor(device, dtype, tm, T, B,
                                                      c.num_dirs * c.state_size, run_lengths)
        LD = c.num_pseudo_layers
        self.h_desc = resources.state_descriptor(device, dtype, (LD, B, c.state_size))
        self.c_desc = resources.state_descriptor(device, dtype, (LD, B, c.num_units))
        self.dev_lengths = cp.asarray(run_lengths)
        if self.ragged:
            steps = np.arange(T)[:, None] < run_lengths[None, :]
            steps = (steps if tm else steps.T)[..., None]
            self.valid, self.padding = cp.asarray(steps), cp.asarray(~steps)
        self.work_bytes, self.reserve_bytes = rnn.temp_space_sizes(
            handle, self.rnn, problem.is_training, self.x_desc)
        self.reserve_offset = _HEADER if problem.is_training and self.reserve_bytes else None
        self.calls = rnn.Calls(self.rnn, training=problem.is_training,
                               dev_lengths=self.dev_lengths.data.ptr, x_desc=self.x_desc,
                               y_desc=self.y_desc, h_desc=self.h_desc, c_desc=self.c_desc,
                               weight_bytes=self.weight_bytes, work_bytes=self.work_bytes,
                               reserve_bytes=self.reserve_bytes)

    # ------------------------------------------------------------------ streams
    def _enter(self):
        """The current stream, ordered after the plan's uploads."""
        stream = self.cupy.cuda.get_current_stream()
        self.lifetime.enter(stream)
        return stream

    def _leave(self, stream):
        """After a run's work is queued on `stream` (see ``lifetime.Lifetime.leave``)."""
        self.lifetime.leave(stream, self)

    def settle(self):
        """Note that the plan's uploads are done (the caller synchronized): runs on
        other streams need not wait for them."""
        self.lifetime.settle()

    # ------------------------------------------------------------------ sizes
    @property
    def reserve_nbytes(self) -> int:
        """Bytes of the reserve_space forward makes (0 in inference)."""
        return _HEADER + self.reserve_bytes if self.problem.is_training else 0

    @property
    def workspace_nbytes(self) -> int:
        """Bytes of the workspace a run may take: cuDNN's, then (training) room for the
        copy of the reserve space backprop hands cuDNN."""
        return self._copy_offset + self.reserve_bytes if self.problem.is_training \
            else self.work_bytes

    @property
    def forward_workspace_nbytes(self) -> int:
        """Bytes of the workspace forward takes: cuDNN's alone (the copy is backprop's)."""
        return self.work_bytes

    @property
    def _copy_offset(self) -> int:
        return -(-self.work_bytes // _HEADER) * _HEADER  # 256-byte aligned, as cuDNN wants

    # ------------------------------------------------------------------ data movement
    def _run_shape(self, width):
        T, B = self.problem.max_time, self.batch
        return (T, B, width) if self.problem.time_major else (B, T, width)

    def _data_in(self, x, zero_padding):
        """Caller's data → the running rows, contiguous, padding zeroed when ragged."""
        if not self.all_rows:
            x = x[:, self.rows] if self.time_major else x[self.rows]
        if zero_padding and self.ragged:
            return self.cupy.where(self.valid, x, self.zero)
        return self.cupy.ascontiguousarray(x)

    def _state_in(self, s):
        if self.direct_states:
            return self.cupy.ascontiguousarray(s)
        s = s if self.time_major else s.swapaxes(0, 1)
        return self.cupy.ascontiguousarray(s if self.all_rows else s[:, self.rows])

    def _data_target(self, out, width):
        """Where cuDNN writes data results: the caller's buffer when all rows run."""
        if out is not None and self.all_rows:
            return out
        return self.cupy.empty(self._run_shape(width), dtype=self.storage)

    def _data_out(self, run, out, width):
        if run is out:
            return out
        if self.all_rows:
            full = run
        else:
            full = out if out is not None else self.cupy.empty(
                self.problem.data_shape(width), dtype=self.storage)
            full[...] = 0
            if self.problem.time_major:
                full[:, self.rows] = run
            else:
                full[self.rows] = run
            return full
        return _into(out, full)

    def _state_target(self, out, like):
        if out is not None and self.direct_states:
            return out
        return self.cupy.empty_like(like)

    def _state_out(self, run, out, passthrough):
        """Rows that ran take cuDNN's result; the others keep `passthrough` (caller's layout)."""
        if run is out or self.direct_states:  # cuDNN wrote into `out`, or a fresh array
            return run
        tm = self.time_major
        if self.all_rows:
            full = run if tm else run.swapaxes(0, 1)
        else:  # never into the caller's passthrough array
            full = (passthrough if tm else passthrough.swapaxes(0, 1)).copy()
            full[:, self.rows] = run
            full = full if tm else full.swapaxes(0, 1)
        return _into(out, full) if out is not None else self.cupy.ascontiguousarray(full)

    def _buffer(self, given, nbytes):
        return given if given is not None else self.cupy.empty(max(nbytes, 1), self.cupy.uint8)

    def _reserve_copy(self, reserve, workspace):
        """A copy of the cuDNN part of `reserve`, for cuDNN's backward calls.

        ``cudnnRNNBackwardData_v8`` and ``cudnnRNNBackwardWeights_v8`` take reserveSpace
        ``[in,out]``: cuDNN may write into it. Handing them a copy keeps the caller's
        reserve space as forward left it, so any number of backprops may use it (a
        second ``backward(retain_graph=True)``, a JAX vjp called twice, ``jacrev``), and
        XLA's operands stay unwritten. The copy lives after cuDNN's workspace in
        `workspace` when that is large enough (``workspace_nbytes``), else in the pool.
        """
        n = self.reserve_bytes
        start = self._copy_offset
        if workspace is not None and workspace.size >= start + n:
            copy = workspace[start:start + n]
        else:
            copy = self.cupy.empty(max(n, 1), self.cupy.uint8)[:n]
        copy[...] = reserve[_HEADER:_HEADER + n]  # device to device, on the current stream
        return copy

    # ------------------------------------------------------------------ reserve space
    def _new_reserve(self, given):
        reserve = self._buffer(given, self.reserve_nbytes)
        reserve[:reserve_header.IDENTITY_BYTES] = self.head_device  # device to device
        reserve_header.remember(reserve, reserve.data.ptr, self.head)
        return reserve

    def _open_reserve(self, reserve_space):
        cp, n = self.cupy, reserve_header.IDENTITY_BYTES
        reserve_space = cp.ascontiguousarray(reserve_space)
        readable = reserve_space.dtype == cp.uint8 and reserve_space.size >= n
        head = reserve_header.identity(
            reserve_space, reserve_space.data.ptr,
            lambda: self._read_header(reserve_space) if readable else None)
        if not (head == self.head and readable and
                reserve_space.size == _HEADER + self.reserve_bytes):
            reserve_header.check(head, reserve_space.dtype, reserve_space.size,
                                 _HEADER + self.reserve_bytes, self.problem, MAGIC, "cuDNN",
                                 self.tf32)
        return reserve_space

    def _read_header(self, reserve_space) -> bytes:
        """The identity of a reserve space this process did not note: a device→host
        copy and a sync, which a capturing stream refuses (so a clear error then)."""
        stream = self.cupy.cuda.get_current_stream()
        if stream.is_capturing():
            raise ValueError(
                "reserve_space: this backprop runs under CUDA-graph capture and the "
                "reserve space is not the array its forward returned here (a copy, or a "
                "framework's tensor object rebuilt at each replay), so its header would "
                "have to be read back, a sync capture refuses: pass the array forward "
                "returned, or note it with RNNPlan.trust_reserve(reserve_space)")
        return bytes(self.cupy.asnumpy(reserve_space[:reserve_header.IDENTITY_BYTES]))

    # ------------------------------------------------------------------ the passes
    def forward(self, input, input_h, input_c, params, out=(None,) * 4, workspace=None,
                restart_dropout=False, dropout_key=None):
        """Forward on CuPy arrays of the problem's shapes; see ``pycudnnrnn.forward``.

        With `restart_dropout`, the seed's dropout states are put back as the seed made
        them first, so the masks depend on the seed alone (the XLA path: XLA may run a
        forward again and expects the same results); else they continue from the last
        training forward (TensorFlow's kernel). A `dropout_key` names this forward: run
        again with the same key, it draws the same masks (``DropoutStates.replaying``;
        ignored while the stream captures a graph, whose replays run no host code).
        """
        stream = self._enter()
        try:
            return self._forward(stream, input, input_h, input_c, params, out, workspace,
                                 restart_dropout, dropout_key)
        finally:
            self._leave(stream)

    def forward_at(self, x: int, hx: int, cx: int, params: int, y: int, hy: int, cy: int,
                   work: int, reserve: int, restart_dropout=False, dropout_key=None):
        """Forward on device addresses (ints, 0 for none), for an adapter whose buffers
        another library allocated: no array crosses into CuPy (a DLPack import each).

        Only for a plan that runs ``in_place``, on buffers the caller vouches for: C-
        contiguous, of the problem's shapes and dtype, on the plan's device. `reserve`:
        ``reserve_nbytes`` bytes in training, whose header is written here (the caller
        notes it by its buffer, ``reserve_header.remember``, or passes it to
        ``backprop_at`` as `trusted`), else 0; `work`:
        ``forward_workspace_nbytes`` bytes, or 0 to take them from CuPy's allocator.
        `restart_dropout` and `dropout_key` as for ``forward``.
        """
        if self.training and not reserve:
            raise ValueError("forward_at: a training forward needs a reserve_space address")
        stream = self._enter()
        try:
            if self.training:  # device to device, on the stream: no host copy, no sync
                runtime = self.cupy.cuda.runtime
                runtime.memcpyAsync(reserve, self._head_ptr, reserve_header.IDENTITY_BYTES,
                                    runtime.memcpyDeviceToDevice, stream.ptr)
            taken = None if work else self._buffer(None, self.work_bytes)
            self._run_forward(stream, x, y, hx, hy, cx, cy, params,
                              work or taken.data.ptr,
                              0 if self.reserve_offset is None else reserve + self.reserve_offset,
                              restart_dropout, dropout_key)
        finally:
            self._leave(stream)

    def _run_forward(self, stream, x, y, hx, hy, cx, cy, weights, work, reserve,
                     restart_dropout, dropout_key):
        """cudnnRNNForward on addresses, with the dropout state restarted or replayed."""
        handle = resources.handle(self.cupy, self.device)
        states = getattr(self.rnn.dropout, "states", None) if self.training else None
        if states is None:
            self.calls.forward(handle, x, y, hx, hy, cx, cy, weights, work, reserve)
            return
        with states.ordered(self.cupy, stream):
            if restart_dropout:
                states.restart()
            # A capture's replays run no host code: a key could name no replayed mask.
            replayed = dropout_key is not None and not stream.is_capturing()
            with states.replaying(dropout_key) if replayed else contextlib.nullcontext():
                self.calls.forward(handle, x, y, hx, hy, cx, cy, weights, work, reserve)

    def _forward(self, stream, input, input_h, input_c, params, out, workspace,
                 restart_dropout, dropout_key):
        cp, lstm, width = self.cupy, self.lstm, self.width
        out_y, out_h, out_c, out_reserve = out
        training = self.training
        reserve = self._new_reserve(out_reserve) if training else self.no_reserve
        if self.batch == 0:  # every sequence is empty: nothing for cuDNN to do
            output = out_y if out_y is not None else cp.empty(
                self.problem.data_shape(width), self.storage)
            output[...] = 0
            return (output, _into(out_h, input_h, copy=True),
                    _into(out_c, input_c, copy=True) if lstm else self.empty, reserve)

        x = self._data_in(input, zero_padding=True)
        y = out_y if out_y is not None and self.all_rows else cp.empty(self.y_shape,
                                                                       self.storage)
        direct = self.direct_states  # (the common case, written out: no helper calls)
        if direct:
            hx = cp.ascontiguousarray(input_h)
            hy = out_h if out_h is not None else cp.empty_like(hx)
            cx = cp.ascontiguousarray(input_c) if lstm else None
            cy = (out_c if out_c is not None else cp.empty_like(cx)) if lstm else None
        else:
            hx = self._state_in(input_h)
            cx = self._state_in(input_c) if lstm else None
            hy = self._state_target(out_h, hx)
            cy = self._state_target(out_c, cx) if lstm else None
        weights = cp.ascontiguousarray(params)
        work = self._buffer(workspace, self.work_bytes)
        offset = self.reserve_offset
        self._run_forward(stream, x.data.ptr, y.data.ptr, hx.data.ptr, hy.data.ptr,
                          cx.data.ptr if lstm else 0, cy.data.ptr if lstm else 0,
                          weights.data.ptr, work.data.ptr,
                          0 if offset is None else reserve.data.ptr + offset,
                          restart_dropout, dropout_key)
        if direct:  # every row ran, time-major: cuDNN's results are the results
            return y, hy, cy if lstm else self.empty, reserve
        return (self._data_out(y, out_y, width), self._state_out(hy, out_h, input_h),
                self._state_out(cy, out_c, input_c) if lstm else self.empty, reserve)

    def backprop(self, input, input_h, input_c, params, output, output_h, output_c,
                 output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                 out=(None,) * 4, workspace=None, gradients="all"):
        """Backprop of data, then weights; see ``pycudnnrnn.backprop``.

        `gradients="data"` skips cudnnRNNBackwardWeights; "weights" still runs the data
        pass (the weight pass reads what it leaves in the reserve space). Gradients left
        out come back as None.
        """
        stream = self._enter()
        try:
            grads = self._backprop(input, input_h, input_c, params, output, output_h,
                                   output_c, output_backprop, output_h_backprop,
                                   output_c_backprop, reserve_space, out, workspace,
                                   gradients != "data")
        finally:
            self._leave(stream)
        return grads if gradients != "weights" else (None, None, None, grads[3])

    def backprop_at(self, x: int, hx: int, cx: int, params: int, y: int, dy: int, dhy: int,
                    dcy: int, dx: int, dhx: int, dcx: int, dparams: int, work: int,
                    work_nbytes: int, reserve: int, reserve_nbytes: int,
                    trusted=False) -> bool:
        """Backprop on device addresses (0 for none), as ``forward_at`` runs forward: for
        a training plan that runs ``in_place``, on buffers the caller vouches for, the
        data gradients always computed (`dparams` 0: no weight pass). Returns False,
        having queued nothing, when the reserve space at `reserve` is not of this plan's
        size or, unless `trusted` (the caller knows it is this plan's forward's, as XLA's
        custom_vjp does), not one this process noted for it (``reserve_header.known``):
        the checked path then reads and checks its header.
        """
        if reserve_nbytes != _HEADER + self.reserve_bytes or \
                not trusted and reserve_header.known(reserve) != self.head:
            return False
        runtime, n = self.cupy.cuda.runtime, self.reserve_bytes
        stream = self._enter()
        try:
            if dparams:  # cuDNN adds the weight gradients
                runtime.memsetAsync(dparams, 0, self.weight_bytes, stream.ptr)
            taken = None
            if work_nbytes < self._copy_offset + n:  # no room for the reserve's copy
                taken = self.cupy.empty(max(self._copy_offset + n, 1), self.cupy.uint8)
                work = taken.data.ptr
            scratch = work + self._copy_offset  # cuDNN may write there: see _reserve_copy
            if n:
                runtime.memcpyAsync(scratch, reserve + _HEADER, n,
                                    runtime.memcpyDeviceToDevice, stream.ptr)
            handle = resources.handle(self.cupy, self.device)
            self.calls.backward_data(handle, y, dy, dx, hx, dhy, dhx, cx, dcy, dcx, params,
                                     work, scratch)
            if dparams:
                self.calls.backward_weights(handle, x, hx, y, dparams, work, scratch)
        finally:
            self._leave(stream)
        return True

    def _backprop(self, input, input_h, input_c, params, output, output_h, output_c,
                  output_backprop, output_h_backprop, output_c_backprop, reserve_space, out,
                  workspace, want_weights):
        cp, lstm, input_size = self.cupy, self.lstm, self.problem.config.input_size
        reserve = self._open_reserve(reserve_space)
        out_dx, out_dh, out_dc, out_dw = out
        dparams = None
        if want_weights:
            dparams = out_dw if out_dw is not None else cp.empty(self.params_size,
                                                                 self.storage)
            dparams[...] = 0  # cuDNN adds the weight gradients
        if self.batch == 0:
            dx = out_dx if out_dx is not None else cp.empty(input.shape, self.storage)
            dx[...] = 0
            return (dx, _into(out_dh, output_h_backprop, copy=True),
                    _into(out_dc, output_c_backprop, copy=True) if lstm else self.empty, dparams)

        y = self._data_in(output, zero_padding=True)
        dy = self._data_in(output_backprop, zero_padding=True)
        hx, dhy = self._state_in(input_h), self._state_in(output_h_backprop)
        cx = self._state_in(input_c) if lstm else None
        dcy = self._state_in(output_c_backprop) if lstm else None
        dx = self._data_target(out_dx, input_size)
        dhx = self._state_target(out_dh, hx)
        dcx = self._state_target(out_dc, cx) if lstm else None
        weights = cp.ascontiguousarray(params)
        work = self._buffer(workspace, self.work_bytes)
        scratch = self._reserve_copy(reserve, workspace)
        handle = resources.handle(cp, self.device)
        work_ptr, scratch_ptr, hx_ptr, y_ptr = (work.data.ptr, scratch.data.ptr, hx.data.ptr,
                                                y.data.ptr)
        self.calls.backward_data(handle, y_ptr, dy.data.ptr, dx.data.ptr, hx_ptr, dhy.data.ptr,
                                 dhx.data.ptr, _ptr(cx), _ptr(dcy), _ptr(dcx),
                                 weights.data.ptr, work_ptr, scratch_ptr)
        if self.ragged:  # cuDNN does not promise to write dx past each length
            cp.copyto(dx, self.zero, where=self.padding)
        if want_weights:  # only the weight gradients read x
            x = self._data_in(input, zero_padding=True)
            self.calls.backward_weights(handle, x.data.ptr, hx_ptr, y_ptr, dparams.data.ptr,
                                        work_ptr, scratch_ptr)
        return (self._data_out(dx, out_dx, input_size),
                self._state_out(dhx, out_dh, output_h_backprop),
                self._state_out(dcx, out_dc, output_c_backprop) if lstm else self.empty,
                dparams)


def _ptr(array) -> int:
    return array.data.ptr if array is not None else 0


def _into(out, value, copy=False):
    """`value` written into `out` when given (else `value`, copied if asked)."""
    if out is None:
        return value.copy() if copy else value
    out[...] = value
    return out
