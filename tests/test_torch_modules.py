"""pycudnnrnn.torch.LSTM / GRU / RNN against torch.nn's: values, gradients, conversions, errors."""

import itertools

import pytest

torch = pytest.importorskip("torch")

import pycudnnrnn.torch as prt  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

KINDS = [("LSTM", {}), ("LSTM", {"proj_size": 2}), ("GRU", {}),
         ("RNN", {"nonlinearity": "tanh"}), ("RNN", {"nonlinearity": "relu"})]
GRID = list(itertools.product(KINDS, [False, True], [False, True], ["dense", "packed"]))
I, H, L, T, B = 3, 4, 2, 5, 3


def _pair(kind, extra, seed=0, **options):
    torch.manual_seed(seed)
    reference = getattr(torch.nn, kind)(I, H, L, **extra, **options, dtype=torch.float64)
    return reference, getattr(prt, kind).from_torch(reference)


def _states(kind, extra, batch, rng_seed=1):
    D = 2
    g = torch.Generator().manual_seed(rng_seed)
    h = torch.randn(L * D, batch, extra.get("proj_size", H), generator=g, dtype=torch.float64)
    if kind != "LSTM":
        return h.requires_grad_()
    return (h.requires_grad_(),
            torch.randn(L * D, batch, H, generator=g, dtype=torch.float64).requires_grad_())


def _leaves(hx):
    return list(hx) if isinstance(hx, tuple) else [hx]


def _run(module, x, hx, lengths, batch_first):
    """Output as a padded tensor, states, and the gradients of a fixed loss."""
    inputs = x
    if lengths is not None:
        inputs = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    out, state = module(inputs, hx)
    if lengths is not None:
        out = pad_packed_sequence(out, batch_first=batch_first, total_length=T)[0]
    states = _leaves(state)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    loss = (out * weights).sum() + sum((s * (k + 1.5)).sum() for k, s in enumerate(states))
    leaves = [x] + _leaves(hx) + list(module.parameters())
    grads = torch.autograd.grad(loss, leaves)
    return out, states, grads


@pytest.mark.parametrize("spec,bidirectional,batch_first,form", GRID,
                         ids=[f"{k}{e}-bi{b}-bf{f}-{p}" for (k, e), b, f, p in GRID])
def test_equals_torch_nn_in_values_and_gradients(spec, bidirectional, batch_first, form):
    kind, extra = spec
    options = dict(extra, bidirectional=bidirectional, batch_first=batch_first)
    reference, ours = _pair(kind, extra, bidirectional=bidirectional, batch_first=batch_first)
    D = 2 if bidirectional else 1
    g = torch.Generator().manual_seed(2)
    shape = (B, T, I) if batch_first else (T, B, I)
    x = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    hx = _states(kind, extra, B)
    if D == 1:
        hx = tuple(s[:L].detach().requires_grad_() for s in _leaves(hx))
        hx = hx if kind == "LSTM" else hx[0]
    lengths = torch.tensor([2, 5, 3]) if form == "packed" else None  # unsorted on purpose
    out_ref, states_ref, grads_ref = _run(reference, x, hx, lengths, batch_first)
    out, states, grads = _run(ours, x, hx, lengths, batch_first)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    for s, s_ref in zip(states, states_ref):
        assert s.shape == s_ref.shape and s.is_contiguous()
        torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12)
    n_data = 1 + len(_leaves(hx))
    for g_ours, g_ref in zip(grads[:n_data], grads_ref[:n_data]):
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-10, atol=1e-12)
    # torch.nn's parameters, in its order: the gradients pair up by name
    names = [n for n, _ in ours.named_parameters()]
    assert names == [n for n, _ in reference.named_parameters()]
    for name, g_ours, g_ref in zip(names, grads[n_data:], grads_ref[n_data:]):
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-10, atol=1e-12, msg=name)


def test_packed_output_keeps_the_input_order_and_indices():
    reference, ours = _pair("GRU", {})
    x = torch.randn(T, 4, I, dtype=torch.float64)
    packed = pack_padded_sequence(x, torch.tensor([3, 5, 5, 1]), enforce_sorted=False)
    out_ref, h_ref = reference(packed)
    out, h = ours(packed)
    assert torch.equal(out.batch_sizes, out_ref.batch_sizes)
    assert torch.equal(out.sorted_indices, out_ref.sorted_indices)
    assert torch.equal(out.unsorted_indices, out_ref.unsorted_indices)
    torch.testing.assert_close(out.data, out_ref.data, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)


def test_unbatched_input_as_torch():
    reference, ours = _pair("LSTM", {"proj_size": 2})
    x = torch.randn(T, I, dtype=torch.float64)
    hx = (torch.randn(L, 2, dtype=torch.float64), torch.randn(L, H, dtype=torch.float64))
    out_ref, (h_ref, c_ref) = reference(x, hx)
    out, (h, c) = ours(x, hx)
    assert out.shape == out_ref.shape and h.shape == h_ref.shape and c.shape == c_ref.shape
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c, c_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind,extra", KINDS + [("LSTM", {"bias": False}), ("GRU", {"bias": False})])
def test_from_torch_and_to_torch_are_exact(kind, extra):
    torch.manual_seed(5)
    reference = getattr(torch.nn, kind)(I, H, L, bidirectional=True, batch_first=True,
                                        dropout=0.25, **extra)
    ours = getattr(prt, kind).from_torch(reference)
    assert (ours.bias, ours.batch_first, ours.dropout) == (reference.bias, True, 0.25)
    back = ours.to_torch()
    assert type(back) is type(reference)
    assert back.batch_first and back.dropout == 0.25 and back.bias == reference.bias
    theirs, mine = reference.state_dict(), back.state_dict()
    assert list(mine) == list(theirs)
    for key in theirs:
        assert torch.equal(mine[key], theirs[key]), key
    again = getattr(prt, kind).from_torch(back)
    assert torch.equal(again.params, ours.params)


def test_checkpoints_load_both_ways_with_torch_nns_keys():
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 3),
                                 torch.nn.LSTM(3, 4, 2, bidirectional=True, proj_size=2))
    ours = torch.nn.Sequential(torch.nn.Linear(3, 3),
                               prt.LSTM(3, 4, 2, bidirectional=True, proj_size=2))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
    torch.manual_seed(1)
    back = torch.nn.Sequential(torch.nn.Linear(3, 3),
                               torch.nn.LSTM(3, 4, 2, bidirectional=True, proj_size=2))
    back.load_state_dict(ours.state_dict())  # and ours into torch.nn's
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), theirs.parameters()))
    with pytest.raises(RuntimeError, match="size mismatch for weight_ih_l0"):
        prt.LSTM(5, 4, 2, bidirectional=True, proj_size=2).load_state_dict(
            theirs[1].state_dict())


def test_a_checkpoint_of_the_earlier_flat_params_still_loads():
    torch.manual_seed(0)
    theirs = torch.nn.GRU(3, 4, 2, bias=False)
    ours = prt.GRU(3, 4, 2, bias=False)
    flat = prt.GRU.from_torch(theirs).params.clone()
    ours.load_state_dict({"params": flat})  # what pycudnnrnn 0.1 saved
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))


def test_from_torch_refuses_another_class():
    with pytest.raises(TypeError, match="module: expected torch.nn.LSTM, got torch.nn.modules.rnn.GRU"):
        prt.LSTM.from_torch(torch.nn.GRU(2, 3))


def test_bias_false_has_torchs_parameters_and_zero_biases_through_training():
    reference, ours = _pair("LSTM", {}, bias=False)
    assert len(list(ours.parameters())) == len(list(reference.parameters())) == 2 * L
    x = torch.randn(T, B, I, dtype=torch.float64)
    torch.testing.assert_close(ours(x)[0], reference(x)[0], rtol=1e-12, atol=1e-12)
    opt = torch.optim.SGD(ours.parameters(), lr=0.5, momentum=0.9, weight_decay=0.1)
    for _ in range(3):
        opt.zero_grad()
        ours(x)[0].square().sum().backward()
        opt.step()
    _, biases = __import__("pycudnnrnn").params_to_canonical(ours.params.numpy(), **ours.attrs)
    assert all((b == 0).all() for b in biases)
    with torch.no_grad():
        ours.params[-1] = 7.0  # a bias written by hand into the flat buffer does not count
    torch.testing.assert_close(ours(x)[0], ours.to_torch()(x)[0], rtol=1e-12, atol=1e-12)


def test_constructor_signature_matches_torch():
    ours = prt.RNN(3, 4, 2, "relu", False, True, 0.5, True)
    assert (ours.nonlinearity, ours.bias, ours.batch_first, ours.dropout, ours.bidirectional) == \
        ("relu", False, True, 0.5, True)
    lstm = prt.LSTM(3, 4, 1, True, False, 0.0, False, 2)
    assert lstm.proj_size == 2
    assert ours.params.dtype == torch.get_default_dtype()
    assert prt.GRU(3, 4, dtype=torch.float64).params.dtype == torch.float64
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        prt.GRU(3, 4, dropout=0.5)
    with pytest.raises(ValueError, match="proj_size has to be smaller than hidden_size"):
        prt.LSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match="Unknown nonlinearity 'gelu'. Select from 'tanh' or"):
        prt.RNN(3, 4, nonlinearity="gelu")


# --------------------------------------------------------------------------- bad input

def test_state_shape_errors_name_the_argument_and_the_layout():
    ours = prt.LSTM(3, 4, batch_first=True)
    x = torch.randn(2, 5, 3)
    batch_major = (torch.zeros(2, 1, 4), torch.zeros(2, 1, 4))
    with pytest.raises(ValueError, match=r"^Expected hidden\[0\] size \(1, 2, 4\), got "
                                         r"\[2, 1, 4\]; h_0 is .*not batch-first even with "
                                         r"batch_first=True"):
        ours(x, batch_major)
    with pytest.raises(ValueError, match=r"^Expected hidden\[1\] size \(1, 2, 4\), got "
                                         r"\[1, 3, 4\]; c_0 is"):
        ours(x, (torch.zeros(1, 2, 4), torch.zeros(1, 3, 4)))
    with pytest.raises(TypeError, match=r"hx: expected a tuple \(h_0, c_0\)"):
        ours(x, torch.zeros(1, 2, 4))
    gru = prt.GRU(3, 4, num_layers=2)
    with pytest.raises(ValueError, match=r"^Expected hidden size \(2, 5, 4\), got \[1, 5, 4\]"):
        gru(torch.randn(7, 5, 3), torch.zeros(1, 5, 4))


def test_batch_first_states_that_happen_to_fit_are_not_misread():
    """B == L·D: a batch-major state has the right shape, and means the wrong thing.

    The module takes states as torch.nn does ([L·D, B, H] always), so it equals nn.GRU.
    """
    torch.manual_seed(0)
    reference = torch.nn.GRU(3, 4, num_layers=2, batch_first=True, dtype=torch.float64)
    ours = prt.GRU.from_torch(reference)
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    h0 = torch.randn(2, 2, 4, dtype=torch.float64)
    torch.testing.assert_close(ours(x, h0)[1], reference(x, h0)[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours(x, h0)[0], reference(x, h0)[0], rtol=1e-12, atol=1e-12)


def test_dtype_device_and_size_errors():
    ours = prt.GRU(3, 4)
    with pytest.raises(TypeError, match=r"^RNN input dtype \(torch.float64\) does not "
                                        r"match weight dtype \(torch.float32\)"):
        ours(torch.randn(5, 2, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="hx: expected dtype torch.float32 .*input.*got torch.float64"):
        ours(torch.randn(5, 2, 3), torch.zeros(1, 2, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="hx: expected a tensor with data on cpu, got a tensor "
                                        "on the meta device"):
        ours(torch.randn(5, 2, 3), torch.zeros(1, 2, 4, device="meta"))
    with pytest.raises(ValueError, match=r"^input.size\(-1\) must be equal to input_size. "
                                         r"Expected 3, got 4; input has shape \(5, 2, 4\)"):
        ours(torch.randn(5, 2, 4))
    with pytest.raises(ValueError, match=r"^GRU: Expected input to be 2D or 3D, got 4D instead"):
        ours(torch.randn(5, 2, 3, 1))
    with pytest.raises(ValueError, match="^For unbatched 2-D input, hx should also be 2-D but "
                                         "got 3-D tensor"):
        ours(torch.randn(5, 3), torch.zeros(1, 1, 4))
    packed = pack_padded_sequence(torch.randn(5, 2, 3), [5, 2])
    with pytest.raises(TypeError, match="sequence_lengths: a PackedSequence carries its lengths"):
        ours(packed, sequence_lengths=[5, 2])
    with pytest.raises(ValueError, match="sequence_lengths: expected values in \\[0, 5\\]"):
        ours(torch.randn(5, 2, 3), sequence_lengths=[6, 2])


# --------------------------------------------------------------------------- modes

def test_eval_mode_backward_gives_input_gradients_and_no_weight_gradients():
    reference, ours = _pair("LSTM", {}, dropout=0.5)
    ours.eval(), reference.eval()
    ours.requires_grad_(False)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    out = ours(x)[0]
    (grad,) = torch.autograd.grad(out.sum(), x)
    x_ref = x.detach().requires_grad_()
    (grad_ref,) = torch.autograd.grad(reference(x_ref)[0].sum(), x_ref)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-12)
    assert ours.params.grad is None
    with torch.no_grad():  # and inference without a reserve space when nothing needs grad
        torch.testing.assert_close(ours(x)[0], out.detach(), rtol=0, atol=0)


def test_only_the_gradients_needed_are_computed(monkeypatch):
    """(The op's backprop: on the NumPy kernels; PyTorch's autograd decides on its own.)"""
    from pycudnnrnn.torch import op_backends as kernels
    monkeypatch.setattr(prt.torch_kernels._choice, "kernels", "numpy")
    asked = []
    real = kernels.run_backprop

    def spy(*args):
        asked.append(args[14])  # gradients (then trust_reserve)
        return real(*args)

    monkeypatch.setattr(kernels, "run_backprop", spy)
    ours = prt.GRU(3, 4, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    ours(x)[0].sum().backward()
    ours.requires_grad_(False)
    ours(x)[0].sum().backward()
    ours.requires_grad_(True)
    ours(x.detach())[0].sum().backward()
    assert asked == ["all", "data", "weights"]


def test_the_pytorch_pages_first_example_gives_the_shapes_it_states():
    """docs/pytorch.md's first example (every block of the page runs in
    tests/test_docs_blocks.py; here, what its comments say)."""
    import os
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "docs", "pytorch.md"), encoding="utf-8").read()
    first = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    namespace = {}
    exec(compile(first, "pytorch.md", "exec"), namespace)
    shapes = [tuple(namespace[n].shape) for n in ("output", "h_n", "c_n")]
    assert shapes == [(4, 7, 20), (2, 4, 20), (2, 4, 20)]
    assert "# [4, 7, 20]; h_n and c_n are [2, 4, 20]" in first


def test_bfloat16_module_follows_the_float32_network():
    torch.manual_seed(0)
    reference = torch.nn.LSTM(I, H, L, bidirectional=True)
    ours = prt.LSTM.from_torch(reference).to(torch.bfloat16)
    x = torch.randn(T, B, I)
    x_bf16 = x.to(torch.bfloat16).requires_grad_()
    out, (h, c) = ours(x_bf16)
    assert out.dtype == h.dtype == c.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(x_bf16.detach().float())[0],
                               rtol=0, atol=2e-2)
    out.float().square().sum().backward()
    assert x_bf16.grad.dtype == ours.weight_ih_l0.grad.dtype == torch.bfloat16


def test_the_readme_torch_example_runs():
    """With backend aot_eager, to keep CI short: inductor is tested in test_torch_ops."""
    import os
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    block = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "prt." in b][0]
    namespace = {}
    torch._dynamo.reset()
    exec(compile(block.replace("fullgraph=True", "fullgraph=True, backend='aot_eager'"),
                 "README.md", "exec"), namespace)
    assert namespace["output"].shape == (8, 20, 64) and namespace["h_n"].shape == (2, 8, 64)


def test_a_module_is_freed_on_del_after_its_first_call_in_a_fresh_process():
    # PyTorch imports torch._dynamo on a custom op's first call, and that import leaves
    # its callers' frames (the module among them) in a reference cycle. Under DDP the
    # cycle kept the process group alive into interpreter exit, where gloo aborted.
    import subprocess
    import sys
    script = (
        "import gc, weakref, torch, pycudnnrnn.torch as prt\n"
        "gc.disable()\n"
        "prt.set_cpu_kernels('numpy')  # the op, whose first call imports torch._dynamo\n"
        "m = prt.LSTM(3, 4, dtype=torch.float64)\n"
        "m(torch.randn(5, 2, 3, dtype=torch.float64))[0].sum().backward()\n"
        "r = weakref.ref(m)\n"
        "del m\n"
        "assert r() is None, 'the module outlived its last reference'\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- torch.nn's parameters

def test_the_weights_are_views_of_one_buffer_that_the_op_gets_without_a_copy(monkeypatch):
    """(The op: on the NumPy kernels. PyTorch's take the views as torch.nn's weights.)"""
    from pycudnnrnn.torch import op_backends as kernels
    monkeypatch.setattr(prt.torch_kernels._choice, "kernels", "numpy")
    seen = []
    real = kernels._flat

    def spy(params):  # the flat params the NumPy backend gets
        flat = real(params)
        seen.append(flat.data_ptr())
        return flat

    monkeypatch.setattr(kernels, "_flat", spy)
    reference, ours = _pair("LSTM", {"proj_size": 2}, bidirectional=True)
    buffer = ours.params
    assert all(p.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
               for p in ours.parameters())
    x = torch.randn(T, B, I, dtype=torch.float64)
    ours(x)[0].sum().backward()
    assert seen == [buffer.data_ptr()] * 2  # forward, then backprop
    grads = [p.grad for p in ours.parameters()]  # each a view of one flat gradient
    assert len({g.untyped_storage().data_ptr() for g in grads}) == 1
    assert ours.params_grad.data_ptr() == grads[0].untyped_storage().data_ptr()
    with torch.no_grad():  # the buffer writes through to the named weights
        ours.params.mul_(0.5)
    torch.testing.assert_close(ours.weight_hh_l1_reverse, reference.weight_hh_l1_reverse * 0.5)
    ours.double()  # a conversion lays them out again
    assert ours.params.untyped_storage().data_ptr() == \
        ours.weight_ih_l0.untyped_storage().data_ptr()


def test_name_based_init_parametrizations_and_pruning_apply_as_on_torch_nn():
    from torch.nn.utils import parametrizations, prune
    reference, ours = _pair("GRU", {}, bidirectional=True)
    for module in (reference, ours):
        torch.manual_seed(3)
        for name, p in module.named_parameters():
            if "weight_hh" in name:
                torch.nn.init.orthogonal_(p)
        parametrizations.weight_norm(module, "weight_ih_l0")
        prune.l1_unstructured(module, "weight_hh_l1", amount=0.5)
    x = torch.randn(T, B, I, dtype=torch.float64)
    results = []
    for module in (reference, ours):
        out = module(x)[0]
        leaves = [p for p in module.parameters()]
        results.append((out, torch.autograd.grad(out.square().sum(), leaves)))
    torch.testing.assert_close(results[1], results[0], rtol=1e-10, atol=1e-12)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in reference.named_parameters()]


def test_an_empty_batch_gives_empty_results_as_torch_nn():
    reference, ours = _pair("LSTM", {"proj_size": 2}, bidirectional=True, batch_first=True)
    x = torch.randn(0, T, I, dtype=torch.float64)
    out_ref, (h_ref, c_ref) = reference(x)
    out, (h, c) = ours(x)
    assert (out.shape, h.shape, c.shape) == (out_ref.shape, h_ref.shape, c_ref.shape)
    out.sum().backward()  # connected to the weights, whose gradients are zero
    assert all(p.grad is not None and not p.grad.any() for p in ours.parameters())


@pytest.mark.parametrize("kind", ["GRU", "RNN"])
def test_unbatched_input_of_gru_and_rnn(kind):
    reference, ours = _pair(kind, {})
    x = torch.randn(T, I, dtype=torch.float64)
    for hx in (None, torch.randn(L, H, dtype=torch.float64)):
        out_ref, h_ref = reference(x, hx)
        out, h = ours(x, hx)
        assert out.shape == out_ref.shape == (T, H) and h.shape == h_ref.shape == (L, H)
        torch.testing.assert_close((out, h), (out_ref, h_ref), rtol=1e-12, atol=1e-12)


def test_bad_calls_raise_what_torch_nn_raises_and_the_librarys_types():
    ours = prt.LSTM(3, 4)
    for bad in (lambda: ours(torch.randn(5, 2, 4)),
                lambda: ours(torch.randn(5, 2, 3), (torch.zeros(1, 3, 4), torch.zeros(1, 2, 4)))):
        with pytest.raises(RuntimeError) as caught:  # as nn.LSTM
            bad()
        assert isinstance(caught.value, ValueError)  # the library's contract
    with pytest.raises(RuntimeError) as caught:
        ours(torch.randn(5, 2, 3), torch.zeros(1, 2, 4))  # not a pair
    assert isinstance(caught.value, TypeError)
    with pytest.raises(RuntimeError) as caught:  # a state on another device (meta here)
        ours(torch.randn(5, 2, 3), (torch.zeros(1, 2, 4, device="meta"), torch.zeros(1, 2, 4)))
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, prt.InputTypeError)
    with pytest.raises(ValueError, match="proj_size argument is only supported for LSTM"):
        prt.GRU(3, 4, proj_size=0)
    with pytest.raises(ValueError, match="hidden_size must be greater than zero"):
        prt.LSTM(10, 0)
    with pytest.raises(TypeError, match="hidden_size should be of type int, got: float"):
        prt.LSTM(3, 5.0)
    with pytest.raises(TypeError, match="batch_first should be of type bool, got: str"):
        prt.GRU(3, 4, batch_first="False")


@pytest.mark.parametrize("lengths", [[1.5, 2], "np-float", [True, 2], "ab", [float("nan"), 2],
                                     "tensor-float"])
def test_sequence_lengths_that_are_not_integers_are_refused(lengths):
    import numpy as np
    lengths = {"np-float": np.array([1.5, 2.0]),
               "tensor-float": torch.tensor([1.5, 2.0])}.get(
        lengths if isinstance(lengths, str) else None, lengths)
    gru = prt.GRU(3, 4)
    with pytest.raises(TypeError, match="sequence_lengths: expected integers"):
        gru(torch.randn(5, 2, 3), sequence_lengths=lengths)


def test_meta_tensors_are_refused_naming_the_argument():
    gru = prt.GRU(3, 4)
    x = torch.randn(5, 2, 3)
    with pytest.raises(TypeError, match="sequence_lengths: .*meta"):
        gru(x, sequence_lengths=torch.tensor([1, 2], device="meta"))
    with pytest.raises(TypeError, match="hx: .*meta"):
        gru(x, torch.zeros(1, 2, 4, device="meta"))
    with pytest.raises(TypeError, match="weight_ih_l0: .*meta"):
        prt.GRU(3, 4, device="meta")(x)
    with pytest.raises(TypeError, match="input: .*meta"):
        prt.GRU(3, 4, device="meta")(x.to("meta"))


@pytest.mark.parametrize("mode,bias,proj,bidirectional", [
    ("lstm", True, 2, True), ("lstm", False, 2, False), ("gru", False, 0, True),
    ("rnn_tanh", True, 0, False)])
def test_weight_offsets_agree_with_the_layout_table(mode, bias, proj, bidirectional):
    from pycudnnrnn.core.checks import make_config
    from pycudnnrnn.torch import flat_weights
    config = make_config(rnn_mode=mode, num_layers=3, num_units=5, input_size=2,
                         input_mode="linear_input", num_proj=proj,
                         direction="bidirectional" if bidirectional else "unidirectional")
    slots = flat_weights.layout_slots(config, bias)
    assert flat_weights.weight_offsets([s for _, s in slots], bias, proj > 0) == \
        [o for o, _ in slots]


def test_weights_that_are_not_views_are_concatenated_with_zero_biases():
    """functional_call swaps in other tensors: one concatenation, zeros for bias=False."""
    reference, ours = _pair("GRU", {}, bias=False, bidirectional=True)
    x = torch.randn(T, B, I, dtype=torch.float64)
    with torch.no_grad():
        ours.params[-1] = 5.0  # a stray value in the buffer's bias slots is not used either
    swapped = {k: v.detach().clone() * 0.5 for k, v in reference.named_parameters()}
    ours_out = torch.func.functional_call(ours, swapped, (x,))
    theirs = torch.func.functional_call(reference, swapped, (x,))
    torch.testing.assert_close(ours_out, theirs, rtol=1e-12, atol=1e-12)
