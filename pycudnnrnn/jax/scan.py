"""The RNN in JAX's own operations, for XLA's CPU: one ``lax.scan`` per pseudo-layer.

On the CPU a custom call runs the NumPy backend one time step at a time from Python,
between XLA's own kernels; written in JAX, the same function is compiled by XLA whole
(each step's products and gate arithmetic fused), and is differentiated, batched and
sharded by JAX itself. It computes what ``pycudnnrnn.cpu.rnn`` computes, step for
step (``docs/semantics.md``); the tests hold the two together.

* Each step makes two products, the input's and the state's, each for all gates at once
  (gates in cuDNN's order); see ``_Cell._products`` for why inside the scan.
* For the backward pass a step keeps its gates' pre-activations (named
  ``pycudnnrnn.gates``) and the state it started from; ``jax.checkpoint`` recomputes the
  rest, which is cheap elementwise work (see ``_Cell.__call__``).
* A ragged batch: a row's results are those of its steps ``t < length`` (the steps
  after are computed and dropped, see ``_Rows.scan``); the reverse direction reads each
  row backwards from its own last step; padding of the output is zero. The state of a row of length 0 is zeroed before it meets the weights,
  so that an initial state that is never used (even NaN) cannot reach the weight
  gradients, as in the NumPy backend; the row's output_h is that state as it came.
* float16 and bfloat16 compute in float32 and round once, when results leave.

Dropout masks are drawn by the NumPy backend's generator, which JAX cannot reproduce:
a training call that applies dropout stays on the custom call (``pycudnnrnn.jax``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from ..core import dtypes, layout


def rnn(problem, input, input_h, input_c, params, lengths):
    """``(output, output_h, output_c)`` for a checked `problem`; `lengths` is None (every
    row runs every step) or an integer ``[B]`` array whose values are in range."""
    c = problem.config
    cdt = dtypes.compute_dtype(problem.dtype)
    tm = problem.time_major
    x = (input if tm else jnp.swapaxes(input, 0, 1)).astype(cdt)
    h0 = (input_h if tm else jnp.swapaxes(input_h, 0, 1)).astype(cdt)
    c0 = (input_c if tm else jnp.swapaxes(input_c, 0, 1)).astype(cdt) if c.is_lstm else None
    params = params.astype(cdt)
    rows = _Rows(lengths, problem.max_time)
    x = rows.zero_padding(x)  # padding may hold anything, even NaN
    blocks = _split(params, layout.pseudo_layer_blocks(c))
    output_h, output_c = [], []
    for layer in range(c.num_layers):
        outputs = []
        for direction in range(c.num_dirs):
            k = layer * c.num_dirs + direction
            cell = _Cell(c, blocks[k])
            carry = (h0[k], c0[k]) if c.is_lstm else (h0[k],)
            y, carry = rows.scan(cell, x, carry, reverse=direction == 1)
            outputs.append(y)
            output_h.append(carry[0])
            if c.is_lstm:
                output_c.append(carry[1])
        x = outputs[0] if c.num_dirs == 1 else jnp.concatenate(outputs, axis=-1)

    def leave(a, axes):
        a = a.astype(problem.dtype)
        return a if tm else jnp.swapaxes(a, *axes)

    output = leave(x, (0, 1))
    output_h = leave(jnp.stack(output_h), (0, 1))
    output_c = leave(jnp.stack(output_c), (0, 1)) if c.is_lstm \
        else jnp.zeros((0,), problem.dtype)
    return output, output_h, output_c


def _split(params, pseudo_layers):
    """Each pseudo-layer's blocks as arrays (``{name: array or None}``), cut from `params`
    by one ``split``: its gradient is one concatenation, where a slice per block would
    each add a zero-padded copy of the whole buffer."""
    names = ("w_input", "w_recurrent", "w_projection", "b_input", "b_recurrent")
    blocks = sorted((b.offset, b.stop, k, name) for k, layer in enumerate(pseudo_layers)
                    for name in names if (b := getattr(layer, name)) is not None)
    cuts, pieces, previous = [], [], 0
    for offset, stop, k, name in blocks:
        if offset != previous:  # (the buffer is tiled by the blocks; a gap stays a piece)
            cuts.append(offset)
            pieces.append(None)
        cuts.append(stop)
        pieces.append((k, name))
        previous = stop
    arrays = jnp.split(params, cuts[:-1]) if cuts[-1] == params.shape[0] else \
        jnp.split(params, cuts)[:-1]
    views = [dict.fromkeys(names) for _ in pseudo_layers]
    for array, piece in zip(arrays, pieces):
        if piece is not None:
            k, name = piece
            views[k][name] = array.reshape(getattr(pseudo_layers[k], name).shape)
    return views


class _Rows:
    """Which rows run at which step, and the scan over steps that honours it."""

    def __init__(self, lengths, max_time):
        self.lengths = lengths
        if lengths is not None:
            t = jnp.arange(max_time)[:, None]
            self.running = t < lengths[None, :]                            # [T, B]
            # The step a row reads at scan step t when it runs backwards: its own last
            # step first; padding stays in place. Its own inverse.
            self.backwards = jnp.where(self.running, lengths[None, :] - 1 - t, t)

    def zero_padding(self, x):
        return x if self.lengths is None else jnp.where(self.running[..., None], x, 0)

    def _reverse(self, a):
        """`a` [T, B, W] with each row's steps in reverse order (padding stays)."""
        return jnp.take_along_axis(a, self.backwards[..., None], axis=0)

    def scan(self, cell, xw, carry, reverse):
        """Run `cell` over the steps of `xw` [T, B, in] from `carry`; ``(y, carry)``."""
        if self.lengths is None:
            def step(carry, xw_t):
                carry = cell(carry, xw_t)
                return carry, carry[0]
            carry, y = jax.lax.scan(step, carry, xw, reverse=reverse)
            return y, carry

        # Every row runs every step and keeps each step's state: no select per step (XLA
        # runs a loop's ops one by one, and on small problems they cost more than the
        # products). A row's steps past its end compute on zero input and finite states,
        # and are dropped after: the output's padding is zeroed, and the final state is
        # read at the row's last step. A row of length 0 never runs: its state is zeroed
        # before any step reads it (it may hold anything, even NaN, which would reach the
        # weight gradients through the dropped steps) and given back as it came.
        # (relu's state is unbounded: there a row keeps its state past its end, lest the
        # dropped steps overflow, and inf · 0 make the gradients NaN.)
        def step(carry, inputs):
            xw_t, running = inputs
            new = cell(carry, xw_t)
            if cell.bounded:
                return new, new
            new = tuple(jnp.where(running[:, None], n, s) for n, s in zip(new, carry))
            return new, new

        if reverse:
            xw = self._reverse(xw)
        started = (self.lengths > 0)[:, None]
        _, states = jax.lax.scan(step, tuple(jnp.where(started, s, 0) for s in carry),
                                 (xw, self.running))
        last = jnp.maximum(self.lengths - 1, 0)[None, :, None]
        carry = tuple(jnp.where(started, jnp.take_along_axis(a, last, axis=0)[0], s)
                      for a, s in zip(states, carry))
        y = jnp.where(self.running[..., None], states[0], 0)
        return (self._reverse(y) if reverse else y), carry


_GATES = "pycudnnrnn.gates"
_KEEP_GATES = jax.checkpoint_policies.save_only_these_names(_GATES)


class _Cell:
    """One pseudo-layer's weights (its blocks, from ``_split``) and its step, in cuDNN's
    gate order."""

    def __init__(self, config, blocks):
        self.mode = config.rnn_mode
        self.gates = config.num_gates
        self.bounded = self.mode != "rnn_relu"  # tanh, σ and LSTM's c (+1 a step at most)
        w_input, w_rec = blocks["w_input"], blocks["w_recurrent"]
        self.w_proj = blocks["w_projection"]
        b_input, b_rec = blocks["b_input"], blocks["b_recurrent"]
        gru = self.mode == "gru"
        self.bias = b_input if gru else b_input + b_rec
        self.b_rec = b_rec
        self.skip = w_input is None
        self.w_input_t = None if self.skip else w_input.T
        self.w_rec_t = w_rec.T

    def _products(self, x, h):
        """``(W x + b, R h)`` of one step, each one product for every gate.

        Both inside the step: XLA's CPU runs a scan over the input 2-2.5 times faster than
        over its transform precomputed for every step (the loop reads its slices of a
        [T, B, G·H] buffer dearly), and one product per step for all gates ~10 % faster in
        training than one per gate or [x, h] joined (measured: benchmarks/peers.py).
        """
        xw = (jnp.tile(x, (1, self.gates)) if self.skip else x @ self.w_input_t) + self.bias
        return xw, h @ self.w_rec_t

    def __call__(self, carry, x):
        """The state after one step from `carry` on input `x`.

        Differentiated, it keeps only what is named ``pycudnnrnn.gates`` (and its own
        arguments): kept whole, JAX's linearisation stores a dozen [B, H] intermediates a
        step for an LSTM, and a medium problem's buffers (T64 B32 H256) then cross glibc's
        32 MB mmap threshold, so that every call pays ~8000 page faults, a third of its
        time (measured: benchmarks/peers.py, flax).
        """
        return jax.checkpoint(self._step, policy=_KEEP_GATES)(carry, x)

    def _step(self, carry, x):
        h = carry[0]
        xw, rec = self._products(x, h)
        if self.mode == "gru":
            xw, rec = checkpoint_name(xw, _GATES), checkpoint_name(rec, _GATES)
            xs = jnp.split(xw, 3, axis=-1)
            rs = jnp.split(rec + self.b_rec, 3, axis=-1)
            r, z = (jax.nn.sigmoid(a + b) for a, b in zip(xs[:2], rs[:2]))
            n = jnp.tanh(xs[2] + r * rs[2])
            return ((h - n) * z + n,)
        pre = checkpoint_name(xw + rec, _GATES)
        if self.mode == "lstm":
            i, f, g, o = jnp.split(pre, 4, axis=-1)
            c = jax.nn.sigmoid(f) * carry[1] + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h if self.w_proj is None else h @ self.w_proj.T), c
        return (jnp.tanh(pre) if self.mode == "rnn_tanh" else jax.nn.relu(pre),)


def applies(problem) -> bool:
    """Whether this module computes `problem`: everything but dropout masks (drawn in
    training, between layers: the NumPy backend's rule)."""
    return not problem.dropout_layers


def constant_lengths(lengths, max_time):
    """Lengths known at trace time (checked already) as a constant, or None when every
    row runs every step: no masks to apply."""
    if lengths is None:
        return None
    lengths = np.asarray(lengths)
    return None if bool((lengths == max_time).all()) else jnp.asarray(lengths, jnp.int32)
