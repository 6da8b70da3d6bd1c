"""pycudnnrnn.jax: the RNN as a native JAX operation (CPU here).

Every result is held against the eager NumPy backend (``pycudnnrnn.forward`` and
``backprop``) on the same arrays. The CPU has two lowerings, both tested (the `lowering`
fixture): XLA's own operations (``pycudnnrnn.jax.scan``, wherever no dropout mask is
drawn), a different computation, held within a few dozen ulps; and the custom call that
runs the NumPy backend, which agrees to the last bit unless a buffer, an attribute or a
layout is mistranslated. The CUDA handlers on the stand-in GPU run it on cuDNN's batch
(zero-length rows left out): a few ulps there.
"""

import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

# On a GPU machine JAX would take 75 % of the GPU's memory at its first use, away from the
# cuDNN backend's CuPy pool (and from the other GPU tests of the same run).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import pycudnnrnn  # noqa: E402
from pycudnnrnn.core.config import Attributes
from conftest import assert_ulp_close, benchmark_script  # noqa: E402
from pycudnnrnn import jax as rnn_jax  # noqa: E402
from pycudnnrnn.jax import xla_ffi  # noqa: E402

from conftest import make_case  # noqa: E402

CONFIGS = {
    "lstm-bi-2layer-zero-lengths": dict(rnn_mode="lstm", direction="bidirectional",
                                        num_layers=2, lengths="zero"),
    "gru-bi-ragged": dict(rnn_mode="gru", direction="bidirectional", lengths="ragged"),
    "rnn_tanh-2layer": dict(rnn_mode="rnn_tanh", num_layers=2, lengths="zero"),
    "rnn_relu-batch-major": dict(rnn_mode="rnn_relu", time_major=False, lengths="ragged"),
    "lstm-projection-bi": dict(rnn_mode="lstm", num_proj=3, direction="bidirectional",
                               lengths="zero"),
    "gru-skip-input-batch-major": dict(rnn_mode="gru", input_mode="skip_input",
                                       time_major=False),
    "lstm-dropout": dict(rnn_mode="lstm", num_layers=3, dropout=0.4, lengths="ragged"),
}


def _case(name, **extra):
    return make_case(**{"dtype": np.float32, **CONFIGS[name], **extra})


def _lengths(case):
    return None if case.sequence_lengths is None else np.asarray(case.sequence_lengths, np.int32)


def _jax_rnn(case, **overrides):
    attrs = {**case.attrs, **overrides}
    return lambda x, h, c, p, lengths: rnn_jax.rnn(x, h, c, p, lengths, **attrs)


@pytest.fixture(params=["scan", "custom call"])
def lowering(request, monkeypatch):
    """Each of the CPU's lowerings of ``rnn`` in turn (see the module docstring)."""
    if request.param == "custom call":
        monkeypatch.setattr(rnn_jax.scan, "applies", lambda problem: False)
    return request.param


@pytest.fixture
def custom_call(monkeypatch):
    """The NumPy backend's custom call on the CPU, for what only it does (folding)."""
    monkeypatch.setattr(rnn_jax.scan, "applies", lambda problem: False)


#: XLA's tanh, sigmoid and products against NumPy's: dozens of ulps of an array's scale
#: after a few steps (a gate, layout or mask mistake is off by orders of magnitude more);
#: 16-bit results, computed in float32 and rounded once, by at most their own last unit.
SCAN_ULPS = 64


def _assert_same(ours, expected, lowering="custom call"):
    for a, b in zip(ours, expected):
        if lowering == "custom call":
            np.testing.assert_array_equal(np.asarray(a), b)
        else:
            assert_ulp_close(a, b, ulps=1 if b.dtype.itemsize == 2 else SCAN_ULPS)


@pytest.mark.parametrize("name", CONFIGS)
def test_jit_equals_numpy_backend(name, lowering):
    case = _case(name)
    f = jax.jit(_jax_rnn(case))
    ours = f(case.input, case.input_h, case.input_c, case.params, _lengths(case))
    _assert_same(ours, case.forward()[:3], lowering)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_other_dtypes_equal_numpy_backend(dtype, lowering):
    case = _case("gru-bi-ragged", dtype=np.dtype(dtype))
    with jax.enable_x64(dtype == "float64"):  # JAX keeps float64 only with x64 on
        ours = jax.jit(_jax_rnn(case))(*_args(case))
        assert ours[0].dtype == np.dtype(dtype)
        _assert_same(ours, case.forward()[:3], lowering)


def test_any_int_seeds_give_the_eager_masks():
    case = _case("lstm-dropout")
    seeds = dict(seed=-(2 ** 40) - 5, seed2=2 ** 64 + 7)  # beyond int64 and negative
    ours = jax.jit(_jax_rnn(case, **seeds))(*_args(case))
    _assert_same(ours, case.forward(**seeds)[:3])
    assert not np.array_equal(np.asarray(ours[0]), case.forward()[0])  # the seeds matter


def test_inference_equals_numpy_backend_and_eager_call_works(lowering):
    case = _case("lstm-bi-2layer-zero-lengths")
    expected = case.forward(is_training=False)[:3]
    args = (case.input, case.input_h, case.input_c, case.params, _lengths(case))
    _assert_same(jax.jit(_jax_rnn(case, is_training=False))(*args), expected, lowering)
    _assert_same(_jax_rnn(case, is_training=False)(*args), expected, lowering)  # no jit


def _loss_weights(case, outputs):
    rng = np.random.default_rng(7)
    return [rng.standard_normal(np.shape(o)).astype(np.float32) for o in outputs]


@pytest.mark.parametrize("name", ["lstm-bi-2layer-zero-lengths", "gru-bi-ragged",
                                  "rnn_relu-batch-major", "lstm-projection-bi", "lstm-dropout"])
def test_grad_through_jit_equals_backprop(name, lowering):
    case = _case(name)
    fwd = case.forward()
    dy, dh, dc = _loss_weights(case, fwd[:3])
    f = _jax_rnn(case)
    lstm = case.attrs["rnn_mode"] == "lstm"

    def loss(x, h, c, p):
        y, hy, cy = f(x, h, c, p, _lengths(case))
        total = jnp.sum(y * dy) + jnp.sum(hy * dh)
        return total + jnp.sum(cy * dc) if lstm else total

    argnums = (0, 1, 2, 3) if lstm else (0, 1, 3)
    grads = jax.jit(jax.grad(loss, argnums=argnums))(case.input, case.input_h, case.input_c,
                                                     case.params)
    expected = case.backprop(fwd, dy, dh, dc if lstm else np.zeros((0,), np.float32))
    expected = expected if lstm else (expected[0], expected[1], expected[3])
    for ours, theirs in zip(grads, expected):
        if lowering == "scan":  # JAX's own derivative of XLA's forward
            assert_ulp_close(ours, theirs, ulps=SCAN_ULPS)
        else:
            np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-6, atol=1e-6)


def _custom_calls(f, *args):
    """How often each of our targets appears in the lowered program of ``grad(f)``."""
    text = jax.jit(jax.grad(f)).lower(*args).as_text()
    return {t: text.count(t) for t in ("pycudnnrnn_forward", "pycudnnrnn_backprop",
                                        "pycudnnrnn_check_lengths")}


@pytest.mark.parametrize("lengths", ["none", "known", "traced"])
def test_cpu_training_step_is_xla_s_own_operations(lengths):
    """No custom call runs the RNN on the CPU unless dropout draws masks; traced lengths
    pass one call that range-checks them (known ones are checked at trace time)."""
    case = _case("gru-bi-ragged")
    f = _jax_rnn(case)
    known = _lengths(case) if lengths == "known" else None
    loss = lambda p, lens: jnp.sum(f(case.input, case.input_h, None, p,  # noqa: E731
                                     known if lens is None else lens)[0])
    traced = _lengths(case) if lengths == "traced" else None
    assert _custom_calls(loss, case.params, traced) == {
        "pycudnnrnn_forward": 0, "pycudnnrnn_backprop": 0,
        "pycudnnrnn_check_lengths": int(lengths == "traced")}
    dropout = _case("lstm-dropout")
    g = _jax_rnn(dropout)
    masked = lambda p: jnp.sum(g(*_args(dropout)[:3], p, _lengths(dropout))[0])  # noqa: E731
    calls = _custom_calls(masked, dropout.params)
    assert calls["pycudnnrnn_forward"] == calls["pycudnnrnn_backprop"] == 1


@pytest.mark.parametrize("rnn_mode, kept", [("lstm", 4 + 1 + 1), ("gru", 2 + 1 + 1 + 1),
                                            ("rnn_tanh", 1 + 1)])
def test_cpu_training_keeps_per_step_only_pre_activations_and_states(rnn_mode, kept):
    """What the CPU's scan keeps for the backward pass, per step: the gate pre-activations
    and the state the step started from (`kept` [B, H] blocks: a GRU's reset and update
    gates summed, its candidate's two products apart), and the input; the rest is
    recomputed. Keeping every intermediate (JAX's own derivative of the loop: 12 blocks
    for an LSTM) made the buffers of a medium LSTM cross glibc's 32 MB mmap threshold,
    and every call paid ~8000 page faults (a third of its time); a GRU's two products
    kept whole (6 blocks) did the same to a medium GRU."""
    T, B, I, H = 7, 3, 2, 5
    n = pycudnnrnn.params_size(rnn_mode=rnn_mode, num_layers=1, num_units=H, input_size=I)
    x, h = jnp.ones((T, B, I)), jnp.zeros((1, B, H))
    c = h if rnn_mode == "lstm" else None
    loss = lambda p, x: jnp.sum(rnn_jax.rnn(x, h, c, p, None, rnn_mode=rnn_mode)[0])  # noqa: E731
    _, backward = jax.vjp(loss, jnp.full((n,), 0.1), x)
    per_step = [a for a in jax.tree_util.tree_leaves(backward) if a.shape[:1] == (T,)]
    assert sum(a.size for a in per_step) == T * B * (kept * H + I)


def _scan_products(jaxpr):
    """The number of products in the body of each ``scan`` in `jaxpr` (nested ones too)."""
    def subjaxprs(eqn):
        for value in eqn.params.values():
            for v in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(v, "jaxpr", v)
                if hasattr(inner, "eqns"):
                    yield inner

    def products(jaxpr):  # not counting those of scans inside
        return sum(1 if e.primitive.name == "dot_general" else
                   0 if e.primitive.name == "scan" else sum(map(products, subjaxprs(e)))
                   for e in jaxpr.eqns)

    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            yield products(eqn.params["jaxpr"].jaxpr)
        for inner in subjaxprs(eqn):
            yield from _scan_products(inner)


@pytest.mark.parametrize("num_proj, forward, backward", [(0, 2, 1), (3, 3, 2)])
def test_cpu_backward_loop_makes_only_the_products_that_carry_the_state(num_proj, forward,
                                                                          backward):
    """An LSTM's gradient on the CPU: the forward loop makes the input's, the state's
    (and the projection's) products; the backward loop only the state's (and the
    projection's), and the weight and input gradients are products over all steps after
    it, as cuDNN makes them (JAX's own derivative of the loop made 4 products a step, 6
    with a projection)."""
    T, B, I, H = 5, 3, 2, 4
    n = pycudnnrnn.params_size(num_layers=1, num_units=H, input_size=I, num_proj=num_proj)
    h, c = jnp.zeros((1, B, num_proj or H)), jnp.zeros((1, B, H))
    loss = lambda p, x: jnp.sum(rnn_jax.rnn(x, h, c, p, None, num_proj=num_proj)[0])  # noqa: E731
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(jnp.ones(n), jnp.ones((T, B, I)))
    assert sorted(_scan_products(jaxpr.jaxpr)) == [backward, forward]


def test_nan_padding_and_unused_states_reach_no_gradient(lowering):
    """A zero-length row's initial state and the input's padding may hold anything: NaN
    there stays out of every other result and of the weight gradients."""
    case = _case("lstm-bi-2layer-zero-lengths")
    x, h, c = case.input.copy(), case.input_h.copy(), case.input_c.copy()
    zero = case.sequence_lengths.index(0)
    h[:, zero], c[:, zero] = np.nan, np.nan
    for b, n in enumerate(case.sequence_lengths):
        x[n:, b] = np.nan
    lengths = _lengths(case)
    f = _jax_rnn(case)
    outputs = jax.jit(f)(x, h, c, case.params, lengths)
    expected = pycudnnrnn.forward(x, h, c, case.params, lengths, **case.attrs)
    _assert_same(outputs, expected[:3], lowering)
    assert np.isnan(np.asarray(outputs[1])[:, zero]).all()  # output_h: its initial state
    grad = jax.jit(jax.grad(lambda p: jnp.nansum(f(x, h, c, p, lengths)[0])))(case.params)
    assert np.isfinite(np.asarray(grad)).all()


def test_short_rows_of_a_relu_rnn_in_a_long_batch_have_finite_gradients():
    """The CPU's scan computes a row's steps past its end and drops them; relu's state is
    unbounded, so there the row keeps its state instead (397 dropped steps overflowed to
    inf, and inf · 0 made the weight gradient NaN)."""
    T, B, I, H = 400, 2, 2, 4
    n = pycudnnrnn.params_size(rnn_mode="rnn_relu", num_layers=1, num_units=H, input_size=I)
    x, h = jnp.ones((T, B, I)), jnp.zeros((1, B, H))
    loss = lambda p, lens: jnp.sum(rnn_jax.rnn(x, h, None, p, lens,  # noqa: E731
                                               rnn_mode="rnn_relu")[1])
    params = jnp.full((n,), 0.6, jnp.float32)
    lengths = np.array([3, 2], np.int32)
    grad = jax.jit(jax.grad(loss))(params, lengths)
    assert np.isfinite(np.asarray(grad)).all()
    want = pycudnnrnn.backprop(
        *(np.asarray(a) for a in (x, h)), None, np.asarray(params), lengths,
        *pycudnnrnn.forward(np.asarray(x), np.asarray(h), None, np.asarray(params), lengths,
                            rnn_mode="rnn_relu")[:3],
        np.zeros((T, B, H), np.float32), np.ones((1, B, H), np.float32),
        np.zeros((0,), np.float32),
        pycudnnrnn.forward(np.asarray(x), np.asarray(h), None, np.asarray(params), lengths,
                           rnn_mode="rnn_relu")[3], rnn_mode="rnn_relu")[3]
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-5)


def test_cpu_scan_has_forward_mode_derivatives():
    """XLA's own operations are differentiated by JAX, forward mode too (the custom calls,
    on the GPU, have only reverse mode): jacfwd agrees with jacrev."""
    case = _case("gru-bi-ragged")
    f = lambda x: _jax_rnn(case)(x, case.input_h, None, case.params,  # noqa: E731
                                 _lengths(case))[1]
    np.testing.assert_allclose(jax.jacfwd(f)(case.input), jax.jacrev(f)(case.input),
                               rtol=1e-5, atol=1e-6)


def test_grad_under_checkpoint_recomputes_the_same_forward():
    case = _case("lstm-dropout")  # dropout: the recomputed forward must draw the same masks
    f = _jax_rnn(case)
    loss = lambda p: jnp.sum(f(case.input, case.input_h, case.input_c, p,  # noqa: E731
                               _lengths(case))[0] ** 2)
    np.testing.assert_array_equal(jax.jit(jax.grad(jax.checkpoint(loss)))(case.params),
                                  jax.jit(jax.grad(loss))(case.params))


def test_scan_over_chunks_equals_one_call_values_and_grads():
    case = make_case(rnn_mode="lstm", num_layers=2, T=6, B=3, dtype=np.float32)
    f = _jax_rnn(case)
    chunks = case.input.reshape(3, 2, *case.input.shape[1:])  # 3 chunks of 2 steps

    def chunked(p):
        def step(state, x):
            y, h, c = f(x, state[0], state[1], p, None)
            return (h, c), y
        (h, c), ys = jax.lax.scan(step, (case.input_h, case.input_c), chunks)
        return ys.reshape(case.input.shape[0], *ys.shape[2:]), h, c

    def whole(p):
        return f(case.input, case.input_h, case.input_c, p, None)

    for ours, want in zip(jax.jit(chunked)(case.params), case.forward()[:3]):
        assert_ulp_close(ours, want)  # products over 2 steps at a time, not 6: other shapes
    loss = lambda g: lambda p: sum(jnp.sum(jnp.sin(o)) for o in g(p))  # noqa: E731
    np.testing.assert_allclose(jax.jit(jax.grad(loss(chunked)))(case.params),
                               jax.jit(jax.grad(loss(whole)))(case.params), rtol=1e-5, atol=1e-6)


def _mapped_problem(N=3, time_major=True):
    """N cases sharing weights and configuration, stacked on a new leading axis."""
    cases = [make_case(rnn_mode="gru", direction="bidirectional", lengths="zero",
                       time_major=time_major, dtype=np.float32, seed=s) for s in range(N)]
    stack = lambda name: np.stack([getattr(c, name) for c in cases])  # noqa: E731
    lengths = np.stack([np.roll(_lengths(cases[0]), s) for s in range(N)])
    return cases[0], stack("input"), stack("input_h"), lengths


def _one_call_no_loop(f, *args):
    """Whether `f` lowers to one forward custom call and no loop (a sequential vmap of a
    custom call lowers to a while loop around it)."""
    text = jax.jit(f).lower(*args).as_text()
    return text.count("pycudnnrnn_forward") == 1 and "while" not in text


@pytest.mark.parametrize("time_major", [True, False])
def test_vmap_inference_folds_into_one_call_and_equals_a_loop(time_major, custom_call):
    case, xs, hs, lengths = _mapped_problem(time_major=time_major)
    f = lambda x, h, lens: _jax_rnn(case, is_training=False)(x, h, None, case.params, lens)  # noqa
    mapped = jax.jit(jax.vmap(f))
    ours = mapped(xs, hs, lengths)
    for n in range(xs.shape[0]):
        expected = pycudnnrnn.forward(xs[n], hs[n], None, case.params, lengths[n],
                                      **case.attrs, is_training=False)
        np.testing.assert_allclose(np.asarray(ours[0][n]), expected[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(ours[1][n]), expected[1], rtol=1e-6, atol=1e-6)
    assert _one_call_no_loop(jax.vmap(f), xs, hs, lengths)
    # An unmapped state is shared by every element.
    shared = jax.vmap(f, in_axes=(0, None, 0))(xs, hs[0], lengths)
    expected = pycudnnrnn.forward(xs[1], hs[0], None, case.params, lengths[1], **case.attrs,
                                  is_training=False)
    np.testing.assert_allclose(np.asarray(shared[0][1]), expected[0], rtol=1e-6, atol=1e-6)


def test_vmap_training_values_and_per_element_grads_equal_a_loop():
    case, xs, hs, lengths = _mapped_problem()
    f = _jax_rnn(case)

    def loss(p, x, h, lens):
        y, hy, _ = f(x, h, None, p, lens)
        return jnp.sum(y ** 2) + jnp.sum(jnp.cos(hy))

    outputs = jax.jit(jax.vmap(lambda x, h, lens: f(x, h, None, case.params, lens)))(
        xs, hs, lengths)
    per_element = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0)))(
        case.params, xs, hs, lengths)
    summed = jax.jit(jax.grad(lambda p: jnp.sum(jax.vmap(loss, in_axes=(None, 0, 0, 0))(
        p, xs, hs, lengths))))(case.params)
    for n in range(xs.shape[0]):
        assert_ulp_close(outputs[0][n],  # vmap folds into the batch: another batch size
                         f(xs[n], hs[n], None, case.params, lengths[n])[0])
        np.testing.assert_allclose(np.asarray(per_element[n]),
                                   jax.grad(loss)(case.params, xs[n], hs[n], lengths[n]),
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(summed), np.asarray(per_element).sum(0),
                               rtol=1e-5, atol=1e-5)


def test_vmap_over_params_maps_each_weight_set():
    case, xs, hs, lengths = _mapped_problem()
    params = np.stack([case.params, 0.5 * case.params, -case.params])
    f = lambda p, x, h: _jax_rnn(case, is_training=False)(x, h, None, p, None)  # noqa: E731
    ours = jax.jit(jax.vmap(f))(params, xs, hs)
    for n in range(3):
        expected = pycudnnrnn.forward(xs[n], hs[n], None, params[n], **case.attrs,
                                      is_training=False)
        np.testing.assert_allclose(np.asarray(ours[0][n]), expected[0], rtol=1e-6, atol=1e-6)


def test_jitted_optax_training_step_lowers_the_loss():
    optax = pytest.importorskip("optax")
    T, B, I, H = 12, 8, 3, 16
    n = pycudnnrnn.params_size(num_layers=1, num_units=H, input_size=I)
    key = jax.random.PRNGKey(0)
    params = jax.random.uniform(key, (n,), minval=-0.3, maxval=0.3)
    x = jax.random.normal(jax.random.PRNGKey(1), (T, B, I))
    target = jnp.cumsum(x[..., :1], axis=0) / 4  # a running sum: needs the recurrence
    zeros = jnp.zeros((1, B, H))
    optimizer = optax.adam(3e-2)

    def loss(p):
        y, _, _ = rnn_jax.rnn(x, zeros, zeros, p)
        return jnp.mean((y[..., :1] - target) ** 2)

    @jax.jit
    def step(p, state):
        value, grad = jax.value_and_grad(loss)(p)
        updates, state = optimizer.update(grad, state)
        return optax.apply_updates(p, updates), state, value

    state = optimizer.init(params)
    first = None
    for _ in range(30):
        params, state, value = step(params, state)
        first = value if first is None else first
    assert float(loss(params)) < 0.5 * float(first)


# --------------------------------------------------------------------------- errors

def _args(case):
    return [case.input, case.input_h, case.input_c, case.params, _lengths(case)]


@pytest.mark.parametrize("index, value, error, words", [
    (0, lambda c: c.input.astype(np.int32), TypeError, "input: expected dtype"),
    (1, lambda c: c.input_h[:, :2], ValueError, "input_h: expected shape"),
    (2, lambda c: c.input_c[..., :3], ValueError, "input_h: expected last dimension"),
    (3, lambda c: c.params[:-1], ValueError, "params: expected"),
    (4, lambda c: np.array([1.0, 2.0, 3.0]), TypeError, "sequence_lengths: expected integers"),
    (4, lambda c: np.array([1, 2]), ValueError, "sequence_lengths: expected shape (3,)"),
])
def test_shape_and_dtype_errors_at_trace_time(index, value, error, words):
    case = _case("lstm-bi-2layer-zero-lengths")
    args = _args(case)
    args[index] = value(case)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        jax.jit(_jax_rnn(case)).trace(*args)  # tracing alone raises: nothing runs


@pytest.mark.parametrize("attribute, value, error", [
    ("rnn_mode", "lstmx", ValueError), ("direction", "both", ValueError),
    ("num_proj", 9, ValueError), ("dropout", 1.0, ValueError), ("time_major", 1, TypeError),
    ("seed", 1.5, TypeError),
])
def test_attribute_errors_name_the_attribute(attribute, value, error):
    case = _case("lstm-bi-2layer-zero-lengths")
    with pytest.raises(error, match=attribute):
        jax.jit(_jax_rnn(case, **{attribute: value})).trace(*_args(case))


def test_known_lengths_out_of_range_raise_at_the_call():
    case = _case("lstm-bi-2layer-zero-lengths")
    args = _args(case)
    args[4] = np.array([1, 9, 0], np.int32)
    with pytest.raises(ValueError, match=r"sequence_lengths: expected values in \[0, 4\]"):
        _jax_rnn(case)(*args)


def test_handler_error_surfaces_as_python_exception_with_our_message(lowering):
    case = _case("lstm-bi-2layer-zero-lengths")
    f = jax.jit(_jax_rnn(case))
    args = _args(case)
    args[4] = np.array([1, 9, 0], np.int32)  # traced under jit: only the handler sees 9
    with pytest.raises(Exception, match=r"sequence_lengths: expected values in \[0, 4\] "
                                        r"\(max_time\), got 9 at index 1") as info:
        jax.block_until_ready(f(*args))
    assert "INVALID_ARGUMENT" in str(info.value)
    _assert_same(f(*_args(case)), case.forward()[:3], lowering)  # and the next call is fine


@pytest.mark.parametrize("dtype,value", [("int64", 2 ** 32 + 3), ("int64", 2 ** 63 - 1),
                                         ("uint32", 2 ** 32 - 1), ("uint64", 2 ** 64 - 1)])
def test_traced_wide_lengths_are_checked_in_their_own_type(dtype, value, lowering):
    """With x64 on, a traced int64 2**32 + 3 used to wrap at the int32 cast to 3 and run;
    now the handler range-checks the value itself, and names it."""
    case = _case("gru-bi-ragged")
    with jax.enable_x64(True):
        lengths = jnp.array([value, 0, 2], dtype=dtype)
        f = jax.jit(lambda lens: _jax_rnn(case)(*_args(case)[:4], lens)[1])
        with pytest.raises(Exception, match=rf"sequence_lengths: expected values in \[0, 4\] "
                                            rf"\(max_time\), got {value} at index 0"):
            jax.block_until_ready(f(lengths))
        ran = f(jnp.array([3, 0, 2], dtype=dtype))  # in range: as the eager call with int32
    assert_ulp_close(ran, pycudnnrnn.forward(*_args(case)[:4], [3, 0, 2], **case.attrs)[1])


def test_vmapped_inference_names_the_element_and_index_of_a_bad_length(lowering):
    case, xs, hs, lengths = _mapped_problem()
    f = jax.jit(jax.vmap(lambda x, h, lens: _jax_rnn(case, is_training=False)(
        x, h, None, case.params, lens)[0]))
    bad = lengths.copy()
    bad[2, 1] = 9
    with pytest.raises(Exception, match=r"got 9 at index 1 of vmapped element 2(\n|$)"):
        jax.block_until_ready(f(xs, hs, bad))
    nested = jax.jit(jax.vmap(jax.vmap(lambda x, h, lens: _jax_rnn(case, is_training=False)(
        x, h, None, case.params, lens)[0])))
    stack = lambda a: np.stack([a, a])  # noqa: E731
    worse = stack(lengths)
    worse[1, 2, 0] = -1
    with pytest.raises(Exception, match=r"got -1 at index 0 of vmapped element \(1, 2\)(\n|$)"):
        jax.block_until_ready(nested(stack(xs), stack(hs), worse))


def test_shard_map_and_pmap_over_the_batch_equal_one_call():
    """Two CPU devices (a process of its own): shard_map training values and gradients
    (a replicated params' gradient summed over the mesh, as JAX's own operations give),
    shard_map inference and pmap, each equal to one call on the whole batch. Before the
    results were typed with the operands' mesh axes, shard_map's gradient was refused."""
    script = os.path.join(os.path.dirname(__file__), "jax_sharded_script.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_import_pycudnnrnn_does_not_import_jax():
    code = "import sys, pycudnnrnn; sys.exit('jax' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


# --------------------------------------------------------------------------- the C mirror

_STRUCTS = ["XLA_FFI_Extension_Base", "XLA_FFI_Api_Version", "XLA_FFI_Error_Create_Args",
            "XLA_FFI_Buffer", "XLA_FFI_ByteSpan", "XLA_FFI_Scalar", "XLA_FFI_Array",
            "XLA_FFI_Error_GetMessage_Args", "XLA_FFI_Error_Destroy_Args",
            "XLA_FFI_Args", "XLA_FFI_Rets", "XLA_FFI_Attrs", "XLA_FFI_Stream_Get_Args",
            "XLA_FFI_DeviceMemory_Allocate_Args", "XLA_FFI_DeviceMemory_Free_Args",
            "XLA_FFI_DeviceOrdinal_Get_Args", "XLA_FFI_Metadata", "XLA_FFI_Metadata_Extension",
            "XLA_FFI_Api", "XLA_FFI_CallFrame"]


def test_ctypes_structs_match_the_c_header_jaxlib_ships(tmp_path):
    """Size, and every field's offset and size, of each mirrored struct as C sees them."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to read xla/ffi/api/c_api.h with")
    lines, expected = [], {}
    for name in _STRUCTS:
        struct = getattr(xla_ffi, name)
        expected[f"{name} size"] = ctypes.sizeof(struct)
        lines.append(f'printf("{name} size %zu\\n", sizeof({name}));')
        for field, *_ in struct._fields_:
            descriptor = getattr(struct, field)
            expected[f"{name}.{field} at"] = descriptor.offset
            expected[f"{name}.{field} size"] = descriptor.size
            lines.append(f'printf("{name}.{field} at %zu\\n", offsetof({name}, {field}));')
            lines.append(f'printf("{name}.{field} size %zu\\n", sizeof((({name}*)0)->{field}));')
    source = tmp_path / "layout.c"
    source.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"xla/ffi/api/c_api.h\"\n"
                      "int main(void) {\n" + "\n".join(lines) + "\nreturn 0; }\n")
    binary = tmp_path / "layout"
    subprocess.run([compiler, "-I", jax.ffi.include_dir(), str(source), "-o", str(binary)],
                   check=True)
    printed = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    seen = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in printed.splitlines()}
    assert seen == expected


def test_jax_experimental_rnn_weights_are_our_params():
    """jax.experimental.rnn.lstm's weights are cuDNN's weight space, so our params as they are."""
    from jax.experimental import rnn as jax_rnn
    I, H, L = 3, 5, 2
    for bidirectional in (False, True):
        direction = "bidirectional" if bidirectional else "unidirectional"
        size = dict(num_layers=L, num_units=H, input_size=I, direction=direction)
        params = np.arange(pycudnnrnn.params_size(**size), dtype=np.float32)
        assert params.size == jax_rnn.get_num_params_in_lstm(I, H, L, bidirectional)
        weights, biases = pycudnnrnn.params_to_canonical(params, **size)
        W_ih, W_hh, b_ih, b_hh = jax_rnn.unpack_lstm_weights(params, I, H, L, bidirectional)
        for k in range(L * (2 if bidirectional else 1)):
            gates = slice(8 * k, 8 * k + 4), slice(8 * k + 4, 8 * k + 8)
            for ours, theirs in ((weights, (W_ih, W_hh)), (biases, (b_ih, b_hh))):
                for part, table in zip(gates, theirs):
                    np.testing.assert_array_equal(np.concatenate(ours[part]), table[k])


# --------------------------------------------------------------------------- bfloat16

def _bfloat16_forward_or_skip(**options):
    """A bfloat16 case and its NumPy-backend forward; skips where the backend has none."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    case = make_case(dtype=ml_dtypes.bfloat16, **options)
    try:
        return case, case.forward()
    except TypeError as exc:  # a NumPy backend without bfloat16
        pytest.skip(f"this pycudnnrnn has no bfloat16: {exc}")


def test_bfloat16_jit_equals_numpy_backend(lowering):
    case, expected = _bfloat16_forward_or_skip(rnn_mode="gru", direction="bidirectional",
                                               lengths="zero")
    ours = jax.jit(_jax_rnn(case))(*_args(case))
    assert ours[0].dtype == jnp.bfloat16
    _assert_same(ours, expected[:3], lowering)


# --------------------------------------------------------------------------- GPU

def _cuda_device():
    try:
        return jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("JAX has no CUDA device")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["lstm-bi-2layer-zero-lengths", "gru-bi-ragged",
                                  "lstm-projection-bi", "rnn_relu-batch-major"])
def test_gpu_jit_and_grad_equal_numpy_backend(name):
    device = _cuda_device()
    case = make_case(dtype=np.float64, **CONFIGS[name])
    as_f32 = lambda a: None if a is None else jax.device_put(a.astype(np.float32), device)  # noqa
    args = [as_f32(a) for a in _args(case)[:4]] + [_lengths(case)]
    fwd = case.forward()
    ours = jax.jit(_jax_rnn(case))(*args)
    for a, b in zip(ours, fwd[:3]):
        assert list(a.devices())[0].platform == "gpu"
        np.testing.assert_allclose(np.asarray(a), b, rtol=2e-4, atol=2e-4)
    lstm = case.attrs["rnn_mode"] == "lstm"
    dy, dh, dc = _loss_weights(case, fwd[:3])

    def loss(x, h, c, p):
        y, hy, cy = _jax_rnn(case)(x, h, c, p, args[4])
        return jnp.sum(y * dy) + jnp.sum(hy * dh) + (jnp.sum(cy * dc) if lstm else 0.0)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 3)))(args[0], args[1], args[2], args[3])
    expected = case.backprop(fwd, dy.astype(np.float64), dh.astype(np.float64),
                             dc.astype(np.float64) if lstm else np.zeros((0,)))
    for ours_g, theirs in zip(grads, (expected[0], expected[1], expected[3])):
        np.testing.assert_allclose(np.asarray(ours_g), theirs, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_gpu_equals_jax_experimental_rnn_lstm_on_shared_weights():
    from jax.experimental import rnn as jax_rnn
    device = _cuda_device()
    B, T, I, H, L = 4, 7, 5, 8, 2
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.device_put(jax.random.normal(keys[0], (B, T, I)), device)
    h0 = jax.device_put(jax.random.normal(keys[1], (2 * L, B, H)), device)
    c0 = jax.device_put(jax.random.normal(keys[2], (2 * L, B, H)), device)
    weights = jax_rnn.init_lstm_weight(keys[3], I, H, L, True)
    lengths = jnp.array([7, 3, 5, 1], jnp.int32)
    with jax.default_matmul_precision("highest"):  # no TF32 in JAX's LSTM either
        theirs = jax.jit(lambda *a: jax_rnn.lstm(*a, I, H, L, 0.0, True))(
            x, h0, c0, weights, lengths)
    ours = jax.jit(lambda x, h, c, w, n: rnn_jax.rnn(
        x, jnp.swapaxes(h, 0, 1), jnp.swapaxes(c, 0, 1), w, n, direction="bidirectional",
        time_major=False))(x, h0, c0, weights, lengths)
    valid = (np.arange(T)[None, :] < np.asarray(lengths)[:, None])[..., None]  # [B, T, 1]
    np.testing.assert_allclose(np.asarray(ours[0]) * valid, np.asarray(theirs[0]) * valid,
                               rtol=2e-4, atol=2e-4)  # padding: ours 0, theirs cuDNN's
    np.testing.assert_allclose(np.asarray(ours[1]).swapaxes(0, 1), np.asarray(theirs[1]),
                               rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(np.asarray(ours[2]).swapaxes(0, 1), np.asarray(theirs[2]),
                               rtol=2e-4, atol=2e-4)


@pytest.mark.gpu
def test_gpu_bfloat16_runs_and_is_close_to_float32():
    device = _cuda_device()
    _bfloat16_forward_or_skip()
    case = make_case(rnn_mode="lstm", direction="bidirectional", lengths="zero",
                     dtype=np.float32)
    args32 = [None if a is None else jax.device_put(a, device) for a in _args(case)[:4]]
    args16 = [None if a is None else a.astype(jnp.bfloat16) for a in args32]
    f = jax.jit(_jax_rnn(case))
    ours16 = f(*args16, _lengths(case))
    ours32 = f(*[None if a is None else a.astype(jnp.float32) for a in args16], _lengths(case))
    assert ours16[0].dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(ours16[0], np.float32), np.asarray(ours32[0]),
                               rtol=2e-2, atol=2e-2)


def test_docs_examples_run():
    """The Python examples of docs/jax.md run, in order, as shown."""
    pytest.importorskip("optax")
    import re
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "docs", "jax.md")
    blocks = re.findall(r"```python\n(.*?)```", open(path, encoding="utf-8").read(), flags=re.S)
    assert len(blocks) >= 5
    namespace = {}
    for block in blocks:
        exec(compile(block, path, "exec"), namespace)
    assert namespace["ys"].shape == (3, 10, 4, 32)
    assert namespace["y"].shape == (4, 10, 32)


# --------------------------------------------------------------------------- handlers without XLA

@pytest.fixture
def stand_in_gpu(monkeypatch):
    """fake_cuda's stand-in GPU, plus the CuPy pieces the CUDA handlers use (views of raw
    pointers, XLA's stream made current); yields the streams cuDNN's handle was set to."""
    import fake_cuda
    from pycudnnrnn.core import gpu
    from pycudnnrnn import plan as plans
    fake_api = fake_cuda.install(monkeypatch)
    fake_cupy, streams = gpu.cupy(), []

    def memory_pointer(memory, offset):
        assert offset == 0
        return memory

    # (the stand-in's own Stream.from_external makes XLA's stream current, with its own queue)
    fake_cupy.cuda.UnownedMemory = lambda ptr, size, owner, device: \
        (ctypes.c_char * size).from_address(ptr)
    fake_cupy.cuda.MemoryPointer = memory_pointer
    set_stream = fake_api._cudnnSetStream
    fake_api._cudnnSetStream = lambda handle, stream: (streams.append(stream),
                                                       set_stream(handle, stream))
    yield streams
    plans.clear_caches()  # no stand-in plan may outlive the stand-in (a real GPU may follow)


def _op(case, **overrides):
    return Attributes(**{"seed": 0, "seed2": 0, "is_training": True, **case.attrs,
                          **overrides})


def _forward_frame(case, op, sizes, lengths=None):
    """A forward call frame over `case`'s arrays; reserve and workspace of `sizes` bytes."""
    from fake_xla import FakeCallFrame
    lengths = _lengths(case) if lengths is None else lengths
    operands = [a for a in (case.input, case.input_h, case.input_c, case.params, lengths)
                if a is not None]
    expected = case.forward()
    results = [np.full(e.shape, np.nan, e.dtype) for e in expected[:3] if e.size]
    results += [np.zeros(n, np.uint8) for n in sizes]
    return FakeCallFrame(operands, results, rnn_jax._ffi_attributes(op, lengths is not None)), expected, results


def _backprop_frame(case, op, sizes, expected, outputs, reserve):
    """A backprop call frame for the forward that gave `outputs` and `reserve`, with a
    workspace of ``sizes[1]`` bytes; its gradient buffers and the NumPy backend's."""
    from fake_xla import FakeCallFrame
    lstm = op.lstm
    dy, dh, dc = _loss_weights(case, expected[:3])
    operands = [a for a in (case.input, case.input_h, case.input_c, case.params,
                            _lengths(case)) if a is not None]
    operands += outputs + [dy, dh] + ([dc] if lstm else []) + [reserve]
    grads = [np.full(a.shape, np.nan, a.dtype) for a in (case.input, case.input_h,
                                                           case.input_c, case.params)
             if a is not None]
    frame = FakeCallFrame(operands, grads + [np.zeros(sizes[1], np.uint8)],
                          rnn_jax._ffi_attributes(op, case.sequence_lengths is not None))
    reference = case.backprop(expected, dy, dh, dc if lstm else np.zeros((0,), np.float32))
    return frame, grads, [r for r in reference if r.size]


@pytest.mark.parametrize("name, lengths", [("lstm-bi-2layer-zero-lengths", "zero"),
                                           ("gru-skip-input-batch-major", None),
                                           ("gru-bi-ragged", "ragged"),
                                           ("lstm-projection-bi", None)])
def test_cuda_handlers_on_the_stand_in_gpu(stand_in_gpu, name, lengths):
    import fake_cuda
    from fake_xla import FakeCallFrame
    from pycudnnrnn.jax import targets as ffi_targets
    case = _case(name, lengths=lengths)
    op = _op(case)
    problem = rnn_jax._problem(op, case.input, case.input_h, case.input_c, case.params)
    sizes = ffi_targets.buffer_sizes(problem, cuda=True)
    stand_in_gpu.clear()  # buffer_sizes ran on the default stream, as at trace time
    frame, expected, results = _forward_frame(case, op, sizes)
    assert frame.call(xla_ffi.make_handler(ffi_targets.cuda_forward)) is None, frame.errors
    outputs, reserve = results[:-2], results[-2]
    for ours, want in zip(outputs, [e for e in expected[:3] if e.size]):
        assert_ulp_close(ours, want)  # cuDNN's batch leaves zero-length rows out
    asked = frame.asked  # then temporaries, if any (see the test below)
    assert asked[:2] == ["XLA_FFI_DeviceOrdinal_Get", "XLA_FFI_Stream_Get"]
    assert set(asked[2:]) <= {"XLA_FFI_DeviceMemory_Allocate", "XLA_FFI_DeviceMemory_Free"}
    assert stand_in_gpu and set(stand_in_gpu) == {frame.stream}  # cuDNN ran on XLA's stream

    backward, grads, reference = _backprop_frame(case, op, sizes, expected, outputs, reserve)
    fake_cuda.reset_counts()
    assert backward.call(xla_ffi.make_handler(ffi_targets.cuda_backprop)) is None, \
        backward.errors
    # The reserve space is our forward's by construction: no header comes back to the
    # host (only traced lengths do), so a training step does not sync XLA's stream.
    reads = 1 if case.sequence_lengths else 0
    assert fake_cuda.COUNTS["device_to_host"] == reads and fake_cuda.COUNTS["sync"] == reads
    for ours, theirs in zip(grads, reference):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)

    # A second forward finds its plan cached: no copy between host and device and no sync
    # (but for the lengths: traced, they come to the host on every call); and, time-major
    # and without lengths, XLA's buffers are written in place with no allocation (the
    # backend makes temporaries, from XLA, to zero ragged padding, to leave rows of
    # length 0 out of cuDNN and to make batch-major states time-major).
    fake_cuda.reset_counts()
    frame, _, results = _forward_frame(case, op, sizes)
    assert frame.call(xla_ffi.make_handler(ffi_targets.cuda_forward)) is None, frame.errors
    _assert_same(results[:-2], outputs)
    traffic = {k: fake_cuda.COUNTS[k] for k in ("host_to_device", "device_to_host", "sync")}
    reads = 1 if case.sequence_lengths else 0
    assert traffic == {"host_to_device": 0, "device_to_host": reads, "sync": reads}
    if case.attrs["time_major"] and case.sequence_lengths is None:
        assert fake_cuda.COUNTS["device_alloc"] == 0 and not frame.allocations


@pytest.mark.parametrize("name, lengths", [("lstm-bi-2layer-zero-lengths", "zero"),
                                           ("rnn_relu-batch-major", "ragged"),
                                           ("gru-skip-input-batch-major", None),
                                           ("lstm-projection-bi", None)])
@pytest.mark.parametrize("xla_workspace", ["sized", "too small"])
def test_cuda_handler_temporaries_come_from_xla(stand_in_gpu, name, lengths, xla_workspace):
    """Every temporary of a CUDA call (rows of length 0 left out, ragged padding zeroed,
    batch-major states, a workspace where XLA's is too small, backprop's copy of the
    reserve space) comes from XLA's allocator, all of it freed by the end of the call:
    none from CuPy's pool, out of sight of an XLA that preallocates most of the GPU."""
    import fake_cuda
    from pycudnnrnn.jax import targets as ffi_targets
    case = _case(name, lengths=lengths)
    op = _op(case)
    sizes = ffi_targets.buffer_sizes(rnn_jax._problem(op, case.input, case.input_h, case.input_c,
                                                case.params), cuda=True)
    if xla_workspace == "too small":
        sizes = (sizes[0], 1)
    forward = xla_ffi.make_handler(ffi_targets.cuda_forward)
    frame, expected, results = _forward_frame(case, op, sizes)
    assert frame.call(forward) is None, frame.errors  # builds the plan (CuPy's pool: kept)

    fake_cuda.reset_counts()
    frame, _, results = _forward_frame(case, op, sizes)
    assert frame.call(forward) is None, frame.errors
    outputs, reserve = results[:-2], results[-2]
    for ours, want in zip(outputs, [e for e in expected[:3] if e.size]):
        assert_ulp_close(ours, want)
    backward, grads, reference = _backprop_frame(case, op, sizes, expected, outputs, reserve)
    assert backward.call(xla_ffi.make_handler(ffi_targets.cuda_backprop)) is None, \
        backward.errors
    for ours, theirs in zip(grads, reference):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)

    assert fake_cuda.COUNTS["pool_alloc"] == 0
    assert fake_cuda.COUNTS["xla_alloc"] == len(frame.allocations) + len(backward.allocations)
    for call in (frame, backward):  # every allocation freed once, by the end of its call
        assert sorted(call.frees) == sorted(call.allocations) and not call.live
    # time-major, all rows full and XLA's workspace large enough: nothing to allocate
    needs = xla_workspace == "too small" or not case.attrs["time_major"] or bool(lengths)
    assert bool(frame.allocations) == bool(backward.allocations) == needs


@pytest.mark.parametrize("name, lengths", [("gru-bi-ragged", "ragged"),
                                           ("gru-skip-input-batch-major", None),
                                           ("lstm-bi-2layer-zero-lengths", "zero")])
def test_cuda_checked_training_forward_uses_xlas_forward_sized_workspace(
        stand_in_gpu, monkeypatch, name, lengths):
    """A training forward on the checked path (ragged, rows of length 0, batch-major), with
    the workspace traced for the forward alone (``buffer_sizes(..., forward=True)``, what
    the lowering asks XLA for): cuDNN's workspace is XLA's, no second one from XLA's
    allocator (review 2026-12-07, finding 4: it compared with backprop's larger size)."""
    from pycudnnrnn import plan as plans
    from pycudnnrnn.jax import targets as ffi_targets
    case = _case(name, lengths=lengths)
    op = _op(case)
    sizes = ffi_targets.buffer_sizes(rnn_jax._problem(op, case.input, case.input_h, case.input_c,
                                                case.params), cuda=True, forward=True)
    used, for_call = [], plans.for_call
    monkeypatch.setattr(plans, "for_call", lambda *a, **k: used.append(for_call(*a, **k)) or used[-1])
    forward = xla_ffi.make_handler(ffi_targets.cuda_forward)
    for _ in range(2):  # the first builds the plan; the second finds it cached
        frame, expected, results = _forward_frame(case, op, sizes)
        assert frame.call(forward) is None, frame.errors
    for ours, want in zip(results[:-2], [e for e in expected[:3] if e.size]):
        assert_ulp_close(ours, want)
    plan = used[-1]
    assert not plan.runs_in_place and 0 < plan.forward_workspace_nbytes <= sizes[1]
    # What _Device._allocate asks of XLA for cuDNN's workspace: none of that size or more.
    padding = ffi_targets._ALIGNMENT - xla_ffi.Scratch.MAX_ALIGNMENT
    assert frame.allocations  # the checked path's temporaries (padded copies, states)
    assert all(size < plan.forward_workspace_nbytes + padding
               for _, size in frame.allocations), frame.allocations


def test_cuda_handlers_under_cupy_14_raise_no_deprecation_warning(stand_in_gpu):
    """CuPy 14 (the stand-in's) deprecates ``ExternalStream`` and warns at each
    construction (review 2026-12-07, finding 10): XLA calls warn nothing, and CuPy's view
    of XLA's stream is made once for all of them."""
    import warnings
    from pycudnnrnn.core import gpu
    from pycudnnrnn.jax import targets as ffi_targets
    case = _case("gru-bi-ragged", lengths="ragged")
    op = _op(case)
    sizes = ffi_targets.buffer_sizes(rnn_jax._problem(op, case.input, case.input_h, case.input_c,
                                                case.params), cuda=True, forward=True)
    forward = xla_ffi.make_handler(ffi_targets.cuda_forward)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for _ in range(3):
            frame, expected, results = _forward_frame(case, op, sizes)
            assert frame.call(forward) is None, frame.errors
    assert gpu.cupy().external_streams == [(frame.stream, 0)]
    for ours, want in zip(results[:-2], [e for e in expected[:3] if e.size]):
        assert_ulp_close(ours, want)


@pytest.mark.parametrize("name", ["lstm-projection-bi", "gru-bi-ragged", "rnn_tanh-2layer"])
def test_cuda_handlers_on_a_plan_that_runs_in_place_take_xlas_addresses(
        stand_in_gpu, monkeypatch, name):
    """Time-major with every row full (a plan that runs in place): forward and backprop
    run on XLA's buffers' addresses, no CuPy view of any (each costs microseconds of a
    tiny call's host time). Results as the NumPy backend's in NaN-filled buffers; the
    reserve's header written on XLA's stream; backprop trusts it (no read-back, no sync)."""
    import fake_cuda
    from pycudnnrnn.jax import targets as ffi_targets
    case = _case(name, lengths=None)
    op = _op(case)
    sizes = ffi_targets.buffer_sizes(rnn_jax._problem(op, case.input, case.input_h, case.input_c,
                                                case.params), cuda=True)
    views, runs = [], []
    array, at = ffi_targets._Device.array, ffi_targets._at_addresses
    monkeypatch.setattr(ffi_targets._Device, "array",
                        lambda self, buffer: views.append(buffer) or array(self, buffer))
    monkeypatch.setattr(ffi_targets, "_at_addresses",
                        lambda plan, *a: runs.append((plan, at(plan, *a))) or runs[-1][1])
    frame, expected, results = _forward_frame(case, op, sizes)
    assert frame.call(xla_ffi.make_handler(ffi_targets.cuda_forward)) is None, frame.errors
    [(plan, ran)] = runs
    assert ran and views == [] and not frame.allocations
    outputs, reserve = results[:-2], results[-2]
    for ours, want in zip(outputs, [e for e in expected[:3] if e.size]):
        assert_ulp_close(ours, want)
    assert bytes(reserve[:32]) == plan._executor.head

    backward, grads, reference = _backprop_frame(case, op, sizes, expected, outputs, reserve)
    fake_cuda.reset_counts()
    assert backward.call(xla_ffi.make_handler(ffi_targets.cuda_backprop)) is None, \
        backward.errors
    assert runs[1] == (plan, True) and views == [] and not backward.allocations
    assert fake_cuda.COUNTS["device_to_host"] == fake_cuda.COUNTS["sync"] == 0
    for ours, theirs in zip(grads, reference):
        assert_ulp_close(ours, theirs)


def test_what_the_cuda_handlers_cannot_take_on_trust_goes_through_the_checks(stand_in_gpu):
    """A plan that runs in place, with a reserve space XLA made too small or a result of
    another shape (our lowering's bug): the checked run, and its error."""
    from fake_xla import FakeCallFrame
    from pycudnnrnn.jax import targets as ffi_targets
    case = _case("lstm-projection-bi", lengths=None)
    op = _op(case)
    sizes = ffi_targets.buffer_sizes(rnn_jax._problem(op, case.input, case.input_h, case.input_c,
                                                case.params), cuda=True)
    handler = xla_ffi.make_handler(ffi_targets.cuda_forward)
    frame, _, _ = _forward_frame(case, op, (sizes[0] - 1, sizes[1]))
    assert frame.call(handler) == frame.ERROR
    assert "reserve_space: this call needs" in frame.errors[0][0]

    frame, _, results = _forward_frame(case, op, sizes)
    results[0] = np.full(results[0].shape[:2] + (results[0].shape[2] + 1,), np.nan,
                         results[0].dtype)
    operands = [case.input, case.input_h, case.input_c, case.params]
    frame = FakeCallFrame(operands, results, rnn_jax._ffi_attributes(op, False))
    assert frame.call(handler) == frame.ERROR
    assert "out output: expected shape" in frame.errors[0][0], frame.errors


def test_xla_out_of_memory_is_an_xla_error_and_nothing_leaks(stand_in_gpu):
    """XLA's allocator refusing a temporary: the call fails with XLA's message (its
    error destroyed), and what the call had taken from XLA goes back."""
    from pycudnnrnn.jax import targets as ffi_targets
    case = _case("rnn_relu-batch-major", lengths="ragged")
    op = _op(case)
    sizes = ffi_targets.buffer_sizes(rnn_jax._problem(op, case.input, case.input_h, case.input_c,
                                                case.params), cuda=True)
    forward = xla_ffi.make_handler(ffi_targets.cuda_forward)
    frame, _, _ = _forward_frame(case, op, sizes)
    assert frame.call(forward) is None, frame.errors
    frame, _, _ = _forward_frame(case, op, sizes)
    frame.fail["XLA_FFI_DeviceMemory_Allocate"] = "RESOURCE_EXHAUSTED: Out of memory"
    assert frame.call(forward) == frame.ERROR
    [(message, code)] = frame.errors
    assert "XLA_FFI_DeviceMemory_Allocate failed: RESOURCE_EXHAUSTED: Out of memory" \
        in message and code == xla_ffi.ErrorCode.INTERNAL
    assert frame.destroyed == list(frame.xla_errors) and not frame.live


def test_trace_time_buffer_sizes_are_remembered(stand_in_gpu, monkeypatch):
    """Each trace asks for them; a plan (with dropout, a cuDNN dropout state) was built
    for every one. Now once per problem, whatever the seed, until clear_caches."""
    import dataclasses
    from pycudnnrnn import plan as plans
    from pycudnnrnn.jax import targets as ffi_targets
    builds = []
    original = plans.RNNPlan.from_problem.__func__
    monkeypatch.setattr(plans.RNNPlan, "from_problem",
                        classmethod(lambda cls, *a: builds.append(a[1]) or original(cls, *a)))
    case = _case("lstm-bi-2layer-zero-lengths")
    op = _op(case, dropout=0.5)
    problem = rnn_jax._problem(op, case.input, case.input_h, case.input_c, case.params)
    sizes = ffi_targets.buffer_sizes(problem, cuda=True)
    assert builds == [0]  # the platform's plan only (issue 17: not the larger of both)
    expected = [original(plans.RNNPlan, problem, d) for d in (None, 0)]
    assert sizes == (expected[1].reserve_nbytes, expected[1].workspace_nbytes) and sizes[1] > 0
    builds.clear()
    reseeded = dataclasses.replace(problem, config=problem.config.with_dropout(0.5, 12345))
    assert ffi_targets.buffer_sizes(reseeded, cuda=True) == sizes
    assert builds == []
    assert ffi_targets.buffer_sizes(problem, cuda=False) == (expected[0].reserve_nbytes, 0)
    assert ffi_targets.buffer_sizes(reseeded, cuda=False) == (expected[0].reserve_nbytes, 0)
    assert builds == [None]
    plans.clear_caches()
    assert ffi_targets.buffer_sizes(problem, cuda=True) == sizes and builds == [None, 0]


@pytest.mark.parametrize("cupy_version", ["14.2.0", "13.6.0"])
def test_cuda_handlers_in_bfloat16_on_the_stand_in_gpu(stand_in_gpu, cupy_version):
    """XLA's bfloat16 buffers through the CUDA handlers; the stand-in playing CuPy 13
    refuses bfloat16, so there they are taken as their bits. Equal bit for bit."""
    import ml_dtypes
    from fake_xla import FakeCallFrame
    from pycudnnrnn.core import gpu
    from pycudnnrnn.jax import targets as ffi_targets
    gpu.cupy().__version__ = cupy_version
    bf16 = np.dtype(ml_dtypes.bfloat16)
    case = _case("lstm-bi-2layer-zero-lengths", dtype=bf16)
    op = _op(case)
    sizes = ffi_targets.buffer_sizes(rnn_jax._problem(op, case.input, case.input_h, case.input_c,
                                                case.params), cuda=True)
    frame, expected, results = _forward_frame(case, op, sizes)
    assert frame.call(xla_ffi.make_handler(ffi_targets.cuda_forward)) is None, frame.errors
    outputs, reserve = results[:-2], results[-2]
    for ours, want in zip(outputs, expected[:3]):
        assert_ulp_close(ours, want)
    seeds = [np.full(o.shape, 0.5, bf16) for o in outputs]
    operands = [case.input, case.input_h, case.input_c, case.params, _lengths(case)]
    grads = [np.full(a.shape, np.nan, bf16) for a in operands[:4]]
    backward = FakeCallFrame(operands + outputs + seeds + [reserve],
                             grads + [np.zeros(sizes[1], np.uint8)], rnn_jax._ffi_attributes(op, True))
    assert backward.call(xla_ffi.make_handler(ffi_targets.cuda_backprop)) is None, \
        backward.errors
    for ours, want in zip(grads, case.backprop(expected, *seeds)):
        assert_ulp_close(ours, want)


def test_handler_errors_and_metadata_without_xla():
    from pycudnnrnn.jax import targets as ffi_targets
    case = _case("lstm-bi-2layer-zero-lengths")
    op = _op(case)
    handler = xla_ffi.make_handler(ffi_targets.cpu_forward)
    problem = rnn_jax._problem(op, case.input, case.input_h, case.input_c, case.params)
    sizes = ffi_targets.buffer_sizes(problem, cuda=False)

    frame, _, results = _forward_frame(case, op, sizes, lengths=np.array([1, 9, 0], np.int32))
    assert frame.call(handler) == frame.ERROR
    [(message, code)] = frame.errors
    assert code == xla_ffi.ErrorCode.INVALID_ARGUMENT
    assert message.startswith("ValueError: sequence_lengths: expected values in [0, 4]")

    def interrupted(call_frame):
        raise KeyboardInterrupt
    frame, _, results = _forward_frame(case, op, sizes)
    assert frame.call(xla_ffi.make_handler(interrupted)) == frame.ERROR  # not "success"
    assert frame.errors[0][0].startswith("KeyboardInterrupt")
    assert frame.errors[0][1] == xla_ffi.ErrorCode.INTERNAL

    too_small = (sizes[0] - 1, sizes[1])  # XLA gave too little room
    frame, _, results = _forward_frame(case, op, too_small)
    assert frame.call(handler) == frame.ERROR
    assert "reserve_space: this call needs" in frame.errors[0][0]

    frame, expected, results = _forward_frame(case, op, sizes)
    metadata = frame.metadata
    frame.frame.extension_start = ctypes.cast(ctypes.pointer(xla_ffi.XLA_FFI_Metadata_Extension(
        xla_ffi.XLA_FFI_Extension_Base(0, xla_ffi.ExtensionType.METADATA, None),
        ctypes.pointer(metadata))), ctypes.POINTER(xla_ffi.XLA_FFI_Extension_Base))
    assert frame.call(handler) is None
    assert (metadata.api_version.major_version, metadata.api_version.minor_version) == \
        xla_ffi.API_VERSION
    assert np.isnan(results[0]).all()  # a metadata query runs nothing


@pytest.mark.parametrize("entry", ["XLA_FFI_Stream_Get", "XLA_FFI_DeviceOrdinal_Get"])
def test_an_error_xla_returns_is_reported_and_destroyed_once(entry):
    """An XLA_FFI_Error* an API call returns is the caller's: its message goes into our
    exception, then it is destroyed (it leaked, and its message was lost)."""
    from fake_xla import FakeCallFrame
    read = {"XLA_FFI_Stream_Get": xla_ffi.stream,
            "XLA_FFI_DeviceOrdinal_Get": xla_ffi.device_ordinal}[entry]
    frame = FakeCallFrame([], [], {}, fail={entry: "no GPU context here"})
    with pytest.raises(RuntimeError, match=f"^{entry} failed: no GPU context here$"):
        read(frame.frame)
    [error] = frame.xla_errors
    assert frame.destroyed == [error] and not frame.misuse
    assert frame.asked[-2:] == ["XLA_FFI_Error_GetMessage", "XLA_FFI_Error_Destroy"]

    # through a handler, it becomes the handler's own error for XLA, with that message
    frame = FakeCallFrame([], [], {}, fail={entry: "no GPU context here"})
    assert frame.call(xla_ffi.make_handler(read)) == frame.ERROR
    assert frame.errors[0][0].startswith(f"RuntimeError: {entry} failed: no GPU context here")
    assert frame.destroyed == list(frame.xla_errors)


def test_scratch_takes_xla_memory_for_one_call_and_gives_it_back_once():
    """xla_ffi.Scratch against fake_xla's allocator, which refuses what XLA's would be
    corrupted by (a double free) or refuses itself (an alignment over 16 bytes)."""
    from fake_xla import FakeCallFrame
    frame = FakeCallFrame([], [], {})
    scratch = xla_ffi.Scratch(frame.frame)
    a, b = scratch.allocate(100, 16), scratch.allocate(7)
    assert a % 16 == 0 and frame.live == {a: 100, b: 7}
    scratch.free_all()
    assert not frame.live and sorted(frame.frees) == sorted(frame.allocations)
    scratch.free_all()  # nothing left
    assert len(frame.frees) == 2 and not frame.misuse
    free = xla_ffi.XLA_FFI_DeviceMemory_Free_Args(
        ctypes.sizeof(xla_ffi.XLA_FFI_DeviceMemory_Free_Args), None, frame.CTX, 100, a)
    with pytest.raises(RuntimeError, match="XLA_FFI_DeviceMemory_Free failed: .*freed already"):
        error = frame.api.XLA_FFI_DeviceMemory_Free(ctypes.byref(free))
        xla_ffi._raise_on_error(frame.api, error, "XLA_FFI_DeviceMemory_Free")
    assert len(frame.misuse) == 1 and "freed already" in frame.misuse[0]
    with pytest.raises(RuntimeError, match="Unsupported alignment: 32"):
        scratch.allocate(8, 32)
    assert frame.destroyed == list(frame.xla_errors)


def test_inference_cannot_be_differentiated_and_says_so(lowering):
    case = _case("gru-bi-ragged")
    f = _jax_rnn(case, is_training=False)
    loss = lambda p: jnp.sum(f(case.input, case.input_h, None, p, _lengths(case))[0])  # noqa
    with pytest.raises(ValueError, match="is_training=False.*cannot be differentiated"):
        jax.grad(loss)(case.params)


def test_vmap_of_vmap_folds_both_axes_into_one_call(custom_call):
    case, xs, hs, lengths = _mapped_problem(N=2)
    f = lambda x, h: _jax_rnn(case, is_training=False)(x, h, None, case.params, None)  # noqa
    xss, hss = np.stack([xs, -xs]), np.stack([hs, hs])
    twice = jax.vmap(jax.vmap(f))
    ours = jax.jit(twice)(xss, hss)
    expected = pycudnnrnn.forward(xss[1, 0], hss[1, 0], None, case.params, **case.attrs,
                                  is_training=False)
    np.testing.assert_allclose(np.asarray(ours[0][1, 0]), expected[0], rtol=1e-6, atol=1e-6)
    assert _one_call_no_loop(twice, xss, hss)


def test_inference_functions_do_not_grow_with_seeds(custom_call):
    """The inference function was cached per dropout and seed, which inference ignores:
    one more per seed, for the life of the process."""
    from pycudnnrnn import jax as rnn_jax
    case = _case("lstm-bi-2layer-zero-lengths")
    rnn_jax._inference.cache_clear()
    outputs = [rnn_jax.rnn(case.input, case.input_h, case.input_c, case.params,
                           case.sequence_lengths, **{**case.attrs, "dropout": 0.5},
                           seed=seed, is_training=False)[0] for seed in range(5)]
    assert rnn_jax._inference.cache_info().currsize == 1
    for output in outputs[1:]:
        np.testing.assert_array_equal(np.asarray(output), np.asarray(outputs[0]))


def test_benchmark_rounds_are_back_to_back_calls_timed_per_call(monkeypatch):
    bench = benchmark_script("jax_bench")
    clock = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])

    def program(x):  # a call of 2 ms on the fake clock
        clock[0] += 0.002
        return x

    calls = bench.calls_per_round(program, (jnp.ones(2),), 0.05)
    assert calls == 25
    start = clock[0]
    assert bench.timed(program, (jnp.ones(2),), calls) == pytest.approx(0.002)
    assert clock[0] - start == pytest.approx(0.05)
    assert bench.calls_per_round(program, (jnp.ones(2),), 0.0001) == 1  # never none
