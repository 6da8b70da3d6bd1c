"""Weights between frameworks, and PyTorch autograd over pycudnnrnn (CPU)."""

import itertools
import os

import numpy as np
import pytest

import pycudnnrnn
from pycudnnrnn import convert

torch = pytest.importorskip("torch")

MODULES = [("LSTM", {}), ("LSTM", {"proj_size": 2}), ("GRU", {}),
           ("RNN", {"nonlinearity": "tanh"}), ("RNN", {"nonlinearity": "relu"})]
GRID = list(itertools.product(MODULES, [False, True], [1, 2, 3]))


def _module(kind, extra, bidirectional, layers, seed=0, **more):
    torch.manual_seed(seed)
    cls = getattr(torch.nn, kind)
    return cls(3, 4, num_layers=layers, bidirectional=bidirectional, **extra, **more).double()


def _grads_as_params(module):
    """The module's parameter gradients, laid out as params (a module whose weights are them)."""
    clone = _module(type(module).__name__, _extra(module), module.bidirectional, module.num_layers)
    with torch.no_grad():
        for (name, p), (_, q) in zip(module.named_parameters(), clone.named_parameters()):
            q.copy_(p.grad)
    return convert.from_torch(clone)[0].numpy()


def _extra(module):
    if type(module).__name__ == "RNN":
        return {"nonlinearity": module.nonlinearity}
    return {"proj_size": module.proj_size} if getattr(module, "proj_size", 0) else {}


@pytest.mark.parametrize("module_spec,bidirectional,layers", GRID,
                         ids=[f"{k}{e}-bi{b}-L{l}" for (k, e), b, l in GRID])
def test_forward_and_backprop_equal_torch(module_spec, bidirectional, layers):
    kind, extra = module_spec
    module = _module(kind, extra, bidirectional, layers)
    params, attrs = convert.from_torch(module)
    assert attrs["num_layers"] == layers and attrs["input_size"] == 3 and attrs["num_units"] == 4
    T, B, D = 6, 4, 2 if bidirectional else 1
    P = extra.get("proj_size", 4)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal((T, B, 3)), requires_grad=True)
    h0 = torch.tensor(rng.standard_normal((layers * D, B, P)), requires_grad=True)
    c0 = torch.tensor(rng.standard_normal((layers * D, B, 4)), requires_grad=True)
    lengths = [6, 2, 5, 1]
    lstm = kind == "LSTM"

    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
    out, state = module(packed, (h0, c0) if lstm else h0)
    y_ref = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)[0]
    h_ref, c_ref = state if lstm else (state, None)

    fwd_attrs = {k: v for k, v in attrs.items() if k not in ("num_layers", "num_units", "input_size")}
    y, hy, cy, reserve = pycudnnrnn.forward(x.detach().numpy(), h0.detach().numpy(),
                                            c0.detach().numpy() if lstm else None,
                                            params.numpy(), lengths, **fwd_attrs)
    np.testing.assert_allclose(y, y_ref.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(hy, h_ref.detach().numpy(), rtol=1e-12, atol=1e-12)
    if lstm:
        np.testing.assert_allclose(cy, c_ref.detach().numpy(), rtol=1e-12, atol=1e-12)

    dy, dh = rng.standard_normal(y.shape), rng.standard_normal(hy.shape)
    dc = rng.standard_normal(cy.shape) if lstm else None
    loss = (y_ref * torch.tensor(dy)).sum() + (h_ref * torch.tensor(dh)).sum()
    if lstm:
        loss = loss + (c_ref * torch.tensor(dc)).sum()
    loss.backward()
    grads = pycudnnrnn.backprop(x.detach().numpy(), h0.detach().numpy(),
                                c0.detach().numpy() if lstm else None, params.numpy(), lengths,
                                y, hy, cy, dy, dh, dc, reserve, **fwd_attrs)
    np.testing.assert_allclose(grads[0], x.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads[1], h0.grad.numpy(), rtol=1e-10, atol=1e-12)
    if lstm:
        np.testing.assert_allclose(grads[2], c0.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads[3], _grads_as_params(module), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("module_spec,bidirectional,layers", GRID,
                         ids=[f"{k}{e}-bi{b}-L{l}" for (k, e), b, l in GRID])
def test_to_torch_of_from_torch_is_the_module(module_spec, bidirectional, layers):
    kind, extra = module_spec
    module = _module(kind, extra, bidirectional, layers, seed=3)
    params, attrs = convert.from_torch(module)
    rebuilt = convert.to_torch(params, **attrs)
    assert type(rebuilt) is type(module)
    ours, theirs = rebuilt.state_dict(), module.state_dict()
    assert list(ours) == list(theirs)
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key
        assert ours[key].dtype == theirs[key].dtype


def test_to_torch_takes_numpy_params():
    attrs = dict(rnn_mode="gru", num_layers=2, num_units=3, input_size=2,
                 direction="bidirectional", num_proj=0)
    params = np.random.default_rng(0).standard_normal(pycudnnrnn.params_size(**attrs))
    module = convert.to_torch(params, **attrs)
    np.testing.assert_array_equal(convert.from_torch(module)[0].numpy(), params)


def test_to_torch_has_the_defaults_of_params_size():
    """direction, num_proj (and rnn_mode) were required; they default as everywhere else."""
    sizes = dict(num_layers=2, num_units=3, input_size=2)
    params = np.random.default_rng(0).standard_normal(pycudnnrnn.params_size(**sizes))
    module = convert.to_torch(params, **sizes)
    assert type(module) is torch.nn.LSTM and not module.bidirectional
    assert module.proj_size == 0 and module.num_layers == 2
    params2, attrs = convert.from_torch(module)
    np.testing.assert_array_equal(params2.numpy(), params)
    assert attrs == dict(rnn_mode="lstm", direction="unidirectional", num_proj=0, **sizes)


@pytest.mark.parametrize("input_mode", ["skip_input", "auto_select"])
def test_to_torch_refuses_skip_input_params(input_mode):
    attrs = dict(rnn_mode="gru", num_layers=1, num_units=3, input_size=3, input_mode=input_mode)
    params = np.zeros(pycudnnrnn.params_size(**attrs))
    with pytest.raises(ValueError, match=r"input_mode: PyTorch's RNNs have input matrices"):
        convert.to_torch(params, **attrs)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_from_torch_attrs_go_to_forward_and_backprop(kind):
    """The attribute dict was refused by forward (unexpected num_layers)."""
    module = _module(kind, {}, True, 2)
    params, attrs = convert.from_torch(module)
    x = torch.randn(5, 3, 3, dtype=torch.float64)
    h0 = torch.randn(4, 3, 4, dtype=torch.float64)
    c0 = torch.randn(4, 3, 4, dtype=torch.float64)
    lstm = kind == "LSTM"
    y_ref, state = module(x, (h0, c0) if lstm else h0)
    result = pycudnnrnn.forward(x, h0, c0, params, **attrs)
    np.testing.assert_allclose(result.output.numpy(), y_ref.detach().numpy(), rtol=1e-12,
                               atol=1e-12)
    ones = [torch.ones_like(t) for t in result[:3]]
    grads = pycudnnrnn.backprop(x, h0, c0, params, None, *result[:3], *ones,
                                result.reserve_space, **attrs)
    assert grads.params_backprop.shape == params.shape
    from pycudnnrnn.torch import rnn
    y_torch = rnn(x, h0, c0 if lstm else None, params, **attrs)[0]
    np.testing.assert_allclose(y_torch.detach().numpy(), y_ref.detach().numpy(), rtol=1e-12,
                               atol=1e-12)


def test_bias_free_module_gets_zero_biases():
    module = torch.nn.LSTM(3, 4, bias=False).double()
    params, attrs = convert.from_torch(module)
    weights, biases = pycudnnrnn.params_to_canonical(params.numpy(), **attrs)
    assert all(np.all(b == 0) for b in biases)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    y_ref = module(x)[0].detach().numpy()
    zeros = np.zeros((1, 2, 4))
    y = pycudnnrnn.forward(x.numpy(), zeros, zeros, params.numpy())[0]
    np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=1e-12)


def test_batch_first_module_maps_to_batch_major():
    module = torch.nn.GRU(3, 4, batch_first=True).double()
    params, attrs = convert.from_torch(module)
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    y_ref = module(x)[0].detach().numpy()
    y = pycudnnrnn.forward(x.numpy(), np.zeros((2, 1, 4)), None, params.numpy(), rnn_mode="gru",
                           time_major=not module.batch_first)[0]
    np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=1e-12)


def test_from_torch_refuses_other_modules():
    with pytest.raises(TypeError, match="module: expected torch.nn.LSTM, GRU or RNN, got Linear"):
        convert.from_torch(torch.nn.Linear(2, 2))


# --------------------------------------------------------------------------- autograd module

@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_gradcheck_of_the_autograd_function(mode):
    from pycudnnrnn.torch import rnn
    torch.manual_seed(0)
    L, D, T, B, I, H = 2, 2, 4, 3, 2, 3
    P = 2 if mode == "lstm" else H
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h = torch.randn(L * D, B, P, dtype=torch.float64, requires_grad=True)
    c = torch.randn(L * D, B, H, dtype=torch.float64, requires_grad=True) if mode == "lstm" else None
    attrs = dict(rnn_mode=mode, direction="bidirectional", num_proj=P if mode == "lstm" and P != H else 0)
    n = pycudnnrnn.params_size(num_layers=L, num_units=H, input_size=I, **attrs)
    p = (torch.rand(n, dtype=torch.float64) - 0.5).requires_grad_()
    lengths = [4, 0, 2]
    inputs = (x, h, c, p) if c is not None else (x, h, p)

    def f(*args):
        if c is None:
            args = (args[0], args[1], None, args[2])
        out = rnn(*args, lengths, **attrs)
        return out if c is not None else out[:2]

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_module_trains_and_matches_functional():
    from pycudnnrnn.torch import CudnnRNN
    torch.manual_seed(0)
    model = CudnnRNN(3, 5, 2, rnn_mode="lstm", bidirectional=True, num_proj=2).double()
    assert model.params.shape == (pycudnnrnn.params_size(rnn_mode="lstm", num_layers=2, num_units=5,
                                                         input_size=3, direction="bidirectional",
                                                         num_proj=2),)
    assert float(model.params.detach().abs().max()) <= 1 / np.sqrt(5)
    x = torch.randn(6, 4, 3, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 3, 0, 5])
    output, h_n, c_n = model(x, sequence_lengths=lengths)
    assert output.shape == (6, 4, 4) and h_n.shape == (4, 4, 2) and c_n.shape == (4, 4, 5)
    y = pycudnnrnn.forward(x.detach().numpy(), np.zeros((4, 4, 2)), np.zeros((4, 4, 5)),
                           model.params.detach().numpy(), [6, 3, 0, 5], rnn_mode="lstm",
                           direction="bidirectional", num_proj=2)[0]
    np.testing.assert_allclose(output.detach().numpy(), y, rtol=1e-12, atol=1e-15)
    (output.square().sum() + h_n.sum() + c_n.sum()).backward()
    assert x.grad is not None and model.params.grad is not None
    assert torch.all(x.grad[:, 2] == 0)  # the empty sequence
    # a few steps of training reduce a simple loss
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    target = torch.full((6, 4, 4), 0.5, dtype=torch.float64)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = (model(x.detach(), sequence_lengths=lengths)[0] - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_module_batch_major_and_given_states():
    from pycudnnrnn.torch import CudnnRNN
    model = CudnnRNN(3, 4, 1, rnn_mode="gru", time_major=False).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    h0 = torch.randn(2, 1, 4, dtype=torch.float64, requires_grad=True)
    output, h_n = model(x, h0)
    assert output.shape == (2, 5, 4) and h_n.shape == (2, 1, 4)
    h_n.sum().backward()
    assert h0.grad.shape == h0.shape
    model.eval()
    assert torch.equal(model(x, h0)[0], output)  # no dropout: same function in eval


def test_inference_forward_cannot_backprop():
    from pycudnnrnn.torch import rnn
    x = torch.randn(3, 2, 2, dtype=torch.float64, requires_grad=True)
    h = torch.zeros(1, 2, 3, dtype=torch.float64)
    p = torch.rand(pycudnnrnn.params_size(rnn_mode="gru", num_layers=1, num_units=3, input_size=2),
                   dtype=torch.float64)
    y = rnn(x, h, None, p, rnn_mode="gru", is_training=False)[0]
    with pytest.raises(RuntimeError, match="needs forward with is_training=True"):
        y.sum().backward()


# --------------------------------------------------------------------------- Keras

def _keras():
    """Keras on whichever backend this process has: the conversion is the same on all three.

    Keras fixes its backend at its first import, and ``import tensorflow`` imports Keras
    (on KERAS_BACKEND, else Keras's default, TensorFlow); tests/test_tensorflow.py does so at
    collection. So the backend is not this test's to choose, and os.environ is left as it is
    (setting KERAS_BACKEND here leaked into every later test's subprocesses).
    """
    try:
        import keras
    except ImportError as error:
        pytest.skip(f"Keras is not installed or has no usable backend: {error}")
    return keras


KERAS_CASES = list(itertools.product(["lstm", "gru"], ["unidirectional", "bidirectional"], [1, 2]))


@pytest.mark.parametrize("mode,direction,layers", KERAS_CASES)
def test_keras_round_trip(mode, direction, layers):
    attrs = dict(rnn_mode=mode, num_layers=layers, num_units=4, input_size=3, direction=direction,
                 num_proj=0)
    rng = np.random.default_rng(0)
    params = rng.standard_normal(pycudnnrnn.params_size(**attrs))
    if mode == "lstm":  # Keras keeps one LSTM bias: make ours representable (recurrent zero)
        weights, biases = pycudnnrnn.params_to_canonical(params, **attrs)
        for k in range(len(biases) // 8):
            for b in biases[8 * k + 4:8 * k + 8]:
                b[:] = 0
    keras_weights = convert.to_keras(params, **attrs)
    D = 2 if direction == "bidirectional" else 1
    assert len(keras_weights) == layers and all(len(w) == 3 * D for w in keras_weights)
    G = 4 if mode == "lstm" else 3
    assert keras_weights[0][0].shape == (3, G * 4) and keras_weights[0][1].shape == (4, G * 4)
    assert keras_weights[0][2].shape == ((2, G * 4) if mode == "gru" else (G * 4,))
    back, back_attrs = convert.from_keras(keras_weights, rnn_mode=mode, direction=direction)
    assert back_attrs == attrs
    np.testing.assert_array_equal(back, params)
    if layers == 1:  # a single layer's list is accepted as it is
        np.testing.assert_array_equal(
            convert.from_keras(keras_weights[0], rnn_mode=mode, direction=direction)[0], params)


def test_keras_gru_gate_order_is_z_r_h():
    attrs = dict(rnn_mode="gru", num_layers=1, num_units=2, input_size=1, direction="unidirectional",
                 num_proj=0)
    weights = [np.full((2, 1), v, dtype=float) for v in (1, 2, 3)] + \
        [np.full((2, 2), v, dtype=float) for v in (4, 5, 6)]
    biases = [np.full(2, v, dtype=float) for v in range(7, 13)]
    params = pycudnnrnn.canonical_to_params(weights, biases, **attrs)
    kernel, recurrent, bias = convert.to_keras(params, **attrs)[0]
    np.testing.assert_array_equal(kernel, [[2, 2, 1, 1, 3, 3]])  # z (cuDNN's 2nd), r, h
    np.testing.assert_array_equal(bias, [[8, 8, 7, 7, 9, 9], [11, 11, 10, 10, 12, 12]])


def test_keras_refuses_reset_before_gru_and_projection():
    with pytest.raises(ValueError, match="reset_after: cuDNN's GRU is the reset-after form"):
        convert.from_keras([np.zeros((3, 12)), np.zeros((4, 12)), np.zeros((2, 12))],
                           rnn_mode="gru", reset_after=False)
    with pytest.raises(ValueError, match=r"bias of shape \(12,\) is reset_after=False"):
        convert.from_keras([np.zeros((3, 12)), np.zeros((4, 12)), np.zeros(12)], rnn_mode="gru")
    with pytest.raises(ValueError, match="Keras LSTM has no projection"):
        convert.to_keras(np.zeros(10), rnn_mode="lstm", num_layers=1, num_units=4, input_size=3,
                         num_proj=2)
    with pytest.raises(ValueError, match="rnn_mode: Keras conversion supports 'lstm' and 'gru'"):
        convert.from_keras([], rnn_mode="rnn_tanh")


@pytest.mark.parametrize("mode,direction", list(itertools.product(["lstm", "gru"],
                                                                  ["unidirectional", "bidirectional"])))
def test_matches_keras_layers(mode, direction):
    keras = _keras()
    if keras.backend.backend() == "jax":  # even with x64 on: to 5e-6 relative, float32's
        pytest.skip("Keras on JAX does not compute these layers to float64 precision")
    cls = keras.layers.LSTM if mode == "lstm" else keras.layers.GRU
    layer = cls(4, return_sequences=True, dtype="float64")
    if direction == "bidirectional":
        layer = keras.layers.Bidirectional(layer, dtype="float64")
    x = np.random.default_rng(1).standard_normal((2, 5, 3))
    y_ref = keras.ops.convert_to_numpy(layer(x))
    assert y_ref.dtype == np.float64, y_ref.dtype
    params, attrs = convert.from_keras(layer.get_weights(), rnn_mode=mode, direction=direction)
    D = 2 if direction == "bidirectional" else 1
    zeros = np.zeros((2, D, 4))
    y = pycudnnrnn.forward(x, zeros, zeros if mode == "lstm" else None, params, rnn_mode=mode,
                           direction=direction, time_major=False)[0]
    np.testing.assert_allclose(y, y_ref, rtol=1e-10, atol=1e-12)
    # and back: Keras computes the same with the weights we give it
    layer.set_weights(convert.to_keras(params, **attrs)[0])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x)), y, rtol=1e-10, atol=1e-12)


def test_the_earlier_autograd_function_interface_still_works():
    from pycudnnrnn.torch import CudnnRNNFunction, rnn
    torch.manual_seed(0)
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    h = torch.zeros(2, 2, 5, dtype=torch.float64)
    attrs = dict(rnn_mode="gru", direction="bidirectional", seed=1, seed2=2)
    p = torch.rand(pycudnnrnn.params_size(rnn_mode="gru", num_layers=1, num_units=5,
                                          input_size=3, direction="bidirectional"),
                   dtype=torch.float64)
    y, hy, _ = CudnnRNNFunction.apply(x, h, None, p, [4, 1], attrs, True)
    y_ref, hy_ref, _ = rnn(x, h, None, p, [4, 1], **attrs)
    assert torch.equal(y, y_ref) and torch.equal(hy, hy_ref)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_importing_pycudnnrnn_does_not_import_torch():
    import subprocess
    import sys
    code = "import sys, pycudnnrnn; print('torch' in sys.modules)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=root, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr


def test_torch_rnn_checks_given_sizes_against_the_shapes():
    from pycudnnrnn.torch import rnn
    module = _module("GRU", {}, True, 2)
    params, attrs = convert.from_torch(module)
    x = torch.randn(5, 3, 3, dtype=torch.float64)
    h0 = torch.randn(4, 3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"num_layers: given 3, but input_h's shape"):
        rnn(x, h0, None, params, **{**attrs, "num_layers": 3})


def test_a_tensors_device_is_read_from_torch_not_through_dlpack(monkeypatch):
    """arrays.device_kind answers plain tensors and Parameters from their device (PyTorch's
    __dlpack_device__ costs ~5 us a tensor); subclasses still go through DLPack."""
    from pycudnnrnn.core.arrays import device_kind

    class Tensor(torch.Tensor):
        pass

    asked = []
    dlpack_device = torch.Tensor.__dlpack_device__
    monkeypatch.setattr(torch.Tensor, "__dlpack_device__",
                        lambda self: asked.append(type(self)) or dlpack_device(self))
    t = torch.ones(3)
    assert device_kind("x", t) == device_kind("x", torch.nn.Parameter(t)) == "cpu"
    assert asked == []
    assert device_kind("x", t.as_subclass(Tensor)) == "cpu" and Tensor in asked
