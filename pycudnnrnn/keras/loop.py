"""One Keras recurrent layer's loop as one call of pycudnnrnn's op.

``run`` takes what ``keras.layers.LSTM.inner_loop`` / ``GRU.inner_loop`` take and returns
what they return, ``(last_output, outputs, states)``, with Keras's meaning of masks:

* A masked step leaves the state unchanged. With any mask (right-padded, left-padded or
  with holes) that is the RNN run over the unmasked steps alone, in their order, so the
  steps are gathered to the front (a stable reordering: the identity for a right-padded
  mask) and the op runs once with ``sequence_lengths`` = the unmasked counts.
* The output of a masked step is 0 with ``zero_output_for_mask=True`` (as
  ``Bidirectional`` sets when it returns sequences); otherwise the previous step's
  output, and before any unmasked step what the backend's own loop carries there: the
  initial ``h`` on JAX, zeros on PyTorch.
* ``go_backwards`` reverses the time axis first; outputs come in processing order, as
  Keras returns them.

``run_bidirectional`` runs a ``Bidirectional`` pair (forward, and backward with
``go_backwards``) as one bidirectional call on the same compacted steps: the op's reverse
direction runs each sequence's unmasked steps from the last to the first, which is
exactly what the backward layer processes.

The weights enter as Keras holds them (``kernel`` [in, G·H], ``recurrent_kernel``
[H, G·H], ``bias``) and are gathered into cuDNN's params layout in the graph, so
gradients reach the Keras variables. The gather's indices come from
``pycudnnrnn.convert.from_keras`` applied to index arrays: the layout is the library's
own, not a second copy of it.

On TensorFlow the op is written in TensorFlow's operations (``pycudnnrnn.tensorflow``),
so there is no buffer to fill: its graph takes Keras's weights as they are
(``_tensorflow_op``), with about half the operations around its loops. Where TensorFlow's
cuDNN kernel can run it (a GPU), the layer takes the other backends' path instead: the
kernel takes a params buffer and lengths.
"""

from __future__ import annotations

import functools

import numpy as np
from keras import backend, ops

from .. import convert

_GATES = {"lstm": 4, "gru": 3}


@functools.lru_cache(maxsize=64)
def params_index(rnn_mode: str, input_size: int, units: int, directions: int = 1) -> np.ndarray:
    """Where each params element comes from in ``[0, kernel, recurrent_kernel, bias]``
    (twice, forward then backward, for two directions).

    Index 0 is a zero: a Keras LSTM has one bias, which becomes cuDNN's input bias, and
    the recurrent bias is zero (as ``convert.from_keras`` converts it).
    """
    G = _GATES[rnn_mode]
    shapes = [(input_size, G * units), (units, G * units),
              (2, G * units) if rnn_mode == "gru" else (G * units,)] * directions
    sizes = [int(np.prod(s)) for s in shapes]
    ids = np.arange(1, 1 + sum(sizes), dtype=np.float64)  # exact in float64
    pieces = np.split(ids, np.cumsum(sizes)[:-1])
    params, _ = convert.from_keras([p.reshape(s) for p, s in zip(pieces, shapes)],
                                   rnn_mode=rnn_mode,
                                   direction="bidirectional" if directions == 2 else "unidirectional")
    index = params.astype(np.int64)
    assert np.array_equal(index, params) and index.max() == sum(sizes)  # a permutation + zeros
    return index


def keras_params(rnn_mode, weights, dtype):
    """The Keras weights gathered into the op's opaque params, differentiably.

    `weights` is ``[(kernel, recurrent_kernel, bias)]``, one triple per direction.
    """
    weights = [[ops.cast(w, dtype) for w in triple] for triple in weights]
    kernel, recurrent_kernel = weights[0][:2]
    index = params_index(rnn_mode, int(kernel.shape[0]), int(recurrent_kernel.shape[0]),
                         len(weights))
    flat = ops.concatenate([ops.zeros((1,), dtype)] +
                           [ops.reshape(w, (-1,)) for triple in weights for w in triple])
    return ops.take(flat, ops.convert_to_tensor(index, "int32"), axis=0)


def _op(rnn_mode, x, h0, c0, params, lengths, direction="unidirectional"):
    """pycudnnrnn's op on the current Keras backend, batch-major, one layer."""
    name = backend.backend()
    if name == "jax":
        from ..jax import rnn
        # is_training=True always: under JAX we cannot tell whether a gradient will be
        # asked for, and an inference call cannot be differentiated. check_lengths=False:
        # the lengths are a mask's counts, in [0, time] by construction, and the range
        # check of traced lengths is a custom call (~0.4 ms a small training step).
        return rnn(x, h0, c0, params, lengths, rnn_mode=rnn_mode, direction=direction,
                   time_major=False, check_lengths=False)
    if name == "torch":
        import torch

        from ..torch import rnn
        return rnn(x, h0, c0, params, lengths, rnn_mode=rnn_mode, direction=direction,
                   time_major=False, is_training=torch.is_grad_enabled())
    if name == "tensorflow":
        from ..tensorflow import rnn
        # is_training=True: the op's inference differs only by dropout, which a Keras
        # layer's own masks replace (one layer per call: no masks between layers).
        return rnn(x, h0, c0, params, lengths, rnn_mode=rnn_mode, direction=direction,
                   time_major=False)
    raise NotImplementedError(f"pycudnnrnn.keras runs on the jax, torch and tensorflow "
                              f"backends, not {name}")


def runs_tensorflow_kernel(x, dtype) -> bool:
    """Whether a call on Keras's TensorFlow backend goes to TensorFlow's cuDNN kernel
    (``pycudnnrnn.tensorflow.cudnn``: a GPU), which XLA cannot compile. It takes the
    other backends' path (a gathered params buffer and lengths); elsewhere TensorFlow
    runs the op's graph on Keras's weights (``_tensorflow_op``)."""
    if backend.backend() != "tensorflow":
        return False
    from ..tensorflow import cudnn
    return cudnn.runs_here(x) and cudnn.serves_dtype(dtype)


def _tensorflow_graph(x, dtype) -> bool:
    """Whether a call runs the op's graph on Keras's weights (``_tensorflow_op``)."""
    return backend.backend() == "tensorflow" and not runs_tensorflow_kernel(x, dtype)


def _tensorflow_op(rnn_mode, x, h0, c0, weights, mask, carry_output,
                   direction="unidirectional"):
    """The op's computation on TensorFlow (``pycudnnrnn.tensorflow.graph``), fed Keras's
    weights as they are, and its mask: ``[(y, h, c)]`` per direction.

    No params buffer is gathered and cut, and steps move only where the mask is not
    right-padded (``graph._Compacted``, asked at run time). It is the op's own graph,
    with about half the operations around its loops.
    """
    del direction  # (the number of weight triples says it; named for the tests' count)
    from ..tensorflow import graph
    return graph.keras_layers(rnn_mode, x, h0, c0, weights, mask, carry_output)


def _compact(x, mask):
    """Unmasked steps first, in order: (gathered x, per-sequence counts)."""
    T = x.shape[1]
    t = ops.expand_dims(ops.arange(T, dtype="int32"), 0)
    order = ops.argsort(ops.where(mask, t, t + T), axis=1)  # distinct keys: any sort is stable
    x = ops.take_along_axis(x, ops.expand_dims(order, -1), axis=1)
    return x, ops.sum(ops.cast(mask, "int32"), axis=1)


def _before_any(carried, h0):
    """What a masked step before any unmasked one outputs (in processing order)."""
    zeros = ops.zeros_like(carried)
    if backend.backend() == "jax":  # Keras's JAX loop carries the state there: h0
        return zeros + ops.expand_dims(h0, 1)
    return zeros  # its PyTorch and TensorFlow loops carry the previous output, zeros at first


def _spread(y, mask, h0, zero_output_for_mask):
    """Outputs of the compacted run back at their steps, masked steps filled as Keras does."""
    k = ops.cumsum(ops.cast(mask, "int32"), axis=1) - 1  # index of the last unmasked step so far
    carried = ops.take_along_axis(y, ops.expand_dims(ops.maximum(k, 0), -1), axis=1)
    if zero_output_for_mask:
        return ops.where(ops.expand_dims(mask, -1), carried, ops.zeros_like(carried))
    return ops.where(ops.expand_dims(k >= 0, -1), carried, _before_any(carried, h0))


def _spread_backward(y, mask, h0, zero_output_for_mask):
    """``_spread`` for the reverse direction, in the original time order: a masked step
    carries the output of the next unmasked one (the previous in processing order)."""
    m = ops.cast(mask, "int32")
    count = ops.cumsum(m, axis=1)
    k = count - m  # unmasked: its own index; masked: the next unmasked step's
    carried = ops.take_along_axis(y, ops.expand_dims(ops.minimum(k, y.shape[1] - 1), -1), axis=1)
    if zero_output_for_mask:
        return ops.where(ops.expand_dims(mask, -1), carried, ops.zeros_like(carried))
    seen = ops.expand_dims(k < count[:, -1:], -1)
    return ops.where(seen, carried, _before_any(carried, h0))


def _check(sequences, states, mask, units):
    """The mask as ``[batch, time]`` bools (or None), after checking it and each initial
    state ``[batch, units]`` against `sequences`: else a ValueError naming the argument
    (where a size is still unknown, it is not held against anything). A mask ``[batch,
    time, 1]`` is taken as Keras's backends take it."""
    batch, time = sequences.shape[0], sequences.shape[1]

    def agrees(shape, expected):  # (== and not int(): a traced size stays symbolic)
        return len(shape) == len(expected) and all(
            a is None or b is None or a == b for a, b in zip(shape, expected))

    for k, state in enumerate(states):
        if not agrees(tuple(state.shape), (batch, units)):
            raise ValueError(f"initial_state: expected each state of shape (batch, units) = "
                             f"{(batch, units)}, got {tuple(state.shape)} at index {k}")
    if mask is None:
        return None
    shape = tuple(mask.shape)
    if len(shape) == 3 and shape[2] == 1:
        mask = mask[:, :, 0]
    if not agrees(tuple(mask.shape), (batch, time)):
        raise ValueError(f"mask: expected shape (batch, time) = {(batch, time)} (or with a "
                         f"last axis of 1), that of the sequences' first two axes, got {shape}")
    return ops.cast(mask, "bool")


def run(rnn_mode, sequences, initial_state, mask, *, kernel, recurrent_kernel, bias,
        dtype, go_backwards=False, zero_output_for_mask=False):
    """The layer's loop: ``(last_output, outputs, states)`` as Keras's ``inner_loop``.

    Parameters
    ----------
    rnn_mode : {"lstm", "gru"}
    sequences : tensor [batch, time, features]
        Dropout, if any, already applied.
    initial_state : list of tensor
        ``[h, c]`` (LSTM) or ``[h]`` (GRU), each [batch, units].
    mask : bool tensor [batch, time] (or [batch, time, 1]) or None
    kernel, recurrent_kernel, bias
        The cell's weights, as Keras holds them.
    dtype : str
        The compute dtype (bfloat16 under ``mixed_bfloat16``): the op runs in it.
    go_backwards, zero_output_for_mask : bool
        The layer's attributes.
    """
    mask = _check(sequences, initial_state, mask, recurrent_kernel.shape[0])
    x = ops.cast(sequences, dtype)
    h0 = ops.cast(initial_state[0], dtype)
    c0 = ops.cast(initial_state[1], dtype) if rnn_mode == "lstm" else None
    if go_backwards:
        x = ops.flip(x, axis=1)
        mask = None if mask is None else ops.flip(mask, axis=1)
    if _tensorflow_graph(x, dtype):
        [(y, h, c)] = _tensorflow_op(rnn_mode, x, [h0], None if c0 is None else [c0],
                                     [(kernel, recurrent_kernel, bias)], mask,
                                     not zero_output_for_mask)
        return y[:, -1], y, [h] + ([c] if rnn_mode == "lstm" else [])
    params = keras_params(rnn_mode, [(kernel, recurrent_kernel, bias)], dtype)
    lengths = None
    if mask is not None:
        x, lengths = _compact(x, mask)
    y, h, c = _op(rnn_mode, x, ops.expand_dims(h0, 1), None if c0 is None else ops.expand_dims(c0, 1),
                  params, lengths)
    if mask is not None:
        y = _spread(y, mask, h0, zero_output_for_mask)
    states = [h[:, 0]] + ([c[:, 0]] if rnn_mode == "lstm" else [])
    return y[:, -1], y, states


def run_bidirectional(rnn_mode, sequences, forward_state, backward_state, mask, *,
                      forward_weights, backward_weights, dtype, zero_output_for_mask=False):
    """A ``Bidirectional`` pair of layers (the second ``go_backwards``) as one op call.

    Returns ``(forward, backward)``, each ``(last_output, outputs, states)`` as the
    layer's ``inner_loop`` would, except that the backward outputs are in the original
    time order (as ``Bidirectional`` turns them); its last output is its final step's,
    which is time 0. The weights are ``(kernel, recurrent_kernel, bias)`` triples.
    """
    mask = _check(sequences, [*forward_state, *backward_state], mask,
                  forward_weights[1].shape[0])
    x = ops.cast(sequences, dtype)
    lstm = rnn_mode == "lstm"
    states = [[ops.cast(s, dtype) for s in pair] for pair in zip(forward_state, backward_state)]
    if _tensorflow_graph(x, dtype):
        (y_f, h_f, c_f), (y_b, h_b, c_b) = _tensorflow_op(
            rnn_mode, x, states[0], states[1] if lstm else None,
            [forward_weights, backward_weights], mask, not zero_output_for_mask,
            direction="bidirectional")
        return ((y_f[:, -1], y_f, [h_f] + ([c_f] if lstm else [])),
                (y_b[:, 0], y_b, [h_b] + ([c_b] if lstm else [])))
    h0 = ops.stack(states[0], axis=1)  # [B, 2, H]: pseudo-layers forward, backward
    c0 = ops.stack(states[1], axis=1) if lstm else None
    params = keras_params(rnn_mode, [forward_weights, backward_weights], dtype)
    lengths = None
    if mask is not None:
        x, lengths = _compact(x, mask)
    y, h, c = _op(rnn_mode, x, h0, c0, params, lengths, direction="bidirectional")
    H = h0.shape[-1]
    y_f, y_b = y[..., :H], y[..., H:]
    if mask is not None:
        y_f = _spread(y_f, mask, states[0][0], zero_output_for_mask)
        y_b = _spread_backward(y_b, mask, states[0][1], zero_output_for_mask)
    finals = [[h[:, d]] + ([c[:, d]] if lstm else []) for d in range(2)]
    return (y_f[:, -1], y_f, finals[0]), (y_b[:, 0], y_b, finals[1])
