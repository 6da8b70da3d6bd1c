"""Second-order derivatives through ``pycudnnrnn.jax.rnn``'s custom calls.

The custom calls (cuDNN's on a GPU, the NumPy backend's here: the same lowering and the
same differentiation rules) give the first order; their tangent rules come from
``pycudnnrnn.jax.scan``. Held against the scan route (JAX's own derivatives of the same
function) and against finite differences of the custom call's first order.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

from conftest import make_case  # noqa: E402
from pycudnnrnn import jax as rnn_jax  # noqa: E402

CONFIGS = {
    "lstm-bi-2layer-ragged": dict(rnn_mode="lstm", direction="bidirectional", num_layers=2,
                                  lengths="zero"),
    "lstm-projection-batch-major": dict(rnn_mode="lstm", num_proj=1, time_major=False,
                                        num_layers=2, lengths="ragged"),
    "gru-skip-input-bi": dict(rnn_mode="gru", input_mode="skip_input",
                              direction="bidirectional"),
    "rnn_tanh-2layer-ragged": dict(rnn_mode="rnn_tanh", num_layers=2, lengths="ragged"),
    "rnn_relu-batch-major": dict(rnn_mode="rnn_relu", time_major=False, lengths="ragged"),
}


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _function(name, **overrides):
    """``(f, (x, params), case)``: a scalar loss of the input and params."""
    case = make_case(**{"T": 3, "B": 3, "input_size": 2, "num_units": 2, **CONFIGS[name],
                        **overrides})
    lengths = None if case.sequence_lengths is None else jnp.asarray(case.sequence_lengths)

    def f(x, params):
        y, hy, cy = rnn_jax.rnn(x, case.input_h, case.input_c, params, lengths, **case.attrs)
        return jnp.sum(jnp.tanh(y) ** 2) + jnp.sum(hy * jnp.cos(hy)) + jnp.sum(cy ** 3)
    return f, (jnp.asarray(case.input), jnp.asarray(case.params)), case


DERIVATIVES = {  # jitted: JAX's eager dispatch of the scan route is slow
    "hessian": lambda f, x, p: jax.jit(jax.hessian(f, argnums=(0, 1)))(x, p),
    "grad(grad)": lambda f, x, p: jax.jit(jax.grad(
        lambda x, p: sum(jnp.sum(g ** 2) for g in jax.grad(f, (0, 1))(x, p)), (0, 1)))(x, p),
    "jvp(grad)": lambda f, x, p: jax.jit(lambda x: jax.jvp(
        lambda x: jax.grad(f, 1)(x, p), (x,), (jnp.cos(x),))[1])(x),
    "eager grad(grad)": lambda f, x, p: jax.grad(
        lambda p: jnp.sum(jax.grad(f, 0)(x, p) ** 2))(p),
}


@pytest.mark.parametrize("name,derivative", [
    *((name, "grad(grad)") for name in CONFIGS),
    ("lstm-projection-batch-major", "hessian"), ("gru-skip-input-bi", "hessian"),
    ("lstm-bi-2layer-ragged", "jvp(grad)"), ("rnn_relu-batch-major", "jvp(grad)"),
    ("rnn_tanh-2layer-ragged", "eager grad(grad)")])
def test_the_custom_call_differentiates_twice_as_the_scan_route(name, derivative,
                                                                monkeypatch):
    f, (x, p), _ = _function(name)
    want = DERIVATIVES[derivative](f, x, p)
    monkeypatch.setattr(rnn_jax.scan, "applies", lambda problem: False)  # the custom call
    got = DERIVATIVES[derivative](f, x, p)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["lstm-bi-2layer-ragged", "rnn_relu-batch-major"])
def test_second_order_equals_finite_differences_of_the_custom_calls(name, monkeypatch):
    monkeypatch.setattr(rnn_jax.scan, "applies", lambda problem: False)
    f, args, _ = _function(name)
    check_grads(f, args, order=2, modes=("rev",), eps=1e-5, atol=1e-5, rtol=1e-5)


def test_first_order_never_runs_the_tangent_rules(monkeypatch):
    monkeypatch.setattr(rnn_jax.scan, "applies", lambda problem: False)
    traced = []
    real = rnn_jax.scan.rnn
    monkeypatch.setattr(rnn_jax.scan, "rnn", lambda *a: traced.append(1) or real(*a))
    f, (x, p), _ = _function("lstm-bi-2layer-ragged")
    jax.jit(jax.grad(f, (0, 1)))(x, p)
    assert traced == []
    jax.grad(lambda p: jnp.sum(jax.grad(f, 0)(x, p) ** 2))(p)
    assert traced  # the second order does


def test_dropout_between_layers_refuses_a_second_derivative_clearly():
    f, (x, p), _ = _function("lstm-bi-2layer-ragged", dropout=0.3)
    jax.grad(f, 1)(x, p)  # the first order works
    with pytest.raises(NotImplementedError, match="through dropout between layers"):
        jax.grad(lambda p: jnp.sum(jax.grad(f, 0)(x, p) ** 2))(p)


def test_a_flax_gradient_penalty_trains_on_the_custom_call(monkeypatch):
    """WGAN-GP's penalty on pycudnnrnn.flax.LSTM: on the custom call, its gradients equal
    the scan route's (JAX's own derivatives; ``test_flax`` holds that route's first order
    against Flax's cells), and a few steps of descent on it lower the loss."""
    nnx = pytest.importorskip("flax.nnx")
    from pycudnnrnn import flax as rnn_flax
    ours = rnn_flax.LSTM(2, 3, num_layers=2, bidirectional=True, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(2), (3, 4, 2), jnp.float32)

    def penalized(state, x, graphdef):
        module = nnx.merge(graphdef, state)  # plain JAX transforms around a pure function
        scores, pullback = jax.vjp(lambda x: module(x).sum((1, 2)), x)
        (g,) = pullback(jnp.ones_like(scores))
        return scores.mean() + ((jnp.sqrt((g ** 2).sum((1, 2))) - 1) ** 2).mean()

    def penalty_grad(step):
        graphdef, state = nnx.split(ours)
        return step(state, x, graphdef)

    # a jitted function each: its cache would keep the route it was traced with
    want = penalty_grad(jax.jit(jax.value_and_grad(penalized), static_argnums=2))
    monkeypatch.setattr(rnn_jax.scan, "applies", lambda problem: False)
    step = jax.jit(jax.value_and_grad(penalized), static_argnums=2)
    got = penalty_grad(step)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    losses = []
    for _ in range(4):
        value, grads = penalty_grad(step)
        losses.append(float(value))
        nnx.update(ours, jax.tree.map(lambda p, g: p - 0.05 * g, nnx.state(ours), grads))
    assert losses[-1] < losses[0], losses


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["lstm-bi-2layer-ragged", "gru-skip-input-bi"])
def test_gpu_cuda_lowering_differentiates_twice_as_the_cpu(name):
    """cuDNN's custom calls with scan's tangent rules, against the CPU's scan route."""
    try:
        gpu = jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("JAX sees no CUDA device")
    f, (x, p), _ = _function(name)
    for derivative in ("hessian", "grad(grad)", "jvp(grad)"):
        want = DERIVATIVES[derivative](f, x, p)
        with jax.default_device(gpu):
            got = DERIVATIVES[derivative](f, jax.device_put(x, gpu), jax.device_put(p, gpu))
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-9, atol=1e-11)


def test_a_flax_penalty_through_dropout_between_layers(monkeypatch):
    """pycudnnrnn.flax draws its own masks (the op runs without dropout): a second
    derivative through them works, and the custom call's equals the scan route's for the
    same RNG streams."""
    nnx = pytest.importorskip("flax.nnx")
    from pycudnnrnn import flax as rnn_flax
    x = jax.random.normal(jax.random.PRNGKey(2), (3, 4, 2), jnp.float32)

    def penalized(model, x):  # NNX's own transforms: the module's RNG count advances
        g = nnx.grad(lambda model, x: model(x).sum(), argnums=1)(model, x)
        return ((jnp.sqrt((g ** 2).sum((1, 2))) - 1) ** 2).mean()

    found = []
    for route in ("scan", "custom call"):
        if route == "custom call":
            monkeypatch.setattr(rnn_jax.scan, "applies", lambda problem: False)
        model = rnn_flax.LSTM(2, 3, num_layers=2, dropout_rate=0.5,
                              rngs=nnx.Rngs(0, dropout=1))
        model.train()
        found.append(nnx.value_and_grad(penalized)(model, x))
    (value, grads), (want_value, want_grads) = found[1], found[0]
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    for g, w in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want_grads)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
