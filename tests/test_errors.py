"""Bad arguments fail before any computation, with a message naming argument,
expectation and what was given."""

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
     r"input_h: expected shape \(4, 3, 4\) \[L·D, B, P\], got \(4, 2, 4\)"),
    ("input_h odd L·D", _fwd(C, input_h=C.input_h[:3]), ValueError,
     r"input_h: expected shape \[L·D, B, P\] with L·D a positive multiple of D=2.*got \(3, 3, 4\)"),
    ("input_c missing", _fwd(C, input_c=None), TypeError, r"input_c: expected an array for rnn_mode='lstm', got None"),
    ("input_c shape", _fwd(C, input_c=C.input_c[:2]), ValueError,
     r"input_c: expected shape \(4, 3, 4\) \[L·D, B, H\], got \(2, 3, 4\)"),
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
    with pytest.raises(ValueError, match=r"reserve_space: made by a forward call with a different"):
        other.backprop(fwd, *grads)
    with pytest.raises(ValueError, match=r"reserve_space: expected a 1-D array"):
        case.backprop((y, hy, cy, reserve[None]), *grads)


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
