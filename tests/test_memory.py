"""Bounded memory: calls estimate what they allocate and refuse, early and clearly, what
cannot fit; nothing of size T×B is built where no lengths ask for it."""

import tracemalloc

import numpy as np
import pytest

import pycudnnrnn
from conftest import make_case
from pycudnnrnn.core import checks, memory
from pycudnnrnn.cpu import rnn as cpu_rnn


def _peak(function):
    tracemalloc.start()
    try:
        result = function()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


ESTIMATE_GRID = [(mode, proj, dropout, dtype, lengths)
                 for mode, proj in (("lstm", 0), ("lstm", 8), ("gru", 0), ("rnn_relu", 0))
                 for dtype in (np.float16, np.float64)
                 for dropout, lengths in ((0.0, None), (0.5, [12, 0, 7, 3]))]


@pytest.mark.parametrize("mode,proj,dropout,dtype,lengths", ESTIMATE_GRID)
def test_estimates_bound_the_peak_allocation(mode, proj, dropout, dtype, lengths):
    """The estimate is an upper bound of what forward and backprop allocate, and not a
    loose one (within 3x)."""
    case = make_case(mode, "bidirectional", num_proj=proj, num_layers=3, T=12, B=16,
                     input_size=24, num_units=24, dtype=dtype, dropout=dropout,
                     lengths=lengths or "full")
    for training in (False, True):
        problem = checks.check_forward(case.input, case.input_h, case.input_c, case.params,
                                       case.sequence_lengths, is_training=training, seed=0,
                                       seed2=0, **case.attrs)
        fwd, peak = _peak(lambda: case.forward(is_training=training))
        estimate = cpu_rnn.forward_nbytes(problem)
        assert peak <= estimate <= 3 * peak, ("forward", training, peak, estimate)
    grads = [np.full_like(a, 0.01) for a in fwd[:3]]
    _, peak = _peak(lambda: case.backprop(fwd, *grads))
    estimate = cpu_rnn.backprop_nbytes(problem)
    assert peak <= estimate <= 3 * peak, ("backprop", peak, estimate)


def test_a_call_that_cannot_fit_fails_before_allocating():
    """The issue's example: a zero-stride input of shape (1e5, 1e4, 1) ran 14.7 s and took
    3.8 GB before NumPy's MemoryError. Its estimate (terabytes) fails at once."""
    T, B, H = 100_000, 10_000, 64
    x = np.broadcast_to(np.float32(1), (T, B, 1))
    h = np.zeros((1, B, H), np.float32)
    params = np.zeros(pycudnnrnn.params_size(num_layers=1, num_units=H, input_size=1),
                      np.float32)
    with pytest.raises(pycudnnrnn.InsufficientMemoryError) as caught:
        _, peak = _peak(lambda: pycudnnrnn.forward(x, h, h, params))
    error = caught.value
    assert isinstance(error, MemoryError)
    assert error.required_bytes > T * B * 4 * H * 4  # at least the gates it would keep
    assert f"forward: needs about {error.required_bytes} bytes" in str(error)
    assert f"but {error.available_bytes} bytes" in str(error)


@pytest.fixture
def little_memory(monkeypatch):
    """Pretend 300 MiB are available, and check every estimate, however small."""
    monkeypatch.setattr(memory, "available_bytes", lambda: (300 << 20, "a test"))
    monkeypatch.setattr(memory, "CHECK_ABOVE", 0)


def test_refusal_follows_the_estimate(little_memory):
    small = make_case("lstm", T=50, B=8)
    fwd = small.forward()  # a few hundred kB: fits
    small.backprop(fwd, *[np.ones_like(a) for a in fwd[:3]])
    big = make_case("gru", T=2000, B=2000, num_units=8, input_size=1, dtype=np.float32)
    with pytest.raises(pycudnnrnn.InsufficientMemoryError,
                       match=r"forward: needs about \d+ bytes .* but 314572800 bytes .*\(a test\)"):
        big.forward()
    with pytest.raises(pycudnnrnn.InsufficientMemoryError, match=r"needs about \d+ bytes"):
        big.forward(is_training=False)


def test_backprop_is_refused_too(monkeypatch):
    case = make_case("lstm", T=50, B=8)
    fwd = case.forward()
    grads = [np.ones_like(a) for a in fwd[:3]]
    monkeypatch.setattr(memory, "available_bytes", lambda: (1000, "a test"))
    monkeypatch.setattr(memory, "CHECK_ABOVE", 0)
    with pytest.raises(pycudnnrnn.InsufficientMemoryError, match=r"^backprop: needs about"):
        case.backprop(fwd, *grads)


def test_available_bytes_is_the_least_the_system_allows(monkeypatch, tmp_path):
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text("3000000\n")
    usage.write_text("1000000\n")
    monkeypatch.setattr(memory, "_CGROUP_LIMITS", ((str(limit), str(usage)),))
    monkeypatch.setattr(memory, "_mem_available", lambda: 5_000_000)
    assert memory.available_bytes() == (2_000_000, f"the cgroup limit {limit}")
    limit.write_text("max\n")  # no cgroup limit: MemAvailable
    assert memory.available_bytes() == (5_000_000, "MemAvailable in /proc/meminfo")
    monkeypatch.setattr(memory, "_mem_available", lambda: None)
    assert memory.available_bytes()[0] == memory.FALLBACK_BYTES


def test_mem_available_parses_proc_meminfo():
    import os
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo here")
    with open("/proc/meminfo") as f:
        line = next(l for l in f if l.startswith("MemAvailable:"))
    assert abs(memory._mem_available() - int(line.split()[1]) * 1024) < 1 << 30


@pytest.mark.parametrize("lengths", [None, "ragged"])
def test_batch_order_builds_nothing_of_size_t_by_b(lengths):
    """Without lengths nothing depends on (t, b); with them, per-step counts come from the
    sorted lengths (a [T, B] mask was built even without lengths: 1 GB at 1e5 x 1e4)."""
    T, B = 20_000, 5_000
    config = checks.make_config(rnn_mode="gru", num_layers=1, num_units=2, input_size=1,
                                input_mode="linear_input", direction="unidirectional",
                                num_proj=0)
    given = None if lengths is None else np.arange(B) % (T + 1)
    problem = checks.Problem(config, T, B, True, np.dtype(np.float32), given)
    batch, peak = _peak(lambda: cpu_rnn._Batch(problem))
    assert peak < T * B / 20, peak
    full = problem.full_lengths
    assert list(batch.active) == [int(np.count_nonzero(full > t)) for t in range(T)]


def test_a_plan_of_a_billion_steps_builds_no_per_step_list():
    """RNNPlan(max_time=10**9) built a list of 10**9 entries (8 GB) before any estimate."""
    plan, peak = _peak(lambda: pycudnnrnn.RNNPlan(num_layers=1, num_units=1, input_size=1,
                                                  max_time=10 ** 9, batch_size=1))
    assert peak < 1 << 20, peak
    x = np.broadcast_to(np.float32(1), (10 ** 9, 1, 1))  # no memory behind it
    with pytest.raises(pycudnnrnn.InsufficientMemoryError, match=r"^forward: needs about"):
        plan.forward(x, *[np.zeros((1, 1, 1), np.float32)] * 2,
                     np.zeros(plan.params_size, np.float32))


@pytest.mark.parametrize("sizes", [dict(batch_size=2 ** 31 - 1, max_time=1),
                                   dict(batch_size=1, max_time=2 ** 31 - 1, sequence_lengths=[1])])
def test_absurd_sizes_are_refused_before_the_plan_allocates(sizes):
    """batch_size=2**62 gave NumPy's "array is too big" from inside the plan. (Sizes beyond
    cuDNN's 32-bit ints are refused by name before this: test_plan.py.)"""
    with pytest.raises(pycudnnrnn.InsufficientMemoryError, match=r"^a plan: needs about"):
        pycudnnrnn.RNNPlan(num_layers=1, num_units=1, input_size=1, **sizes)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_estimates_count_the_python_objects_of_many_layers(mode):
    """A 100 000-layer network of one unit estimated 5.6 MB for a forward that peaks near
    0.7 GB: the layout table and views per layer (about 6 KB) were not counted."""
    L = 1500
    plan = pycudnnrnn.RNNPlan(num_layers=L, num_units=1, input_size=1, max_time=1,
                              batch_size=1, rnn_mode=mode, direction="bidirectional")
    args = [np.ones((1, 1, 1), np.float32), np.zeros((2 * L, 1, 1), np.float32),
            np.zeros((2 * L, 1, 1), np.float32) if mode == "lstm" else None,
            np.zeros(plan.params_size, np.float32)]
    fwd, forward_peak = _peak(lambda: plan.forward(*args))
    _, backprop_peak = _peak(lambda: plan.backprop(*args, *fwd[:3], *fwd[:3], fwd[3]))
    assert forward_peak <= plan._executor.forward_nbytes, (forward_peak, plan._executor.forward_nbytes)
    assert backprop_peak <= plan._executor.backprop_nbytes
    _, build_peak = _peak(lambda: pycudnnrnn.RNNPlan(
        num_layers=L, num_units=1, input_size=1, max_time=1, batch_size=1, rnn_mode=mode,
        direction="bidirectional"))
    assert build_peak <= cpu_rnn.plan_nbytes(plan.problem)


def test_the_address_space_limit_counts_as_available_memory(monkeypatch):
    """Under ``ulimit -v`` a forward too large for the address space died after seconds
    of chained MemoryErrors; the limit is now one of the figures the estimate meets."""
    import resource
    limit = 1 << 30
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, resource.RLIM_INFINITY))
    monkeypatch.setattr(memory, "_mem_available", lambda: 1 << 40)
    available, source = memory.available_bytes()
    assert source == "the address-space limit (ulimit -v)" and available < limit


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_relu"])
@pytest.mark.parametrize("training, dropout", [(True, 0.0), (True, 0.5), (False, 0.5)])
def test_the_reserve_size_is_the_sum_of_its_entries(mode, training, dropout):
    """reserve_nbytes sums the entries kind by kind (fast for any number of layers): the
    same total as the entries the forward lays out."""
    from pycudnnrnn.core.checks import make_problem
    problem = make_problem(max_time=7, batch_size=3, sequence_lengths=None, dtype="float32",
                           time_major=True, is_training=training, rnn_mode=mode, num_layers=3,
                           num_units=5, input_size=4, input_mode="linear_input",
                           direction="bidirectional", num_proj=0, dropout=dropout)
    entries = cpu_rnn._reserve_entries(problem)
    assert len({name for name, _ in entries}) == len(entries)
    assert cpu_rnn.reserve_nbytes(problem) == cpu_rnn._HEADER_BYTES + 4 * sum(
        int(np.prod(shape)) for _, shape in entries)
    huge = make_problem(max_time=7, batch_size=3, sequence_lengths=None, dtype="float32",
                        time_major=True, is_training=training, rnn_mode=mode,
                        num_layers=2 ** 31 - 1, num_units=5, input_size=4,
                        input_mode="linear_input", direction="bidirectional", num_proj=0,
                        dropout=dropout)
    assert cpu_rnn.reserve_nbytes(huge) > (2 ** 40 if training else 0)  # without a list
