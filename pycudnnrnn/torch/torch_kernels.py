"""Eager CPU calls (and CUDA ones with cuDNN off) on PyTorch's own fused RNN kernels:
``torch.lstm``, ``gru``, ``rnn_tanh`` and ``rnn_relu``, which ``torch.nn``'s RNNs call.

They compute the op's function (cuDNN's cells, a GRU's reset gate after the product,
projection, packed lengths), with PyTorch's autograd and its oneDNN kernels, at the cost
of one dispatch; the op's own CPU backend (NumPy) is what the tests hold this route
against. What the op adds on top is done here:

* sequence lengths in any order, a length 0 among them: the rows that run are sorted
  (ties in the caller's order; a PackedSequence's rows in its own) and packed (so
  padding, NaN or not, is never read), and put back in the caller's order; a row of
  length 0 outputs zeros and keeps its initial state, as cuDNN. A ragged call that
  records a gradient takes the full-length kernel where that is faster (``_ragged_route``:
  PyTorch's autograd of its kernel for packed rows is a per-step loop): a large LSTM as
  runs between consecutive lengths, a GRU or RNN on zeroed padding;
* the op's layouts: batch-major states ``[B, L·D, ·]``, the flat params in cuDNN's layout
  (sliced into torch.nn's weights, views, so the gradient reaches the buffer).

What takes this route (``takes``): CPU tensors of float32 or float64 (one dtype), and CUDA
ones of any floating dtype while ``torch.backends.cudnn`` is disabled (as ``torch.nn``'s
RNNs then leave cuDNN for PyTorch's kernels: their masks and their double backward),
outside ``torch.compile``, ``torch.export`` and ONNX export (which see the op) and
torch.func's transforms (the op has their rules: ``vmap``), without autocast, and with a
linear input
(``skip_input`` has no ``torch.nn`` weights). Dropout masks on this route are PyTorch's,
drawn as ``torch.nn``'s RNNs draw them: the modules take it with dropout (their masks
come from PyTorch's generator either way); ``rnn`` with a dropout seed keeps the op, whose
masks that seed fixes. An inference call (``rnn(is_training=False)``) keeps the op's
contract: no backward. Double backward works here, as for ``torch.nn``'s RNNs on the CPU.

``set_cpu_kernels("numpy")`` (or ``with cpu_kernels("numpy"):``) sends every CPU call to
the op and its NumPy backend instead: the function the tests hold this route against,
and a dropout mask fixed by the seed for the modules too.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..core import checks, layout, reserve_header
from ..core.checks import make_config

_KERNELS = {"lstm": torch.lstm, "gru": torch.gru, "rnn_tanh": torch.rnn_tanh,
            "rnn_relu": torch.rnn_relu}
DTYPES = (torch.float32, torch.float64)
CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class _Choice(threading.local):
    kernels = "torch"


_choice = _Choice()
_KINDS = ("torch", "numpy")


def set_cpu_kernels(kind: str) -> None:
    """Which kernels eager CPU calls run on, in this thread: ``"torch"`` (PyTorch's own,
    the default) or ``"numpy"`` (the op and its NumPy backend)."""
    if kind not in _KINDS:
        raise ValueError(f"kind: expected 'torch' or 'numpy', got {kind!r}")
    _choice.kernels = kind


@contextlib.contextmanager
def cpu_kernels(kind: str):
    """``set_cpu_kernels(kind)`` for the block, then the previous choice again."""
    previous = _choice.kernels
    set_cpu_kernels(kind)
    try:
        yield
    finally:
        _choice.kernels = previous


def takes(input, weights, input_mode="linear_input") -> bool:
    """Whether a call on `input` and `weights` runs on PyTorch's kernels (see the module
    docstring); where not, the op runs and its checks name what is wrong."""
    dtype = input.dtype
    # Cheapest first: this is asked at every call. (Either ONNX exporter traces: TorchScript's
    # with torch.jit, the other with torch.export.)
    return (_choice.kernels == "torch"
            and (input.is_cpu and dtype in DTYPES
                 or input.is_cuda and dtype in CUDA_DTYPES and not torch.backends.cudnn.enabled)
            and input.numel() > 0
            and input_mode == "linear_input" and all(w.dtype == dtype for w in weights)
            and torch._C._functorch.maybe_current_level() is None
            and not torch.compiler.is_exporting() and not torch.compiler.is_compiling()
            and not torch.jit.is_tracing()
            and not torch.is_autocast_enabled(input.device.type))


def rnn(input, input_h, input_c, weights, has_biases, sequence_lengths, rnn_mode, direction,
        time_major, dropout=0.0, dropout_active=False, is_training=True, zero_states=False,
        torch_states=False, input_mode="linear_input", order=None):
    """``(output, output_h, output_c)`` as the op gives them, on PyTorch's kernels.

    Arguments in the op's layout and convention; `weights` torch.nn's list (`has_biases`
    as torch.nn's ``bias``), or ``[params]`` in cuDNN's layout (`has_biases` None).
    `dropout`: torch.nn's p; `dropout_active`: whether its masks are drawn (the ``train``
    argument of torch.nn's kernels: its module's training mode). `is_training` False, the
    op's attribute, is an inference call, whose results refuse a backward as the op's do.
    `zero_states`: the initial states are zeros (then not reordered for packing).
    `torch_states`: states in and out are ``[L·D, B, ·]`` even when batch-major, as
    torch.nn's (no transposes either way).
    `input_mode` "skip_input" (flat params only): layer 0 adds its input to every gate, as
    an input matrix of stacked identities would (what ``second_order`` recomputes with).
    `order`: the rows' order for PyTorch's kernel on packed rows (a PackedSequence's
    ``sorted_indices``: torch.nn's kernel runs them so); by default by length, longest
    first, ties in the caller's order.
    """
    if not is_training:
        with torch.no_grad():
            results = rnn(input, input_h, input_c, weights, has_biases, sequence_lengths,
                          rnn_mode, direction, time_major, zero_states=zero_states,
                          torch_states=torch_states, order=order)
        sources = [t for t in (input, input_h, input_c, *weights)
                   if t is not None and t.requires_grad]
        if not (sources and torch.is_grad_enabled()):
            return results
        return tuple(_Inference.apply(r, *sources) for r in results)
    lstm = rnn_mode == "lstm"
    bidirectional = direction == "bidirectional"
    ragged = empty = False
    if sequence_lengths is not None:  # they steer the packing: host int64, once checked
        sequence_lengths = sequence_lengths.cpu()
        ragged, empty = _ragged_lengths(sequence_lengths, input, time_major)
        sequence_lengths = sequence_lengths.to(torch.int64)
    transpose = not (time_major or torch_states)
    if transpose:  # the op's batch-major states are [B, L·D, ·]; torch.nn's [L·D, B, ·]
        # (contiguous: PyTorch's LSTM with a projection views them)
        input_h = input_h.transpose(0, 1).contiguous()
        input_c = input_c.transpose(0, 1).contiguous() if lstm else input_c
    num_layers = input_h.shape[0] // (2 if bidirectional else 1)
    if has_biases is None:
        weights, has_biases = [w for _, w in _torch_weights(
            weights[0], rnn_mode, bidirectional, num_layers, input.shape[-1], input_c,
            input_h, input_mode)], True
    hx = [input_h, input_c] if lstm else input_h
    kernel = _KERNELS[rnn_mode]
    if empty and not sequence_lengths.any():  # no row runs
        output, states = _none_runs(input, hx if lstm else [hx], weights, bidirectional)
    elif not ragged:
        output, *states = kernel(input, hx, weights, has_biases, num_layers, dropout,
                                 dropout_active, bidirectional, not time_major)
    elif (route := _ragged_route(rnn_mode, input, hx, weights, time_major, sequence_lengths,
                                 bool(dropout) and dropout_active and num_layers > 1)) == "runs":
        output, states = _runs(kernel, input, hx if lstm else [hx], weights, has_biases,
                               bidirectional, time_major, sequence_lengths)
    elif route == "zeroed":
        output, states = _zeroed_padding(kernel, input, hx, weights, has_biases,
                                         bidirectional, time_major, sequence_lengths)
    else:
        output, states = _ragged(kernel, input, hx, weights, has_biases, num_layers, dropout,
                                 dropout_active, bidirectional, time_major, sequence_lengths,
                                 lstm, zero_states, empty, order)
    output_h = states[0]
    output_c = states[1] if lstm else output.new_empty((0,))
    if transpose:
        output_h = output_h.transpose(0, 1)
        output_c = output_c.transpose(0, 1) if lstm else output_c
    return output, output_h, output_c


def packed(sequence, h0, c0, weights, has_biases, rnn_mode, bidirectional, dropout):
    """torch.nn's own training call on PackedSequence `sequence`, its rows in the order it
    packed them (its dropout masks fall on the rows torch.nn's fall on): ``(output, h_n,
    c_n)``, output a PackedSequence like `sequence`, c_n empty unless LSTM; checked
    states in torch.nn's layout, in the caller's row order."""
    lstm = rnn_mode == "lstm"
    order, unorder = sequence.sorted_indices, sequence.unsorted_indices
    states = [s if order is None else s.index_select(1, order) for s in (h0, c0)[:1 + lstm]]
    data, *finals = _KERNELS[rnn_mode](
        sequence.data, sequence.batch_sizes, states if lstm else states[0], weights,
        has_biases, h0.shape[0] // (2 if bidirectional else 1), dropout, True, bidirectional)
    finals = [f if unorder is None else f.index_select(1, unorder) for f in finals]
    output = PackedSequence(data, sequence.batch_sizes, order, unorder)
    return output, finals[0], finals[1] if lstm else data.new_empty((0,))


def _ragged_lengths(lengths, input, time_major) -> tuple[bool, bool]:
    """``(ragged, empty)``: whether `lengths` leave any row short of max_time, and any of
    length 0; out of ``[0, max_time]``, or not one per row, the op's ValueError. (One
    reduction in the common case: asked per call.)"""
    T, B = (input.shape[0], input.shape[1]) if time_major else (input.shape[1], input.shape[0])
    if lengths.shape == (B,):
        # (aminmax has no unsigned kernels; a uint64 past int64 reads negative: refused)
        low, high = (int(v) for v in torch.aminmax(lengths.to(torch.int64)))
        if 0 <= low and high <= T:
            return low < T, low == 0
    checks.check_lengths(lengths.cpu().numpy(), B, T)  # raises, naming the value
    raise AssertionError("unreachable: check_lengths refuses what is out of range")


def _ragged(kernel, input, hx, weights, has_biases, num_layers, dropout, dropout_active,
            bidirectional, time_major, lengths, lstm, zero_states, empty, order=None):
    """The kernel on packed rows, results in the caller's order (``torch.nn``'s recipe for
    a PackedSequence of unsorted lengths); rows of length 0, which packing refuses, are
    left out of it and keep their state.

    The rows run in `order` (see ``rnn``), by default sorted stably: the weights'
    gradients sum over the rows in the order they run, so tied rows taken in another
    order than torch.nn's (an unstable sort's) give other roundings."""
    batch_axis, T = (1, input.shape[0]) if time_major else (0, input.shape[1])
    states = hx if lstm else [hx]
    order = torch.sort(lengths, descending=True, stable=True).indices if order is None \
        else order.cpu()
    if empty:  # run the others; their results go back among the empty rows' below
        order = order[lengths[order] > 0]
    rows = order.to(input.device)
    packed = pack_padded_sequence(input.index_select(batch_axis, rows), lengths[order],
                                  batch_first=not time_major, enforce_sorted=True)
    sorted_states = [s[:, :len(order)] if zero_states else s.index_select(1, rows)
                     for s in states]
    data, *finals = kernel(packed.data, packed.batch_sizes,
                           sorted_states if lstm else sorted_states[0], weights, has_biases,
                           num_layers, dropout, dropout_active, bidirectional)
    if not empty:
        unsorted = torch.argsort(rows)
        output, _ = pad_packed_sequence(
            PackedSequence(data, packed.batch_sizes, rows, unsorted),
            batch_first=not time_major, total_length=T)
        return output, [f.index_select(1, unsorted) for f in finals]
    output, _ = pad_packed_sequence(PackedSequence(data, packed.batch_sizes),  # in `rows`' order
                                    batch_first=not time_major, total_length=T)
    shape = list(output.shape)
    shape[batch_axis] = states[0].shape[1]
    return (output.new_zeros(shape).index_copy(batch_axis, rows, output),
            [s.index_copy(1, rows, f) for s, f in zip(states, finals)])


def _none_runs(input, states, weights, bidirectional):
    """``(output, states)`` of a batch whose rows all have length 0: zeros, and the states
    as they came. Tied to the input and weights (``zero_tie``): a backward reaches them
    with zero gradients, and the states' gradients reach the initial states."""
    tie = zero_tie(input, *weights)
    shape = (*input.shape[:-1], states[0].shape[-1] * (2 if bidirectional else 1))
    return input.new_zeros(shape) + tie, [s + tie for s in states]


def zero_tie(*tensors):
    """A zero scalar that depends on `tensors` for autograd (a sum of none of their
    elements, so exactly 0 whatever they hold): added to a result computed without them,
    it gives them zero gradients, as a computation that reads them would."""
    return sum(t.reshape(-1)[:0].sum() for t in tensors)


#: Batch × state size from which a ragged LSTM call that records a gradient runs as runs
#: of the full-length kernel (``_runs``). Measured (docs/performance.md): a training
#: step of T64 B32 H256 takes 46–54 ms this way against 63–67 ms on the packed kernel,
#: T128 B64 H512 0.68–0.78 s against 2.5–2.8 s; T32 B16 H64 10–12 ms against 7 ms.
RUNS_FROM = 32 * 256
#: The most steps × rows over the sum of lengths with which a ragged GRU or RNN call that
#: records a gradient runs the full-length kernel on zeroed padding (``_zeroed_padding``),
#: computing the padding's steps too. Measured with lengths from T down to T/4 (1.6): GRU
#: steps of T32 B16 H64 4.3 ms against 5.2 ms packed, T128 B64 H512 0.56 s against 0.95 s,
#: tanh RNN 2.0 against 2.7 ms and 0.18 against 0.36 s; level at T64 B32 H256.
ZEROED_UP_TO = 2.0


def _ragged_route(rnn_mode, input, hx, weights, time_major, lengths, dropout) -> str:
    """How a ragged call runs: ``"packed"`` (PyTorch's kernel for packed rows), ``"runs"``
    (``_runs``) or ``"zeroed"`` (``_zeroed_padding``). PyTorch's autograd of its
    kernel for packed rows is a per-step loop: calls that record a gradient and draw no
    dropout mask (drawn on the packed rows, as torch.nn's kernel draws it) take the
    full-length kernel instead where it is faster; without a gradient it is as fast.
    Inside torch.func's transforms (the second order's recomputations) the kernel for
    packed rows fails ("Cannot access data pointer of Tensor that doesn't have
    storage"): there every call without dropout takes the full-length kernel."""
    lstm = rnn_mode == "lstm"
    states = hx if lstm else [hx]
    transformed = torch._C._functorch.maybe_current_level() is not None
    if dropout or not (transformed or torch.is_grad_enabled()
                       and any(t.requires_grad for t in (input, *states, *weights))):
        return "packed"
    T, B = (input.shape[0], input.shape[1]) if time_major else (input.shape[1], input.shape[0])
    if lstm:
        return "runs" if transformed or B * states[-1].shape[-1] >= RUNS_FROM else "packed"
    # Not a relu RNN: its state is unbounded, and a row's steps past its end could grow
    # until they overflow, where inf · 0 in the weight gradients' products is NaN. (A GRU's
    # state is a blend of tanh and the state before: bounded by the row's last one.)
    zeroed = rnn_mode != "rnn_relu" and T * B <= ZEROED_UP_TO * int(lengths.sum())
    return "zeroed" if zeroed else "runs" if transformed else "packed"


def _runs(kernel, input, states, weights, has_biases, bidirectional, time_major, lengths):
    """``(output, states)`` of a ragged batch (`states`: ``[h, c]`` of an LSTM, ``[h]``
    else), each layer and direction as runs of the full-length kernel: rows sorted by
    length, one run for the steps between two consecutive lengths, on the rows still
    going. Padding is never read; a row of length 0 keeps its states, and outputs
    zeros."""
    x = input if time_major else input.transpose(0, 1)  # [T, B, ·] from here on
    order = torch.argsort(lengths, descending=True, stable=True)
    lengths = lengths[order]
    stops = sorted(set(lengths.tolist()) - {0})
    going = [int((lengths >= stop).sum()) for stop in stops]  # rows in each run
    states = [s.index_select(1, order) for s in states]
    per = _per_direction(weights, states[0])
    output, finals = _layers(x.index_select(1, order), lengths, len(states[0]), bidirectional,
                             lambda k, source: _layer_runs(
                                 kernel, source, [s[k:k + 1] for s in states],
                                 weights[k * per:(k + 1) * per], has_biases, stops, going))
    unsort = torch.argsort(order)
    output = output.index_select(1, unsort)
    return (output if time_major else output.transpose(0, 1),
            [torch.cat([f[i] for f in finals]).index_select(1, unsort)
             for i in range(len(states))])


def _zeroed_padding(kernel, input, h0, weights, has_biases, bidirectional, time_major,
                    lengths):
    """``(output, [h_n])`` of a ragged GRU or RNN batch, each layer and direction one call
    of the full-length kernel on the padding zeroed. A step past a row's length changes
    none of its earlier outputs, nor their gradients (it receives none); the row's final
    state is its output at its last step. Padding is never read; a row of length 0 keeps
    its state, and runs its dropped steps from zeros."""
    x = input if time_major else input.transpose(0, 1)  # [T, B, ·] from here on
    T, B = x.shape[:2]
    valid = (torch.arange(T)[:, None] < lengths)[..., None]
    last = (lengths - 1).clamp(min=0)[None, :, None]
    ran = (lengths > 0)[:, None]
    per = _per_direction(weights, h0)

    def direction(k, source):
        # A row of length 0 runs from zeros: its state may hold anything (NaN, inf), which
        # its dropped steps would carry into the weight gradients' products.
        start = torch.where(ran, h0[k], 0.0)[None]
        y, _ = kernel(source, start, weights[k * per:(k + 1) * per], has_biases, 1, 0.0,
                      False, False, False)
        end = y.gather(0, last.expand(1, B, y.shape[-1]))[0]
        return torch.where(valid, y, 0.0), [torch.where(ran, end, h0[k])]

    output, finals = _layers(torch.where(valid, x, 0.0), lengths, len(h0), bidirectional,
                             direction)
    return (output if time_major else output.transpose(0, 1),
            [torch.stack([f[0] for f in finals])])


def _per_direction(weights, h0):
    """How many of torch.nn's weights a layer and direction has: they come a layer and
    direction at a time (w_ih, w_hh, the biases, w_hr)."""
    return len(weights) // len(h0)


def _layers(x, lengths, count, bidirectional, direction):
    """``(output, finals)`` of a ragged batch's `count` layers and directions on `x`
    (time-major): ``direction(k, source)`` runs the k-th forward in time on `source`,
    giving ``(output, final states)``. The reverse direction gets each row reversed
    within its length (padding in place: an involution), and its output reversed back.
    `finals`: each layer and direction's final states, in torch.nn's order."""
    if bidirectional:  # (the lengths are on the host; the index goes where `x` is)
        steps = torch.arange(x.shape[0])[:, None]
        flip = torch.where(steps < lengths, lengths - 1 - steps, steps).to(x.device)[..., None]
    directions = 2 if bidirectional else 1
    finals = []
    for layer in range(count // directions):
        outputs = []
        for k in range(layer * directions, (layer + 1) * directions):
            reverse = k % directions == 1
            y, ends = direction(k, x.gather(0, flip.expand_as(x)) if reverse else x)
            outputs.append(y.gather(0, flip.expand_as(y)) if reverse else y)
            finals.append(ends)
        x = torch.cat(outputs, -1) if bidirectional else outputs[0]
    return x, finals


def _layer_runs(kernel, x, states, weights, has_biases, stops, going):
    """One layer and direction of ``_runs``: ``(output, final states)``. `x`: rows
    sorted by length, longest first; `stops`: the distinct nonzero lengths, ascending;
    `going`: how many rows each run takes (those of length at least its stop)."""
    T, B = x.shape[:2]
    outputs, ends, start, now = [], [[] for _ in states], 0, states
    for stop, rows, after in zip(stops, going, going[1:] + [0]):
        hx = [s[:, :rows] for s in now]
        y, *now = kernel(x[start:stop, :rows], hx if len(hx) == 2 else hx[0], weights,
                         has_biases, 1, 0.0, False, False, False)
        outputs.append(torch.nn.functional.pad(y, (0, 0, 0, B - rows)))
        for end, s in zip(ends, now):
            end.append(s[:, after:])  # the rows whose last step this was
        start = stop
    if start < T:
        outputs.append(x.new_zeros((T - start, B, states[0].shape[-1])))
    rest = going[0] if going else 0  # rows of length 0: their states as they came
    finals = [torch.cat([*reversed(end), s[:, rest:]], 1) for end, s in zip(ends, states)]
    return torch.cat(outputs), finals


def _torch_weights(params, rnn_mode, bidirectional, num_layers, input_size, input_c, input_h,
                   input_mode="linear_input"):
    """torch.nn's weights as views of the flat params (cuDNN's layout; gradients reach it):
    ``[(offset, view), ...]`` in torch.nn's order; states in torch.nn's layout. With
    `input_mode` "skip_input", layer 0's input matrices (which params lacks) are stacked
    identities, constants at offset None."""
    state_size, num_units = input_h.shape[-1], (input_c.shape[-1] if rnn_mode == "lstm"
                                                 else input_h.shape[-1])
    config = make_config(rnn_mode=rnn_mode, num_layers=num_layers, num_units=num_units,
                         input_size=input_size, input_mode=input_mode,
                         direction="bidirectional" if bidirectional else "unidirectional",
                         num_proj=state_size if state_size != num_units else 0)
    weights = []
    for blocks in layout.pseudo_layer_blocks(config):
        if blocks.w_input is None:  # skip input: x reaches every gate as it is
            gates = blocks.w_recurrent.shape[0] // num_units
            weights.append((None, torch.eye(num_units, dtype=params.dtype,
                                            device=params.device).repeat(gates, 1)))
        for block in (blocks.w_input, blocks.w_recurrent, blocks.b_input, blocks.b_recurrent,
                      blocks.w_projection):
            if block is not None:
                size = block.shape[0] * (block.shape[1] if len(block.shape) == 2 else 1)
                weights.append((block.offset,
                                params[block.offset:block.offset + size].view(block.shape)))
    return weights


class _Inference(torch.autograd.Function):
    """Identity on an inference call's result, tied to what required grad: its backward
    is refused, as the op's inference forward refuses one (it keeps nothing to run it)."""

    @staticmethod
    def forward(result, *sources):
        return result.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("pycudnnrnn: backward needs forward with is_training=True (the "
                           "modules do this by themselves when a gradient is needed)")


# --------------------------------------------------------------------------- the op's kernels
#
# Compiled, exported and transformed calls see the op (torch.ops.pycudnnrnn.forward and
# backprop), whose CPU kernels run PyTorch's kernels too where they compute its function.
# A kernel runs below autograd, so forward records its graph with autograd switched back on
# (as PyTorch's own invoke_leaf_function does) and keeps it under its reserve space's
# address (the reserve's bytes are the same at every call: the op stays a function of its
# inputs); backprop runs autograd on that graph, or on a graph made again for a reserve
# space whose graph is gone (a copy of one, a pickle, or run already). The graph lives as
# long as the reserve space, but for the ops' autograd formula (its own reserve space and
# inputs): there backprop runs it once, freeing it as it goes, as a backward does.

#: The reserve space of a forward on PyTorch's kernels: the identity header alone
#: (core.reserve_header: this route's magic, then the call's fingerprint).
RESERVE_NBYTES = reserve_header.IDENTITY_BYTES
_MAGIC = b"pycudnnrnn:torch"
_graphs: dict = {}
_AUTOGRAD_KEYS = [key for name, key in torch._C.DispatchKey.__members__.items()
                  if name.startswith("Autograd") or name == "ADInplaceOrView"]


def runs_kernels(problem) -> bool:
    """Whether the op's CPU kernels for `problem` (a validated one) run on PyTorch's
    kernels: float32 or float64, a linear input, no dropout mask drawn, a batch, and
    PyTorch's kernels chosen (``set_cpu_kernels``: before compiling, since the reserve
    space's size follows)."""
    return (_choice.kernels == "torch" and problem.dtype.name in ("float32", "float64")
            and not problem.config.skip_input and not problem.dropout_layers
            and problem.batch_size > 0 and _FORCE_GUARD is not None)


_FORCE_GUARD = getattr(torch._C, "_ForceDispatchKeyGuard", None)


@contextlib.contextmanager
def _autograd():
    """Autograd on, inside an op's kernel (which runs with it excluded)."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    with _FORCE_GUARD(torch._C._dispatch_tls_local_include_set(),
                      _autograd_taken_out(exclude)), torch.enable_grad():
        yield


def _autograd_taken_out(exclude):
    """Excluded dispatch key set `exclude` with autograd's keys taken out of it.

    Remembered by the set's raw value where PyTorch gives it (a kernel meets few sets,
    and taking out each key costs a call: this runs twice a training step).
    """
    if not _RAW_KEY_SETS:
        return _take_out_autograd(exclude)
    raw = exclude.raw_repr()
    found = _taken_out.get(raw)
    if found is None:
        found = _taken_out[raw] = _take_out_autograd(exclude).raw_repr()
    return torch._C.DispatchKeySet.from_raw_repr(found)


def _take_out_autograd(exclude):
    for key in _AUTOGRAD_KEYS:
        exclude = exclude.remove(key)
    return exclude


_RAW_KEY_SETS = hasattr(torch._C.DispatchKeySet, "from_raw_repr")
_taken_out: dict = {}  # raw excluded key set → the same with autograd's keys taken out


def _graph(input, input_h, input_c, params, lengths, attributes):
    """``(leaves, offsets, results)``: the forward on PyTorch's kernels, recorded for
    backprop. Leaves: input, input_h, input_c, then each of torch.nn's weights on its own,
    at `offsets` in the flat params: views of `params`, or the weights themselves when
    `params` is ``flat_weights.Weights`` with biases (a gradient reaching params through
    views would make a zero-padded copy of the whole buffer per weight)."""
    if not (isinstance(params, torch.Tensor) or params.has_biases):
        # Zero biases as leaves: the flat gradient holds theirs, as every backend's does.
        params = params.flat()
    offsets, weights, has_biases = _op_weights(params, input, input_h, input_c, attributes)
    leaves = [None if t is None else t.detach().requires_grad_()
              for t in (input, input_h, input_c, *weights)]
    with _autograd():
        results = rnn(*leaves[:3], leaves[3:], has_biases, lengths, attributes.rnn_mode,
                      attributes.direction, attributes.time_major)
    return leaves, offsets, results


def _op_weights(params, input, input_h, input_c, attributes):
    """``(offsets, weights, has_biases)``: the op's `params` as torch.nn's weights and
    where each lies in the flat params. Flat params (states in the op's layout) are sliced
    into views; ``flat_weights.Weights`` are taken as they are."""
    if not isinstance(params, torch.Tensor):
        return params.offsets, params.tensors, params.has_biases
    states = [t if attributes.time_major or t is None else t.transpose(0, 1)
              for t in (input_h, input_c)]
    bidirectional = attributes.direction == "bidirectional"
    offsets, weights = zip(*_torch_weights(
        params, attributes.rnn_mode, bidirectional,
        states[0].shape[0] // (2 if bidirectional else 1), input.shape[-1],
        states[1] if attributes.lstm else None, states[0]))
    return list(offsets), list(weights), True


def forward_kernel(problem, input, input_h, input_c, params, lengths, attributes):
    """The op's forward on CPU tensors for a validated `problem` (its lengths the host's):
    ``(output, output_h, output_c, reserve_space)``, fresh tensors with the fakes' strides.
    `params`: the flat params, or ``flat_weights.Weights``."""
    if not problem.is_training or torch.is_inference_mode_enabled():  # nothing to record
        _, weights, has_biases = _op_weights(params, input, input_h, input_c, attributes)
        with torch.no_grad():
            results = rnn(input, input_h, input_c, weights, has_biases, lengths,
                          attributes.rnn_mode, attributes.direction, attributes.time_major)
        leaves = offsets = None
    else:
        leaves, offsets, results = _graph(input, input_h, input_c, params, lengths,
                                          attributes)
    if not problem.is_training:
        reserve = input.new_empty((0,), dtype=torch.uint8)
    else:
        head = reserve_header.header(problem, _MAGIC)
        reserve = torch.frombuffer(bytearray(head), dtype=torch.uint8)
        if leaves is not None:
            key = reserve.data_ptr()
            _graphs[key] = (head, leaves, offsets, results)
            weakref.finalize(reserve, _graphs.pop, key, None)
    # Copies: the graph keeps its own results (an in-place write into ours would fail
    # its backprop, or change it).
    return (*(r.detach().clone(memory_format=torch.contiguous_format) for r in results),
            reserve)


def runs_backprop(reserve_space) -> bool:
    """Whether `reserve_space` is one a forward on PyTorch's kernels made (by its magic;
    ``backprop_kernel`` checks the rest of its identity)."""
    return reserve_space is not None and reserve_space.dtype == torch.uint8 and \
        reserve_space.dim() == 1 and reserve_space.numel() >= len(_MAGIC) and \
        (reserve_space.data_ptr() in _graphs or
         bytes(reserve_space[:len(_MAGIC)].cpu().numpy()) == _MAGIC)


def backprop_kernel(problem, input, input_h, input_c, params, lengths, grads, reserve_space,
                    attributes, gradients, own=False):
    """The op's backprop on CPU tensors for the forward that made `reserve_space`, of the
    validated `problem` (refused, as the other backends refuse it, when its identity is
    another call's): ``(dx, dh, dc, dparams)``, None for the gradients `gradients` leaves
    out (and dc unless LSTM).

    `own`: the reserve space is the forward's own, with its inputs (the ops' autograd
    formula): its graph then runs once, freed as it goes (a second backprop records it
    again from the same inputs), and its header is not read back. Otherwise the graph
    is kept for the next backprop, which gets the same results."""
    key = reserve_space.data_ptr()
    entry = _graphs.pop(key, None) if own else _graphs.get(key)
    head = entry[0] if own and entry is not None else \
        bytes(reserve_space[:RESERVE_NBYTES].cpu().numpy())
    reserve_header.check(head, "uint8", reserve_space.numel(), RESERVE_NBYTES, problem,
                         _MAGIC, "PyTorch-kernel")
    if entry is None:  # its graph is gone (run already, a copy of the reserve, a pickle)
        entry = head, *_graph(input, input_h, input_c, params, lengths, attributes)
    _, leaves, offsets, results = entry
    lstm = attributes.lstm
    data, weights = gradients in ("all", "data"), gradients in ("all", "weights")
    data_wanted = [k for k, needed in enumerate((data, data, data and lstm)) if needed]
    wanted = [leaves[k] for k in data_wanted] + (leaves[3:] if weights else [])
    # (A result that does not depend on the inputs, every row of length 0's output, has
    # no graph: its gradient reaches nothing.)
    used = [(r, g) for r, g in zip(results, grads)
            if g is not None and r.numel() and r.requires_grad]
    # A gradient of zeros, what the autograd formula passes for a result the loss does not
    # use, adds nothing: left out, its path back is not run, as autograd skips an unused
    # result's. (Not all of them: zeros alone still run, so that 0 · inf gives NaN, as
    # torch.nn's and the NumPy backend's backward do.)
    nonzero = [(r, g) for r, g in used if _nonzero(g)]
    used = nonzero or used
    with _autograd():
        found = torch.autograd.grad([r for r, _ in used], wanted, [g for _, g in used],
                                    retain_graph=not own, allow_unused=True) if used else \
            [None] * len(wanted)
    found = [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(wanted, found)]
    out = [None] * 4
    for k, g in zip(data_wanted, found):
        out[k] = g.contiguous()
    if weights:  # one flat gradient in cuDNN's layout, which the weights' blocks tile
        parts = sorted(zip(offsets, found[len(data_wanted):]), key=lambda part: part[0])
        out[3] = torch.cat([g.reshape(-1) for _, g in parts])
    return tuple(out)


def _nonzero(tensor) -> bool:
    """Whether `tensor` (a checked gradient: detached, on the CPU, float32 or float64, not
    empty) holds a nonzero value or NaN.

    Through NumPy, whose ``any`` costs a fraction of PyTorch's on a large tensor, the
    first element looked at first (a loss's gradient is nonzero there as a rule): this
    runs for every gradient of every training step.
    """
    values = tensor.resolve_neg().numpy()
    return bool(values.flat[0]) or bool(values.any())
