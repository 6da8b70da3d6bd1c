"""Bad arguments fail before any computation, with a message naming argument,
expectation and what was given."""

import dataclasses

import numpy as np
import pytest

import pycudnnrnn
from conftest import make_case


def _lstm(**kw):
    return make_case("lstm", "bidirectional", num_layers=2, T=4, B=3, input_size=3,
                     num_units=4, **kw)


def _fwd(case, **over):
    return lambda: case.forward(**over)


C = _lstm()
G = make_case("gru", num_layers=1)
F32 = C.input.astype(np.float32)

FORWARD_ERRORS = [
    # attribute values
    ("rnn_mode", _fwd(C, rnn_mode="lstmm"), ValueError, r"rnn_mode: expected one of 'lstm'.*got 'lstmm'"),
    ("input_mode", _fwd(C, input_mode="skip"), ValueError, r"input_mode: expected one of .*got 'skip'"),
    ("direction", _fwd(C, direction="both"), ValueError, r"direction: expected one of .*got 'both'"),
    ("dropout high", _fwd(C, dropout=1.0), ValueError, r"dropout: expected a float in \[0, 1\), got 1.0"),
    ("dropout negative", _fwd(C, dropout=-0.1), ValueError, r"dropout: expected .*got -0.1"),
    ("dropout type", _fwd(C, dropout="0.1"), TypeError, r"dropout: expected a float .*got str"),
    ("seed type", _fwd(C, seed=1.5), TypeError, r"seed: expected an int, got float 1.5"),
    ("seed2 type", _fwd(C, seed2="1"), TypeError, r"seed2: expected an int, got str"),
    ("num_proj negative", _fwd(C, num_proj=-1), ValueError, r"num_proj: expected an int >= 0, got -1"),
    ("time_major type", _fwd(C, time_major=1), TypeError, r"time_major: expected a bool, got int 1"),
    ("is_training type", _fwd(C, is_training="yes"), TypeError, r"is_training: expected a bool"),
    # dtypes
    ("input int", _fwd(C, input=C.input.astype(np.int32)), TypeError,
     r"input: expected dtype float16, bfloat16, float32 or float64, got int32"),
    ("input_h dtype", _fwd(C, input=F32), TypeError,
     r"input_h: expected dtype float32 \(the dtype of input\), got float64"),
    ("params dtype", _fwd(C, params=C.params.astype(np.float32)), TypeError,
     r"params: expected dtype float64 \(the dtype of input\), got float32"),
    ("input_c dtype", _fwd(C, input_c=C.input_c.astype(np.float16)), TypeError,
     r"input_c: expected dtype float64 \(the dtype of input\), got float16"),
    # shapes
    ("input 2-D", _fwd(C, input=C.input[0]), ValueError,
     r"input: expected a 3-D array \[T, B, input_size\], got shape \(3, 3\)"),
    ("T = 0", _fwd(C, input=C.input[:0]), ValueError, r"input: expected non-empty .*got shape \(0, 3, 3\)"),
    ("B = 0", _fwd(C, input=C.input[:, :0]), ValueError, r"input: expected non-empty .*got shape \(4, 0, 3\)"),
    ("input_h batch", _fwd(C, input_h=C.input_h[:, :2]), ValueError,
     r"input_h: expected shape \(4, 3, 4\) \[L·D, B, P\] \(L·D from input_h's shape, B from "
     r"input's\), got \(4, 2, 4\)$"),
    ("input_h odd L·D", _fwd(C, input_h=C.input_h[:3]), ValueError,
     r"input_h: expected shape \[L·D, B, P\] with L·D a positive multiple of D=2.*got \(3, 3, 4\)"),
    ("input_c missing", _fwd(C, input_c=None), TypeError, r"input_c: expected an array for rnn_mode='lstm', got None"),
    ("input_c shape", _fwd(C, input_c=C.input_c[:2]), ValueError,
     r"input_c: expected shape \(4, 3, 4\) \[L·D, B, H\] \(L·D from input_h's shape, B from "
     r"input's\), got \(2, 3, 4\)$"),
    ("P vs H", _fwd(C, input_h=C.input_h[..., :3]), ValueError,
     r"input_h: expected last dimension num_units=4 .*got shape \(4, 3, 3\)"),
    ("P vs num_proj", _fwd(C, num_proj=2), ValueError,
     r"input_h: expected last dimension num_proj=2, got shape \(4, 3, 4\)"),
    ("batch-major state", _fwd(C, time_major=False), ValueError,
     r"input_h: expected shape \[B, L·D, P\] with L·D a positive multiple of D=2"),
    ("params length", _fwd(C, params=C.params[:-1]), ValueError,
     rf"params: expected {C.params.size} elements \(params_size for this configuration\), got {C.params.size - 1}"),
    ("params 2-D", _fwd(C, params=C.params[None]), ValueError, r"params: expected a 1-D array"),
    # configuration
    ("num_proj on GRU", _fwd(G, num_proj=2), ValueError,
     r"num_proj: a projection needs rnn_mode='lstm', got num_proj=2 with rnn_mode='gru'"),
    ("num_proj >= num_units", _fwd(C, num_proj=4), ValueError,
     r"num_proj: expected 0 < num_proj < num_units=4, got 4"),
    ("skip_input sizes", _fwd(C, input_mode="skip_input"), ValueError,
     r"input_mode: 'skip_input' needs input_size == num_units, got input_size=3 and num_units=4"),
    # array types and devices
    ("list input", _fwd(C, input=C.input.tolist()), TypeError, r"input: expected a NumPy array, a CUDA array .* or a DLPack array on the CPU, got builtins.list"),
]


@pytest.mark.parametrize("name,call,error,message", FORWARD_ERRORS, ids=[e[0] for e in FORWARD_ERRORS])
def test_forward_errors(name, call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("lengths,error,message", [
    ([1, 2], ValueError, r"sequence_lengths: expected shape \(3,\) \(the batch size\), got \(2,\)"),
    ([1, 5, 2], ValueError, r"sequence_lengths: expected values in \[0, 4\] \(max_time\), got 5 at index 1"),
    ([1, -1, 2], ValueError, r"got -1 at index 1"),
    ([1.0, 2.0, 3.0], TypeError, r"sequence_lengths: expected integers, got dtype float64"),
    ([[1, 2, 3]], ValueError, r"sequence_lengths: expected shape \(3,\)"),
    # NumPy reads True as 1: refused like any non-integer.
    ([True, 2, 3], TypeError, r"sequence_lengths: expected integers, got True \(a bool\) at index 0"),
    ((1, np.bool_(False), 3), TypeError, r"got False \(a bool\) at index 1"),
    # Beyond int64 NumPy gives dtype object: a value error like any other out of range.
    ([1, 2 ** 64, 2], ValueError, r"expected values in \[0, 4\] \(max_time\), got 18446744073709551616 at index 1"),
    ([2 ** 63, 1, 2], ValueError, r"got 9223372036854775808 at index 0"),  # NumPy: float64
    (np.ma.array([1, 2, 3], mask=[0, 1, 0]), TypeError,
     r"sequence_lengths: got a NumPy masked array, whose mask would be ignored"),
])
def test_sequence_length_errors(lengths, error, message):
    case = _lstm()
    case.sequence_lengths = lengths
    with pytest.raises(error, match=message):
        case.forward()


class _FakeCuda:
    """Anything that says it lives on a CUDA device through DLPack."""
    shape, ndim, dtype = (4, 3, 3), 3, np.float64

    def __dlpack_device__(self):
        return (2, 0)


def test_mixed_devices_are_a_type_error():
    with pytest.raises(TypeError, match=r"arrays must all be NumPy \(CPU\) or all CUDA, got input on cuda"):
        C.forward(input=_FakeCuda())


def _backprop_parts(case):
    fwd = case.forward()
    grads = [np.ones_like(a) for a in fwd[:3]]
    return fwd, grads


def test_backprop_shape_and_dtype_errors():
    case = _lstm()
    fwd, (dy, dh, dc) = _backprop_parts(case)
    with pytest.raises(ValueError, match=r"output_backprop: expected shape \(4, 3, 8\) \(\[T, B, D·P\]\), got \(4, 3, 7\)"):
        case.backprop(fwd, dy[..., :7], dh, dc)
    with pytest.raises(ValueError, match=r"output_h_backprop: expected shape \(4, 3, 4\) \(the shape of input_h\)"):
        case.backprop(fwd, dy, dh[:2], dc)
    with pytest.raises(ValueError, match=r"output_c_backprop: expected shape \(4, 3, 4\) \(the shape of input_c\)"):
        case.backprop(fwd, dy, dh, dc[:, :1])
    with pytest.raises(TypeError, match=r"output_backprop: expected dtype float64 \(the dtype of input\), got float32"):
        case.backprop(fwd, dy.astype(np.float32), dh, dc)
    with pytest.raises(ValueError, match=r"output: expected shape \(4, 3, 8\)"):
        case.backprop((fwd[0][:1],) + fwd[1:], dy, dh, dc)


def test_reserve_space_errors():
    case = _lstm()
    fwd, grads = _backprop_parts(case)
    y, hy, cy, reserve = fwd
    with pytest.raises(ValueError, match=r"reserve_space: .*got an empty one \(forward ran with is_training=False\)"):
        case.backprop((y, hy, cy, case.forward(is_training=False)[3]), *grads)
    with pytest.raises(TypeError, match=r"reserve_space: expected the array .*got None"):
        case.backprop((y, hy, cy, None), *grads)
    with pytest.raises(ValueError, match=r"reserve_space: expected the uint8 array made by the NumPy backend's forward, got a foreign float64"):
        case.backprop((y, hy, cy, np.zeros(reserve.size)), *grads)
    with pytest.raises(ValueError, match=r"reserve_space: expected the uint8 array .*got a foreign uint8"):
        case.backprop((y, hy, cy, np.zeros_like(reserve)), *grads)
    with pytest.raises(ValueError, match=rf"reserve_space: expected {reserve.size} bytes .*got {reserve.size - 8}"):
        case.backprop((y, hy, cy, reserve[:-8]), *grads)
    other = _lstm()
    other.sequence_lengths = [4, 1, 2]
    with pytest.raises(ValueError, match=r"reserve_space: made by a forward call with a different identity"):
        other.backprop(fwd, *grads)
    with pytest.raises(ValueError, match=r"reserve_space: expected a 1-D array"):
        case.backprop((y, hy, cy, reserve[None]), *grads)


def test_reserve_space_from_a_time_major_forward_is_refused_by_a_batch_major_backprop():
    """T = B = L·D makes every array fit both layouts; only the identity tells them apart."""
    case = make_case("lstm", "bidirectional", num_layers=2, T=4, B=4)
    fwd, grads = _backprop_parts(case)
    with pytest.raises(ValueError, match=r"reserve_space: made by a forward call with a different "
                                         r"identity than this backprop: an attribute .*time_major"):
        case.backprop(fwd, *grads, time_major=False)


RESERVE_MISMATCHES = {
    "time_major": dict(time_major=False),
    "dropout": dict(dropout=0.25),
    "seed": dict(seed=1),
    "seed2": dict(seed2=1),
    "lengths": dict(sequence_lengths=[4, 4, 3, 4]),
}


@pytest.mark.parametrize("change", RESERVE_MISMATCHES, ids=list(RESERVE_MISMATCHES))
def test_reserve_space_from_a_call_with_other_attributes_is_refused(change):
    case = make_case("lstm", "bidirectional", num_layers=2, T=4, B=4, dropout=0.5)
    fwd, grads = _backprop_parts(case)
    overrides = dict(RESERVE_MISMATCHES[change])
    case.sequence_lengths = overrides.pop("sequence_lengths", case.sequence_lengths)
    with pytest.raises(ValueError, match=r"reserve_space: made by a forward call with a different identity"):
        case.backprop(fwd, *grads, **overrides)


def _problem_fields():
    """(field, changed value) for every field of Problem and of its RNNConfig."""
    from pycudnnrnn.core.checks import Problem
    from pycudnnrnn.core.config import RNNConfig
    changed = dict(rnn_mode="gru", skip_input=True, bidirectional=False, num_layers=3,
                   num_units=5, input_size=7, num_proj=2, dropout=0.5, seed=9, max_time=5,
                   batch_size=2, time_major=False, dtype=np.dtype(np.float32),
                   lengths=np.array([4, 0, 1]), is_training=False)
    names = [f.name for f in dataclasses.fields(RNNConfig)] + \
        [f.name for f in dataclasses.fields(Problem) if f.name != "config"]
    assert set(names) == set(changed), "a new field needs a value here"
    return [(name, changed[name]) for name in names]


@pytest.mark.parametrize("field,value", _problem_fields(), ids=[f for f, _ in _problem_fields()])
def test_reserve_identity_covers_every_field(field, value):
    from pycudnnrnn.core import reserve_header
    from pycudnnrnn.core.checks import Problem, make_config
    config = make_config(rnn_mode="lstm", num_layers=2, num_units=4, input_size=3,
                         input_mode="linear_input", direction="bidirectional", num_proj=0)
    problem = Problem(config, 4, 3, True, np.dtype(np.float64), None)
    if field in {f.name for f in dataclasses.fields(config)}:
        other = dataclasses.replace(problem, config=dataclasses.replace(config, **{field: value}))
    else:
        other = dataclasses.replace(problem, **{field: value})
    magic = b"m" * 16
    assert reserve_header.header(problem, magic) != reserve_header.header(other, magic)
    # and lengths of all T are the same call as no lengths
    same = dataclasses.replace(problem, lengths=np.full(3, 4))
    assert reserve_header.header(problem, magic) == reserve_header.header(same, magic)


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(num_layers=0), ValueError, r"num_layers: expected an int >= 1, got 0"),
    (dict(num_units=2.5), TypeError, r"num_units: expected an int, got float 2.5"),
    (dict(rnn_mode="rnn"), ValueError, r"rnn_mode: expected one of"),
    (dict(input_mode="skip_input"), ValueError, r"input_mode: 'skip_input' needs input_size == num_units"),
])
def test_params_size_errors(kwargs, error, message):
    attrs = {**dict(num_layers=1, num_units=4, input_size=3), **kwargs}
    with pytest.raises(error, match=message):
        pycudnnrnn.params_size(**attrs)


def test_canonical_errors():
    attrs = dict(rnn_mode="gru", num_layers=1, num_units=2, input_size=3)
    params = np.zeros(pycudnnrnn.params_size(**attrs))
    weights, biases = pycudnnrnn.params_to_canonical(params, **attrs)
    with pytest.raises(ValueError, match=r"weights: expected 6 arrays for this configuration, got 5"):
        pycudnnrnn.canonical_to_params(weights[:5], biases, **attrs)
    with pytest.raises(ValueError, match=r"biases: expected 6 arrays for this configuration, got 7"):
        pycudnnrnn.canonical_to_params(weights, biases + biases[:1], **attrs)
    bad = list(weights)
    bad[1] = bad[1].T
    with pytest.raises(ValueError, match=r"weights\[1\]: expected shape \(2, 3\) \(pseudo-layer 0 input matrix of gate 'z'\), got \(3, 2\)"):
        pycudnnrnn.canonical_to_params(bad, biases, **attrs)
    with pytest.raises(TypeError, match=r"biases\[0\]: expected dtype float64 \(the dtype of weights\[0\]\), got float32"):
        pycudnnrnn.canonical_to_params(weights, [biases[0].astype(np.float32)] + biases[1:], **attrs)
    with pytest.raises(ValueError, match=r"params: expected 42 elements \(params_size for this configuration\), got 41"):
        pycudnnrnn.params_to_canonical(params[:-1], **attrs)


# --------------------------------------------------------------------------- clear, not obscure

ATTRIBUTES = ["rnn_mode", "input_mode", "direction"]
NOT_STRINGS = [np.array(["lstm"]), None, 1]


@pytest.mark.parametrize("attribute", ATTRIBUTES)
@pytest.mark.parametrize("value", NOT_STRINGS, ids=["array", "None", "int"])
def test_attribute_that_is_not_a_string_is_a_type_error(attribute, value):
    """An array rnn_mode gave NumPy's 'truth value ... is ambiguous'."""
    message = rf"{attribute}: expected a str, one of '.*, got "
    with pytest.raises(TypeError, match=message):
        C.forward(**{attribute: value})
    fwd, grads = _backprop_parts(C)
    with pytest.raises(TypeError, match=message):
        C.backprop(fwd, *grads, **{attribute: value})
    with pytest.raises(TypeError, match=message):
        pycudnnrnn.params_size(num_layers=1, num_units=4, input_size=3, **{attribute: value})


@pytest.mark.parametrize("argument", ["weights", "biases"])
@pytest.mark.parametrize("value,given", [(None, "NoneType"), (np.zeros((2, 3)), "one array"),
                                         (3, "int"), ("w", "str")],
                         ids=["None", "one array", "int", "str"])
def test_canonical_lists_that_are_not_lists_are_type_errors(argument, value, given):
    attrs = dict(rnn_mode="gru", num_layers=1, num_units=2, input_size=3)
    weights, biases = pycudnnrnn.params_to_canonical(
        np.zeros(pycudnnrnn.params_size(**attrs)), **attrs)
    lists = {**dict(weights=weights, biases=biases), argument: value}
    with pytest.raises(TypeError, match=rf"{argument}: expected a list of arrays \(as "
                                        rf"params_to_canonical returns them\), got {given}"):
        pycudnnrnn.canonical_to_params(lists["weights"], lists["biases"], **attrs)


@pytest.mark.parametrize("input_mode,params_input_size,given_input_size", [
    ("linear_input", 5, 3),       # params for input_size 5, input of 3 features
    ("linear_input", 3, 5),
    ("auto_select", 4, 3),        # params made skip (input_size = num_units = 4)
    ("auto_select", 3, 4),        # the reverse: auto_select picks skip for the input
])
def test_wrong_input_size_names_the_input_not_params(input_mode, params_input_size,
                                                     given_input_size):
    """A wrong feature size was reported as a params length error."""
    made = make_case("lstm", "bidirectional", input_mode=input_mode, num_layers=2,
                     input_size=params_input_size)
    wrong = make_case("lstm", "bidirectional", input_mode=input_mode, num_layers=2,
                      input_size=given_input_size)
    expected = pycudnnrnn.params_size(**wrong.layout_attrs)
    with pytest.raises(ValueError, match=rf"input: expected last dimension {params_input_size} "
                                         rf"\(params has {made.params.size} elements, params_size "
                                         rf"for input_size={params_input_size}\), got shape "
                                         rf"\(4, 3, {given_input_size}\) \(input_size="
                                         rf"{given_input_size} needs {expected} elements\)"):
        wrong.forward(params=made.params)


def test_params_that_fit_no_input_size_are_a_params_error():
    with pytest.raises(ValueError, match=r"^params: expected \d+ elements"):
        C.forward(params=np.zeros(C.params.size + 1))  # one more than any input_size gives


# PyTorch tensors arrive as they are used in training: requiring grad, or as lazy views.
TORCH_VIEWS = {
    "requires_grad": lambda torch, t: t.clone().requires_grad_(True),
    "non-leaf": lambda torch, t: t.clone().requires_grad_(True) * 1,
    "negative view": lambda torch, t: torch._neg_view(-t),
}


@pytest.mark.parametrize("view", TORCH_VIEWS, ids=list(TORCH_VIEWS))
def test_torch_tensors_are_read_as_their_values(view):
    """DLPack refuses tensors that require grad (a BufferError) and drops a negative view's
    sign; we only read them, so they are detached and resolved first."""
    torch = pytest.importorskip("torch")
    case = _lstm()
    expected = case.forward()
    tensors = {name: TORCH_VIEWS[view](torch, torch.from_numpy(getattr(case, name)))
               for name in ("input", "input_h", "input_c", "params")}
    got = case.forward(**tensors)
    for a, b in zip(expected[:3], got[:3]):
        np.testing.assert_array_equal(a, b.numpy())


def test_conjugate_torch_tensor_is_a_dtype_error():
    """A conjugate view (complex only) gave PyTorch's BufferError; now the dtype is named."""
    torch = pytest.importorskip("torch")
    conj = torch.from_numpy(C.input.astype(np.complex128)).conj()
    assert conj.is_conj()
    with pytest.raises(TypeError, match=r"input: expected dtype float16, bfloat16, float32 or float64, "
                                        r"got complex128"):
        C.forward(input=conj)


def test_arrays_on_torch_meta_device_are_type_errors():
    torch = pytest.importorskip("torch")
    case = _lstm()
    case.sequence_lengths = torch.tensor([1, 2, 3], device="meta")
    with pytest.raises(TypeError, match=r"sequence_lengths: expected integers on the CPU or a "
                                        r"CUDA device .*got torch.Tensor on device meta"):
        case.forward()
    with pytest.raises(TypeError, match=r"input: expected a NumPy array.*got torch.Tensor on "
                                        r"device meta"):
        C.forward(input=torch.empty(4, 3, 3, dtype=torch.float64, device="meta"))


@pytest.mark.parametrize("size,value,where", [
    ("num_layers", 3, r"input_h's shape \(4, 3, 4\) \[L·D, B, P\] with D=2 gives 2"),
    ("num_units", 5, r"input_c's shape \(4, 3, 4\) \[L·D, B, H\] gives 4"),
    ("input_size", 4, r"input's shape \(4, 3, 3\) \[T, B, input_size\] gives 3"),
], ids=["num_layers", "num_units", "input_size"])
def test_sizes_given_to_forward_must_match_the_shapes(size, value, where):
    """forward and backprop take the sizes of convert's attribute dicts, and check them."""
    with pytest.raises(ValueError, match=rf"{size}: given {value}, but {where}"):
        C.forward(**{size: value})
    fwd, grads = _backprop_parts(C)
    with pytest.raises(ValueError, match=rf"{size}: given {value}, but {where}"):
        C.backprop(fwd, *grads, **{size: value})
    with pytest.raises(TypeError, match=rf"{size}: expected an int, got float"):
        C.forward(**{size: 2.0})


def test_a_plan_reads_torch_tensors_that_require_grad():
    torch = pytest.importorskip("torch")
    case = _lstm()
    plan = pycudnnrnn.RNNPlan(num_layers=2, num_units=4, input_size=3, max_time=4,
                              batch_size=3, dtype="float64", direction="bidirectional")
    expected = plan.forward(case.input, case.input_h, case.input_c, case.params)
    grad = {n: torch.from_numpy(getattr(case, n)).requires_grad_(True)
            for n in ("input", "input_h", "input_c", "params")}
    got = plan.forward(grad["input"], grad["input_h"], grad["input_c"], grad["params"])
    assert isinstance(got, pycudnnrnn.ForwardResult)
    for a, b in zip(expected[:3], got[:3]):
        np.testing.assert_array_equal(a, b.numpy())


@pytest.mark.parametrize("name", ["input", "input_h", "input_c", "params"])
def test_masked_arrays_are_refused_not_read_without_their_mask(name):
    case = _lstm()
    with pytest.raises(TypeError, match=rf"^{name}: got a NumPy masked array, whose mask would "
                                        rf"be ignored; pass plain data"):
        case.forward(**{name: np.ma.array(getattr(case, name))})
    plan = pycudnnrnn.RNNPlan(num_layers=2, num_units=4, input_size=3, max_time=4,
                              batch_size=3, dtype="float64", direction="bidirectional")
    arrays = dict(input=case.input, input_h=case.input_h, input_c=case.input_c,
                  params=case.params)
    arrays[name] = np.ma.array(arrays[name])
    with pytest.raises(TypeError, match=rf"^{name}: got a NumPy masked array"):
        plan.forward(**arrays)


def _plan_and_args():
    case = _lstm()
    plan = pycudnnrnn.RNNPlan(num_layers=2, num_units=4, input_size=3, max_time=4,
                              batch_size=3, dtype="float64", direction="bidirectional")
    return plan, [case.input, case.input_h, case.input_c, case.params]


def test_out_buffers_that_share_memory_are_refused_naming_both():
    """One buffer for output_h and output_c ran, and output_h came back holding output_c."""
    plan, args = _plan_and_args()
    state = np.empty(plan.output_h_shape)
    with pytest.raises(ValueError, match=r"out output_h: shares memory with out output_c"):
        plan.forward(*args, out=(None, state, state, None))
    size = int(np.prod(plan.output_h_shape))
    flat = np.empty(2 * size)  # two views, overlapping by half
    first, second = (flat[k:k + size].reshape(plan.output_h_shape) for k in (0, size // 2))
    with pytest.raises(ValueError, match=r"out output_h: shares memory with out output_c"):
        plan.forward(*args, out=(None, first, second.reshape(plan.output_c_shape), None))
    with pytest.raises(ValueError, match=r"out output_h: shares memory with input_h"):
        plan.forward(*args, out=(None, args[1], None, None))  # written while it is read
    reserve = np.empty(plan.reserve_nbytes, np.uint8)
    with pytest.raises(ValueError, match=r"out reserve_space: shares memory with workspace"):
        plan.forward(*args, out=(None, None, None, reserve), workspace=reserve)
    # Neighbours in one allocation are fine: only shared bytes are refused.
    apart = flat.reshape((2,) + plan.output_h_shape)
    got = plan.forward(*args, out=(None, apart[0], apart[1], None))
    want = plan.forward(*args)
    np.testing.assert_array_equal(got.output_h, want.output_h)
    np.testing.assert_array_equal(got.output_c, want.output_c)


def test_out_of_the_wrong_kind_or_read_only_is_refused_before_any_work(monkeypatch):
    from pycudnnrnn.cpu import rnn as cpu_rnn
    plan, args = _plan_and_args()
    monkeypatch.setattr(cpu_rnn, "forward", None)  # any computation would fail
    for out, given in ((np.empty(plan.output_shape), "numpy.ndarray"), (5, "builtins.int")):
        with pytest.raises(TypeError, match=rf"out: expected a tuple of 4 buffers \(output, "
                                            rf"output_h, output_c, reserve_space\) or None, "
                                            rf"got {given}"):
            plan.forward(*args, out=out)
    read_only = np.empty(plan.output_shape)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"out output: expected a writable buffer, got a "
                                         r"read-only one"):
        plan.forward(*args, out=(read_only, None, None, None))
    with pytest.raises(TypeError, match=r"workspace: expected dtype uint8, got float32"):
        plan.forward(*args, workspace=np.empty(8, np.float32))


def test_read_only_jax_array_as_out_is_refused():
    jnp = pytest.importorskip("jax.numpy")
    case = _lstm(dtype=np.float32)
    plan = pycudnnrnn.RNNPlan(num_layers=2, num_units=4, input_size=3, max_time=4,
                              batch_size=3, direction="bidirectional")
    with pytest.raises(ValueError, match=r"out output: expected a writable buffer, got a "
                                         r"read-only one"):
        plan.forward(case.input, case.input_h, case.input_c, case.params,
                     out=(jnp.zeros(plan.output_shape), None, None, None))


def _zeros(*shape):
    return np.zeros(shape)


BI_LSTM_2 = pycudnnrnn.params_size(num_layers=2, num_units=4, input_size=3,
                                   direction="bidirectional")


@pytest.mark.parametrize("call,message", [
    # GRU params of 2 bidirectional layers, input_h of 1: input_h, not an invented input_size=17.
    (lambda: pycudnnrnn.forward(_zeros(5, 3, 3), _zeros(2, 3, 4), None, _zeros(552),
                                rnn_mode="gru", direction="bidirectional"),
     r"^input_h: expected L·D=4 \(params has 552 elements, params_size for num_layers=2\), got "
     r"shape \(2, 3, 4\); the shapes give num_layers=1 \(input_h \(2, 3, 4\), L·D=2 with D=2\)"),
    # direction= forgotten: input_h's 4 read as 4 layers.
    (lambda: pycudnnrnn.forward(_zeros(5, 3, 3), _zeros(4, 3, 4), _zeros(4, 3, 4),
                                _zeros(BI_LSTM_2)),
     r"^direction: params has 736 elements, params_size for direction='bidirectional' with "
     r"num_layers=2; the shapes give num_layers=4 .*: pass direction='bidirectional'$"),
    # LSTM with input_h of the wrong layer count: input_h is named, not input_c.
    (lambda: pycudnnrnn.forward(_zeros(5, 3, 3), _zeros(2, 3, 4), _zeros(4, 3, 4),
                                _zeros(BI_LSTM_2), direction="bidirectional"),
     r"^input_h: expected L·D=4 as in input_c and params \(params has 736 elements, params_size "
     r"for num_layers=2\), got shape \(2, 3, 4\)$"),
    # Batch-major input with the default time_major=True: say so, not just "input_h".
    (lambda: pycudnnrnn.forward(_zeros(3, 5, 3), _zeros(4, 3, 4), _zeros(4, 3, 4),
                                _zeros(BI_LSTM_2), direction="bidirectional"),
     r"input \(3, 5, 3\) reads as \[T, B, input_size\] \(time_major=True\) with B=5, but "
     r"input_h's batch matches its other dimension: for that layout pass time_major=False$"),
    (lambda: pycudnnrnn.forward(_zeros(5, 3, 3), _zeros(3, 4, 4), _zeros(3, 4, 4),
                                _zeros(BI_LSTM_2), direction="bidirectional", time_major=False),
     r"input \(5, 3, 3\) reads as \[B, T, input_size\] \(time_major=False\) with B=5, but "
     r"input_h's batch matches its other dimension: for that layout pass time_major=True$"),
], ids=["gru-layers", "direction", "lstm-input_h-layers", "batch-major", "time-major"])
def test_a_wrong_layer_count_or_layout_names_the_argument_that_differs(call, message):
    with pytest.raises(ValueError, match=message):
        call()


class _CupyLikeFlags(np.ndarray):
    """An array whose flags are CuPy's: c_contiguous, f_contiguous, owndata, no writeable."""

    @property
    def flags(self):
        import types
        return types.SimpleNamespace(c_contiguous=True, f_contiguous=False, owndata=True)


def test_buffers_whose_flags_have_no_writeable_field_are_taken():
    """CuPy's flags have no ``writeable``: the read-only check must not raise
    AttributeError for every CUDA call with out= or workspace=."""
    plan, args = _plan_and_args()
    out = tuple(np.empty(s).view(_CupyLikeFlags) for s in (plan.output_shape,
                                                            plan.output_h_shape,
                                                            plan.output_c_shape))
    got = plan.forward(*args, out=out + (None,),
                       workspace=np.empty(8, np.uint8).view(_CupyLikeFlags))
    np.testing.assert_array_equal(got.output, plan.forward(*args).output)


def test_attributes_replace_is_dataclasses_and_refuses_unknown_names():
    """``Attributes.replace`` (the PyTorch call's path replaces twice) makes what
    ``dataclasses.replace`` makes, equal and hashed alike, and refuses a name it lacks."""
    import dataclasses

    from pycudnnrnn.core.config import Attributes
    given = Attributes(rnn_mode="gru", direction="bidirectional", dropout=0.5, seed=3)
    for changes in ({}, {"dropout": 0.0, "is_training": False}, {"seed": 7, "seed2": 9}):
        copy, want = given.replace(**changes), dataclasses.replace(given, **changes)
        assert copy == want and hash(copy) == hash(want) and type(copy) is Attributes
        assert vars(copy) == vars(want) and copy is not given
    assert given.without_dropout() == dataclasses.replace(given, dropout=0.0, seed=0, seed2=0)
    assert given.dropout == 0.5  # unchanged
    with pytest.raises(TypeError, match="Attributes has no attribute 'dropuot'"):
        given.replace(dropuot=0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.replace(dropout=0.1).dropout = 0.2
