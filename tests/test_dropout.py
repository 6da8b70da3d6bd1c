"""Dropout between layers: when it acts, reproducibility, and its gradient."""

import numpy as np
import pytest

import pycudnnrnn
from conftest import make_case


def _outputs_equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a[:3], b[:3]))


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_no_effect_in_inference_or_with_one_layer(mode):
    multi = make_case(mode, "bidirectional", num_layers=2, lengths="zero", dropout=0.5)
    plain = multi.forward(dropout=0.0)
    assert _outputs_equal(multi.forward(is_training=False), plain)
    assert not _outputs_equal(multi.forward(), plain), "dropout must act in training"
    single = make_case(mode, num_layers=1, dropout=0.5)
    assert _outputs_equal(single.forward(), single.forward(dropout=0.0))


def test_same_seeds_same_result_other_seeds_other_result():
    case = make_case("lstm", num_layers=3, lengths="ragged", dropout=0.3)
    a = case.forward(seed=1, seed2=2)
    assert _outputs_equal(a, case.forward(seed=1, seed2=2))
    assert np.array_equal(a[3], case.forward(seed=1, seed2=2)[3])
    assert not _outputs_equal(a, case.forward(seed=1, seed2=3))
    assert not _outputs_equal(a, case.forward(seed=2, seed2=2))


def test_keeps_about_one_minus_p_scaled_by_its_inverse():
    """With identity-like layer 1 (relu RNN, zero recurrence, positive input), layer 1's
    output is relu(drop(y0)); the zeros and scale reveal the mask."""
    T, B, H, p = 40, 50, 8, 0.25
    case = make_case("rnn_relu", num_layers=2, T=T, B=B, num_units=H, input_size=H,
                     dropout=p)
    weights = [np.eye(H), np.zeros((H, H)), np.eye(H), np.zeros((H, H))]
    biases = [np.zeros(H)] * 4
    case.params = pycudnnrnn.canonical_to_params(weights, biases, **case.layout_attrs)
    case.input = np.abs(case.input) + 1.0
    case.input_h = np.zeros_like(case.input_h)
    y_drop = case.forward()[0]
    y_plain = case.forward(is_training=False)[0]
    kept = y_drop != 0
    assert abs(kept.mean() - (1 - p)) < 0.02
    np.testing.assert_allclose(y_drop[kept], y_plain[kept] / (1 - p), rtol=1e-14)


def test_backprop_uses_the_mask_in_reserve_space():
    """A reserve space from other seeds is refused: the mask is part of the call."""
    case = make_case("gru", num_layers=2, dropout=0.5)
    fwd = case.forward(seed=4)
    other = case.forward(seed=5)
    dy, dh = np.ones_like(fwd[0]), np.ones_like(fwd[1])
    with pytest.raises(ValueError, match="reserve_space: made by a forward call"):
        case.backprop((fwd[0], fwd[1], fwd[2], other[3]), dy, dh, None, seed=4)
    g_a = case.backprop(fwd, dy, dh, None, seed=4)
    g_b = case.backprop(other, dy, dh, None, seed=5)
    assert not np.array_equal(g_a[3], g_b[3])
