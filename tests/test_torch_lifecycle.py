"""The drop-ins after the first training run: what users do to a module next.

Weights replaced by strided tensors, moves, copies, pickles and loads; seeded models and
their copies; the swap mode FSDP2 and ``to_empty`` use. Each as ``torch.nn`` does.
"""

import copy
import pickle

import pytest

torch = pytest.importorskip("torch")

import pycudnnrnn.torch as prt  # noqa: E402

KINDS = [("LSTM", {}), ("LSTM", {"proj_size": 2}), ("GRU", {}), ("RNN", {"nonlinearity": "relu"})]
T, B, I, H = 5, 3, 4, 6


def _pair(kind, options, **more):
    torch.manual_seed(0)
    ours = getattr(prt, kind)(I, H, **options, **more)
    theirs = getattr(torch.nn, kind)(I, H, **options, **more)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _assert_same(ours, theirs, dtype=torch.float32):
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert torch.equal(a, b), name
    x = torch.randn(T, B, I, dtype=dtype)
    out, state = ours(x)
    want_out, want_state = theirs(x)
    torch.testing.assert_close(out, want_out)
    for a, b in zip(state if isinstance(state, tuple) else [state],
                    want_state if isinstance(want_state, tuple) else [want_state]):
        torch.testing.assert_close(a, b)


def _transposed(weight):
    """The values of `weight` in a tensor of its shape that is a transpose (strided)."""
    return weight.detach().clone().t().contiguous().t()


_AFTERWARDS = {
    "to": lambda m: m.to("cpu"),
    "double": lambda m: m.double(),
    "deepcopy": copy.deepcopy,
    "pickle": lambda m: pickle.loads(pickle.dumps(m)),
    "flatten": lambda m: (m.flatten_parameters(), m)[1],
}


@pytest.mark.parametrize("kind,options", KINDS)
@pytest.mark.parametrize("then", list(_AFTERWARDS))
def test_a_strided_weight_keeps_its_values_through_what_follows(kind, options, then):
    """`.data = w.t()` then a move, copy or flatten re-pointed the weight into the flat
    buffer with its old strides: permuted values, outputs 0.2-0.95 off torch.nn's."""
    ours, theirs = _pair(kind, options)
    strided = _transposed(torch.randn(ours.weight_hh_l0.shape))
    assert not strided.is_contiguous()
    ours.weight_hh_l0.data = strided.clone()
    theirs.weight_hh_l0.data = strided.clone()
    ours, theirs = _AFTERWARDS[then](ours), _AFTERWARDS[then](theirs)
    _assert_same(ours, theirs, torch.float64 if then == "double" else torch.float32)


@pytest.mark.parametrize("kind,options", KINDS)
def test_a_strided_parameter_set_or_assigned_keeps_its_values(kind, options):
    ours, theirs = _pair(kind, options)
    weight = torch.nn.Parameter(_transposed(torch.randn(ours.weight_ih_l0.shape)))
    ours.weight_ih_l0 = weight
    theirs.weight_ih_l0 = torch.nn.Parameter(weight.detach().clone())
    _assert_same(ours, theirs)
    assert ours.weight_ih_l0 is weight  # re-laid out in place: an optimizer still holds it

    state = {k: _transposed(v) for k, v in theirs.state_dict().items()}  # a TF/Keras kernel
    ours.load_state_dict(state, assign=True)
    theirs.load_state_dict(state, assign=True)
    _assert_same(ours, theirs)


@pytest.mark.parametrize("kind,options", KINDS)
def test_building_a_module_draws_what_torch_nn_draws(kind, options):
    """The dropout seed was drawn at construction: every layer built after the RNN in a
    seeded model got other weights than with torch.nn."""
    torch.manual_seed(0)
    ours = getattr(prt, kind)(I, H, num_layers=2, dropout=0.3, **options)
    after_ours = torch.randn(8)
    torch.manual_seed(0)
    theirs = getattr(torch.nn, kind)(I, H, num_layers=2, dropout=0.3, **options)
    after_theirs = torch.randn(8)
    assert torch.equal(after_ours, after_theirs)
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
                         ids=["deepcopy", "pickle"])
def test_copies_draw_nothing_and_still_hold_a_seed_of_their_own(copier):
    module = prt.LSTM(I, H, num_layers=2, dropout=0.5)
    torch.manual_seed(3)
    twin = copier(module)  # an EMA copy, each step
    assert torch.equal(torch.randn(4), torch.manual_seed(3) and torch.randn(4))
    assert twin.gpu_seed != module.gpu_seed  # a dropout state of its own
    given = prt.CudnnRNN(I, H, 2, dropout=0.5, seed=77)
    assert copier(given).gpu_seed == 77


def test_a_cpu_training_call_without_dropout_draws_nothing():
    module = prt.GRU(I, H, num_layers=2)
    x = torch.randn(T, B, I)
    torch.manual_seed(4)
    module(x)[0].sum().backward()
    assert torch.equal(torch.randn(4), torch.manual_seed(4) and torch.randn(4))


@pytest.fixture
def swap_mode():
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    yield
    torch.__future__.set_swap_module_params_on_conversion(previous)


@pytest.mark.parametrize("kind,options", KINDS)
def test_from_torch_and_conversions_work_in_swap_mode(swap_mode, kind, options):
    """The mode FSDP2 and to_empty use: from_torch raised "Cannot swap ... weakref"."""
    torch.manual_seed(0)
    theirs = getattr(torch.nn, kind)(I, H, num_layers=2, **options)
    ours = getattr(prt, kind).from_torch(theirs)
    _assert_same(ours, theirs)
    kept = [id(p) for p in ours.parameters()]
    ours = ours.to(torch.float64)  # each Parameter object kept, as torch.nn keeps them
    theirs = theirs.to(torch.float64)
    assert [id(p) for p in ours.parameters()] == kept
    assert all(p.dtype == torch.float64 for p in ours.parameters())
    _assert_same(ours, theirs, torch.float64)
    back = ours.to_torch()
    assert type(back) is getattr(torch.nn, kind)
    _assert_same(ours, back, torch.float64)
    ours.load_state_dict(theirs.state_dict())  # torch.nn's own load fails in this mode


def test_to_empty_then_load_as_on_the_meta_device(swap_mode):
    with torch.device("meta"):
        ours = prt.LSTM(I, H, num_layers=2)
    ours = ours.to_empty(device="cpu")
    torch.manual_seed(0)
    theirs = torch.nn.LSTM(I, H, num_layers=2)
    ours.load_state_dict(theirs.state_dict())
    _assert_same(ours, theirs)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_a_non_bool_bidirectional_is_refused_at_the_call_as_torch_nn(kind):
    ours = getattr(prt, kind)(I, H, bidirectional=1)  # built, as torch.nn builds it
    theirs = getattr(torch.nn, kind)(I, H, bidirectional=1)
    x = torch.randn(T, B, I)
    with pytest.raises(TypeError):
        theirs(x)
    with pytest.raises(TypeError, match="bidirectional should be of type bool, got: int"):
        ours(x)


def test_a_modules_cuda_seed_follows_torch_manual_seed_from_run_to_run():
    import subprocess
    import sys
    script = ("import torch, pycudnnrnn.torch as prt; torch.manual_seed({}); "
              "print(prt.LSTM(3, 4, 2, dropout=0.5).gpu_seed, prt.GRU(3, 4).gpu_seed)")
    runs = [subprocess.run([sys.executable, "-c", script.format(seed)], capture_output=True,
                           text=True, check=True).stdout.split() for seed in (0, 0, 1)]
    assert runs[0] == runs[1] and len(set(runs[0])) == 2  # repeated; one per module
    assert not set(runs[0]) & set(runs[2])


@pytest.mark.parametrize("kind,options", KINDS)
def test_conversions_draw_nothing(kind, options):
    theirs = getattr(torch.nn, kind)(I, H, num_layers=2, **options)
    torch.manual_seed(6)
    ours = getattr(prt, kind).from_torch(theirs)
    back = ours.to_torch()
    assert torch.equal(torch.randn(4), torch.manual_seed(6) and torch.randn(4))
    _assert_same(ours, theirs)
    _assert_same(ours, back)
