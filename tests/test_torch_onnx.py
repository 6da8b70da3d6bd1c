"""torch.onnx.export of models holding pycudnnrnn's PyTorch modules, run in onnxruntime.

Both exporters (``dynamo=True``, the default, and TorchScript's) write ONNX's own LSTM,
GRU and RNN operators for the op, which onnxruntime runs to the eager outputs.
"""

import logging
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import pycudnnrnn.torch as prt  # noqa: E402

EXPORTERS = [pytest.param(True, id="dynamo"), pytest.param(False, id="torchscript")]
T, B, I, H = 6, 4, 3, 5


class _Call(torch.nn.Module):
    """The module called with every state and the lengths as graph inputs."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, hx, lengths):
        return self.rnn(x, hx, sequence_lengths=lengths)


def _export(model, args, path, dynamo):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' own deprecations and tracer notes
        logging.disable(logging.WARNING)
        try:
            torch.onnx.export(model, args, str(path), dynamo=dynamo, verbose=False)
        finally:
            logging.disable(logging.NOTSET)
    return ort.InferenceSession(str(path))


def _run(session, feeds):
    names = [i.name for i in session.get_inputs()]
    assert len(names) == len(feeds), names
    return session.run(None, {n: f.numpy() for n, f in zip(names, feeds)})


def _flat(results):
    output, state = results
    return [output, *(state if isinstance(state, tuple) else [state])]


def _operators(path):
    return [node.op_type for node in onnx.load(str(path)).graph.node]


def _assert_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("kind,options", [
    ("LSTM", {}),
    ("GRU", {}),
    ("RNN", {}),
    ("RNN", {"nonlinearity": "relu"}),
    ("LSTM", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("GRU", {"num_layers": 3, "bidirectional": True}),
    ("RNN", {"num_layers": 2, "bias": False, "batch_first": True}),
])
def test_a_module_exports_to_onnxs_recurrent_operator(tmp_path, dynamo, kind, options):
    torch.manual_seed(0)
    module = getattr(prt, kind)(I, H, **options).eval()
    x = torch.randn(B, T, I) if options.get("batch_first") else torch.randn(T, B, I)
    path = tmp_path / "model.onnx"
    session = _export(module, (x,), path, dynamo)
    operator = {"LSTM": "LSTM", "GRU": "GRU", "RNN": "RNN"}[kind]
    assert _operators(path).count(operator) == options.get("num_layers", 1)
    _assert_close(_run(session, [x]), _flat(module(x)))
    x2 = torch.randn_like(x)  # the graph computes, not a constant of the traced input
    _assert_close(_run(session, [x2]), _flat(module(x2)))


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("kind,options", [
    ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("GRU", {"bidirectional": True, "batch_first": True}),
    ("RNN", {}),
])
def test_states_and_sequence_lengths_are_inputs(tmp_path, dynamo, kind, options):
    """Lengths (unsorted, a 0 among them: that row keeps its state) and initial states."""
    torch.manual_seed(1)
    module = getattr(prt, kind)(I, H, **options).eval()
    LD = options.get("num_layers", 1) * (2 if options.get("bidirectional") else 1)
    x = torch.randn(B, T, I) if options.get("batch_first") else torch.randn(T, B, I)
    states = [torch.randn(LD, B, H) for _ in range(2 if kind == "LSTM" else 1)]
    hx = tuple(states) if kind == "LSTM" else states[0]
    lengths = torch.tensor([T, 2, 0, 5])
    session = _export(_Call(module), (x, hx, lengths), tmp_path / "model.onnx", dynamo)
    _assert_close(_run(session, [x, *states, lengths]),
                  _flat(module(x, hx, sequence_lengths=lengths)))
    other = torch.tensor([1, T, 3, 0])
    _assert_close(_run(session, [x, *states, other]),
                  _flat(module(x, hx, sequence_lengths=other)))


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("rnn_mode,input_mode", [("lstm", "skip_input"), ("gru", "linear_input"),
                                                 ("rnn_tanh", "skip_input")])
def test_cudnn_rnn_and_its_flat_params_export(tmp_path, dynamo, rnn_mode, input_mode):
    """TensorFlow's layout (one flat params), skip_input among it: layer 0's input
    matrices are identities in ONNX, which is what skipping them computes."""
    torch.manual_seed(2)
    module = prt.CudnnRNN(H, H, 2, rnn_mode=rnn_mode, input_mode=input_mode,
                          bidirectional=True).eval()
    x = torch.randn(T, B, H)
    session = _export(module, (x,), tmp_path / "model.onnx", dynamo)
    want = module(x)
    _assert_close(_run(session, [x])[:len(want)], list(want))


def test_the_functional_rnn_exports(tmp_path):
    import pycudnnrnn

    class Functional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            n = pycudnnrnn.params_size(rnn_mode="gru", num_layers=1, num_units=H, input_size=I)
            self.params = torch.nn.Parameter(torch.randn(n) / 4)

        def forward(self, x, h):
            return prt.rnn(x, h, None, self.params, rnn_mode="gru", time_major=False,
                           is_training=False)[:2]

    model = Functional()
    x, h = torch.randn(B, T, I), torch.randn(B, 1, H)
    session = _export(model, (x, h), tmp_path / "model.onnx", True)
    _assert_close(_run(session, [x, h]), list(model(x, h)))


def _messages(error):
    chain = []
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__
    return chain


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_a_projection_is_refused_naming_what_onnx_lacks(tmp_path, dynamo):
    module = prt.LSTM(I, H, proj_size=2).eval()
    with pytest.raises(Exception) as raised:
        _export(module, (torch.randn(T, B, I),), tmp_path / "model.onnx", dynamo)
    chain = _messages(raised.value)
    assert any("ONNX's LSTM operator has no projection" in text for text in chain), chain


def test_dropout_in_training_mode_is_refused(tmp_path):
    """(TorchScript's exporter exports in eval mode by default, as it does torch.nn's.)"""
    module = prt.GRU(I, H, num_layers=2, dropout=0.5).train()
    with pytest.raises(Exception) as raised:
        _export(module, (torch.randn(T, B, I),), tmp_path / "model.onnx", True)
    chain = _messages(raised.value)
    assert any("ONNX's recurrent operators have no dropout" in text for text in chain), chain


def test_eager_calls_are_untouched_by_the_export_path():
    """Outside an export the op runs: a backward works, which the ONNX nodes have none of."""
    module = prt.LSTM(I, H)
    x = torch.randn(T, B, I, requires_grad=True)
    module(x)[0].sum().backward()
    assert x.grad is not None and module.weight_hh_l0.grad is not None


def test_dynamic_batch_and_time_export(tmp_path):
    from torch.export import Dim
    torch.manual_seed(3)
    module = prt.LSTM(I, H, num_layers=2, bidirectional=True, batch_first=True).eval()
    path = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.randn(B, T, I),), str(path), dynamo=True,
                          dynamic_shapes=({0: Dim("batch"), 1: Dim("time")},), verbose=False)
    session = ort.InferenceSession(str(path))
    for shape in [(B, T, I), (7, 11, I), (1, 2, I)]:
        x = torch.randn(*shape)
        _assert_close(_run(session, [x]), _flat(module(x)))


def test_torchscripts_exporter_keeps_batch_and_time_dynamic(tmp_path):
    """sequence_lens was a constant of the traced batch: another batch size failed."""
    torch.manual_seed(4)
    module = prt.GRU(I, H, bidirectional=True).eval()
    path = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.randn(T, B, I),), str(path), dynamo=False,
                          input_names=["x"], dynamic_axes={"x": {0: "time", 1: "batch"}})
    session = ort.InferenceSession(str(path))
    for shape in [(T, B, I), (9, 2, I), (1, 7, I)]:
        x = torch.randn(*shape)
        _assert_close(_run(session, [x]), _flat(module(x)))


class _Packed(torch.nn.Module):
    """A PackedSequence in, padded out: torch.nn's recipe for ragged batches."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, lengths):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        output, state = self.rnn(packed)
        output = torch.nn.utils.rnn.pad_packed_sequence(output, total_length=x.shape[0])[0]
        return output, state


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torchscripts_exporter_takes_a_packed_sequence(tmp_path, kind):
    """TorchScript's exporter removes a pad of a pack only when the pad reads both of that
    pack's results: the module's packed output carried the input's batch_sizes, and the
    export failed ('must occur in pairs') where torch.nn's passes."""
    torch.manual_seed(0)
    model = _Packed(getattr(prt, kind)(I, H, num_layers=2, bidirectional=True)).eval()
    x, lengths = torch.randn(T, B, I), torch.tensor([6, 2, 4, 5])
    session = _export(model, (x, lengths), tmp_path / "packed.onnx", dynamo=False)
    with torch.no_grad():
        expected = _flat(model(x, lengths))
    _assert_close(_run(session, [x, lengths]), expected)
