"""The CUDA backend's staging (``pycudnnrnn.cuda.staging``), on NumPy: it is layout
logic alone, and NumPy has every call it makes of CuPy."""

import numpy as np
import pytest

from pycudnnrnn.core import checks
from pycudnnrnn.cuda.staging import Staging

T, H = 4, 3
RAGGED = [3, 0, 4, 1]  # a row that does not run, rows shorter than T


def _staging(time_major, lengths):
    problem = checks.make_problem(
        max_time=T, batch_size=len(lengths), sequence_lengths=np.array(lengths),
        dtype="float32", time_major=time_major, is_training=True, rnn_mode="gru",
        num_layers=1, num_units=H, input_size=H, input_mode="linear_input",
        direction="unidirectional", num_proj=0, dropout=0.0, seed=0, seed2=0)
    return problem, Staging(np, problem, np.dtype(np.float32))


@pytest.mark.parametrize("time_major", [True, False])
def test_data_goes_in_as_the_running_rows_with_padding_zeroed_and_comes_back(time_major):
    problem, stage = _staging(time_major, RAGGED)
    assert (stage.batch, stage.all_rows, stage.ragged, stage.direct_states) == \
        (3, False, True, False)
    x = np.random.default_rng(0).standard_normal(problem.data_shape(H)).astype(np.float32)
    run = stage.data_in(x, zero_padding=True)
    assert run.shape == stage.run_shape(H)
    running = [b for b, n in enumerate(RAGGED) if n]
    for i, b in enumerate(running):
        steps = run[:, i] if time_major else run[i]
        given = x[:, b] if time_major else x[b]
        np.testing.assert_array_equal(steps[:RAGGED[b]], given[:RAGGED[b]])
        assert not steps[RAGGED[b]:].any()
    back = stage.data_out(run, None, H)
    assert back.shape == problem.data_shape(H)
    empty = back[:, 1] if time_major else back[1]
    assert not empty.any()  # the row that did not run reads zero
    running_back = back[:, running] if time_major else back[running]
    np.testing.assert_array_equal(running_back, run)


@pytest.mark.parametrize("time_major", [True, False])
def test_states_go_in_contiguous_and_rows_that_did_not_run_pass_through(time_major):
    problem, stage = _staging(time_major, RAGGED)
    h = np.random.default_rng(1).standard_normal(problem.state_shape(H)).astype(np.float32)
    run = stage.state_in(h)
    assert run.shape == (1, 3, H) and run.flags.c_contiguous
    result = stage.state_target(None, run) + 1  # what cuDNN would write
    out = np.empty_like(h)
    back = stage.state_out(result, out, h)
    assert back is out
    rows = (lambda s: s) if time_major else (lambda s: s.swapaxes(0, 1))
    np.testing.assert_array_equal(rows(back)[:, 1], rows(h)[:, 1])  # passed through
    np.testing.assert_array_equal(rows(back)[:, [0, 2, 3]], result)


def test_time_major_full_rows_use_the_callers_buffers_as_they_are():
    problem, stage = _staging(True, [T, T])
    assert (stage.all_rows, stage.ragged, stage.direct_states) == (True, False, True)
    out = np.empty(problem.data_shape(H), np.float32)
    assert stage.data_target(out, H) is out
    assert stage.data_out(out, out, H) is out
    h_out = np.empty(problem.state_shape(H), np.float32)
    assert stage.state_target(h_out, h_out) is h_out
