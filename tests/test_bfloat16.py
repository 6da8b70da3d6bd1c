"""bfloat16 on the CPU, through PyTorch, the converters and the stand-in GPU.

bfloat16 computes in float32 and rounds once, to bfloat16, where results leave (see
docs/semantics.md, "dtypes"). Every bfloat16 value is exactly a float32, so the same
call in float32 on the same values, rounded to bfloat16, must give the very same bits:
on the CPU the tolerance of these tests is zero. The stand-in GPU computes with the NumPy
backend on the batch the cuDNN backend hands cuDNN (zero-length rows left out), whose other
matrix shapes may round a float32 intermediate differently: a bfloat16 result then lands
one ulp over, so those tests compare within a few ulps (conftest.assert_ulp_close).
"""

import dataclasses
import sys
import types

import ml_dtypes
import numpy as np
import pytest

import pycudnnrnn
from conftest import assert_ulp_close, make_case
from fake_cuda import FakeDeviceArray, _device
from pycudnnrnn import convert
from pycudnnrnn.core import dtypes
from pycudnnrnn.core import gpu as gpu_module
from pycudnnrnn.errors import CudnnUnavailableError

torch = pytest.importorskip("torch")

BF16 = np.dtype(ml_dtypes.bfloat16)
MODES = [("lstm", 0), ("lstm", 2), ("gru", 0), ("rnn_tanh", 0), ("rnn_relu", 0)]


def _bits(a):
    """The raw bits of a bfloat16 NumPy array or tensor, for exact comparison."""
    if isinstance(a, torch.Tensor):
        return a.detach().view(torch.int16).numpy()
    return np.asarray(a).view(np.int16)


def _rounded(a):
    """A float32 result rounded to bfloat16 (round to nearest even, as cuDNN does)."""
    return _bits(np.asarray(a, dtype=np.float32).astype(BF16))


def _float32_twin(case):
    """The same case in float32, on the same (exactly representable) values."""
    wide = lambda a: None if a is None else a.astype(np.float32)
    return dataclasses.replace(case, **{n: wide(getattr(case, n))
                                        for n in ("input", "input_h", "input_c", "params")})


def _tensor(a):
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)


# --------------------------------------------------------------------------- NumPy backend

@pytest.mark.parametrize("mode,proj", MODES)
@pytest.mark.parametrize("direction", ["unidirectional", "bidirectional"])
@pytest.mark.parametrize("lengths", ["full", "zero"])
@pytest.mark.parametrize("time_major", [True, False])
def test_bfloat16_is_float32_arithmetic_rounded_once(mode, proj, direction, lengths, time_major):
    case = make_case(mode, direction, num_proj=proj, num_layers=2, lengths=lengths, T=6,
                     time_major=time_major, dtype=BF16, seed=3)
    twin = _float32_twin(case)
    fwd, ref = case.forward(), twin.forward()
    for got, want in zip(fwd[:3], ref[:3]):
        assert got.dtype == BF16 and got.shape == want.shape
        np.testing.assert_array_equal(_bits(got), _rounded(want))
    rng = np.random.default_rng(5)
    seeds = [rng.standard_normal(a.shape).astype(BF16) for a in fwd[:3]]
    grads = case.backprop(fwd, *seeds)
    grads_ref = twin.backprop(ref, *(s.astype(np.float32) for s in seeds))
    for got, want in zip(grads, grads_ref):
        assert got.dtype == BF16 and got.shape == want.shape
        np.testing.assert_array_equal(_bits(got), _rounded(want))


def test_bfloat16_results_differ_from_float32_by_one_rounding():
    """Not truncation, not a second rounding: within half a bfloat16 ulp of float32's."""
    case = make_case("lstm", "bidirectional", num_layers=2, T=8, num_units=16, dtype=BF16)
    got = case.forward()[0].astype(np.float64)
    want = _float32_twin(case).forward()[0].astype(np.float64)
    assert np.all(np.abs(got - want) <= 2.0 ** -8 * np.abs(want))  # unit roundoff, 8 bits
    assert np.any(got != want)  # the rounding is real


def test_mixed_bfloat16_and_float32_is_a_type_error():
    case = make_case("lstm", dtype=np.float32)
    with pytest.raises(TypeError, match="params: expected dtype float32 .the dtype of input., "
                                        "got bfloat16"):
        case.forward(params=case.params.astype(BF16))


def test_other_16_bit_types_are_refused():
    case = make_case("gru", dtype=np.float32)
    with pytest.raises(TypeError, match="input: expected dtype float16, bfloat16, float32 or "
                                        "float64, got int16"):
        case.forward(input=case.input.astype(np.int16))


# --------------------------------------------------------------------------- PyTorch CPU

@pytest.mark.parametrize("mode,proj", MODES)
def test_torch_bfloat16_tensors_in_and_out(mode, proj):
    case = make_case(mode, "bidirectional", num_proj=proj, num_layers=2, lengths="zero",
                     time_major=False, dtype=BF16)
    fwd = case.forward()
    args = [None if a is None else _tensor(a) for a in (case.input, case.input_h, case.input_c,
                                                        case.params)]
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    for got, want in zip(out[:3], fwd[:3]):
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
        np.testing.assert_array_equal(_bits(got), _bits(want))
    assert out[3].dtype == torch.uint8
    seeds = [np.full(a.shape, 0.5, BF16) for a in fwd[:3]]
    grads = case.backprop(fwd, *seeds)
    attrs = {k: v for k, v in case.attrs.items()}
    got = pycudnnrnn.backprop(*args, case.sequence_lengths, *out[:3], *map(_tensor, seeds),
                              out[3], **attrs)
    for g, want in zip(got, grads):
        assert isinstance(g, torch.Tensor) and g.dtype == torch.bfloat16
        np.testing.assert_array_equal(_bits(g), _bits(want))


def test_torch_bfloat16_crosses_without_a_copy():
    t = torch.randn(4, 6).to(torch.bfloat16)
    for tensor in (t, t.t()):  # contiguous or not
        host = dtypes.numpy_from_dlpack("input", tensor)
        assert host.dtype == BF16 and host.ctypes.data == tensor.data_ptr()
        assert host.strides == tuple(s * 2 for s in tensor.stride())
        np.testing.assert_array_equal(host.astype(np.float32), tensor.float().numpy())
    back = dtypes.torch_from_dlpack(host)
    assert back.dtype == torch.bfloat16 and back.data_ptr() == host.ctypes.data
    # and end to end: canonical weights are views of the caller's params tensor
    attrs = dict(rnn_mode="gru", num_layers=1, num_units=3, input_size=2)
    params = torch.zeros(pycudnnrnn.params_size(**attrs), dtype=torch.bfloat16)
    weights, biases = pycudnnrnn.params_to_canonical(params, **attrs)
    assert weights[0].dtype == torch.bfloat16 and weights[0].data_ptr() == params.data_ptr()
    biases[-1][:] = 2.5
    assert params[-1].item() == 2.5


def test_torch_autograd_in_bfloat16():
    from pycudnnrnn.torch import rnn
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", dtype=BF16)
    leaves = [_tensor(a).requires_grad_() for a in (case.input, case.input_h, case.input_c,
                                                    case.params)]
    y, hy, cy = rnn(*leaves, case.sequence_lengths, **case.attrs)
    assert y.dtype == torch.bfloat16
    (y.float().sum() + hy.float().sum() + cy.float().sum()).backward()
    fwd = case.forward()
    want = case.backprop(fwd, *(np.ones(a.shape, BF16) for a in fwd[:3]))
    for leaf, g in zip(leaves, want):
        assert leaf.grad.dtype == torch.bfloat16
        np.testing.assert_array_equal(_bits(leaf.grad), _bits(g))


def test_bfloat16_without_ml_dtypes_names_the_package(monkeypatch):
    case = make_case("gru", dtype=BF16)
    args = [_tensor(case.input), _tensor(case.input_h), None, _tensor(case.params)]
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` now fails
    message = r"{}: bfloat16 needs the ml_dtypes package .*pip install 'ml_dtypes>=0.4'"
    with pytest.raises(TypeError, match=message.format("input")):
        pycudnnrnn.forward(*args, rnn_mode="gru")
    with pytest.raises(TypeError, match=message.format("dtype")):
        pycudnnrnn.RNNPlan(num_layers=1, num_units=4, input_size=3, max_time=4, batch_size=3,
                           dtype="bfloat16")
    new_cupy = types.SimpleNamespace(__version__="14.2.0", from_dlpack=lambda a: pytest.fail())
    with pytest.raises(TypeError, match=message.format("input_h")):
        dtypes.cupy_from_dlpack(new_cupy, "input_h", args[1])


def test_jax_bfloat16_arrays_in_and_out():
    jnp = pytest.importorskip("jax.numpy")
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="zero", dtype=BF16)
    fwd = case.forward()
    args = [jnp.asarray(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    for got, want in zip(out[:3], fwd[:3]):
        assert type(got).__module__.startswith("jax") and got.dtype == BF16
        np.testing.assert_array_equal(_bits(np.asarray(got)), _bits(want))
    weights, biases = pycudnnrnn.params_to_canonical(args[3], **case.layout_attrs)
    assert weights[0].dtype == BF16 and type(weights[0]).__module__.startswith("jax")


# --------------------------------------------------------------------------- params, converters

def test_params_helpers_keep_bfloat16():
    attrs = dict(rnn_mode="lstm", num_layers=2, num_units=4, input_size=3,
                 direction="bidirectional", num_proj=2)
    n = pycudnnrnn.params_size(**attrs)
    params = np.random.default_rng(0).standard_normal(n).astype(BF16)
    weights, biases = pycudnnrnn.params_to_canonical(params, **attrs)
    assert all(a.dtype == BF16 for a in weights + biases)
    back = pycudnnrnn.canonical_to_params(weights, biases, **attrs)
    assert back.dtype == BF16
    np.testing.assert_array_equal(_bits(back), _bits(params))
    tensors = pycudnnrnn.canonical_to_params([_tensor(w) for w in weights],
                                             [_tensor(b) for b in biases], **attrs)
    assert tensors.dtype == torch.bfloat16
    np.testing.assert_array_equal(_bits(tensors), _bits(params))


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_torch_converters_in_bfloat16(kind):
    torch.manual_seed(0)
    module = getattr(torch.nn, kind)(3, 4, num_layers=2, bidirectional=True).to(torch.bfloat16)
    params, attrs = convert.from_torch(module)
    assert params.dtype == torch.bfloat16
    reference, _ = convert.from_torch(module.float())  # bfloat16 → float32 is exact
    np.testing.assert_array_equal(_bits(params), _rounded(reference.numpy()))
    for given in (params, dtypes.numpy_from_dlpack("params", params)):  # tensor or NumPy
        rebuilt = convert.to_torch(given, **attrs)
        assert next(rebuilt.parameters()).dtype == torch.bfloat16
        np.testing.assert_array_equal(_bits(convert.from_torch(rebuilt)[0]), _bits(params))


def test_keras_and_tf_converters_in_bfloat16():
    attrs = dict(rnn_mode="gru", num_layers=2, num_units=4, input_size=3,
                 direction="bidirectional", num_proj=0)
    params = np.random.default_rng(1).standard_normal(pycudnnrnn.params_size(**attrs)).astype(BF16)
    keras_weights = convert.to_keras(_tensor(params), **attrs)
    assert all(w.dtype == BF16 for layer in keras_weights for w in layer)
    back, _ = convert.from_keras(keras_weights, rnn_mode="gru", direction="bidirectional")
    assert back.dtype == BF16
    np.testing.assert_array_equal(_bits(back), _bits(params))
    weights, biases = convert.to_tf_canonical(params, **attrs)
    np.testing.assert_array_equal(_bits(convert.from_tf_canonical(weights, biases, **attrs)),
                                  _bits(params))


# --------------------------------------------------------------------------- cuDNN path

def test_cuda_bfloat16_with_cupy_13_crosses_as_bits():
    """CuPy 13's DLPack import refuses bfloat16: the tensor's int16 view crosses instead."""
    imported = []
    old = types.SimpleNamespace(__version__="13.6.0", ndarray=np.ndarray,
                                from_dlpack=lambda a: imported.append(a) or np.from_dlpack(a))
    tensor = _tensor(np.arange(6, dtype=np.float32).reshape(2, 3).astype(BF16))
    got = dtypes.cupy_from_dlpack(old, "output_h", tensor)
    assert isinstance(got, dtypes.Bfloat16Bits) and got.dtype == BF16 and got.shape == (2, 3)
    assert imported[0].dtype == torch.int16  # CuPy was handed the bits, not bfloat16
    assert got.bits.dtype == np.int16 and got.bits.ctypes.data == tensor.data_ptr()  # no copy
    np.testing.assert_array_equal(got.bits, _bits(tensor))
    back = dtypes.torch_from_dlpack(got)  # and out again as bfloat16, still no copy
    assert back.dtype == torch.bfloat16 and back.data_ptr() == tensor.data_ptr()
    new = types.SimpleNamespace(__version__="14.2.0", from_dlpack=lambda a: "imported")
    assert dtypes.cupy_from_dlpack(new, "output_h", tensor) == "imported"
    assert dtypes.storage_dtype(BF16, old) == np.int16 == dtypes.storage_dtype("int16", old)
    assert dtypes.storage_dtype(BF16, new) == BF16 == dtypes.storage_dtype(BF16, np)
    assert dtypes.storage_dtype(np.float16, old) == np.float16


def test_jax_bfloat16_with_cupy_13_crosses_as_bits():
    jnp = pytest.importorskip("jax.numpy")
    old = types.SimpleNamespace(__version__="13.6.0", ndarray=np.ndarray,
                                from_dlpack=np.from_dlpack)
    values = np.linspace(-2, 2, 6, dtype=np.float32).astype(BF16)
    got = dtypes.cupy_from_dlpack(old, "input", jnp.asarray(values))
    assert isinstance(got, dtypes.Bfloat16Bits) and got.bits.dtype == np.int16
    np.testing.assert_array_equal(got.bits, _bits(values))
    back = dtypes.jax_from_dlpack(dtypes.Bfloat16Bits(got.bits.copy()))  # JAX's CPU
    # arrays import read-only, which NumPy will not export again; CuPy's are writable
    assert back.dtype == BF16
    np.testing.assert_array_equal(_bits(np.asarray(back)), _bits(values))


def test_a_cupy_int16_array_is_not_bfloat16(stand_in_gpu):
    stand_in_gpu.cupy.__version__ = "13.6.0"
    case = make_case("gru", dtype=BF16)
    args = _on_device(case)
    args[1] = args[1].view(np.int16)
    with pytest.raises(TypeError, match=r"input_h: expected dtype bfloat16 \(the dtype of "
                                        r"input\), got int16"):
        pycudnnrnn.forward(*args, rnn_mode="gru")


@pytest.fixture
def stand_in_gpu(fake_gpu, monkeypatch):
    """The stand-in GPU of test_cudnn_backend_emulated; RNN descriptors made are kept in
    ``fake_gpu.rnn_descriptors`` (to read back through cuDNN)."""
    from pycudnnrnn.cudnn import descriptors
    made, build = [], descriptors.RNNDescriptor.__init__

    def recording(self, *args, **kwargs):
        build(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(descriptors.RNNDescriptor, "__init__", recording)
    fake_gpu.rnn_descriptors = made
    fake_gpu.cupy = gpu_module.cupy()  # the FakeCupy: tests may make it play CuPy 13
    return fake_gpu


def _on_device(case):
    return [None if a is None else _device(a) for a in (case.input, case.input_h, case.input_c,
                                                        case.params)]


@pytest.mark.parametrize("mode,proj", MODES)
@pytest.mark.parametrize("time_major", [True, False])
@pytest.mark.parametrize("cupy_version", ["14.2.0", "13.6.0"])
def test_cudnn_backend_bfloat16_on_the_stand_in_gpu(stand_in_gpu, mode, proj, time_major,
                                                    cupy_version):
    """CuPy 14 holds bfloat16; the stand-in playing CuPy 13 refuses it in imports,
    allocations and kernels, so there every bfloat16 buffer is carried as its bits."""
    from pycudnnrnn.cudnn import capi
    stand_in_gpu.cupy.__version__ = cupy_version
    case = make_case(mode, "bidirectional", num_proj=proj, num_layers=2, lengths="zero",
                     time_major=time_major, dtype=BF16, seed=7)
    cpu = case.forward()
    seeds = [np.random.default_rng(2).standard_normal(a.shape).astype(BF16) for a in cpu[:3]]
    cpu_grads = case.backprop(cpu, *seeds)
    args = _on_device(case)
    gpu = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    gpu_grads = pycudnnrnn.backprop(*args, case.sequence_lengths, *gpu[:3],
                                    *map(_device, seeds), gpu[3], **case.attrs)
    for got, want in zip(gpu[:3] + tuple(gpu_grads), cpu[:3] + tuple(cpu_grads)):
        assert isinstance(got, FakeDeviceArray) and got.dtype == BF16
        assert_ulp_close(got, want)
    assert "cudnnRNNBackwardWeights_v8" in stand_in_gpu.calls
    assert stand_in_gpu.rnn_descriptors
    for descriptor in stand_in_gpu.rnn_descriptors:
        values = descriptor.read()  # read back through cuDNN itself
        assert values["dataType"] == capi.CUDNN_DATA_BFLOAT16 == 9
        assert (values["mathPrec"], values["mathType"]) == (capi.CUDNN_DATA_FLOAT,
                                                            capi.CUDNN_TENSOR_OP_MATH)


@pytest.mark.parametrize("version,ok", [((9, 12, 2), False), ((8, 9, 7), False),
                                        ((9, 13, 0), True), ((9, 19, 1), True)])
def test_cudnn_version_gate_for_bfloat16(stand_in_gpu, monkeypatch, version, ok):
    from pycudnnrnn.cudnn import loader
    monkeypatch.setattr(loader, "version", lambda: version)
    case = make_case("lstm", dtype=BF16)
    found = ".".join(map(str, version))
    if ok:
        pycudnnrnn.forward(*_on_device(case))
        return
    with pytest.raises(CudnnUnavailableError, match=rf"bfloat16 RNNs need cuDNN >= 9\.13\.0, "
                                                    rf"found cuDNN {found}"):
        pycudnnrnn.forward(*_on_device(case))
    assert "cudnnRNNForward" not in stand_in_gpu.calls
    f32 = make_case("lstm", dtype=np.float32)  # other dtypes do not care
    pycudnnrnn.forward(*_on_device(f32))


@pytest.mark.parametrize("time_major", [True, False])
def test_bfloat16_descriptors_read_back(time_major):
    from pycudnnrnn.core.checks import make_config
    from pycudnnrnn.cudnn import capi, descriptors
    assert descriptors.math_settings(BF16) == (capi.CUDNN_DATA_FLOAT, capi.CUDNN_TENSOR_OP_MATH)
    config = make_config(rnn_mode="gru", num_layers=2, num_units=6, input_size=5,
                         input_mode="linear_input", direction="bidirectional", num_proj=0)
    with descriptors.DropoutDescriptor() as dropout:
        with descriptors.RNNDescriptor(config, BF16, dropout) as desc:
            assert desc.read()["dataType"] == capi.CUDNN_DATA_BFLOAT16
    with descriptors.RNNDataDescriptor(BF16, time_major, 7, 3, 5, [7, 2, 1]) as desc:
        values = desc.read(3)
    assert values["dataType"] == capi.CUDNN_DATA_BFLOAT16
    assert values["paddingFill"] == b"\x00" * 2 + b"\xff" * 6  # a bfloat16 zero, two bytes
    with descriptors.TensorDescriptor(BF16, [4, 3, 6]) as desc:
        assert desc.read()["dataType"] == capi.CUDNN_DATA_BFLOAT16


# --------------------------------------------------------------------------- plans

@pytest.mark.parametrize("dtype", ["bfloat16", BF16, torch.bfloat16])
def test_plan_in_bfloat16_on_the_cpu_with_torch_tensors(dtype):
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="zero", dtype=BF16)
    want = case.forward()
    seeds = [np.full(a.shape, 0.25, BF16) for a in want[:3]]
    want_grads = case.backprop(want, *seeds)
    p = pycudnnrnn.RNNPlan(**case.size, max_time=4, batch_size=3, dtype=dtype,
                           sequence_lengths=case.sequence_lengths, rnn_mode="lstm",
                           direction="bidirectional")
    assert p.dtype == BF16
    args = [_tensor(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    got = p.forward(*args)
    got_grads = p.backprop(*args, *got[:3], *map(_tensor, seeds), got[3])
    for g, w in zip(got[:3] + tuple(got_grads), want[:3] + tuple(want_grads)):
        assert isinstance(g, torch.Tensor) and g.dtype == torch.bfloat16
        np.testing.assert_array_equal(_bits(g), _bits(w))
    with pytest.raises(TypeError, match=r"input: expected dtype bfloat16 \(the dtype of the "
                                        r"plan\), got float32"):
        p.forward(case.input.astype(np.float32), *args[1:])


def test_plan_in_bfloat16_with_cupy_13_and_another_librarys_arrays(stand_in_gpu):
    """Another library's bfloat16 arrays (FakeFrameworkArray) through a plan on the
    stand-in playing CuPy 13: they cross as bits, caller buffers (out) too, results equal
    the NumPy backend's bits, and what leaves for a library we do not know is CuPy's
    int16 bits (CuPy 13 has no bfloat16)."""
    from fake_cuda import FakeFrameworkArray
    stand_in_gpu.cupy.__version__ = "13.6.0"
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="zero", dtype=BF16)
    want = case.forward()
    seeds = [np.full(a.shape, 0.25, BF16) for a in want[:3]]
    want_grads = case.backprop(want, *seeds)
    p = pycudnnrnn.RNNPlan(**case.size, max_time=4, batch_size=3, dtype="bfloat16",
                           sequence_lengths=case.sequence_lengths, rnn_mode="lstm",
                           direction="bidirectional", device="cuda")
    framework = lambda a: FakeFrameworkArray(_device(a))
    args = [framework(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    out = [framework(np.zeros(w.shape, BF16)) for w in want[:3]] + [None]
    got = p.forward(*args, out=out)
    for g, w, o in zip(got[:3], want[:3], out):
        assert g.dtype == np.int16 and g.ctypes.data == o.array.ctypes.data
        assert_ulp_close(g.view(BF16), w)
    got_grads = p.backprop(*args, *(framework(g.view(BF16)) for g in got[:3]),
                           *(framework(s) for s in seeds), got[3])
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == np.int16
        assert_ulp_close(g.view(BF16), w)
    with pytest.raises(TypeError, match=r"input: expected dtype bfloat16 \(the dtype of the "
                                        r"plan\), got int16"):
        p.forward(_device(case.input.view(np.int16)), *args[1:])
    functional = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    for g, w in zip(functional[:3], got[:3]):  # the plan's computation again: the same bits
        np.testing.assert_array_equal(g, w)


def test_params_helpers_in_bfloat16_with_cupy_13(stand_in_gpu):
    """params_to_canonical and canonical_to_params on the stand-in playing CuPy 13: views
    of the bits, and bfloat16 again for a CuPy bfloat16 caller."""
    stand_in_gpu.cupy.__version__ = "13.6.0"
    attrs = dict(rnn_mode="lstm", num_layers=2, num_units=4, input_size=3,
                 direction="bidirectional", num_proj=2)
    n = pycudnnrnn.params_size(**attrs)
    params = _device(np.random.default_rng(0).standard_normal(n).astype(BF16))
    weights, biases = pycudnnrnn.params_to_canonical(params, **attrs)
    assert all(a.dtype == BF16 for a in weights + biases)
    assert weights[0].ctypes.data == params.ctypes.data  # a view, no copy
    back = pycudnnrnn.canonical_to_params(weights, biases, **attrs)
    assert isinstance(back, FakeDeviceArray) and back.dtype == BF16
    np.testing.assert_array_equal(_bits(back), _bits(params))


@pytest.mark.parametrize("cupy_version", ["14.2.0", "13.6.0"])
def test_plan_in_bfloat16_on_the_stand_in_gpu(stand_in_gpu, cupy_version):
    stand_in_gpu.cupy.__version__ = cupy_version
    case = make_case("gru", "bidirectional", num_layers=2, lengths="zero", dtype=BF16)
    want = case.forward()
    p = pycudnnrnn.RNNPlan(**case.size, max_time=4, batch_size=3, dtype="bfloat16",
                           sequence_lengths=case.sequence_lengths, rnn_mode="gru",
                           direction="bidirectional", device="cuda")
    got = p.forward(*_on_device(case))
    for g, w in zip(got[:3], want[:3]):
        assert isinstance(g, FakeDeviceArray) and g.dtype == BF16
        assert_ulp_close(g, w)


# --------------------------------------------------------------------------- command line

@pytest.mark.parametrize("backend", ["cpu", "gpu"], ids=["numpy", "stand-in"])  # not a `gpu` test
def test_check_command_in_bfloat16(fake_gpu, backend):
    """`pycudnnrnn check --dtype bfloat16`, on the CPU and on the stand-in GPU."""
    from pycudnnrnn.tools import cli, selfcheck
    assert "bfloat16" in cli.DTYPES
    rows = selfcheck.run(selfcheck.CheckConfig(backend=backend, dtype="bfloat16"))
    what = "bfloat16 vs float64" if backend == "cpu" else "cuDNN vs NumPy"
    compared = [r for r in rows if r.name.endswith(what)]
    assert len(compared) == 7 and all(r.ok for r in rows), rows
    assert all(r.tolerance == selfcheck.TOLERANCE["bfloat16"] for r in compared)
    if backend == "cpu":  # one rounding, and a real one
        assert all(0 < r.error <= 2.0 ** -8 for r in compared), compared
    else:
        assert "cudnnRNNBackwardWeights_v8" in fake_gpu.calls
