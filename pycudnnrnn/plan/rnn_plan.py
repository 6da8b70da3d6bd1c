"""``RNNPlan``: everything one RNN call needs that the data does not, built once.

The plan/run split of cuFFT plans: a plan fixes the op's attributes, the sizes, the
sequence lengths, the dtype and the device; each run then only checks its arrays'
shapes, dtypes and device and calls its backend's executor (``.backend``).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from ..core import checks, dtypes, gpu, layout
from ..core.arrays import (BackpropAddresses, ForwardAddresses, host_lengths, readable_kind,
                           results_like, to_backend)
from ..core.config import Problem, describe_lengths
from ..results import BackpropResult, ForwardResult
from .backend import executor_type
from .buffers import NO_OUT, checked_outputs, checked_workspace, refuse_overlaps

FORWARD_NAMES = ("input", "input_h", "input_c", "params")
_BACKPROP_NAMES = FORWARD_NAMES + ("output", "output_h", "output_c", "output_backprop",
                                    "output_h_backprop", "output_c_backprop", "reserve_space")


class RNNPlan:
    """A planned RNN: the op's attributes, sizes, lengths, dtype and device, fixed once.

    Parameters
    ----------
    num_layers, num_units, input_size : int
    max_time, batch_size : int
        T and B of every run.
    sequence_lengths : array of int, optional
        ``[B]`` lengths in ``[0, T]``; None means all T. Fixed: another set of lengths
        needs another plan.
    dtype : {"float16", "bfloat16", "float32", "float64"}, default "float32"
        Or a NumPy, PyTorch or ml_dtypes dtype; None means the default.
    device : "cpu", "cuda", "cuda:N" or int, default "cpu"
        "cpu" runs the NumPy backend, anything else cuDNN on that CUDA device.
    is_training : bool, default True
        Training plans apply dropout, make a reserve_space and can run ``backprop``.
    rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj, time_major
        The attributes of ``pycudnnrnn.forward``, with its defaults.

    Notes
    -----
    ``forward(input, input_h, input_c, params)`` and ``backprop(input, input_h, input_c,
    params, output, output_h, output_c, output_backprop, output_h_backprop,
    output_c_backprop, reserve_space)`` return what the functional API returns. Arrays
    must have the plan's shapes, dtype and device (else ``ValueError`` / ``TypeError``
    naming the argument); they may be NumPy / CuPy arrays or any DLPack array there, and
    results come back in the library of `input`.

    For framework adapters (a PyTorch custom op, a JAX FFI call), the sizes are known at
    plan time: ``input_shape``, ``state_shapes``, ``output_shape``, ``output_h_shape``,
    ``output_c_shape`` (``(0,)`` unless LSTM), ``params_size``, ``reserve_nbytes`` (0 in
    inference), ``workspace_nbytes`` and ``forward_workspace_nbytes`` (forward's part of
    it: backprop's copy of the reserve space is not forward's). A framework can allocate
    every buffer through its own allocator and pass them in: ``out=(output, output_h, output_c, reserve_space)`` to
    ``forward`` and ``out=(input_backprop, input_h_backprop, input_c_backprop,
    params_backprop)`` to ``backprop`` (any entry may be None, and one for a result
    that does not exist, output_c of other cells or an inference reserve_space, is
    ignored; given ones must be C-contiguous, of the result's shape and dtype,
    reserve_space uint8 of ``reserve_nbytes``), and ``workspace=`` a uint8 buffer of at
    least ``workspace_nbytes`` (``forward_workspace_nbytes`` for ``forward``). The results
    are then those buffers; other temporaries come from CuPy's current allocator
    (``cupy.cuda.using_allocator`` for a framework's). On the GPU a run works on CuPy's
    current stream (for a framework's stream ``ptr``: ``with
    cupy.cuda.ExternalStream(ptr):`` with CuPy 13; CuPy 14 deprecates it for
    ``cupy.cuda.Stream.from_external(obj)``, ``obj.__cuda_stream__()`` giving
    ``(0, ptr)``; see docs/gpu.md) and makes no host↔device copy, no sync and no size
    query; from its second call on it can be captured in a CUDA graph
    (``pycudnnrnn.graphs``).
    """

    def __init__(self, *, num_layers, num_units, input_size, max_time, batch_size,
                 sequence_lengths=None, dtype="float32", device="cpu", is_training=True,
                 rnn_mode="lstm", input_mode="linear_input", direction="unidirectional",
                 dropout=0.0, seed=0, seed2=0, num_proj=0, time_major=True):
        problem = checks.make_problem(
            max_time=max_time, batch_size=batch_size,
            sequence_lengths=host_lengths(sequence_lengths), dtype=dtype,
            time_major=time_major, is_training=is_training, rnn_mode=rnn_mode,
            num_layers=num_layers, num_units=num_units, input_size=input_size,
            input_mode=input_mode, direction=direction, num_proj=num_proj, dropout=dropout,
            seed=seed, seed2=seed2)
        self._build(problem, gpu.device_index(device))

    @classmethod
    def from_problem(cls, problem: Problem, device: int | None) -> "RNNPlan":
        """A plan for a validated problem on a CUDA device (None: the CPU)."""
        plan = cls.__new__(cls)
        plan._build(problem, device)
        return plan

    def _build(self, problem: Problem, device):
        self.problem, self.device_index = problem, device
        c = problem.config
        self._executor = executor = executor_type(device)(problem, device)
        self._xp, self.device = executor.xp, executor.device_name
        self.dtype = problem.dtype
        self._lstm = c.is_lstm
        # bfloat16 with a CuPy older than 14: arrays cross as their bits (dtypes.Bfloat16Bits)
        self._bits = dtypes.storage_dtype(self.dtype, self._xp) != self.dtype
        self.input_shape = problem.data_shape(c.input_size)
        self.state_shapes = (problem.state_shape(c.state_size),
                             problem.state_shape(c.num_units) if c.is_lstm else None)
        self.output_shape = problem.data_shape(c.num_dirs * c.state_size)
        self.output_h_shape = self.state_shapes[0]
        self.output_c_shape = self.state_shapes[1] if c.is_lstm else (0,)
        self.params_size = layout.params_size(c)
        self.reserve_nbytes = self._executor.reserve_nbytes
        self.workspace_nbytes = self._executor.workspace_nbytes
        self.forward_workspace_nbytes = self._executor.forward_workspace_nbytes
        uint8, lstm, training = np.dtype(np.uint8), c.is_lstm, problem.is_training
        self._results_of = {  # (name, shape or None where there is no such result, dtype)
            "forward": [("output", self.output_shape, self.dtype),
                        ("output_h", self.output_h_shape, self.dtype),
                        ("output_c", self.output_c_shape if lstm else None, self.dtype),
                        ("reserve_space", (self.reserve_nbytes,) if training else None, uint8)],
            "backprop": [("input_backprop", self.input_shape, self.dtype),
                         ("input_h_backprop", self.output_h_shape, self.dtype),
                         ("input_c_backprop", self.output_c_shape if lstm else None,
                          self.dtype),
                         ("params_backprop", (self.params_size,), self.dtype)]}
        self._forward_shapes = checks.forward_shapes(problem)
        self._backprop_shapes = self._forward_shapes + checks.backprop_shapes(problem)
        self._described = {  # what describes compares, for forward and for backprop
            backprop: [(name, shape, self.dtype) for name, shape, _ in inputs] +
                      [(name, shape, dtype) for name, shape, dtype in self._results_of[run]
                       if shape is not None and name != "reserve_space"]
            for backprop, inputs, run in ((False, self._forward_shapes, "forward"),
                                          (True, self._backprop_shapes, "backprop"))}

    @property
    def is_training(self) -> bool:
        return self.problem.is_training

    def _with_seed(self, seed: int) -> "RNNPlan":
        """This plan with another combined dropout seed; it shares everything else.

        The NumPy backend draws its masks from the seed at run time, so a fresh seed per
        training step (as PyTorch's modules draw) needs no new plan; where the backend
        fixes the seed (cuDNN's dropout state), a ValueError.
        """
        if seed == self.problem.config.seed and self._executor.reseeds:
            return self
        seeded = copy.copy(self)
        seeded.problem = dataclasses.replace(
            self.problem, config=dataclasses.replace(self.problem.config, seed=seed))
        seeded._executor = self._executor.reseeded(seeded.problem)
        return seeded

    def __repr__(self):
        """The constructor's arguments: the sizes, then what differs from the defaults."""
        p, c = self.problem, self.problem.config
        fields = [f"num_layers={c.num_layers}", f"num_units={c.num_units}",
                  f"input_size={c.input_size}", f"max_time={p.max_time}",
                  f"batch_size={p.batch_size}"]
        if p.lengths is not None:
            fields.append(f"sequence_lengths={describe_lengths(p.lengths)}")
        fields += [f"dtype={self.dtype.name!r}", f"device={self.device!r}"]
        fields += [text for text, default in (
            ("is_training=False", p.is_training), (f"rnn_mode={c.rnn_mode!r}", c.is_lstm),
            ("input_mode='skip_input'", not c.skip_input),
            ("direction='bidirectional'", not c.bidirectional),
            (f"dropout={c.dropout!r}", not c.dropout), (f"num_proj={c.num_proj}", not c.num_proj),
            ("time_major=False", p.time_major)) if not default]
        if c.dropout:  # the seeds that fix the masks: the combined seed's two halves
            fields += [f"seed={c.seed >> 32}", f"seed2={c.seed & 0xFFFFFFFF}"]
        return f"RNNPlan({', '.join(fields)})"

    # ------------------------------------------------------------------ runs
    def forward(self, input, input_h, input_c, params, out=None, workspace=None,
                return_results=True, check_overlaps=True, dropout_key=None):
        """Run forward; returns ``ForwardResult(output, output_h, output_c, reserve_space)``.

        `return_results=False` (for a caller whose `out` buffers are the results) returns
        None, without exporting the results to the inputs' library (a DLPack round trip
        each). `check_overlaps=False` is for an adapter whose allocator has just made the
        `out` and `workspace` buffers; `dropout_key` names the forward (see
        ``run_forward``)."""
        arrays = self._adopt(dict(input=input, input_h=input_h, input_c=input_c, params=params))
        results = self.run_forward(arrays, out=out, workspace=workspace,
                                   check_overlaps=check_overlaps, dropout_key=dropout_key)
        given = out[3] if out is not None and len(out) == 4 else None
        if given is not None and given is not results[3]:
            # A framework's buffer, seen here through a DLPack view that dies with this
            # call: remember its header by the buffer itself, so backprop need not read it.
            self._executor.remember_reserve(given, reserve=results[3])
        if not return_results:
            return None
        return ForwardResult._make(self._results_like(input, results))

    def backprop(self, input, input_h, input_c, params, output, output_h, output_c,
                 output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                 out=None, workspace=None, gradients="all", trust_reserve=False,
                 return_results=True, check_overlaps=True):
        """Run backprop; returns ``BackpropResult(input_backprop, input_h_backprop,
        input_c_backprop, params_backprop)``, None for those `gradients` ("all", "data" or
        "weights", as for ``pycudnnrnn.backprop``) leaves out. `trust_reserve`: the caller
        vouches that `reserve_space` is this plan's forward's (a framework's autograd
        formula, which ties the two by construction): see ``trust_reserve``.
        `return_results` and `check_overlaps` as for ``forward``: ``return_results=False``
        returns which gradients were computed (a tuple of True and None) rather than the
        gradients."""
        arrays = self._adopt(dict(
            input=input, input_h=input_h, input_c=input_c, params=params, output=output,
            output_h=output_h, output_c=output_c, output_backprop=output_backprop,
            output_h_backprop=output_h_backprop, output_c_backprop=output_c_backprop,
            reserve_space=reserve_space))
        if trust_reserve:  # noted on the array adopted here, which lives through the run
            self.trust_reserve(arrays["reserve_space"])
        results = self.run_backprop(arrays, out=out, workspace=workspace, gradients=gradients,
                                    check_overlaps=check_overlaps)
        if not return_results:
            return tuple(None if r is None else True for r in results)
        return BackpropResult._make(self._results_like(input, results))

    def trust_reserve(self, reserve_space, pointer=None):
        """Note that `reserve_space` (a backend array) holds this plan's forward's reserve
        space, for a framework that ties the two by construction (XLA's custom_vjp): its
        backprop then reads no header back from the GPU. The note lasts at least as long
        as the array object does (as long as any buffer noted with that header).
        `pointer`: the address of its first byte, for a framework's buffer (larger than
        ``reserve_nbytes``, of which forward was given the start)."""
        self._executor.remember_reserve(reserve_space, address=pointer)

    @property
    def runs_in_place(self) -> bool:
        """Whether ``forward_at`` can run this plan: on the GPU, time-major, with every
        row running its full length (the caller's buffers are then cuDNN's as they are)."""
        return self._executor.in_place

    def describes(self, arrays: dict, backprop=False) -> bool:
        """Whether `arrays` by name (anything with ``shape`` and ``dtype``: an adapter's
        description of its buffers) hold each input of forward (of `backprop`) and each
        of its results, of this plan's shapes and dtype, as ``forward_at`` and
        ``backprop_at`` take them on trust (the reserve space and workspace are not
        looked at: their sizes are passed). A comparison per array, no error: where
        this says False, the checked ``forward`` or ``backprop`` tells what is wrong."""
        for name, shape, dtype in self._described[backprop]:
            array = arrays.get(name)
            if array is None or array.shape != shape or array.dtype != dtype:
                return False
        return True

    def forward_at(self, *addresses, restart_dropout=False, dropout_key=None):
        """Forward on device addresses, for an adapter whose buffers another library
        allocated: no DLPack import, no check. `addresses`: one ``ForwardAddresses``, or
        its nine fields as ints (0 for none), then `restart_dropout` and `dropout_key`
        as for ``run_forward``. The caller vouches for
        the buffers: C-contiguous, of the plan's shapes and dtype, on its device, the
        results fresh; ``forward_workspace_nbytes`` of workspace (or 0: CuPy's
        allocator gives it) and, in training, ``reserve_nbytes`` of reserve space, which
        it notes with ``trust_reserve(buffer, address)`` (or passes to ``backprop_at``
        as `trusted`, knowing it is this forward's). Only where ``runs_in_place``;
        ``describes`` checks the buffers' shapes and dtype for an adapter that has them
        at hand."""
        addresses, (restart_dropout, dropout_key) = _addresses(
            ForwardAddresses, addresses, (restart_dropout, dropout_key))
        if not self.runs_in_place:
            raise ValueError(f"forward_at: {self!r} does not run in place (on the GPU, "
                             f"time-major, every row its full length); use forward")
        with self._executor.on_device():
            self._executor.forward_at(addresses, restart_dropout, dropout_key)

    def backprop_at(self, *addresses, trusted=False) -> bool:
        """Backprop on device addresses, as ``forward_at`` runs forward (the caller
        vouches for the buffers; ``workspace_nbytes`` of workspace leave room for the
        reserve's copy). `addresses`: one ``BackpropAddresses``, or its sixteen fields as
        ints, then `trusted`. The data gradients always, the weight gradients when
        `params_backprop` is not 0. Returns False, having run nothing,
        when the reserve space is not of the plan's size or, unless `trusted` (the
        caller knows it is this plan's forward's, as XLA's custom_vjp does), not one this
        process noted for this plan (``trust_reserve``): call ``backprop``, which reads
        and checks its header. Only where ``runs_in_place``, in training."""
        addresses, (trusted,) = _addresses(BackpropAddresses, addresses, (trusted,))
        if not (self.runs_in_place and self.problem.is_training):
            raise ValueError(f"backprop_at: {self!r} does not run in place in training (on "
                             f"the GPU, time-major, every row its full length); use backprop")
        with self._executor.on_device():
            return self._executor.backprop_at(addresses, trusted)

    def run_forward(self, arrays: dict, out=None, workspace=None, reference="the plan",
                    check_overlaps=False, restart_dropout=False, dropout_key=None):
        """forward on backend arrays (NumPy or CuPy on the plan's device), by name.

        `check_overlaps` refuses `out` and `workspace` buffers that share memory with each
        other or an input; adapters whose allocator has just made them leave it off (it
        costs a pass over every array per call). `restart_dropout`: on the GPU, draw the
        seed's first masks again rather than continue cuDNN's dropout state (the CPU's
        masks depend on the seed alone anyway). `dropout_key` (hashable): on the GPU, a
        forward run again with the key of one of the seed's last
        ``pycudnnrnn.cuda.resources.DROPOUT_REPLAYS_KEPT`` keyed forwards draws that forward's
        masks (a framework's recomputation), and leaves the state as it was; a new key
        continues the state.
        """
        checks.check_arrays(arrays, self._forward_shapes, self.dtype, reference)
        out, workspace = self._buffers("forward", out, workspace, self.forward_workspace_nbytes,
                                       arrays, check_overlaps)
        if self._bits:
            arrays = {n: dtypes.storage(a) for n, a in arrays.items()}
        with self._executor.on_device():
            results = self._executor.forward(arrays["input"], arrays["input_h"],
                                             arrays["input_c"] if self._lstm else None,
                                             arrays["params"], out, workspace, restart_dropout,
                                             dropout_key)
        return self._as_bfloat16(results) if self._bits else results

    def run_backprop(self, arrays: dict, out=None, workspace=None, reference="the plan",
                     gradients="all", check_overlaps=False):
        """backprop on backend arrays (NumPy or CuPy on the plan's device), by name; see
        ``run_forward`` for `check_overlaps`."""
        if not self.problem.is_training:
            raise ValueError("backprop: this plan was built with is_training=False; build "
                             "one with is_training=True")
        gradients = checks.check_gradients(gradients)
        checks.check_arrays(arrays, self._backprop_shapes, self.dtype, reference)
        checks.check_reserve_space(arrays["reserve_space"])
        out, workspace = self._buffers("backprop", out, workspace, self.workspace_nbytes,
                                       arrays, check_overlaps)
        a = {n: arrays[n] for n in _BACKPROP_NAMES}
        if not self._lstm:
            a.update(input_c=None, output_c=None, output_c_backprop=None)
        if self._bits:
            a = {n: dtypes.storage(v) for n, v in a.items()}
        with self._executor.on_device():
            results = self._executor.backprop(**a, out=out, workspace=workspace,
                                              gradients=gradients)
        return self._as_bfloat16(results) if self._bits else results

    def _buffers(self, run, out, workspace, nbytes, arrays, check_overlaps):
        """The caller's `out` and `workspace` (of at least `nbytes`) for `run`, "forward"
        or "backprop", checked (see ``run_forward`` for `check_overlaps`)."""
        results = self._results_of[run]
        out = NO_OUT if out is None else checked_outputs(out, results, self._adopt, self._bits)
        workspace = None if workspace is None else \
            checked_workspace(workspace, nbytes, self._adopt)
        if check_overlaps and (out is not NO_OUT or workspace is not None):
            refuse_overlaps(results, out, workspace, arrays)
        return out, workspace

    def _results_like(self, template, results):
        """Backend results in the library of `template` (the caller's input)."""
        if type(template) is self._xp.ndarray and not self._bits:
            return results  # the backend's own arrays, as they are (results_like's answer)
        return results_like(template, self._xp, results)

    @staticmethod
    def _as_bfloat16(results):
        """Results held as bfloat16 bits, marked so that they leave as bfloat16."""
        return tuple(dtypes.Bfloat16Bits(r) if r is not None and r.dtype == dtypes.BITS
                     else r for r in results)

    # ------------------------------------------------------------------ arrays
    def _adopt(self, arrays: dict) -> dict:
        """The arguments (a dict of the caller's, made for the call: it is updated in
        place and returned) as backend arrays on the plan's device, or a clear error."""
        xp, lstm, index, kind = self._xp, self._lstm, self.device_index, self._executor.kind
        for name, a in arrays.items():
            if a is None:
                continue
            if not lstm and name in _C_NAMES:
                arrays[name] = None
                continue
            if type(a) is not xp.ndarray and type(a) is not dtypes.Bfloat16Bits:
                a, got = readable_kind(name, a)
                if got != kind:
                    raise TypeError(f"{name}: expected an array on {self.device} (the plan's "
                                    f"device), got one on {got}")
                arrays[name] = a = to_backend(xp, name, a)
            if index is not None and a.device.id != index:
                raise TypeError(f"{name}: expected an array on {self.device} (the plan's "
                                f"device), got one on cuda:{a.device.id}")
        return arrays


_C_NAMES = frozenset({"input_c", "output_c", "output_c_backprop"})  # LSTM only


def _addresses(kind, given, options):
    """``(addresses, options)`` of an address door's positional arguments `given`: one
    `kind` named tuple, or its fields as bare ints (the older form), either followed by
    the door's `options` positionally (their keyword values otherwise)."""
    if given and isinstance(given[0], kind):
        addresses, more = given[0], given[1:]
    else:
        count = len(kind._fields)
        if len(given) < count:
            raise TypeError(f"expected one {kind.__name__} or its {count} addresses, got "
                            f"{len(given)} positional arguments")
        addresses, more = kind(*given[:count]), given[count:]
    if len(more) > len(options):
        raise TypeError(f"too many positional arguments: {len(more)} after the addresses")
    return addresses, (*more, *options[len(more):])
