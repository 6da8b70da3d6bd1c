"""Second-order gradients through the op (``pycudnnrnn.torch.second_order``).

The op's routes (the NumPy kernels, PyTorch's kernels under torch.func, the stand-in GPU,
which runs the CUDA code) differentiate their first-order gradients again: checked
against finite differences of the op's own first order (``gradgradcheck``, whose first
order is cuDNN's on the stand-in: the NumPy backend there), against ``torch.nn`` in
float64, and for torch.func's transforms.
"""

import pytest

torch = pytest.importorskip("torch")

import pycudnnrnn  # noqa: E402
import pycudnnrnn.torch as prt  # noqa: E402
from pycudnnrnn.torch import native, second_order  # noqa: E402
from test_torch_ops import torch_on_stand_in  # noqa: E402,F401  (a fixture)

T, B, I, H = 4, 3, 3, 2

#: (rnn_mode, input_mode, direction, num_layers, num_proj, time_major, lengths)
CONFIGS = [
    ("lstm", "linear_input", "bidirectional", 2, 0, True, (4, 0, 2)),
    ("lstm", "linear_input", "unidirectional", 2, 1, False, (2, 4, 1)),
    ("gru", "skip_input", "bidirectional", 1, 0, False, None),
    ("gru", "linear_input", "unidirectional", 2, 0, True, (3, 4, 0)),
    ("rnn_tanh", "linear_input", "bidirectional", 2, 0, False, (1, 4, 3)),
    ("rnn_relu", "skip_input", "unidirectional", 2, 0, True, (4, 2, 3)),
]


def _call(config, seed=0):
    """``(function, inputs)``: ``prt.rnn`` for `config` as a function of its tensors."""
    mode, input_mode, direction, L, P, time_major, lengths = config
    torch.manual_seed(seed)
    D = 2 if direction == "bidirectional" else 1
    size = H if input_mode == "skip_input" else I
    n = pycudnnrnn.params_size(rnn_mode=mode, num_layers=L, num_units=H, input_size=size,
                               input_mode=input_mode, direction=direction, num_proj=P)
    f64 = dict(dtype=torch.float64, requires_grad=True)
    x = torch.randn(*((T, B) if time_major else (B, T)), size, **f64)
    state = (L * D, B) if time_major else (B, L * D)
    h = torch.randn(*state, P or H, **f64)
    c = torch.randn(*state, H, **f64) if mode == "lstm" else None
    params = (0.8 * torch.rand(n, dtype=torch.float64) - 0.4).requires_grad_()

    def function(x, h, params, *c):
        y, hy, cy = prt.rnn(x, h, c[0] if c else None, params, lengths, rnn_mode=mode,
                            input_mode=input_mode, direction=direction, num_proj=P,
                            time_major=time_major)
        return (y, hy, cy) if mode == "lstm" else (y, hy)
    return function, (x, h, params) + ((c,) if c is not None else ())


@pytest.fixture(params=["numpy-kernels", "stand-in"])
def route(request, monkeypatch):
    """The op on the CPU's NumPy kernels, or on the stand-in GPU (the CUDA code: cuDNN's
    calls are the fake's, the tensors CPU tensors taken as CUDA ones)."""
    monkeypatch.setattr(native._choice, "kernels", "numpy")
    if request.param == "stand-in":
        request.getfixturevalue("torch_on_stand_in")
    return request.param


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c[:5])))
def test_second_order_equals_finite_differences_of_the_first(config, route):
    function, inputs = _call(config)
    assert torch.autograd.gradgradcheck(function, inputs, fast_mode=True, rtol=1e-5, atol=1e-8)


def test_a_gradient_penalty_equals_torch_nn(monkeypatch):
    """The drop-ins on the op (NumPy kernels) against torch.nn's LSTM, float64: the
    gradient of a penalty on the input's and the weights' gradients."""
    monkeypatch.setattr(native._choice, "kernels", "numpy")
    torch.manual_seed(0)
    reference = torch.nn.LSTM(I, H, 2, bidirectional=True, proj_size=1, dtype=torch.float64)
    ours = prt.LSTM.from_torch(reference)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    found = []
    for module in (reference, ours):
        params = list(module.parameters())
        grads = torch.autograd.grad(module(x)[0].tanh().sum(), [x, *params], create_graph=True)
        penalty = sum(g.square().sum() for g in grads)
        found.append(torch.autograd.grad(penalty, [x, *params]))
    for got, want in zip(found[1], found[0]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_packed_batch_differentiates_twice_as_torch_nn(monkeypatch):
    monkeypatch.setattr(native._choice, "kernels", "numpy")
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.manual_seed(1)
    reference = torch.nn.GRU(I, H, 2, dtype=torch.float64)
    ours = prt.GRU.from_torch(reference)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    found = []
    for module in (reference, ours):
        packed = pack_padded_sequence(x, [2, 4, 1], enforce_sorted=False)
        _, h = module(packed)
        (gx,) = torch.autograd.grad(h.square().sum(), x, create_graph=True)
        found.append(torch.autograd.grad(gx.sin().sum(), [x, *module.parameters()]))
    for got, want in zip(found[1], found[0]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


TRANSFORMS = {
    "jacrev(grad)": lambda f, x: torch.func.jacrev(torch.func.grad(f))(x),
    "hessian": lambda f, x: torch.func.hessian(f)(x),
    "grad(grad)": lambda f, x: torch.func.grad(lambda x: torch.func.grad(f)(x).square().sum())(x),
    "jvp(grad)": lambda f, x: torch.func.jvp(torch.func.grad(f), (x,), (torch.cos(x),))[1],
    "jvp": lambda f, x: torch.func.jvp(f, (x,), (torch.cos(x),))[1],
}


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_torch_func_transforms_equal_torch_nn(transform, mode):
    """torch.func sends the drop-ins to the op (its CPU kernels here)."""
    torch.manual_seed(2)
    cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
    reference = cls(I, H, 2, dtype=torch.float64)
    ours = getattr(prt, cls.__name__).from_torch(reference)
    x = torch.randn(T, B, I, dtype=torch.float64)
    found = [TRANSFORMS[transform](lambda x: m(x)[0].square().sum() if transform != "jvp"
                                   else m(x)[0], x) for m in (reference, ours)]
    torch.testing.assert_close(found[1], found[0], rtol=1e-10, atol=1e-12)


def test_the_second_order_is_computed_only_when_asked_for(route, monkeypatch):
    """First-order steps, with or without create_graph, never recompute; the second
    derivative recomputes once."""
    calls = []
    real = second_order.recompute
    monkeypatch.setattr(second_order, "recompute", lambda *a: calls.append(1) or real(*a))
    function, inputs = _call(CONFIGS[0])
    function(*inputs)[0].sum().backward()
    (gx,) = torch.autograd.grad(function(*inputs)[0].sum(), inputs[0], create_graph=True)
    torch.func.grad(lambda x: function(x, *inputs[1:])[0].sum())(inputs[0].detach())
    assert calls == []
    gx.square().sum().backward()
    assert len(calls) == 1


def test_dropout_between_layers_refuses_a_second_derivative_clearly(route):
    torch.manual_seed(0)
    with native.cpu_kernels("numpy"):
        model = prt.LSTM(I, H, 2, dropout=0.5, dtype=torch.float64)
        x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
        (gx,) = torch.autograd.grad(model(x)[0].sum(), x, create_graph=True)
        with pytest.raises(NotImplementedError, match="through dropout between layers"):
            gx.square().sum().backward()
        one_layer = prt.LSTM(I, H, 1, dropout=0.0, dtype=torch.float64)
        (gx,) = torch.autograd.grad(one_layer(x)[0].sum(), x, create_graph=True)
        gx.square().sum().backward()  # no mask drawn: fine
        model.eval()  # no mask either
        (gx,) = torch.autograd.grad(model(x)[0].sum(), x, create_graph=True)
        gx.square().sum().backward()


def test_output_gradients_that_depend_on_the_outputs_differentiate_too(route):
    """A loss whose gradient with respect to the outputs depends on them (and so on the
    weights): the second derivative flows through those output gradients as well."""
    function, inputs = _call(CONFIGS[3])
    x, h, params = inputs
    y = function(x, h, params)[0]
    (gp,) = torch.autograd.grad((y.square() * y).sum(), params, create_graph=True)
    (got,) = torch.autograd.grad(gp.square().sum(), x)

    with native.cpu_kernels("torch"):  # PyTorch's own kernels, twice differentiable
        mode, input_mode, direction, L, P, time_major, lengths = CONFIGS[3]
        y = native.rnn(x, h, None, [params], None, torch.tensor(lengths), mode, direction,
                       time_major)[0]
        (gp,) = torch.autograd.grad((y.square() * y).sum(), params, create_graph=True)
        (want,) = torch.autograd.grad(gp.square().sum(), x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
