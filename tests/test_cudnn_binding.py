"""The cuDNN binding without a GPU: loading, the prototype table against the wheel's
headers, descriptors read back, error mapping, and ownership (nothing leaks)."""

import ctypes
import gc
import glob
import itertools
import json
import os
import re

import numpy as np
import pytest

import pycudnnrnn
from pycudnnrnn import errors
from pycudnnrnn.core.checks import make_config
from pycudnnrnn.cudnn import capi, descriptors, loader


# --------------------------------------------------------------------------- loading

def test_loads_cudnn9_from_the_wheel():
    lib = loader.load()
    assert loader.version()[0] == 9
    path = loader.library_path()
    assert path.endswith("libcudnn.so.9")
    assert os.sep + "nvidia" + os.sep in path, "the pip wheel comes before the system loader"
    assert lib.cudnnGetVersion() == capi.api().cudnnGetVersion()


def test_missing_library_says_what_was_tried_and_what_to_install(monkeypatch):
    monkeypatch.setattr(loader, "nvidia_wheel_roots", lambda: ["/nonexistent/site-packages/nvidia"])
    monkeypatch.setattr(loader, "SONAME", "libcudnn_no_such_library.so.9")
    monkeypatch.setenv(loader.ENV_VAR, "/nowhere/libcudnn.so.9")
    loader.load.cache_clear()
    try:
        with pytest.raises(errors.CudnnUnavailableError) as info:
            loader.load()
    finally:
        loader.load.cache_clear()
    message = str(info.value)
    assert "/nowhere/libcudnn.so.9 (no such file)" in message
    assert "/nonexistent/site-packages/nvidia/cudnn/lib/libcudnn_no_such_library.so.9" in message
    assert "libcudnn_no_such_library.so.9 (" in message  # the system loader's own complaint
    assert "pip install nvidia-cudnn-cu12" in message and loader.ENV_VAR in message


def test_environment_variable_comes_first(monkeypatch):
    monkeypatch.setenv(loader.ENV_VAR, "/custom/libcudnn.so.9")
    assert loader.candidates()[0] == "/custom/libcudnn.so.9"
    assert loader.candidates()[-1] == "libcudnn.so.9"


# --------------------------------------------------------------------------- prototypes vs headers

def _header_declarations():
    include = [os.path.join(root, sub, "include") for root in loader.nvidia_wheel_roots()
               for sub in ("cudnn", "cu13", "cu12")]
    include = next((d for d in include if glob.glob(os.path.join(d, "cudnn*.h"))), None)
    declarations = {}
    if include is None:
        return declarations  # every prototype test then fails, saying so
    for path in glob.glob(os.path.join(include, "cudnn*.h")):
        text = open(path, encoding="utf-8", errors="replace").read()
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        text = re.sub(r"\bCUDNN_DEPRECATED\b", " ", text)
        for m in re.finditer(r"([A-Za-z_][\w\s\*]*?)\s*\bCUDNNWINAPI\s+(\w+)\s*\(([^)]*)\)\s*;", text):
            declarations[m.group(2)] = (m.group(1).split(";")[-1].split("}")[-1].strip(),
                                        m.group(3))
    return declarations


_HANDLES = re.compile(r"^(cudnn\w*(Descriptor|Handle)_t|cudaStream_t)$")
_SCALARS = {"int": ctypes.c_int, "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32,
            "size_t": ctypes.c_size_t, "float": ctypes.c_float,
            "unsigned long long": ctypes.c_ulonglong}


def _ctype(declaration):
    """The ctypes type a C parameter or return type maps to."""
    text = re.sub(r"\bconst\b", " ", declaration)
    stars = text.count("*") + text.count("[]")
    text = re.sub(r"\[\s*\]", " ", text).replace("*", " ")
    words = text.split()
    base = " ".join(words)
    for known in list(_SCALARS) + ["void", "char"]:
        if base == known or base.startswith(known + " "):
            base = known
            break
    else:
        base = words[0]
    if base == "void":
        return {0: None, 1: ctypes.c_void_p, 2: ctypes.POINTER(ctypes.c_void_p)}[stars]
    if base == "char" and stars == 1:
        return ctypes.c_char_p
    if _HANDLES.match(base):
        t = ctypes.c_void_p
    elif base in _SCALARS:
        t = _SCALARS[base]
    elif re.match(r"^(cudnn\w+_t|libraryPropertyType)$", base):
        t = ctypes.c_int  # an enum
    else:
        raise AssertionError(f"unknown C type {declaration!r}")
    for _ in range(stars):
        t = ctypes.POINTER(t)
    return t


def _parameters(text):
    text = text.strip()
    if text in ("", "void"):
        return []
    return [p.strip() for p in text.split(",")]


DECLARATIONS = _header_declarations()


@pytest.mark.parametrize("name", sorted(capi.PROTOTYPES))
def test_prototype_matches_the_header(name):
    assert name in DECLARATIONS, f"{name} is not declared in the wheel's cudnn*.h"
    c_return, c_params = DECLARATIONS[name]
    restype, argtypes = capi.PROTOTYPES[name]
    expected_args = [_ctype(p) for p in _parameters(c_params)]
    assert len(argtypes) == len(expected_args), f"{name}: argument count"
    for i, (ours, theirs) in enumerate(zip(argtypes, expected_args)):
        assert ours == theirs, f"{name} argument {i} ({_parameters(c_params)[i]})"
    assert restype == _ctype(c_return), f"{name}: return type {c_return}"


def test_header_parser_sees_the_functions_we_call():
    assert {"cudnnRNNForward", "cudnnRNNBackwardData_v8", "cudnnGetRNNWeightParams"} <= set(DECLARATIONS)
    assert "cudnnRNNForwardTraining" not in DECLARATIONS, "cuDNN 9 removed the legacy RNN API"


def test_every_prototype_binds():
    api = capi.api()
    for name in capi.PROTOTYPES:
        assert callable(getattr(api, name))
    with pytest.raises(AttributeError, match="not in pycudnnrnn's prototype table"):
        api.cudnnRNNForwardTraining


# --------------------------------------------------------------------------- descriptors

CONFIGS = [
    (mode, direction, skip, proj, layers, dtype)
    for mode, direction, skip, proj, layers, dtype in itertools.product(
        ["lstm", "gru", "rnn_tanh", "rnn_relu"], ["unidirectional", "bidirectional"],
        [False, True], [0, 3], [1, 3], [np.float16, np.float32, np.float64])
    if not (proj and mode != "lstm")
]


@pytest.mark.parametrize("mode,direction,skip,proj,layers,dtype", CONFIGS)
def test_rnn_descriptor_reads_back(mode, direction, skip, proj, layers, dtype):
    config = make_config(rnn_mode=mode, num_layers=layers, num_units=6,
                         input_size=6 if skip else 5,
                         input_mode="skip_input" if skip else "linear_input",
                         direction=direction, num_proj=proj)
    with descriptors.DropoutDescriptor() as dropout:
        with descriptors.RNNDescriptor(config, dtype, dropout) as desc:
            values = desc.read()
            assert values["dropoutDesc"] == dropout._as_parameter_.value
    expected = descriptors.rnn_descriptor_values(config, dtype)
    assert {k: values[k] for k in expected} == expected
    # and the values themselves are the ones cuDNN's headers name
    assert values["cellMode"] == {"lstm": 2, "gru": 3, "rnn_tanh": 1, "rnn_relu": 0}[mode]
    assert values["dirMode"] == (direction == "bidirectional")
    assert values["inputMode"] == int(skip)
    assert values["projSize"] == (proj or 6) and values["hiddenSize"] == 6
    assert values["biasMode"] == 2 and values["auxFlags"] == 1  # double bias, padded I/O
    assert values["dataType"] == {np.float16: 2, np.float32: 0, np.float64: 1}[dtype]
    assert values["mathPrec"] == (1 if dtype == np.float64 else 0)  # half computes in float


def test_math_modes():
    assert descriptors.math_settings(np.float32) == (capi.CUDNN_DATA_FLOAT, capi.CUDNN_FMA_MATH)
    assert descriptors.math_settings(np.float32, allow_tf32=True)[1] == capi.CUDNN_DEFAULT_MATH
    assert descriptors.math_settings(np.float16) == (capi.CUDNN_DATA_FLOAT, capi.CUDNN_TENSOR_OP_MATH)
    assert descriptors.math_settings(np.float64) == (capi.CUDNN_DATA_DOUBLE, capi.CUDNN_DEFAULT_MATH)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("time_major", [True, False])
def test_rnn_data_descriptor_reads_back(dtype, time_major):
    with descriptors.RNNDataDescriptor(dtype, time_major, 7, 3, 5, [7, 2, 1]) as desc:
        values = desc.read(3)
    assert values["dataType"] == descriptors.data_type(dtype)
    assert values["layout"] == (0 if time_major else 2)
    assert (values["maxSeqLength"], values["batchSize"], values["vectorSize"]) == (7, 3, 5)
    assert values["seqLengthArray"] == [7, 2, 1]
    width = np.dtype(dtype).itemsize  # a zero of the data's own width, no more
    assert values["paddingFill"] == b"\x00" * width + b"\xff" * (8 - width)


def test_tensor_descriptor_reads_back():
    with descriptors.TensorDescriptor(np.float64, [4, 3, 6]) as desc:
        assert desc.read() == dict(dataType=capi.CUDNN_DATA_DOUBLE, dims=[4, 3, 6], strides=[18, 6, 1])


@pytest.mark.parametrize("dims", [[2, 2 ** 16 + 1, 2 ** 16], [1, 2 ** 31 - 1, 2]])
def test_tensor_descriptor_refuses_strides_past_int32(dims):
    """A state [L·D, B, P] whose stride B·P passes 2**31 - 1: cuDNN takes strides as
    32-bit ints, and a ctypes c_int array wraps them silently (2**32 + 2**16 becomes
    2**16). cuDNN 9 then refuses the tensor as NOT_SUPPORTED, naming neither limit nor
    remedy. Refused first, naming both, before any descriptor is made (review
    2026-12-07, finding 12); no memory is needed for it."""
    live = descriptors.LIVE["TensorDescriptor"]
    with pytest.raises(ValueError, match=r"2147483647.*split the batch"):
        descriptors.TensorDescriptor(np.float32, dims)
    assert descriptors.LIVE["TensorDescriptor"] == live


def test_tensor_descriptor_takes_the_largest_tensor_cudnn_takes():
    with descriptors.TensorDescriptor(np.float32, [1, 2 ** 15, 2 ** 16 - 1]) as desc:
        assert desc.read()["strides"] == [2 ** 31 - 2 ** 15, 2 ** 16 - 1, 1]


@pytest.mark.parametrize("config,error,reason", [
    (dict(rnn_mode="gru", num_proj=3), errors.CudnnNotSupportedError, "CUDNN_STATUS_NOT_SUPPORTED"),
    (dict(rnn_mode="lstm", num_proj=7), errors.CudnnNotSupportedError, "CUDNN_STATUS_NOT_SUPPORTED"),
])
def test_rejected_configuration_raises_its_family(config, error, reason):
    cfg = pycudnnrnn.core.config.RNNConfig(skip_input=False, bidirectional=False, num_layers=1,
                                      num_units=6, input_size=5, **config)
    with descriptors.DropoutDescriptor() as dropout:
        with pytest.raises(error, match=reason) as info:
            descriptors.RNNDescriptor(cfg, np.float32, dropout)
    assert info.value.function == "cudnnSetRNNDescriptor_v8"
    assert info.value.status == 3000 and info.value.status_name == reason


def test_cudnn_reason_is_in_the_message():
    """projSize 0 (what cuDNN gets if nobody maps 'no projection' to hiddenSize)."""
    config = make_config(rnn_mode="lstm", num_layers=1, num_units=6, input_size=5,
                         input_mode="linear_input", direction="unidirectional", num_proj=0)
    with descriptors.DropoutDescriptor() as dropout, \
            descriptors.RNNDescriptor(config, np.float32, dropout) as desc:
        v = descriptors.rnn_descriptor_values(config, np.float32)
        with pytest.raises(errors.CudnnBadParamError, match=r"CUDNN_STATUS_BAD_PARAM \(2000\): projSize <= 0") as info:
            capi.api().cudnnSetRNNDescriptor_v8(
                desc, v["algo"], v["cellMode"], v["biasMode"], v["dirMode"], v["inputMode"],
                v["dataType"], v["mathPrec"], v["mathType"], v["inputSize"], v["hiddenSize"], 0,
                v["numLayers"], dropout, v["auxFlags"])
    assert info.value.detail == "projSize <= 0"
    with pytest.raises(errors.CudnnBadParamError, match="currentSeqLength"):
        descriptors.RNNDataDescriptor(np.float32, True, 5, 2, 3, [6, 1])


def test_error_classes_by_family():
    assert errors.error_class(1001) is errors.CudnnNotInitializedError
    assert errors.error_class(2008) is errors.CudnnBadParamError
    assert errors.error_class(3000) is errors.CudnnNotSupportedError
    assert errors.error_class(4003) is errors.CudnnInternalError
    assert errors.error_class(5002) is errors.CudnnExecutionFailedError
    assert errors.error_class(9999) is errors.CudnnError
    for cls in (errors.CudnnBadParamError, errors.CudnnNotSupportedError):
        assert issubclass(cls, pycudnnrnn.CudnnError)


def test_cudnns_failed_device_allocation_is_a_memory_error():
    """Status 4004, CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED: cuDNN ran out of
    device memory. A MemoryError, as CuPy's out-of-memory error is (what callers and the
    CLI catch for a failed allocation), and still a CudnnInternalError (review
    2026-12-07, finding 12: it was a CudnnInternalError only)."""
    call = capi._checked(capi.api(), "cudnnRNNForward", lambda *args: 4004)
    with pytest.raises(MemoryError) as info:
        call()
    assert isinstance(info.value, errors.CudnnInternalError)
    assert type(info.value) is errors.error_class(4004) is pycudnnrnn.CudnnAllocationError
    assert (info.value.status, info.value.function) == (4004, "cudnnRNNForward")
    assert info.value.status_name == "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"
    assert errors.error_class(4003) is errors.CudnnInternalError  # its family's, as before


def test_handle_without_a_gpu_is_not_initialised():
    with pytest.raises(errors.CudnnNotInitializedError, match="cudnnCreate failed with CUDNN_STATUS_NOT_INITIALIZED"):
        descriptors.Handle()


def test_descriptors_are_freed_exactly_once_and_do_not_accumulate():
    config = make_config(rnn_mode="gru", num_layers=2, num_units=4, input_size=3,
                         input_mode="linear_input", direction="bidirectional", num_proj=0)
    gc.collect()
    before = dict(descriptors.LIVE)
    dropout = descriptors.DropoutDescriptor()
    for i in range(1000):
        descriptors.RNNDescriptor(config, np.float32, dropout)
        descriptors.RNNDataDescriptor(np.float32, True, 5, 2, 3, [5, i % 5])
        with descriptors.TensorDescriptor(np.float32, [4, 2, 4]):
            pass
    dropout.close()
    dropout.close()  # idempotent
    gc.collect()
    assert {k: v for k, v in descriptors.LIVE.items() if v != before.get(k, 0)} == {}
    assert dropout.closed
    with pytest.raises(ValueError, match="DropoutDescriptor is closed"):
        dropout._as_parameter_


# --------------------------------------------------------------------------- dispatch without a GPU

class _FakeCudaArray:
    shape, ndim, dtype = (4, 3, 3), 3, np.float32

    def __dlpack_device__(self):
        return (2, 0)


def test_cuda_arrays_without_a_gpu_say_so():
    fake = _FakeCudaArray()
    with pytest.raises(errors.CudnnUnavailableError, match="no usable GPU|no GPU"):
        pycudnnrnn.forward(fake, fake, fake, fake)


def test_gpu_check_refuses_to_pass_without_a_gpu(tmp_path):
    """`make gpu-check` exits non-zero at once, saying why, rather than run zero GPU tests."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "gpu_check.py")],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OUT=str(tmp_path)))
    assert proc.returncode != 0
    assert "no usable GPU" in proc.stderr + proc.stdout and "nothing was run" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_every_test_the_gpu_check_counts_on_is_a_gpu_test():
    """Each hazard of ``make gpu-check`` is settled by tests it names: each must be one that
    ``pytest -m gpu`` runs (a test left unmarked leaves its hazard "not settled")."""
    import re
    import subprocess
    import sys
    from conftest import benchmark_script
    check = benchmark_script("gpu_check")
    names = {name for _, tests in check.HAZARDS for name in tests}
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    files = sorted({os.path.join(tests, f) for f in os.listdir(tests)
                    if f.startswith("test_") and f.endswith(".py") and any(
                        re.search(rf"def {re.escape(n.split('[')[0])}\(",
                                  open(os.path.join(tests, f)).read()) for n in names)})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                           "-p", "no:cacheprovider", *files], capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(tests))
    collected = {line.split("::")[-1] for line in proc.stdout.splitlines() if "::" in line}
    assert sorted(names - collected) == []


def test_gpu_check_limits_sum_to_under_six_minutes():
    """A device session has about 15 minutes; a check must fit twice with start-up."""
    from conftest import benchmark_script
    check = benchmark_script("gpu_check")
    limits = [check.LAYOUT_TIMEOUT_S, check.TEST_TIMEOUT_S, check.BENCH_TIMEOUT_S]
    limits += [entry[2] for entry in check.FRAMEWORK_BENCHES]
    assert sum(limits) < 360
    names = {entry[0] for entry in check.FRAMEWORK_BENCHES}
    assert names == {"torch_bench.py", "jax_bench.py", "flax_bench.py", "keras_bench.py",
                     "second_order_bench.py"}
    for name in names:
        assert os.path.exists(os.path.join(os.path.dirname(check.__file__), name))


def test_gpu_check_writes_its_report_as_it_goes(tmp_path, monkeypatch):
    """A device's time limit can kill the check at any step: the hazard files run first,
    each outcome reaches the log as its test ends, and the report of the steps finished
    is on disk before the next step starts."""
    from conftest import benchmark_script
    check = benchmark_script("gpu_check")
    root, out = tmp_path / "checkout", tmp_path / "out"
    (root / "tests").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: a GPU test\n")
    (root / "tests" / "test_a_slow.py").write_text(
        "import time, pytest\n"
        "@pytest.mark.gpu\ndef test_skipped():\n    pytest.skip('no reason')\n"
        "@pytest.mark.gpu\ndef test_hangs():\n    time.sleep(600)\n")
    (root / "tests" / check.FIRST[0]).write_text(
        "import pytest\n@pytest.mark.gpu\n@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_settles_a_hazard(n):\n    assert n\n")
    monkeypatch.setattr(check, "ROOT", str(root))
    monkeypatch.setattr(check, "TEST_TIMEOUT_S", 20)
    monkeypatch.setattr(check, "environment", lambda: {"gpu": "stand-in"})
    monkeypatch.setenv("OUT", str(out))

    def killed(name, *args, **kwargs):  # the device's limit, reached at the next step
        raise KeyboardInterrupt(name)
    monkeypatch.setattr(check, "run_script", killed)
    with pytest.raises(KeyboardInterrupt):
        check.main()
    report = (out / "gpu-report.md").read_text()
    tests = report.split("## gpu tests")[1].split("##")[0]
    assert "passed 2, failed 0, errors 0, skipped 1 (pytest exit 124)" in tests
    assert "## params layout against cuDNN\n\nnot reached" in report
    assert "test_settles_a_hazard[2] PASSED" in (out / "gpu-tests.log").read_text()
    summary = json.loads((out / "gpu-summary.json").read_text())
    assert summary["finished"] is False and summary["tests"]["passed"] == 2


def test_the_driver_probe_answers_without_a_gpu():
    """No NVIDIA driver on CI's machines: the probe says so instead of raising."""
    from pycudnnrnn.core import driver
    version = driver.cuda_version() if driver.found() else None
    assert driver.found() == (version is not None)
    assert version is None or version >= 10000
    # the capture mode's exchange: None without a driver, else a mode, set back as it was
    previous = driver.exchange_stream_capture_mode(driver.CAPTURE_MODE_RELAXED)
    assert (previous is None) == (version is None)
    if previous is not None:
        assert driver.exchange_stream_capture_mode(previous) == driver.CAPTURE_MODE_RELAXED


def test_only_the_ctypes_layers_import_ctypes():
    """cudnn/ binds cuDNN; jax/ mirrors XLA's FFI; core/driver.py probes the NVIDIA
    driver and core/blas.py calls the thread count setters of NumPy's BLAS. Nothing else
    needs ctypes."""
    import pathlib
    package = pathlib.Path(pycudnnrnn.__file__).parent
    users = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                   if "import ctypes" in p.read_text())
    assert all(u.startswith(("cudnn/", "jax/")) or u in ("core/blas.py", "core/driver.py")
               for u in users), users
