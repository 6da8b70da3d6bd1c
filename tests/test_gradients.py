"""backprop is the gradient of forward: checked against central finite differences.

A random linear loss ``L = <wy, output> + <wh, output_h> + <wc, output_c>`` is
differentiated both ways, in float64, over the whole grid of modes and options.
"""

import itertools

import numpy as np
import pytest

from conftest import make_case

EPS = 1e-6


def _loss_weights(fwd, rng):
    y, hy, cy, _ = fwd
    return rng.standard_normal(y.shape), rng.standard_normal(hy.shape), rng.standard_normal(cy.shape)


def _loss(fwd, weights):
    return sum(float(np.sum(a * w)) for a, w in zip(fwd[:3], weights))


def _check_directional(case, rng, directions=2, **overrides):
    """Compare <gradient, v> with the central difference along random v, per argument."""
    fwd = case.forward(**overrides)
    weights = _loss_weights(fwd, rng)
    grads = case.backprop(fwd, *weights, **overrides)
    names = ["input", "input_h", "input_c", "params"]
    for name, grad in zip(names, grads):
        base = getattr(case, name)
        if base is None:
            assert grad.shape == (0,)
            continue
        assert grad.shape == base.shape and grad.dtype == base.dtype, name
        for _ in range(directions):
            v = rng.standard_normal(base.shape)
            plus = _loss(case.forward(**{name: base + EPS * v}, **overrides), weights)
            minus = _loss(case.forward(**{name: base - EPS * v}, **overrides), weights)
            numeric = (plus - minus) / (2 * EPS)
            analytic = float(np.sum(grad * v))
            assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-7), name


MODES = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
GRID = [
    (mode, direction, input_mode, proj, lengths, time_major, layers)
    for mode, direction, input_mode, proj, lengths, time_major, layers in itertools.product(
        MODES, ["unidirectional", "bidirectional"], ["linear_input", "skip_input"], [0, 2],
        ["full", "ragged", "zero"], [True, False], [1, 2, 3])
    if not (proj and mode != "lstm")
]


@pytest.mark.parametrize("mode,direction,input_mode,proj,lengths,time_major,layers", GRID,
                         ids=["-".join(map(str, g)) for g in GRID])
def test_gradients_match_finite_differences(mode, direction, input_mode, proj, lengths,
                                            time_major, layers):
    case = make_case(mode, direction, input_mode, num_proj=proj, num_layers=layers,
                     lengths=lengths, time_major=time_major, seed=len(GRID))
    _check_directional(case, np.random.default_rng(1))


@pytest.mark.parametrize("mode", MODES)
def test_every_params_coordinate(mode):
    """The full params gradient, one coordinate at a time, on a small hard case."""
    case = make_case(mode, "bidirectional", num_layers=2, lengths="zero",
                     num_proj=2 if mode == "lstm" else 0, num_units=3, input_size=2, seed=7)
    fwd = case.forward()
    weights = _loss_weights(fwd, np.random.default_rng(2))
    dparams = case.backprop(fwd, *weights)[3]
    numeric = np.empty_like(case.params)
    for j in range(case.params.size):
        step = np.zeros_like(case.params)
        step[j] = EPS
        numeric[j] = (_loss(case.forward(params=case.params + step), weights)
                      - _loss(case.forward(params=case.params - step), weights)) / (2 * EPS)
    np.testing.assert_allclose(dparams, numeric, rtol=1e-6, atol=1e-8)


def test_gradients_with_dropout_use_the_forward_mask():
    """With the same seeds forward draws the same mask, so finite differences see it too."""
    case = make_case("lstm", "bidirectional", num_layers=3, lengths="zero", dropout=0.4)
    case.attrs.update(seed=3, seed2=11)
    _check_directional(case, np.random.default_rng(3))


def test_gradient_of_padding_is_zero_and_padding_is_ignored():
    case = make_case("gru", "bidirectional", num_layers=2, lengths="ragged")
    fwd = case.forward()
    rng = np.random.default_rng(4)
    weights = _loss_weights(fwd, rng)
    dx = case.backprop(fwd, *weights)[0]
    x = case.input.copy()
    for b, n in enumerate(case.sequence_lengths):
        assert np.all(dx[n:, b] == 0)
        x[n:, b] = np.nan  # padding may hold anything
    fwd_nan = case.forward(input=x)
    np.testing.assert_array_equal(fwd_nan[0], fwd[0])
    np.testing.assert_array_equal(fwd_nan[1], fwd[1])
    # output_backprop past each length is ignored, even when it is garbage
    dy = weights[0].copy()
    for b, n in enumerate(case.sequence_lengths):
        dy[n:, b] = 1e30
    grads = case.backprop(fwd, dy, *weights[1:])
    reference = case.backprop(fwd, *weights)
    for g, r in zip(grads, reference):
        np.testing.assert_array_equal(g, r)
