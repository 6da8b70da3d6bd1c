"""Padding and rows that do not run are isolated, on every CPU route (issue 38).

The rule (``docs/semantics.md``, "Variable-length sequences"): whatever a padded step of
the input, the initial state of a row of length 0, or the cotangent of a padded output
or of such a row's final state holds (NaN, inf, 1e30), it never reaches another row's
results or any weight gradient; padded outputs are 0, the padded input's gradient is 0,
a row of length 0 gives back its own initial state (NaN in, NaN out) and passes its
state gradient straight through. A route that computes the dropped steps at all (the
JAX scan; PyTorch's; TensorFlow's) must also keep a relu state that would overflow there out of the
results (``make_exploding``).

The first section holds what any route's test needs, as NumPy arrays in the op's own
layout: ``make_ragged`` (a 2-layer problem on a ragged batch with rows of length 0 and
short rows, its cotangents included), ``plant`` (the same problem with a value planted
in one place), ``Results`` (what a route gives back, time-major) and ``assert_isolated``
(a planted run against the clean one). A route is a function ``Ragged -> Results``,
and ``check_route`` (the grid ``GRID``: cell × direction × place × value),
``check_all_zero`` (every row of length 0) and ``check_exploding`` test one. The routes
here are the NumPy backend (functional, batch-major, plan, inference, 16-bit dtypes),
JAX (the CPU's scan and its custom call, dropout and inference included;
``jax.hessian``), Flax, TensorFlow (``pycudnnrnn.tensorflow``), and Keras 3 on its JAX,
PyTorch and TensorFlow backends (each in a subprocess, as ``tests/test_keras.py`` runs
them). PyTorch's own routes can be added
the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import pycudnnrnn

# --------------------------------------------------------------------------- shared helpers

MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
DIRECTIONS = ("unidirectional", "bidirectional")
#: What is planted: a key of these, in a place of WHERE.
VALUES = {"nan": np.nan, "inf": np.inf, "1e30": 1e30}
#: input padding; the initial states of rows of length 0; the cotangents of padded
#: outputs and of rows of length 0's final states.
WHERE = ("padding", "empty_rows", "cotangents")
#: T = 6: a full row, two of length 0, short ones.
LENGTHS = (6, 0, 3, 1, 0)
NUM_LAYERS, INPUT_SIZE, NUM_UNITS = 2, 2, 3


@dataclasses.dataclass
class Ragged:
    """One problem and the cotangents of its results, all time-major NumPy arrays.

    ``x [T, B, I]``, ``h0 [L·D, B, P]``, ``c0 [L·D, B, H]`` (LSTM, else None),
    ``params`` (flat, the op's layout), ``lengths [B]`` int32; cotangents
    ``dy [T, B, D·P]``, ``dhy``, ``dcy`` (P = num_proj or H).
    """

    rnn_mode: str
    direction: str
    lengths: np.ndarray
    x: np.ndarray
    h0: np.ndarray
    c0: np.ndarray | None
    params: np.ndarray
    dy: np.ndarray
    dhy: np.ndarray
    dcy: np.ndarray | None
    num_proj: int = 0
    input_mode: str = "linear_input"

    @property
    def lstm(self):
        return self.rnn_mode == "lstm"

    @property
    def attrs(self):
        """The op's attributes (time_major apart)."""
        return dict(rnn_mode=self.rnn_mode, direction=self.direction,
                    num_proj=self.num_proj, input_mode=self.input_mode)

    @property
    def sizes(self):
        """What ``params_size`` and the canonical conversions take."""
        return dict(self.attrs, num_layers=self.h0.shape[0] // (1 + (
            self.direction == "bidirectional")), num_units=self.c0.shape[2] if self.lstm
            else self.h0.shape[2], input_size=self.x.shape[2])

    @property
    def T(self):
        return self.x.shape[0]

    @property
    def dtype(self):
        return self.x.dtype

    @property
    def padding(self):
        """[T, B] bool: the steps a row does not run."""
        return np.arange(self.T)[:, None] >= self.lengths[None, :]

    @property
    def empty(self):
        """[B] bool: the rows of length 0."""
        return self.lengths == 0

    def replace(self, **changes) -> "Ragged":
        """A copy (arrays copied too), with `changes`."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in fields.items()}
        return Ragged(**{**fields, **changes})

    def truncated(self, T: int) -> "Ragged":
        """The first `T` steps (every length at most `T`)."""
        assert self.lengths.max() <= T
        return self.replace(x=self.x[:T].copy(), dy=self.dy[:T].copy())


def make_ragged(rnn_mode, direction, *, lengths=LENGTHS, dtype=np.float64, seed=0,
                num_layers=NUM_LAYERS, input_size=INPUT_SIZE, num_units=NUM_UNITS,
                T=None, num_proj=0, input_mode="linear_input") -> Ragged:
    """A random problem with finite data everywhere (the clean run), padding included.
    (skip_input takes input_size = num_units.)"""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, np.int32)
    T = T or max(int(lengths.max()), 1)
    B, D = len(lengths), 2 if direction == "bidirectional" else 1
    LD, H, P = num_layers * D, num_units, num_proj or num_units
    if input_mode == "skip_input":
        input_size = num_units
    n = pycudnnrnn.params_size(rnn_mode=rnn_mode, direction=direction, num_layers=num_layers,
                               num_units=H, input_size=input_size, num_proj=num_proj,
                               input_mode=input_mode)
    normal = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    lstm = rnn_mode == "lstm"
    return Ragged(rnn_mode, direction, lengths, normal(T, B, input_size), normal(LD, B, P),
                  normal(LD, B, H) if lstm else None,
                  rng.uniform(-0.6, 0.6, n).astype(dtype), normal(T, B, D * P),
                  normal(LD, B, P), normal(LD, B, H) if lstm else None, num_proj, input_mode)


def plant(problem: Ragged, where: str, value: float) -> Ragged:
    """`problem` with `value` in every element of `where` (one of WHERE, or "all")."""
    p = problem.replace()
    pad, empty = p.padding, p.empty
    if where in ("padding", "all"):
        p.x[pad] = value
    if where in ("empty_rows", "all"):
        p.h0[:, empty] = value
        if p.lstm:
            p.c0[:, empty] = value
    if where in ("cotangents", "all"):
        p.dy[pad] = value
        p.dhy[:, empty] = value
        if p.lstm:
            p.dcy[:, empty] = value
    return p


@dataclasses.dataclass
class Results:
    """What a route gives back, time-major NumPy arrays like ``Ragged``'s; the gradients
    (``dx``, ``dh0``, ``dc0``, ``dparams``) are None for a route that has none."""

    y: np.ndarray
    hy: np.ndarray
    cy: np.ndarray | None
    dx: np.ndarray | None = None
    dh0: np.ndarray | None = None
    dc0: np.ndarray | None = None
    dparams: np.ndarray | None = None


#: Units in the last place, at the scale of the clean run's array, that a planted run
#: may differ by (it computes the same values in the same order: it is usually exact).
ULPS = 4


def assert_close(got, want, what, ulps=ULPS):
    """Finite, and within `ulps` of `want` (at the scale of its largest magnitude)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert np.isfinite(want).all(), f"{what}: the clean run is not finite"
    assert np.isfinite(got).all(), f"{what}: not finite where the clean run is: " \
        f"{np.argwhere(~np.isfinite(got))[:5].tolist()} ..."
    scale = float(np.abs(want.astype(np.float64)).max(initial=0.0))
    atol = ulps * float(ml_dtypes.finfo(want.dtype).eps) * scale
    np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=what)


def assert_zero(got, what):
    got = np.asarray(got)
    bad = np.argwhere(got != 0)
    assert not bad.size, f"{what}: expected 0, got {got[tuple(bad[0])]} at {bad[:5].tolist()}"


def assert_isolated(planted: Ragged, got: Results, clean: Results, where="", ulps=ULPS):
    """`got`, from `planted`, against `clean`, from the same problem unplanted (or, for
    a problem cut to fewer steps, ``clean`` of the cut one: see ``make_exploding``).

    Running rows: outputs, final states and gradients as clean; padded outputs and the
    padded input's gradient 0; rows of length 0: final states their own initial ones
    and state gradients their own cotangents, exactly; weight gradients as clean.
    """
    T, tc = planted.T, clean.y.shape[0]  # the clean run may have fewer steps
    pad, empty = planted.padding, planted.empty
    valid = ~pad
    assert not valid[tc:].any()
    tag = f"[{where}] " if where else ""
    assert_close(got.y[:tc][valid[:tc]], clean.y[valid[:tc]], f"{tag}output, valid steps",
                 ulps)
    assert_zero(got.y[pad], f"{tag}output, padded steps")
    states = [("h", got.hy, clean.hy, planted.h0, got.dh0, clean.dh0, planted.dhy)]
    if planted.lstm:
        states.append(("c", got.cy, clean.cy, planted.c0, got.dc0, clean.dc0, planted.dcy))
    for name, final, clean_final, initial, grad, clean_grad, cotangent in states:
        assert_close(final[:, ~empty], clean_final[:, ~empty],
                     f"{tag}output_{name}, running rows", ulps)
        np.testing.assert_array_equal(final[:, empty], initial[:, empty],
                                      err_msg=f"{tag}output_{name}, rows of length 0")
        if grad is not None:
            assert_close(grad[:, ~empty], clean_grad[:, ~empty],
                         f"{tag}input_{name} gradient, running rows", ulps)
            np.testing.assert_array_equal(grad[:, empty], cotangent[:, empty],
                                          err_msg=f"{tag}input_{name} gradient, rows of length 0")
    if got.dx is not None:
        assert got.dx.shape[0] == T
        assert_close(got.dx[:tc][valid[:tc]], clean.dx[valid[:tc]],
                     f"{tag}input gradient, valid steps", ulps)
        assert_zero(got.dx[pad], f"{tag}input gradient, padded steps")
    if got.dparams is not None:
        assert_close(got.dparams, clean.dparams, f"{tag}params gradient", ulps)


def make_exploding(direction, dtype=np.float64) -> Ragged:
    """A 2-layer relu RNN whose state grows by a factor g a step (recurrent matrices
    g/H·ones, positive biases and inputs): finite over every row's valid steps (at most
    2), past the dtype's range within the padding (a full row of 6 steps overflows). A
    route that computes the dropped steps, keeping them only out of the results,
    overflows there, and inf · 0 is NaN. The shapes are ``make_ragged``'s (a jitted
    route compiles once); ``check_exploding`` holds a route against NumPy's 2 steps."""
    g = 1e80 if dtype == np.float64 else 1e9  # g^3 finite (two layers), g^5 overflows
    p = make_ragged("rnn_relu", direction, lengths=(2, 0, 1, 2, 0), T=LENGTHS[0], dtype=dtype)
    sizes = p.sizes
    weights, biases = pycudnnrnn.params_to_canonical(p.params, **sizes)
    # per pseudo-layer: the input matrix, then the recurrent one
    weights = [np.full_like(w, g / NUM_UNITS) if i % 2 else 0.1 * w
               for i, w in enumerate(weights)]
    p.params = np.asarray(pycudnnrnn.canonical_to_params(
        weights, [np.ones_like(b) for b in biases], **sizes), dtype)
    p.x = np.abs(p.x)
    return p


def isolation_cases():
    """(mode, direction, where, value) of the main grid."""
    return [(m, d, w, v) for m in MODES for d in DIRECTIONS for w in WHERE for v in VALUES]


def _id(case):
    return "-".join(str(c)[:4] if c in DIRECTIONS else str(c) for c in case)


GRID = pytest.mark.parametrize("mode,direction,where,value", isolation_cases(),
                               ids=[_id(c) for c in isolation_cases()])
#: The cells' options with code of their own (bidirectional): an LSTM's projection,
#: skip_input (layer 0 adds its input to the gates as it is).
VARIANTS = {"projection": dict(mode="lstm", num_proj=2),
            "skip_input": dict(mode="gru", input_mode="skip_input")}
VARIANT_GRID = pytest.mark.parametrize("variant,where,value", [
    (o, w, v) for o in VARIANTS for w in WHERE for v in VALUES])
ALL_ZERO = pytest.mark.parametrize("mode,direction",
                                   [(m, d) for m in MODES for d in DIRECTIONS])


def check_route(route, mode, direction, where, value, dtype=np.float64, **options):
    """The grid's test for one route: clean and planted runs of ``make_ragged``
    (`options`: its num_proj, input_mode)."""
    problem = make_ragged(mode, direction, dtype=dtype, **options)
    planted = plant(problem, where, VALUES[value])
    assert_isolated(planted, route(planted), route(problem), where)


def check_all_zero(route, mode, direction, dtype=np.float64):
    """Every row of length 0, NaN planted everywhere: outputs 0, states as given, no
    gradient but the states' own, passed straight through."""
    problem = make_ragged(mode, direction, lengths=(0,) * len(LENGTHS), T=LENGTHS[0],
                          dtype=dtype)
    planted = plant(problem, "all", np.nan)
    got = route(planted)
    assert_isolated(planted, got, route(problem), "all")
    if got.dparams is not None:
        assert_zero(got.dparams, "params gradient")


def check_exploding(route, direction, dtype=np.float64, ulps=ULPS):
    """``make_exploding`` against the NumPy backend on its first 2 steps (nothing past
    the rows' ends to compute, or overflow), within `ulps` for another computation."""
    problem = make_exploding(direction, dtype)
    assert_isolated(problem, route(problem), run_numpy(problem.truncated(2)),
                    "exploding relu", ulps=ulps)


# --------------------------------------------------------------------------- NumPy backend

def _batch_major(a, time_major):
    if a is None or time_major or a.ndim < 2:  # (the empty output_c of other cells)
        return a
    return np.ascontiguousarray(a.swapaxes(0, 1))


def run_numpy(p: Ragged, time_major=True, plan=False, is_training=True) -> Results:
    """``pycudnnrnn.forward``/``backprop`` (or an ``RNNPlan`` on the CPU)."""
    bm = lambda a: _batch_major(a, time_major)  # noqa: E731
    x, h0, c0, dy, dhy, dcy = map(bm, (p.x, p.h0, p.c0, p.dy, p.dhy, p.dcy))
    attrs = dict(p.attrs, time_major=time_major)
    if plan:
        sizes = {k: v for k, v in p.sizes.items() if k not in attrs}
        runner = pycudnnrnn.RNNPlan(
            max_time=p.T, batch_size=len(p.lengths), sequence_lengths=p.lengths,
            dtype=p.dtype, device="cpu", is_training=is_training, **sizes, **attrs)
        fwd = runner.forward(x, h0, c0, p.params)
    else:
        fwd = pycudnnrnn.forward(x, h0, c0, p.params, p.lengths, is_training=is_training,
                                 **attrs)
    y, hy, cy = (bm(a) for a in fwd[:3])
    if not is_training:
        return Results(y, hy, cy if p.lstm else None)
    zeros_c = np.zeros((0,), p.dtype)
    args = (x, h0, c0, p.params) + ((p.lengths,) if not plan else ()) + tuple(fwd[:3]) + \
        (dy, dhy, dcy if p.lstm else zeros_c, fwd[3])
    grads = runner.backprop(*args) if plan else pycudnnrnn.backprop(*args, **attrs)
    dx, dh0, dc0 = (bm(a) for a in grads[:3])
    return Results(y, hy, cy if p.lstm else None, dx, dh0, dc0 if p.lstm else None, grads[3])


NUMPY_ROUTES = {
    "functional": run_numpy,
    "batch-major": functools.partial(run_numpy, time_major=False),
    "plan": functools.partial(run_numpy, plan=True, time_major=False),
    "inference": functools.partial(run_numpy, is_training=False),
}


@pytest.mark.parametrize("route", list(NUMPY_ROUTES))
@GRID
def test_numpy_backend(route, mode, direction, where, value):
    check_route(NUMPY_ROUTES[route], mode, direction, where, value)


@pytest.mark.parametrize("route", list(NUMPY_ROUTES))
@VARIANT_GRID
def test_numpy_backend_variants(route, variant, where, value):
    check_route(NUMPY_ROUTES[route], direction="bidirectional", where=where, value=value,
                **VARIANTS[variant])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", WHERE)
def test_numpy_backend_other_dtypes(dtype, mode, where):
    """Computed in float32 (16-bit types rounded once, at the end); 1e30 is inf in
    float16. NaN, inf and 1e30 planted together, each in a third of the places."""
    dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    problem = make_ragged(mode, "bidirectional")
    planted = problem.replace()
    for i, value in enumerate(VALUES.values()):
        part = plant(problem, where, value)
        for name in ("x", "h0", "c0", "dy", "dhy", "dcy"):
            a, b = getattr(planted, name), getattr(part, name)
            if a is not None:
                a.reshape(-1)[i::3] = b.reshape(-1)[i::3]
    cast = lambda p: p.replace(**{  # noqa: E731
        n: getattr(p, n).astype(dtype) for n in ("x", "h0", "c0", "params", "dy", "dhy", "dcy")
        if getattr(p, n) is not None})
    with np.errstate(over="ignore"):  # 1e30 in float16
        planted, problem = cast(planted), cast(problem)
    assert_isolated(planted, run_numpy(planted), run_numpy(problem), where)


@pytest.mark.parametrize("route", ["functional", "plan", "inference"])
@ALL_ZERO
def test_numpy_backend_all_rows_of_length_0(route, mode, direction):
    check_all_zero(NUMPY_ROUTES[route], mode, direction)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_backend_exploding_relu(direction, dtype):
    check_exploding(NUMPY_ROUTES["plan"], direction, dtype)


# --------------------------------------------------------------------------- JAX

def _jax():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return pytest.importorskip("jax")


@functools.lru_cache(maxsize=None)
def _jax_function(route, attrs, time_major):
    """Jitted ``(x, h0, c0, params, lengths, dy, dhy, dcy) -> (results, gradients)`` of
    ``pycudnnrnn.jax.rnn`` through ``jax.vjp`` (gradients None in inference): one
    compilation per route and cell (the lengths are traced), whatever is planted."""
    jax = _jax()
    import jax.numpy as jnp

    from pycudnnrnn import jax as rnn_jax
    attrs = dict(attrs, time_major=time_major)
    if route == "dropout":  # training with dropout: the NumPy backend's custom call
        attrs.update(dropout=0.5, seed=3, seed2=4)
    inference = route.endswith("inference")

    def f(x, h0, c0, params, lengths, dy, dhy, dcy):
        run = lambda x, h0, c0, params: rnn_jax.rnn(  # noqa: E731
            x, h0, c0, params, lengths, is_training=not inference, **attrs)
        if inference:
            return run(x, h0, c0, params), None
        results, vjp = jax.vjp(run, x, h0, c0, params)
        return results, vjp((dy, dhy, jnp.zeros((0,), x.dtype) if dcy is None else dcy))
    return jax.jit(f)


def run_jax(p: Ragged, route="scan", time_major=True) -> Results:
    """``pycudnnrnn.jax.rnn`` on the CPU: XLA's scan, or (`route` "custom call", "custom
    call inference", "dropout") the NumPy backend's custom call."""
    jax = _jax()
    from pycudnnrnn import jax as rnn_jax
    bm = lambda a: _batch_major(a, time_major)  # noqa: E731
    args = [bm(a) for a in (p.x, p.h0, p.c0)] + [p.params, p.lengths] + \
        [bm(a) for a in (p.dy, p.dhy, p.dcy)]
    applies = rnn_jax.scan.applies
    if route.startswith("custom call"):
        rnn_jax.scan.applies = lambda problem: False  # (read when the function is traced)
    try:
        with jax.enable_x64(p.dtype == np.float64):
            (y, hy, cy), grads = _jax_function(route, tuple(sorted(p.attrs.items())),
                                               time_major)(*args)
    finally:
        rnn_jax.scan.applies = applies
    y, hy, cy = (bm(np.asarray(a)) for a in (y, hy, cy))
    results = Results(y, hy, cy if p.lstm else None)
    if grads is not None:
        dx, dh0, dc0, dparams = grads
        results.dx, results.dh0, results.dparams = bm(np.asarray(dx)), bm(np.asarray(dh0)), \
            np.asarray(dparams)
        results.dc0 = bm(np.asarray(dc0)) if p.lstm else None
    return results


#: XLA's tanh and products against NumPy's (as in tests/test_jax.py).
SCAN_ULPS = 64

JAX_ROUTES = {  # (Flax's modules below run the scan batch-major)
    "scan": run_jax,
    "custom call": functools.partial(run_jax, route="custom call"),
    "custom call inference": functools.partial(run_jax, route="custom call inference"),
    "dropout": functools.partial(run_jax, route="dropout"),
}


@pytest.mark.parametrize("route", list(JAX_ROUTES))
@GRID
def test_jax(route, mode, direction, where, value):
    check_route(JAX_ROUTES[route], mode, direction, where, value)


@pytest.mark.parametrize("route", list(JAX_ROUTES))
@VARIANT_GRID
def test_jax_variants(route, variant, where, value):
    check_route(JAX_ROUTES[route], direction="bidirectional", where=where, value=value,
                **VARIANTS[variant])


@pytest.mark.parametrize("route", list(JAX_ROUTES))
@ALL_ZERO
def test_jax_all_rows_of_length_0(route, mode, direction):
    check_all_zero(JAX_ROUTES[route], mode, direction)


@pytest.mark.parametrize("route", ["scan", "custom call"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_jax_exploding_relu(route, direction):
    """(float64: the grid's compiled functions; the scan's rule for relu does not
    depend on the dtype, and float32 overflows as surely, see the NumPy test.)"""
    check_exploding(JAX_ROUTES[route], direction, ulps=SCAN_ULPS if route == "scan" else ULPS)


@functools.lru_cache(maxsize=None)
def _jax_hessian(rnn_mode, direction, argnums):
    """Jitted ``jax.hessian`` of a fixed projection of the results (the cotangents'
    weights) with respect to `argnums` of ``(x, h0, params)``."""
    jax = _jax()
    import jax.numpy as jnp

    from pycudnnrnn import jax as rnn_jax

    def loss(x, h0, params, c0, lengths, dy, dhy, dcy):
        y, hy, cy = rnn_jax.rnn(x, h0, c0, params, lengths, rnn_mode=rnn_mode,
                                direction=direction)
        return jnp.sum(y * dy) + jnp.sum(hy * dhy) + (0 if dcy is None else jnp.sum(cy * dcy))
    return jax.jit(jax.hessian(loss, argnums=argnums))


@pytest.mark.parametrize("mode,direction,argnums", [("rnn_relu", "bidirectional", (0, 1, 2))])
def test_jax_hessian(mode, direction, argnums):
    """``jax.hessian`` (forward over reverse, through the scan's own derivative rule):
    NaN planted in the padding, the states of rows of length 0 and the cotangents'
    padding changes no second derivative, and those with respect to the padding and to
    such a row's state (on which the results depend linearly, if at all) are 0."""
    jax = _jax()
    problem = make_ragged(mode, direction)
    planted = plant(plant(plant(problem, "padding", np.nan), "empty_rows", np.nan),
                    "cotangents", np.nan)

    def hessian(p):
        with jax.enable_x64(True):
            blocks = _jax_hessian(mode, direction, argnums)(
                p.x, p.h0, p.params, p.c0, p.lengths, p.dy, p.dhy, p.dcy)
        return [[np.asarray(b) for b in row] for row in blocks]

    got, want = hessian(planted), hessian(problem)
    arrays = (problem.x, problem.h0, problem.params)
    unread = (np.broadcast_to(problem.padding[..., None], problem.x.shape),
              np.broadcast_to(problem.empty[None, :, None], problem.h0.shape),
              np.zeros(problem.params.shape, bool))
    for i, a in enumerate(argnums):
        for j, b in enumerate(argnums):
            g = got[i][j].reshape(arrays[a].size, arrays[b].size)
            w = want[i][j].reshape(g.shape)
            assert_close(g, w, f"hessian block {a}, {b}")
            assert_zero(g[unread[a].reshape(-1)], f"hessian block {a}, {b}: unread rows")
            assert_zero(g[:, unread[b].reshape(-1)], f"hessian block {a}, {b}: unread columns")


# --------------------------------------------------------------------------- Flax

@functools.lru_cache(maxsize=None)
def _flax_function(rnn_mode, direction, dropout):
    """Jitted ``(x, h0, c0, params, lengths, dy, dhy, dcy) -> (results, gradients)`` of
    a ``pycudnnrnn.flax`` module (batch-major, as Flax's own RNNs) through ``jax.vjp``;
    states ``[L·D, B, ·]`` and results as the op's, batch-major. With `dropout`, the
    module trains with dropout between its layers (one call per layer, masks from a
    fixed key)."""
    jax = _jax()
    import jax.numpy as jnp
    from flax import nnx

    from pycudnnrnn import flax as rnn_flax
    cls = {"lstm": rnn_flax.LSTM, "gru": rnn_flax.GRU}.get(rnn_mode, rnn_flax.SimpleRNN)
    options = dict(activation=rnn_mode[4:]) if rnn_mode.startswith("rnn_") else {}
    module = nnx.eval_shape(lambda: cls(
        INPUT_SIZE, NUM_UNITS, num_layers=NUM_LAYERS, bidirectional=direction == "bidirectional",
        dropout_rate=0.5 if dropout else 0.0, param_dtype=jnp.float64, rngs=nnx.Rngs(0),
        **options))
    graphdef, weights, rest = nnx.split(module, nnx.Param, ...)  # weights: the one Param
    lstm = rnn_mode == "lstm"

    def f(x, h0, c0, params, lengths, dy, dhy, dcy):
        def run(x, h0, c0, params):
            m = nnx.merge(graphdef, jax.tree.map(lambda _: params, weights), rest)
            B = x.shape[0]
            carry, y = m(x, seq_lengths=lengths, initial_carry=m._carry_from_states(h0, c0, (B,)),
                         return_carry=True, deterministic=not dropout,
                         rngs=jax.random.key(5) if dropout else None)
            hy, cy = m._states_from_carry(carry, (B,), x.dtype)
            return y, hy, cy
        results, vjp = jax.vjp(run, x, h0, c0, params)
        return results, vjp((dy, dhy, dcy if lstm else None))
    return jax.jit(f)


def run_flax(p: Ragged, dropout=False) -> Results:
    jax = _jax()
    bm = lambda a: _batch_major(a, False)  # noqa: E731
    with jax.enable_x64(True):
        (y, hy, cy), (dx, dh0, dc0, dparams) = _flax_function(p.rnn_mode, p.direction, dropout)(
            bm(p.x), p.h0, p.c0, p.params, p.lengths, bm(p.dy), p.dhy, p.dcy)
    as_numpy = lambda a: None if a is None else np.asarray(a)  # noqa: E731
    return Results(bm(np.asarray(y)), *map(as_numpy, (hy, cy)), bm(np.asarray(dx)),
                   *map(as_numpy, (dh0, dc0, dparams)))


FLAX_ROUTES = {"flax": run_flax, "flax-dropout": functools.partial(run_flax, dropout=True)}


@pytest.fixture(scope="module")
def flax_installed():
    _jax()
    pytest.importorskip("flax.nnx")


#: Flax's module is a thin layer on the scan above (tested for every cell): its own
#: parts (carry, lengths, the layer-by-layer call with dropout) for some of them (each
#: costs a compilation of seconds).
FLAX_CELLS = {"flax": [("lstm", "bidirectional"), ("rnn_relu", "unidirectional")],
              "flax-dropout": [("gru", "bidirectional")]}
FLAX_CASES = [(r, m, d) for r, cells in FLAX_CELLS.items() for m, d in cells]


@pytest.mark.parametrize("route,mode,direction", FLAX_CASES)
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("value", list(VALUES))
def test_flax(flax_installed, route, mode, direction, where, value):
    check_route(FLAX_ROUTES[route], mode, direction, where, value)


@pytest.mark.parametrize("route,mode,direction", FLAX_CASES)
def test_flax_all_rows_of_length_0(flax_installed, route, mode, direction):
    check_all_zero(FLAX_ROUTES[route], mode, direction)


def test_flax_exploding_relu(flax_installed):
    check_exploding(FLAX_ROUTES["flax"], "unidirectional", ulps=SCAN_ULPS)


# --------------------------------------------------------------------------- PyTorch
#
# pycudnnrnn.torch.rnn on the CPU, eager: PyTorch's kernels on the packed rows, on zeroed
# padding (GRU, tanh RNN) or as runs of the full-length kernel (LSTM), chosen by size
# (``native._ragged_route``: forced here); under a torch.func transform, the op, whose CPU
# kernels run the same PyTorch kernels (what torch.compile runs too); and the op on the
# NumPy backend, through PyTorch's autograd.

def _torch():
    return pytest.importorskip("torch")


def run_torch(p: Ragged, kernels="torch", transform=False, time_major=True) -> Results:
    """``pycudnnrnn.torch.rnn`` with its gradients for `p`'s cotangents (torch.autograd,
    or ``torch.func.vjp``: `transform`)."""
    torch = _torch()
    import pycudnnrnn.torch as prt
    bm = lambda a: _batch_major(a, time_major)  # noqa: E731
    tensor = lambda a: torch.from_numpy(np.array(bm(a)))  # noqa: E731
    leaves = [tensor(p.x), tensor(p.h0)] + ([tensor(p.c0)] if p.lstm else []) + \
        [torch.from_numpy(p.params.copy())]
    cotangents = [tensor(p.dy), tensor(p.dhy)] + ([tensor(p.dcy)] if p.lstm else [])
    lengths = torch.from_numpy(p.lengths.astype(np.int64))

    def run(x, h0, *rest):
        c0, params = (rest[0], rest[1]) if p.lstm else (None, rest[0])
        y, hy, cy = prt.rnn(x, h0, c0, params, lengths, time_major=time_major, **p.attrs)
        return (y, hy, cy) if p.lstm else (y, hy)

    with prt.cpu_kernels(kernels):
        if transform:
            results, pullback = torch.func.vjp(run, *leaves)
            grads = pullback(tuple(cotangents))
        else:
            leaves = [leaf.requires_grad_() for leaf in leaves]
            results = run(*leaves)
            grads = torch.autograd.grad(results, leaves, cotangents)
    numpy = lambda t: bm(t.detach().numpy())  # noqa: E731
    y, hy = numpy(results[0]), numpy(results[1])
    cy = numpy(results[2]) if p.lstm else None
    dx, dh0 = numpy(grads[0]), numpy(grads[1])
    return Results(y, hy, cy, dx, dh0, numpy(grads[2]) if p.lstm else None,
                   grads[-1].numpy())


TORCH_ROUTES = {  # (route, how the size rules are set: native.RUNS_FROM, ZEROED_UP_TO)
    "packed": (run_torch, {"RUNS_FROM": 10 ** 9, "ZEROED_UP_TO": 0.0}),
    "full-length": (run_torch, {"RUNS_FROM": 0, "ZEROED_UP_TO": float("inf")}),
    "batch-major": (functools.partial(run_torch, time_major=False),
                    {"RUNS_FROM": 0, "ZEROED_UP_TO": float("inf")}),
    "op kernels": (functools.partial(run_torch, transform=True),
                   {"RUNS_FROM": 0, "ZEROED_UP_TO": float("inf")}),
    "numpy kernels": (functools.partial(run_torch, kernels="numpy"), {}),
}


def _torch_route(route, monkeypatch):
    _torch()
    import pycudnnrnn.torch.torch_kernels as native
    run, sizes = TORCH_ROUTES[route]
    for name, value in sizes.items():
        monkeypatch.setattr(native, name, value)
    return run


@pytest.mark.parametrize("route", list(TORCH_ROUTES))
@GRID
def test_torch(route, mode, direction, where, value, monkeypatch):
    check_route(_torch_route(route, monkeypatch), mode, direction, where, value)


@pytest.mark.parametrize("route", list(TORCH_ROUTES))
@VARIANT_GRID
def test_torch_variants(route, variant, where, value, monkeypatch):
    check_route(_torch_route(route, monkeypatch), direction="bidirectional", where=where,
                value=value, **VARIANTS[variant])


@pytest.mark.parametrize("route", list(TORCH_ROUTES))
@ALL_ZERO
def test_torch_all_rows_of_length_0(route, mode, direction, monkeypatch):
    check_all_zero(_torch_route(route, monkeypatch), mode, direction)


@pytest.mark.parametrize("route", list(TORCH_ROUTES))
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_torch_exploding_relu(route, direction, dtype, monkeypatch):
    # against the NumPy backend: another computation (conftest.ULPS)
    check_exploding(_torch_route(route, monkeypatch), direction, dtype, ulps=16)


# --------------------------------------------------------------------------- TensorFlow

def run_tensorflow(p: Ragged) -> Results:
    """``pycudnnrnn.tensorflow.rnn`` (TensorFlow's operations: every row runs every step)
    and its gradients, by a tape."""
    tf = pytest.importorskip("tensorflow")
    import pycudnnrnn.tensorflow as ptf
    x, h0, params = (tf.constant(a) for a in (p.x, p.h0, p.params))
    c0 = tf.constant(p.c0) if p.lstm else None
    sources = [x, h0] + ([c0] if p.lstm else []) + [params]
    with tf.GradientTape() as tape:
        tape.watch(sources)
        y, hy, cy = ptf.rnn(x, h0, c0, params, p.lengths, **p.attrs)
    grads = [g.numpy() for g in tape.gradient(
        [y, hy] + ([cy] if p.lstm else []), sources,
        output_gradients=[tf.constant(a) for a in (p.dy, p.dhy) + ((p.dcy,) if p.lstm else ())])]
    return Results(y.numpy(), hy.numpy(), cy.numpy() if p.lstm else None, grads[0], grads[1],
                   grads[2] if p.lstm else None, grads[-1])


@GRID
def test_tensorflow(mode, direction, where, value):
    check_route(run_tensorflow, mode, direction, where, value)


@VARIANT_GRID
def test_tensorflow_variants(variant, where, value):
    check_route(run_tensorflow, direction="bidirectional", where=where, value=value,
                **VARIANTS[variant])


@ALL_ZERO
def test_tensorflow_all_rows_of_length_0(mode, direction):
    check_all_zero(run_tensorflow, mode, direction)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tensorflow_exploding_relu(direction, dtype):
    # against the NumPy backend: another computation (conftest.ULPS)
    check_exploding(run_tensorflow, direction, dtype, ulps=16)


# --------------------------------------------------------------------------- Keras 3
#
# Keras fixes its backend at import, so each backend runs the cases below in a process
# of its own (``python tests/test_padding_isolation.py --keras REPORT`` with
# KERAS_BACKEND set), started when the first test of this module runs; each test then
# reads its case's line of the report. pycudnnrnn.keras has LSTM and GRU layers; a
# Keras mask gives the lengths (a right-padded one here), and a 2-layer network is two
# layers (two Bidirectional) in a row, the first returning Keras's carried outputs at
# masked steps (its default; on JAX, a row of length 0 outputs its initial h there), the
# second zeros (``zero_output_for_mask``, as Bidirectional sets it).

KERAS_BACKENDS = ("jax", "torch", "tensorflow")
#: (cell, direction) per backend: on JAX each costs a compilation of seconds, and the
#: layers' code is one for both cells (the op's cell is tested above).
KERAS_CELLS = {"jax": [("lstm", "unidirectional"), ("gru", "bidirectional")],
               "torch": [(m, d) for m in ("lstm", "gru") for d in DIRECTIONS],
               "tensorflow": [(m, d) for m in ("lstm", "gru") for d in DIRECTIONS]}


def keras_cases(backend):
    return [(m, d, w, v) for m, d in KERAS_CELLS[backend] for w in WHERE for v in VALUES] + \
        [(m, d, "all zero", "nan") for m, d in KERAS_CELLS[backend]]


def _keras_model(mode, direction, T, B):
    """A functional model ``[x, mask, *states] -> [y, *final states]``, states in the
    op's pseudo-layer order (per pseudo-layer h, then c for LSTM)."""
    import keras

    from pycudnnrnn import keras as ours
    keras.utils.set_random_seed(0)
    cls = {"lstm": ours.LSTM, "gru": ours.GRU}[mode]
    per = 2 if mode == "lstm" else 1
    D = 2 if direction == "bidirectional" else 1
    x_in = keras.Input((T, INPUT_SIZE), batch_size=B)
    mask_in = keras.Input((T,), batch_size=B, dtype="bool")
    states_in = [keras.Input((NUM_UNITS,), batch_size=B) for _ in range(NUM_LAYERS * D * per)]
    x, finals = x_in, []
    for layer in range(NUM_LAYERS):
        last = layer == NUM_LAYERS - 1
        states = states_in[layer * D * per:(layer + 1) * D * per]
        rnn = cls(NUM_UNITS, return_sequences=True, return_state=True,
                  zero_output_for_mask=last)
        if D == 2:
            rnn = ours.Bidirectional(rnn)
        x, *out = rnn(x, mask=mask_in, initial_state=states)
        finals += out
    return keras.Model([x_in, mask_in, *states_in], [x, *finals])


def _keras_states(p: Ragged):
    """h0 (and c0) as the model's state inputs, [B, H] each, pseudo-layer by pseudo-layer."""
    return [s[k] for k in range(p.h0.shape[0]) for s in ((p.h0, p.c0) if p.lstm else (p.h0,))]


def run_keras(p: Ragged, model) -> Results:
    """The model on `p` (float32; Keras's JAX, PyTorch or TensorFlow backend): results and the
    gradients of the cotangents' projection, with respect to the input, the initial
    states and every weight (concatenated in the model's order)."""
    import keras
    bm = lambda a: _batch_major(a, False)  # noqa: E731
    inputs = [bm(p.x), ~bm(p.padding)] + _keras_states(p)
    cotangents = [bm(p.dy)] + _keras_states(p.replace(h0=p.dhy, c0=p.dcy))
    if keras.backend.backend() == "jax":
        import jax
        trainable = [v.value for v in model.trainable_variables]
        frozen = [v.value for v in model.non_trainable_variables]

        @jax.jit
        def vjp(trainable, inputs, cotangents):
            run = lambda w, i: model.stateless_call(w, frozen, i)[0]  # noqa: E731
            outputs, pullback = jax.vjp(run, trainable, inputs)
            return outputs, pullback(cotangents)
        if getattr(model, "_padding_vjp", None) is None:
            model._padding_vjp = vjp
        outputs, (dw, dinputs) = model._padding_vjp(trainable, inputs, cotangents)
        dinputs = [dinputs[0]] + list(dinputs[2:])
    elif keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        tensors = [tf.constant(a) for a in inputs]
        watched = [tensors[0]] + tensors[2:]
        weights = [v.value for v in model.trainable_variables]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            outputs = model(tensors)
        grads = tape.gradient(outputs, watched + weights,
                              output_gradients=[tf.constant(c) for c in cotangents])
        dinputs, dw = grads[:len(watched)], grads[len(watched):]
    else:
        import torch
        tensors = [torch.tensor(a, requires_grad=a.dtype != bool) for a in inputs]
        weights = [v.value for v in model.trainable_variables]
        outputs = model(tensors)
        grads = torch.autograd.grad(outputs, [tensors[0]] + tensors[2:] + weights,
                                    [torch.tensor(c) for c in cotangents])
        n = len(inputs) - 1
        dinputs, dw = grads[:n], grads[n:]
    numpy = lambda a: np.asarray(keras.ops.convert_to_numpy(a))  # noqa: E731
    outputs, dinputs = [numpy(o) for o in outputs], [numpy(g) for g in dinputs]
    per = 2 if p.lstm else 1
    stack = lambda arrays, j: np.stack(arrays[j::per])  # noqa: E731
    return Results(bm(outputs[0]), stack(outputs[1:], 0), stack(outputs[1:], 1) if p.lstm else None,
                   bm(dinputs[0]), stack(dinputs[1:], 0), stack(dinputs[1:], 1) if p.lstm else None,
                   np.concatenate([numpy(g).reshape(-1) for g in dw]))


def _keras_case_id(backend, case):
    return f"{backend}-" + _id(case)


def _keras_report(path):
    """Run every case of ``keras_cases`` on this process's Keras backend; write
    ``{case id: "ok" or what failed}`` to `path` as JSON."""
    import traceback

    import keras
    backend = keras.backend.backend()
    report, models, clean_runs = {}, {}, {}
    for case in keras_cases(backend):
        mode, direction, where, value = case
        try:
            all_zero = where == "all zero"
            if all_zero:
                problem = make_ragged(mode, direction, lengths=(0,) * len(LENGTHS),
                                      T=LENGTHS[0], dtype=np.float32)
                planted = plant(problem, "all", np.nan)
            else:
                problem = make_ragged(mode, direction, dtype=np.float32)
                planted = plant(problem, where, VALUES[value])
            key = (mode, direction)
            if key not in models:
                models[key] = _keras_model(mode, direction, problem.T, len(problem.lengths))
            if key + (all_zero,) not in clean_runs:  # (a Keras call costs ~0.1 s)
                clean_runs[key + (all_zero,)] = run_keras(problem, models[key])
            clean = clean_runs[key + (all_zero,)]
            got = run_keras(planted, models[key])
            assert_isolated(planted, got, clean, where)
            if where == "all zero":
                assert_zero(got.dparams, "params gradient")
            report[_keras_case_id(backend, case)] = "ok"
        except Exception:  # noqa: BLE001  (reported to the test of that case)
            report[_keras_case_id(backend, case)] = traceback.format_exc()[-6000:]
    with open(path, "w") as f:
        json.dump(report, f)


_HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module", autouse=True)
def keras_runs(request, tmp_path_factory):
    """Each backend's process, started with this module's first test if any Keras test
    is selected (they run beside the other tests): ``{backend: (process, report path)}``."""
    selected = any(item.fspath == request.node.fspath and "test_keras" in item.name
                   for item in request.session.items)
    runs = {}
    if selected and importlib.util.find_spec("keras") is not None:
        for backend in KERAS_BACKENDS:
            if importlib.util.find_spec(backend) is None:
                continue
            path = tmp_path_factory.mktemp(f"keras-{backend}") / "report.json"
            env = {**os.environ, "KERAS_BACKEND": backend,
                   "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "PYTHONPATH": os.pathsep.join([os.path.dirname(_HERE),
                                                  os.environ.get("PYTHONPATH", "")])}
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--keras", str(path)], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            runs[backend] = (proc, path)
    yield runs
    for proc, _ in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@functools.lru_cache(maxsize=None)
def _keras_result(backend, proc, path):
    output, _ = proc.communicate(timeout=900)
    if proc.returncode != 0 or not os.path.exists(path):
        return {"error": f"KERAS_BACKEND={backend} exited with {proc.returncode}:\n"
                         f"{output[-6000:]}"}
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("backend,mode,direction,where,value",
                         [(b,) + c for b in KERAS_BACKENDS for c in keras_cases(b)],
                         ids=[_keras_case_id(b, c) for b in KERAS_BACKENDS
                              for c in keras_cases(b)])
def test_keras(keras_runs, backend, mode, direction, where, value):
    if backend not in keras_runs:
        pytest.skip(f"keras or {backend} is not installed")
    report = _keras_result(backend, *keras_runs[backend])
    assert "error" not in report, report.get("error")
    result = report[_keras_case_id(backend, (mode, direction, where, value))]
    assert result == "ok", result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--keras"]:
        _keras_report(sys.argv[2])
