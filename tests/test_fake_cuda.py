"""The stand-in GPU itself: its weight-slot table is cuDNN's, its counters count, and it
lives in time (streams, events, the pool, cuDNN's stream, dropout state, reserve writes)."""

import importlib.util
import json
import os

import numpy as np
import pytest

import fake_cuda
import pycudnnrnn
from conftest import assert_ulp_close, benchmark_script, make_case, on_thread
from pycudnnrnn.core.checks import make_config

RECORDED = os.path.join(os.path.dirname(__file__), "data", "gpu-layout.json")


def _recorded():
    with open(RECORDED) as f:
        return json.load(f)


@pytest.mark.parametrize("entry", _recorded(), ids=lambda e: "-".join(
    str(v) for k, v in e["config"].items() if k in ("rnn_mode", "num_proj", "direction",
                                                     "input_mode")))
def test_weight_slots_are_those_cudnn_reported_on_an_h200(entry):
    """cuDNN 9.19's table, recorded by `make gpu-check` (2026-11-30), for all 20 configs."""
    c = entry["config"]
    config = make_config(rnn_mode=c["rnn_mode"], num_layers=c["num_layers"],
                         num_units=c["num_units"], input_size=c["input_size"],
                         input_mode=c["input_mode"], direction=c["direction"],
                         num_proj=c["num_proj"])
    ours = sorted([s.pseudo_layer, s.lin_layer_id, s.kind, s.offset, int(np.prod(s.shape))]
                  for s in fake_cuda.weight_slots(config))
    assert ours == sorted(entry["cudnn"])
    itemsize = np.dtype(c["dtype"]).itemsize
    assert fake_cuda.weight_space_elements(config) * itemsize == entry["cudnn_bytes"]


def test_counters_see_transfers_and_syncs():
    cp = fake_cuda.FakeCupy()
    fake_cuda.reset_counts()
    a = cp.asarray(np.arange(4.0))                 # host → device
    b = cp.asarray(a)                              # device → device: not counted
    b[...] = np.ones(4)                            # host → device
    cp.asnumpy(b)                                  # device → host, sync
    bool(a[0] > 0)                                 # a scalar read: device → host, sync
    cp.cuda.get_current_stream().synchronize()     # sync
    assert fake_cuda.COUNTS["host_to_device"] == 2
    assert fake_cuda.COUNTS["device_to_host"] == 2
    assert fake_cuda.COUNTS["sync"] == 3


def test_benchmark_helpers_report_median_and_quartiles():
    bench = benchmark_script("gpu_bench")  # imports without a GPU; its GPU parts run in gpu-check
    calls = []
    rows = bench.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                             rounds=3, calls=2)
    assert calls == ["a", "a", "b", "b"] * 3  # interleaved rounds
    assert set(rows) == {"a", "b"} and all(q1 <= m <= q3 for m, q1, q3 in rows.values())
    assert bench.format_rows("t", {"a": (2.0, 1.0, 3.0)}).splitlines()[1].split()[:3] == \
        ["a", "2.0", "us"]


def test_host_cost_benchmark_runs_on_the_stand_in(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["gpu_host_bench.py", "--rounds", "2"])
    benchmark_script("gpu_host_bench").main()
    out = capsys.readouterr().out
    assert "forward plan" in out and "fwd+bwd functional" in out
    assert "fwd+bwd plan, another stream" in out  # the host work counted per call
    if importlib.util.find_spec("torch") is not None:  # the op's CUDA body, timed too
        assert "forward PyTorch op, kernel" in out and "fwd+bwd PyTorch op, kernels" in out


def test_the_light_stand_in_runs_plans_without_the_emulation(monkeypatch):
    """What gpu_host_bench times: a plan's runs over plain host arrays, the cuDNN calls a
    run makes marshalled by ctypes into a C no-op (so none reaches the FakeCudnn)."""
    fake = fake_cuda.install_light(monkeypatch)
    cp = pycudnnrnn.core.gpu.cupy()
    case = make_case("lstm")
    plan = pycudnnrnn.RNNPlan(**case.size, max_time=case.input.shape[0],
                              batch_size=case.input.shape[1], dtype=case.input.dtype,
                              device="cuda")
    x, h, c, w = (cp.asarray(a) for a in (case.input, case.input_h, case.input_c,
                                          case.params))
    fake.calls.clear()
    out = plan.forward(x, h, c, w)
    grads = plan.backprop(x, h, c, w, *out[:3], *(cp.asarray(np.ones(a.shape, a.dtype))
                                                 for a in out[:3]), out[3])
    assert fake.calls == []
    assert all(type(a) is fake_cuda.LightDeviceArray for a in (*out, *grads))
    assert grads.params_backprop.shape == w.shape
    with pytest.raises(TypeError, match="input: expected dtype"):  # the checks still run
        plan.forward(x.astype(np.float16), h, c, w)
    pycudnnrnn.plan.clear_caches()


# ----------------------------------------------------------------- the stand-in lives in time

def _host(a):
    return np.asarray(a).view(np.ndarray)


def test_work_waits_in_its_stream_until_a_sync(fake_gpu):
    cp = fake_cuda.FakeCupy()
    a = cp.asarray(np.arange(4.0))  # a host→device copy: queued on the current stream
    assert np.isnan(_host(a)).all()  # not there yet: the host has not synchronized
    cp.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(_host(a), np.arange(4.0))


def test_a_stream_runs_in_order_but_two_streams_are_not_ordered(fake_gpu):
    cp = fake_cuda.FakeCupy()
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        a = cp.asarray(np.ones(4))
        b = a * 2  # the same stream: runs after the copy
    np.testing.assert_array_equal(_host(b), 2.0)
    with side:
        c = cp.asarray(np.full(4, 3.0))
    d = c + 1  # the null stream does not wait for `side`
    assert np.isnan(_host(d)).all()
    event = side.record()
    with side:
        e = cp.asarray(np.full(4, 5.0))
    cp.cuda.get_current_stream().wait_event(event)
    f = e * 1  # wait_event orders what `side` did before the event, not after
    assert np.isnan(_host(f)).all()
    g = c * 1
    np.testing.assert_array_equal(_host(g), 3.0)


def test_freed_blocks_are_poisoned_in_stream_order_and_reused(fake_gpu):
    cp = fake_cuda.FakeCupy()
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        a = cp.zeros(64, cp.float32)
        address = a.data.ptr
        del a  # freed on `side`: poisoned once `side` gets there
        b = cp.empty(64, cp.float32)  # the same stream takes it at once
        assert b.data.ptr == address
        b[...] = 1.0
    np.testing.assert_array_equal(_host(b), 1.0)
    with side:
        del b
        fake_cuda._submit(side.ptr, lambda: None)  # more work queued on `side`
    c = cp.empty(64, cp.float32)  # another stream: not before `side` passed the free
    assert c.data.ptr != address
    side.synchronize()
    d = cp.empty(64, cp.float32)
    assert d.data.ptr == address and np.isnan(_host(d)).all()


def test_strict_mode_runs_streams_out_of_submission_order(strict_gpu):
    cp = fake_cuda.FakeCupy()
    order, streams = [], [cp.cuda.Stream(non_blocking=True) for _ in range(3)]
    for i, s in enumerate(streams):
        fake_cuda._submit(s.ptr, lambda i=i: order.append(i))
    cp.cuda.runtime.deviceSynchronize()
    assert order == [2, 1, 0]


def test_cudnn_runs_on_the_stream_set_on_its_handle(fake_gpu):
    case = make_case("gru", num_units=4)
    cp = fake_cuda.FakeCupy()
    args = [fake_cuda._device(a) for a in (case.input, case.input_h, case.params)]
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        y = pycudnnrnn.forward(args[0], args[1], None, args[2], **case.attrs)[0]
    queued = fake_cuda._queue(side.ptr).ops
    assert queued and "cudnnSetStream" in fake_gpu.calls
    side.synchronize()
    assert_ulp_close(_host(y), case.forward()[0])


def test_cudnn_destroy_synchronizes_and_invalidates_a_capture(fake_gpu):
    from pycudnnrnn.cudnn.descriptors import Handle
    cp = fake_cuda.FakeCupy()
    handle = Handle()
    a = cp.asarray(np.ones(3))
    handle.close()  # cudaDeviceSynchronize inside
    np.testing.assert_array_equal(_host(a), 1.0)
    stream, other = cp.cuda.Stream(non_blocking=True), Handle()
    stream.begin_capture()
    other.close()
    with pytest.raises(RuntimeError, match="StreamCaptureInvalidated"):
        stream.end_capture()


def test_dropout_masks_follow_the_cudnn_state_which_advances(fake_gpu):
    case = make_case("lstm", num_layers=2, num_units=6, dropout=0.5)
    args = [fake_cuda._device(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    plan = pycudnnrnn.RNNPlan(num_layers=2, num_units=6, input_size=3, max_time=4,
                              batch_size=3, dtype="float64", device="cuda", dropout=0.5)
    first, second = (fake_cuda.to_host(plan.forward(*args)[0]) for _ in range(2))
    plain = fake_cuda.to_host(pycudnnrnn.forward(*args, **{**case.attrs, "dropout": 0.0})[0])
    assert not np.allclose(first, plain) and not np.allclose(first, second)


def test_backward_data_overwrites_the_reserve_space_it_is_handed(fake_gpu):
    """cudnnRNNBackwardData_v8's reserveSpace is [in,out]: the stand-in's call replaces
    forward's record with its own. (The backend hands it a copy, here in the workspace.)"""
    case = make_case("lstm")
    p = pycudnnrnn.RNNPlan(num_layers=1, num_units=4, input_size=3, max_time=4, batch_size=3,
                           dtype="float64", device="cuda")
    args = [fake_cuda._device(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    workspace = fake_cuda._device(np.zeros(p.workspace_nbytes, np.uint8))
    out = p.forward(*args)
    grads = [fake_cuda._device(np.ones(a.shape)) for a in out[:3]]
    p.backprop(*args, *out[:3], *grads, out[3], workspace=workspace)
    token = lambda buffer, at: int(fake_cuda.to_host(buffer)[at:at + 8].view(np.int64)[0])
    copy_at = p.workspace_nbytes - p._executor.reserve_bytes
    assert fake_gpu.state[token(workspace, copy_at)][0] == "data"  # overwritten by cuDNN
    assert fake_gpu.state[token(out[3], 256)][0] == "forward"  # the caller's, as forward left it


def test_temp_space_sizes_grow_with_the_problem():
    from pycudnnrnn.core.checks import make_config
    config = make_config(rnn_mode="lstm", num_layers=2, num_units=8, input_size=4,
                         input_mode="linear_input", direction="unidirectional", num_proj=0)
    small = fake_cuda.temp_space_bytes(config, np.float32, 4, 2, True)
    large = fake_cuda.temp_space_bytes(config, np.float32, 40, 20, True)
    assert all(b > 10 * a - 10_000 for a, b in zip(small, large)) and large[1] > small[1]
    assert fake_cuda.temp_space_bytes(config, np.float32, 4, 2, False)[1] == 0


def test_gpu_check_gives_a_verdict_per_hazard(tmp_path):
    check = benchmark_script("gpu_check")
    xml = tmp_path / "t.xml"
    cases = [f'<testcase name="{n}"/>' for _, names in check.HAZARDS for n in names]
    cases[0] = cases[0].replace("/>", "><failure/></testcase>")
    cases[-1] = cases[-1].replace("/>", "><skipped/></testcase>")
    xml.write_text(f'<testsuites><testsuite>{"".join(cases)}</testsuite></testsuites>')
    verdicts = [v for _, v, _ in check.hazard_verdicts(check.test_outcomes(str(xml)))]
    assert verdicts[0] == "NOT FIXED" and verdicts[-1] == "not settled"
    assert set(verdicts[1:-1]) == {"fixed"}


# ----------------------------------------------------------------- capture modes, devices

@pytest.mark.parametrize("mode, other_thread, refused", [
    (fake_cuda.CAPTURE_GLOBAL, False, True), (fake_cuda.CAPTURE_GLOBAL, True, True),
    (fake_cuda.CAPTURE_THREAD_LOCAL, False, True), (fake_cuda.CAPTURE_THREAD_LOCAL, True, False),
    (fake_cuda.CAPTURE_RELAXED, False, False)])
def test_event_queries_under_capture_follow_cudas_modes(fake_gpu, mode, other_thread, refused):
    """A query of an event recorded before the capture: refused on the capturing thread
    unless relaxed, and on any thread in global mode; a refusal invalidates the capture."""
    import threading
    cp = fake_cuda.FakeCupy()
    event = cp.cuda.get_current_stream().record()
    stream = cp.cuda.Stream(non_blocking=True)
    stream.begin_capture(mode=mode)
    errors = []

    def query():
        try:
            assert event.done
        except RuntimeError as exc:
            errors.append(exc)
    if other_thread:
        thread = threading.Thread(target=query)
        thread.start()
        thread.join()
    else:
        query()
    assert bool(errors) == refused
    if refused:
        assert "cudaErrorStreamCaptureUnsupported" in str(errors[0])
        with pytest.raises(RuntimeError, match="StreamCaptureInvalidated"):
            stream.end_capture()
    else:
        stream.end_capture()


@pytest.mark.parametrize("thread_mode, refused", [
    (fake_cuda.CAPTURE_GLOBAL, True), (fake_cuda.CAPTURE_THREAD_LOCAL, False),
    (fake_cuda.CAPTURE_RELAXED, False)])
def test_a_threads_capture_interaction_mode(fake_gpu, thread_mode, refused):
    """cudaThreadExchangeStreamCaptureMode: a thread whose mode is thread-local or relaxed
    may query while another thread captures in global mode; the default (global) may not."""
    import threading
    cp = fake_cuda.FakeCupy()
    event = cp.cuda.get_current_stream().record()
    stream = cp.cuda.Stream(non_blocking=True)
    stream.begin_capture(mode=fake_cuda.CAPTURE_GLOBAL)
    errors, modes = [], []

    def query():
        modes.append(cp.cuda.runtime.threadExchangeStreamCaptureMode(thread_mode))
        try:
            assert event.done
        except RuntimeError as exc:
            errors.append(exc)
    thread = threading.Thread(target=query)
    thread.start()
    thread.join()
    assert modes == [fake_cuda.CAPTURE_GLOBAL] and bool(errors) == refused
    if refused:
        with pytest.raises(RuntimeError, match="StreamCaptureInvalidated"):
            stream.end_capture()
    else:
        stream.end_capture()


def test_temp_space_sizes_differ_by_device(fake_gpu):
    """The stand-in's devices are GPUs of different kinds: cuDNN asks for other sizes on
    cuda:1 than on cuda:0, by the device its handle was made on."""
    from pycudnnrnn.core.checks import make_config
    config = make_config(rnn_mode="gru", num_layers=1, num_units=4, input_size=4,
                         input_mode="linear_input", direction="unidirectional", num_proj=0)
    on_0, on_1 = (fake_cuda.temp_space_bytes(config, np.float32, 4, 2, True, device=d)
                  for d in (0, 1))
    assert on_0[0] < on_1[0] and on_0[1] < on_1[1]
    fake_cuda.DEVICES[0] = 2
    plans = [pycudnnrnn.RNNPlan(num_layers=1, num_units=4, input_size=4, max_time=4,
                                batch_size=2, dtype="float32", device=f"cuda:{d}",
                                rnn_mode="gru") for d in (0, 1)]
    assert [p.workspace_nbytes < q.workspace_nbytes for p, q in [plans]] == [True]


def test_captured_events_and_outside_events_across_a_capture(fake_gpu):
    """A captured event is refused to queries, syncs and outside waits; a capturing
    stream waits on an outside event only as an external one."""
    cp = fake_cuda.FakeCupy()
    outside = cp.cuda.get_current_stream().record()
    stream = cp.cuda.Stream(non_blocking=True)
    stream.begin_capture()
    inside = stream.record()
    with pytest.raises(RuntimeError, match="cudaErrorCapturedEvent"):
        inside.synchronize()
    with pytest.raises(RuntimeError, match="cudaErrorCapturedEvent"):
        cp.cuda.get_current_stream().wait_event(inside)
    cp.cuda.runtime.streamWaitEvent(stream.ptr, outside.ptr, fake_cuda.EVENT_WAIT_EXTERNAL)
    stream.end_capture()
    stream.begin_capture()
    with pytest.raises(RuntimeError, match="cudaErrorStreamCaptureIsolation"):
        stream.wait_event(outside)
    with pytest.raises(RuntimeError, match="StreamCaptureInvalidated"):
        stream.end_capture()


def test_a_replay_works_on_addresses_whoever_owns_them_now(fake_gpu):
    """A graph holds no memory: freed after the capture and handed to a new owner, a
    block is what the replay reads and writes."""
    cp = fake_cuda.FakeCupy()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        a = cp.zeros(64, cp.float64)
        stream.begin_capture()
        a += 1
        graph = stream.end_capture()
        del a
        b = cp.zeros(64, cp.float64)  # a's block, at once (the same stream)
        graph.launch(stream)
        np.testing.assert_array_equal(fake_cuda.to_host(b), 1.0)


def test_devices_streams_and_arrays_know_their_device(fake_gpu):
    cp = fake_cuda.FakeCupy()
    with pytest.raises(RuntimeError, match="InvalidDevice"):
        cp.cuda.Device(1)
    fake_cuda.DEVICES[0] = 2
    with cp.cuda.Device(1):
        a = cp.zeros(3)
        stream = cp.cuda.Stream(non_blocking=True)
        assert cp.cuda.get_current_stream() is not fake_cuda.NULL_STREAM
    assert a.device.id == 1 and a.__dlpack_device__() == (2, 1)
    assert cp.zeros(3).device.id == 0
    with pytest.raises(RuntimeError, match="created on device 1"):
        stream.__enter__()


def test_the_dlpack_handshake_orders_the_importers_stream_after_the_exporters(fake_gpu):
    """PyTorch's ``__dlpack__`` and CuPy's: where the importer's stream differs from the
    exporter library's current stream, the importer's waits for it (an event); on one
    stream nothing is made; -1 orders nothing; 0 and 2 are refused as PyTorch refuses
    them; across a capture's boundary the wait is refused as CUDA refuses it."""
    cp = fake_cuda.FakeCupy()
    theirs, ours = fake_cuda.FakeStream(), cp.cuda.Stream(non_blocking=True)
    fake_cuda.set_library_stream("torch", theirs)
    tensor = fake_cuda.FakeTorchTensor(cp.zeros(4))
    fake_cuda._submit(theirs.ptr, lambda: tensor.array.view(np.ndarray).fill(3))  # queued
    with ours:
        got = cp.from_dlpack(tensor)  # ours waits on an event of theirs
        np.testing.assert_array_equal(fake_cuda.to_host(got), 3)
    assert fake_cuda.DLPACK_WAITS == [("torch", ours.ptr, theirs.ptr)]
    with fake_cuda.library_stream_entered("torch", ours), ours:
        cp.from_dlpack(tensor)  # one stream: no event
    tensor.__dlpack__(stream=-1)
    assert len(fake_cuda.DLPACK_WAITS) == 1
    with pytest.raises(AssertionError, match="unsupported stream"):
        tensor.__dlpack__(stream=0)
    with pytest.raises(BufferError, match="per-thread"):
        tensor.__dlpack__(stream=2)
    with ours:  # the export: PyTorch's stream waits on CuPy's current one
        fake_cuda.torch_from_dlpack(got)
    assert fake_cuda.DLPACK_WAITS[-1] == ("cupy", theirs.ptr, ours.ptr)
    with ours:
        ours.begin_capture()
        with pytest.raises(RuntimeError, match="cudaErrorStreamCaptureIsolation"):
            cp.from_dlpack(tensor)
        with pytest.raises(RuntimeError, match="cudaErrorCapturedEvent"):
            fake_cuda.torch_from_dlpack(got)
        with pytest.raises(RuntimeError, match="Invalidated"):
            ours.end_capture()


def test_a_tensor_is_exported_only_on_its_device(fake_gpu):
    fake_cuda.DEVICES[0] = 2
    cp = fake_cuda.FakeCupy()
    with cp.cuda.Device(1):
        tensor = fake_cuda.FakeTorchTensor(cp.zeros(4))
    with pytest.raises(BufferError, match="different CUDA device"):
        tensor.__dlpack__(stream=1)
    assert cp.from_dlpack(tensor).device.id == 1  # CuPy's import makes its device current


def test_cupy_14_deprecates_external_stream_for_stream_from_external(fake_gpu):
    """CuPy 14's ``ExternalStream`` warns at each one made; ``Stream.from_external``
    takes an object of the CUDA stream protocol on the current device. CuPy 13 has no
    ``from_external`` and does not warn."""
    import warnings

    from pycudnnrnn.core import gpu
    cp = fake_cuda.FakeCupy()
    with pytest.warns(DeprecationWarning, match="Stream.from_external"):
        cp.cuda.ExternalStream(0xBEEF)
    fake_cuda.DEVICES[0] = 2
    with cp.cuda.Device(1):
        stream = cp.cuda.Stream.from_external(gpu._StreamHandle(0xCAFE))
    assert (stream.ptr, stream.device_id) == (0xCAFE, 1)
    assert cp.external_streams == [(0xBEEF, 0), (0xCAFE, 1)]
    with pytest.raises(AttributeError, match="CUDA stream protocol"):
        cp.cuda.Stream.from_external(object())
    cp.__version__ = "13.6.0"
    assert getattr(cp.cuda.Stream, "from_external", None) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cp.cuda.ExternalStream(0xBEEF)


# ----------------------------------------------------------------- CUDA's special stream handles

@pytest.mark.parametrize("ptr", [0, 1])
def test_pointer_0_and_1_name_the_legacy_stream_of_the_current_device(fake_gpu, ptr):
    """cudaStreamLegacy (1), and 0: the legacy stream of the device current at the call,
    whatever the stream object was made on; each device's null stream is pointer 0."""
    cp = fake_cuda.FakeCupy()
    fake_cuda.DEVICES[0] = 2
    fake_cuda.PER_THREAD_DEFAULT_STREAM[0] = False  # the legacy default, in any run
    with cp.cuda.Device(1):
        assert cp.cuda.get_current_stream().ptr == 0
    ran = []
    handle = fake_cuda.FakeStream(ptr=ptr, device_id=0)  # made for device 0
    with cp.cuda.Device(1):
        fake_cuda._submit(handle.ptr, lambda: ran.append(1))  # on device 1's legacy stream
    handle.synchronize()  # device 0's
    fake_cuda.NULL_STREAM.synchronize()
    assert ran == []
    with cp.cuda.Device(1):
        fake_cuda.NULL_STREAM.synchronize()  # pointer 0, device 1 current
    assert ran == [1]


def test_pointer_2_names_each_threads_own_stream(per_thread_gpu):
    """cudaStreamPerThread (2): every thread's default stream with CuPy's per-thread
    default stream on, and a different stream on each thread; an event names its point
    in the stream of the thread that recorded it."""
    cp = fake_cuda.FakeCupy()
    assert cp.cuda.get_current_stream().ptr == 2
    ran = []

    def queue_one():
        assert cp.cuda.get_current_stream().ptr == 2
        fake_cuda._submit(2, lambda: ran.append(1))
        return cp.cuda.get_current_stream().record()
    event = on_thread(queue_one)
    cp.cuda.get_current_stream().synchronize()  # this thread's: not the other's
    assert ran == [] and not event.done
    event.synchronize()
    assert ran == [1]


def test_the_pool_keys_the_per_thread_stream_by_thread(per_thread_gpu):
    """CuPy's pool (#5069): a block freed on one thread's per-thread stream goes at once
    to that thread's next request only; another thread's waits until the freeing
    thread's stream got past the free."""
    cp = fake_cuda.FakeCupy()
    a = cp.zeros(64, cp.float32)
    address = a.data.ptr
    del a
    fake_cuda._submit(2, lambda: None)  # more work queued on this thread's stream
    assert on_thread(lambda: cp.empty(64, cp.float32).data.ptr) != address
    b = cp.empty(64, cp.float32)
    assert b.data.ptr == address  # this thread's stream: at once
