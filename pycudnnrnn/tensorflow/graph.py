"""The RNN in TensorFlow's own operations: what runs where TensorFlow has no cuDNN kernel.

It computes what ``pycudnnrnn.cpu.rnn`` computes, step for step (``docs/semantics.md``),
and the tests hold the two together. Being TensorFlow's operations, it is what a
``tf.function`` traces, XLA compiles, a ``GradientTape`` differentiates (to any order)
and a SavedModel stores: a model saved with it loads and runs without this library.

* Each pseudo-layer makes its input's product for many steps at once, outside the loop
  (one large matrix product); the loop, a ``tf.while_loop``, makes the state's product
  and the gate arithmetic of one step.
* The gradient is written out (``_states``), not derived by TensorFlow: a loop back
  over the steps, then the weights' gradients as products over many steps at once.
* A ragged batch: its rows run longest first, and each of a long sequence's loops runs
  the rows still running at its first step (``_Rows``). A row runs on to the end of
  its loop, and its final state is picked out of the states after it, at its last
  step; its outputs past it are zero. (The steps past a row's end get a gradient of
  exactly zero: see ``_states``.) The reverse direction reads each row backwards from
  its own last step. A row of length 0 never runs (under XLA, its state is zeroed
  before it meets the weights), so an initial state that is never used (even NaN)
  cannot reach the weight gradients; the row's output_h is that state as it came.
* Dropout masks (training, between layers) come from TensorFlow's stateless generator,
  keyed by the seed and the layer: reproducible from the seed (XLA's generator draws
  other numbers), and not the NumPy backend's masks (nor cuDNN's), as the masks of the
  two backends differ.
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

    A masked step leaves the state as it was. So the layer is the op over each row's
    unmasked steps alone, in order: they are moved to the front (``_Compacted``) and run
    as lengths. A right-padded mask, the common one, moves nothing.
    """
    dtype = x.dtype
    cdt = tf.float32 if dtype.size == 2 else dtype
    cast = lambda a: None if a is None else tf.cast(tf.cast(a, dtype), cdt)  # noqa: E731
    x = cast(x)
    compacted = None if mask is None else _Compacted(mask)
    if compacted is not None:
        x = compacted.gather(x)
    rows = _Rows(None, None) if compacted is None else _Rows(compacted.lengths, tf.shape(x)[1])
    x = rows.zero_padding(tf.transpose(x, [1, 0, 2]))  # time-major
    results = []
    for direction, triple in enumerate(weights):
        cell = _Cell.from_keras(rnn_mode, *map(cast, triple))
        y, h, c = rows.run(cell, x, cast(h0[direction]),
                           None if c0 is None else cast(c0[direction]),
                           reverse=direction == 1)
        y = tf.transpose(y, [1, 0, 2])
        if compacted is not None:
            y = compacted.spread(y, h, reverse=direction == 1, carry_output=carry_output)
        results.append((tf.cast(y, dtype), tf.cast(h, dtype),
                        None if c is None else tf.cast(c, dtype)))
    return results


class _Compacted:
    """A Keras mask [B, T] as lengths: each row's unmasked steps moved to the front, in
    order, and the outputs of those steps moved back after the loop.

    Whether anything moves is asked at run time (``tf.cond``): a right-padded mask moves
    nothing, and pays for no gather.
    """

    def __init__(self, mask):
        mask = tf.cast(mask, tf.bool)
        T = tf.shape(mask)[1]
        self.mask, self.lengths = mask, tf.reduce_sum(tf.cast(mask, tf.int32), 1)
        self.right_padded = tf.reduce_all(tf.equal(mask, tf.sequence_mask(self.lengths, T)))
        steps = tf.range(T)[None]
        # unmasked steps first (distinct keys: any sort is stable)
        self.order = tf.argsort(tf.where(mask, steps, steps + T), axis=1)

    def gather(self, x):
        """`x` [B, T, ...] with each row's unmasked steps first."""
        return tf.cond(self.right_padded, lambda: x,
                       lambda: tf.gather(x, self.order, batch_dims=1))

    def spread(self, y, h, reverse, carry_output):
        """The outputs `y` [B, T, P] of the moved steps back at their own steps. A masked
        step outputs zero, or with `carry_output` the previous output in the direction
        of processing (zero before the first); `h` is the last."""
        mask = self.mask[..., None]

        def right_padded():  # y is zero past each row's end
            if not carry_output or reverse:  # (backward, masked steps are processed first)
                return y
            carried = tf.where(self.lengths[:, None] > 0, h, tf.zeros_like(h))
            return tf.where(mask, y, carried[:, None])

        def moved():
            m = tf.cast(self.mask, tf.int32)
            count = tf.cumsum(m, 1)  # unmasked steps up to this one
            # the moved step whose output this step outputs: its own where unmasked, else
            # the one processed just before it
            j = count - m if reverse else count - 1
            due = self.mask
            if carry_output:
                due = due | ((j >= 0) & (j < self.lengths[:, None]))
            found = tf.gather(y, tf.clip_by_value(j, 0, tf.shape(y)[1] - 1), batch_dims=1)
            return tf.where(due[..., None], found, tf.zeros_like(found))

        return tf.cond(self.right_padded, right_padded, moved)


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
        w_input_t, w_rec_t, bias, b_rec, w_proj_t = (
            None if w is None else tf.convert_to_tensor(w)
            for w in (w_input_t, w_rec_t, bias, b_rec, w_proj_t))
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
        return _each_step(x, self.w_input_t) + self.bias

    def input_backward(self, x, dxw):
        """``(dx, [dw_input_t, dbias])`` (no `dw_input_t` for skip_input) from the
        gradient `dxw` of ``input_products(x)``."""
        dbias = tf.reduce_sum(dxw, [0, 1])
        if self.w_input_t is None:
            T, B, width = tf.unstack(tf.shape(dxw))  # (no -1: there may be no rows)
            split = tf.reshape(dxw, tf.stack([T, B, self.gates, width // self.gates]))
            return tf.reduce_sum(split, 2), [dbias]
        return (_each_step(dxw, self.w_input_t, transpose_b=True),
                [_product(x, dxw), dbias])

    def weights(self) -> list:
        """The weights the loop uses, in the order its gradient returns theirs."""
        return [w for w in (self.w_input_t, self.bias, self.w_rec_t, self.b_rec,
                            self.w_proj_t) if w is not None]

    def step(self, xw, h, c):
        """``(h, c, kept)``: the new state (c None but for an LSTM) from a step's input
        product, and the tensors ``step_backward`` needs of the step (a tuple of
        ``kept`` of them)."""
        if self.mode == "lstm":
            i, f, g, o = tf.split(xw + h @ self.w_rec_t, 4, axis=-1)
            i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
            c_prev, c = c, f * c + i * g
            tc = tf.tanh(c)
            out = o * tc
            # The derivatives the backward step multiplies by, made here: nothing here
            # waits for them, where there the next step would.
            factors = tf.concat([g * i * (1 - i), c_prev * f * (1 - f), i * (1 - g * g),
                                 tc * o * (1 - o)], -1)
            if self.w_proj_t is None:
                return out, c, (factors, o * (1 - tc * tc), f)
            return out @ self.w_proj_t, c, (factors, o * (1 - tc * tc), f, out)
        if self.mode == "gru":  # (split, not sliced: a slice's gradient is a padded copy)
            x_r, x_z, x_n = tf.split(xw, 3, axis=-1)
            h_r, h_z, h_n = tf.split(h @ self.w_rec_t + self.b_rec, 3, axis=-1)
            if self.gru_gates == "zrn":
                x_r, x_z, h_r, h_z = x_z, x_r, h_z, h_r
            r, z = tf.sigmoid(x_r + h_r), tf.sigmoid(x_z + h_z)
            n = tf.tanh(x_n + r * h_n)
            return (h - n) * z + n, None, (r, z, n, h_n)
        pre = xw + h @ self.w_rec_t
        h = tf.tanh(pre) if self.mode == "rnn_tanh" else tf.nn.relu(pre)
        return h, None, (h,)

    def _rec_backward(self, dz):
        """``dz @ w_rec_tᵀ``: the gradient of ``h @ w_rec_t`` for its `h`."""
        return tf.matmul(dz, self.w_rec_t, transpose_b=True)

    @property
    def kept(self) -> int:
        """How many tensors ``step`` keeps."""
        if self.mode == "lstm":
            return 3 if self.w_proj_t is None else 4
        return 4 if self.mode == "gru" else 1

    def step_backward(self, kept, h_prev, dh, dc):
        """One step's gradients, from those of its new state `dh`, `dc`: ``(dxw, dzh,
        dh_prev, dc_prev)``, where `dxw` is the input product's and `dzh` that of the
        state's product ``h_prev @ w_rec_t (+ b_rec)`` (`dxw` itself but for a GRU).
        `kept` is ``step``'s; `h_prev` the state before the step."""
        if self.mode == "lstm":
            factors, dc_dout, f = kept[:3]
            if self.w_proj_t is not None:
                dh = tf.matmul(dh, self.w_proj_t, transpose_b=True)
            dc = dc + dh * dc_dout
            dz = tf.concat([dc, dc, dc, dh], -1) * factors
            return dz, dz, self._rec_backward(dz), dc * f
        if self.mode == "gru":
            r, z, n, h_n = kept
            dn = dh * (1 - z) * (1 - n * n)
            dr = dn * h_n * r * (1 - r)
            dz = dh * (h_prev - n) * z * (1 - z)
            dx = [dr, dz, dn] if self.gru_gates == "rzn" else [dz, dr, dn]
            dzh = tf.concat(dx[:2] + [dn * r], -1)
            return tf.concat(dx, -1), dzh, dh * z + self._rec_backward(dzh), None
        (h,) = kept
        dz = dh * (1 - h * h) if self.mode == "rnn_tanh" else tf.where(h > 0, dh, tf.zeros_like(dh))
        return dz, dz, self._rec_backward(dz), None

    def recurrent_backward(self, h_prev, dzh, kept, dh):
        """The gradients of the recurrent weights (``weights`` from ``w_rec_t`` on) over
        all steps at once, from the states before each step `h_prev` [T, B, P],
        ``step_backward``'s `dzh` [T, B, G·H], and (for a projection) ``step``'s `kept`
        tensors [T, B, ...] and the new states' gradients `dh` [T, B, P]."""
        found = [_product(h_prev, dzh)]
        if self.b_rec is not None:
            found.append(tf.reduce_sum(dzh, [0, 1]))
        if self.w_proj_t is not None:
            found.append(_product(kept[3], dh))
        return found


def _each_step(a, w, transpose_b=False):
    """``a[t] @ w`` (or ``wᵀ``) for every step of `a` [T, B, M] at once: one product."""
    shape = tf.shape(a)
    flat = tf.matmul(tf.reshape(a, [-1, shape[2]]), w, transpose_b=transpose_b)
    # (the width, not -1: `a` may have no rows, a chunk's when every row has ended)
    width = tf.shape(w)[0 if transpose_b else 1]
    return tf.reshape(flat, tf.stack([shape[0], shape[1], width]))


def _product(a, b):
    """``Σ_t a[t]ᵀ b[t]`` of `a` [T, B, M] and `b` [T, B, N]: [M, N], one product."""
    return tf.matmul(tf.reshape(a, [-1, tf.shape(a)[-1]]),
                     tf.reshape(b, [-1, tf.shape(b)[-1]]), transpose_a=True)


class _Rows:
    """Which rows run which steps, and the loop over steps that honours it.

    Each row runs its first `lengths` steps (every step without lengths), and its output
    after them is zero. A loop runs each of its rows through every one of its steps: a
    row's state after its last step is picked out of the states afterwards (``_states``),
    where selecting it step by step would cost two selects a step forward and four
    back. Reversed, a row runs its own steps backwards, from its last one.

    A ragged batch runs its rows longest first (except where XLA compiles, which needs
    static shapes). Then a long sequence's later loops (``_states``' chunks) run only
    the rows still running at their first step, and a row that has ended costs nothing
    there. One ``tf.gather_nd`` takes the steps into that order (each row's reversed,
    for the reverse direction), and one takes the outputs back.
    """

    def __init__(self, lengths, max_time):
        self.lengths = lengths
        if lengths is None:
            return
        self.running = tf.transpose(tf.sequence_mask(lengths, max_time))  # [T, B]
        self.started = (lengths > 0)[:, None]
        self.sorted = not _compiled()
        self.max_time = max_time
        place = tf.range(tf.size(lengths))  # each row's place in the loop's order
        if self.sorted:
            self.order = tf.argsort(lengths, direction="DESCENDING", stable=True)
            place = tf.math.invert_permutation(self.order)
            self.sorted_lengths = tf.gather(lengths, self.order)
            self.sorted_running = tf.gather(self.running, self.order, axis=1)
        # each row's last step, as indices [B, 2] into states [T, B, ...]
        self.last = tf.stack([tf.maximum(lengths - 1, 0), place], 1)
        self._place, self._made = place, {}

    def zero_padding(self, x):
        """`x` [T, B, ...] with zeros past each row's last step."""
        if self.lengths is None:
            return x
        return tf.where(self.running[..., None], x, tf.zeros_like(x))

    def _reverse(self, a):
        """`a` [T, B, W] with each row's own steps in reverse order (padding stays)."""
        if self.lengths is None:
            return tf.reverse(a, [0])
        return tf.reverse_sequence(a, self.lengths, seq_axis=0, batch_axis=1)

    def _moves(self, reverse):
        """Indices [T, B, 2] that move steps [T, B, ...] into the loop's order of rows,
        and back; each row's own steps reversed with `reverse` (padding stays). Made
        once for each direction, for every layer."""
        if reverse in self._made:
            return self._made[reverse]

        def move(rows, lengths):  # row rows[j] to place j
            t = tf.range(self.max_time)[:, None]
            if reverse:
                t = tf.where(t < lengths, lengths - 1 - t, t)
            t, rows = tf.broadcast_to(t, tf.shape(self.running)), \
                tf.broadcast_to(rows, tf.shape(self.running))
            return tf.stack([t, rows], -1)

        made = move(self.order, self.sorted_lengths), move(self._place, self.lengths)
        self._made[reverse] = made
        return made

    def run(self, cell, x, h0, c0, reverse):
        """``(y [T, B, P], h, c)`` of `cell` over the steps of `x` [T, B, in] (zeroed past
        each row's last step) from the state `h0`, `c0` (None but for an LSTM).

        ``(h, c)`` is each row's state after its last step: the initial state for a row
        of length 0.
        """
        if self.lengths is not None and self.sorted:
            # (a row of length 0 is in no loop: its state never meets the weights)
            into, back = self._moves(reverse)
            first = lambda s: None if s is None else tf.gather(s, self.order)  # noqa: E731
            states, cs, _, _ = _states(cell, tf.gather_nd(x, into), first(h0), first(c0),
                                       self.sorted_running, self.sorted_lengths)
            return self._ends(tf.gather_nd(states, back), states, cs, h0, c0)
        if reverse:
            x = self._reverse(x)
        if self.lengths is None:
            y, _, h, c = _states(cell, x, h0, c0)
        else:
            # a row that never runs: no value of its state reaches the weights
            h, c = (None if s is None else tf.where(self.started, s, tf.zeros_like(s))
                    for s in (h0, c0))
            states, cs, _, _ = _states(cell, x, h, c, self.running)
            y, h, c = self._ends(states, states, cs, h0, c0)
        if reverse:
            y = self._reverse(y)
        return y, h, c

    def _ends(self, y, states, cs, h0, c0):
        """``run``'s ``(y, h, c)``, from the outputs `y` (in time order, their padding
        not yet zero) and the loop's `states` and `cs`."""
        h = tf.where(self.started, tf.gather_nd(states, self.last), h0)
        c = None if c0 is None else tf.where(self.started, tf.gather_nd(cs, self.last), c0)
        return self.zero_padding(y), h, c


_CHUNKS, _CHUNK_STEPS = 8, 8  # at most 8 loops, of at least 8 steps each


def _states(cell, x, h0, c0, running=None, lengths=None):
    """``(states, cs, h, c)``: each step's new state h [T, B, P], for a ragged batch an
    LSTM's each step's c [T, B, H] too (else None), and the last ``(h, c)``.

    Every row runs every step (but see `lengths`, below). With `running` [T, B] (a
    ragged batch, ``_Rows``), rows run on past their last step, on zeroed inputs, and
    what they compute there is not used. The loop back multiplies a row's state
    gradients by 0 there: no gradient (nor, for a second derivative, the gradient's own
    adjoint) crosses a row's end, and the steps past it get gradients of exactly 0.
    That needs the states there to be finite, as they are for every cell but relu,
    whose state there may overflow: a relu row keeps its state past its end, by a
    select each step, as ``jax/scan.py`` does.

    Its gradient is written out, not derived by TensorFlow from the loop: a loop back
    over the steps makes each step's gate gradients and the previous state's, and the
    weights' gradients are then products over many steps at once, where the derived
    gradient makes and sums one per step. The gradient is itself TensorFlow's operations
    on the forward loop's saved tensors, so it differentiates again (second order).

    Where the number of steps is known, they run in ``_CHUNKS`` consecutive loops. A
    chunk's products over all its steps (its input products, forward; its inputs' and
    weights' gradients, backward) then need only that chunk's loop, and TensorFlow runs
    them beside the next chunk's loop, on another thread.

    With the rows' `lengths` too (sorted longest first), each chunk runs only the rows
    still running at its first step: the first rows of the batch. The states of the
    others are zero in that chunk, and the last ``(h, c)`` is that of the last chunk's
    rows alone (there may be none): the caller picks each row's from the states. Each
    loop's shapes stay the same from step to step, which TensorFlow needs to
    differentiate it twice.
    """
    lstm, ragged = c0 is not None, running is not None
    shrinks = lengths is not None
    every_c = ragged and lstm
    keeps_state = ragged and cell.mode == "rnn_relu"
    weights = cell.weights()
    x, h0 = tf.convert_to_tensor(x), tf.convert_to_tensor(h0)
    initial = [h0, tf.convert_to_tensor(c0)] if lstm else [h0]
    steps = x.shape[0]
    # (one loop under XLA: it compiles no more than two alike loops in one function,
    # tensorflow#122886, and schedules the products itself)
    chunks = 1 if steps is None or _compiled() else max(1, min(_CHUNKS, steps // _CHUNK_STEPS))
    bounds = [None] + [steps * k // chunks for k in range(1, chunks)] + [None]
    spans = list(zip(bounds[:-1], bounds[1:]))
    zero = tf.zeros((), x.dtype)  # a loop variable that is not used
    batch = tf.shape(x)[1]
    # each chunk's rows: those still running at its first step, the first of the batch
    counts = [tf.reduce_sum(tf.cast(lengths > (a or 0), tf.int32)) if shrinks else None
              for a, _ in spans]

    def rows(a, k):
        """The first `k` rows of `a` [n, B, ...] (all with None)."""
        return a if k is None else a[:, :k]

    def grown(a, size, axis=1):
        """`a` with zero rows after its own (along `axis`), `size` in all."""
        pad = [[0, 0]] * a.shape.rank
        pad[axis] = [0, size - tf.shape(a)[axis]]
        return tf.pad(a, pad)

    def forward(xw, h, c, running):
        """One chunk's loop: its states (h, and c if `every_c`) and the last ``(h, c)``,
        and what its gradient needs: each step's state h before it, and the tensors
        ``_Cell.step`` keeps (stacked: a SavedModel holding the gradient cannot hold
        ``tf.TensorArray``s). With `running` [n, B], a row keeps its h past its end."""
        n = _length(xw)
        inputs = tf.TensorArray(xw.dtype, size=n).unstack(xw)
        array = lambda: tf.TensorArray(xw.dtype, size=n)  # noqa: E731
        h_first = h

        def body(t, h, c, hs, cs, kept):
            h_prev = h
            h, new_c, keep = cell.step(inputs.read(t), h, c)
            if running is not None:
                h = tf.where(running[t][:, None], h, h_prev)
            kept = tuple(a.write(t, k) for a, k in zip(kept, keep))
            cs = cs.write(t, new_c) if every_c else cs
            return t + 1, h, new_c if lstm else c, hs.write(t, h), cs, kept

        # maximum_iterations: the arrays can be allocated once, at their size
        _, h, c, hs, cs, kept = tf.while_loop(
            lambda t, *_: t < n, body,
            (tf.constant(0), h, c, array(), array(), tuple(array() for _ in range(cell.kept))),
            maximum_iterations=n)
        hs = hs.stack()
        h_prev = tf.concat([h_first[None], hs[:-1]], 0)[:n]
        return hs, cs.stack() if every_c else None, h, c, (h_prev, tuple(a.stack() for a in kept))

    def backward(d_states, d_cs, running, saved, dh, dc):
        """One chunk's loop back: its ``(dxw, dzh, dh_new)`` stacked (see
        ``_Cell.step_backward``; `dh_new` the new states' gradients, for a projection),
        and the gradients of the state before it. `running` [n, B, 1] (ragged rows) is 1
        where a row runs, else 0."""
        n = _length(d_states)
        d_states, h_prevs, *kept = (tf.TensorArray(d_states.dtype, size=n).unstack(a)
                                    for a in (d_states, saved[0]) + saved[1])
        d_cs = tf.TensorArray(dh.dtype, size=n).unstack(d_cs) if every_c else None
        array = lambda: tf.TensorArray(dh.dtype, size=n)  # noqa: E731

        def body(t, dh, dc, dxws, dzhs, dhs):
            t = t - 1
            d_new = dh + d_states.read(t)
            d_c = (dc + d_cs.read(t) if every_c else dc) if lstm else None
            if running is not None:  # 0 past a row's end: nothing crosses it
                d_new = d_new * running[t]
                d_c = d_c * running[t] if lstm else None
            dxw, dzh, dh_prev, dc_prev = cell.step_backward(
                [a.read(t) for a in kept], h_prevs.read(t) if cell.mode == "gru" else None,
                d_new, d_c)
            dzhs = dzhs.write(t, dzh) if cell.mode == "gru" else dzhs
            dhs = dhs.write(t, d_new) if cell.w_proj_t is not None else dhs
            return t, dh_prev, dc_prev if lstm else dc, dxws.write(t, dxw), dzhs, dhs

        _, dh, dc, dxws, dzhs, dhs = tf.while_loop(
            lambda t, *_: t > 0, body, (n, dh, dc, array(), array(), array()),
            maximum_iterations=n)
        dxw = dxws.stack()
        return ((dxw, dzhs.stack() if cell.mode == "gru" else dxw,
                 dhs.stack() if cell.w_proj_t is not None else None), dh, dc)

    @tf.custom_gradient
    def loop(x, *tensors):
        h, c = tensors[0], tensors[1] if lstm else zero
        states, cs, saved, after = [], [], [], []
        for (a, b), k in zip(spans, counts):
            with tf.control_dependencies(after):
                xw = cell.input_products(rows(x[a:b], k))
            after = [xw, h]  # the next chunk's products: beside this chunk's loop
            if shrinks:  # the rows that have ended drop out
                h, c = h[:k], c[:k] if lstm else c
            hs, cs_k, h, c, kept = forward(xw, h, c,
                                           rows(running[a:b], k) if keeps_state else None)
            states.append(grown(hs, batch) if shrinks else hs)
            cs.append(grown(cs_k, batch) if shrinks and every_c else cs_k)
            saved.append(kept)
        join = lambda parts: parts[0] if chunks == 1 else tf.concat(parts, 0)  # noqa: E731
        states = join(states)
        cs = join(cs) if every_c else None

        def gradient(d_states, d_cs, dh, dc):
            running_f = tf.cast(running, dh.dtype)[..., None] if ragged else None
            d_states = tf.zeros_like(states) if d_states is None else d_states
            if every_c:
                d_cs = tf.zeros_like(cs) if d_cs is None else d_cs
            dh = tf.zeros_like(h) if dh is None else dh
            dc = (tf.zeros_like(c) if dc is None else dc) if lstm else zero
            dx, found = [], None
            for (a, b), k, chunk in reversed(list(zip(spans, counts, saved))):
                if shrinks:  # the rows that end in this chunk join
                    dh, dc = grown(dh, k, 0), grown(dc, k, 0) if lstm else dc
                (dxw, dzh, dh_new), dh, dc = backward(
                    rows(d_states[a:b], k), rows(d_cs[a:b], k) if every_c else None,
                    rows(running_f[a:b], k) if ragged else None, chunk, dh, dc)
                dx_k, input_grads = cell.input_backward(rows(x[a:b], k), dxw)
                grads = input_grads + cell.recurrent_backward(chunk[0], dzh, chunk[1], dh_new)
                dx.append(grown(dx_k, batch) if shrinks else dx_k)
                found = grads if found is None else [f + g for f, g in zip(found, grads)]
            dx = dx[0] if chunks == 1 else tf.concat(dx[::-1], 0)
            if shrinks:  # (rows of length 0 never ran)
                dh, dc = grown(dh, batch, 0), grown(dc, batch, 0) if lstm else dc
            return [dx, dh] + ([dc] if lstm else []) + found

        # (four outputs always: a mode's unused ones are `zero`, and get no gradient)
        return (states, cs if every_c else zero, h, c), gradient

    states, cs, h, c = loop(x, *initial, *weights)
    return states, cs if every_c else None, h, c if lstm else None


def _compiled() -> bool:
    """Whether the graph being built is one that XLA compiles (``jit_compile=True``)."""
    from tensorflow.python.ops import control_flow_util  # (no public API says it)
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _length(a):
    """The number of steps of `a` [T, ...]: an int where it is known (XLA takes a
    loop's bound as a constant), else a tensor."""
    return tf.shape(a)[0] if a.shape[0] is None else a.shape[0]
