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

``keras_layers`` runs the same loops on a Keras layer's own weights and mask, for
``pycudnnrnn.keras`` on Keras's TensorFlow backend.
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
            cell = _Cell.from_blocks(config, blocks[k])
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


def keras_layers(rnn_mode, x, h0, c0, weights, mask, carry_output):
    """Keras recurrent layers' loops on Keras's weights: ``[(y, h, c)]``, one per direction.

    `x` [B, T, F] batch-major; `weights` ``[(kernel, recurrent_kernel, bias)]``, one
    triple per direction, used as they are (no params buffer to gather and cut); `h0`,
    `c0` (None but for an LSTM) a state [B, H] per direction; `mask` [B, T] bool or None.
    The first direction runs forward, the second (if any) backward over the reversed
    time axis, its outputs back in time order. A masked step keeps the state and outputs
    zero, or with `carry_output` the last output. Results in `x`'s dtype.
    """
    dtype = x.dtype
    cdt = tf.float32 if dtype.size == 2 else dtype
    cast = lambda a: None if a is None else tf.cast(tf.cast(a, dtype), cdt)  # noqa: E731
    rows = _Rows(None, None, None if mask is None else tf.transpose(mask))
    x = rows.zero_padding(tf.transpose(cast(x), [1, 0, 2]))  # time-major
    results = []
    for direction, triple in enumerate(weights):
        cell = _Cell.from_keras(rnn_mode, *map(cast, triple))
        y, h, c = rows.run(cell, x, cast(h0[direction]),
                           None if c0 is None else cast(c0[direction]),
                           reverse=direction == 1, carry_output=carry_output)
        results.append((tf.cast(tf.transpose(y, [1, 0, 2]), dtype), tf.cast(h, dtype),
                        None if c is None else tf.cast(c, dtype)))
    return results


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
    """One pseudo-layer's cell: its mode and weights, arranged for the products.

    `w_input_t` [in, G·H] (None for skip_input), `w_rec_t` [P, G·H], `w_proj_t` [H, P] or
    None; `bias` is added to the input's product; a GRU's `b_rec` stays inside the reset
    gate's product. `gru_gates` is the order of a GRU's gates in the columns: cuDNN's
    "rzn", or Keras's "zrn".
    """

    def __init__(self, mode, w_input_t, w_rec_t, bias, b_rec=None, w_proj_t=None,
                 gru_gates="rzn"):
        self.mode = mode
        self.gates = {"lstm": 4, "gru": 3}.get(mode, 1)
        self.w_input_t, self.w_rec_t, self.w_proj_t = w_input_t, w_rec_t, w_proj_t
        self.bias, self.b_rec = bias, b_rec
        self.gru_gates = gru_gates

    @classmethod
    def from_blocks(cls, config, blocks):
        """The cell of one pseudo-layer's blocks, cut from the params (``_split``)."""
        w_input, b_input, b_rec = blocks["w_input"], blocks["b_input"], blocks["b_recurrent"]
        w_proj = blocks["w_projection"]
        gru = config.rnn_mode == "gru"
        # A GRU's recurrent bias stays inside the reset gate's product; elsewhere the
        # two biases are one.
        return cls(config.rnn_mode, None if w_input is None else tf.transpose(w_input),
                   tf.transpose(blocks["w_recurrent"]), b_input if gru else b_input + b_rec,
                   b_rec if gru else None, None if w_proj is None else tf.transpose(w_proj))

    @classmethod
    def from_keras(cls, mode, kernel, recurrent_kernel, bias):
        """The cell of a Keras layer's weights, used as they are: ``kernel`` [in, G·H] and
        ``recurrent_kernel`` [H, G·H] are the transposed matrices, with an LSTM's gates
        in cuDNN's order (i, f, c, o); a GRU's ``bias`` [2, 3H] is input and recurrent."""
        if mode == "gru":
            return cls(mode, kernel, recurrent_kernel, bias[0], bias[1], gru_gates="zrn")
        return cls(mode, kernel, recurrent_kernel, bias)

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
            if self.gru_gates == "zrn":
                x_r, x_z, h_r, h_z = x_z, x_r, h_z, h_r
            r, z = tf.sigmoid(x_r + h_r), tf.sigmoid(x_z + h_z)
            n = tf.tanh(x_n + r * h_n)
            return (h - n) * z + n, None
        pre = xw + h @ self.w_rec_t
        return (tf.tanh(pre) if self.mode == "rnn_tanh" else tf.nn.relu(pre)), None


class _Rows:
    """Which rows run at which step, and the loop over steps that honours it.

    From `lengths` (the op's: each row runs its first steps), or from a Keras `mask`
    ([T, B] bool, time-major: any steps, holes too). A row keeps its state through the
    steps it does not run. Reversed, a row runs its own steps backwards: from its last
    one with lengths, over the whole reversed time axis with a mask (Keras's
    ``go_backwards``), which is the same for right-padded rows.
    """

    def __init__(self, lengths, max_time, mask=None):
        self.lengths, self.running = lengths, mask
        if lengths is not None:
            self.running = tf.transpose(tf.sequence_mask(lengths, max_time))  # [T, B]
            self.started = (lengths > 0)[:, None]
        elif mask is not None:
            self.started = tf.reduce_any(mask, 0)[:, None]

    def zero_padding(self, x):
        if self.running is None:
            return x
        return tf.where(self.running[..., None], x, tf.zeros_like(x))

    def _reverse(self, a):
        """`a` [T, B, W] with each row's own steps in reverse order (padding stays, with
        lengths)."""
        if self.lengths is None:
            return tf.reverse(a, [0])
        return tf.reverse_sequence(a, self.lengths, seq_axis=0, batch_axis=1)

    def run(self, cell, x, h0, c0, reverse, carry_output=False):
        """``(y [T, B, P], h, c)`` of `cell` over the steps of `x` [T, B, in].

        A step a row does not run outputs zero, or with `carry_output` the row's last
        output (zero before its first), as Keras's TensorFlow loop does.
        """
        xw = cell.input_products(x)
        running = self.running
        if reverse:
            xw = self._reverse(xw)
            if self.lengths is None and running is not None:
                running = tf.reverse(running, [0])
        ragged = running is not None
        if ragged:  # a row that never runs: no value of its state reaches the weights
            h, c = (None if s is None else tf.where(self.started, s, tf.zeros_like(s))
                    for s in (h0, c0))
        else:
            h, c = h0, c0
        steps = tf.shape(xw)[0]
        inputs = tf.TensorArray(xw.dtype, size=steps).unstack(xw)
        outputs = tf.TensorArray(h.dtype, size=steps)
        lstm = c is not None

        def body(t, h, c, last, outputs):
            new_h, new_c = cell.step(inputs.read(t), h, c if lstm else None)
            if ragged:
                run = running[t][:, None]
                new_h = tf.where(run, new_h, h)
                new_c = tf.where(run, new_c, c) if lstm else c
                y = tf.where(run, new_h, last if carry_output else tf.zeros_like(new_h))
            else:
                new_c = new_c if lstm else c
                y = new_h
            return t + 1, new_h, new_c, (y if carry_output else last), outputs.write(t, y)

        c_loop = c if lstm else tf.zeros((), h.dtype)
        last = tf.zeros_like(h) if carry_output else tf.zeros((), h.dtype)
        # maximum_iterations: the gradient's accumulators can be allocated once, at their
        # size, as Keras's own loop has them
        _, h, c_loop, _, outputs = tf.while_loop(
            lambda t, *_: t < steps, body, (tf.constant(0), h, c_loop, last, outputs),
            maximum_iterations=steps)
        y = outputs.stack()
        if reverse:
            y = self._reverse(y)
        if ragged:
            h = tf.where(self.started, h, h0)
            c_loop = tf.where(self.started, c_loop, c0) if lstm else c_loop
        return y, h, (c_loop if lstm else None)
