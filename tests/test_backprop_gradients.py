"""backprop(..., gradients=...): only the gradients asked for, on both backends."""

import numpy as np
import pytest

import pycudnnrnn
from conftest import make_case
from fake_cuda import _device
from pycudnnrnn.cpu import rnn as cpu_rnn

CASES = [dict(rnn_mode="lstm", num_proj=2), dict(rnn_mode="gru"), dict(rnn_mode="rnn_tanh")]


def _case(spec):
    return make_case(direction="bidirectional", num_layers=2, lengths="zero", time_major=False,
                     dropout=0.3, seed=2, **spec)


def _output_grads(fwd, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(a.shape) for a in fwd[:3]]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s["rnn_mode"])
def test_data_or_weights_only_equal_their_part_of_all(spec):
    case = _case(spec)
    fwd = case.forward()
    grads = _output_grads(fwd)
    every = case.backprop(fwd, *grads)
    data = case.backprop(fwd, *grads, gradients="data")
    weights = case.backprop(fwd, *grads, gradients="weights")
    for ours, full in zip(data[:3], every[:3]):
        np.testing.assert_array_equal(ours, full)
    assert data[3] is None
    assert weights[:3] == (None, None, None)
    np.testing.assert_array_equal(weights[3], every[3])


def test_data_only_skips_the_weight_products(monkeypatch):
    def refuse(*args):
        raise AssertionError("weight gradients formed although only data was asked for")

    monkeypatch.setattr(cpu_rnn, "_store_weight_grads", refuse)
    case = _case(CASES[0])
    fwd = case.forward()
    dx = case.backprop(fwd, *_output_grads(fwd), gradients="data")[0]
    assert dx.shape == case.input.shape
    with pytest.raises(AssertionError, match="weight gradients formed"):
        case.backprop(fwd, *_output_grads(fwd))


def test_gradients_names_the_choices():
    case = _case(CASES[1])
    fwd = case.forward()
    with pytest.raises(ValueError, match="gradients: expected one of 'all', 'data', 'weights', "
                                         "got 'input'"):
        case.backprop(fwd, *_output_grads(fwd), gradients="input")


@pytest.mark.parametrize("gradients", ["all", "data", "weights"])
def test_cudnn_skips_backward_weights_for_data_only(fake_gpu, gradients):
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="zero", seed=3)
    cpu = case.forward()
    grads = _output_grads(cpu)
    expected = case.backprop(cpu, *grads, gradients=gradients)
    args = [None if a is None else _device(a) for a in (case.input, case.input_h, case.input_c,
                                                        case.params)]
    gpu = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    fake_gpu.calls.clear()
    ours = pycudnnrnn.backprop(*args, case.sequence_lengths, *gpu[:3], *map(_device, grads),
                               gpu[3], **{k: v for k, v in case.attrs.items()},
                               gradients=gradients)
    assert ("cudnnRNNBackwardWeights_v8" in fake_gpu.calls) == (gradients != "data")
    assert "cudnnRNNBackwardData_v8" in fake_gpu.calls
    for a, b in zip(ours, expected):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-12, atol=1e-12)
