"""Eager CPU calls on PyTorch's own kernels (pycudnnrnn.torch.torch_kernels), held against the op
on the NumPy backend: the same function, values and gradients, whatever the lengths."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pycudnnrnn.torch as prt  # noqa: E402
from conftest import assert_ulp_close  # noqa: E402

T, B, I, H = 6, 5, 3, 4
LENGTHS = {"full": None, "ragged": [6, 2, 5, 1, 3], "zero": [3, 0, 6, 0, 2],
           "short": [4, 2, 0, 1, 3],  # none of max_time
           "tied": [5, 3, 3, 0, 5]}


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
    _module_against_op(kind, options, bidirectional, lengths, batch_first)


@pytest.mark.parametrize("kind,options", [
    ("LSTM", {}), ("LSTM", {"proj_size": 2}), ("LSTM", {"bias": False}), ("GRU", {}),
    ("GRU", {"bias": False}), ("RNN", {})])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("lengths", ["ragged", "zero", "short", "tied"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_a_ragged_training_call_on_the_full_length_kernel(kind, options, bidirectional,
                                                          lengths, batch_first, monkeypatch):
    """What large batches take: an LSTM as runs between consecutive lengths
    (``native._runs``), a GRU or RNN on zeroed padding (``_zeroed_padding``)."""
    _force_full_length(monkeypatch)
    spied = "_layer_runs" if kind == "LSTM" else "_zeroed_padding"
    calls = []
    real = getattr(prt.torch_kernels, spied)
    monkeypatch.setattr(prt.torch_kernels, spied, lambda *a: calls.append(1) or real(*a))
    _module_against_op(kind, options, bidirectional, lengths, batch_first)
    # LSTM: a layer and direction each; else once a call
    assert len(calls) == (2 * (2 if bidirectional else 1) if kind == "LSTM" else 1)


def test_a_relu_rnn_never_runs_its_padding(monkeypatch):
    """A relu RNN's state is unbounded: steps past a row's end could overflow, and inf · 0
    is NaN in the weight gradients. It stays on the packed rows, however large."""
    _force_full_length(monkeypatch)
    calls = []
    real = prt.torch_kernels._zeroed_padding
    monkeypatch.setattr(prt.torch_kernels, "_zeroed_padding", lambda *a: calls.append(1) or real(*a))
    _module_against_op("RNN", {"nonlinearity": "relu"}, True, "ragged", False)
    assert not calls


def _force_full_length(monkeypatch):
    monkeypatch.setattr(prt.torch_kernels, "RUNS_FROM", 0)
    monkeypatch.setattr(prt.torch_kernels, "ZEROED_UP_TO", float("inf"))


def _module_against_op(kind, options, bidirectional, lengths, batch_first):
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


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_the_full_length_kernel_never_reads_the_padding_nor_draws_dropout(kind, monkeypatch):
    _force_full_length(monkeypatch)
    module = getattr(prt, kind)(I, H, 2, bidirectional=True, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64)
    lengths = [6, 2, 5, 0, 3]
    for b, n in enumerate(lengths):
        x[n:, b] = float("nan")
    x.requires_grad_()
    output, state = module(x, sequence_lengths=lengths)
    state = state if kind == "LSTM" else (state,)
    (output.sum() + sum(s.sum() for s in state)).backward()
    valid = torch.arange(T)[:, None] < torch.tensor(lengths)[None, :]
    assert torch.isfinite(output[valid]).all() and (output[~valid] == 0).all()
    assert all(torch.isfinite(s).all() for s in state)
    assert torch.isfinite(x.grad[valid]).all() and (x.grad[~valid] == 0).all()
    # Without a gradient to record, with a dropout mask (drawn on the packed rows, as
    # torch.nn's kernel draws it), or below RUNS_FROM / past ZEROED_UP_TO, the packed
    # kernel runs.
    monkeypatch.setattr(prt.torch_kernels, "_layer_runs", None)
    monkeypatch.setattr(prt.torch_kernels, "_zeroed_padding", None)
    with torch.no_grad():
        module(x, sequence_lengths=lengths)
    module.requires_grad_(False)
    module(x.detach(), sequence_lengths=lengths)
    module.requires_grad_(True)
    monkeypatch.setattr(prt.torch_kernels, "RUNS_FROM", B * H + 1)
    monkeypatch.setattr(prt.torch_kernels, "ZEROED_UP_TO", T * B / sum(lengths) - 0.01)
    module(x, sequence_lengths=lengths)[0].sum().backward()
    _force_full_length(monkeypatch)
    module.dropout = 0.5
    module(x, sequence_lengths=lengths)[0].sum().backward()


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_the_full_length_kernel_in_float32_equals_the_packed_one(kind, monkeypatch):
    """float32 is what runs oneDNN's LSTM kernel (float64 PyTorch's own)."""
    torch.manual_seed(3)
    module = getattr(prt, kind)(I, H, 2, bidirectional=True, batch_first=True)
    x = torch.randn(B, T, I, requires_grad=True)
    results = []
    for full_length in (True, False):
        if full_length:
            _force_full_length(monkeypatch)
        else:
            monkeypatch.setattr(prt.torch_kernels, "RUNS_FROM", 10**9)
            monkeypatch.setattr(prt.torch_kernels, "ZEROED_UP_TO", 0.0)
        x.grad = None
        module.zero_grad()
        output, state = module(x, sequence_lengths=LENGTHS["tied"])
        state = state if kind == "LSTM" else (state,)
        (output.square().sum() + sum(s.sum() for s in state)).backward()
        results.append([output, *state, x.grad, *(p.grad for p in module.parameters())])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


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
    from pycudnnrnn.torch import op_backends as kernels
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
    assert reserve.numel() == prt.torch_kernels.RESERVE_NBYTES
    with prt.cpu_kernels("numpy"):
        want, numpy_reserve = _op_results(args)
    assert numpy_reserve.numel() > prt.torch_kernels.RESERVE_NBYTES
    for k, (a, b) in enumerate(zip(got, want)):
        assert_ulp_close(a, b, err_msg=f"result {k}")


@pytest.mark.parametrize("kind,options", [
    ("LSTM", {}), ("LSTM", {"proj_size": 2}), ("LSTM", {"bias": False}), ("GRU", {"bias": False}),
    ("RNN", {})])
@pytest.mark.parametrize("lengths", ["full", "zero"])
def test_the_drop_ins_through_the_op_equal_the_numpy_backend(kind, options, lengths,
                                                             monkeypatch):
    """What torch.compile traces of the drop-ins: ``forward_weights``, whose CPU kernels run
    on torch.nn's weights as they are (``bias=False``: no biases, zeros in their slots)."""
    monkeypatch.setattr(prt.torch_kernels, "takes", lambda *a, **k: False)  # the op's door, eagerly
    graphs = []
    real = prt.torch_kernels._graph
    monkeypatch.setattr(prt.torch_kernels, "_graph", lambda *a: graphs.append(a[3]) or real(*a))
    _module_against_op(kind, options, True, lengths, True)
    assert graphs and all(isinstance(w, prt.flat_weights.Weights) for w in graphs)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("lengths", ["full", "zero"])
def test_through_the_op_a_loss_of_the_output_alone_and_a_second_backward(kind, lengths,
                                                                         monkeypatch):
    """The states' gradients are then zeros, which the op's CPU backprop leaves out; a
    second backward (retain_graph) makes the forward's graph again: same gradients."""
    monkeypatch.setattr(prt.torch_kernels, "takes", lambda *a, **k: False)  # the op's door, eagerly
    torch.manual_seed(0)
    module = getattr(prt, kind)(I, H, num_layers=2, bidirectional=True, batch_first=True,
                                dtype=torch.float64)
    x = torch.randn(B, T, I, dtype=torch.float64, requires_grad=True)

    def grads():
        leaves = [x, *module.parameters()]
        for leaf in leaves:
            leaf.grad = None
        loss = module(x, sequence_lengths=LENGTHS[lengths])[0].sin().sum()
        loss.backward(retain_graph=True)
        first = [leaf.grad.clone() for leaf in leaves]
        loss.backward()
        return [g.numpy() for g in first] + [leaf.grad.numpy() for leaf in leaves]

    got, want = _both(grads)
    for k, (a, b) in enumerate(zip(got, want)):
        assert_ulp_close(a, b, err_msg=f"gradient {k}")
    n = len(got) // 2
    for a, b in zip(got[:n], got[n:]):
        assert_ulp_close(2 * a, b)


def _weights_op_call(rnn_mode, x, h, weights, grads_of=torch.ones_like, backprop_x=None):
    """forward_weights, then backprop_weights (given `backprop_x` for x, if any) of
    gradients `grads_of(result)`."""
    attrs = (rnn_mode, "unidirectional", 0.0, 0, True)
    out = torch.ops.pycudnnrnn.forward_weights(x, h, None, weights, True, None, None, *attrs,
                                               True)
    grads = [grads_of(r) for r in out[:2]] + [torch.empty(0)]
    return out, lambda: torch.ops.pycudnnrnn.backprop_weights(
        x if backprop_x is None else backprop_x, h, None, weights, True, None, None,
        *out[:3], *grads, out[3], *attrs, "all")


def test_zero_gradients_alone_still_run_so_an_overflow_gives_nan_as_torch_nn():
    """0 · inf is NaN in torch.nn's backward and the NumPy backend's; the CPU kernels
    leave zero gradients out only beside others."""
    module = torch.nn.RNN(2, 2, nonlinearity="relu")
    with torch.no_grad():
        for w in module.parameters():
            w.fill_(1e20)  # the forward overflows to inf
    x, h = torch.full((3, 2, 2), 1e20), torch.zeros(1, 2, 2)
    weights = [w.detach() for w in module._flat_weights]

    def run():
        out, backprop = _weights_op_call("rnn_relu", x, h, weights, torch.zeros_like)
        return [r.numpy() for r in backprop()]

    got, want = _both(run)
    assert np.isnan(want[3]).any()
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))


@pytest.mark.parametrize("bad", ["float16", "int64", "shape", "empty"])
def test_backprop_refuses_a_gradient_of_another_dtype_or_shape_as_the_numpy_backend(bad):
    """The CPU kernels check forward's results and their gradients as every backend does
    (they took any before, and an empty one broke the zero-gradient test)."""
    torch.manual_seed(0)
    weights = [w.detach() for w in torch.nn.LSTM(I, H)._flat_weights]
    x, h, c = torch.randn(T, B, I), torch.zeros(1, B, H), torch.zeros(1, B, H)
    attrs = ("lstm", "unidirectional", 0.0, 0, True)
    wrong = {"float16": torch.zeros(1, B, H, dtype=torch.float16),
             "int64": torch.zeros(1, B, H, dtype=torch.int64), "shape": torch.zeros(2),
             "empty": torch.empty(0)}[bad]

    def run():
        out = torch.ops.pycudnnrnn.forward_weights(x, h, c, weights, True, None, None, *attrs,
                                                   True)
        with pytest.raises((TypeError, ValueError)) as raised:
            torch.ops.pycudnnrnn.backprop_weights(
                x, h, c, weights, True, None, None, *out[:3], torch.ones_like(out[0]),
                torch.zeros_like(out[1]), wrong, out[3], *attrs, "all")
        return type(raised.value), str(raised.value)

    got, want = _both(run)
    assert got == want
    assert want[1].startswith("output_c_backprop: expected ")


def test_an_integer_input_is_named_by_its_dtype():
    weights = [w.detach() for w in torch.nn.RNN(I, H)._flat_weights]
    with pytest.raises(TypeError, match="input: expected dtype .*, got int64"):
        torch.ops.pycudnnrnn.forward_weights(
            torch.zeros(T, B, I, dtype=torch.int64), torch.zeros(1, B, H), None, weights, True,
            None, None, "rnn_tanh", "unidirectional", 0.0, 0, True, True)


def test_a_gradient_zero_at_its_first_element_alone_still_counts():
    """The CPU kernels look at a gradient's first element before the rest: one that is
    zero there and not elsewhere is not left out."""
    torch.manual_seed(2)
    weights = [w.detach().double() for w in torch.nn.RNN(I, H)._flat_weights]
    x, h = torch.randn(T, B, I, dtype=torch.float64), torch.randn(1, B, H, dtype=torch.float64)

    def zero_first(result):  # the output's gradient; output_h's is nonzero there
        grad = torch.randn_like(result)
        if result.shape[0] == T:
            grad.view(-1)[0] = 0
        return grad

    def run():
        torch.manual_seed(5)
        _, backprop = _weights_op_call("rnn_tanh", x, h, weights, zero_first)
        return [r.numpy() for r in backprop()]

    got, want = _both(run)
    for k, (a, b) in enumerate(zip(got, want)):
        assert_ulp_close(a, b, err_msg=f"gradient {k}")


def test_backprop_called_twice_on_one_reserve_gives_the_same_gradients():
    """Also from a forward on other data of the same identity (which the op accepts)."""
    torch.manual_seed(0)
    weights = [w.detach() for w in torch.nn.GRU(I, H)._flat_weights]
    h = torch.zeros(1, B, H)
    for other_data in (False, True):
        x = torch.randn(T, B, I)
        _, backprop = _weights_op_call("gru", x, h, weights,
                                       backprop_x=torch.randn(T, B, I) if other_data else None)
        first, second = backprop(), backprop()
        for a, b in zip(first, second):
            assert torch.equal(a, b)


@pytest.mark.parametrize("rnn_mode", ["lstm", "gru"])
def test_the_weights_ops_without_biases_give_every_backends_flat_gradient(rnn_mode):
    """backprop_weights' flat gradient holds the bias slots' gradient too (as the NumPy
    backend's and cuDNN's do) when torch.nn's weights have no biases."""
    torch.manual_seed(3)
    module = getattr(prt, rnn_mode.upper())(I, H, bias=False, dtype=torch.float64)
    weights = [w.detach() for w in module._flat_weights]
    x, h = torch.randn(T, B, I, dtype=torch.float64), torch.randn(1, B, H, dtype=torch.float64)
    c = torch.randn(1, B, H, dtype=torch.float64) if rnn_mode == "lstm" else None
    lengths = torch.tensor(LENGTHS["zero"])
    attrs = (rnn_mode, "unidirectional", 0.0, 0, True)

    def run():
        out = torch.ops.pycudnnrnn.forward_weights(x, h, c, weights, False, lengths, None,
                                                   *attrs, True)
        grads = [torch.randn(r.shape, generator=torch.Generator().manual_seed(5),
                             dtype=r.dtype) for r in out[:3]]
        back = torch.ops.pycudnnrnn.backprop_weights(x, h, c, weights, False, lengths, None,
                                                     *out[:3], *grads, out[3], *attrs, "all")
        return [r.numpy() for r in (*out[:3], *back)]

    got, want = _both(run)
    for k, (a, b) in enumerate(zip(got, want)):
        assert_ulp_close(a, b, err_msg=f"result {k}")


@pytest.mark.parametrize("time_major", [True, False])
def test_the_ops_cpu_kernels_record_runs_for_a_large_ragged_lstm(time_major, monkeypatch):
    _force_full_length(monkeypatch)
    calls = []
    real = prt.torch_kernels._layer_runs
    monkeypatch.setattr(prt.torch_kernels, "_layer_runs", lambda *a: calls.append(1) or real(*a))
    args = _op_call("lstm", time_major, LENGTHS["zero"], 2)
    got, _ = _op_results(args)
    assert len(calls) == 4
    with prt.cpu_kernels("numpy"):
        want, _ = _op_results(args)
    for k, (a, b) in enumerate(zip(got, want)):
        assert_ulp_close(a, b, err_msg=f"result {k}")


def test_a_reserve_without_its_graph_still_backprops_and_graphs_are_freed():
    import gc
    x, h, c, params, lengths, attrs = _op_call("lstm", True, LENGTHS["zero"])
    gc.collect()  # (reserves an earlier test left to the collector: freed below otherwise)
    before = len(prt.torch_kernels._graphs)
    out = torch.ops.pycudnnrnn.forward(x.detach(), h.detach(), c.detach(), params.detach(),
                                       lengths, None, *attrs)
    assert len(prt.torch_kernels._graphs) == before + 1
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
    assert len(prt.torch_kernels._graphs) == before


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


# --------------------------------------------------------------------------- edges (review)

def test_cudnn_rnn_on_pytorchs_kernels_keeps_the_ops_checks():
    module = prt.CudnnRNN(I, H)
    x = torch.randn(T, B, I)
    with pytest.raises(ValueError, match="input_h: expected shape"):
        module(x, (torch.randn(1, B + 1, H), torch.randn(1, B + 1, H)))
    with pytest.raises(TypeError, match="input_h: expected dtype"):
        module(x, (torch.randn(1, B, H, dtype=torch.float64), torch.randn(1, B, H)))


def test_a_weight_of_another_dtype_is_named_as_the_op_names_it():
    module = prt.LSTM(I, H)
    module.weight_hh_l0.data = module.weight_hh_l0.data.double()
    with pytest.raises(TypeError, match=r"weights\[1\]: expected dtype torch.float32"):
        module(torch.randn(T, B, I))


@pytest.mark.parametrize("call", ["module", "rnn", "op"])
def test_every_length_zero_keeps_every_state(call):
    torch.manual_seed(5)
    module = prt.GRU(I, H, bidirectional=True, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64)
    h0 = torch.randn(2, B, H, dtype=torch.float64, requires_grad=True)
    zeros = [0] * B
    if call == "module":
        output, h_n = module(x, h0, sequence_lengths=zeros)
    elif call == "rnn":
        output, h_n, _ = prt.rnn(x, h0, None, module.params.detach(), zeros, rnn_mode="gru",
                                 direction="bidirectional")
    else:
        output, h_n, _, _ = torch.ops.pycudnnrnn.forward(
            x, h0, None, module.params.detach(), torch.tensor(zeros), None, "gru",
            "linear_input", "bidirectional", 0.0, 0, True, True)
    assert output.shape == (T, B, 2 * H) and not output.any()
    torch.testing.assert_close(h_n, h0, rtol=0, atol=0)
    h_n.sum().backward()
    torch.testing.assert_close(h0.grad, torch.ones_like(h0), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.uint32,
                                   torch.uint64])
def test_lengths_of_any_integer_dtype(dtype):
    module = prt.LSTM(I, H, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64)
    lengths = [6, 2, 0, 5, 1]
    got = module(x, sequence_lengths=torch.tensor(lengths, dtype=dtype))[0]
    want = module(x, sequence_lengths=torch.tensor(lengths))[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_ops_training_forward_under_inference_mode():
    x, h, c, params, lengths, attrs = _op_call("lstm", True, LENGTHS["ragged"])
    with torch.inference_mode():
        out = torch.ops.pycudnnrnn.forward(x.detach(), h.detach(), c.detach(),
                                           params.detach(), lengths, None, *attrs)
    assert out[3].numel() == prt.torch_kernels.RESERVE_NBYTES
    with prt.cpu_kernels("numpy"):
        want = torch.ops.pycudnnrnn.forward(x.detach(), h.detach(), c.detach(),
                                            params.detach(), lengths, None, *attrs)
    for a, b in zip(out[:3], want[:3]):
        assert_ulp_close(a.numpy(), b.numpy())


def test_the_ops_results_are_fresh_and_its_reserve_knows_its_call():
    x, h, c, params, lengths, attrs = _op_call("lstm", True, LENGTHS["ragged"])
    detached = [t.detach() for t in (x, h, c, params)]
    out = torch.ops.pycudnnrnn.forward(*detached, lengths, None, *attrs)
    grads = [torch.randn_like(t) for t in out[:3]]

    def backprop(reserve, lengths=lengths, dropout=0.0):
        return torch.ops.pycudnnrnn.backprop(
            *detached, lengths, None, *out[:3], *grads, reserve, *attrs[:3], dropout,
            *attrs[4:6], "all")

    want = backprop(out[3])
    out[0].mul_(2)  # the caller's to write into: the graph keeps its own
    for a, b in zip(backprop(out[3]), want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="reserve_space: made by a forward call with a "
                                         "different identity"):
        backprop(out[3], lengths=torch.tensor([6, 6, 6, 6, 6]))
    with pytest.raises(ValueError, match="reserve_space: made by a forward call with a "
                                         "different identity"):
        backprop(out[3], dropout=0.5)
    with pytest.raises(ValueError, match="reserve_space: expected the uint8 array made by"):
        backprop(torch.zeros(prt.torch_kernels.RESERVE_NBYTES, dtype=torch.uint8))  # the NumPy's


def test_autograds_keys_taken_out_alike_with_and_without_the_memo(monkeypatch):
    """Remembered by raw key set where PyTorch gives one; the loop alone elsewhere."""
    exclude = torch._C._dispatch_tls_local_exclude_set().add(torch._C.DispatchKey.AutogradCPU)
    remembered = prt.torch_kernels._autograd_taken_out(exclude)
    monkeypatch.setattr(prt.torch_kernels, "_RAW_KEY_SETS", False)
    computed = prt.torch_kernels._autograd_taken_out(exclude)
    assert remembered.raw_repr() == computed.raw_repr()
    assert not computed.has(torch._C.DispatchKey.AutogradCPU)
    assert exclude.has(torch._C.DispatchKey.AutogradCPU)
