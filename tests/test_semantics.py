"""What forward computes: the SPEC equations, lengths, directions and batch order."""

import itertools

import numpy as np
import pytest

from conftest import make_case
from reference import reference_forward

MODES = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
CONFIGS = [
    (mode, direction, input_mode, proj, lengths, time_major, layers)
    for mode, direction, input_mode, proj, lengths, time_major, layers in itertools.product(
        MODES, ["unidirectional", "bidirectional"], ["linear_input", "skip_input", "auto_select"],
        [0, 2], ["full", "ragged", "zero"], [True, False], [1, 3])
    if not (proj and mode != "lstm")
]


def _time_major_outputs(case, fwd):
    y, hy, cy, _ = fwd
    return case.time_major_state(y), case.time_major_state(hy), \
        (case.time_major_state(cy) if cy.size else None)


@pytest.mark.parametrize("mode,direction,input_mode,proj,lengths,time_major,layers", CONFIGS,
                         ids=["-".join(map(str, c)) for c in CONFIGS])
def test_forward_matches_the_equations(mode, direction, input_mode, proj, lengths, time_major,
                                       layers):
    case = make_case(mode, direction, input_mode, num_proj=proj, num_layers=layers,
                     lengths=lengths, time_major=time_major, seed=3)
    y, hy, cy = _time_major_outputs(case, case.forward())
    c0 = None if case.input_c is None else case.time_major_state(case.input_c)
    ry, rh, rc = reference_forward(case.time_major_input(), case.time_major_state(case.input_h),
                                   c0, case.params, case.sequence_lengths, rnn_mode=mode,
                                   direction=direction, input_mode=input_mode, num_proj=proj)
    np.testing.assert_allclose(y, ry, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(hy, rh, rtol=1e-12, atol=1e-12)
    if mode == "lstm":
        np.testing.assert_allclose(cy, rc, rtol=1e-12, atol=1e-12)
    else:
        assert cy is None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("direction", ["unidirectional", "bidirectional"])
def test_lengths_outputs_and_final_states(mode, direction):
    lengths = [5, 0, 2, 4, 1]
    case = make_case(mode, direction, num_layers=2, lengths=lengths, T=5, B=5,
                     num_proj=2 if mode == "lstm" else 0)
    y, hy, cy, _ = case.forward()
    P = y.shape[2] // (2 if direction == "bidirectional" else 1)
    top = hy.shape[0] - (2 if direction == "bidirectional" else 1)  # first top pseudo-layer
    for b, n in enumerate(lengths):
        assert np.all(y[n:, b] == 0), "outputs past the length are exactly zero"
        if n == 0:
            np.testing.assert_array_equal(hy[:, b], case.input_h[:, b])
            if mode == "lstm":
                np.testing.assert_array_equal(cy[:, b], case.input_c[:, b])
            continue
        # forward direction: final state is the output at the sequence's own last step
        np.testing.assert_array_equal(hy[top, b], y[n - 1, b, :P])
        if direction == "bidirectional":
            # reverse direction ends at t = 0, having started at t = n - 1
            np.testing.assert_array_equal(hy[top + 1, b], y[0, b, P:])


@pytest.mark.parametrize("mode", MODES)
def test_each_sequence_is_its_own_truncated_run(mode):
    """A ragged batch gives, per sequence, what that sequence alone of its own length gives:
    in particular the reverse direction starts at each sequence's own last step."""
    lengths = [3, 5, 1]
    case = make_case(mode, "bidirectional", num_layers=2, lengths=lengths, T=5, B=3)
    y, hy, cy, _ = case.forward()
    for b, n in enumerate(lengths):
        alone = make_case(mode, "bidirectional", num_layers=2, T=n, B=1)
        alone.params = case.params
        alone.input = case.input[:n, b:b + 1]
        alone.input_h = case.input_h[:, b:b + 1]
        alone.input_c = None if case.input_c is None else case.input_c[:, b:b + 1]
        ya, ha, ca, _ = alone.forward()
        np.testing.assert_allclose(y[:n, b:b + 1], ya, rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(hy[:, b:b + 1], ha, rtol=1e-13, atol=1e-14)
        if mode == "lstm":
            np.testing.assert_allclose(cy[:, b:b + 1], ca, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("time_major", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_independent_of_batch_order(mode, time_major):
    case = make_case(mode, "bidirectional", num_layers=2, lengths=[4, 1, 0, 3, 4], B=5,
                     time_major=time_major)
    fwd = case.forward()
    rng = np.random.default_rng(0)
    dy, dh = rng.standard_normal(fwd[0].shape), rng.standard_normal(fwd[1].shape)
    dc = rng.standard_normal(fwd[2].shape)
    grads = case.backprop(fwd, dy, dh, dc)

    perm = np.array([3, 0, 4, 2, 1])
    axis = 1 if time_major else 0
    take = lambda a: a if a is None or a.size == 0 else np.take(a, perm, axis=axis)
    shuffled = make_case(mode, "bidirectional", num_layers=2, B=5, time_major=time_major)
    shuffled.params = case.params
    shuffled.input, shuffled.input_h, shuffled.input_c = map(take, (case.input, case.input_h,
                                                                    case.input_c))
    shuffled.sequence_lengths = [case.sequence_lengths[i] for i in perm]
    fwd2 = shuffled.forward()
    for a, b in zip(fwd[:3], fwd2[:3]):
        np.testing.assert_allclose(take(a), b, rtol=1e-14, atol=1e-15)
    grads2 = shuffled.backprop(fwd2, take(dy), take(dh), take(dc))
    for a, b in zip(grads[:3], grads2[:3]):
        np.testing.assert_allclose(take(a), b, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(grads[3], grads2[3], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("mode", MODES)
def test_batch_major_is_the_transpose_of_time_major(mode):
    tm = make_case(mode, "bidirectional", num_layers=2, lengths="zero")
    bm = make_case(mode, "bidirectional", num_layers=2, lengths="zero", time_major=False)
    assert np.array_equal(bm.input, tm.input.swapaxes(0, 1))
    assert np.array_equal(bm.input_h, tm.input_h.swapaxes(0, 1))  # states really batch-major
    for a, b in zip(tm.forward()[:3], bm.forward()[:3]):
        np.testing.assert_array_equal(a.swapaxes(0, 1) if a.ndim == 3 else a, b)


def test_zero_length_sequence_passes_state_gradients_through():
    case = make_case("lstm", "bidirectional", num_layers=2, lengths=[4, 0, 2])
    fwd = case.forward()
    rng = np.random.default_rng(5)
    dy, dh, dc = (rng.standard_normal(a.shape) for a in fwd[:3])
    dx, dh0, dc0, dparams = case.backprop(fwd, dy, dh, dc)
    np.testing.assert_array_equal(dh0[:, 1], dh[:, 1])
    np.testing.assert_array_equal(dc0[:, 1], dc[:, 1])
    assert np.all(dx[:, 1] == 0)
    # it adds nothing to params_backprop: its output gradients change nothing there
    dy2, dh2, dc2 = dy.copy(), dh.copy(), dc.copy()
    dy2[:, 1], dh2[:, 1], dc2[:, 1] = 7.0, -3.0, 2.0
    np.testing.assert_array_equal(case.backprop(fwd, dy2, dh2, dc2)[3], dparams)


@pytest.mark.parametrize("time_major", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_zero_length_sequence_adds_exactly_nothing(mode, time_major):
    """NaN in everything a zero-length row (and a ragged row's padding) owns stays there.

    Its initial state, its input padding, its output and state gradients may hold NaN or
    Inf: every other output is bit-identical to a call where they are finite, and the row's
    own results are the pass-through SPEC gives (output 0, output_h = input_h, state
    gradients = output state gradients, input gradient 0).
    """
    lengths = [4, 0, 2]
    case = make_case(mode, "bidirectional", num_layers=2, lengths=lengths, T=4, B=3,
                     time_major=time_major, seed=7)
    lstm = mode == "lstm"
    rng = np.random.default_rng(1)
    fwd = case.forward()
    grads = [rng.standard_normal(a.shape) for a in fwd[:3]]
    clean = case.forward(), case.backprop(case.forward(), *grads)

    # Time-major views of the arrays to poison; row 1 has length 0, row 2 length 2.
    tm = case.time_major_state
    for array in (case.input, grads[0]):
        tm(array)[:, 1] = np.nan
        tm(array)[2:, 2] = np.inf
    tm(case.input_h)[:, 1] = np.nan
    tm(grads[1])[:, 1] = -np.inf
    if lstm:
        tm(case.input_c)[:, 1] = np.inf
        tm(grads[2])[:, 1] = np.nan
    fwd = case.forward()
    dx, dh0, dc0, dparams = case.backprop(fwd, *grads)

    (y, hy, cy, _), (cdx, cdh0, cdc0, cdparams) = clean
    others = [0, 2]
    np.testing.assert_array_equal(dparams, cdparams)
    assert np.all(np.isfinite(dparams))
    np.testing.assert_array_equal(tm(fwd[0])[:, others], tm(y)[:, others])
    np.testing.assert_array_equal(tm(fwd[1])[:, others], tm(hy)[:, others])
    np.testing.assert_array_equal(tm(dx)[:, others], tm(cdx)[:, others])
    np.testing.assert_array_equal(tm(dh0)[:, others], tm(cdh0)[:, others])
    assert np.all(tm(fwd[0])[:, 1] == 0) and np.all(tm(fwd[0])[2:, 2] == 0)
    assert np.all(tm(dx)[:, 1] == 0) and np.all(tm(dx)[2:, 2] == 0)
    np.testing.assert_array_equal(tm(fwd[1])[:, 1], tm(case.input_h)[:, 1])
    np.testing.assert_array_equal(tm(dh0)[:, 1], tm(grads[1])[:, 1])
    if lstm:
        np.testing.assert_array_equal(tm(fwd[2])[:, others], tm(cy)[:, others])
        np.testing.assert_array_equal(tm(dc0)[:, others], tm(cdc0)[:, others])
        np.testing.assert_array_equal(tm(fwd[2])[:, 1], tm(case.input_c)[:, 1])
        np.testing.assert_array_equal(tm(dc0)[:, 1], tm(grads[2])[:, 1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("time_major", [True, False])
def test_inference_matches_training_without_dropout(mode, time_major):
    # Three layers, so inference's two alternating layer outputs are each reused.
    case = make_case(mode, "bidirectional", num_layers=3, lengths="zero", T=5,
                     num_proj=3 if mode == "lstm" else 0, time_major=time_major)
    train = case.forward(is_training=True)
    infer = case.forward(is_training=False)
    for a, b in zip(train[:3], infer[:3]):
        np.testing.assert_array_equal(a, b)
    assert infer[3].shape == (0,) and train[3].size > 0 and train[3].dtype == np.uint8


@pytest.mark.parametrize("mode", MODES)
def test_inference_scratch_does_not_grow_with_depth_or_keep_activations(mode):
    """Inference keeps two layer outputs and one step of gate activations."""
    from pycudnnrnn.cpu import rnn as cpu_rnn
    from pycudnnrnn.core.checks import Problem, make_config

    def scratch_bytes(num_layers, max_time):
        config = make_config(rnn_mode=mode, num_layers=num_layers, num_units=8, input_size=8,
                             input_mode="linear_input", direction="bidirectional", num_proj=0)
        problem = Problem(config, max_time, 4, True, np.dtype(np.float32), None,
                          is_training=False)
        return cpu_rnn.reserve_nbytes(problem)

    assert scratch_bytes(6, 50) == scratch_bytes(2, 50)
    slots, B, width, itemsize = 2, 4, 2 * 8, 4  # two [T, B, D·H] float32 outputs
    outputs = slots * B * width * itemsize
    assert scratch_bytes(2, 51) - scratch_bytes(2, 50) == outputs


def test_results_are_named_tuples():
    import pycudnnrnn
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="zero")
    fwd = case.forward()
    assert isinstance(fwd, pycudnnrnn.ForwardResult) and isinstance(fwd, tuple)
    assert fwd._fields == ("output", "output_h", "output_c", "reserve_space")
    y, hy, cy, reserve = fwd
    assert fwd.output is y and fwd.output_h is hy and fwd.output_c is cy
    assert fwd.reserve_space is reserve
    grads = case.backprop(fwd, np.ones_like(y), np.ones_like(hy), np.ones_like(cy))
    assert isinstance(grads, pycudnnrnn.BackpropResult)
    assert grads._fields == ("input_backprop", "input_h_backprop", "input_c_backprop",
                             "params_backprop")
    assert grads.input_backprop.shape == case.input.shape
    assert grads.input_h_backprop.shape == case.input_h.shape
    assert grads.input_c_backprop.shape == case.input_c.shape
    assert grads.params_backprop.shape == case.params.shape


def test_non_lstm_modes_return_empty_cell_outputs():
    case = make_case("rnn_tanh")
    y, hy, cy, reserve = case.forward()
    assert cy.shape == (0,) and cy.dtype == y.dtype
    grads = case.backprop((y, hy, cy, reserve), np.ones_like(y), np.ones_like(hy), None)
    assert grads[2].shape == (0,)


def test_inference_keeps_one_pseudo_layer_of_activations():
    """Training keeps every pseudo-layer's gates for backprop; inference reuses one slot."""
    import tracemalloc
    case = make_case("lstm", "bidirectional", num_layers=3, T=50, B=8, input_size=16,
                     num_units=32)
    peaks = {}
    for training in (True, False):
        tracemalloc.start()
        case.forward(is_training=training)
        peaks[training] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # gates + cells are 5H per step and pseudo-layer: six pseudo-layers' worth vs one
    assert peaks[False] < 0.5 * peaks[True], peaks
