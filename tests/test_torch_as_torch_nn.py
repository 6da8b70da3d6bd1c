"""Code written for torch.nn's RNNs, run on the drop-ins as their authors run it.

Other people's models, tests and tools must not be able to tell ``pycudnnrnn.torch.LSTM``
from ``torch.nn.LSTM``: a model that calls ``flatten_parameters()`` in ``forward`` traced
by ``torch.jit.trace`` and exported by the TorchScript ONNX exporter; PyTorch's own tests
matching torch.nn's error texts with ``assertRaisesRegex``; ``dropout=1``; a batch whose
lengths are all 0 taken through ``backward()``; seeded dropout on packed input, where
torch.nn's masks fall on its packed rows.
"""

import io
import re
import unittest
import warnings

import pytest

torch = pytest.importorskip("torch")

import pycudnnrnn.torch as prt  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

KINDS = ["LSTM", "GRU", "RNN"]


def _pair(kind, *args, seed=0, **options):
    """torch.nn's module and ours with the same weights."""
    torch.manual_seed(seed)
    theirs = getattr(torch.nn, kind)(*args, **options)
    return theirs, getattr(prt, kind).from_torch(theirs)


# --------------------------------------------------------------------------- tracing

class _FlattensInForward(torch.nn.Module):
    """The pattern of many published models: ``flatten_parameters()`` at each call."""

    def __init__(self, rnn):
        super().__init__()
        directions = 2 if rnn.bidirectional else 1
        self.rnn, self.head = rnn, torch.nn.Linear(directions * rnn.hidden_size, 3)

    def forward(self, x):
        self.rnn.flatten_parameters()
        y, _ = self.rnn(x)
        if x.shape[0] > 0:  # the model's own size read: its TracerWarning is the model's
            y = y + 0
        return self.head(y)


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_flattening_in_forward_traces_and_exports_as_torch_nn(kind):
    torch.manual_seed(0)
    rnn = getattr(prt, kind)(5, 8, num_layers=2, bidirectional=True)
    model = _FlattensInForward(rnn).eval()
    x = torch.randn(7, 2, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(model, x)  # its check runs the model again: the same graph
    tracer = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    assert tracer and all(w.filename == __file__ for w in tracer), \
        "the model's own warnings, none from pycudnnrnn"
    other = torch.randn(9, 3, 5)  # the trace takes other sizes, as torch.nn's does
    torch.testing.assert_close(traced(other), model(other), rtol=1e-6, atol=1e-7)
    # The weights are still views of one buffer, and training still works.
    assert rnn.params.data_ptr() == rnn.weight_ih_l0.data_ptr()

    onnxruntime = pytest.importorskip("onnxruntime")
    exported = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation
        torch.onnx.export(model, (x,), exported, dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "T", 1: "B"}})
    session = onnxruntime.InferenceSession(exported.getvalue())
    got = session.run(None, {"x": other.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(got), model(other).detach(), rtol=1e-5,
                               atol=1e-6)


class _Outputs(torch.nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]


class _ReadsItsSize(torch.nn.Module):
    """A parametrization of the user's, run inside the drop-in's forward."""

    def forward(self, weight):
        return weight * 1.0 if weight.shape[0] > 0 else weight


def test_a_trace_keeps_the_users_own_tracer_warnings():
    """Ours are silenced, as PyTorch silences torch.nn's; the user's code still warns."""
    rnn = prt.GRU(3, 4)
    torch.nn.utils.parametrize.register_parametrization(rnn, "weight_hh_l0", _ReadsItsSize())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.trace(_Outputs(rnn), torch.randn(5, 2, 3), check_trace=False)
    tracer = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    assert tracer and all(w.filename == __file__ for w in tracer)


def test_a_frozen_model_traced_for_inference_backpropagates_to_its_input():
    """torch.nn's traces backpropagate whatever was frozen when tracing (saliency)."""
    theirs, ours = _pair("LSTM", 4, 6, num_layers=2, dtype=torch.float64)
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    saliency = []
    for module in (theirs, ours):
        module.eval().requires_grad_(False)
        with torch.no_grad():
            traced = torch.jit.trace(lambda x: module(x)[0], x)
        leaf = x.clone().requires_grad_()
        traced(leaf).square().sum().backward()
        saliency.append(leaf.grad)
    torch.testing.assert_close(saliency[1], saliency[0], rtol=1e-10, atol=1e-12)


def test_a_traced_training_graph_backpropagates():
    """Traced with grad mode on, checked again under no_grad: one graph, which trains."""
    theirs, ours = _pair("GRU", 4, 6, num_layers=2)
    x = torch.randn(5, 3, 4)
    traced = torch.jit.trace(_FlattensInForward(ours), x)
    reference = _FlattensInForward(theirs)
    reference.head.load_state_dict(traced.head.state_dict())
    traced(x).square().sum().backward()
    reference(x).square().sum().backward()
    for mine, want in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(mine.grad, want.grad, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- error texts

class TestTorchNNErrorTexts(unittest.TestCase):
    """PyTorch's ``test_cudnn_forward_exception`` (test_nn.py), on the CPU, on ours."""

    def test_forward_exception(self):
        rnns = [
            (prt.LSTM(10, 20, batch_first=True), (torch.zeros(1, 2, 19), torch.zeros(1, 2, 19))),
            (prt.LSTM(10, 20, batch_first=True, proj_size=10),
             (torch.zeros(1, 2, 19), torch.zeros(1, 2, 19))),
            (prt.GRU(10, 20, batch_first=True), torch.zeros(1, 2, 19)),
            (prt.RNN(10, 20, batch_first=True), torch.zeros(1, 2, 19)),
        ]
        x_wrong = torch.randn(2, 3, 3)
        x_right = torch.randn(2, 3, 10)
        for rnn, hidden in rnns:
            self.assertRaisesRegex(RuntimeError, "Expected hidden.*size.*got", rnn, x_right,
                                   hidden)
            self.assertRaisesRegex(RuntimeError, re.escape("input.size(-1) must be equal to "
                                                           "input_size"), rnn, x_wrong)

    def test_empty_sequence(self):
        for kind in KINDS:
            self.assertRaisesRegex(RuntimeError, "Expected sequence length to be larger than 0 "
                                   "in RNN", getattr(prt, kind)(3, 4), torch.randn(0, 2, 3))


def _bad_calls(kind):
    """(what, args) of calls torch.nn refuses, for a ``kind(10, 20, batch_first=True)``."""
    lstm = kind == "LSTM"
    state = (lambda h, c: (h, c)) if lstm else (lambda h, c: h)
    z = torch.zeros
    return [
        ("input size", (torch.randn(2, 3, 3),)),
        ("h size", (torch.randn(2, 3, 10), state(z(1, 2, 19), z(1, 2, 20)))),
        *([("c size", (torch.randn(2, 3, 10), (z(1, 2, 20), z(1, 2, 21))))] if lstm else []),
        ("batch", (torch.randn(2, 3, 10), state(z(1, 3, 20), z(1, 3, 20)))),
        ("4-D input", (torch.randn(2, 3, 10, 1),)),
        ("1-D input", (torch.randn(10),)),
        ("no steps", (torch.randn(2, 0, 10),)),
        ("3-D states, unbatched", (torch.randn(3, 10), state(z(1, 1, 20), z(1, 1, 20)))),
        ("2-D states, batched", (torch.randn(2, 3, 10), state(z(1, 20), z(1, 20)))),
        ("unbatched size", (torch.randn(3, 10), state(z(1, 19), z(1, 20)))),
        ("dtype", (torch.randn(2, 3, 10, dtype=torch.float64),)),
        # two things wrong: torch.nn's order of checks says which is named
        ("3-D states and input size, unbatched", (torch.randn(3, 9), state(z(1, 1, 20),
                                                                          z(1, 1, 20)))),
        ("2-D states and input size", (torch.randn(2, 3, 9), state(z(1, 20), z(1, 20)))),
        ("dtype and input size", (torch.randn(2, 3, 9, dtype=torch.float64),)),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_every_refusal_begins_with_torch_nns_words(kind):
    for what, args in _bad_calls(kind):
        theirs, ours = _pair(kind, 10, 20, batch_first=True)
        with pytest.raises(Exception) as expected:
            theirs(*args)
        with pytest.raises(type(expected.value)) as got:  # theirs, and ours too (a subclass)
            ours(*args)
        assert str(got.value).startswith(str(expected.value)), what


def test_an_unbatched_inputs_shape_is_shown_as_given():
    with pytest.raises(ValueError, match=r"Expected 10, got 9; input has shape \(3, 9\)$"):
        prt.GRU(10, 20)(torch.randn(3, 9))


# --------------------------------------------------------------------------- dropout=1

@pytest.mark.parametrize("dropout", [-0.1, 1.1, "0.5", True, 1, 0.5])
def test_the_constructor_takes_and_refuses_dropout_as_torch_nn(dropout):
    def build(module):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                module.LSTM(3, 4, num_layers=1, dropout=dropout)
                return None, [str(w.message) for w in caught]
            except Exception as error:  # noqa: BLE001 (compared below)
                return (type(error), str(error)), [str(w.message) for w in caught]

    assert build(prt) == build(torch.nn)


@pytest.mark.parametrize("kernels", ["torch", "numpy"])
@pytest.mark.parametrize("kind,options", [
    ("LSTM", {}), ("LSTM", {"proj_size": 2}), ("LSTM", {"proj_size": 2, "bias": False}),
    ("GRU", {}), ("GRU", {"bias": False}), ("RNN", {"nonlinearity": "relu"})])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_dropout_one_drops_every_later_layers_input_as_torch_nn(kernels, kind, options,
                                                                 bidirectional, packed):
    """On PyTorch's kernels and on the op (what CUDA and compiled calls run, where cuDNN
    takes p < 1 only): layers after the first see zeros; their input matrices' gradients
    are zero, and no gradient reaches the first layer through them."""
    theirs, ours = _pair(kind, 3, 4, num_layers=3, dropout=1, bidirectional=bidirectional,
                         dtype=torch.float64, **options)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    if packed:
        x = pack_padded_sequence(x, [5, 3])
    results = []
    for module, kind_of_kernels in ((theirs, "torch"), (ours, kernels)):
        with prt.cpu_kernels(kind_of_kernels):
            output, _ = module(x)
        output = pad_packed_sequence(output)[0] if packed else output
        output.sum().backward()
        results.append(output)
    got, want = results[1], results[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for (name, mine), wanted in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(mine.grad, wanted.grad, rtol=1e-10, atol=1e-12, msg=name)
    assert not theirs.weight_ih_l1.grad.any()


def test_dropout_one_compiles_as_eager():
    theirs, ours = _pair("GRU", 3, 4, num_layers=2, dropout=1)
    x = torch.randn(5, 2, 3)
    compiled = torch.compile(lambda x: ours(x)[0], backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), theirs(x)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_dropout_one_on_cuda_equals_torch_nn_on_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of PyTorch and a GPU")
    theirs, ours = _pair("LSTM", 3, 4, num_layers=3, dropout=1, dtype=torch.float64)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    want, _ = theirs(x)
    got, _ = ours.cuda()(x.cuda())
    torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- no row runs

def _no_row_runs(run, kind, lstm):
    """Outputs zero, states as they came; a backward gives zero gradients to the input and
    weights and passes the state gradients to the initial states."""
    x = torch.randn(4, 3, 2, dtype=torch.float64, requires_grad=True)
    states = [torch.randn(1, 3, 5, dtype=torch.float64, requires_grad=True)
              for _ in range(2 if lstm else 1)]
    output, finals, weights = run(x, states, torch.zeros(3, dtype=torch.int64))
    assert not output.detach().any()
    for final, state in zip(finals, states):
        assert torch.equal(final.detach(), state.detach())
    (output.sum() + sum((3 * f).sum() for f in finals)).backward()
    for t in [x, *weights]:
        assert t.grad is not None and not t.grad.any(), kind
    for state in states:
        torch.testing.assert_close(state.grad, torch.full_like(state, 3.0))


@pytest.mark.parametrize("kernels", ["torch", "numpy"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_whose_lengths_are_all_zero_backpropagates(kernels, kind):
    module = getattr(prt, kind)(2, 5, dtype=torch.float64)

    def run(x, states, lengths):
        with prt.cpu_kernels(kernels):
            output, final = module(x, tuple(states) if kind == "LSTM" else states[0],
                                   sequence_lengths=lengths)
        return output, final if kind == "LSTM" else (final,), list(module.parameters())

    _no_row_runs(run, kind, kind == "LSTM")


@pytest.mark.parametrize("kernels", ["torch", "numpy"])
def test_a_zero_length_batch_through_the_functional_api_and_cudnn_rnn(kernels):
    params = torch.randn(prt.CudnnRNN(2, 5, rnn_mode="gru").params.numel(),
                         dtype=torch.float64, requires_grad=True)

    def functional(x, states, lengths):
        with prt.cpu_kernels(kernels):
            output, h, _ = prt.rnn(x, states[0], None, params, lengths, rnn_mode="gru")
        return output, (h,), [params]

    _no_row_runs(functional, "rnn", False)
    module = prt.CudnnRNN(2, 5, rnn_mode="lstm", dtype=torch.float64)

    def cudnn_rnn(x, states, lengths):
        with prt.cpu_kernels(kernels):
            output, h, c = module(x, tuple(states), sequence_lengths=lengths)
        return output, (h, c), [module.params]

    _no_row_runs(cudnn_rnn, "CudnnRNN", True)


def test_only_the_final_state_of_an_all_zero_batch_backpropagates_to_the_weights():
    module = prt.LSTM(2, 5)
    _, (h, _) = module(torch.randn(4, 3, 2), sequence_lengths=[0, 0, 0])
    h.sum().backward()  # the states need no gradient: the weights' zeros still come
    assert all(p.grad is not None and not p.grad.any() for p in module.parameters())


# --------------------------------------------------------------------------- seeded dropout

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lengths,enforce_sorted", [
    ([6] * 20, False), ([6] * 20, True),  # every row as long: torch.nn still packs them
    ([6, 3, 5, 2, 1] * 4, False), (sorted([6, 3, 5, 2, 1] * 4, reverse=True), True)])
def test_seeded_dropout_on_packed_input_gives_torch_nns_masks(kind, lengths, enforce_sorted):
    """torch.nn runs its packed kernel in the packing's row order, and draws its masks on
    the packed rows; a seed gives ours the same masks, so models train alike."""
    theirs, ours = _pair(kind, 3, 5, num_layers=2, dropout=0.3, bidirectional=True)
    x = torch.randn(6, len(lengths), 3)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    _same_masks_as_torch_nn(theirs, ours, kind, packed)


@pytest.mark.parametrize("kind,options", [("LSTM", {"proj_size": 3}), ("GRU", {}),
                                          ("RNN", {"nonlinearity": "relu"})])
def test_seeded_dropout_on_packed_batch_first_input_with_states(kind, options):
    theirs, ours = _pair(kind, 3, 5, num_layers=3, dropout=0.4, batch_first=True, **options)
    lengths = [6, 3, 5, 2, 1] * 4
    packed = pack_padded_sequence(torch.randn(len(lengths), 6, 3), lengths, batch_first=True,
                                  enforce_sorted=False)
    h0 = torch.randn(3, len(lengths), options.get("proj_size", 5))
    hx = (h0, torch.randn(3, len(lengths), 5)) if kind == "LSTM" else h0
    _same_masks_as_torch_nn(theirs, ours, kind, packed, hx)


def _same_masks_as_torch_nn(theirs, ours, kind, packed, hx=None):
    results = []
    for module in (theirs, ours):
        torch.manual_seed(1)
        output, state = module(packed, hx)
        padded, _ = pad_packed_sequence(output)
        finals = state if kind == "LSTM" else (state,)
        (padded.square().sum() + sum(f.sum() for f in finals)).backward()
        results.append([output.data, *finals, *(p.grad for p in module.parameters())])
    for got, want in zip(*reversed(results)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- tied lengths

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_packed_rows_of_tied_lengths_give_torch_nns_gradients_exactly(kind, enforce_sorted):
    """torch.nn runs its packed kernel on the rows in the packing's order; ties among the
    lengths (flair packs sentences sorted, many of a length) kept in that order, ours
    runs the same kernel on the same rows: the same sums, so the weights' gradients are
    torch.nn's to the bit. (Re-sorted by an unstable sort, tied rows were summed in
    another order: off by up to 1e-6 relative in float32.) Mostly short rows, so that
    every kind takes the packed kernel."""
    theirs, ours = _pair(kind, 8, 16, num_layers=2, bidirectional=True)
    lengths = [9] * 2 + [4] * 10 + [2] * 20
    if not enforce_sorted:
        lengths = [lengths[k] for k in torch.randperm(len(lengths), generator=torch.Generator()
                                                      .manual_seed(0)).tolist()]
    x = torch.randn(9, len(lengths), 8)
    results = []
    for module in (theirs, ours):
        output, state = module(pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted))
        finals = state if kind == "LSTM" else (state,)
        loss = output.data.square().sum() + sum(f.sin().sum() for f in finals)
        results.append([output.data, *finals,
                        *torch.autograd.grad(loss, list(module.parameters()))])
    for got, want in zip(*reversed(results), strict=True):
        assert torch.equal(got, want)


# --------------------------------------------------------------------------- what differs
# Each row of docs/pytorch.md's table "What differs", both sides. (Double backward on the
# CPU, the same for both: tests/test_torch_native.py; compiled: tests/test_torch_ops.py.)

def test_row_torch_compile_fullgraph_refuses_torch_nn_and_traces_ours():
    theirs, ours = _pair("LSTM", 3, 4)
    x = torch.randn(5, 2, 3)
    with pytest.raises(Exception, match="Attempted to wrap RNN, GRU, or LSTM"):
        torch.compile(lambda x: theirs(x)[0], backend="eager", fullgraph=True)(x)
    compiled = torch.compile(lambda x: ours(x)[0], backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), theirs(x)[0], rtol=1e-5, atol=1e-6)


def test_row_vmap_has_no_batching_rule_for_torch_nn_and_runs_ours():
    vmap = torch.func.vmap
    theirs, ours = _pair("LSTM", 3, 4, dtype=torch.float64)
    x = torch.randn(2, 5, 2, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="Batching rule not implemented for aten::lstm"):
        vmap(lambda x: theirs(x)[0])(x)
    batched = vmap(lambda x: ours(x)[0])(x)
    torch.testing.assert_close(batched[1], theirs(x[1])[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_row_jit_script_refuses_ours_saying_what_works(kind):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(prt, kind)(3, 4)

        def forward(self, x):
            return self.rnn(x)[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(RuntimeError, match=rf"pycudnnrnn.torch.{kind}: torch.jit.script "
                                               r"cannot compile .* torch.jit.trace, "
                                               r"torch.compile or torch.export"):
            torch.jit.script(Model())
        scripted = torch.jit.script(getattr(torch.nn, kind)(3, 4))  # torch.nn's scripts...
    if not hasattr(scripted, "forward"):  # ...and in torch 2.13 has no forward to call
        with pytest.raises(AttributeError, match="no attribute 'forward'"):
            scripted(torch.randn(5, 2, 3))
