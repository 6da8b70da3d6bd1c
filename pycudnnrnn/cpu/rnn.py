"""The CPU backend: cuDNN's RNN math in NumPy, forward and backprop.

It is the oracle for the cuDNN backend and a real CPU fallback, so it is written for
speed as well as for reading against cuDNN's equations (see ``docs/semantics.md``):

* The batch is sorted by length, longest first, once per call. At every time step the
  sequences still running are then a prefix ``[:k]`` of the batch in *both*
  directions, so each step works on plain slices: no masks, no Python loop over the
  batch. A sequence's state simply stops changing after its last step, which is
  exactly what output_h must hold; zero-length sequences never start.
* Data is time-major ``[T, B, width]`` inside. The input transform of all time steps
  is one matrix product per pseudo-layer outside the time loop; so are all weight
  gradients, from the per-step gate gradients kept in one array.
* Gates are kept with the sigmoid gates first (LSTM i, f, o, c; GRU r, z, h), whose
  pre-activations are pre-scaled by ½ so that one ``tanh`` over all gates and one
  multiply-add give ``σ(x) = ½·tanh(x/2) + ½``.
* float16 and bfloat16 compute in float32, as cuDNN does, and round once, to the
  caller's dtype, when results leave (see ``docs/semantics.md``, "dtypes").

``reserve_space`` is a uint8 array: a header that identifies the forward call that
made it, then the activations backprop needs (layer outputs, gate activations, LSTM
cells, GRU's ``R_h·h + b_Rh``, dropout masks) in the compute dtype. Inference uses the
same code with a scratch buffer that keeps only what the next step or layer reads.
"""

from __future__ import annotations

import math

import numpy as np

from ..core import dtypes, layout, reserve_header
from ..core.config import Problem

_MAGIC = b"pycudnnrnn-cpu\x00\x01"
_HEADER_BYTES = reserve_header.HEADER_BYTES


_compute_dtype = dtypes.compute_dtype  # float32 for float16 and bfloat16


# --------------------------------------------------------------------------- batch order

class _Batch:
    """The length-sorted order of the batch and how many sequences run at each step."""

    def __init__(self, problem: Problem):
        lengths = problem.full_lengths
        self.order = np.argsort(-lengths, kind="stable")
        self.inverse = np.argsort(self.order, kind="stable")
        self.lengths = lengths[self.order]
        T, B = problem.max_time, problem.batch_size
        self.ragged = problem.lengths is not None and bool((self.lengths < T).any())
        if self.ragged:  # sequences longer than t, from the sorted lengths: no [T, B] mask
            ended = np.searchsorted(self.lengths[::-1], np.arange(T), side="right")
            self.active = (B - ended).tolist()
        else:
            self.active = _EveryRow(B, T)

    def padding(self):
        """(t, k) for every step at which rows ``[k:]`` do not run."""
        if not self.ragged:
            return iter(())
        B = len(self.order)
        return ((t, k) for t, k in enumerate(self.active) if k < B)

    def data_in(self, x, time_major, dtype):
        """Caller's data → sorted, time-major, contiguous, compute dtype, zero padding."""
        x = x if time_major else x.swapaxes(0, 1)
        x = np.ascontiguousarray(x[:, self.order], dtype=dtype)
        for t, k in self.padding():
            # Padding may hold anything (even NaN); zero it so no product can see it.
            x[t, k:] = 0
        return x

    def state_in(self, s, time_major, dtype):
        s = s if time_major else s.swapaxes(0, 1)
        return np.ascontiguousarray(s[:, self.order], dtype=dtype)

    def data_out(self, x, time_major, dtype):
        x = x[:, self.inverse]
        return np.ascontiguousarray(x if time_major else x.swapaxes(0, 1), dtype=dtype)

    state_out = data_out

    def previous(self, outputs, initial, reverse):
        """The state each step started from, ``[T, B, W]``, for all steps at once."""
        prev = np.empty_like(outputs)
        if not reverse:
            prev[0] = initial
            prev[1:] = outputs[:-1]
        else:
            prev[:-1] = outputs[1:]
            prev[-1] = initial
            started = np.flatnonzero(self.lengths)
            prev[self.lengths[started] - 1, started] = initial[started]
        for t, k in self.padding():
            # A row that does not run at a step meets a zero gradient there, and 0·NaN is
            # NaN: zero its state so that a zero-length sequence's initial state (which may
            # hold anything) cannot reach the weight gradients.
            prev[t, k:] = 0
        return prev


class _EveryRow:
    """``active`` when every sequence runs every step: B at each of T steps, without a
    list of T entries (a plan for T = 10**9 would build 8 GB before any size check)."""

    def __init__(self, batch_size: int, max_time: int):
        self.batch_size, self._T = batch_size, max_time

    def __len__(self):
        return self._T

    def __getitem__(self, t: int) -> int:
        if not -self._T <= t < self._T:
            raise IndexError(t)
        return self.batch_size


# --------------------------------------------------------------------------- memory

#: Python objects per pseudo-layer: the layout table, reserve-space views, weight views
#: (about 6 KiB measured in a forward or backprop, 1 KiB kept by a plan).
_RUN_BYTES_PER_PSEUDO_LAYER = 8 << 10
_PLAN_BYTES_PER_PSEUDO_LAYER = 2 << 10
#: A ragged batch's per-step table (a Python int per step, and the arrays it is made of).
_PLAN_BYTES_PER_RAGGED_STEP = 64


def plan_nbytes(problem: Problem) -> int:
    """An upper estimate of what a plan keeps: the batch order (five [B] int64 arrays),
    the per-step table of a ragged batch and the per-pseudo-layer tables; checked before
    the plan builds any of it."""
    ragged = problem.lengths is not None
    return (40 * problem.batch_size + _PLAN_BYTES_PER_RAGGED_STEP * problem.max_time * ragged
            + _PLAN_BYTES_PER_PSEUDO_LAYER * problem.config.num_pseudo_layers)


# --------------------------------------------------------------------------- reserve space

def _reserve_groups(problem: Problem):
    """The reserve space's entries, kind by kind: ``(name, indices, shape)``, each kind
    one entry ``name + str(i)`` of `shape` per index. (Sizes are summed over these, not
    over the entries: an estimate for 10**9 layers makes no 10**9 tuples.)"""
    c = problem.config
    T, B, H = problem.max_time, problem.batch_size, c.num_units
    width = c.num_dirs * c.state_size
    groups = [("y", range(_output_slots(problem)), (T, B, width)),
              ("mask", problem.dropout_layers, (T, B, width))]
    if c.rnn_mode in ("lstm", "gru"):
        steps = T if problem.is_training else 1
        slots = range(c.num_pseudo_layers if problem.is_training else 1)
        groups += [("gates", slots, (steps, B, c.num_gates * H)),
                   ("c" if c.is_lstm else "hr", slots, (steps, B, H))]
    return groups


def _reserve_entries(problem: Problem):
    return [(f"{name}{i}", shape) for name, indices, shape in _reserve_groups(problem)
            for i in indices]


def _output_slots(problem: Problem) -> int:
    """Layer outputs kept: all for backprop; in inference two take turns (a layer reads
    the one before)."""
    layers = problem.config.num_layers
    return layers if problem.is_training else min(layers, 2)


def reserve_nbytes(problem: Problem) -> int:
    """Bytes of the reserve_space forward makes for this problem."""
    itemsize = _compute_dtype(problem.dtype).itemsize
    # math.prod, not np.prod: sizes may be symbolic while PyTorch traces (pycudnnrnn.torch)
    return _HEADER_BYTES + itemsize * sum(len(indices) * math.prod(shape)
                                          for _, indices, shape in _reserve_groups(problem))


def _sizes(problem: Problem):
    """Element counts the estimates below are made of."""
    c = problem.config
    TB = problem.max_time * problem.batch_size
    LDB = c.num_pseudo_layers * problem.batch_size
    return c, TB, LDB, c.num_dirs * c.state_size, c.num_gates * c.num_units


def _weight_copies(problem: Problem) -> int:
    """Bytes of one pseudo-layer's weights as ``_Weights`` copies them (gathered, cast,
    scaled and transposed: three copies of the largest pseudo-layer are plenty)."""
    c = problem.config
    gh, P, H = c.num_gates * c.num_units, c.state_size, c.num_units
    widest = max(c.input_size, c.num_dirs * P)
    largest = gh * (widest + P + 2) + (P * H if c.num_proj else 0)
    return 3 * largest * max(problem.dtype.itemsize, _compute_dtype(problem.dtype).itemsize)


def forward_nbytes(problem: Problem) -> int:
    """An upper estimate of the bytes ``forward`` allocates at its peak.

    What lives throughout (the input in compute dtype, the states, the reserve space or
    inference scratch) plus the largest of the transient phases: the input's reordering
    copy, drawing the dropout masks, a layer, and the output's reordering copies. A
    layer's buffers (masked input, input transform, weight copies) count twice: the
    previous layer's stay alive until they are replaced.
    """
    c, TB, LDB, width, gh = _sizes(problem)
    cs, s = _compute_dtype(problem.dtype).itemsize, problem.dtype.itemsize
    dropout = bool(problem.dropout_layers)
    lasting = TB * c.input_size * cs + 2 * LDB * (c.state_size + c.num_units) * cs + \
        reserve_nbytes(problem)
    layer = TB * ((width if dropout else 0) + gh) * cs + _weight_copies(problem)
    phases = (TB * c.input_size * s,
              TB * width * (4 + 1 + 1 + 8 + cs) if dropout else 0,
              2 * layer,
              (TB * width + LDB * (c.state_size + c.num_units)) * (cs + s))
    return lasting + max(phases) + _RUN_BYTES_PER_PSEUDO_LAYER * c.num_pseudo_layers


def backprop_nbytes(problem: Problem) -> int:
    """An upper estimate of the bytes ``backprop`` allocates at its peak (the caller's
    reserve_space is not counted: it exists already).

    What lives throughout (input and output gradient in compute dtype, the states and
    their gradients, params_backprop) plus the largest phase: the inputs' reordering
    copies, a layer (its masked input, its input gradient twice, one pseudo-layer's
    previous states, gate gradients, projection terms and weight copies; twice, as in
    ``forward_nbytes``), or the results' copies.
    """
    c, TB, LDB, width, gh = _sizes(problem)
    cs, s = _compute_dtype(problem.dtype).itemsize, problem.dtype.itemsize
    P, H, n = c.state_size, c.num_units, layout.params_size(c)
    in_width = max(c.input_size, width)
    lasting = TB * (c.input_size + width) * cs + 4 * LDB * (P + H) * cs + n * cs
    gate_grads = {"gru": 2 * gh, "lstm": gh}.get(c.rnn_mode, 2 * P)
    pseudo_layer = P + (H if c.is_lstm else 0) + gate_grads + (P + 3 * H if c.num_proj else 0)
    layer = TB * (3 * in_width + pseudo_layer) * cs + _weight_copies(problem)
    phases = (TB * in_width * s,
              2 * layer,
              (TB * c.input_size + 2 * LDB * (P + H)) * (cs + s) + n * s)
    return lasting + max(phases) + _RUN_BYTES_PER_PSEUDO_LAYER * c.num_pseudo_layers


def _carve(buffer, problem):
    """Named views of a reserve buffer's data part."""
    data = buffer[_HEADER_BYTES:].view(_compute_dtype(problem.dtype))
    views, offset = {}, 0
    for name, shape in _reserve_entries(problem):
        size = math.prod(shape)
        views[name] = data[offset:offset + size].reshape(shape)
        offset += size
    return views


def _new_reserve(problem):
    buffer = np.zeros(reserve_nbytes(problem), dtype=np.uint8)
    head = reserve_header.header(problem, _MAGIC)
    buffer[:len(head)] = np.frombuffer(head, dtype=np.uint8)
    return buffer


def _open_reserve(reserve_space, problem):
    """Check a reserve_space from forward belongs to this call; return its views."""
    readable = reserve_space.dtype == np.uint8
    head = bytes(reserve_space[:reserve_header.IDENTITY_BYTES]) if readable else None
    reserve_header.check(head, reserve_space.dtype, reserve_space.shape[0],
                         reserve_nbytes(problem), problem, _MAGIC, "NumPy")
    return _carve(np.ascontiguousarray(reserve_space), problem)


def _dropout_mask(problem, layer, batch, dtype):
    """Keep-mask of layer `layer`'s input, scaled by 1/(1-p); reproducible from the seed."""
    c = problem.config
    rng = np.random.Generator(np.random.PCG64([c.seed, layer]))
    shape = (problem.max_time, problem.batch_size, c.num_dirs * c.state_size)
    keep = rng.random(shape, dtype=np.float32) >= c.dropout
    return (keep[:, batch.order] / (1.0 - c.dropout)).astype(dtype)


# --------------------------------------------------------------------------- weights

def _gate_rows(config):
    """Row indices taking canonical gate order to the backend's (sigmoid gates first)."""
    H = config.num_units
    gate_order = (0, 1, 3, 2) if config.is_lstm else tuple(range(config.num_gates))
    return np.concatenate([np.arange(g * H, (g + 1) * H) for g in gate_order])


def _sigmoid_width(config):
    """How many leading (reordered) gate columns are sigmoid gates."""
    return {"lstm": 3, "gru": 2}.get(config.rnn_mode, 0) * config.num_units


class _Weights:
    """One pseudo-layer's weights in the backend's gate order and compute dtype."""

    def __init__(self, params, blocks, config, dtype):
        rows = _gate_rows(config)
        self.rows = rows
        take = lambda block: None if block is None else block.view(params)
        self.w_input = None if blocks.w_input is None else take(blocks.w_input)[rows].astype(dtype)
        self.w_rec = take(blocks.w_recurrent)[rows].astype(dtype)          # [GH, P]
        self.w_proj = None if blocks.w_projection is None else take(blocks.w_projection).astype(dtype)
        self.b_input = take(blocks.b_input)[rows].astype(dtype)
        self.b_rec = take(blocks.b_recurrent)[rows].astype(dtype)
        # Biases that can join the input transform: both, except GRU's recurrent ones,
        # which sit inside r ⊙ (R_h h + b_Rh).
        self.b_xw = self.b_input if config.rnn_mode == "gru" else self.b_input + self.b_rec
        scale = np.ones(len(rows), dtype=dtype)
        scale[:_sigmoid_width(config)] = 0.5
        self.scale = scale


def _input_transform(x, weights, gh):
    """Input-side pre-activations of all steps at once, ``W x + b``, as [T, B, G·H].

    Already multiplied by ``weights.scale`` (½ on sigmoid gates), folded into the
    small weight matrix rather than applied to the large result.
    """
    T, B, width = x.shape
    scale = weights.scale
    if weights.w_input is None:  # skip input: x is added to every gate
        xw = np.empty((T, B, gh), dtype=x.dtype)
        np.multiply(x[:, :, None, :], scale.reshape(-1, width), out=xw.reshape(T, B, -1, width))
    else:
        w_scaled = weights.w_input * scale[:, None]
        xw = np.matmul(x.reshape(T * B, width), w_scaled.T).reshape(T, B, gh)
    xw += weights.b_xw * scale
    return xw


def _input_gradient(dxw, weights, width):
    """Gradient of the pseudo-layer's input from its input-gate gradients [T, B, G·H]."""
    T, B, gh = dxw.shape
    if weights.w_input is None:
        return dxw.reshape(T, B, gh // width, width).sum(axis=2)
    return np.matmul(dxw.reshape(T * B, gh), weights.w_input).reshape(T, B, width)


# --------------------------------------------------------------------------- cells, forward

def _active_steps(active, reverse):
    """(t, k) for each step in processing order, k = sequences running at t (a prefix)."""
    steps = range(len(active) - 1, -1, -1) if reverse else range(len(active))
    if isinstance(active, _EveryRow):  # no lookup per step
        return ((t, active.batch_size) for t in steps)
    return ((t, active[t]) for t in steps if active[t])


def _lstm_forward(xw, w, h, c, y, store, active, reverse):
    H = c.shape[1]
    gates, cells = store["gates"], store["c"]
    rec = np.ascontiguousarray((w.w_rec * w.scale[:, None]).T)  # pre-scaled, [P, 4H]
    proj = None if w.w_proj is None else np.ascontiguousarray(w.w_proj.T)
    tmp = np.empty_like(c)
    m = np.empty_like(c)
    for t, k in _active_steps(active, reverse):
        g = gates[t, :k]
        np.matmul(h[:k], rec, out=g)
        g += xw[t, :k]
        np.tanh(g, out=g)
        sig = g[:, :3 * H]
        sig *= 0.5
        sig += 0.5
        ck, tk = c[:k], tmp[:k]
        ck *= g[:, H:2 * H]
        np.multiply(g[:, :H], g[:, 3 * H:], out=tk)
        ck += tk
        cells[t, :k] = ck
        np.tanh(ck, out=tk)
        if proj is None:
            np.multiply(g[:, 2 * H:3 * H], tk, out=h[:k])
        else:
            np.multiply(g[:, 2 * H:3 * H], tk, out=m[:k])
            np.matmul(m[:k], proj, out=h[:k])
        y[t, :k] = h[:k]


def _gru_forward(xw, w, h, c, y, store, active, reverse):
    H = h.shape[1]
    gates, hr_store = store["gates"], store["hr"]
    rec = np.ascontiguousarray((w.w_rec * w.scale[:, None]).T)  # r, z pre-scaled
    b_rec = w.b_rec * w.scale
    hr = np.empty((h.shape[0], 3 * H), dtype=h.dtype)
    tmp = np.empty_like(h)
    for t, k in _active_steps(active, reverse):
        g, r_k = gates[t, :k], hr[:k]
        np.matmul(h[:k], rec, out=r_k)
        r_k += b_rec
        rz = g[:, :2 * H]
        np.add(xw[t, :k, :2 * H], r_k[:, :2 * H], out=rz)
        np.tanh(rz, out=rz)
        rz *= 0.5
        rz += 0.5
        hr_store[t, :k] = r_k[:, 2 * H:]
        n = g[:, 2 * H:]
        np.multiply(g[:, :H], r_k[:, 2 * H:], out=n)
        n += xw[t, :k, 2 * H:]
        np.tanh(n, out=n)
        tk = tmp[:k]
        np.subtract(h[:k], n, out=tk)
        tk *= g[:, H:2 * H]
        np.add(tk, n, out=h[:k])
        y[t, :k] = h[:k]


def _rnn_forward(activation):
    def forward(xw, w, h, c, y, store, active, reverse):
        rec = np.ascontiguousarray(w.w_rec.T)
        pre = np.empty_like(h)
        for t, k in _active_steps(active, reverse):
            p = pre[:k]
            np.matmul(h[:k], rec, out=p)
            p += xw[t, :k]
            activation(p, out=h[:k])
            y[t, :k] = h[:k]
    return forward


_relu = lambda x, out: np.maximum(x, 0, out=out)
_FORWARD = {"lstm": _lstm_forward, "gru": _gru_forward,
            "rnn_tanh": _rnn_forward(np.tanh), "rnn_relu": _rnn_forward(_relu)}


# --------------------------------------------------------------------------- cells, backward

def _lstm_backward(dy, dh, dc, w, store, prev_h, prev_c, batch, reverse):
    """Returns the input-side and recurrent gate gradients (the same array for LSTM).

    Derivatives are formed step by step on the rows that run, while they are in cache,
    rather than as whole-sequence arrays.
    """
    H = dc.shape[1]
    gates, cells = store["gates"], store["c"]
    i, f, o, g = (gates[..., j * H:(j + 1) * H] for j in range(4))
    # Rows past a sequence's end are never written, and must read as zero below.
    dgates = (np.zeros_like if batch.ragged else np.empty_like)(gates)
    dhs = None if w.w_proj is None else np.zeros(dy.shape, dtype=dy.dtype)
    rec = w.w_rec
    dm_buf, tanh_buf, tmp = np.empty_like(dc), np.empty_like(dc), np.empty_like(dc)
    act_buf = np.empty(gates.shape[1:], dtype=gates.dtype)
    for t, k in _active_steps(batch.active, not reverse):
        dh_k = dh[:k]
        dh_k += dy[t, :k]
        if dhs is None:
            dm = dh_k
        else:
            dhs[t, :k] = dh_k
            dm = np.matmul(dh_k, w.w_proj, out=dm_buf[:k])
        dg, dc_k, tc, t_k = dgates[t, :k], dc[:k], tanh_buf[:k], tmp[:k]
        np.tanh(cells[t, :k], out=tc)
        np.multiply(dm, tc, out=dg[:, 2 * H:3 * H])          # through o
        np.multiply(tc, tc, out=t_k)                           # through tanh(c'): o·(1 - tanh²)
        np.subtract(1, t_k, out=t_k)
        t_k *= o[t, :k]
        t_k *= dm
        dc_k += t_k
        np.multiply(dc_k, g[t, :k], out=dg[:, :H])
        np.multiply(dc_k, prev_c[t, :k], out=dg[:, H:2 * H])
        np.multiply(dc_k, i[t, :k], out=dg[:, 3 * H:])
        act = act_buf[:k]                                      # s - s² and 1 - g²
        np.multiply(gates[t, :k], gates[t, :k], out=act)
        np.subtract(gates[t, :k, :3 * H], act[:, :3 * H], out=act[:, :3 * H])
        np.subtract(1, act[:, 3 * H:], out=act[:, 3 * H:])
        dg *= act
        dc_k *= f[t, :k]
        np.matmul(dg, rec, out=dh_k)
    grads = {}
    if dhs is not None:  # formed only if weight gradients are wanted
        grads["w_proj"] = lambda: np.matmul(dhs.reshape(-1, dhs.shape[2]).T,
                                            (o * np.tanh(cells)).reshape(-1, H))
    return dgates, dgates, grads


def _gru_backward(dy, dh, dc, w, store, prev_h, prev_c, batch, reverse):
    """Returns the input-side and the recurrent gate gradients, which differ for the GRU
    in the new gate: r multiplies only R_h·h + b_Rh."""
    H = dh.shape[1]
    gates, hr = store["gates"], store["hr"]
    r, z, n = (gates[..., j * H:(j + 1) * H] for j in range(3))
    new = np.zeros_like if batch.ragged else np.empty_like  # unwritten rows must read zero
    dxg, dhg = new(gates), new(gates)
    rec = w.w_rec
    tmp, one_minus_z, d = np.empty_like(dh), np.empty_like(dh), np.empty_like(dh)
    for t, k in _active_steps(batch.active, not reverse):
        dh_k = dh[:k]
        dh_k += dy[t, :k]
        dx_t, dh_t = dxg[t, :k], dhg[t, :k]
        r_t, z_t, n_t = r[t, :k], z[t, :k], n[t, :k]
        omz, d_k = one_minus_z[:k], d[:k]
        np.subtract(1, z_t, out=omz)
        np.multiply(n_t, n_t, out=d_k)                   # n: h' = (1-z)·n + z·h, tanh'
        np.subtract(1, d_k, out=d_k)
        d_k *= omz
        np.multiply(dh_k, d_k, out=dx_t[:, 2 * H:])
        np.subtract(prev_h[t, :k], n_t, out=d_k)         # z: (h - n)·σ'
        d_k *= z_t
        d_k *= omz
        np.multiply(dh_k, d_k, out=dx_t[:, H:2 * H])
        np.subtract(1, r_t, out=d_k)                     # r: (R_h·h + b_Rh)·σ'
        d_k *= r_t
        d_k *= hr[t, :k]
        np.multiply(dx_t[:, 2 * H:], d_k, out=dx_t[:, :H])
        dh_t[:, :2 * H] = dx_t[:, :2 * H]
        np.multiply(dx_t[:, 2 * H:], r_t, out=dh_t[:, 2 * H:])
        dh_k *= z_t
        t_k = tmp[:k]
        np.matmul(dh_t, rec, out=t_k)
        dh_k += t_k
    return dxg, dhg, {}


def _rnn_backward(derivative):
    def backward(dy, dh, dc, w, store, prev_h, prev_c, batch, reverse):
        act_grad = derivative(store["y"])
        dgates = (np.zeros_like if batch.ragged else np.empty_like)(dy)
        rec = w.w_rec
        for t, k in _active_steps(batch.active, not reverse):
            dh_k = dh[:k]
            dh_k += dy[t, :k]
            dg = dgates[t, :k]
            np.multiply(dh_k, act_grad[t, :k], out=dg)
            np.matmul(dg, rec, out=dh_k)
        return dgates, dgates, {}
    return backward


_BACKWARD = {"lstm": _lstm_backward, "gru": _gru_backward,
             "rnn_tanh": _rnn_backward(lambda y: 1 - y * y),
             "rnn_relu": _rnn_backward(lambda y: (y > 0).astype(y.dtype))}


# --------------------------------------------------------------------------- the passes

def _pseudo_store(views, problem, layer, direction):
    """Pseudo-layer index and the reserve views it reads and writes.

    In inference nothing is kept for backprop: every pseudo-layer shares one step's worth
    of gate activations, seen at every time step through a zero stride.
    """
    config = problem.config
    k = layer * config.num_dirs + direction
    P = config.state_size
    store = {"y": _layer_output(views, problem, layer)[..., direction * P:(direction + 1) * P]}
    slot = k if problem.is_training else 0
    for name in ("gates", "c", "hr"):
        if f"{name}{slot}" in views:
            view = views[f"{name}{slot}"]
            if not problem.is_training:
                view = np.lib.stride_tricks.as_strided(
                    view, (problem.max_time,) + view.shape[1:], (0,) + view.strides[1:])
            store[name] = view
    return k, store


def _layer_output(views, problem, layer):
    return views[f"y{layer % _output_slots(problem)}"]


def _layer_input(views, problem, x0, layer):
    x = x0 if layer == 0 else _layer_output(views, problem, layer - 1)
    if f"mask{layer}" in views:
        x = x * views[f"mask{layer}"]
    return x


def forward(problem: Problem, input, input_h, input_c, params, batch=None):
    """Forward pass on NumPy arrays; see ``pycudnnrnn.forward``.

    `batch` is the problem's ``_Batch`` when the caller (a plan) keeps one.
    """
    c = problem.config
    cdt = _compute_dtype(problem.dtype)
    batch = batch or _Batch(problem)
    x0 = batch.data_in(input, problem.time_major, cdt)
    h = batch.state_in(input_h, problem.time_major, cdt)
    cell = batch.state_in(input_c, problem.time_major, cdt) if c.is_lstm else None
    buffer = _new_reserve(problem) if problem.is_training else \
        np.zeros(reserve_nbytes(problem), dtype=np.uint8)
    views = _carve(buffer, problem)
    for layer in problem.dropout_layers:
        views[f"mask{layer}"][:] = _dropout_mask(problem, layer, batch, cdt)

    blocks = layout.pseudo_layer_blocks(c)
    gh = c.num_gates * c.num_units
    step = _FORWARD[c.rnn_mode]
    for layer in range(c.num_layers):
        x = _layer_input(views, problem, x0, layer)
        for direction in range(c.num_dirs):
            k, store = _pseudo_store(views, problem, layer, direction)
            w = _Weights(params, blocks[k], c, cdt)
            step(_input_transform(x, w, gh), w, h[k], None if cell is None else cell[k],
                 store["y"], store, batch.active, reverse=direction == 1)

    dtype, tm = problem.dtype, problem.time_major
    output = batch.data_out(_layer_output(views, problem, c.num_layers - 1), tm, dtype)
    output_h = batch.state_out(h, tm, dtype)
    output_c = batch.state_out(cell, tm, dtype) if c.is_lstm else np.zeros((0,), dtype)
    if not problem.is_training:
        buffer = np.zeros((0,), dtype=np.uint8)
    return output, output_h, output_c, buffer


def backprop(problem: Problem, input, input_h, input_c, params, output, output_h, output_c,
             output_backprop, output_h_backprop, output_c_backprop, reserve_space,
             gradients="all", batch=None):
    """Backprop of data and weights on NumPy arrays; see ``pycudnnrnn.backprop``.

    `output`, `output_h` and `output_c` are not read: the reserve space holds what
    forward computed, so a caller cannot make the two disagree. `gradients` ("all",
    "data" or "weights") leaves out the weight-gradient products, or the first layer's
    input gradient; what is left out comes back as None.
    """
    want_data, want_weights = gradients in ("all", "data"), gradients in ("all", "weights")
    c = problem.config
    cdt = _compute_dtype(problem.dtype)
    views = _open_reserve(reserve_space, problem)
    batch = batch or _Batch(problem)
    tm = problem.time_major
    x0 = batch.data_in(input, tm, cdt)
    h0 = batch.state_in(input_h, tm, cdt)
    c0 = batch.state_in(input_c, tm, cdt) if c.is_lstm else None
    dh = batch.state_in(output_h_backprop, tm, cdt)
    dc = batch.state_in(output_c_backprop, tm, cdt) if c.is_lstm else None
    dy = batch.data_in(output_backprop, tm, cdt)

    blocks = layout.pseudo_layer_blocks(c)
    dparams = np.zeros(layout.params_size(c), dtype=cdt)
    backward = _BACKWARD[c.rnn_mode]
    P = c.state_size
    for layer in reversed(range(c.num_layers)):
        x = _layer_input(views, problem, x0, layer)
        dx = np.zeros(x.shape, dtype=cdt)
        for direction in range(c.num_dirs):
            k, store = _pseudo_store(views, problem, layer, direction)
            reverse = direction == 1
            w = _Weights(params, blocks[k], c, cdt)
            prev_h = batch.previous(store["y"], h0[k], reverse)
            prev_c = batch.previous(store["c"], c0[k], reverse) if c.is_lstm else None
            dxg, dhg, extra = backward(dy[..., direction * P:(direction + 1) * P], dh[k],
                                       None if dc is None else dc[k], w, store, prev_h,
                                       prev_c, batch, reverse)
            if want_data or layer > 0:  # layer l's input gradient feeds layer l-1
                dx += _input_gradient(dxg, w, x.shape[2])
            if want_weights:
                _store_weight_grads(dparams, blocks[k], w, x, prev_h, dxg, dhg, extra)
        if f"mask{layer}" in views:
            dx *= views[f"mask{layer}"]
        dy = dx

    dtype = problem.dtype
    data = (batch.data_out(dy, tm, dtype),
            batch.state_out(dh, tm, dtype),
            batch.state_out(dc, tm, dtype) if c.is_lstm else np.zeros((0,), dtype)) \
        if want_data else (None, None, None)
    return data + (dparams.astype(dtype, copy=False) if want_weights else None,)


def _store_weight_grads(dparams, blocks, w, x, prev_h, dxg, dhg, extra):
    """All weight and bias gradients of one pseudo-layer, as a few large products."""
    gh = dxg.shape[2]
    dxg2, dhg2 = dxg.reshape(-1, gh), dhg.reshape(-1, gh)
    rows = w.rows
    if blocks.w_input is not None:
        blocks.w_input.view(dparams)[rows] = dxg2.T @ x.reshape(-1, x.shape[2])
    blocks.w_recurrent.view(dparams)[rows] = dhg2.T @ prev_h.reshape(-1, prev_h.shape[2])
    blocks.b_input.view(dparams)[rows] = dxg2.sum(axis=0)
    blocks.b_recurrent.view(dparams)[rows] = dhg2.sum(axis=0)
    if blocks.w_projection is not None:
        blocks.w_projection.view(dparams)[:] = extra["w_proj"]()
