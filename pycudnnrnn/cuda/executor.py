"""The GPU backend: TensorFlow's CudnnRNNV3 / CudnnRNNBackpropV3 on CuPy arrays via cuDNN 9.

``Executor`` is the GPU half of a ``pycudnnrnn.RNNPlan``: built once for a validated
``pycudnnrnn.core.config.Problem`` on one device, it holds the descriptors (from
``pycudnnrnn.cuda.resources``; a new RNN descriptor's weight layout is checked against
ours by ``pycudnnrnn.cuda.weight_space``), the workspace and reserve sizes and the
device copy of the lengths; its ``Staging`` (``pycudnnrnn.cuda.staging``) holds the
running rows' index and the padding mask, its ``ReserveSpace``
(``pycudnnrnn.cuda.reserve``) the reserve header. Building one makes no host sync
either: its uploads are queued, and an event orders them before runs on other streams.
A run is then pointers and cuDNN calls on CuPy's current stream: no host↔device copy,
no sync, no size query. Per run:

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

from ..core import dtypes, gpu, layout, reserve_header
from ..core.arrays import BackpropAddresses, ForwardAddresses
from ..core.config import Problem
from ..cudnn import rnn
from . import building, lifetime, resources, weight_space
from .reserve import HEADER, ReserveSpace, copy_offset
from .staging import Staging, into



class Executor:
    """One problem on one device, with everything a run needs that the data does not.

    It keeps the contract every backend's executor keeps (``pycudnnrnn.plan.backend``),
    and runs on device addresses too (``forward_at``, ``backprop_at``).
    """

    kind = "cuda"
    #: cuDNN fixes the seed in its dropout state: another seed needs another plan.
    reseeds = False

    def __init__(self, problem: Problem, device: int):
        self.xp = self.cupy = cp = gpu.cupy()
        self.problem, self.device = problem, device
        self.device_name = f"cuda:{device}"
        c, dtype = problem.config, problem.dtype
        self.tf32 = gpu.get_allow_tf32()
        # What buffers are made of: the dtype, or bfloat16's bits with a CuPy older than
        # 14 (cuDNN sees pointers; the descriptors say bfloat16).
        self.storage = dtypes.storage_dtype(dtype, cp)
        self.params_size = layout.params_size(c)
        self.weight_bytes = self.params_size * dtype.itemsize
        self.work_bytes = self.reserve_bytes = 0
        self.reserve_offset = None  # of cuDNN's part in reserve_space, when it has one
        # Fixed for every run, read there as plain attributes.
        self.lstm, self.training = c.is_lstm, problem.is_training
        self.width = c.num_dirs * c.state_size  # of y
        # The plan's buffers outlive the call that builds it: CuPy's own pool, never the
        # caller's allocator (a framework's, or a CUDA graph's private pool); and never
        # inside a capture: on a private stream then, which becomes the plan's home.
        with cp.cuda.Device(device), building.outside_capture(cp, device), \
                cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
            self.staging = staging = Staging(cp, problem, self.storage)
            # The caller's buffers are cuDNN's, as they are: time-major, every row running
            # its full length (nothing to pad, gather or transpose). See ``forward_at``.
            self.in_place = staging.direct_states and not staging.ragged and staging.batch > 0
            self.y_shape = staging.run_shape(self.width)
            handle = resources.handle(cp)
            self.rnn = resources.rnn_descriptor(cp, handle, device, c, dtype, self.tf32)
            if not self.rnn.layout_checked:  # once per descriptor: a bug in layout.py if not
                weight_space.check_layout(cp, handle, self.rnn)
                self.rnn.layout_checked = True
            self.empty = cp.zeros((0,), self.storage)  # output_c of other cells: never written
            self.no_reserve = cp.zeros((0,), dtype=cp.uint8)  # inference's reserve_space
            if staging.batch:
                self._describe(handle, staging.run_lengths)
            self.reserves = ReserveSpace(cp, problem, self.tf32, self.reserve_bytes,
                                         self.work_bytes)
            self.head = self.reserves.head
            # The uploads above are queued on this stream (the caller's, or the private
            # one of a build during a capture): no host sync here. Who uses the plan's
            # memory after (streams, graphs) is the lifetime's to know; it keeps all the
            # plan holds (a snapshot: nothing is added after) until then.
            states = getattr(self.rnn.dropout, "states", None)
            self.lifetime = lifetime.Lifetime(
                cp, self, cp.cuda.get_current_stream(), device, keep=tuple(vars(self).values()),
                parts=() if states is None else (states.lifetime,), uploads=True)

    def _describe(self, handle, run_lengths):
        """Descriptors, temp-space sizes and device lengths of the running rows."""
        cp, problem, device = self.cupy, self.problem, self.device
        c, dtype, T, B = problem.config, problem.dtype, problem.max_time, self.staging.batch
        tm = problem.time_major
        self.x_desc = resources.data_descriptor(device, dtype, tm, T, B, c.input_size,
                                                      run_lengths)
        self.y_desc = resources.data_descriptor(device, dtype, tm, T, B,
                                                      c.num_dirs * c.state_size, run_lengths)
        LD = c.num_pseudo_layers
        self.h_desc = resources.state_descriptor(device, dtype, (LD, B, c.state_size))
        self.c_desc = resources.state_descriptor(device, dtype, (LD, B, c.num_units))
        self.dev_lengths = cp.asarray(run_lengths)
        self.work_bytes, self.reserve_bytes = rnn.temp_space_sizes(
            handle, self.rnn, problem.is_training, self.x_desc)
        self.reserve_offset = HEADER if problem.is_training and self.reserve_bytes else None
        self.calls = rnn.Calls(self.rnn, training=problem.is_training,
                               dev_lengths=self.dev_lengths.data.ptr, x_desc=self.x_desc,
                               y_desc=self.y_desc, h_desc=self.h_desc, c_desc=self.c_desc,
                               weight_bytes=self.weight_bytes, work_bytes=self.work_bytes,
                               reserve_bytes=self.reserve_bytes)

    @staticmethod
    def traced_reserve_nbytes(problem: Problem) -> None:
        """None: cuDNN tells the reserve space's size, to a built plan only."""
        return None

    def reseeded(self, problem: Problem):
        raise ValueError("only a CPU plan can change its seed (cuDNN fixes it in its "
                         "dropout state)")

    def on_device(self):
        """The plan's device, made current."""
        return self.cupy.cuda.Device(self.device)

    def remember_reserve(self, buffer, reserve=None, address=None):
        """Note `buffer` (a caller's object) as holding this plan's forward's reserve
        space, at `address` (else that of `reserve`, the backend's array over it, else
        of `buffer`): its backprop then reads no header back. Nothing in inference."""
        if self.training:
            if address is None:
                address = (buffer if reserve is None else reserve).data.ptr
            reserve_header.remember(buffer, address, self.head)

    # ------------------------------------------------------------------ streams
    def _enter(self):
        """The current stream, ordered after the plan's uploads, and what ``_leave``
        takes (see ``lifetime.Lifetime.enter``)."""
        stream = self.cupy.cuda.get_current_stream()
        return stream, self.lifetime.enter(stream)

    def _leave(self, stream, token):
        """After a run's work is queued on `stream` (see ``lifetime.Lifetime.leave``)."""
        self.lifetime.leave(stream, token, self)

    def settle(self):
        """Note that the plan's uploads are done (the caller synchronized): runs on
        other streams need not wait for them."""
        self.lifetime.settle()

    # ------------------------------------------------------------------ sizes
    @property
    def reserve_nbytes(self) -> int:
        """Bytes of the reserve_space forward makes (0 in inference)."""
        return HEADER + self.reserve_bytes if self.problem.is_training else 0

    @property
    def workspace_nbytes(self) -> int:
        """Bytes of the workspace a run may take: cuDNN's, then (training) room for the
        copy of the reserve space backprop hands cuDNN."""
        return copy_offset(self.work_bytes) + self.reserve_bytes if self.problem.is_training \
            else self.work_bytes

    @property
    def forward_workspace_nbytes(self) -> int:
        """Bytes of the workspace forward takes: cuDNN's alone (the copy is backprop's)."""
        return self.work_bytes

    def _buffer(self, given, nbytes):
        return given if given is not None else self.cupy.empty(max(nbytes, 1), self.cupy.uint8)

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
        stream, token = self._enter()
        try:
            return self._forward(stream, input, input_h, input_c, params, out, workspace,
                                 restart_dropout, dropout_key)
        finally:
            self._leave(stream, token)

    def forward_at(self, addresses: ForwardAddresses, restart_dropout=False, dropout_key=None):
        """Forward on device addresses (0 for none), for an adapter whose buffers another
        library allocated: no array crosses into CuPy (a DLPack import each).

        Only for a plan that runs ``in_place``, on buffers the caller vouches for: C-
        contiguous, of the problem's shapes and dtype, on the plan's device. `reserve`:
        ``reserve_nbytes`` bytes in training, whose header is written here (the caller
        notes it by its buffer, ``reserve_header.remember``, or passes it to
        ``backprop_at`` as `trusted`), else 0; `work`:
        ``forward_workspace_nbytes`` bytes, or 0 to take them from CuPy's allocator.
        `restart_dropout` and `dropout_key` as for ``forward``.
        """
        x, hx, cx, params, y, hy, cy, work, reserve = addresses
        if self.training and not reserve:
            raise ValueError("forward_at: a training forward needs a reserve_space address")
        stream, token = self._enter()
        try:
            if self.training:  # device to device, on the stream: no host copy, no sync
                runtime = self.cupy.cuda.runtime
                runtime.memcpyAsync(reserve, self.reserves.head_ptr,
                                    reserve_header.IDENTITY_BYTES,
                                    runtime.memcpyDeviceToDevice, stream.ptr)
            taken = None if work else self._buffer(None, self.work_bytes)
            self._run_forward(stream, x, y, hx, hy, cx, cy, params,
                              work or taken.data.ptr,
                              0 if self.reserve_offset is None else reserve + self.reserve_offset,
                              restart_dropout, dropout_key)
        finally:
            self._leave(stream, token)

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
        cp, lstm, width, stage = self.cupy, self.lstm, self.width, self.staging
        out_y, out_h, out_c, out_reserve = out
        training = self.training
        reserve = self.reserves.new(out_reserve) if training else self.no_reserve
        if stage.batch == 0:  # every sequence is empty: nothing for cuDNN to do
            output = out_y if out_y is not None else cp.empty(
                self.problem.data_shape(width), self.storage)
            output[...] = 0
            return (output, into(out_h, input_h, copy=True),
                    into(out_c, input_c, copy=True) if lstm else self.empty, reserve)

        x = stage.data_in(input, zero_padding=True)
        y = out_y if out_y is not None and stage.all_rows else cp.empty(self.y_shape,
                                                                       self.storage)
        direct = stage.direct_states  # (the common case, written out: no helper calls)
        if direct:
            hx = cp.ascontiguousarray(input_h)
            hy = out_h if out_h is not None else cp.empty_like(hx)
            cx = cp.ascontiguousarray(input_c) if lstm else None
            cy = (out_c if out_c is not None else cp.empty_like(cx)) if lstm else None
        else:
            hx = stage.state_in(input_h)
            cx = stage.state_in(input_c) if lstm else None
            hy = stage.state_target(out_h, hx)
            cy = stage.state_target(out_c, cx) if lstm else None
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
        return (stage.data_out(y, out_y, width), stage.state_out(hy, out_h, input_h),
                stage.state_out(cy, out_c, input_c) if lstm else self.empty, reserve)

    def backprop(self, input, input_h, input_c, params, output, output_h, output_c,
                 output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                 out=(None,) * 4, workspace=None, gradients="all"):
        """Backprop of data, then weights; see ``pycudnnrnn.backprop``.

        `gradients="data"` skips cudnnRNNBackwardWeights; "weights" still runs the data
        pass (the weight pass reads what it leaves in the reserve space). Gradients left
        out come back as None.
        """
        stream, token = self._enter()
        try:
            grads = self._backprop(input, input_h, input_c, params, output, output_h,
                                   output_c, output_backprop, output_h_backprop,
                                   output_c_backprop, reserve_space, out, workspace,
                                   gradients != "data")
        finally:
            self._leave(stream, token)
        return grads if gradients != "weights" else (None, None, None, grads[3])

    def backprop_at(self, addresses: BackpropAddresses, trusted=False) -> bool:
        """Backprop on device addresses (0 for none), as ``forward_at`` runs forward: for
        a training plan that runs ``in_place``, on buffers the caller vouches for, the
        data gradients always computed (`dparams` 0: no weight pass). Returns False,
        having queued nothing, when the reserve space at `reserve` is not of this plan's
        size or, unless `trusted` (the caller knows it is this plan's forward's, as XLA's
        custom_vjp does), not one this process noted for it (``reserve_header.known``):
        the checked path then reads and checks its header.
        """
        (x, hx, cx, params, y, dy, dhy, dcy, dx, dhx, dcx, dparams, work, work_nbytes,
         reserve, reserve_nbytes) = addresses
        if reserve_nbytes != HEADER + self.reserve_bytes or \
                not trusted and reserve_header.known(reserve) != self.head:
            return False
        runtime, n, offset = self.cupy.cuda.runtime, self.reserve_bytes, self.reserves.copy_offset
        stream, token = self._enter()
        try:
            if dparams:  # cuDNN adds the weight gradients
                runtime.memsetAsync(dparams, 0, self.weight_bytes, stream.ptr)
            taken = None
            if work_nbytes < offset + n:  # no room for the reserve's copy
                taken = self.cupy.empty(max(offset + n, 1), self.cupy.uint8)
                work = taken.data.ptr
            scratch = work + offset  # cuDNN may write there: see ReserveSpace.copy
            if n:
                runtime.memcpyAsync(scratch, reserve + HEADER, n,
                                    runtime.memcpyDeviceToDevice, stream.ptr)
            handle = resources.handle(self.cupy, self.device)
            self.calls.backward_data(handle, y, dy, dx, hx, dhy, dhx, cx, dcy, dcx, params,
                                     work, scratch)
            if dparams:
                self.calls.backward_weights(handle, x, hx, y, dparams, work, scratch)
        finally:
            self._leave(stream, token)
        return True

    def _backprop(self, input, input_h, input_c, params, output, output_h, output_c,
                  output_backprop, output_h_backprop, output_c_backprop, reserve_space, out,
                  workspace, want_weights):
        cp, lstm, input_size = self.cupy, self.lstm, self.problem.config.input_size
        stage = self.staging
        reserve = self.reserves.open(reserve_space)
        out_dx, out_dh, out_dc, out_dw = out
        dparams = None
        if want_weights:
            dparams = out_dw if out_dw is not None else cp.empty(self.params_size,
                                                                 self.storage)
            dparams[...] = 0  # cuDNN adds the weight gradients
        if stage.batch == 0:
            dx = out_dx if out_dx is not None else cp.empty(input.shape, self.storage)
            dx[...] = 0
            return (dx, into(out_dh, output_h_backprop, copy=True),
                    into(out_dc, output_c_backprop, copy=True) if lstm else self.empty, dparams)

        y = stage.data_in(output, zero_padding=True)
        dy = stage.data_in(output_backprop, zero_padding=True)
        hx, dhy = stage.state_in(input_h), stage.state_in(output_h_backprop)
        cx = stage.state_in(input_c) if lstm else None
        dcy = stage.state_in(output_c_backprop) if lstm else None
        dx = stage.data_target(out_dx, input_size)
        dhx = stage.state_target(out_dh, hx)
        dcx = stage.state_target(out_dc, cx) if lstm else None
        weights = cp.ascontiguousarray(params)
        work = self._buffer(workspace, self.work_bytes)
        scratch = self.reserves.copy(reserve, workspace)
        handle = resources.handle(cp, self.device)
        work_ptr, scratch_ptr, hx_ptr, y_ptr = (work.data.ptr, scratch.data.ptr, hx.data.ptr,
                                                y.data.ptr)
        self.calls.backward_data(handle, y_ptr, dy.data.ptr, dx.data.ptr, hx_ptr, dhy.data.ptr,
                                 dhx.data.ptr, _ptr(cx), _ptr(dcy), _ptr(dcx),
                                 weights.data.ptr, work_ptr, scratch_ptr)
        if stage.ragged:  # cuDNN does not promise to write dx past each length
            cp.copyto(dx, stage.zero, where=stage.padding)
        if want_weights:  # only the weight gradients read x
            x = stage.data_in(input, zero_padding=True)
            self.calls.backward_weights(handle, x.data.ptr, hx_ptr, y_ptr, dparams.data.ptr,
                                        work_ptr, scratch_ptr)
        return (stage.data_out(dx, out_dx, input_size),
                stage.state_out(dhx, out_dh, output_h_backprop),
                stage.state_out(dcx, out_dc, output_c_backprop) if lstm else self.empty,
                dparams)


def _ptr(array) -> int:
    return array.data.ptr if array is not None else 0

