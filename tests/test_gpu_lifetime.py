"""The GPU path, round 2 (issue 40): graphs that keep what they replay, every stream
fenced, devices entered, dropout states ordered, JAX's forward workspace.

Each stand-in test failed on the code before its fix: the stand-in GPU of
``fake_cuda.py`` knows CUDA's capture modes (queries, syncs and waits refused as CUDA
refuses them), replays graphs by address (memory freed and reused since shows up as a
wrong answer), several streams and devices. The ``gpu`` tests run the same stories on
a real GPU with PyTorch, CuPy and JAX (``make gpu-check``); ``docs/gpu.md`` states each
guarantee.
"""

import gc
import types

import numpy as np
import pytest

import fake_cuda
import pycudnnrnn
from conftest import make_case
from pycudnnrnn import plan as plans


def _cp():
    from pycudnnrnn.core import gpu
    return gpu.cupy()


def _on_device(case):
    return [None if a is None else fake_cuda._device(a)
            for a in (case.input, case.input_h, case.input_c, case.params)]


def _expected(case, x):
    """The CPU backend's forward of `case` with input `x` (host arrays)."""
    return pycudnnrnn.forward(x, case.input_h, case.input_c, case.params,
                              case.sequence_lengths, **case.attrs)


def _close(got, want, name="output"):
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)


def _reuse_freed_memory(cp):
    """Let the pool hand out every freed block (to someone who fills it)."""
    junk = [cp.empty(n, cp.uint8) for n in range(64, 8192, 64)]
    for j in junk:
        j[...] = 7
    return junk


# ----------------------------------------------------------------- 1: foreign graphs

@pytest.mark.parametrize("mode", [fake_cuda.CAPTURE_RELAXED, fake_cuda.CAPTURE_GLOBAL])
def test_a_graph_captured_outside_pycudnnrnn_keeps_the_plans_it_replays(fake_gpu, mode):
    """A CuPy (relaxed) or PyTorch-style (global) capture of the functional API: the
    graph holds no plan, and ``clear_caches`` drops the cached one. The plan run under
    the capture is pinned, so the pool does not hand its device lengths and mask to
    someone else before the replay reads them."""
    cp = _cp()
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", num_units=8)
    x, h, c, w = _on_device(case)
    lengths = case.sequence_lengths
    pycudnnrnn.forward(x, h, c, w, lengths, **case.attrs)  # built and run eagerly
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc), stream:  # a graph's own pool, as torch's
        stream.begin_capture(mode=mode)
        y = pycudnnrnn.forward(x, h, c, w, lengths, **case.attrs)[0]
        graph = stream.end_capture()
    plans.clear_caches()
    gc.collect()
    junk = _reuse_freed_memory(cp)
    new_x = np.random.default_rng(5).standard_normal(case.input.shape)
    with stream:
        x[...] = fake_cuda._device(new_x)
        graph.launch(stream)
        _close(fake_cuda.to_host(y), _expected(case, new_x)[0])
    from pycudnnrnn.cuda import lifetime
    assert junk and lifetime.pinned() >= 1


# ----------------------------------------------------------------- 2: every stream fenced

def test_a_dead_plan_waits_for_its_runs_on_every_stream(fake_gpu):
    """A plan run on stream A (work still queued), then on stream B, then dropped: its
    buffers are not reused before A's work is done, though B's run was the latest."""
    cp = _cp()
    case = make_case("lstm", num_layers=2, lengths="ragged", num_units=6)
    args = _on_device(case)
    plan = pycudnnrnn.RNNPlan(num_layers=2, num_units=6, input_size=3, max_time=4,
                              batch_size=3, sequence_lengths=case.sequence_lengths,
                              dtype="float64", device="cuda")
    plan.forward(*args)
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with a:
        y = plan.forward(*args)[0]  # queued on A
    with b:
        plan.forward(*args)
        b.synchronize()
    del plan
    gc.collect()
    junk = _reuse_freed_memory(cp)
    with a:
        _close(fake_cuda.to_host(y), case.forward()[0])
    assert junk


# ----------------------------------------------------------------- 6: the upload event

@pytest.mark.parametrize("mode", [fake_cuda.CAPTURE_GLOBAL, fake_cuda.CAPTURE_RELAXED])
def test_a_capture_right_after_the_plan_is_built_waits_for_its_uploads(fake_gpu, mode):
    """The documented ``torch.cuda.graph`` recipe with one warm-up on a side stream,
    the GPU still busy with the plan's uploads: the capture neither queries their event
    (refused in global mode) nor waits on it as an ordinary event (refused in any
    mode): it waits on it as an external event, which each replay honours."""
    cp = _cp()
    case = make_case("gru", "bidirectional", lengths="ragged", num_units=5)
    x, h, _, w = _on_device(case)
    side, capturing = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with side:  # the warm-up stream: the plan is built there, its uploads queued
        plan = pycudnnrnn.RNNPlan(num_layers=1, num_units=5, input_size=3, max_time=4,
                                  batch_size=3, sequence_lengths=case.sequence_lengths,
                                  dtype="float64", device="cuda", rnn_mode="gru",
                                  direction="bidirectional")
    with capturing:
        capturing.begin_capture(mode=mode)
        y = plan.forward(x, h, None, w)[0]
        graph = capturing.end_capture()
        graph.launch(capturing)
        _close(fake_cuda.to_host(y), case.forward()[0])
    assert plan.device == "cuda:0"


# ----------------------------------------------------------------- 3, 4: PyTorch's tensors

class _TorchLike(fake_cuda.FakeFrameworkArray):
    """Stands for a PyTorch CUDA tensor: the library knows one by its module's name and
    runs it on PyTorch's current stream (``torch.cuda.current_stream``, patched by the
    ``torch_like`` fixture to hand out stand-in streams)."""

    requires_grad = False

    def is_conj(self):
        return False

    def is_neg(self):
        return False


_TorchLike.__module__ = "torch"


@pytest.fixture
def torch_like(fake_gpu, monkeypatch):
    """PyTorch's current stream per device: a stand-in stream of its own."""
    torch = pytest.importorskip("torch")
    from pycudnnrnn.core import dtypes
    streams = {}

    def current_stream(device=None):
        device = fake_cuda.current_device() if device is None else device
        stream = streams.setdefault(device, fake_cuda.FakeStream(device_id=device))
        return types.SimpleNamespace(cuda_stream=stream.ptr)

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(dtypes, "torch_from_dlpack", lambda array: array)  # stays stand-in
    return streams


def test_graphs_capture_of_the_functional_api_on_torch_tensors_captures_it(torch_like):
    """Inside ``graphs.capture`` the call runs on the capturing stream, not PyTorch's
    current one: the replay recomputes the outputs from the new input."""
    from pycudnnrnn import graphs
    case = make_case("gru", lengths="ragged", num_units=5)
    x, h, _, w = [None if a is None else _TorchLike(a) for a in _on_device(case)]
    captured = graphs.capture(
        lambda: pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs))
    new_x = np.random.default_rng(7).standard_normal(case.input.shape)
    with captured.stream:
        x.array[...] = fake_cuda._device(new_x)
        captured.replay()
        _close(fake_cuda.to_host(captured.outputs[0]), _expected(case, new_x)[0])


def test_torch_tensors_on_another_gpu_than_the_current_one(torch_like):
    """Tensors on cuda:1 with cuda:0 current: the call enters cuda:1 and runs on
    PyTorch's current stream there."""
    fake_cuda.DEVICES[0] = 2
    case = make_case("lstm", lengths="ragged", num_units=5)
    cp = _cp()
    with cp.cuda.Device(1):
        args = [_TorchLike(a) for a in _on_device(case)]
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    assert out[0].device.id == 1
    with cp.cuda.Device(1), fake_cuda.FakeStream(ptr=torch_like[1].ptr, device_id=1):
        _close(fake_cuda.to_host(out[0]), case.forward()[0])


def test_other_librarys_arrays_on_another_gpu_live_until_its_work_is_done(fake_gpu):
    """Another library's arrays on cuda:1, cuda:0 current: they are kept until the work
    queued on cuda:1 is done (an event there, not on cuda:0), though a later call on
    cuda:0 lets go of what is done, and their library reuses their memory at once."""
    fake_cuda.DEVICES[0] = 2
    cp = _cp()
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", num_units=8)
    with cp.cuda.Device(1):
        theirs = cp.cuda.Stream(non_blocking=True)
        with theirs:
            foreign = [fake_cuda.FakeFrameworkArray(a) for a in _on_device(case)]
    out = pycudnnrnn.forward(*foreign, case.sequence_lengths, **case.attrs)
    del foreign
    gc.collect()
    later = [fake_cuda.FakeFrameworkArray(a) for a in _on_device(case)]  # on cuda:0
    pycudnnrnn.forward(*later, case.sequence_lengths, **case.attrs)
    with cp.cuda.Device(1):
        with theirs:
            junk = _reuse_freed_memory(cp)
        _close(fake_cuda.to_host(out[0]), case.forward()[0])
    assert junk


# ----------------------------------------------------------------- 5: dropout states

def test_forwards_of_one_seed_on_two_streams_draw_in_order(fake_gpu):
    """The seed's dropout states are one buffer: a forward on stream B that restarts
    them waits for the forward still queued on stream A, so that each draws the seed's
    first masks (without the wait, B's restart lands before A's draw advances them)."""
    cp = _cp()
    case = make_case("lstm", num_layers=2, num_units=6)
    x, h, c, w = _on_device(case)
    plan = pycudnnrnn.RNNPlan(num_layers=2, num_units=6, input_size=3, max_time=4,
                              batch_size=3, dtype="float64", device="cuda", dropout=0.5,
                              seed=3)
    arrays = dict(input=x, input_h=h, input_c=c, params=w)
    first = fake_cuda.to_host(plan.run_forward(arrays, restart_dropout=True)[0])
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with a:
        on_a = plan.run_forward(arrays, restart_dropout=True)[0]
    with b:
        on_b = plan.run_forward(arrays, restart_dropout=True)[0]
    with a:
        _close(fake_cuda.to_host(on_a), first, "on A")
    with b:
        _close(fake_cuda.to_host(on_b), first, "on B")


def test_graphs_capture_waits_for_the_callers_stream(fake_gpu):
    """The caller's input write, queued on its stream: the capture's warm-up (and so the
    graph's stream) comes after it."""
    from pycudnnrnn import graphs
    cp = _cp()
    case = make_case("gru", lengths="ragged", num_units=5)
    x, h, _, w = _on_device(case)
    new_x = np.random.default_rng(9).standard_normal(case.input.shape)
    caller = cp.cuda.Stream(non_blocking=True)
    with caller:
        x[...] = new_x  # a host copy, queued on the caller's stream
        captured = graphs.capture(
            lambda: pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs))
    with captured.stream:
        captured.replay()
        _close(fake_cuda.to_host(captured.outputs[0]), _expected(case, new_x)[0])


# ----------------------------------------------------------------- 8: smaller

def test_a_plan_built_in_a_captures_warm_up_takes_no_block_of_its_pool(fake_gpu):
    """A plan first built inside ``graphs.capture`` (its warm-up) outlives the graph in
    the caches: its buffers come from CuPy's own pool, not the graph's private one."""
    from pycudnnrnn import graphs
    case = make_case("lstm", lengths="ragged", num_units=5, dropout=0.5)
    x, h, c, w = _on_device(case)
    captured = graphs.capture(
        lambda: pycudnnrnn.forward(x, h, c, w, case.sequence_lengths, **case.attrs))
    (built,) = {id(p): p for p in captured._held}.values()
    buffers = [built.dev_lengths, built.valid, built.head_device,
               built.rnn.dropout.states.buffer]
    pools = {id(fake_cuda._root(b).release[0]) for b in buffers}
    assert pools == {id(fake_cuda.FakeCupy.get_default_memory_pool())}
