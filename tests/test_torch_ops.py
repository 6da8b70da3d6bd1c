"""The torch.library ops: registration, fakes, torch.compile, torch.export, dropout, CUDA graphs.

Compile tests are few and small (each compile costs seconds on two cores).
"""

import pytest

torch = pytest.importorskip("torch")

import pycudnnrnn  # noqa: E402
import pycudnnrnn.torch as prt  # noqa: E402

T, B, I, H = 5, 3, 4, 6


def _op_args(mode="lstm", num_proj=0, is_training=True, dropout=0.0, lengths=(5, 0, 2)):
    torch.manual_seed(0)
    L, D = 2, 2
    P = num_proj or H
    n = pycudnnrnn.params_size(rnn_mode=mode, num_layers=L, num_units=H, input_size=I,
                               direction="bidirectional", num_proj=num_proj)
    grad = dict(dtype=torch.float64, requires_grad=True)
    x = torch.randn(B, T, I, **grad)
    h = torch.randn(B, L * D, P, **grad)
    c = torch.randn(B, L * D, H, **grad) if mode == "lstm" else None
    params = (torch.rand(n, dtype=torch.float64) - 0.5).requires_grad_()
    lengths = None if lengths is None else torch.tensor(lengths)
    return (x, h, c, params, lengths, torch.tensor(12345), mode, "linear_input", "bidirectional",
            dropout, num_proj, False, is_training)


@pytest.mark.parametrize("mode,num_proj,dropout", [("lstm", 2, 0.5), ("gru", 0, 0.0)])
def test_opcheck_forward_and_backprop(mode, num_proj, dropout):
    args = _op_args(mode, num_proj, dropout=dropout)
    torch.library.opcheck(torch.ops.pycudnnrnn.forward.default, args)
    out, out_h, out_c, reserve = torch.ops.pycudnnrnn.forward(*args)
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args[:6]]
    grads = [torch.randn_like(t) for t in (out, out_h, out_c)]
    for gradients in ("all", "data", "weights"):
        torch.library.opcheck(torch.ops.pycudnnrnn.backprop.default,
                              (*detached, out.detach(), out_h.detach(), out_c.detach(), *grads,
                               reserve, *args[6:12], gradients))


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_relu"])
@pytest.mark.parametrize("is_training", [True, False])
def test_fake_gives_the_real_shapes_and_reserve_size(mode, is_training):
    from torch._subclasses.fake_tensor import FakeTensorMode
    args = _op_args(mode, dropout=0.3, is_training=is_training)
    real = torch.ops.pycudnnrnn.forward(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as fake_mode:
        fake_args = [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = torch.ops.pycudnnrnn.forward(*fake_args)
    for r, f in zip(real, fake):
        assert (tuple(r.shape), r.dtype) == (tuple(f.shape), f.dtype)
    assert (real[3].numel() > 0) == is_training


def test_the_ops_take_an_optional_seed_tensor_and_none_without_dropout():
    """Seed and lengths are tensors (graph inputs: plain torch.compile takes new values
    without recompiling); the seed is optional, and a call that draws no dropout mask
    passes None, so that without lengths the call holds no CPU tensor at all (CUDA-graph
    trees skip graphs with one)."""
    for name in ("forward", "forward_weights", "backprop", "backprop_weights"):
        schema = getattr(torch.ops.pycudnnrnn, name).default._schema
        types = {a.name: str(a.type) for a in schema.arguments}
        assert (types["seed"], types["sequence_lengths"]) == ("Optional[Tensor]",
                                                              "Optional[Tensor]"), name
    seen = []
    forward_weights = prt.ops.forward_weights
    forward = prt.ops.forward

    def record(op):
        return lambda *args: seen.append(args) or op(*args)

    x = torch.randn(T, B, I)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prt.ops, "forward_weights", record(forward_weights))
        patch.setattr(prt.ops, "forward", record(forward))
        patch.setattr(torch.compiler, "is_compiling", lambda: True)  # the op's own door
        torch.manual_seed(0)
        prt.LSTM(I, H, num_layers=2)(x)  # training, no dropout
        prt.LSTM(I, H, num_layers=2, dropout=0.5).eval()(x)  # eval: no mask
        prt.LSTM(I, H, dropout=0.0)(x)
        prt.CudnnRNN(I, H, 1, rnn_mode="gru", dropout=0.5)(x)  # one layer: no mask
        args = _op_args("gru", dropout=0.5, lengths=None)
        prt.rnn(*args[:4], rnn_mode="gru", direction="bidirectional", dropout=0.5,
                is_training=False, time_major=False)
        assert len(seen) == 5
        for call in seen:  # no tensor but the data and weights (args 0-3)
            assert not [a for a in call[4:] if isinstance(a, torch.Tensor)], call[4:]
            assert (call[5:7] if isinstance(call[3], list) else call[4:6]) == (None, None)
        seen.clear()
        prt.LSTM(I, H, num_layers=2, dropout=0.5)(x)  # a mask: a fresh CPU seed tensor
        prt.rnn(*args[:4], rnn_mode="gru", direction="bidirectional", dropout=0.5,
                seed=3, time_major=False)
        for call in seen:
            seed = call[6] if isinstance(call[3], list) else call[5]
            assert seed.shape == () and seed.dtype == torch.int64 and seed.device.type == "cpu"


def test_without_a_gpu_to_ask_the_cuda_fake_leaves_the_reserve_size_to_run_time():
    """Tracing for CUDA on a PyTorch without CUDA (torch.export, say): cuDNN's reserve
    size needs the GPU, so it is a size known only at run time."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    args = _op_args("lstm", num_proj=2)
    with FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True):
        on_cuda = [torch.empty(a.shape, dtype=a.dtype, device="cuda")
                   if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        output, output_h, output_c, reserve = torch.ops.pycudnnrnn.forward(*on_cuda)
    assert output.shape == (B, T, 2 * 2) and output.device.type == "cuda"
    assert output_h.shape == on_cuda[1].shape and output_c.shape == on_cuda[2].shape
    assert reserve.dtype == torch.uint8 and isinstance(reserve.shape[0], torch.SymInt)


def test_the_fake_raises_the_api_errors_while_tracing():
    args = list(_op_args("gru"))
    args[1] = args[1][:, :1]  # one pseudo-layer for a bidirectional RNN
    # Dynamo wraps it in its own error; the message is the API's ValueError.
    with pytest.raises(Exception, match="ValueError.*input_h: expected shape .* with L·D a "
                                        "positive multiple"):
        torch.compile(lambda *a: torch.ops.pycudnnrnn.forward(*a), backend="aot_eager",
                      fullgraph=True)(*args)


def test_backward_honours_needs_input_grad():
    x, h, c, params, lengths, seed, *attrs = _op_args("lstm")
    h.requires_grad_(False), c.requires_grad_(False)
    out = torch.ops.pycudnnrnn.forward(x, h, c, params.detach(), lengths, seed, *attrs)
    (dx,) = torch.autograd.grad(out[0].sum(), [x])
    assert dx.shape == x.shape and bool(dx[1].eq(0).all())  # the empty sequence


# --------------------------------------------------------------------------- compile, export

class _Tagger(torch.nn.Module):
    """A small model around the drop-in LSTM."""

    def __init__(self, dropout=0.0):
        super().__init__()
        self.rnn = prt.LSTM(I, H, num_layers=2, batch_first=True, bidirectional=True,
                            proj_size=3, dropout=dropout, dtype=torch.float64)
        self.head = torch.nn.Linear(6, 2, dtype=torch.float64)

    def forward(self, x):
        out, (h, c) = self.rnn(x)
        return self.head(out).sum() + h.square().sum() + c.mean()


def _loss_and_grads(model, function, x):
    model.zero_grad()
    x = x.detach().requires_grad_()
    loss = function(x)
    loss.backward()
    return loss.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


def test_compile_fullgraph_aot_eager_equals_eager_and_takes_a_new_mask_without_recompiling():
    from torch._dynamo.testing import CompileCounterWithBackend
    # Dynamo's default, which graph-breaks on nn.LSTM itself; the drop-in (an RNNBase
    # subclass) traces with it.
    assert torch._dynamo.config.allow_rnn is False
    assert isinstance(_Tagger().rnn, torch.nn.RNNBase)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Tagger()
    x = torch.randn(B, T, I, dtype=torch.float64)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    eager = _loss_and_grads(model, model, x)
    ours = _loss_and_grads(model, compiled, x)
    torch.testing.assert_close(ours, eager, rtol=1e-12, atol=1e-12)

    model.rnn.dropout = 0.5  # a mask per step: new seeds must not mean new graphs
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    losses = [compiled(x).item() for _ in range(3)]
    assert len(set(losses)) == 3 and counter.frame_count == 1
    torch.manual_seed(7)
    first = compiled(x).item()
    torch.manual_seed(7)
    assert compiled(x).item() == first
    model.eval()
    with torch.no_grad():  # eager on PyTorch's kernels, compiled on the op's: ulps apart
        assert compiled(x).item() == pytest.approx(model(x).item(), rel=1e-12) and \
            compiled(x).item() == compiled(x).item()


def test_ragged_batches_compile_through_sequence_lengths_and_equal_packing():
    """PackedSequence does not trace; sequence_lengths= on the drop-in does, with the same
    result as packing with torch.nn."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    torch._dynamo.reset()
    torch.manual_seed(0)
    reference = torch.nn.GRU(I, H, 2, batch_first=True, bidirectional=True,
                             dtype=torch.float64)
    model = prt.GRU.from_torch(reference)
    x = torch.randn(B, T, I, dtype=torch.float64)
    lengths = torch.tensor([2, 5, 3])
    compiled = torch.compile(lambda x, n: model(x, sequence_lengths=n), backend="aot_eager",
                             fullgraph=True)
    out, h_n = compiled(x, lengths)
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out_ref, h_ref = reference(packed)
    out_ref = pad_packed_sequence(out_ref, batch_first=True, total_length=T)[0]
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_n, h_ref, rtol=1e-12, atol=1e-12)


def test_plain_compile_takes_fresh_seeds_and_new_lengths_in_one_graph():
    """Default torch.compile (inductor, fullgraph=False): a seed or lengths given to the
    ops as host values (an int, a list) made Dynamo break the graph (``.item()``,
    ``.tolist()``) and compile again for new values. As tensors they are graph inputs:
    a training step with dropout, called four times, and a module called with five sets
    of lengths each make one graph, with no break."""
    from torch._dynamo.utils import counters
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    def compiled_once(fn, calls):
        torch._dynamo.reset()
        counters.clear()
        with inductor_config.patch(fx_graph_cache=False), \
                functorch_config.patch(enable_autograd_cache=False):
            results = [fn(*args) for args in calls]
        assert dict(counters["graph_break"]) == {}
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
        return results

    torch.manual_seed(0)
    model = prt.LSTM(I, H, num_layers=2, dropout=0.5)
    model.train()
    x = torch.randn(T, B, I)
    loss = torch.compile(lambda x: model(x)[0].square().sum())

    def step(x):
        model.zero_grad(set_to_none=True)
        value = loss(x)
        value.backward()
        return value.item(), model.weight_ih_l1.grad.clone()

    steps = compiled_once(step, [(x,)] * 4)
    assert len({value for value, _ in steps}) == 4  # a fresh mask each step
    assert all(grad.abs().sum() > 0 for _, grad in steps)

    model = prt.LSTM(I, H)
    forward = torch.compile(lambda x, lengths: model(x, sequence_lengths=lengths)[0])
    lengths = [[5, 3, 1], [2, 2, 2], [5, 0, 4], [1, 5, 5], [3, 4, 0]]
    outputs = compiled_once(forward, [(x, torch.tensor(n)) for n in lengths])
    for n, out in zip(lengths, outputs):
        torch.testing.assert_close(out, model(x, sequence_lengths=torch.tensor(n))[0])


def test_compile_fullgraph_inductor_equals_eager_and_draws_reproducible_masks():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = prt.GRU(I, H, 2, dropout=0.5, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64)

    def step(x):
        return torch.tanh(model(x)[0]).sum()

    compiled = torch.compile(step, fullgraph=True)  # default backend: inductor
    # Inductor's on-disk caches do not key on an op's fake: a graph cached with another
    # version of this library would keep that version's sizes. Compile afresh.
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    with inductor_config.patch(fx_graph_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):
        torch.manual_seed(5)
        first, second = compiled(x).item(), compiled(x).item()
        torch.manual_seed(5)
        assert compiled(x).item() == first != second  # fresh masks, reproducible
        model.eval()
        ours = _loss_and_grads(model, compiled, x)
    torch.testing.assert_close(ours, _loss_and_grads(model, step, x), rtol=1e-12, atol=1e-12)


def test_export_of_a_model_runs_and_equals_eager():
    torch.manual_seed(0)
    model = _Tagger().eval()
    x = torch.randn(B, T, I, dtype=torch.float64)
    program = torch.export.export(model, (x,))
    assert "torch.ops.pycudnnrnn.forward_weights.default" in program.graph_module.code
    other = torch.randn(B, T, I, dtype=torch.float64)
    torch.testing.assert_close(program.module()(other), model(other), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- dropout

@pytest.mark.parametrize("make", [
    lambda: prt.LSTM(I, H, num_layers=3, dropout=0.5, dtype=torch.float64),
    lambda: prt.CudnnRNN(I, H, 3, rnn_mode="gru", dropout=0.5, seed=3, dtype=torch.float64)],
    ids=["LSTM", "CudnnRNN"])
def test_dropout_fresh_per_step_reproducible_by_manual_seed_and_off_in_eval(make):
    torch.manual_seed(0)
    model = make()
    x = torch.randn(T, B, I, dtype=torch.float64)
    first, second = model(x)[0], model(x)[0]
    assert not torch.equal(first, second)  # a new mask each training step
    torch.manual_seed(11)
    again = model(x)[0]
    torch.manual_seed(11)
    torch.testing.assert_close(model(x)[0], again, rtol=0, atol=0)
    model.eval()
    torch.manual_seed(11)
    evaluated = model(x)[0]
    model.dropout = 0.0
    model.train()
    torch.testing.assert_close(model(x)[0], evaluated, rtol=0, atol=0)


def test_dropout_gradient_uses_the_forward_mask():
    torch.manual_seed(0)
    model = prt.RNN(I, H, num_layers=2, dropout=0.4, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)

    def function(x):
        torch.manual_seed(3)  # the same mask at every evaluation of gradcheck
        return model(x)[0]

    assert torch.autograd.gradcheck(function, (x,), eps=1e-6, atol=1e-7)


def test_cudnn_rnn_eval_backward_gives_input_gradients():
    model = prt.CudnnRNN(I, H, 2, rnn_mode="lstm", dropout=0.3, dtype=torch.float64).eval()
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    out = model(x)[0]
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


# --------------------------------------------------------------------------- CUDA

def _needs_torch_cuda():
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_cuda_drop_in_equals_torch_nn_on_packed_input(kind):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    _needs_torch_cuda()
    torch.manual_seed(0)
    reference = getattr(torch.nn, kind)(I, H, 2, bidirectional=True, batch_first=True,
                                        device="cuda", dtype=torch.float64)
    ours = getattr(prt, kind).from_torch(reference)
    x = torch.randn(B, T, I, device="cuda", dtype=torch.float64, requires_grad=True)
    results = []
    for module in (reference, ours):
        packed = pack_padded_sequence(x, torch.tensor([5, 2, 4]), batch_first=True,
                                      enforce_sorted=False)
        out = pad_packed_sequence(module(packed)[0], batch_first=True)[0]
        grads = torch.autograd.grad(out.square().sum(), [x] + list(module.parameters()))
        results.append((out, grads[0]))
    torch.testing.assert_close(results[1], results[0])


@pytest.mark.gpu
def test_cuda_outputs_and_reserve_come_from_torchs_allocator():
    _needs_torch_cuda()
    args = [a.cuda() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in _op_args("lstm", lengths=None)]
    torch.ops.pycudnnrnn.forward(*args)  # warm-up: the plan
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    results = torch.ops.pycudnnrnn.forward(*args)
    grown = torch.cuda.memory_allocated() - before
    assert results[3].numel() > 0 and all(r.is_cuda for r in results)
    assert grown >= sum(r.numel() * r.element_size() for r in results)


@pytest.mark.gpu
def test_cuda_compile_fullgraph_equals_eager_and_dropout_is_fresh_per_step():
    _needs_torch_cuda()
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = prt.GRU(I, H, 3, dropout=0.5, device="cuda")
    x = torch.randn(T, B, I, device="cuda")

    def loss(x):
        return model(x)[0].square().sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    assert compiled(x).item() != compiled(x).item()  # cuDNN advances its dropout state
    model.eval()
    torch.testing.assert_close(compiled(x), loss(x))


def test_held_dropout_states_are_reused_not_initialised_again(fake_gpu):
    """Stand-in GPU: more seeds than the caches keep, each held by a plan (as the modules
    hold theirs); a new plan for a held seed (new lengths) continues its state."""
    import fake_cuda
    from conftest import make_case
    fake = fake_gpu
    case = make_case("gru", num_layers=2, lengths=[4, 3, 2])

    def plan_for(seed, lengths):
        return pycudnnrnn.RNNPlan(num_layers=2, num_units=4, input_size=3, max_time=4,
                                  batch_size=3, sequence_lengths=lengths, dtype="float64",
                                  device="cuda", rnn_mode="gru", dropout=0.3, seed=seed)

    held = [plan_for(seed, [4, 3, 2]) for seed in range(6)]
    fake.calls.clear()
    again = plan_for(0, [4, 4, 1])
    args = [fake_cuda._device(a) for a in (case.input, case.input_h, case.params)]
    again.forward(args[0], args[1], None, args[2])
    assert "cudnnSetDropoutDescriptor" not in fake.calls  # restored, not initialised
    assert len(held) == 6


def test_a_module_gets_its_dropout_plan_back_while_the_key_holds():
    from pycudnnrnn.torch.op_backends import ModulePlans
    built = []

    def build():
        built.append(object())
        return built[-1]

    plans = ModulePlans()
    for seed in [7] + list(range(100, 120)):
        plans.acquire(seed)
    first = plans.get(0, 7, ("shapes", 1), build)
    others = [plans.get(0, seed, ("shapes", 1), build) for seed in range(100, 120)]  # others
    assert plans.get(0, 7, ("shapes", 1), build) is first and len(built) == 21
    assert plans.get(0, 7, ("shapes", 2), build) is not first  # new lengths: a new plan
    assert plans.get(1, 7, ("shapes", 2), build) is not built[-2]  # another device
    assert len(built) == 23 and len(others) == 20


def test_module_plans_live_as_long_as_a_module_with_their_seed():
    """One ~6 MiB cuDNN dropout state per module: kept forever, a loop that builds modules
    grew without bound."""
    import gc

    from pycudnnrnn.torch import CudnnRNN, op_backends as kernels
    plans = kernels._module_plans
    held = lambda seed: [k for k in plans._held if k[1] == seed]
    first, twin = (CudnnRNN(3, 4, 2, dropout=0.5, seed=1234) for _ in range(2))
    plans.get(0, 1234, "key", object)
    assert held(1234)
    del first
    gc.collect()
    assert held(1234)  # the twin still uses the seed's state
    del twin
    gc.collect()
    assert not held(1234)
    plans.get(0, 99, "key", object)  # a seed no module holds (a functional call) is not kept
    assert not held(99)


@pytest.mark.gpu
def test_cuda_many_dropout_modules_each_draw_fresh_masks():
    """More modules than the caches keep seeds for: no state is re-initialised (which
    would repeat a module's masks)."""
    _needs_torch_cuda()
    torch.manual_seed(0)
    models = [prt.LSTM(I, H, 2, dropout=0.5, device="cuda") for _ in range(6)]
    x = torch.randn(T, B, I, device="cuda")
    outputs = [[m(x)[0].detach() for m in models] for _ in range(2)]
    for first, second in zip(*outputs):
        assert not torch.equal(first, second)


@pytest.mark.gpu
def test_cuda_graph_capture_replays_the_forward():
    _needs_torch_cuda()
    model = prt.LSTM(I, H, num_layers=2, device="cuda").eval()
    x = torch.randn(T, B, I, device="cuda")
    with torch.no_grad():
        expected = model(x)[0].clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            model(x)  # warm-up: the plan is built outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = model(x)[0]
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(captured, model(x)[0])
    assert not torch.equal(captured, expected)


def test_cuda_calls_run_on_torchs_stream_and_allocator(monkeypatch):
    """The plumbing of kernels._on_device, with stand-ins for CuPy and torch.cuda (no GPU)."""
    import types
    from pycudnnrnn.core import gpu
    from pycudnnrnn.torch import op_backends as kernels
    seen = {}

    class Context:
        def __init__(self, kind, *args):
            seen.setdefault("entered", []).append((kind,) + args)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    class PythonFunctionAllocator:
        def __init__(self, malloc, free):
            seen.setdefault("allocators", []).append(self)
            self.malloc = lambda size: (malloc(size, 0), free)

    cuda = types.SimpleNamespace(
        Device=lambda device: Context("Device", device),
        ExternalStream=lambda ptr, device: Context("ExternalStream", ptr, device),
        using_allocator=lambda malloc: Context("using_allocator", malloc(64)[0]),
        memory=types.SimpleNamespace(PythonFunctionAllocator=PythonFunctionAllocator))
    monkeypatch.setattr(gpu, "cupy", lambda: types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(kernels, "_allocators", {}, raising=False)  # none from real CuPy
    stream = types.SimpleNamespace(cuda_stream=0xBEEF)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "caching_allocator_alloc",
                        lambda size, device, s: ("torch", size, device, s.cuda_stream))
    tensor = types.SimpleNamespace(device=torch.device("cuda", 1))
    with kernels._on_device(tensor):
        pass
    assert seen["entered"] == [("Device", 1), ("ExternalStream", 0xBEEF, 1),
                               ("using_allocator", ("torch", 64, 0, 0xBEEF))]
    with kernels._on_device(tensor):  # the same (device, stream): the same allocator
        pass
    assert len(seen["allocators"]) == 1
    stream = types.SimpleNamespace(cuda_stream=0xCAFE)  # another stream: its own
    with kernels._on_device(tensor):
        pass
    assert len(seen["allocators"]) == 2
    assert seen["entered"][-1] == ("using_allocator", ("torch", 64, 0, 0xCAFE))


def test_cuda_calls_under_cupy_14_raise_no_deprecation_warning(fake_gpu, monkeypatch):
    """CuPy 14 (the stand-in's) deprecates ``ExternalStream`` and warns at each
    construction (review 2026-12-07, finding 10): kernels._on_device takes
    ``Stream.from_external`` there, once per (device, stream), on the tensor's device
    (it takes the current one's), and runs on PyTorch's stream there."""
    import types
    import warnings
    import fake_cuda
    from pycudnnrnn.core import gpu
    from pycudnnrnn.torch import op_backends as kernels
    fake_cuda.DEVICES[0] = 2
    cupy, entered = gpu.cupy(), []
    monkeypatch.setattr(kernels, "_allocator", lambda cupy, device, stream:  # none real
                        types.SimpleNamespace(malloc=lambda nbytes: pytest.fail("allocated")))
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(cuda_stream=0xBEEF))
    tensor = types.SimpleNamespace(device=torch.device("cuda", 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for _ in range(3):
            with kernels._on_device(tensor):
                entered.append((fake_cuda.current_stream().ptr, fake_cuda.current_device()))
    assert cupy.external_streams == [(0xBEEF, 1)] and entered == [(0xBEEF, 1)] * 3


@pytest.mark.parametrize("mode,gradients", [("lstm", "all"), ("gru", "data"),
                                            ("lstm", "weights")])
def test_the_planned_path_cuda_takes_equals_the_functional_api(mode, gradients):
    """kernels.planned_forward/backprop (what CUDA tensors run), here on CPU tensors."""
    from pycudnnrnn.torch import op_backends as kernels
    x, h, c, params, lengths, seed, *attrs = _op_args(mode, dropout=0.4)
    x, h, c, params = (None if t is None else t.detach() for t in (x, h, c, params))
    names = ("rnn_mode", "input_mode", "direction", "dropout", "num_proj", "time_major")
    attrs = dict(zip(names, attrs[:6]))
    planned = kernels.planned_forward(x, h, c, params, lengths.numpy(), seed,
                                      _attributes(attrs, True))
    direct = pycudnnrnn.forward(x, h, c, params, lengths, **kernels.split_seed(seed), **attrs)
    assert all(isinstance(t, torch.Tensor) for t in planned)
    for ours, theirs in zip(planned, direct):
        assert torch.equal(ours, theirs)
    grads = [torch.randn_like(t) for t in planned[:3]]
    ours = kernels.planned_backprop(x, h, c, params, *planned[:3], *grads, planned[3],
                                    lengths.numpy(), seed, _attributes(attrs), gradients)
    theirs = pycudnnrnn.backprop(x, h, c, params, lengths, *direct[:3], *grads, direct[3],
                                 **kernels.split_seed(seed), **attrs, gradients=gradients)
    for a, b in zip(ours, theirs):
        assert (a is None) == (b is None)
        assert a is None or torch.equal(a, b)


def test_a_copied_module_holds_a_seed_of_its_own():
    """copy.deepcopy shared the original's dropout seed and was not counted: the copy's
    CUDA state went when the original was collected."""
    import copy
    import gc

    from pycudnnrnn.torch import LSTM, CudnnRNN, op_backends as kernels
    holders = kernels._module_plans._holders
    original = LSTM(3, 4, 2, dropout=0.5)
    twin = copy.deepcopy(original)
    assert twin.gpu_seed != original.gpu_seed and holders.get(twin.gpu_seed) == 1
    seed = twin.gpu_seed
    del original
    gc.collect()
    assert holders.get(seed) == 1
    given = CudnnRNN(3, 4, 2, dropout=0.5, seed=77)
    copied = copy.deepcopy(given)  # a seed the user gave is kept, and counted twice
    assert copied.gpu_seed == 77 and holders.get(77) == 2
    del twin, given, copied
    gc.collect()
    assert seed not in holders and 77 not in holders


# --------------------------------------------------------------------------- torch.func

def _lstm_pair():
    torch.manual_seed(0)
    reference = torch.nn.LSTM(I, H, 2, bidirectional=True, dtype=torch.float64)
    return reference, prt.LSTM.from_torch(reference)


def test_torch_func_grad_vjp_jacrev_functional_call_equal_torch_nn():
    from torch.func import functional_call, grad, jacrev, vjp
    reference, ours = _lstm_pair()
    x = torch.randn(T, 2, I, dtype=torch.float64)
    results = []
    for module in (reference, ours):
        params = {k: v.detach() for k, v in module.named_parameters()}
        loss = lambda p, x: functional_call(module, p, (x,))[0].square().sum()
        g_params, g_x = grad(loss, argnums=(0, 1))(params, x)
        out, pullback = vjp(lambda x: functional_call(module, params, (x,))[0], x)
        (v,) = pullback(torch.ones_like(out))
        jac = jacrev(lambda x: functional_call(module, params, (x,))[1][0].sum())(x)
        results.append((g_params, g_x, v, jac))
    torch.testing.assert_close(results[1], results[0], rtol=1e-10, atol=1e-12)


def test_torch_func_through_cudnn_rnn_and_rnn_equals_autograd_and_vmap_works():
    from torch.func import functional_call, grad, vmap
    model = prt.CudnnRNN(I, H, 2, rnn_mode="gru", dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64)
    flat = model.params.detach()
    g = grad(lambda p: functional_call(model, {"params": p}, (x,))[0].square().sum())(flat)
    model(x)[0].square().sum().backward()
    torch.testing.assert_close(g, model.params.grad, rtol=1e-12, atol=1e-12)
    h = torch.zeros(2, B, H, dtype=torch.float64)
    via_rnn = grad(lambda p: prt.rnn(x, h, None, p, rnn_mode="gru")[0].square().sum())(flat)
    torch.testing.assert_close(via_rnn, g, rtol=1e-12, atol=1e-12)
    batched = vmap(lambda x: model(x)[0])(torch.stack([x, 2 * x]))
    torch.testing.assert_close(batched[1], model(2 * x)[0], rtol=1e-12, atol=1e-12)


def test_double_backward_through_the_op_equals_torch_nn(monkeypatch):
    """The op's (CUDA, compiled, NumPy kernels) differentiates twice
    (``second_order``; tests/test_second_order.py holds it against finite differences)."""
    monkeypatch.setattr(prt.torch_kernels._choice, "kernels", "numpy")
    reference, ours = _lstm_pair()
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    second = []
    for module in (reference, ours):
        (gx,) = torch.autograd.grad(module(x)[0].sum(), x, create_graph=True)
        second.append(torch.autograd.grad(gx.square().sum(), x)[0])
    torch.testing.assert_close(second[1], second[0], rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- autocast

def test_cpu_autocast_bfloat16_behaves_as_for_torch_nn_lstm():
    torch.manual_seed(0)
    reference = torch.nn.LSTM(I, H, 2)
    ours = prt.LSTM.from_torch(reference)
    cudnn = prt.CudnnRNN(I, H, 2)
    linear = torch.nn.Linear(I, I)
    x = torch.randn(T, B, I)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_ref, (h_ref, _) = reference(linear(x))
        out, (h, _) = ours(linear(x))
        out_cudnn = cudnn(linear(x))[0]
        h0 = torch.zeros(2, B, H)
        out_rnn = prt.rnn(linear(x), h0, h0, cudnn.params)[0]
    assert out.dtype == h.dtype == out_ref.dtype == torch.bfloat16
    assert out_cudnn.dtype == out_rnn.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), out_ref.float(), rtol=0, atol=3e-2)
    torch.testing.assert_close(out_rnn, out_cudnn, rtol=0, atol=0)
    out.float().square().sum().backward()  # gradients reach the float32 weights
    assert ours.weight_ih_l0.grad.dtype == torch.float32 and ours.weight_ih_l0.grad.any()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: ours(x)[0], backend="aot_eager", fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # compiled: the same
        assert compiled(x).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the op, called directly
        args = list(_op_args("gru"))
        args[:4] = [None if a is None else a.detach().float() for a in args[:4]]
        assert torch.ops.pycudnnrnn.forward(*args)[0].dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast_runs_in_autocasts_dtype_as_torch_nn_lstm(dtype):
    _needs_torch_cuda()
    torch.manual_seed(0)
    reference = torch.nn.LSTM(I, H, 2, device="cuda")
    ours = prt.LSTM.from_torch(reference)
    x = torch.randn(T, B, I, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        out_ref, out = reference(x)[0], ours(x)[0]
    assert out.dtype == out_ref.dtype == dtype
    torch.testing.assert_close(out.float(), out_ref.float(), rtol=0, atol=3e-2)
    scaler = torch.amp.GradScaler("cuda")
    scaler.scale(out.float().square().sum()).backward()
    assert ours.weight_ih_l0.grad.dtype == torch.float32


# --------------------------------------------------------------------------- bad arguments

def test_meta_arguments_of_the_ops_and_cudnn_rnn_are_refused():
    args = list(_op_args("gru"))
    args[1] = args[1].detach().to("meta")
    with pytest.raises(TypeError, match="input_h: expected a tensor with data"):
        torch.ops.pycudnnrnn.forward(*args)
    x = torch.randn(T, B, I)
    with pytest.raises(TypeError, match="input_h: .*meta"):
        prt.rnn(x, torch.zeros(2, B, H, device="meta"), None,
                prt.CudnnRNN(I, H, rnn_mode="gru").params, rnn_mode="gru")
    with pytest.raises(TypeError, match="params: .*meta"):
        prt.CudnnRNN(I, H, device="meta")(x)
    with pytest.raises(TypeError, match=r"hx \(h_0\): .*meta"):
        prt.CudnnRNN(I, H, rnn_mode="gru")(x, torch.zeros(1, B, H, device="meta"))


def test_obscure_argument_errors_are_clear():
    model = prt.CudnnRNN(I, H, rnn_mode="gru")
    x = torch.randn(T, B, I)
    with pytest.raises(TypeError, match=r"hx \(h_0\): expected a torch.Tensor, got list"):
        model(x, [[0.0]])
    for seed in (1.5, True, "1"):
        with pytest.raises(TypeError, match="seed: expected an integer or None"):
            prt.CudnnRNN(I, H, seed=seed)
    h = torch.zeros(1, B, H)
    for seed in (torch.zeros(2), torch.tensor(1.5), torch.tensor(True)):
        with pytest.raises(TypeError, match="seed: expected an integer or a 0-d integer tensor"):
            prt.rnn(x, h, None, model.params, rnn_mode="gru", seed=seed)


def test_an_argument_of_the_wrong_type_is_refused_whatever_ran_before():
    """The checked calls are cached by the attributes' values and types: an int where a
    bool belongs is refused after a call with the bool too (True == 1 as keys)."""
    model = prt.CudnnRNN(I, H, rnn_mode="gru")
    x, h = torch.randn(T, B, I), torch.zeros(1, B, H)
    for _ in range(2):
        with pytest.raises(TypeError, match="is_training: expected a bool, got int 1"):
            prt.rnn(x, h, None, model.params, rnn_mode="gru", is_training=1)
        prt.rnn(x, h, None, model.params, rnn_mode="gru", is_training=True)


@pytest.fixture
def torch_on_stand_in(fake_gpu, monkeypatch):
    """CPU tensors taken as tensors on the stand-in GPU by kernels' planned path and the
    ops (no CUDA tensors exist without CUDA): plans are built for device 0 and the
    stand-in's DLPack import adopts the tensors' memory (the stand-in's device memory is
    host memory). A plan's run finishes its queued work before it returns: PyTorch frees
    a CPU tensor (the workspace, a temporary) at once, not in a stream's order as its
    CUDA allocator does. An imported tensor lives until then, as CuPy's DLPack view
    keeps it (a temporary too: a copy made to import, which nothing else holds)."""
    import fake_cuda
    import numpy as np

    from pycudnnrnn import plan
    from pycudnnrnn.torch import op_backends as kernels
    monkeypatch.setattr(kernels, "_plan_device", lambda tensor: 0)
    monkeypatch.setattr(kernels, "on_gpu", lambda tensor: True)
    for name in ("forward", "forward_at", "backprop", "backprop_at"):
        def drained(*args, _run=getattr(plan.RNNPlan, name), **kwargs):
            try:
                return _run(*args, **kwargs)
            finally:
                fake_cuda.synchronize_all()
                imported.clear()
        monkeypatch.setattr(plan.RNNPlan, name, drained)
    from pycudnnrnn.core import arrays
    kind = arrays.device_kind
    monkeypatch.setattr(arrays, "device_kind", lambda name, a, strict=True: "cuda" if isinstance(
        a, torch.Tensor) else kind(name, a, strict))
    imports, imported = [], []
    take = fake_cuda.FakeCupy.from_dlpack

    def from_dlpack(self, a):
        if not isinstance(a, torch.Tensor):
            return take(self, a)
        imports.append(tuple(a.shape))
        imported.append(a)  # held through the run, as CuPy's view holds it
        # by address, no reference: the stand-in keeps the views it sees, and a DLPack
        # view would keep the tensor object alive with them (a CuPy view dies with the call)
        dtype = torch.empty(0, dtype=a.dtype).numpy().dtype
        extent = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride())) if a.numel() else 0
        flat = fake_cuda._array(a.data_ptr(), dtype, (extent,))
        return np.lib.stride_tricks.as_strided(  # strided as the tensor is, as CuPy's import
            flat, tuple(a.shape), tuple(s * dtype.itemsize for s in a.stride())).view(
            fake_cuda.FakeDeviceArray)

    monkeypatch.setattr(fake_cuda.FakeCupy, "from_dlpack", from_dlpack)
    return imports


def _attributes(attrs, is_training=True):
    """The op's ``Attributes`` of the functional API's keywords `attrs` (what the ops'
    bodies hand ``op_backends``)."""
    from pycudnnrnn.core.config import Attributes
    return Attributes(**attrs, is_training=is_training)


def _stand_in_call(mode="lstm", dropout=0.0):
    x, h, c, params, lengths, seed, *attrs = _op_args(mode, dropout=dropout)
    x, h, c, params = (None if t is None else t.detach() for t in (x, h, c, params))
    names = ("rnn_mode", "input_mode", "direction", "dropout", "num_proj", "time_major")
    return x, h, c, params, lengths.numpy(), seed, dict(zip(names, attrs[:6]))


def test_a_trusted_reserve_is_not_read_back_on_the_stand_in_gpu(torch_on_stand_in):
    """Hazard 6: backprop from the ops' autograd formula read the reserve space's header
    back from the GPU (a sync; an error under CUDA-graph capture) whenever the tensor
    object was not forward's own (CUDA-graph trees rebuild them at every replay). Trusted,
    it reads nothing; untrusted (the public op), a rebuilt tensor is still checked."""
    import gc

    import fake_cuda
    from conftest import assert_ulp_close
    from pycudnnrnn.torch import op_backends as kernels
    x, h, c, params, lengths, seed, attrs = _stand_in_call()
    fwd = list(kernels.planned_forward(x, h, c, params, lengths, seed, _attributes(attrs, True)))
    grads = [torch.randn_like(t) for t in fwd[:3]]
    # another tensor object over the same memory (no view: its _base would keep forward's)
    fwd[3] = _rebuilt(fwd[3])
    fake_cuda.release_foreign_views()  # forward's views of the tensors die, as CuPy's do
    gc.collect()
    results = []
    for trust in (False, True):  # untrusted first: the stand-in keeps views it saw alive
        fake_cuda.reset_counts()
        results.append(kernels.planned_backprop(x, h, c, params, *fwd[:3], *grads, fwd[3],
                                                lengths, seed, _attributes(attrs), "all", trust))
        fake_cuda.synchronize_all()
        counts = {k: fake_cuda.COUNTS[k] for k in ("device_to_host", "sync")}
        assert counts == ({"device_to_host": 0, "sync": 0} if trust else
                          {"device_to_host": 1, "sync": 1}), (trust, counts)
    for trusted, checked in zip(*results):
        assert_ulp_close(trusted.numpy(), checked.numpy())
    wrong = dict(attrs, direction="unidirectional")  # still a wrong identity is refused
    fwd2 = kernels.planned_forward(x, h[:, :2].contiguous(), c[:, :2].contiguous(),
                                   params[:_params_size(wrong)],
                                   lengths, seed, _attributes(wrong, True))
    with pytest.raises(ValueError, match="reserve_space"):
        kernels.planned_backprop(x, h, c, params, *fwd[:3], *grads, _rebuilt(fwd2[3]),
                                 lengths, seed, _attributes(attrs), "all", False)


def _rebuilt(tensor):
    """A new tensor object over `tensor`'s memory, as CUDA-graph trees make at replays."""
    return torch.empty(0, dtype=tensor.dtype).set_(tensor.untyped_storage())


def _params_size(attrs):
    return pycudnnrnn.params_size(rnn_mode=attrs["rnn_mode"], num_layers=2, num_units=H,
                                  input_size=I, direction=attrs["direction"])


@pytest.mark.parametrize("weights", [False, True])
def test_the_autograd_formula_trusts_the_reserve_and_the_public_op_does_not(monkeypatch,
                                                                           weights):
    from pycudnnrnn.torch import op_backends as kernels
    seen = []
    run = kernels.run_backprop

    def spy(*args, **kwargs):
        seen.append(kwargs.get("trust_reserve", args[15] if len(args) > 15 else False))
        return run(*args, **kwargs)

    monkeypatch.setattr(kernels, "run_backprop", spy)
    monkeypatch.setattr(prt.torch_kernels._choice, "kernels", "numpy")  # the op's autograd formula
    torch.manual_seed(0)
    if weights:
        model = prt.LSTM(I, H, 2, batch_first=True)
        model(torch.randn(B, T, I))[0].sum().backward()
    else:
        args = _op_args("gru")
        torch.ops.pycudnnrnn.forward(*args)[0].sum().backward()
    assert seen == [True]
    args = _op_args("gru")
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args[:6]]
    out = [t.detach() for t in torch.ops.pycudnnrnn.forward(*args)]
    grads = [torch.randn_like(t) for t in out[:3]]
    torch.ops.pycudnnrnn.backprop(*detached, *out[:3], *grads, out[3], *args[6:12], "all")
    assert seen == [True, False]


def test_the_planned_path_imports_each_tensor_once_and_exports_nothing(torch_on_stand_in,
                                                                       monkeypatch):
    """Stand-in GPU: the ops' CUDA path took every tensor in through DLPack once (inputs,
    PyTorch-allocated results and workspace) and then exported the plan's results back
    to PyTorch, four DLPack round trips a call it threw away."""
    from pycudnnrnn.plan import rnn_plan
    from pycudnnrnn.torch import op_backends as kernels
    exports = []
    monkeypatch.setattr(rnn_plan, "results_like",
                        lambda like, xp, results: exports.append(results) or results)
    imports = torch_on_stand_in
    x, h, c, params, lengths, seed, attrs = _stand_in_call()
    fwd = kernels.planned_forward(x, h, c, params, lengths, seed, _attributes(attrs, True))
    # x, h, c, params; output, output_h, output_c, reserve; workspace
    assert (len(imports), exports) == (9, [])
    imports.clear()
    grads = [torch.randn_like(t) for t in fwd[:3]]
    kernels.planned_backprop(x, h, c, params, *fwd[:3], *grads, fwd[3], lengths, seed,
                             _attributes(attrs), "all", True)
    # 11 arguments; dx, dh, dc, dparams; workspace
    assert (len(imports), exports) == (16, [])


def _time_major_call(mode="lstm", dropout=0.0):
    """A call on which a plan runs in place: time-major, every row its full length."""
    torch.manual_seed(1)
    n = pycudnnrnn.params_size(rnn_mode=mode, num_layers=2, num_units=H, input_size=I,
                               direction="bidirectional")
    x = torch.randn(T, B, I, dtype=torch.float64)
    h = torch.randn(4, B, H, dtype=torch.float64)
    c = torch.randn(4, B, H, dtype=torch.float64) if mode == "lstm" else None
    params = torch.rand(n, dtype=torch.float64) - 0.5
    attrs = dict(rnn_mode=mode, input_mode="linear_input", direction="bidirectional",
                 dropout=dropout, num_proj=0, time_major=True)
    return x, h, c, params, None, torch.tensor(12345), attrs


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_a_plan_that_runs_in_place_takes_the_tensors_addresses(torch_on_stand_in,
                                                              monkeypatch, mode):
    """Stand-in GPU: a time-major call with every row at full length crossed DLPack
    nine times in forward and sixteen in backprop, each a CuPy import of a PyTorch
    tensor. Its plan now runs on the tensors' addresses: no import, the NumPy backend's
    results, into buffers that hold NaN as fresh device memory may (the weight
    gradients are zeroed on the stream before cuDNN adds to them), a reserve space left
    as forward wrote it however often backprop reads it (cuDNN scribbles on a copy),
    and a header forward wrote on the stream: an untrusted backprop from a rebuilt
    tensor takes the checked path, reads it back, and accepts it."""
    import gc

    import fake_cuda
    from conftest import assert_ulp_close
    from pycudnnrnn.torch import op_backends as kernels
    empty = kernels._empty
    monkeypatch.setattr(kernels, "_empty", lambda shape, like, dtype=None: empty(
        shape, like, dtype).fill_(float("nan") if (dtype or like.dtype).is_floating_point
                                  else 0xFF))
    imports = torch_on_stand_in
    x, h, c, params, lengths, seed, attrs = _time_major_call(mode)
    assert kernels._plan(x, h, c, params, lengths, seed, _attributes(attrs, True)).runs_in_place
    fwd = list(kernels.planned_forward(x, h, c, params, lengths, seed, _attributes(attrs, True)))
    assert imports == []
    numpy_c = None if c is None else c.numpy()
    want = pycudnnrnn.forward(x.numpy(), h.numpy(), numpy_c, params.numpy(), **attrs)
    for got, expected in zip(fwd[:3 if mode == "lstm" else 2], want):
        assert_ulp_close(got.numpy(), expected)
    grads = [torch.randn_like(t) for t in fwd[:3]]
    want_grads = pycudnnrnn.backprop(x.numpy(), h.numpy(), numpy_c, params.numpy(), None,
                                     *want[:3], *(g.numpy() for g in grads), want[3], **attrs)
    reserve = fwd[3].clone()
    fake_cuda.reset_counts()
    first, second = (kernels.planned_backprop(x, h, c, params, *fwd[:3], *grads, fwd[3],
                                              lengths, seed, _attributes(attrs), "all", True)
                     for _ in range(2))
    assert imports == [] and fake_cuda.COUNTS["device_to_host"] == 0
    assert torch.equal(fwd[3], reserve)
    for got, again, expected in zip(first, second, want_grads):
        if expected is not None and expected.size:
            assert_ulp_close(got.numpy(), expected)
            assert torch.equal(got, again)  # the same computation on the same bytes
    fwd[3] = _rebuilt(fwd[3])  # forward's tensor object gone: its note goes with it
    gc.collect()
    fake_cuda.reset_counts()
    dx = kernels.planned_backprop(x, h, c, params, *fwd[:3], *grads, fwd[3], lengths, seed,
                                  _attributes(attrs), "all", False)[0]
    assert fake_cuda.COUNTS["device_to_host"] == 1  # the header, read back and accepted
    assert imports != []
    assert_ulp_close(dx.numpy(), want_grads[0])
    imports.clear()
    dparams = kernels.planned_backprop(x, h, c, params, *fwd[:3], *grads, fwd[3], lengths,
                                       seed, _attributes(attrs), "weights", True)[3]
    assert imports != []  # no data gradients asked for: the checked path, which makes them
    assert_ulp_close(dparams.numpy(), want_grads[3])
    with pytest.raises(ValueError, match="output_backprop: expected shape"):  # the checks'
        kernels.planned_backprop(x, h, c, params, *fwd[:3], grads[0][:-1].contiguous(),
                                 *grads[1:], fwd[3], lengths, seed, _attributes(attrs), "all", True)


def test_what_a_plan_cannot_take_on_trust_goes_through_its_checks(torch_on_stand_in,
                                                                   monkeypatch):
    """A plan that runs in place still runs a strided state, a state with a lazy sign
    or a params of another dtype through its own path: the first two with a DLPack
    import (and the values they stand for), the last with the plan's error naming the
    argument. ``forward_at`` refuses a plan that does
    not run in place."""
    from conftest import assert_ulp_close
    from pycudnnrnn import plan
    from pycudnnrnn.core.arrays import ForwardAddresses
    from pycudnnrnn.torch import op_backends as kernels
    imports = torch_on_stand_in
    x, h, c, params, lengths, seed, attrs = _time_major_call()
    plain = kernels.planned_forward(x, h, c, params, lengths, seed, _attributes(attrs, False))
    strided = torch.empty(4, B, 2 * H, dtype=h.dtype)[..., :H]
    strided.copy_(h)
    again = kernels.planned_forward(x, strided, c, params, lengths, seed, _attributes(attrs, False))
    assert len(imports) > 0
    for got, want in zip(again[:3], plain[:3]):
        assert_ulp_close(got.numpy(), want.numpy())
    negated = torch._neg_view(-h)  # h's values over -h's memory: a lazy sign
    assert negated.is_contiguous() and negated.is_neg()
    again = kernels.planned_forward(x, negated, c, params, lengths, seed, _attributes(attrs, False))
    for got, want in zip(again[:3], plain[:3]):
        assert_ulp_close(got.numpy(), want.numpy())
    with pytest.raises(TypeError, match="params: expected dtype"):
        kernels.planned_forward(x, h, c, params.float(), lengths, seed, _attributes(attrs, False))
    gru = dict(attrs, rnn_mode="gru")
    gru_params = torch.rand(pycudnnrnn.params_size(
        rnn_mode="gru", num_layers=2, num_units=H, input_size=I, direction="bidirectional"),
        dtype=torch.float64)
    seen = []
    at = plan.RNNPlan.forward_at
    monkeypatch.setattr(plan.RNNPlan, "forward_at",
                        lambda self, *a, **k: seen.append(a) or at(self, *a, **k))
    kernels.planned_forward(x, h, c, gru_params, lengths, seed, _attributes(gru, False))
    assert seen[0][0].input_c == 0  # a GRU's cell state is no argument of cuDNN's: NULL
    training = kernels._plan(x, h, c, params, lengths, seed, _attributes(attrs, True))
    with pytest.raises(ValueError, match="needs a reserve_space"):
        training.forward_at(ForwardAddresses(*(1,) * 8, 0))
    with pytest.raises(ValueError, match="needs a reserve_space"):  # bare ints, the older form
        training.forward_at(*(1,) * 8, 0, False, None)
    with pytest.raises(TypeError, match="one ForwardAddresses or its 9 addresses, got 3"):
        training.forward_at(1, 2, 3)
    ragged = kernels._plan(*_stand_in_call()[:-1], _attributes(_stand_in_call()[-1], False))
    assert not ragged.runs_in_place
    with pytest.raises(ValueError, match="does not run in place"):
        ragged.forward_at(ForwardAddresses(*(0,) * 9))


def test_the_ops_skip_the_overlap_check_their_fresh_buffers_need_not(torch_on_stand_in,
                                                                    monkeypatch):
    """The kernels' planned path (CUDA) hands the plan buffers PyTorch has just allocated:
    the per-call pass over every array that refuses shared memory (for callers' own
    out=) is not paid."""
    from pycudnnrnn.plan import rnn_plan
    from pycudnnrnn.torch import op_backends as kernels

    def refuse(*args):
        raise AssertionError("the op ran the overlap check")
    monkeypatch.setattr(rnn_plan, "refuse_overlaps", refuse)
    x, h, c, params, lengths, seed, attrs = _stand_in_call()
    fwd = kernels.planned_forward(x, h, c, params, lengths, seed, _attributes(attrs, True))
    grads = [torch.randn_like(t) for t in fwd[:3]]
    got = kernels.planned_backprop(x, h, c, params, *fwd[:3], *grads, fwd[3], lengths, seed,
                                   _attributes(attrs), "all", True)
    assert all(g is not None for g in got)


def test_the_fake_reserve_size_on_cuda_is_static_and_the_kernels(torch_on_stand_in,
                                                                 monkeypatch):
    """The fake sized cuDNN's reserve space as data-dependent (an unbacked size, which
    CUDA graphs refuse). It is now the size every row takes, asked of cuDNN at trace
    time, and the kernel allocates that, also for lengths that leave a row out (the plan
    uses its start, whose header is still known without a read-back)."""
    import contextlib

    import fake_cuda
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from pycudnnrnn.torch import op_backends as kernels
    x, h, c, params, lengths, seed, attrs = _stand_in_call(dropout=0.5)
    real = kernels.planned_forward(x, h, c, params, lengths, seed, _attributes(attrs, True))
    run = kernels._plan(x, h, c, params, lengths, seed, _attributes(attrs, True))
    assert real[3].numel() > run.reserve_nbytes  # the empty row leaves cuDNN's part short
    grads = [torch.randn_like(t) for t in real[:3]]
    fake_cuda.reset_counts()
    kernels.planned_backprop(x, h, c, params, *real[:3], *grads, real[3], lengths, seed,
                             _attributes(attrs), "all", False)  # untrusted, yet known: no read-back
    assert fake_cuda.COUNTS["device_to_host"] == 0
    monkeypatch.setattr(kernels, "_on_device", lambda t: contextlib.nullcontext())  # no CUDA
    monkeypatch.setattr(kernels, "on_gpu", lambda t: t.device.type == "cuda")
    args = _op_args("lstm", dropout=0.5)
    with FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True):
        on_cuda = [torch.empty(a.shape, dtype=a.dtype, device="cuda:0")
                   if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                   for a in args]
        reserve = torch.ops.pycudnnrnn.forward(*on_cuda)[3]
    assert type(reserve.shape[0]) is int and reserve.shape[0] == real[3].numel()


@pytest.mark.parametrize("dropout,lengths", [(0.0, None), (0.5, [5, 0, 2])],
                         ids=["no-dropout-no-lengths", "dropout-and-lengths"])
def test_a_cuda_training_step_traces_with_cpu_tensors_only_for_seed_and_lengths(
        fake_gpu, monkeypatch, dropout, lengths):
    """Stand-in GPU, fake CUDA tensors: a module's training forward, then the backprop
    its autograd formula calls, trace with no unbacked size (the reserve's size learnt
    at run time made CUDA-graph trees skip the graph). Without dropout and lengths the
    graph holds CUDA tensors alone (seed None), what the trees need to take it; with
    them, the seed and the lengths are its only CPU tensors (host values cuDNN needs).
    Autograd itself is not traced: its Function wants a CUDA device guard, which this
    PyTorch has not."""
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols
    from torch.utils._pytree import tree_leaves
    from pycudnnrnn.torch import op_backends as kernels
    monkeypatch.setattr(kernels, "_on_device", lambda t: contextlib.nullcontext())  # no CUDA
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # compile's door: the op
    model = prt.CudnnRNN(I, H, 2, rnn_mode="lstm", dropout=dropout, device="meta")
    seen = []  # the forward op's arguments, as the module gave them
    forward = torch.ops.pycudnnrnn.forward
    monkeypatch.setattr(prt.ops, "forward", lambda *args: seen.append(args) or forward(*args))

    def step(x, params, *lengths):
        out, h_n, c_n = torch.func.functional_call(
            model, {"params": params}, (x,), {"sequence_lengths": lengths[0] if lengths else None})
        (x, h0, c0, params, lengths, seed, *attrs, is_training), = seen
        assert is_training
        results = forward(x, h0, c0, params, lengths, seed, *attrs, is_training)
        grads = [torch.ones_like(t) for t in results[:3]]
        return torch.ops.pycudnnrnn.backprop(x, h0, c0, params, lengths, seed, *results[:3],
                                             *grads, results[3], *attrs, "all", True)

    with FakeTensorMode(shape_env=ShapeEnv()):
        x = torch.randn(T, B, I, device="cuda:0")
        params = torch.randn(model.params.shape, device="cuda:0")
        given = () if lengths is None else (torch.tensor(lengths),)
        graph = make_fx(step)(x, params, *given)
    (_, _, _, _, seen_lengths, seed, *_), = seen
    if dropout:
        assert seen_lengths.device.type == "cpu" and seed.device.type == "cpu"
    else:
        assert (seen_lengths, seed) == (None, None)
    ops = [n for n in graph.graph.nodes if "pycudnnrnn" in str(n.target)]
    assert sorted({str(n.target) for n in ops}) == ["pycudnnrnn.backprop.default",
                                                     "pycudnnrnn.forward.default"]
    host = {a for n in ops for a in n.args[4:6] if a is not None}  # lengths and seed nodes
    assert len(host) == (2 if dropout else 0)
    for node in list(host):  # and what they are made from (the seed's constant)
        host.update(node.all_input_nodes)
    for node in graph.graph.nodes:
        for value in tree_leaves(node.meta.get("val")):
            if isinstance(value, torch.Tensor) and node not in host:
                assert value.device.type == "cuda", (node.format_node(), value.device)
            assert not free_unbacked_symbols(value), node.format_node()


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputes_the_forward_with_its_dropout_masks(torch_on_stand_in,
                                                                  reentrant):
    """Stand-in GPU, whose dropout state advances: torch.utils.checkpoint runs a
    module's forward again in backward, which drew new masks and paired them with the
    first forward's loss. Each forward is named by PyTorch's generator state, which
    checkpoint restores: the recomputed forward draws the first one's masks, so the
    gradients equal a plain run's from the same generator state."""
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    model = prt.LSTM(I, H, 2, dropout=0.5, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    inputs = [x, *model.parameters()]

    def loss_and_grads(run):
        for t in inputs:
            t.grad = None
        torch.manual_seed(3)
        loss = run(x).square().sum()
        loss.backward()  # not autograd.grad: reentrant checkpoint refuses it
        return (loss.detach(), *(t.grad for t in inputs))

    plain = loss_and_grads(lambda x: model(x)[0])
    checkpointed = loss_and_grads(
        lambda x: checkpoint(lambda x: model(x)[0], x, use_reentrant=reentrant))
    for got, want in zip(checkpointed, plain):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not torch.equal(model(x)[0], model(x)[0])  # still fresh masks each call
    model.dropout = 0.0
    torch.manual_seed(3)
    assert model(x)[0].square().sum() != plain[0]  # dropout did act


def test_the_forward_allocates_no_room_for_backprops_reserve_copy(torch_on_stand_in,
                                                                  monkeypatch):
    """Stand-in GPU: forward took a training workspace sized for backprop too (cuDNN's
    workspace plus room for the copy of the reserve space backprop hands cuDNN). It now
    takes cuDNN's forward workspace only: PyTorch allocates outputs, reserve and that."""
    from pycudnnrnn.torch import op_backends as kernels
    allocated = []
    empty = kernels._empty

    def counted(shape, like, dtype=None):
        tensor = empty(shape, like, dtype)
        allocated.append(tensor.numel() * tensor.element_size())
        return tensor

    monkeypatch.setattr(kernels, "_empty", counted)
    x, h, c, params, lengths, seed, attrs = _stand_in_call()
    run = kernels._plan(x, h, c, params, lengths, seed, _attributes(attrs, True))
    results = kernels.planned_forward(x, h, c, params, lengths, seed, _attributes(attrs, True))
    assert 0 < run.forward_workspace_nbytes < run.workspace_nbytes
    assert sum(allocated) == sum(r.numel() * r.element_size() for r in results) + \
        run.forward_workspace_nbytes


def test_the_kernels_find_their_cuda_plan_by_the_tensors_own_key(torch_on_stand_in,
                                                                 monkeypatch):
    """A CUDA call's plan comes from the adapters' cache, keyed on the tensors' shapes and
    dtype: for_call (its key and checks) runs on a miss only, the plans go with
    clear_caches, and a hit still checks the arrays it runs on."""
    from pycudnnrnn import plan as plans
    from pycudnnrnn.torch import op_backends as kernels
    built = []
    for_call = plans.for_call
    monkeypatch.setattr(plans, "for_call", lambda *a, **k: built.append(1) or for_call(*a, **k))
    x, h, c, params, lengths, seed, attrs = _stand_in_call()
    first = kernels.planned_forward(x, h, c, params, lengths, seed, _attributes(attrs, False))
    again = kernels.planned_forward(x, h, c, params, lengths, seed, _attributes(attrs, False))
    assert len(built) == 1
    torch.testing.assert_close(first[0], again[0])
    kernels.planned_forward(x, h, c, params, None, seed, _attributes(attrs, False))  # other lengths
    assert len(built) == 2
    with pytest.raises(TypeError, match="params: expected dtype"):  # same key, wrong dtype
        kernels.planned_forward(x, h, c, params.float(), lengths, seed, _attributes(attrs, False))
    plans.clear_caches()
    kernels.planned_forward(x, h, c, params, lengths, seed, _attributes(attrs, False))
    assert len(built) == 3
