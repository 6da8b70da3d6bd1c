"""The GPU path, round 2 (issue 40): graphs that keep what they replay, every stream
fenced, devices entered, dropout states ordered, JAX's forward workspace, trace-time
sizes on JAX's default device, another library's arrays released once read.

Each stand-in test failed on the code before its fix: the stand-in GPU of
``fake_cuda`` knows CUDA's capture modes (queries, syncs and waits refused as CUDA
refuses them), replays graphs by address (memory freed and reused since shows up as a
wrong answer), several streams and devices. The ``gpu`` tests run the same stories on
a real GPU with PyTorch, CuPy and JAX (``make gpu-check``); ``docs/gpu.md`` states each
guarantee.
"""

import gc
import weakref

import numpy as np
import pytest

import fake_cuda
import pycudnnrnn
from pycudnnrnn.core.config import Attributes
from conftest import make_case, on_thread
from pycudnnrnn import plan as plans


def _cp(device=None):
    if device is not None and device.kind != "stand-in":
        return pytest.importorskip("cupy")
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

def test_a_graph_captured_outside_pycudnnrnn_keeps_the_plans_it_replays(device):
    """A CuPy capture of the functional API (on a private pool, as PyTorch's graphs
    have): the graph holds no plan, and ``clear_caches`` drops the cached one. The plan
    run under the capture is pinned, so the pool does not hand its device lengths and
    mask to someone else before the replay reads them."""
    cp = _cp(device)
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", num_units=8)
    x, h, c, w = [device.put(a) for a in (case.input, case.input_h, case.input_c,
                                          case.params)]
    lengths = case.sequence_lengths
    pycudnnrnn.forward(x, h, c, w, lengths, **case.attrs)  # built and run eagerly
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc), stream:  # a graph's own pool, as torch's
        stream.begin_capture()  # CuPy's default: relaxed
        y = pycudnnrnn.forward(x, h, c, w, lengths, **case.attrs)[0]
        graph = stream.end_capture()
    plans.clear_caches()
    gc.collect()
    junk = _reuse_freed_memory(cp)
    new_x = np.random.default_rng(5).standard_normal(case.input.shape)
    with stream:
        x[...] = device.put(new_x)
        graph.launch(stream)
        got = device.get(y)
    np.testing.assert_allclose(got, _expected(case, new_x)[0], rtol=1e-9, atol=1e-10)
    from pycudnnrnn.cuda import lifetime
    assert junk and lifetime.pinned() >= 1


# ----------------------------------------------------------------- 2: every stream fenced

def test_a_dead_plan_waits_for_its_runs_on_every_stream(device):
    """A plan run on stream A (work still queued), then on stream B, then dropped: its
    buffers are not reused before A's work is done, though B's run was the latest."""
    cp = _cp(device)
    case = make_case("lstm", num_layers=2, lengths="ragged", num_units=6)
    args = [device.put(a) for a in (case.input, case.input_h, case.input_c, case.params)]
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
        got = device.get(y)
    np.testing.assert_allclose(got, case.forward()[0], rtol=1e-9, atol=1e-10)
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

@pytest.fixture
def torch_like(fake_gpu, monkeypatch):
    """PyTorch's streams and DLPack import on the stand-in (``fake_cuda.install_torch``),
    PyTorch's current stream on each device a side stream of its own (cuda:1's too: a
    test may give the stand-in a second device), not its default stream (the null
    stream, CuPy's too): a wait between the two shows. ``side(d)`` is that stream."""
    torch = pytest.importorskip("torch")
    cuda = fake_cuda.install_torch(monkeypatch, torch)
    for device in (0, 1):
        fake_cuda.set_library_stream("torch", fake_cuda.FakeStream(device_id=device))
    cuda.side = lambda device=0: fake_cuda.library_stream("torch", device)
    return cuda


def test_graphs_capture_of_the_functional_api_on_torch_tensors_captures_it(torch_like):
    """Inside ``graphs.capture`` the call runs on the capturing stream, PyTorch's current
    stream then too: the DLPack handshakes wait on nothing (across the capture they are
    refused), the warm-up reads the input the caller queued on PyTorch's stream, and the
    replays recompute the outputs from each new input."""
    from pycudnnrnn import graphs
    case = make_case("gru", lengths="ragged", num_units=5)
    x, h, _, w = [None if a is None else fake_cuda.FakeTorchTensor(a) for a in _on_device(case)]
    rng = np.random.default_rng(7)
    queued, new_x = (rng.standard_normal(case.input.shape) for _ in range(2))
    with torch_like.side(0):
        x.array[...] = queued  # a host copy, queued on PyTorch's stream
    captured = graphs.capture(
        lambda: pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs))
    assert fake_cuda.DLPACK_WAITS == []
    with captured.stream:
        captured.replay()
        _close(fake_cuda.to_host(captured.outputs[0]), _expected(case, queued)[0], "queued")
        x.array[...] = fake_cuda._device(new_x)
        captured.replay()
        _close(fake_cuda.to_host(captured.outputs[0]), _expected(case, new_x)[0])


def test_the_functional_api_on_torch_tensors_makes_no_cross_stream_wait(torch_like):
    """Outside any capture, the DLPack import and export are between PyTorch's current
    stream and itself: no stream waits on another (the legacy stream waited on
    PyTorch's side stream, holding back every blocking stream)."""
    case = make_case("lstm", lengths="ragged", num_units=5)
    args = [fake_cuda.FakeTorchTensor(a) for a in _on_device(case)]
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    assert fake_cuda.DLPACK_WAITS == []
    with torch_like.side(0):
        _close(fake_cuda.to_host(out[0]), case.forward()[0])


def test_torch_cuda_graph_of_the_functional_api_on_torch_tensors_replays_it(torch_like):
    """``torch.cuda.graph`` (a global-mode capture on PyTorch's current stream, after a
    warm-up there) captures the call: its DLPack import and export happen on the
    capturing stream, and a replay recomputes the output from a new input."""
    case = make_case("gru", lengths="ragged", num_units=5)
    x, h, _, w = [None if a is None else fake_cuda.FakeTorchTensor(a) for a in _on_device(case)]
    call = lambda: pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs)
    call()  # the recipe's warm-up: the plan is built outside the capture
    fake_cuda.synchronize_all()  # torch.cuda.graph synchronizes before capturing
    capturing = fake_cuda.FakeStream(non_blocking=True)
    with torch_like.stream(torch_like.ExternalStream(capturing.ptr)):
        capturing.begin_capture(mode=fake_cuda.CAPTURE_GLOBAL)
        try:
            y = call()[0]
        finally:
            graph = capturing.end_capture()
    assert fake_cuda.DLPACK_WAITS == []
    new_x = np.random.default_rng(8).standard_normal(case.input.shape)
    x.array[...] = fake_cuda._device(new_x)
    graph.launch(capturing)
    with capturing:
        _close(fake_cuda.to_host(y), _expected(case, new_x)[0])


def test_torch_tensors_on_another_gpu_than_the_current_one(torch_like):
    """Tensors on cuda:1 with cuda:0 current: the call enters cuda:1 and runs on
    PyTorch's current stream there."""
    fake_cuda.DEVICES[0] = 2
    case = make_case("lstm", lengths="ragged", num_units=5)
    cp = _cp()
    with cp.cuda.Device(1):
        args = [fake_cuda.FakeTorchTensor(a) for a in _on_device(case)]
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    assert out[0].device.id == 1
    with cp.cuda.Device(1), torch_like.side(1):
        _close(fake_cuda.to_host(out[0]), case.forward()[0])


def test_params_to_canonical_exports_on_the_arrays_device(fake_gpu, monkeypatch):
    """Another library's params on cuda:1, cuda:0 current: ``params_to_canonical``'s
    results are exported, and its arrays kept alive, on cuda:1's current stream, not
    cuda:0's (review 2026-12-07, finding 12: it exported outside the arrays' device)."""
    from pycudnnrnn.cuda import foreign
    fake_cuda.DEVICES[0] = 2
    cp = _cp()
    case = make_case("gru", "bidirectional", num_units=5)
    with cp.cuda.Device(1):
        params = fake_cuda.FakeFrameworkArray(fake_cuda._device(case.params))
    kept, keep = [], foreign.keep_until_done
    monkeypatch.setattr(foreign, "keep_until_done", lambda cupy, arrays: kept.append(
        (fake_cuda.current_device(), cupy.cuda.get_current_stream().device_id))
        or keep(cupy, arrays))
    weights, biases = pycudnnrnn.params_to_canonical(params, **case.layout_attrs)
    assert kept and set(kept) == {(1, 1)}
    want = pycudnnrnn.params_to_canonical(case.params, **case.layout_attrs)
    for got, expected in zip(weights + biases, want[0] + want[1]):
        np.testing.assert_array_equal(fake_cuda.to_host(got), expected)


def test_torch_tensors_under_cupy_14_raise_no_deprecation_warning(torch_like):
    """CuPy 14 (the stand-in's) deprecates ``ExternalStream`` and warns at each
    construction (review 2026-12-07, finding 10): the functional API on PyTorch tensors
    warns nothing, and makes CuPy's view of PyTorch's stream once, on the tensors' device
    (cuda:1 here, cuda:0 current: ``Stream.from_external`` takes the current device's)."""
    import warnings
    fake_cuda.DEVICES[0] = 2
    case = make_case("gru", lengths="ragged", num_units=5)
    cp = _cp()
    with cp.cuda.Device(1):
        args = [None if a is None else fake_cuda.FakeTorchTensor(a) for a in _on_device(case)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for _ in range(3):
            out = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    assert cp.external_streams == [(torch_like.side(1).ptr, 1)]
    with cp.cuda.Device(1), fake_cuda.FakeStream(ptr=torch_like.side(1).ptr, device_id=1):
        _close(fake_cuda.to_host(out[0]), case.forward()[0])


def test_other_librarys_arrays_on_another_gpu_live_until_its_work_is_done(fake_gpu):
    """Another library's arrays on cuda:1, cuda:0 current: they are kept until the work
    queued on cuda:1 is done (an event there, not on cuda:0), though a later call on
    cuda:0 comes, and their library reuses their memory at once."""
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


# ----------------------------------------------------------------- graphs on another device

def test_graphs_capture_refuses_arrays_on_another_device(fake_gpu):
    """Arrays on cuda:1 with cuda:0 current: the call would run on cuda:1's stream,
    outside the capture, and every replay would leave the outputs stale. Refused, with
    what to do; inside ``cupy.cuda.Device(1)`` it captures and replays right."""
    from pycudnnrnn import graphs
    fake_cuda.DEVICES[0] = 2
    cp = _cp()
    case = make_case("gru", lengths="ragged", num_units=5)
    with cp.cuda.Device(1):
        x, h, _, w = _on_device(case)
    call = lambda: pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs)
    with pytest.raises(ValueError, match=r"cuda:1.*cuda:0.*cupy\.cuda\.Device\(1\)"):
        graphs.capture(call)
    new_x = np.random.default_rng(5).standard_normal(case.input.shape)
    with cp.cuda.Device(1):
        captured = graphs.capture(call)
        with captured.stream:
            x[...] = fake_cuda._device(new_x)
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
    buffers = [built.dev_lengths, built.staging.valid, built.reserves.head_device,
               built.rnn.dropout.states.buffer]
    pools = {id(fake_cuda._root(b).release[0]) for b in buffers}
    assert pools == {id(fake_cuda.FakeCupy.get_default_memory_pool())}


# ----------------------------------------------------------------- on a real GPU only

def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    pytest.importorskip("cupy")
    return torch


@pytest.mark.gpu
def test_gpu_torch_graph_replays_after_lru_eviction_and_clear_caches():
    """The documented torch.cuda.graph recipe (one warm-up on a side stream), then 70
    other shapes through the adapter's cache of 64, ``clear_caches`` and junk in CuPy's
    pool: the replay equals an eager call on the new batch."""
    torch = _torch_cuda()
    import cupy
    import pycudnnrnn.torch as prt
    torch.manual_seed(0)
    model = prt.LSTM(3, 8, num_layers=2, device="cuda").eval()
    x = torch.randn(5, 4, 3, device="cuda")
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(x)  # the warm-up: the plan is built on the side stream
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = model(x)[0]
        for batch in range(5, 75):  # evict the captured plan from the adapter's LRU
            model(torch.randn(5, batch, 3, device="cuda"))
        plans.clear_caches()
        gc.collect()
        torch.cuda.synchronize()
        junk = _reuse_freed_memory(cupy)
        new = torch.randn_like(x)
        x.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        want = model(new)[0]
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    assert junk


@pytest.mark.gpu
def test_gpu_graphs_capture_with_torch_tensors():
    """``graphs.capture`` of the functional API on PyTorch tensors captures the call:
    a replay after a new input equals an eager call on it."""
    torch = _torch_cuda()
    from pycudnnrnn import graphs
    case = make_case("gru", lengths="ragged", num_units=5, dtype=np.float32)
    x, h, w = (torch.from_numpy(a).cuda() for a in (case.input, case.input_h, case.params))
    attrs = case.attrs
    captured = graphs.capture(
        lambda: pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **attrs))
    new_x = np.random.default_rng(7).standard_normal(case.input.shape).astype(np.float32)
    x.copy_(torch.from_numpy(new_x))
    torch.cuda.synchronize()
    captured.replay()
    captured.stream.synchronize()
    got = captured.outputs[0]
    got = got.cpu().numpy() if hasattr(got, "cpu") else pytest.importorskip("cupy").asnumpy(got)
    want = pycudnnrnn.forward(new_x, case.input_h, None, case.params, case.sequence_lengths,
                              **attrs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_gpu_jax_forward_workspace_is_forwards():
    """The forward custom call's workspace is ``forward_workspace_nbytes`` (cuDNN's
    forward workspace), not backprop's (which adds a copy of the reserve space)."""
    jax = pytest.importorskip("jax")
    try:
        jax.devices("cuda")
    except RuntimeError:
        pytest.skip("JAX sees no CUDA device")
    import jax.numpy as jnp
    import pycudnnrnn.jax as rnn_jax
    case = make_case("lstm", num_layers=2, num_units=32, input_size=16, T=16, B=8,
                     dtype=np.float32)
    args = [jnp.asarray(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    with jax.default_device(jax.devices("cuda")[0]):
        jaxpr = jax.make_jaxpr(lambda *a: rnn_jax.rnn(*a, is_training=True))(*args)
    (call,) = [e for e in _equations(jaxpr.jaxpr)
               if e.params.get("target_name") == rnn_jax.FORWARD]
    workspace = call.params["result_avals"][-1].shape[0]  # the forward call's scratch
    plan = pycudnnrnn.RNNPlan(num_layers=2, num_units=32, input_size=16, max_time=16,
                              batch_size=8, dtype="float32", device="cuda")
    assert workspace == plan.forward_workspace_nbytes < plan.workspace_nbytes


def _equations(jaxpr):
    """Every equation of `jaxpr`, those of the jaxprs its equations hold included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


# ----------------------------------------------------------------- 7: JAX's forward workspace

def test_the_forward_calls_workspace_is_sized_by_forward_workspace_nbytes(fake_gpu):
    """What the forward custom call allocates at trace time for its scratch: cuDNN's
    forward workspace, not backprop's (its reserve copy is ~3 GiB for a float16
    4-layer LSTM at T=512, B=128, H=1024)."""
    from pycudnnrnn.jax import targets
    case = make_case("lstm", num_layers=4, num_units=32, input_size=32, T=16, B=8,
                     dtype=np.float16)
    from pycudnnrnn import jax as rnn_jax
    op = Attributes(**{"seed": 0, "seed2": 0, "is_training": True, **case.attrs})
    problem = rnn_jax._problem(op, case.input, case.input_h, case.input_c, case.params)
    cuda = plans.RNNPlan.from_problem(problem, 0)
    assert cuda.forward_workspace_nbytes < cuda.workspace_nbytes
    assert targets.buffer_sizes(problem, cuda=True, forward=True) == (
        cuda.reserve_nbytes, cuda.forward_workspace_nbytes)
    assert targets.buffer_sizes(problem, cuda=True) == (cuda.reserve_nbytes,
                                                        cuda.workspace_nbytes)


def test_the_forward_custom_call_allocates_forwards_workspace(fake_gpu, monkeypatch):
    """Issue 40, item 7, at the call site: ``rnn``'s trace for a CUDA default device asks
    XLA for the forward's workspace, not backprop's (no device needed: tracing runs
    nothing)."""
    jax = pytest.importorskip("jax")
    from pycudnnrnn import jax as rnn_jax
    from pycudnnrnn.jax import calls as jax_calls
    monkeypatch.setattr(jax_calls, "default_platform", lambda: "gpu")
    monkeypatch.setattr(jax_calls, "has_cuda", lambda: True)
    case = make_case("lstm", num_layers=4, num_units=32, input_size=32, T=16, B=8,
                     dtype=np.float32)
    args = (case.input, case.input_h, case.input_c, case.params)
    jaxpr = jax.make_jaxpr(lambda *a: rnn_jax.rnn(*a, is_training=True))(*args)
    (call,) = [e for e in _equations(jaxpr.jaxpr)
               if e.params.get("target_name") == rnn_jax.FORWARD]
    op = Attributes(**{"seed": 0, "seed2": 0, "is_training": True, **case.attrs})
    plan = plans.RNNPlan.from_problem(rnn_jax._problem(op, *args), 0)
    assert plan.forward_workspace_nbytes < plan.workspace_nbytes
    assert call.params["result_avals"][-1].shape == (plan.forward_workspace_nbytes,)


# ----------------------------------------------------------------- 8: JAX's default device

class _CudaDevice:
    """Stands for a JAX CUDA device (JAX takes an object whose type names a Device as a
    default device): ``local_hardware_id`` is its CUDA ordinal in this process."""

    platform = "gpu"

    def __init__(self, ordinal, id=None):
        self.local_hardware_id, self.id = ordinal, ordinal if id is None else id


_CudaDevice.__name__ = _CudaDevice.__qualname__ = "CudaDevice"


def _jax_on_cuda(monkeypatch):
    jax = pytest.importorskip("jax")
    from pycudnnrnn import jax as rnn_jax
    from pycudnnrnn.jax import calls as jax_calls
    monkeypatch.setattr(jax_calls, "has_cuda", lambda: True)
    return jax, rnn_jax


def _sizes_on(problem, device, forward=False):
    plan = plans.RNNPlan.from_problem(problem, device)
    return plan.reserve_nbytes, plan.forward_workspace_nbytes if forward else \
        plan.workspace_nbytes


def test_trace_time_sizes_are_the_default_devices(fake_gpu, monkeypatch):
    """Under ``jax.default_device(cuda:1)`` the custom calls' reserve space and workspace
    are cuDNN's sizes on cuda:1 (the stand-in's two devices are GPUs of different kinds,
    whose cuDNN asks for different sizes), not on cuda:0: the handler, on cuda:1, would
    find XLA's buffers too small."""
    fake_cuda.DEVICES[0] = 2
    jax, rnn_jax = _jax_on_cuda(monkeypatch)
    case = make_case("lstm", num_layers=2, num_units=8, input_size=4, T=5, B=3,
                     dtype=np.float32)
    op = Attributes(**{"seed": 0, "seed2": 0, "is_training": True, **case.attrs})
    problem = rnn_jax._problem(op, case.input, case.input_h, case.input_c, case.params)
    on_0, on_1 = _sizes_on(problem, 0), _sizes_on(problem, 1)
    assert on_0[0] < on_1[0] and on_0[1] < on_1[1]  # the stand-in's GPUs differ
    with jax.default_device(_CudaDevice(1)):
        assert rnn_jax._buffer_sizes(problem) == on_1
        assert rnn_jax._buffer_sizes(problem, forward=True) == _sizes_on(problem, 1, True)
    with jax.default_device(_CudaDevice(0, id=5)):  # JAX's id is global; the ordinal local
        assert rnn_jax._buffer_sizes(problem) == on_0


def test_trace_time_sizes_without_a_default_device_are_the_first_local_ones(fake_gpu,
                                                                           monkeypatch):
    """No ``jax.default_device``: JAX's default is its first local device, which need not
    be cuda:0 (a process of a multi-process job on one host); the sizes are its."""
    fake_cuda.DEVICES[0] = 2
    jax, rnn_jax = _jax_on_cuda(monkeypatch)
    monkeypatch.setattr(rnn_jax.calls, "default_platform", lambda: "gpu")
    monkeypatch.setattr(jax, "local_devices", lambda backend=None: [_CudaDevice(1, id=3)])
    case = make_case("gru", "bidirectional", num_units=6, input_size=3, T=4, B=2,
                     dtype=np.float32)
    op = Attributes(**{"seed": 0, "seed2": 0, "is_training": True, **case.attrs})
    problem = rnn_jax._problem(op, case.input, case.input_h, None, case.params)
    assert jax.config.jax_default_device is None
    assert rnn_jax._buffer_sizes(problem) == _sizes_on(problem, 1) != _sizes_on(problem, 0)


# ----------------------------------------------------------------- 8: the last call's inputs

def _foreign_call(case, device=0):
    """A functional-API call on another library's arrays on `device`; weak references to
    them (the caller drops its own)."""
    import weakref
    cp = _cp()
    with cp.cuda.Device(device):
        arrays = [fake_cuda.FakeFrameworkArray(a) for a in _on_device(case)]
    out = pycudnnrnn.forward(*arrays, case.sequence_lengths, **case.attrs)
    return out, [weakref.ref(a) for a in arrays]


def _released():
    """After the GPU ran the work: let the library's background release (if any) finish."""
    from pycudnnrnn.cuda import waiter
    waiter.wait_released()
    gc.collect()


@pytest.mark.parametrize("device", [0, 1])
def test_one_call_on_another_librarys_arrays_releases_them_once_its_work_is_done(fake_gpu,
                                                                                 device):
    """A process makes one call on JAX-like arrays (on cuda:`device`, cuda:0 current)
    and waits for the GPU: the arrays are released once the work that reads them is
    done, with no later call (they used to be held until the next one). Not before:
    their library would reuse their memory under the queued work."""
    fake_cuda.DEVICES[0] = 2
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", num_units=8)
    out, refs = _foreign_call(case, device)
    gc.collect()
    assert all(r() is not None for r in refs)  # the work is still queued: kept
    fake_cuda.synchronize_all()  # the GPU is done (the caller waits for its results)
    _released()
    assert [r() for r in refs] == [None] * len(refs)
    with _cp().cuda.Device(device):
        _close(fake_cuda.to_host(out[0]), case.forward()[0])


@pytest.mark.parametrize("mode", [fake_cuda.CAPTURE_GLOBAL, fake_cuda.CAPTURE_RELAXED])
def test_a_capture_of_a_call_on_another_librarys_arrays_queries_no_event(fake_gpu, mode):
    """A call on JAX-like arrays, its work still queued, then a CuPy capture (global mode,
    as ``torch.cuda.graph``'s default) of another such call: nothing queries the first
    call's event (refused in global mode; it invalidated the capture), nothing waits
    on an event recorded in the capture, and the replay computes from the new input."""
    cp = _cp()
    case = make_case("gru", lengths="ragged", num_units=5)
    _foreign_call(case)  # in flight
    x, h, _, w = [fake_cuda.FakeFrameworkArray(a) for a in _on_device(case)]
    pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs)
    fake_cuda.synchronize_all()  # the plan built, its uploads done
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture(mode=mode)
        y = pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs)[0]
        graph = stream.end_capture()
    _foreign_call(case)  # a later eager call
    new_x = np.random.default_rng(11).standard_normal(case.input.shape)
    with stream:
        x.array[...] = fake_cuda._device(new_x)
        graph.launch(stream)
        _close(fake_cuda.to_host(y), _expected(case, new_x)[0])
    fake_cuda.synchronize_all()
    _released()


# ----------------------------------------------------------------- issue 47: one owner
# Review 3 (2026-12-07), findings 2, 5, 6, 7 and 8: every block the GPU path hands to
# cuDNN is released through ``pycudnnrnn.cuda.lifetime.Lifetime``, which knows every
# stream that used it (by CUDA's identity), the streams it was made on and the graphs
# that replay it.

def _filled(cp, sizes, value, stream=None):
    """Arrays of `sizes` bytes filled with `value` on `stream` (the current one if None):
    they take whatever blocks the pool has freed there."""
    with stream if stream is not None else cp.cuda.get_current_stream():
        blocks = [cp.empty(n, cp.uint8) for n in sizes]
        for b in blocks:
            b[...] = value
    return blocks


def _changed(blocks, value):
    """How many of `blocks` no longer hold only `value` (read after their stream's work)."""
    return sum(bool((fake_cuda.to_host(b) != value).any()) for b in blocks)


def test_a_cupy_capture_on_cupys_pool_keeps_the_calls_temporaries(fake_gpu):
    """Finding 2: a CuPy capture (``Stream.begin_capture``) of the functional API on
    CuPy's default pool. cuDNN's workspace and the padded copies are the call's
    temporaries: they must not go back to the pool, where the next allocations on the
    stream would take them and every replay would write into those."""
    cp = _cp()
    case = make_case("gru", "bidirectional", lengths="ragged", num_units=8)
    x, h, _, w = _on_device(case)
    lengths = case.sequence_lengths
    pycudnnrnn.forward(x, h, None, w, lengths, **case.attrs)  # built and run eagerly
    fake_cuda.synchronize_all()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()  # CuPy's default: relaxed, on CuPy's default pool
        y = pycudnnrnn.forward(x, h, None, w, lengths, **case.attrs)[0]
        graph = stream.end_capture()
    junk = _filled(cp, range(512, 64 * 1024 + 1, 512), 0x5A, stream)
    new_x = np.random.default_rng(5).standard_normal(case.input.shape)
    with stream:
        x[...] = fake_cuda._device(new_x)
        graph.launch(stream)
        assert _changed(junk, 0x5A) == 0
        _close(fake_cuda.to_host(y), _expected(case, new_x)[0])
    from pycudnnrnn.cuda import lifetime
    assert lifetime.pinned_bytes() > 0  # the temporaries' private pool, counted


def test_a_seeds_dropout_states_outlive_a_forward_queued_on_another_stream(fake_gpu):
    """Finding 6: a seed's states made on the null stream, drawn by a second plan's
    forward still queued on its home H, then both plans dropped and the caches cleared.
    The states' blocks go back to the null stream's arena: they must not be handed out
    there before H's forward, which writes its RNG state into them, is done."""
    cp = _cp()
    case = make_case("lstm", num_units=6, dropout=0.5)
    x, h, c, w = _on_device(case)
    size = dict(num_layers=1, num_units=6, input_size=3, max_time=4, batch_size=3,
                dtype="float64", device="cuda", dropout=0.5, seed=7)
    first = pycudnnrnn.RNNPlan(**size)  # makes the seed's states, on the null stream
    states = first._executor.rnn.dropout.states
    nbytes = states.buffer.nbytes
    fake_cuda.synchronize_all()
    home = cp.cuda.Stream(non_blocking=True)
    with home:
        second = pycudnnrnn.RNNPlan(**size, sequence_lengths=[4, 2, 3])  # the same states
        assert second._executor.rnn.dropout.states is states
        second.forward(x, h, c, w)  # queued on H
    del first, second, states
    plans.clear_caches()
    gc.collect()
    junk = _filled(cp, [nbytes] * 6, 0x5A)  # on the null stream, where they were made
    home.synchronize()
    assert _changed(junk, 0x5A) == 0
    _released()


def test_a_dropped_captured_graph_does_not_free_its_plans_under_a_queued_replay(fake_gpu):
    """Finding 8: ``graphs.capture`` of a ragged plan, one replay queued, then the graph
    and the plan dropped (a function returning after its last replay). The plan's
    lengths and masks must not be handed out on its home stream before the replay that
    reads them is done."""
    from pycudnnrnn import graphs
    cp = _cp()
    case = make_case("lstm", "bidirectional", lengths="ragged", num_units=8)
    x, h, c, w = _on_device(case)
    plan = pycudnnrnn.RNNPlan(num_layers=1, num_units=8, input_size=3, max_time=4,
                              batch_size=3, sequence_lengths=case.sequence_lengths,
                              dtype="float64", device="cuda", direction="bidirectional")
    captured = graphs.capture(lambda: plan.forward(x, h, c, w)[0])
    stream, y = captured.stream, captured.outputs
    new_x = np.random.default_rng(3).standard_normal(case.input.shape)
    with stream:
        x[...] = fake_cuda._device(new_x)
        captured.replay()  # queued
    executor = weakref.ref(plan._executor)
    del captured, plan
    gc.collect()
    assert executor() is None  # let go of: only its blocks wait for the replay
    junk = _filled(cp, range(64, 8192, 64), 0x7F)  # the home stream's freed blocks
    with stream:
        got = fake_cuda.to_host(y)
    _close(got, _expected(case, new_x)[0])
    assert _changed(junk, 0x7F) == 0
    _released()


def _ragged_plan(case, **extra):
    return pycudnnrnn.RNNPlan(num_layers=1, num_units=8, input_size=3, max_time=4,
                              batch_size=3, sequence_lengths=case.sequence_lengths,
                              dtype="float64", direction="bidirectional", **extra)


def test_a_plan_built_on_one_threads_default_stream_waits_for_its_uploads_on_anothers(
        per_thread_gpu):
    """Finding 5: with CuPy's per-thread default stream, thread A builds a ragged plan
    (its uploads queued on A's stream, behind work queued there) and thread B runs it at
    once. Both streams are pointer 2, but they are two streams: B's run must wait for
    A's uploads (its lengths and masks), or cuDNN reads them before they are there."""
    case = make_case("lstm", "bidirectional", lengths="ragged", num_units=8)
    x, h, c, w = _on_device(case)
    fake_cuda._submit(2, lambda: None)  # work queued on A's stream before the build
    plan = _ragged_plan(case, device="cuda")
    got = on_thread(lambda: fake_cuda.to_host(plan.forward(x, h, c, w)[0]))
    _close(got, case.forward()[0])


def test_a_plan_run_on_another_threads_default_stream_is_freed_behind_that_run(
        per_thread_gpu):
    """Finding 5: a plan built on thread A (its home: A's per-thread stream), run on
    thread B's (work still queued there), then dropped. B's run is a use on another
    stream, though both are pointer 2: the plan's blocks must not go to the next
    allocations on A's stream before B's run is done."""
    cp = _cp()
    case = make_case("lstm", "bidirectional", lengths="ragged", num_units=8)
    x, h, c, w = _on_device(case)
    plan = _ragged_plan(case, device="cuda")
    cp.cuda.get_current_stream().synchronize()  # the uploads are there: only the free races

    def run_on_b():
        y = plan.forward(x, h, c, w)[0]  # queued on B's stream
        return y, cp.cuda.get_current_stream().record()
    y, done_on_b = on_thread(run_on_b)
    executor = weakref.ref(plan._executor)
    del plan
    gc.collect()
    assert executor() is None
    junk = _filled(cp, range(64, 8192, 64), 0x7F)  # on A's stream, the plan's home
    done_on_b.synchronize()
    _close(fake_cuda.to_host(y), case.forward()[0])
    assert _changed(junk, 0x7F) == 0
    _released()


def test_dropout_forwards_on_two_threads_default_streams_draw_in_order(per_thread_gpu):
    """Finding 5: a seed's dropout states drawn by a forward queued on thread A's
    per-thread stream, then restarted and drawn on thread B's: B's must wait for A's
    (both pointer 2), so that each draws the seed's first masks."""
    case = make_case("lstm", num_layers=2, num_units=6)
    x, h, c, w = _on_device(case)
    plan = pycudnnrnn.RNNPlan(num_layers=2, num_units=6, input_size=3, max_time=4,
                              batch_size=3, dtype="float64", device="cuda", dropout=0.5,
                              seed=4705)
    arrays = dict(input=x, input_h=h, input_c=c, params=w)
    first = fake_cuda.to_host(plan.run_forward(arrays, restart_dropout=True)[0])
    on_a = plan.run_forward(arrays, restart_dropout=True)[0]  # queued on A's stream
    cp = _cp()

    def forward_on_b():
        y = plan.run_forward(arrays, restart_dropout=True)[0]  # queued on B's stream
        return y, cp.cuda.get_current_stream().record()
    on_b, done_on_b = on_thread(forward_on_b)
    _close(fake_cuda.to_host(on_a), first, "on A")
    done_on_b.synchronize()
    _close(fake_cuda.to_host(on_b), first, "on B")


def test_a_plan_on_device_1_dropped_with_device_0_current_is_freed_behind_its_runs(fake_gpu):
    """Finding 7: a ragged plan on device 1 whose home is device 1's legacy stream
    (pointer 0), run on a device-1 side stream behind queued work, then dropped while
    device 0 is current. Pointer 0 there names device 0's legacy stream: whatever orders
    the blocks' release must not name it. Device 1's legacy stream then allocates and
    fills blocks: none may be the plan's while the side stream's run is queued."""
    cp = _cp()
    fake_cuda.DEVICES[0] = 2
    fake_cuda.PER_THREAD_DEFAULT_STREAM[0] = False  # the legacy default, in any run
    case = make_case("lstm", "bidirectional", lengths="ragged", num_units=8)
    with cp.cuda.Device(1):
        x, h, c, w = _on_device(case)
        plan = _ragged_plan(case, device="cuda:1")
        assert cp.cuda.get_current_stream().ptr == 0  # the plan's home: the legacy stream
        side = cp.cuda.Stream(non_blocking=True)
        with side:
            fake_cuda._submit(side.ptr, lambda: None)  # queued work ahead of the run
            y = plan.forward(x, h, c, w)[0]
    with cp.cuda.Device(0):
        executor = weakref.ref(plan._executor)
        del plan
        gc.collect()
        assert executor() is None
    with cp.cuda.Device(1):
        junk = _filled(cp, range(64, 8192, 64), 0x7F)  # device 1's legacy stream
        with side:
            got = fake_cuda.to_host(y)
        _close(got, case.forward()[0])
        assert _changed(junk, 0x7F) == 0
    _released()


def test_a_graph_on_device_1_dropped_with_device_0_current_lets_its_plans_go(fake_gpu):
    """Finding 7's kin: a ``graphs.capture`` on device 1, its replay queued, dropped with
    device 0 current. Its finaliser records its release event on the graph's stream, a
    device-1 stream: an event made on device 0 cannot be recorded there (CUDA's
    cudaErrorInvalidResourceHandle), and the plans were then kept for good. They must be
    let go of once the replay is done, and not before."""
    from pycudnnrnn.cuda import graphs
    cp = _cp()
    fake_cuda.DEVICES[0] = 2
    case = make_case("lstm", "bidirectional", lengths="ragged", num_units=8)
    with cp.cuda.Device(1):
        x, h, c, w = _on_device(case)
        plan = _ragged_plan(case, device="cuda:1")
        captured = graphs.capture(lambda: plan.forward(x, h, c, w)[0])
        stream, y = captured.stream, captured.outputs
        with stream:
            captured.replay()  # queued
    executor = weakref.ref(plan._executor)
    kept = len(graphs._never_released)
    with cp.cuda.Device(0):
        del captured, plan
        gc.collect()
    assert len(graphs._never_released) == kept  # not kept for good
    with cp.cuda.Device(1):
        junk = _filled(cp, range(64, 8192, 64), 0x7F)  # device 1's legacy stream, the home
        with stream:
            _close(fake_cuda.to_host(y), case.forward()[0])
        assert _changed(junk, 0x7F) == 0
    _released()
    assert executor() is None


# ----------------------------------------------------------------- review 3, finding 3: built in a capture

CAPTURE_MODES = [fake_cuda.CAPTURE_RELAXED, fake_cuda.CAPTURE_GLOBAL]


@pytest.mark.parametrize("mode", CAPTURE_MODES)
def test_a_plan_first_built_during_a_capture_is_built_outside_it(fake_gpu, mode):
    """A configuration no call has used, first called inside ``s.begin_capture(mode)``
    (no warm-up). Its uploads were captured, not run, and CuPy's ``asarray`` queried an
    event recorded in the capture (refused; in global mode the capture was lost). Now
    the plan is built on a private stream: the capture ends, an eager run on `s` before
    any replay, the replay and an eager run on another stream all equal the CPU."""
    cp = _cp()
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", num_units=5)
    x, h, c, w = _on_device(case)
    lengths = case.sequence_lengths
    s, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture(mode=mode)
        y = pycudnnrnn.forward(x, h, c, w, lengths, **case.attrs)[0]
        graph = s.end_capture()
        eager = pycudnnrnn.forward(x, h, c, w, lengths, **case.attrs)[0]
        _close(fake_cuda.to_host(eager), case.forward()[0], "eager on s, before a replay")
        new_x = np.random.default_rng(47).standard_normal(case.input.shape)
        x[...] = fake_cuda._device(new_x)
        graph.launch(s)
        _close(fake_cuda.to_host(y), _expected(case, new_x)[0], "the replay")
    with other:
        eager = pycudnnrnn.forward(x, h, c, w, lengths, **case.attrs)[0]
        _close(fake_cuda.to_host(eager), _expected(case, new_x)[0], "eager on another stream")
    assert fake_cuda.streams._thread_capture_mode() == fake_cuda.CAPTURE_GLOBAL  # put back


@pytest.mark.parametrize("mode", CAPTURE_MODES)
def test_a_seeds_dropout_states_first_made_during_a_capture_are_made_outside_it(fake_gpu,
                                                                                  mode):
    """A training forward with dropout whose seed no live plan holds, first called
    inside a capture: the states' initialising kernel and the copy of them were captured
    (the replay would draw from uninitialised states) and their event recorded in the
    capture. Now they are made on a private stream: the first replay draws the seed's
    first masks, as a first eager forward does, and eager forwards after it, on `s` and
    on another stream, draw the second and third."""
    from pycudnnrnn.cuda import resources
    cp = _cp()
    seed = 4703 + mode  # a seed of this test's own: a captured plan is pinned, its states too
    case = make_case("gru", num_layers=2, lengths="ragged", num_units=5, dropout=0.5)
    attrs = dict(case.attrs, seed=seed)
    x, h, _, w = _on_device(case)
    lengths = case.sequence_lengths

    def forward():
        return pycudnnrnn.forward(x, h, None, w, lengths, **attrs)[0]

    want = [fake_cuda.to_host(forward()) for _ in range(3)]  # a fresh seed's draws
    assert not np.array_equal(want[0], want[1])
    plans.clear_caches()
    gc.collect()
    assert not [s for s in resources.LIVE_DROPOUT_STATES if s.seed == seed]
    s, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture(mode=mode)
        y = forward()
        graph = s.end_capture()
        graph.launch(s)
        _close(fake_cuda.to_host(y), want[0], "the first replay")
        _close(fake_cuda.to_host(forward()), want[1], "eager on s")
    with other:
        _close(fake_cuda.to_host(forward()), want[2], "eager on another stream")


def test_a_plan_built_during_a_capture_frees_its_blocks_behind_its_runs(fake_gpu):
    """Built during a capture, the plan's blocks come from the private build stream's
    arena of the pool, and go back there: that stream is its home, so when the plan
    dies it waits for the plan's run still queued on `s` before the blocks are handed
    out again (the junk below would otherwise land in its lengths and masks)."""
    from pycudnnrnn.cuda import building
    cp = _cp()
    case = make_case("lstm", num_layers=2, lengths="ragged", num_units=6)
    args = _on_device(case)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        plan = pycudnnrnn.RNNPlan(num_layers=2, num_units=6, input_size=3, max_time=4,
                                  batch_size=3, sequence_lengths=case.sequence_lengths,
                                  dtype="float64", device="cuda")
        s.end_capture()
        y = plan.forward(*args)[0]  # queued on s
    del plan
    gc.collect()
    with building._streams[0]:
        junk = _reuse_freed_memory(cp)
    with s:
        _close(fake_cuda.to_host(y), case.forward()[0])
    assert junk


def test_a_plan_that_cannot_be_built_outside_a_capture_says_to_warm_up(fake_gpu,
                                                                        monkeypatch):
    """Without a way to relax this thread's capture mode (no CUDA driver library), a
    first call inside a capture is refused, with a message that names the warm-up."""
    from pycudnnrnn.core import driver
    cp = _cp()
    monkeypatch.delattr(cp.cuda.runtime, "threadExchangeStreamCaptureMode")
    monkeypatch.setattr(driver, "_load", lambda: None)
    case = make_case("gru", lengths="ragged", num_units=5)
    x, h, _, w = _on_device(case)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture(mode=fake_cuda.CAPTURE_GLOBAL)
        with pytest.raises(RuntimeError, match="before the capture .a warm-up"):
            pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs)
        s.end_capture()


# ----------------------------------------------------------------- issue 47: a review of the fixes
# An independent review of this round's lifetime code (2026-12-07) found these.

def test_a_failed_capture_keeps_its_plan_behind_the_queued_warm_up(fake_gpu):
    """``graphs.capture`` of a function that raises after a plan's run: no graph is made,
    so no graph's release event covers the eager warm-up still queued on the capture's
    stream. Dropping the plan must not free its lengths under that warm-up."""
    from pycudnnrnn import graphs
    cp = _cp()
    case = make_case("lstm", "bidirectional", lengths="ragged", num_units=8)
    x, h, c, w = _on_device(case)
    plan = _ragged_plan(case, device="cuda")
    plan.forward(x, h, c, w)
    fake_cuda.synchronize_all()
    out = []

    def step():
        out.append(plan.forward(x, h, c, w)[0])
        raise KeyError("the user's function fails after the run")

    with pytest.raises(KeyError):
        graphs.capture(step)
    executor = weakref.ref(plan._executor)
    del plan
    gc.collect()
    assert executor() is None
    junk = _filled(cp, range(64, 8192, 64), 0x7F)  # home's freed blocks, reused at once
    fake_cuda.synchronize_all()  # the warm-up runs now
    _close(np.array(np.asarray(out[0]).view(np.ndarray)), case.forward()[0])
    assert junk
    _released()


@pytest.mark.parametrize("allocator", ["cupy's pool", "an application's pool"])
def test_a_cupy_capture_keeps_the_calls_temporaries_whatever_the_allocator(fake_gpu,
                                                                          allocator):
    """An application-wide allocator other than CuPy's default pool (RMM's, a pool of its
    own) hands a captured call's temporaries to its next arrays as CuPy's pool does:
    they must come from a private pool, and the replay must write into none of them."""
    cp = _cp()
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", num_units=8)
    x, h, c, w = _on_device(case)
    lengths = case.sequence_lengths
    pool = cp.get_default_memory_pool() if allocator == "cupy's pool" \
        else fake_cuda.FakeMemoryPool()
    s = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.using_allocator(pool.malloc), s:
        pycudnnrnn.forward(x, h, c, w, lengths, **case.attrs)  # warm-up
        s.begin_capture()
        y = pycudnnrnn.forward(x, h, c, w, lengths, **case.attrs)[0]
        graph = s.end_capture()
        junk = _filled(cp, range(64, 16384, 64), 0x7F)
        new_x = np.random.default_rng(5).standard_normal(case.input.shape)
        x[...] = fake_cuda._device(new_x)
        graph.launch(s)
        _close(fake_cuda.to_host(y), _expected(case, new_x)[0])
        assert _changed(junk, 0x7F) == 0


def test_a_graph_safe_allocator_keeps_the_calls_temporaries_itself(fake_gpu, monkeypatch):
    """An allocator registered with ``graphs.keeps_blocks_for_graphs`` (PyTorch's, for the
    torch ops) serves a captured call as it is: no private pool is pinned for it."""
    from pycudnnrnn import graphs
    from pycudnnrnn.cuda import lifetime
    cp = _cp()
    pool = fake_cuda.FakeMemoryPool(counter="application_alloc")
    monkeypatch.setattr(lifetime, "_graph_safe_allocators", [lambda a: a is pool.malloc])
    case = make_case("gru", lengths="ragged", num_units=5)
    x, h, _, w = _on_device(case)
    s = cp.cuda.Stream(non_blocking=True)
    before = graphs.pinned_bytes()
    with cp.cuda.using_allocator(pool.malloc), s:
        pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs)
        taken = fake_cuda.COUNTS["application_alloc"]
        s.begin_capture()
        pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs)
        s.end_capture()
    assert graphs.pinned_bytes() == before
    assert fake_cuda.COUNTS["application_alloc"] > taken  # the call took its blocks there
