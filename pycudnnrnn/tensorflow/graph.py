"""The RNN in TensorFlow's own operations: what runs where TensorFlow has no cuDNN kernel.

It computes what ``pycudnnrnn.cpu.rnn`` computes, step for step (``docs/semantics.md``),
and the tests hold the two together. Being TensorFlow's operations, it is what a
``tf.function`` traces, XLA compiles, a ``GradientTape`` differentiates (to any order)
and a SavedModel stores: a model saved with it loads and runs without this library.

* Each pseudo-layer makes its input's product for all steps at once, outside the loop
  (one large matrix product); the loop, a ``tf.while_loop``, makes the state's product
  and the gate arithmetic of one step.
* A ragged batch: rows keep their state past their last step, and their output there
  is zero. The reverse direction reads each row backwards from its own last step
  (``tf.reverse_sequence``). The state of a row of length 0 is zeroed before it meets
  the weights, so an initial state that is never used (even NaN) cannot reach the
  weight gradients; the row's output_h is that state as it came.
* Dropout masks (training, between layers) come from TensorFlow's stateless generator,
  keyed by the seed and the layer: reproducible from the seed, and not the NumPy
  backend's masks (nor cuDNN's), as the masks of the two backends differ.
* float16 and bfloat16 compute in float32 and round once, when results leave.
"""

from __future__ import annotations

import tensorflow as tf

from ..core import layout


def dropped_layers(config, is_training) -> range:
    """The layers whose input dropout masks: every layer after the first, in training
    with dropout (``Problem.dropout_layers``' rule, without a ``Problem``)."""
    return range(1, config.num_layers) if is_training and config.dropout > 0 else range(0)


def masks(config, is_training, x_shape, seed, dtype):
    """``{layer: keep-mask scaled by 1/(1-p)}`` of each dropped layer's input, [T, B, W]
    (time-major); empty where no mask is drawn. `seed` is the combined 64-bit seed, an
    int64 scalar tensor."""
    p = config.dropout
    T, B = x_shape
    width = config.num_dirs * config.state_size
    found = {}
    for layer in dropped_layers(config, is_training):
        key = tf.stack([seed, tf.constant(layer, tf.int64)])
        uniform = tf.random.stateless_uniform(tf.stack([T, B, width]), key, dtype=tf.float32)
        found[layer] = tf.cast(uniform >= p, dtype) * tf.cast(1.0 / (1.0 - p), dtype)
    return found


def rnn(config, time_major, input, input_h, input_c, params, lengths, dropout_masks):
    """``(output, output_h, output_c)`` in the input's dtype.

    `lengths` is None (every row runs every step) or an int32 ``[B]`` tensor whose values
    are in range; `dropout_masks` as ``masks`` gives them (compute dtype, time-major).
    """
    dtype = input.dtype
    cdt = tf.float32 if dtype.size == 2 else dtype
    enter = (lambda a: tf.cast(a, cdt)) if time_major else \
        (lambda a: tf.transpose(tf.cast(a, cdt), [1, 0, 2]))
    x, h0 = enter(input), enter(input_h)
    c0 = enter(input_c) if config.is_lstm else None
    rows = _Rows(lengths, tf.shape(x)[0])
    x = rows.zero_padding(x)  # padding may hold anything, even NaN
    blocks = _split(tf.cast(params, cdt), layout.pseudo_layer_blocks(config))
    output_h, output_c = [], []
    for layer in range(config.num_layers):
        if layer in dropout_masks:
            x = x * dropout_masks[layer]
        outputs = []
        for direction in range(config.num_dirs):
            k = layer * config.num_dirs + direction
            cell = _Cell(config, blocks[k])
            y, h, c = rows.run(cell, x, h0[k], None if c0 is None else c0[k],
                               reverse=direction == 1)
            outputs.append(y)
            output_h.append(h)
            output_c.append(c)
        x = outputs[0] if config.num_dirs == 1 else tf.concat(outputs, axis=-1)

    def leave(a):
        a = tf.cast(a, dtype)
        return a if time_major else tf.transpose(a, [1, 0, 2])

    output_c = leave(tf.stack(output_c)) if config.is_lstm else tf.zeros((0,), dtype)
    return leave(x), leave(tf.stack(output_h)), output_c


def _split(params, pseudo_layers):
    """Each pseudo-layer's blocks as tensors (``{name: tensor or None}``), cut from
    `params` by one ``tf.split`` (``layout.tiles``)."""
    pieces = layout.tiles(pseudo_layers)
    views = [dict.fromkeys(layout.BLOCK_NAMES) for _ in pseudo_layers]
    for array, (_, _, k, name) in zip(tf.split(params, [b - a for a, b, _, _ in pieces]),
                                      pieces):
        if k is not None:
            views[k][name] = tf.reshape(array, getattr(pseudo_layers[k], name).shape)
    return views


class _Cell:
    """One pseudo-layer's cell: its mode and weights, arranged for the products."""

    def __init__(self, config, blocks):
        self.mode = config.rnn_mode
        self.gates = config.num_gates
        w_input, b_input, b_rec = blocks["w_input"], blocks["b_input"], blocks["b_recurrent"]
        self.w_input_t = None if w_input is None else tf.transpose(w_input)
        self.w_rec_t = tf.transpose(blocks["w_recurrent"])
        w_proj = blocks["w_projection"]
        self.w_proj_t = None if w_proj is None else tf.transpose(w_proj)
        # A GRU's recurrent bias stays inside the reset gate's product; elsewhere the
        # two biases are one.
        self.bias = b_input if self.mode == "gru" else b_input + b_rec
        self.b_rec = b_rec if self.mode == "gru" else None

    def input_products(self, x):
        """``W x + b`` for every step at once: [T, B, G·H] from [T, B, in]."""
        if self.w_input_t is None:  # skip_input: the identity matrix, for every gate
            return tf.tile(x, [1, 1, self.gates]) + self.bias
        shape = tf.shape(x)
        flat = tf.reshape(x, [-1, shape[2]]) @ self.w_input_t
        return tf.reshape(flat, tf.concat([shape[:2], [-1]], 0)) + self.bias

    def step(self, xw, h, c):
        """The new ``(h, c)`` (c None but for an LSTM) from a step's input product."""
        if self.mode == "lstm":
            i, f, g, o = tf.split(xw + h @ self.w_rec_t, 4, axis=-1)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            out = tf.sigmoid(o) * tf.tanh(c)
            return (out if self.w_proj_t is None else out @ self.w_proj_t), c
        if self.mode == "gru":  # (split, not sliced: a slice's gradient is a padded copy)
            x_r, x_z, x_n = tf.split(xw, 3, axis=-1)
            h_r, h_z, h_n = tf.split(h @ self.w_rec_t + self.b_rec, 3, axis=-1)
            r, z = tf.sigmoid(x_r + h_r), tf.sigmoid(x_z + h_z)
            n = tf.tanh(x_n + r * h_n)
            return (h - n) * z + n, None
        pre = xw + h @ self.w_rec_t
        return (tf.tanh(pre) if self.mode == "rnn_tanh" else tf.nn.relu(pre)), None


class _Rows:
    """Which rows run at which step, and the loop over steps that honours it."""

    def __init__(self, lengths, max_time):
        self.lengths = lengths
        if lengths is not None:
            self.running = tf.transpose(tf.sequence_mask(lengths, max_time))  # [T, B]
            self.started = (lengths > 0)[:, None]

    def zero_padding(self, x):
        if self.lengths is None:
            return x
        return tf.where(self.running[..., None], x, tf.zeros_like(x))

    def _reverse(self, a):
        """`a` [T, B, W] with each row's own steps in reverse order (padding stays)."""
        if self.lengths is None:
            return tf.reverse(a, [0])
        return tf.reverse_sequence(a, self.lengths, seq_axis=0, batch_axis=1)

    def run(self, cell, x, h0, c0, reverse):
        """``(y [T, B, P], h, c)`` of `cell` over the steps of `x` [T, B, in]."""
        xw = cell.input_products(x)
        if reverse:
            xw = self._reverse(xw)
        ragged = self.lengths is not None
        if ragged:  # a row of length 0 never runs: no value of its state reaches the weights
            h, c = (None if s is None else tf.where(self.started, s, tf.zeros_like(s))
                    for s in (h0, c0))
        else:
            h, c = h0, c0
        steps = tf.shape(xw)[0]
        inputs = tf.TensorArray(xw.dtype, size=steps).unstack(xw)
        outputs = tf.TensorArray(h.dtype, size=steps)
        lstm = c is not None

        def body(t, h, c, outputs):
            new_h, new_c = cell.step(inputs.read(t), h, c if lstm else None)
            if ragged:
                run = self.running[t][:, None]
                new_h = tf.where(run, new_h, h)
                new_c = tf.where(run, new_c, c) if lstm else c
                y = tf.where(run, new_h, tf.zeros_like(new_h))
            else:
                new_c = new_c if lstm else c
                y = new_h
            return t + 1, new_h, new_c, outputs.write(t, y)

        c_loop = c if lstm else tf.zeros((), h.dtype)
        # maximum_iterations: the gradient's accumulators can be allocated once, at their
        # size, as Keras's own loop has them
        _, h, c_loop, outputs = tf.while_loop(
            lambda t, *_: t < steps, body, (tf.constant(0), h, c_loop, outputs),
            maximum_iterations=steps)
        y = outputs.stack()
        if reverse:
            y = self._reverse(y)
        if ragged:
            h = tf.where(self.started, h, h0)
            c_loop = tf.where(self.started, c_loop, c0) if lstm else c_loop
        return y, h, (c_loop if lstm else None)
