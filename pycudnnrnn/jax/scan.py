"""The RNN in JAX's own operations, for XLA's CPU: one ``lax.scan`` per pseudo-layer.

On the CPU a custom call runs the NumPy backend one time step at a time from Python,
between XLA's own kernels; written in JAX, the same function is compiled by XLA whole
(each step's products and gate arithmetic fused), and is differentiated, batched and
sharded by JAX itself. It computes what ``pycudnnrnn.cpu.rnn`` computes, step for
step (``docs/semantics.md``); the tests hold the two together.

* Each step makes two products, the input's and the state's, each for all gates at once
  (gates in cuDNN's order); see ``_Kind.pre_activations`` for why inside the scan.
* Derivatives (``_steps``, a ``jax.custom_jvp``): a step keeps its pre-activations and
  the state it started from, and the rest is recomputed (cheap, elementwise); the weight
  and input gradients are one product each over all steps, outside the loop, whose
  backward steps then make one product each (JAX's own derivative of the loop makes
  four, and keeps a dozen [B, H] intermediates a step). Forward mode, higher orders,
  ``vmap`` and sharding work as for any JAX function.
* A ragged batch: a row's results are those of its steps ``t < length`` (the steps
  after are computed and dropped, see ``_Rows.scan``); the reverse direction reads each
  row backwards from its own last step; padding of the output is zero. The state of a
  row of length 0 is zeroed before it meets the weights, so that an initial state that
  is never used (even NaN) cannot reach the weight gradients, as in the NumPy backend;
  the row's output_h is that state as it came.
* float16 and bfloat16 compute in float32 and round once, when results leave.

Dropout masks are drawn by the NumPy backend's generator, which JAX cannot reproduce:
a training call that applies dropout stays on the custom call (``pycudnnrnn.jax``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

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
    by one ``split`` (``layout.tiles``)."""
    pieces = layout.tiles(pseudo_layers)
    cuts = [stop for _, stop, _, _ in pieces]
    arrays = jnp.split(params, cuts[:-1]) if cuts[-1] == params.shape[0] else \
        jnp.split(params, cuts)[:-1]
    views = [dict.fromkeys(layout.BLOCK_NAMES) for _ in pseudo_layers]
    for array, (_, _, k, name) in zip(arrays, pieces):
        if k is not None:
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
            states, carry = _steps(cell.kind, reverse, cell.weights, xw, carry, None)
            return states[0], carry

        # Every row runs every step and keeps each step's state: no select per step (XLA
        # runs a loop's ops one by one, and on small problems they cost more than the
        # products). A row's steps past its end compute on zero input and finite states,
        # and are dropped after: the output's padding is zeroed, and the final state is
        # read at the row's last step. A row of length 0 never runs: its state is zeroed
        # before any step reads it (it may hold anything, even NaN, which would reach the
        # weight gradients through the dropped steps) and given back as it came.
        # (relu's state is unbounded: there a row keeps its state past its end, lest the
        # dropped steps overflow, and inf · 0 make the gradients NaN.)
        if reverse:
            xw = self._reverse(xw)
        started = (self.lengths > 0)[:, None]
        states, _ = _steps(cell.kind, False, cell.weights, xw,
                           tuple(jnp.where(started, s, 0) for s in carry),
                           None if cell.kind.bounded else self.running)
        last = jnp.maximum(self.lengths - 1, 0)[None, :, None]
        carry = tuple(jnp.where(started, jnp.take_along_axis(a, last, axis=0)[0], s)
                      for a, s in zip(states, carry))
        y = jnp.where(self.running[..., None], states[0], 0)
        return (self._reverse(y) if reverse else y), carry


# --------------------------------------------------------------------------- one pseudo-layer

@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _steps(kind, reverse, weights, xs, carry, running):
    """The state after each step (a tuple of ``[T, B, ·]``, as `carry`) and after the last,
    of a scan of `kind`'s cell with `weights` over `xs` [T, B, in] from `carry`.
    `running` [T, B] (or None: every row) says which rows take a step; the others keep
    their state (relu's rule, see ``_Rows.scan``).

    Its derivative (``_steps_jvp``) is the scan's own, arranged so that the products
    with the weights' tangents, and so in reverse mode the weight and input gradients,
    are one product each over all steps, outside the loop, as cuDNN and the NumPy
    backend make them: a loop keeps only the products that carry the state.
    """
    return _forward(kind, reverse, weights, xs, carry, running)[:2]


def _forward(kind, reverse, weights, xs, carry, running, keep=False):
    """``(states, final carry, kept)``; `keep`: also each step's pre-activations and (with
    a projection) unprojected output, what the derivative needs (else ``kept`` is None)."""
    def step(carry, inputs):
        x, run = inputs
        pre = kind.pre_activations(weights, x, carry[0])
        out, *rest = kind.elementwise(pre, carry, run)
        new = (kind.project(weights, out), *rest)
        return new, (new, (pre, out if kind.projected else None) if keep else None)

    final, (states, kept) = jax.lax.scan(step, carry, (xs, running), reverse=reverse)
    return states, final, kept


@_steps.defjvp
def _steps_jvp(kind, reverse, primals, tangents):
    weights, xs, carry, running = primals
    d_weights, d_xs, d_carry, _ = tangents
    states, final, (pre, out) = _forward(kind, reverse, weights, xs, carry, running, keep=True)
    # The state each step starts from: the one before it in the scan's order.
    if reverse:
        before = tuple(jnp.concatenate([s[1:], c[None]]) for s, c in zip(states, carry))
    else:
        before = tuple(jnp.concatenate([c[None], s[:-1]]) for s, c in zip(states, carry))
    # What the tangents of weights and inputs add to each step, all steps at once: the
    # pre-activations' (W·dx + dW·x + dW_rec·h + db) and the projection's (dP·out).
    d_pre = jax.jvp(lambda w, x: kind.pre_activations(w, x, before[0]),
                    (weights, xs), (d_weights, d_xs))[1]
    d_projected = jax.jvp(lambda w: kind.project(w, out), (weights,), (d_weights,))[1] \
        if kind.projected else None

    def d_elementwise(pre, state, run, d_pre, d_state):
        return jax.jvp(lambda p, s: kind.elementwise(p, s, run), (pre, state),
                       (d_pre, d_state))[1]
    # Recomputed in the backward pass from pre and the state (cheap, elementwise), not
    # stored: stored, they were a dozen [B, H] blocks a step for an LSTM, and a medium
    # problem's buffers crossed glibc's 32 MB mmap threshold: ~8000 page faults a call.
    d_elementwise = jax.checkpoint(d_elementwise)

    def step(d_carry, inputs):
        pre_t, before_t, d_pre_t, d_projected_t, run = inputs
        d_pre_t = tuple(a + b for a, b in zip(d_pre_t, kind.recurrent(weights, d_carry[0])))
        d_out, *d_rest = d_elementwise(pre_t, before_t, run, d_pre_t, d_carry)
        d_h = kind.project(weights, d_out)
        d_new = (d_h if d_projected_t is None else d_h + d_projected_t, *d_rest)
        return d_new, d_new

    d_final, d_states = jax.lax.scan(step, d_carry, (pre, before, d_pre, d_projected,
                                                      running), reverse=reverse)
    return (states, final), (d_states, d_final)


@dataclasses.dataclass(frozen=True)
class _Kind:
    """A pseudo-layer's cell, apart from its weights: static, so hashable."""

    mode: str
    gates: int
    skip: bool
    projected: bool

    @property
    def bounded(self) -> bool:
        return self.mode != "rnn_relu"  # tanh, σ and LSTM's c (+1 a step at most)

    def pre_activations(self, w, x, h):
        """The products of a step (or of every step at once: any leading axes), with the
        biases, each for all gates at once (gates in cuDNN's order): ``(W x + b + R h,)``;
        a GRU's ``(W_rz x + b + R_rz h, W_n x + b_in, R_n h + b_rec)``, its candidate's
        two apart (the reset gate scales the second) and its other gates' summed: what
        a step keeps for the derivative is 4 blocks of [B, H], not 6 (at 6, a medium
        problem's buffers crossed glibc's 32 MB mmap threshold: ~9000 page faults a call).

        Both products inside the step: XLA's CPU runs a scan over the input faster than
        over its transform precomputed for every step (the loop reads its slices of a
        [T, B, G·H] buffer dearly, and the buffer adds to the memory each call takes).
        """
        xw = (jnp.tile(x, (1,) * (x.ndim - 1) + (self.gates,)) if self.skip
              else x @ w["w_input_t"]) + w["bias"]
        if self.mode == "gru":
            hw = h @ w["w_rec_t"] + w["b_rec"]
            return self._gru_parts(xw, hw)
        return (xw + h @ w["w_rec_t"],)

    def recurrent(self, w, d_h):
        """What a state's tangent `d_h` adds to the pre-activations (linear in it)."""
        d_rec = d_h @ w["w_rec_t"]
        return self._gru_parts(jnp.zeros_like(d_rec), d_rec) if self.mode == "gru" \
            else (d_rec,)

    @staticmethod
    def _gru_parts(xw, hw):
        """A GRU's pre-activations from its two products (gates r, z, n in each)."""
        rz = 2 * hw.shape[-1] // 3
        return xw[..., :rz] + hw[..., :rz], xw[..., rz:], hw[..., rz:]

    def elementwise(self, pre, carry, running):
        """The step's new ``(output, c)`` (``(output,)`` but for an LSTM) from its
        pre-activations and `carry`, the state it starts from; rows not `running` (None:
        all run) keep their state."""
        if self.mode == "gru":
            rz, x_n, h_n = pre
            r, z = jnp.split(jax.nn.sigmoid(rz), 2, axis=-1)
            n = jnp.tanh(x_n + r * h_n)
            new = ((carry[0] - n) * z + n,)
        elif self.mode == "lstm":
            i, f, g, o = jnp.split(pre[0], 4, axis=-1)
            c = jax.nn.sigmoid(f) * carry[1] + jax.nn.sigmoid(i) * jnp.tanh(g)
            new = (jax.nn.sigmoid(o) * jnp.tanh(c), c)
        else:
            new = (jnp.tanh(pre[0]) if self.mode == "rnn_tanh" else jax.nn.relu(pre[0]),)
        if running is None:
            return new
        return tuple(jnp.where(running[:, None], n, s) for n, s in zip(new, carry))

    def project(self, w, out):
        """An LSTM's projection of its output (linear); the output itself without one."""
        return out @ w["w_proj_t"] if self.projected else out


class _Cell:
    """One pseudo-layer's cell (``kind``) and weights (``weights``: its blocks from
    ``_split``, arranged for the products)."""

    def __init__(self, config, blocks):
        w_input, w_rec, w_proj = blocks["w_input"], blocks["w_recurrent"], blocks["w_projection"]
        b_input, b_rec = blocks["b_input"], blocks["b_recurrent"]
        gru = config.rnn_mode == "gru"
        self.kind = _Kind(config.rnn_mode, config.num_gates, w_input is None,
                          w_proj is not None)
        self.weights = {"w_input_t": None if w_input is None else w_input.T,
                        "w_rec_t": w_rec.T, "bias": b_input if gru else b_input + b_rec,
                        "b_rec": b_rec if gru else None,
                        "w_proj_t": None if w_proj is None else w_proj.T}


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
