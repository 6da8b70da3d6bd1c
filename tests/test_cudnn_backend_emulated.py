"""The cuDNN backend's own code, run in CI on a stand-in GPU (see fake_cuda); tests
taking the ``device`` fixture also run on a real GPU when there is one.

The agreement grid against the NumPy backend (every mode, direction, lengths kind, layout
and dtype, NaN padding, all-empty batches, caller arrays left unchanged) lives in
``test_gpu.py``, over the same real-or-stand-in fixture. Here: what only the stand-in can
see or that needs no grid — the cuDNN calls made (descriptor and dropout-state caching,
layout queries), a layout disagreement reported, reserve-space checks, device-side
canonical conversion, and the ``check`` command and layout dump on the stand-in.
"""

import numpy as np
import pytest

import pycudnnrnn
from conftest import benchmark_script, make_case
from fake_cuda import _device
from pycudnnrnn.cuda import resources


def _to_device(case):
    return [None if a is None else _device(a) for a in (case.input, case.input_h, case.input_c,
                                                        case.params)]


def test_inference_has_no_reserve_space(device):
    case = make_case("gru", "bidirectional", num_layers=2, lengths="zero")
    args = [None if a is None else device.put(a)
            for a in (case.input, case.input_h, case.input_c, case.params)]
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs, is_training=False)
    assert out[3].size == 0
    np.testing.assert_allclose(device.get(out[0]), case.forward(is_training=False)[0],
                               rtol=1e-10, atol=1e-12)


def test_reserve_space_is_checked(device):
    case = make_case("lstm", num_layers=2)
    args = [device.put(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    y, hy, cy, reserve = pycudnnrnn.forward(*args)
    grads = [device.put(np.ones(a.shape)) for a in (y, hy, cy)]
    with pytest.raises(ValueError, match=r"reserve_space: expected \d+ bytes .* got \d+"):
        pycudnnrnn.backprop(*args, None, y, hy, cy, *grads, reserve[:-8])
    with pytest.raises(ValueError, match="reserve_space: expected the uint8 array made by the cuDNN backend's forward, got a foreign uint8"):
        pycudnnrnn.backprop(*args, None, y, hy, cy, *grads, device.put(np.zeros(reserve.shape, np.uint8)))
    with pytest.raises(ValueError, match="reserve_space: made by a forward call with a different"):
        pycudnnrnn.backprop(*args, [4, 1, 2], y, hy, cy, *grads, reserve)
    with pytest.raises(ValueError, match="got an empty one"):
        pycudnnrnn.backprop(*args, None, y, hy, cy, *grads, device.put(np.zeros(0, np.uint8)))


def test_descriptors_are_cached_and_layout_checked_once(fake_gpu):
    case = make_case("lstm", "bidirectional", num_layers=2, num_proj=2, lengths="ragged")
    args = _to_device(case)
    for _ in range(3):
        pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    layout_queries = fake_gpu.calls.count("cudnnGetRNNWeightParams")
    assert layout_queries == 4 * (2 * 4 + 1) * 1  # L·D pseudo-layers × (2G + projection), once
    assert fake_gpu.calls.count("cudnnRNNForward") == 3
    assert len(resources._rnn_descriptors) == 1


def test_a_layout_disagreement_is_reported(fake_gpu, monkeypatch):
    original = fake_gpu._cudnnGetRNNWeightSpaceSize

    def wrong(handle, desc, size):
        original(handle, desc, size)
        size[0] += 4

    monkeypatch.setattr(fake_gpu, "_cudnnGetRNNWeightSpaceSize", wrong)
    case = make_case("gru")
    with pytest.raises(RuntimeError, match="params layout disagrees with cuDNN.*weight space is"):
        pycudnnrnn.forward(*_to_device(case), **case.attrs)


def test_canonical_conversion_stays_on_the_device(device):
    attrs = dict(rnn_mode="lstm", num_layers=2, num_units=4, input_size=3, num_proj=2)
    params = device.put(np.arange(pycudnnrnn.params_size(**attrs), dtype=np.float32))
    weights, biases = pycudnnrnn.params_to_canonical(params, **attrs)
    assert all(type(a) is type(params) for a in weights + biases)
    back = pycudnnrnn.canonical_to_params(weights, biases, **attrs)
    assert type(back) is type(params)
    np.testing.assert_array_equal(device.get(back), device.get(params))


def test_dropout_states_are_initialised_once_per_seed(fake_gpu):
    case = make_case("lstm", "bidirectional", num_layers=2)
    args = _to_device(case)
    for dropout, seed in [(0.3, 1), (0.3, 1), (0.5, 1), (0.3, 2), (0.0, 1)]:
        pycudnnrnn.forward(*args, **{**case.attrs, "dropout": dropout, "seed": seed})
    calls = fake_gpu.calls
    assert calls.count("cudnnSetDropoutDescriptor") == 3  # seeds 1 and 2, and p = 0 (no states)
    assert calls.count("cudnnRestoreDropoutDescriptor") == 1  # p = 0.5 reuses seed 1's states
    assert calls.count("cudnnDropoutGetStatesSize") == 2
    assert len(resources._rnn_descriptors) + len(resources._dropout_rnn_descriptors) == 4


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_check_command_gpu_path(fake_gpu, dtype):
    """`pycudnnrnn check --backend gpu` compares cuDNN with NumPy; here the stand-in GPU."""
    from pycudnnrnn.tools import selfcheck
    cfg = selfcheck.CheckConfig(backend="gpu", dtype=dtype, time_major=False,
                                lengths=(7, 0, 5, 2))
    rows = selfcheck.run(cfg)
    assert [r.name for r in rows][:2] == ["output cuDNN vs NumPy", "output_h cuDNN vs NumPy"]
    assert all(r.ok for r in rows), rows
    assert "cudnnRNNBackwardWeights_v8" in fake_gpu.calls


def test_gpu_layout_dump_reports_agreement_and_each_disagreement(fake_gpu, monkeypatch):
    """`make gpu-check`'s layout dump: both whole tables per configuration, and a verdict."""
    gpu_layout = benchmark_script("gpu_layout")
    results = gpu_layout.collect()
    assert len(results) == 20 and all(r["agree"] for r in results)
    assert gpu_layout.summary(results) == "layout: 20 of 20 configurations agree with cuDNN"
    lstm = results[0]
    assert lstm["config"]["rnn_mode"] == "lstm" and lstm["cudnn"] == lstm["ours"]
    assert len(lstm["cudnn"]) == 2 * 8 * 2  # 2 pseudo-layers × 8 linLayerIDs × matrix and bias

    original = fake_gpu._cudnnGetRNNWeightParams

    def second_layer_moved(handle, desc, k, size, space, lin, m_desc, m_addr, b_desc, b_addr):
        original(handle, desc, k, size, space, lin, m_desc, m_addr, b_desc, b_addr)
        if k == 1 and lin == 0 and m_addr[0]:  # one matrix elsewhere than layout.py says
            m_addr[0] += 4

    monkeypatch.setattr(fake_gpu, "_cudnnGetRNNWeightParams", second_layer_moved)
    results = gpu_layout.collect()
    # Pseudo-layer 1 has an input matrix except when it is layer 0's reverse with skip input.
    for r in results:
        untouched = r["config"]["direction"] == "bidirectional" and \
            r["config"]["input_mode"] == "skip_input"
        assert r["agree"] == untouched, r["config"]
    first = results[0]
    expected = [row for row in first["ours"] if row[:3] == [1, 0, "weight"]]
    moved = [row for row in first["cudnn"] if row not in first["ours"]]
    assert moved == [[1, 0, "weight", expected[0][3] + 1, expected[0][4]]]
    assert gpu_layout.summary(results).splitlines()[-1] == \
        "layout: 5 of 20 configurations agree with cuDNN"
