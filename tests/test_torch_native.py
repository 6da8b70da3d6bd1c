"""Eager CPU calls on PyTorch's own kernels (pycudnnrnn.torch.native), held against the op
on the NumPy backend: the same function, values and gradients, whatever the lengths."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pycudnnrnn.torch as prt  # noqa: E402
from conftest import assert_ulp_close  # noqa: E402

T, B, I, H = 6, 5, 3, 4
LENGTHS = {"full": None, "ragged": [6, 2, 5, 1, 3], "zero": [3, 0, 6, 0, 2]}


def _grads(module, x, hx, lengths):
    """Outputs, states and the gradient of every input and weight of a fixed projection."""
    leaves = [x, *([hx] if isinstance(hx, torch.Tensor) else hx), *module.parameters()]
    for leaf in leaves:
        leaf.grad = None
    output, state = module(x, hx, sequence_lengths=lengths)
    results = [output, *(state if isinstance(state, tuple) else (state,))]
    g = torch.Generator().manual_seed(9)
    loss = sum((r * torch.randn(r.shape, generator=g, dtype=r.dtype)).sum() for r in results)
    loss.backward()
    return [r.detach().numpy() for r in results] + [l.grad.numpy() for l in leaves]


def _both(run):
    with prt.cpu_kernels("numpy"):
        want = run()
    return run(), want


@pytest.mark.parametrize("kind,options", [
    ("LSTM", {}), ("LSTM", {"proj_size": 2}), ("GRU", {}), ("RNN", {}),
    ("RNN", {"nonlinearity": "relu"}), ("LSTM", {"bias": False})])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("batch_first", [False, True])
def test_the_modules_equal_the_op(kind, options, bidirectional, lengths, batch_first):
    torch.manual_seed(0)
    module = getattr(prt, kind)(I, H, num_layers=2, bidirectional=bidirectional,
                                batch_first=batch_first, dtype=torch.float64, **options)
    x = torch.randn((B, T, I) if batch_first else (T, B, I), dtype=torch.float64,
                    requires_grad=True)
    LD, P = 2 * (2 if bidirectional else 1), options.get("proj_size") or H
    h0 = torch.randn(LD, B, P, dtype=torch.float64, requires_grad=True)
    hx = (h0, torch.randn(LD, B, H, dtype=torch.float64, requires_grad=True)) \
        if kind == "LSTM" else h0
    got, want = _both(lambda: _grads(module, x, hx, LENGTHS[lengths]))
    for k, (a, b) in enumerate(zip(got, want)):
        assert_ulp_close(a, b, err_msg=f"result {k}")


@pytest.mark.parametrize("rnn_mode", ["lstm", "gru", "rnn_tanh"])
def test_rnn_and_cudnn_rnn_equal_the_op_on_the_flat_params(rnn_mode):
    torch.manual_seed(1)
    module = prt.CudnnRNN(I, H, 2, rnn_mode=rnn_mode, bidirectional=True, time_major=False,
                          num_proj=2 if rnn_mode == "lstm" else 0, dtype=torch.float64)
    x = torch.randn(B, T, I, dtype=torch.float64, requires_grad=True)

    def run():
        x.grad = module.params.grad = None
        output, h_n, *c_n = module(x, sequence_lengths=[6, 0, 2, 5, 1])
        (output.square().sum() + h_n.sum() + sum(c.sum() for c in c_n)).backward()
        return [output.detach().numpy(), h_n.detach().numpy(), x.grad.numpy(),
                module.params.grad.numpy()]

    for a, b in zip(*_both(run)):
        assert_ulp_close(a, b)


def test_nan_in_the_padding_stays_there():
    module = prt.GRU(I, H, bidirectional=True, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64)
    lengths = [6, 2, 5, 1, 3]
    for b, n in enumerate(lengths):
        x[n:, b] = float("nan")
    output, h_n = module(x, sequence_lengths=lengths)
    assert torch.isfinite(h_n).all()
    valid = torch.arange(T)[:, None] < torch.tensor(lengths)[None, :]
    assert torch.isfinite(output[valid]).all() and (output[~valid] == 0).all()


def test_dropout_masks_are_torch_nns():
    """Same seed, same masks: the modules make torch.nn's own call."""
    torch.manual_seed(0)
    reference = torch.nn.LSTM(I, H, 3, dropout=0.5, dtype=torch.float64)
    ours = prt.LSTM.from_torch(reference)
    x = torch.randn(T, B, I, dtype=torch.float64)
    torch.manual_seed(5)
    want = reference(x)[0]
    torch.manual_seed(5)
    got = ours(x)[0]
    assert torch.equal(got, want) and not torch.equal(ours(x)[0], got)  # a fresh mask a call


def test_double_backward_works_as_for_torch_nn():
    torch.manual_seed(0)
    reference = torch.nn.GRU(I, H, dtype=torch.float64)
    ours = prt.GRU.from_torch(reference)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    second = []
    for module in (reference, ours):
        (gx,) = torch.autograd.grad(module(x)[0].square().sum(), x, create_graph=True)
        second.append(torch.autograd.grad(gx.square().sum(), x)[0])
    torch.testing.assert_close(second[1], second[0])


def test_the_route_is_chosen_by_what_the_op_alone_can_do(monkeypatch):
    from pycudnnrnn.torch import kernels
    ran = []
    real = kernels.run_forward
    monkeypatch.setattr(kernels, "run_forward", lambda *a, **k: ran.append(1) or real(*a, **k))
    module = prt.LSTM(I, H)
    x = torch.randn(T, B, I)
    module(x)
    assert not ran  # PyTorch's kernels
    with prt.cpu_kernels("numpy"):
        module(x)
    assert len(ran) == 1
    module.bfloat16()(x.bfloat16())  # 16-bit: the op's float32 arithmetic
    assert len(ran) == 2
    seeded = prt.rnn(x, torch.zeros(2, B, H), torch.zeros(2, B, H),
                     prt.LSTM(I, H, 2).params.detach(), dropout=0.5, seed=3)
    assert len(ran) == 3  # a dropout seed fixes the op's masks
    with pytest.raises(ValueError, match="kind: expected 'torch' or 'numpy'"):
        prt.set_cpu_kernels("cuda")
    assert seeded[0].shape == (T, B, H)


# --------------------------------------------------------------------------- the op's kernels

def _op_call(rnn_mode, time_major, lengths, num_proj=0):
    import pycudnnrnn
    torch.manual_seed(2)
    P = num_proj or H
    n = pycudnnrnn.params_size(rnn_mode=rnn_mode, num_layers=2, num_units=H, input_size=I,
                               direction="bidirectional", num_proj=num_proj)
    x = torch.randn((T, B, I) if time_major else (B, T, I), dtype=torch.float64,
                    requires_grad=True)
    states = [torch.randn((4, B, w) if time_major else (B, 4, w), dtype=torch.float64,
                          requires_grad=True) for w in (P, H)]
    params = (torch.rand(n, dtype=torch.float64) - 0.5).requires_grad_()
    lengths = None if lengths is None else torch.tensor(lengths)
    return x, states[0], states[1] if rnn_mode == "lstm" else None, params, lengths, \
        (rnn_mode, "linear_input", "bidirectional", 0.0, num_proj, time_major, True)


def _op_results(args):
    x, h, c, params, lengths, attrs = args
    for t in (x, h, c, params):
        if t is not None:
            t.grad = None
    out = torch.ops.pycudnnrnn.forward(x, h, c, params, lengths, None, *attrs)
    g = torch.Generator().manual_seed(4)
    sum(((r * torch.randn(r.shape, generator=g, dtype=r.dtype)).sum()
         for r in out[:3] if r.numel())).backward()
    return [r.detach().numpy() for r in out[:3]] + \
        [t.grad.numpy() for t in (x, h, c, params) if t is not None], out[3]


@pytest.mark.parametrize("rnn_mode,num_proj", [("lstm", 0), ("lstm", 2), ("gru", 0),
                                               ("rnn_relu", 0)])
@pytest.mark.parametrize("time_major", [True, False])
@pytest.mark.parametrize("lengths", list(LENGTHS))
def test_the_ops_cpu_kernels_equal_the_numpy_backend(rnn_mode, num_proj, time_major, lengths):
    """What torch.compile, torch.export and torch.func run: the op, on PyTorch's kernels."""
    args = _op_call(rnn_mode, time_major, LENGTHS[lengths], num_proj)
    got, reserve = _op_results(args)
    assert reserve.numel() == prt.native.RESERVE_NBYTES
    with prt.cpu_kernels("numpy"):
        want, numpy_reserve = _op_results(args)
    assert numpy_reserve.numel() > prt.native.RESERVE_NBYTES
    for k, (a, b) in enumerate(zip(got, want)):
        assert_ulp_close(a, b, err_msg=f"result {k}")


def test_a_reserve_without_its_graph_still_backprops_and_graphs_are_freed():
    import gc
    x, h, c, params, lengths, attrs = _op_call("lstm", True, LENGTHS["zero"])
    before = len(prt.native._graphs)
    out = torch.ops.pycudnnrnn.forward(x.detach(), h.detach(), c.detach(), params.detach(),
                                       lengths, None, *attrs)
    assert len(prt.native._graphs) == before + 1
    grads = [torch.randn_like(t) for t in out[:3]]
    backprop = lambda reserve: torch.ops.pycudnnrnn.backprop(  # noqa: E731
        x.detach(), h.detach(), c.detach(), params.detach(), lengths, None, *out[:3], *grads,
        reserve, *attrs[:6], "all")
    kept, copied = backprop(out[3]), backprop(out[3].clone())  # the copy: recomputed
    for a, b in zip(kept, copied):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch.equal(out[3], torch.ops.pycudnnrnn.forward(
        x, h, c, params, lengths, None, *attrs)[3])  # the same bytes: a function
    del out, kept, copied
    gc.collect()
    assert len(prt.native._graphs) == before


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_compiled_step_equals_the_eager_one(kind):
    torch.manual_seed(0)
    module = getattr(prt, kind)(I, H, num_layers=2, bidirectional=True, batch_first=True,
                                dtype=torch.float64)
    x = torch.randn(B, T, I, dtype=torch.float64)
    lengths = torch.tensor(LENGTHS["zero"])

    def step(forward):
        module.zero_grad(set_to_none=True)
        loss = forward(x, lengths)
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in module.parameters()]

    loss = lambda x, lengths: module(x, sequence_lengths=lengths)[0].square().sum()  # noqa: E731
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    for a, b in zip(step(compiled), step(loss)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
