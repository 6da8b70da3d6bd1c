"""``LSTM`` and ``GRU``: Keras's own layers whose loop is pycudnnrnn's op; ``Bidirectional``:
Keras's wrapper, running a pair of them as one bidirectional call.

Everything but the loop is inherited from ``keras.layers.LSTM`` / ``GRU``: constructor,
``get_config``, weights, initial and stateful states, dropout masks, ``return_*``,
``Bidirectional`` wrapping. Only ``inner_loop`` is ours, and it hands a configuration
cuDNN does not compute back to Keras's own ``inner_loop`` (which may itself take Keras's
cuDNN path, as it would for a plain Keras layer).
"""

from __future__ import annotations

import keras
from keras import activations, backend, ops

from . import loop

_TANH = (activations.tanh, ops.tanh)
_SIGMOID = (activations.sigmoid, ops.sigmoid)


def _native(name):
    """The backend's own tanh and sigmoid, which Keras's cudnn_ok accepts too."""
    if backend.backend() == "jax":
        import jax
        import jax.numpy as jnp
        return {"tanh": (jnp.tanh,), "sigmoid": (jax.nn.sigmoid,)}[name]
    if backend.backend() == "torch":
        import torch
        return {"tanh": (torch.tanh,), "sigmoid": (torch.sigmoid,)}[name]
    if backend.backend() == "tensorflow":
        import tensorflow as tf
        return {"tanh": (tf.tanh, tf.nn.tanh), "sigmoid": (tf.sigmoid, tf.nn.sigmoid)}[name]
    return ()


class _OnOurOp:
    """The part ``LSTM`` and ``GRU`` share: when to run our op, and running it."""

    _rnn_mode: str

    def runs_on_our_op(self, training=False) -> bool:
        """Whether a call (in training or not) runs pycudnnrnn's op, not Keras's loop.

        True on the JAX, PyTorch and TensorFlow backends for what cuDNN computes: tanh and sigmoid,
        ``use_bias=True``, ``recurrent_dropout=0``, ``unroll=False``, a GRU with
        ``reset_after=True``, and not ``use_cudnn=False`` (Keras's way to ask for its own
        loop). Input dropout in training runs ours too (the cell's mask multiplies the
        inputs, as Keras's cell does), except with ``implementation=1``, whose per-gate
        masking is Keras's alone. Any mask runs ours (see ``pycudnnrnn.keras.loop``).
        """
        cell = self.cell
        return (backend.backend() in ("jax", "torch", "tensorflow")
                and getattr(self, "use_cudnn", "auto") in ("auto", True)
                and cell.activation in _TANH + _native("tanh")
                and cell.recurrent_activation in _SIGMOID + _native("sigmoid")
                and cell.use_bias
                and not cell.recurrent_dropout
                and not self.unroll
                and getattr(cell, "reset_after", True)
                and not (training and 0.0 < cell.dropout < 1.0 and cell.implementation == 1))

    def inner_loop(self, sequences, initial_state, mask, training=False):
        if not self.runs_on_our_op(training):
            return super().inner_loop(sequences, initial_state, mask=mask, training=training)
        if isinstance(mask, (list, tuple)):
            mask = mask[0]
        if self._rnn_mode == "gru" and isinstance(initial_state, (list, tuple)) \
                and isinstance(initial_state[0], (list, tuple)):
            initial_state = initial_state[0]
        if not isinstance(initial_state, (list, tuple)):
            initial_state = [initial_state]
        if loop.runs_tensorflow_kernel(sequences, self.compute_dtype):
            # As Keras's own LSTM says on a GPU: then compile's jit_compile="auto" leaves
            # XLA off, which would compile TensorFlow's operations and never reach cuDNN.
            self.supports_jit = False
        cell = self.cell
        if training and 0.0 < cell.dropout < 1.0:
            # The mask the cell drew for this call (RNN.call prepares it): the one Keras's
            # own cell would multiply every step's input by.
            sequences = sequences * ops.expand_dims(cell.get_dropout_mask(sequences[:, 0, :]), 1)
        return loop.run(self._rnn_mode, sequences, list(initial_state), mask,
                        kernel=cell.kernel, recurrent_kernel=cell.recurrent_kernel,
                        bias=cell.bias, dtype=self.compute_dtype,
                        go_backwards=self.go_backwards,
                        zero_output_for_mask=self.zero_output_for_mask)


@keras.saving.register_keras_serializable(package="pycudnnrnn")
class LSTM(_OnOurOp, keras.layers.LSTM):
    """``keras.layers.LSTM`` on pycudnnrnn's op (JAX, PyTorch and TensorFlow backends).

    Takes exactly ``keras.layers.LSTM``'s arguments and has its weights (``kernel``
    [in, 4H], ``recurrent_kernel`` [H, 4H], ``bias`` [4H], gates i, f, c, o), so
    ``set_weights`` / ``get_weights`` move weights between the two unchanged. See
    ``runs_on_our_op`` for which configurations run our op; the rest run Keras's own loop.
    """

    _rnn_mode = "lstm"


@keras.saving.register_keras_serializable(package="pycudnnrnn")
class GRU(_OnOurOp, keras.layers.GRU):
    """``keras.layers.GRU`` on pycudnnrnn's op (JAX, PyTorch and TensorFlow backends).

    Takes exactly ``keras.layers.GRU``'s arguments and has its weights (``kernel``
    [in, 3H], ``recurrent_kernel`` [H, 3H], ``bias`` [2, 3H], gates z, r, h). cuDNN's GRU
    is the reset-after form, Keras's default; ``reset_after=False`` runs Keras's loop.
    """

    _rnn_mode = "gru"


@keras.saving.register_keras_serializable(package="pycudnnrnn")
class Bidirectional(keras.layers.Bidirectional):
    """``keras.layers.Bidirectional`` that runs a pair of our layers as one op call.

    Takes ``keras.layers.Bidirectional``'s arguments. When both layers are ours (of one
    class, the backward one ``go_backwards``, both running our op, not stateful, no input
    dropout in training: see ``fuses``), the two directions are one bidirectional call
    of pycudnnrnn's op, masks included; otherwise Keras's ``Bidirectional`` runs each
    layer (ours still run our op, one call each). ``keras.layers.Bidirectional`` around
    our layers computes the same; on a GPU, though, it first tries Keras's own fused cuDNN
    call, which this one never does.
    """

    def fuses(self, training=False) -> bool:
        """Whether a call (in training or not) is one bidirectional call of our op."""
        fwd, bwd = self.forward_layer, self.backward_layer
        dropout = training and any(0.0 < l.cell.dropout < 1.0 for l in (fwd, bwd))
        return (isinstance(fwd, _OnOurOp) and type(fwd) is type(bwd)
                and not fwd.go_backwards and bwd.go_backwards
                and fwd.units == bwd.units and not self.stateful and not dropout
                and fwd.runs_on_our_op(training) and bwd.runs_on_our_op(training))

    def call(self, sequences, initial_state=None, mask=None, training=None):
        if not self.fuses(training):
            return super().call(sequences, initial_state=initial_state, mask=mask,
                                training=training)
        fwd, bwd = self.forward_layer, self.backward_layer
        if isinstance(mask, (list, tuple)):
            mask = mask[0]
        if initial_state is None:
            batch = ops.shape(sequences)[0]
            forward_state, backward_state = fwd.get_initial_state(batch), bwd.get_initial_state(batch)
        else:
            half = len(initial_state) // 2
            forward_state, backward_state = list(initial_state[:half]), list(initial_state[half:])
        if loop.runs_tensorflow_kernel(sequences, self.compute_dtype):
            for layer in (self, fwd, bwd):  # (see _OnOurOp.inner_loop)
                layer.supports_jit = False
        weights = lambda l: (l.cell.kernel, l.cell.recurrent_kernel, l.cell.bias)
        # Keras's RNN.call draws each cell's dropout mask at every call, inference included
        # (unused there), which advances the cell's seed generator: drawn here too, so that
        # a later training call draws the masks Keras's pair would.
        for layer, state in ((fwd, forward_state), (bwd, backward_state)):
            layer._maybe_config_dropout_masks(layer.cell, sequences[:, 0, :], state)
        try:
            forward, backward = loop.run_bidirectional(
                fwd._rnn_mode, sequences, forward_state, backward_state, mask,
                forward_weights=weights(fwd), backward_weights=weights(bwd),
                dtype=self.compute_dtype, zero_output_for_mask=fwd.zero_output_for_mask)
        finally:  # no mask of this call kept for the next
            for layer in (fwd, bwd):
                layer._maybe_reset_dropout_masks(layer.cell)
        pick = 1 if self.return_sequences else 0  # outputs, else the last output
        y, y_rev = (ops.cast(r[pick], self.compute_dtype) for r in (forward, backward))
        merged = {"concat": lambda: ops.concatenate([y, y_rev], axis=-1),
                  "sum": lambda: y + y_rev, "ave": lambda: (y + y_rev) / 2,
                  "mul": lambda: y * y_rev, None: lambda: (y, y_rev)}[self.merge_mode]()
        if not self.return_state:
            return merged
        states = tuple(ops.cast(s, self.compute_dtype) for s in forward[2] + backward[2])
        return (merged + states) if self.merge_mode is None else (merged,) + states
