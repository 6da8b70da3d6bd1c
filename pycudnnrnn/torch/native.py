"""Eager CPU calls on PyTorch's own fused RNN kernels: ``torch.lstm``, ``gru``,
``rnn_tanh`` and ``rnn_relu``, which ``torch.nn``'s RNNs call.

They compute the op's function (cuDNN's cells, a GRU's reset gate after the product,
projection, packed lengths), with PyTorch's autograd and its oneDNN kernels, at the cost
of one dispatch; the op's own CPU backend (NumPy) is what the tests hold this route
against. What the op adds on top is done here:

* sequence lengths in any order, a length 0 among them: the rows that run are sorted and
  packed (so padding, NaN or not, is never read), and put back in the caller's order; a
  row of length 0 outputs zeros and keeps its initial state, as cuDNN;
* the op's layouts: batch-major states ``[B, L·D, ·]``, the flat params in cuDNN's layout
  (sliced into torch.nn's weights, views, so the gradient reaches the buffer).

What takes this route (``takes``): CPU tensors of float32 or float64 (one dtype), outside
``torch.compile``, ``torch.export`` and ONNX export (which see the op) and torch.func's
transforms (the op has their rules: ``vmap``), without autocast, and with a linear input
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

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..core import checks, layout
from ..core.checks import make_config

_KERNELS = {"lstm": torch.lstm, "gru": torch.gru, "rnn_tanh": torch.rnn_tanh,
            "rnn_relu": torch.rnn_relu}
_DTYPES = (torch.float32, torch.float64)


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
    return (_choice.kernels == "torch" and input.device.type == "cpu" and dtype in _DTYPES
            and input_mode == "linear_input" and all(w.dtype == dtype for w in weights)
            and not torch.is_autocast_enabled("cpu")
            and torch._C._functorch.maybe_current_level() is None
            and not torch.compiler.is_compiling() and not torch.compiler.is_exporting()
            and not torch.onnx.is_in_onnx_export())


def rnn(input, input_h, input_c, weights, has_biases, sequence_lengths, rnn_mode, direction,
        time_major, dropout=0.0, train=False, is_training=True):
    """``(output, output_h, output_c)`` as the op gives them, on PyTorch's kernels.

    Arguments in the op's layout and convention; `weights` torch.nn's list (`has_biases`
    as torch.nn's ``bias``), or ``[params]`` in cuDNN's layout (`has_biases` None).
    `dropout` and `train` as ``torch.nn``'s; `is_training` False is an inference call,
    whose results refuse a backward as the op's do.
    """
    if not is_training:
        with torch.no_grad():
            results = rnn(input, input_h, input_c, weights, has_biases, sequence_lengths,
                          rnn_mode, direction, time_major)
        sources = [t for t in (input, input_h, input_c, *weights)
                   if t is not None and t.requires_grad]
        if not (sources and torch.is_grad_enabled()):
            return results
        return tuple(_Inference.apply(r, *sources) for r in results)
    lstm = rnn_mode == "lstm"
    bidirectional = direction == "bidirectional"
    if sequence_lengths is not None:  # values in range, as the op checks them
        T, B = input.shape[:2] if time_major else input.shape[1::-1]
        checks.check_lengths(sequence_lengths.cpu().numpy(), B, T)
    if not time_major:  # the op's batch-major states are [B, L·D, ·]; torch.nn's [L·D, B, ·]
        input_h = input_h.transpose(0, 1)
        input_c = input_c.transpose(0, 1) if lstm else input_c
    num_layers = input_h.shape[0] // (2 if bidirectional else 1)
    if has_biases is None:
        weights, has_biases = _torch_weights(weights[0], rnn_mode, bidirectional, num_layers,
                                             input.shape[-1], input_c, input_h), True
    hx = [input_h, input_c] if lstm else input_h
    kernel = _KERNELS[rnn_mode]
    if sequence_lengths is None or bool((sequence_lengths == input.shape[0 if time_major
                                                                        else 1]).all()):
        output, *states = kernel(input, hx, weights, has_biases, num_layers, dropout, train,
                                 bidirectional, not time_major)
    else:
        output, states = _ragged(kernel, input, hx, weights, has_biases, num_layers, dropout,
                                 train, bidirectional, time_major, sequence_lengths, lstm)
    output_h = states[0]
    output_c = states[1] if lstm else output.new_empty((0,))
    if not time_major:
        output_h = output_h.transpose(0, 1)
        output_c = output_c.transpose(0, 1) if lstm else output_c
    return output, output_h, output_c


def _ragged(kernel, input, hx, weights, has_biases, num_layers, dropout, train,
            bidirectional, time_major, lengths, lstm):
    """The kernel on the rows that run, sorted and packed; results in the caller's order."""
    lengths = lengths.to(torch.int64)
    rows = torch.argsort(lengths, descending=True, stable=True)
    rows = rows[:int((lengths > 0).sum())]  # rows of length 0 run nothing
    batch_axis, T = (1, input.shape[0]) if time_major else (0, input.shape[1])
    states = hx if lstm else [hx]
    packed = pack_padded_sequence(input.index_select(batch_axis, rows), lengths[rows],
                                  batch_first=not time_major, enforce_sorted=True)
    running = [s.index_select(1, rows) for s in states]
    data, *finals = kernel(packed.data, packed.batch_sizes, running if lstm else running[0],
                           weights, has_biases, num_layers, dropout, train, bidirectional)
    output, _ = pad_packed_sequence(PackedSequence(data, packed.batch_sizes),
                                    batch_first=not time_major, total_length=T)
    B = input.shape[batch_axis]
    if rows.shape[0] == B:  # every row ran: only the order to undo
        inverse = torch.empty_like(rows)
        inverse[rows] = torch.arange(B)
        return (output.index_select(batch_axis, inverse),
                [f.index_select(1, inverse) for f in finals])
    shape = list(output.shape)
    shape[batch_axis] = B
    return (output.new_zeros(shape).index_copy(batch_axis, rows, output),
            [s.index_copy(1, rows, f) for s, f in zip(states, finals)])


def _torch_weights(params, rnn_mode, bidirectional, num_layers, input_size, input_c, input_h):
    """torch.nn's weights as views of the flat params (cuDNN's layout; gradients reach it)."""
    state_size, num_units = input_h.shape[-1], (input_c.shape[-1] if rnn_mode == "lstm"
                                                 else input_h.shape[-1])
    config = make_config(rnn_mode=rnn_mode, num_layers=num_layers, num_units=num_units,
                         input_size=input_size, input_mode="linear_input",
                         direction="bidirectional" if bidirectional else "unidirectional",
                         num_proj=state_size if state_size != num_units else 0)
    weights = []
    for blocks in layout.pseudo_layer_blocks(config):
        for block in (blocks.w_input, blocks.w_recurrent, blocks.b_input, blocks.b_recurrent,
                      blocks.w_projection):
            if block is not None:
                size = block.shape[0] * (block.shape[1] if len(block.shape) == 2 else 1)
                weights.append(params[block.offset:block.offset + size].view(block.shape))
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
