"""RNNPlan and the functional API's plan cache, on the CPU and on a GPU.

The ``device`` fixture (conftest.py) runs each GPU test on the stand-in GPU of
fake_cuda (always, in CI) and on a real one (marked ``gpu``, skipped without it). On
the stand-in, host↔device copies and syncs are counted: a plan's steady-state run and a
functional call that hits the plan cache make none.
"""

import gc

import numpy as np
import pytest

import fake_cuda
import pycudnnrnn
from conftest import make_case
from conftest import STEADY
from pycudnnrnn import plan
from pycudnnrnn.cuda import resources


def _plan_for(case, **overrides):
    size = case.size
    T, B = case.input.shape[:2] if case.attrs["time_major"] else case.input.shape[1::-1]
    kwargs = dict(case.attrs, **size, max_time=T, batch_size=B,
                  sequence_lengths=case.sequence_lengths, dtype=case.input.dtype)
    kwargs.update(overrides)
    return pycudnnrnn.RNNPlan(**kwargs)


def _grads(outputs, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(np.shape(a)).astype(np.asarray(a).dtype) for a in outputs[:3]]


CASES = [dict(rnn_mode="lstm", direction="bidirectional", num_layers=2, lengths="zero"),
         dict(rnn_mode="gru", lengths="ragged", time_major=False),
         dict(rnn_mode="lstm", num_proj=2, lengths="full"),
         dict(rnn_mode="rnn_relu", lengths=[0, 0, 0])]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: f"{s['rnn_mode']}-{s['lengths']}")
def test_cpu_plan_equals_the_functional_api(spec):
    case = make_case(**spec)
    want = case.forward()
    grads = _grads(want)
    want_grads = case.backprop(want, *grads)
    p = _plan_for(case, device="cpu")
    got = p.forward(case.input, case.input_h, case.input_c, case.params)
    got_grads = p.backprop(case.input, case.input_h, case.input_c, case.params, *got[:3],
                           *grads, got[3])
    for g, w in zip(got + got_grads, want + want_grads):
        np.testing.assert_array_equal(g, w)
    assert p.reserve_nbytes == got[3].size and p.workspace_nbytes == 0
    assert p.output_shape == want[0].shape and p.output_h_shape == want[1].shape
    assert p.output_c_shape == want[2].shape


@pytest.mark.parametrize("spec", CASES, ids=lambda s: f"{s['rnn_mode']}-{s['lengths']}")
def test_gpu_plan_equals_the_numpy_backend(device, spec):
    case = make_case(**spec, dtype=np.float64)
    want = case.forward()
    grads = _grads(want)
    want_grads = case.backprop(want, *grads)
    p = _plan_for(case, device="cuda")
    args = [None if a is None else device.put(a) for a in
            (case.input, case.input_h, case.input_c, case.params)]
    got = p.forward(*args)
    got_grads = p.backprop(*args, *got[:3], *[device.put(g) for g in grads], got[3])
    for g, w in zip(got[:3] + got_grads, want[:3] + want_grads):
        np.testing.assert_allclose(device.get(g), w, rtol=1e-10, atol=1e-10)
    assert got[3].size == p.reserve_nbytes


def test_steady_state_runs_make_no_transfer_and_no_sync(device):
    if device.kind != "stand-in":
        pytest.skip("copies are counted on the stand-in GPU")
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="zero", time_major=False)
    p = _plan_for(case, device="cuda")
    args = [device.put(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    first = p.forward(*args)
    grads = [device.put(g) for g in _grads(first)]
    p.backprop(*args, *first[:3], *grads, first[3])
    fake_cuda.reset_counts()
    out = p.forward(*args)
    p.backprop(*args, *out[:3], *grads, out[3])
    assert device.counts() == dict.fromkeys(STEADY, 0)

    # The functional API, once its plan is cached, likewise (lengths stay on the host).
    attrs = dict(case.attrs)
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **attrs)
    pycudnnrnn.backprop(*args, case.sequence_lengths, *out[:3], *grads, out[3], **attrs)
    fake_cuda.reset_counts()
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **attrs)
    pycudnnrnn.backprop(*args, case.sequence_lengths, *out[:3], *grads, out[3], **attrs)
    assert device.counts() == dict.fromkeys(STEADY, 0)


def test_caller_buffers_are_used_and_nothing_else_is_copied(device):
    """out= and workspace= (for framework allocators): results land in the buffers; with
    every sequence full and time-major data, no array is copied on the device."""
    case = make_case("lstm", "unidirectional", num_layers=2, lengths="full")
    p = _plan_for(case, device="cuda")
    args = [device.put(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    out = (device.put(np.empty(p.output_shape)), device.put(np.empty(p.output_h_shape)),
           device.put(np.empty(p.output_c_shape)),
           device.put(np.empty(p.reserve_nbytes, np.uint8)))
    workspace = device.put(np.empty(max(p.workspace_nbytes, 1), np.uint8))
    fake_cuda.reset_counts()
    got = p.forward(*args, out=out, workspace=workspace)
    assert all(g is o for g, o in zip(got, out))
    if device.kind == "stand-in":
        assert fake_cuda.COUNTS["device_copy"] == 0 and fake_cuda.COUNTS["device_alloc"] == 0
    np.testing.assert_array_equal(device.get(got[0]), case.forward()[0])
    grads = [device.put(g) for g in _grads(got)]
    grad_out = (device.put(np.empty(p.input_shape)), device.put(np.empty(p.output_h_shape)),
                device.put(np.empty(p.output_c_shape)), device.put(np.empty(p.params_size)))
    back = p.backprop(*args, *got[:3], *grads, got[3], out=grad_out, workspace=workspace)
    assert all(g is o for g, o in zip(back, grad_out))
    with pytest.raises(TypeError, match=r"workspace: expected dtype uint8, got float64"):
        p.forward(*args, workspace=device.put(np.empty(3)))
    with pytest.raises(ValueError, match=r"workspace: expected a writable, contiguous 1-D "
                                         r"uint8 buffer of at least \d+ bytes, got shape"):
        p.forward(*args, workspace=device.put(np.empty((2, p.workspace_nbytes + 1), np.uint8)))


def test_padding_is_zeroed_only_when_lengths_are_ragged(device):
    if device.kind != "stand-in":
        pytest.skip("copies are counted on the stand-in GPU")
    allocations = {}
    for lengths in ("full", "ragged"):
        case = make_case("gru", lengths=lengths)
        p = _plan_for(case, device="cuda", is_training=False)
        args = [None if a is None else device.put(a)
                for a in (case.input, case.input_h, case.input_c, case.params)]
        p.forward(*args)
        fake_cuda.reset_counts()
        p.forward(*args)
        allocations[lengths] = fake_cuda.COUNTS["device_alloc"]
        assert fake_cuda.COUNTS["device_copy"] == 0
    assert allocations["ragged"] == allocations["full"] + 1  # the zero-padded copy of x


def test_wrong_arrays_get_clear_errors():
    case = make_case("lstm", lengths="ragged")
    p = _plan_for(case, device="cpu")
    args = [case.input, case.input_h, case.input_c, case.params]
    with pytest.raises(ValueError, match=r"input: expected shape \(4, 3, 3\) .*got \(4, 2, 3\)"):
        p.forward(case.input[:, :2], *args[1:])
    with pytest.raises(TypeError, match=r"params: expected dtype float64 \(the dtype of the "
                                        r"plan\), got float32"):
        p.forward(*args[:3], case.params.astype(np.float32))
    with pytest.raises(TypeError, match=r"input_h: expected an array on cpu \(the plan's "
                                        r"device\), got one on cuda"):
        p.forward(case.input, fake_cuda._device(case.input_h), *args[2:])
    with pytest.raises(ValueError, match=r"out output: expected shape"):
        p.forward(*args, out=(np.empty(3), None, None, None))
    inference = _plan_for(case, device="cpu", is_training=False)
    y = inference.forward(*args)
    with pytest.raises(ValueError, match="backprop: this plan was built with is_training=False"):
        inference.backprop(*args, *y[:3], *y[:3], y[3])
    with pytest.raises(ValueError, match=r"device: expected 'cpu', 'cuda', 'cuda:N' or an int, "
                                         r"got 'gpu'"):
        _plan_for(case, device="gpu")
    with pytest.raises(TypeError, match="dtype: expected float16, bfloat16, float32 or float64, got int32"):
        _plan_for(case, dtype="int32")
    with pytest.raises(ValueError, match=r"sequence_lengths: expected values in \[0, 4\]"):
        _plan_for(case, sequence_lengths=[9, 1, 1])


def test_arrays_on_another_gpu_are_refused(device):
    if device.kind != "stand-in":
        pytest.skip("on one GPU, arrays are all on cuda:0")
    fake_cuda.DEVICES[0] = 2  # the stand-in with two devices (install puts back one)
    case = make_case("gru")
    p = _plan_for(case, device="cuda:1")
    args = [None if a is None else device.put(a)
            for a in (case.input, case.input_h, case.input_c, case.params)]
    with pytest.raises(TypeError, match=r"input: expected an array on cuda:1 \(the plan's "
                                        r"device\), got one on cuda:0"):
        p.forward(*args)
    with pytest.raises(TypeError, match=r"input: expected an array on cuda:1 \(the plan's "
                                        r"device\), got one on cpu"):
        p.forward(case.input, *args[1:])


def test_functional_calls_reuse_a_bounded_number_of_plans():
    plan.clear_caches()
    case = make_case("gru", lengths="ragged")
    for n in range(1, 5):
        lengths = [n, 1, 2]
        pycudnnrnn.forward(case.input, case.input_h, None, case.params, lengths,
                           **case.attrs)
        pycudnnrnn.forward(case.input, case.input_h, None, case.params, lengths,
                           **case.attrs)
    assert len(plan._plans) == 4  # one per set of lengths, reused by the repeated call
    for n in range(200):
        pycudnnrnn.forward(case.input, case.input_h, None, case.params,
                           [1 + n % 4, 1 + (n // 4) % 4, 1 + (n // 16) % 4], **case.attrs)
    assert len(plan._plans) <= plan._plans.maxsize


def test_cpu_training_with_a_fresh_seed_per_step_reuses_one_plan(monkeypatch):
    """PyTorch's CPU modules draw a seed per step: one plan, reseeded, serves them all."""
    plan.clear_caches()
    builds = []
    original = plan.RNNPlan.from_problem.__func__
    monkeypatch.setattr(plan.RNNPlan, "from_problem",
                        classmethod(lambda cls, *a: builds.append(a) or original(cls, *a)))
    case = make_case("lstm", num_layers=2, lengths="ragged", dropout=0.5)
    arrays = (case.input, case.input_h, case.input_c, case.params)
    outputs = {}
    for seed in range(4):
        attrs = {**case.attrs, "seed": seed, "seed2": 7}
        result = pycudnnrnn.forward(*arrays, case.sequence_lengths, **attrs)
        grads = pycudnnrnn.backprop(*arrays, case.sequence_lengths, *result[:3],
                                    *_grads(result), result.reserve_space, **attrs)
        fresh = _plan_for(case, seed=seed, seed2=7)
        expected = fresh.forward(*arrays)
        for got, want in zip([*result, *grads], [*expected, *fresh.backprop(
                *arrays, *expected[:3], *_grads(expected), expected.reserve_space)]):
            np.testing.assert_array_equal(got, want)
        outputs[seed] = result.output
    assert len(builds) == 1
    assert not np.array_equal(outputs[0], outputs[1])  # the seed still picks the masks
    with pytest.raises(ValueError, match="reserve_space"):  # and a reserve knows its seed
        pycudnnrnn.backprop(*arrays, case.sequence_lengths, *result[:3], *_grads(result),
                            result.reserve_space, **{**case.attrs, "seed": 0, "seed2": 7})
    with pytest.raises(TypeError, match="seed"):  # the seed is still checked
        pycudnnrnn.forward(*arrays, case.sequence_lengths, **{**case.attrs, "seed": 1.5})


def test_threads_missing_one_key_at_once_share_one_value():
    import threading
    from pycudnnrnn.core.lru import LRU
    cache, both_building = LRU(2), threading.Barrier(2)

    def build():
        both_building.wait(timeout=10)  # both threads missed the key and are building
        return object()

    got = [None, None]
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, cache.get("k", build)))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] is got[1] is cache.get("k", object)


def test_a_cache_hit_still_checks_every_array():
    case = make_case("lstm")
    case.forward()  # cached
    with pytest.raises(TypeError, match=r"input_c: expected dtype float64 \(the dtype of "
                                        r"input\), got float32"):
        pycudnnrnn.forward(case.input, case.input_h, case.input_c.astype(np.float32),
                           case.params, **case.attrs)
    with pytest.raises(TypeError, match="time_major: expected a bool, got int 1"):
        pycudnnrnn.forward(case.input, case.input_h, case.input_c, case.params,
                           **{**case.attrs, "time_major": 1})


def test_dropout_states_stay_bounded_over_many_seeds(device):
    """Issue 12: one ~6 MiB cuDNN state per seed was kept forever; now a bounded few."""
    if device.kind != "stand-in":
        pytest.skip("the live states are counted on the stand-in GPU")
    case = make_case("lstm", "bidirectional", num_layers=2)
    args = [device.put(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    seeds = set(range(40)) | {1000}

    def live():  # this test's (a plan captured by another test is pinned, its states too)
        return len([s for s in resources.LIVE_DROPOUT_STATES if s.seed in seeds])

    for seed in range(40):
        pycudnnrnn.forward(*args, **{**case.attrs, "dropout": 0.3, "seed": seed})
    gc.collect()
    assert resources.DROPOUT_SEEDS_KEPT <= 8  # at most ~50 MiB on an H200
    assert live() <= resources.DROPOUT_SEEDS_KEPT
    held = _plan_for(case, device="cuda", dropout=0.3, seed=1000)  # a held plan keeps its own
    for seed in range(40):
        pycudnnrnn.forward(*args, **{**case.attrs, "dropout": 0.3, "seed": seed})
    gc.collect()
    assert live() <= resources.DROPOUT_SEEDS_KEPT + 1
    assert held.forward(*args)[0].shape == held.output_shape


def test_reserve_identity_needs_no_read_back(device):
    """backprop knows its own reserve spaces without reading their header from the GPU;
    a copy (not ours) is read, and still checked."""
    if device.kind != "stand-in":
        pytest.skip("copies are counted on the stand-in GPU")
    case = make_case("lstm", num_layers=2, lengths="ragged")
    p = _plan_for(case, device="cuda")
    args = [device.put(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    out = p.forward(*args)
    grads = [device.put(g) for g in _grads(out)]
    fake_cuda.reset_counts()
    p.backprop(*args, *out[:3], *grads, out[3])
    assert fake_cuda.COUNTS["device_to_host"] == 0
    copy = device.put(np.asarray(out[3]).copy())
    p.backprop(*args, *out[:3], *grads, copy)
    assert fake_cuda.COUNTS["device_to_host"] == 1
    other = _plan_for(case, device="cuda", sequence_lengths=[4, 4, 1]).forward(*args)[3]
    with pytest.raises(ValueError, match="reserve_space: made by a forward call with a different"):
        p.backprop(*args, *out[:3], *grads, other)


@pytest.mark.parametrize("lengths", ["full", "zero"])
def test_forward_and_backprop_capture_into_a_cuda_graph(device, lengths):
    """Item 4: a training step (forward + backprop through a plan) captured once and
    replayed on new input values equals eager calls. On the stand-in, the capture shows
    that a run makes no transfer and no sync (CUDA would refuse them while capturing)."""
    from pycudnnrnn import graphs
    case = make_case("lstm", "bidirectional", num_layers=2, lengths=lengths, dtype=np.float32)
    p = _plan_for(case, device="cuda")
    x, h, c, w = [device.put(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    dy, dh, dc = [device.put(g) for g in _grads(case.forward())]

    def step():
        y, hy, cy, reserve = p.forward(x, h, c, w)
        return (y, hy, cy) + p.backprop(x, h, c, w, y, hy, cy, dy, dh, dc, reserve)

    step()  # the plan's first call
    captured = graphs.capture(step)
    if device.kind == "stand-in":
        assert fake_cuda.CAPTURING == []
        assert "cudnnRNNBackwardWeights_v8" in captured.graph.calls
        return
    rng = np.random.default_rng(7)
    for _ in range(2):
        with captured.stream:  # new values, ordered before the replay on its stream
            x[...] = device.put(rng.standard_normal(x.shape).astype(np.float32))
            w[...] = device.put(rng.uniform(-0.3, 0.3, w.shape).astype(np.float32))
            captured.replay()
        captured.stream.synchronize()
        replayed = [device.get(a) for a in captured.outputs]
        eager = [device.get(a) for a in step()]
        for got, want in zip(replayed, eager):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nothing_is_kept_after_a_call(device):
    """Item 6: a call's arrays (inputs, results, reserve space) are freed once the caller
    drops them: neither the plan, its cache nor the reserve-header memory keeps one."""
    import weakref
    case = make_case("lstm", lengths="zero", num_layers=2)
    args = [device.put(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    grads = [device.put(g) for g in _grads(out)]
    back = pycudnnrnn.backprop(*args, case.sequence_lengths, *out[:3], *grads, out[3],
                               **case.attrs)
    refs = [weakref.ref(a) for a in args + list(out) + grads + list(back)]
    del args, out, grads, back
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_cpu_plan_takes_dlpack_arrays_and_caller_buffers():
    """PyTorch CPU tensors in, PyTorch tensors out; out= buffers filled and returned."""
    torch = pytest.importorskip("torch")
    case = make_case("gru", "bidirectional", num_layers=2, lengths="ragged", time_major=False)
    p = _plan_for(case, device="cpu")
    want = case.forward()
    got = p.forward(*[None if a is None else torch.from_numpy(a)
                      for a in (case.input, case.input_h, case.input_c, case.params)])
    assert all(isinstance(g, torch.Tensor) for g in got)
    np.testing.assert_array_equal(got[0].numpy(), want[0])
    grads = _grads(want)
    buffers = (np.empty(p.input_shape), np.empty(p.output_h_shape), None,
               np.empty(p.params_size))
    back = p.backprop(case.input, case.input_h, None, case.params, *want[:3], *grads, want[3],
                      out=buffers)
    assert back[0] is buffers[0] and back[3] is buffers[3]
    for g, w in zip(back, case.backprop(want, *grads)):
        np.testing.assert_array_equal(g, w)


def test_a_framework_reserve_buffer_needs_no_read_back(device):
    """A reserve space a framework allocated (out=) comes in through a DLPack view that
    dies with the call; its header is remembered by the framework's buffer itself."""
    if device.kind != "stand-in":
        pytest.skip("copies are counted on the stand-in GPU")
    case = make_case("lstm", lengths="ragged")
    p = _plan_for(case, device="cuda")
    args = [device.put(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    buffer = fake_cuda.FakeFrameworkArray(device.put(np.empty(p.reserve_nbytes, np.uint8)))
    out = p.forward(*args, out=(None, None, None, buffer))[:3]  # the framework keeps its own
    gc.collect()
    grads = [device.put(g) for g in _grads(out)]
    fake_cuda.reset_counts()
    p.backprop(*args, *out, *grads, buffer)
    assert fake_cuda.COUNTS["device_to_host"] == 0



def test_dtype_none_is_the_documented_default():
    """RNNPlan(dtype=None) gave float64 (np.dtype(None)); the default is float32."""
    plan = pycudnnrnn.RNNPlan(num_layers=1, num_units=2, input_size=2, max_time=2,
                              batch_size=1, dtype=None)
    assert plan.dtype == np.float32


@pytest.mark.parametrize("size, value", [("max_time", 2 ** 62), ("batch_size", 2 ** 31),
                                         ("num_layers", 10 ** 30), ("num_units", 2 ** 31),
                                         ("input_size", 2 ** 40)])
def test_sizes_beyond_cudnns_32_bit_ints_are_refused_naming_them(size, value):
    """RNNPlan(max_time=2**62) was built (its estimate has no time term on the CPU)."""
    sizes = dict(num_layers=1, num_units=4, input_size=3, max_time=5, batch_size=2)
    sizes[size] = value
    with pytest.raises(ValueError, match=rf"{size}: expected an int in \[1, 2147483647\]"):
        pycudnnrnn.RNNPlan(**sizes, device="cpu")


@pytest.mark.parametrize("lengths", [
    np.array([5, 2], dtype=object), np.array([5, np.int64(2)], dtype=object),
    np.array([5, 2.5], dtype=object), np.array([5, True], dtype=object),
    np.array([5, 2 ** 70], dtype=object), [5, 2 ** 64], [5, 2.0], np.array([5, -1]),
    np.array([[5], [2]]), np.array([5, None], dtype=object)])
def test_a_plan_takes_the_lengths_the_functional_api_takes(lengths):
    """Same answer, or the same error, from RNNPlan and forward for odd lengths."""
    def outcome(call):
        try:
            return call() and "ok"
        except (TypeError, ValueError) as error:
            return type(error).__name__, str(error)

    n = pycudnnrnn.params_size(num_layers=1, num_units=4, input_size=3)
    x, h = np.zeros((5, 2, 3), np.float32), np.zeros((1, 2, 4), np.float32)
    planned = outcome(lambda: pycudnnrnn.RNNPlan(
        num_layers=1, num_units=4, input_size=3, max_time=5, batch_size=2,
        sequence_lengths=lengths, device="cpu"))
    functional = outcome(lambda: pycudnnrnn.forward(x, h, h, np.zeros(n, np.float32), lengths))
    assert planned == functional


def test_the_address_doors_take_a_named_tuple_or_bare_ints():
    """``forward_at`` and ``backprop_at`` take their addresses as one named tuple, or as
    the bare ints they took before, then their options positionally or by keyword."""
    from pycudnnrnn.plan import BackpropAddresses, ForwardAddresses
    from pycudnnrnn.plan.rnn_plan import _addresses
    named = ForwardAddresses(*range(1, 10))
    assert _addresses(ForwardAddresses, (named,), (False, None)) == (named, (False, None))
    assert _addresses(ForwardAddresses, (*range(1, 10), True), (False, "k")) == \
        (named, (True, "k"))
    backprop = BackpropAddresses(*range(16))
    assert _addresses(BackpropAddresses, (*range(16), True), (False,)) == (backprop, (True,))
    with pytest.raises(TypeError, match="too many positional arguments: 2"):
        _addresses(BackpropAddresses, (backprop, True, 1), (False,))
