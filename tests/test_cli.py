"""The command line through its real entry points (subprocesses)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from pycudnnrnn.tools import selfcheck


def _run(*args, env=None, entry="module"):
    if entry == "script":
        script = shutil.which("pycudnnrnn", path=os.path.dirname(sys.executable))
        command = [script, *args]
    else:
        command = [sys.executable, "-m", "pycudnnrnn", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("entry", ["module", "script"])
def test_info_prints_what_a_bug_report_needs(entry):
    proc = _run("info", entry=entry)
    assert proc.returncode == 0, proc.stderr
    for field in ("pycudnnrnn", "python", "numpy", "cupy", "cudnn", "cudnn library", "gpus",
                  "torch", "jax", "flax", "optax", "orbax", "keras",
                  "backend for NumPy arrays", "backend for CUDA arrays"):
        assert any(line.startswith(field + " ") for line in proc.stdout.splitlines()), field
    assert "9." in proc.stdout  # the cuDNN version from the wheel


def test_check_passes_on_a_good_configuration():
    proc = _run("check", "--backend", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "d/dparams vs finite differences" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "6 passed, 0 failed"


@pytest.mark.parametrize("options", [
    ["--mode", "gru", "--dtype", "float32", "--batch-major"],
    ["--mode", "rnn_relu", "--direction", "unidirectional", "--layers", "3", "--lengths", "4,4"],
    ["--num-proj", "3", "--input-mode", "skip_input", "--input-size", "6", "--dtype", "float16"],
])
def test_check_other_configurations(options):
    proc = _run("check", "--backend", "cpu", *options)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 failed" in proc.stdout


def test_check_fails_on_a_corrupted_gradient():
    proc = _run("check", "--backend", "cpu", env={selfcheck.CORRUPT_ENV: "1.01"})
    assert proc.returncode == 1
    assert "d/dparams vs finite differences" in proc.stdout and "FAIL" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "5 passed, 1 failed"


@pytest.mark.parametrize("args,message", [
    (["check", "--layers", "0"], "argument --layers: expected a positive integer, got 0"),
    (["check", "--mode", "lstmm"], "argument --mode: invalid choice: 'lstmm'"),
    (["check", "--lengths", "3,x"], "argument --lengths: expected comma-separated integers"),
    (["check", "--lengths", "3,9", "--max-time", "4"], "--lengths: expected values in [0, 4]"),
    (["check", "--mode", "gru", "--num-proj", "2"], "num_proj: a projection needs rnn_mode='lstm'"),
    (["bench", "--seq-lengths", ""], "argument --seq-lengths: expected at least one integer"),
    (["bench", "--dtype", "int8"], "argument --dtype: invalid choice"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "the following arguments are required"),
])
def test_bad_options_are_usage_errors(args, message):
    proc = _run(*args)
    assert proc.returncode == 2
    assert "usage: pycudnnrnn" in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_gpu_backend_without_a_gpu_is_a_usage_error():
    from pycudnnrnn.tools.environment import gpu_status
    if gpu_status()[0]:
        pytest.skip("this machine has a GPU")
    proc = _run("check", "--backend", "gpu")
    assert proc.returncode == 2 and "--backend gpu: " in proc.stderr


def test_bench_writes_json_and_png(tmp_path):
    json_path, png_path = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = _run("bench", "--backend", "cpu", "--seq-lengths", "4,8", "--input-size", "8",
                "--hidden-size", "16", "--batch", "4", "--repeat", "3", "--warmup", "1",
                "--json", str(json_path), "--plot", str(png_path), "--progress", "always")
    assert proc.returncode == 0, proc.stderr
    written = json.loads(json_path.read_text())
    results = written["results"]
    # One row per length and side, the op's and torch.nn's (torch is in the test environment).
    assert [(r["seq_length"], r["side"]) for r in results] == [
        (4, "op"), (4, "torch"), (8, "op"), (8, "torch")]
    for r in results:
        assert r["device"] == "cpu" and r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0
        for key in ("fwd_ms", "fwd_bwd_ms"):
            assert r[f"{key}_min"] <= r[key] <= r[f"{key}_max"], key
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png_path.stat().st_size > 5000
    # table and progress: 2 rounds of 2 sides, each side timing 2 lengths
    assert "configuration" in proc.stdout and "[8/8]" in proc.stderr
    assert proc.stdout.splitlines()[0].count("[min-max]") == 2  # the spread of every figure


def test_bench_json_uses_the_command_lines_names(tmp_path):
    json_path = tmp_path / "bench.json"
    proc = _run("bench", "--backend", "cpu", "--seq-lengths", "3", "--input-size", "4",
                "--hidden-size", "5", "--batch", "2", "--repeat", "1", "--warmup", "0",
                "--mode", "gru", "--layers", "1", "--direction", "bidirectional", "--ragged",
                "--dtype", "float64", "--no-torch", "--json", str(json_path))
    assert proc.returncode == 0, proc.stderr
    row = json.loads(json_path.read_text())["results"][0]
    assert {k: row[k] for k in ("mode", "direction", "layers", "seq_length", "batch",
                                "input_size", "hidden_size", "dtype", "ragged")} == dict(
        mode="gru", direction="bidirectional", layers=1, seq_length=3, batch=2, input_size=4,
        hidden_size=5, dtype="float64", ragged=True)
    assert row["side"] == "op" and row["label"] == "pycudnnrnn, NumPy backend"
    assert not {"bidirectional", "rnn_mode", "num_layers", "max_time", "batch_size"} & set(row)


def test_bench_labels_every_side_by_what_it_is(tmp_path):
    pytest.importorskip("torch")
    json_path = tmp_path / "bench.json"
    proc = _run("bench", "--backend", "cpu", "--seq-lengths", "3", "--input-size", "4",
                "--hidden-size", "5", "--batch", "2", "--repeat", "1", "--warmup", "0",
                "--sides", "op,drop-in,torch", "--json", str(json_path))
    assert proc.returncode == 0, proc.stderr
    labels = ["pycudnnrnn, NumPy backend", "pycudnnrnn.torch.LSTM", "torch.nn.LSTM"]
    rows = json.loads(json_path.read_text())["results"]
    assert [(r["side"], r["label"]) for r in rows] == list(zip(["op", "drop-in", "torch"], labels))
    table = proc.stdout.splitlines()
    assert [next(i for i, line in enumerate(table) if label in line) for label in labels] == [1, 2, 3]
    assert "forward (cpu)" not in proc.stdout + proc.stderr


def test_bench_compares_the_drop_in_with_torch_nn(tmp_path):
    pytest.importorskip("torch")
    json_path = tmp_path / "bench.json"
    proc = _run("bench", "--backend", "cpu", "--seq-lengths", "3", "--input-size", "4",
                "--hidden-size", "5", "--batch", "2", "--repeat", "1", "--warmup", "0",
                "--mode", "rnn_tanh", "--sides", "drop-in,torch", "--json", str(json_path))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(json_path.read_text())["results"]
    assert [r["label"] for r in rows] == ["pycudnnrnn.torch.RNN", "torch.nn.RNN"]
    assert "pycudnnrnn, NumPy backend" not in proc.stdout


def test_bench_progress_goes_to_stderr_when_output_is_redirected():
    # _run captures both streams: neither is a terminal.
    proc = _run("bench", "--backend", "cpu", "--seq-lengths", "2,3", "--input-size", "3",
                "--hidden-size", "4", "--batch", "2", "--repeat", "1", "--warmup", "0",
                "--no-torch")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] for line in lines] == ["[1/2", "[2/2"], proc.stderr
    assert all("pycudnnrnn, NumPy backend: fwd " in line for line in lines), lines
    assert "[1/2]" not in proc.stdout  # the table alone on stdout
    quiet = _run("bench", "--backend", "cpu", "--seq-lengths", "2", "--input-size", "3",
                 "--hidden-size", "4", "--batch", "2", "--repeat", "1", "--warmup", "0",
                 "--no-torch", "--progress", "never")
    assert quiet.returncode == 0 and "[1/1]" not in quiet.stderr


def test_bench_default_run_is_small():
    """The default run took 2 min 16 s on 2 cores: its problems and runs are now few and
    small (counted, not timed)."""
    from pycudnnrnn.tools import cli
    args = cli._parser().parse_args(["bench"])
    sides = 2  # the op and torch.nn
    runs = sides * 2 * args.rounds * (args.repeat + args.warmup)  # forward, forward+backward
    # multiply-adds of one forward, over the default lengths (4 gate matrices per step)
    work = sum(args.layers * T * args.batch * 4 * args.hidden_size
               * (args.input_size + args.hidden_size) for T in args.seq_lengths)
    assert runs * work <= 1.5e10, (runs, work)  # 1.1e10; it was 48 runs of 3.8e9: 1.8e11
    assert args.direction == "unidirectional" and args.sides is None  # default: op,torch


def _tiny_bench(tmp_path, repeat, *options):
    """A CPU bench of a tiny default-attribute problem: (process, its JSON)."""
    json_path = tmp_path / "bench.json"
    proc = _run("bench", "--backend", "cpu", "--seq-lengths", "2", "--input-size", "3",
                "--hidden-size", "4", "--batch", "2", "--repeat", str(repeat), "--warmup", "0",
                "--no-torch", "--json", str(json_path), *options)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(json_path.read_text())


def test_bench_json_carries_the_environment(tmp_path):
    environment = _tiny_bench(tmp_path, repeat=2)[1]["environment"]
    from pycudnnrnn.tools.environment import collect
    assert set(environment) == set(collect())
    assert environment["numpy"] == __import__("numpy").__version__


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_bench_runs_every_dtype_it_offers(tmp_path, dtype):
    """bfloat16 was offered but crashed as "an unexpected error" (no itemsize for it)."""
    proc, report = _tiny_bench(tmp_path, 1, "--dtype", dtype)
    assert report["results"][0]["dtype"] == dtype and f" {dtype}" in proc.stdout


def test_bench_defaults_to_the_librarys_unidirectional(tmp_path):
    proc, report = _tiny_bench(tmp_path, repeat=1)
    assert report["results"][0]["direction"] == "unidirectional"
    assert " uni " in proc.stdout


def test_bench_progress_shows_the_whole_label():
    proc = _run("bench", "--backend", "cpu", "--mode", "rnn_tanh", "--layers", "12",
                "--seq-lengths", "4", "--input-size", "8", "--hidden-size", "16", "--batch", "4",
                "--dtype", "float64", "--ragged", "--repeat", "1", "--warmup", "0", "--no-torch",
                "--progress", "always")
    assert proc.returncode == 0, proc.stderr
    label = "cpu rnn_tanh 12L uni T4 B4 8->16 float64 ragged, pycudnnrnn, NumPy backend"
    assert len(label) > 40 and label in proc.stderr


def test_info_gives_frameworks_driver_cuda_blas_and_threads():
    proc = _run("info", env={"OMP_NUM_THREADS": "3"})
    assert proc.returncode == 0, proc.stderr
    info = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("  ")
        info[key.strip()] = value.strip()
    torch = pytest.importorskip("torch")
    assert info["torch"].startswith(torch.__version__)
    from importlib import metadata
    try:
        assert info["jax"].startswith(f"jax {metadata.version('jax')}")
    except metadata.PackageNotFoundError:
        assert info["jax"] == "not installed"
    for field in ("nvidia driver", "cuda driver api", "cuda runtime (cupy)", "cpus"):
        assert info.get(field), field
    assert "OMP_NUM_THREADS=3" in info["thread settings"]
    # Every OpenBLAS, OpenMP and MKL variable set, and the BLAS threads in use.
    proc = _run("info", env={"OPENBLAS_CORETYPE": "Haswell", "MKL_DYNAMIC": "FALSE",
                             "OMP_WAIT_POLICY": "passive", "OPENBLAS_NUM_THREADS": "1"})
    lines = {key.strip(): value.strip() for key, _, value in
             (line.partition("  ") for line in proc.stdout.splitlines())}
    for setting in ("OPENBLAS_CORETYPE=Haswell", "MKL_DYNAMIC=FALSE", "OMP_WAIT_POLICY=passive"):
        assert setting in lines["thread settings"], lines["thread settings"]
    # threadpoolctl sets KMP_DUPLICATE_LIB_OK when imported: reported only if it was set
    # before (here: if this test process imported threadpoolctl, its children inherit it).
    assert ("KMP_DUPLICATE_LIB_OK" in lines["thread settings"]) == (
        "KMP_DUPLICATE_LIB_OK" in os.environ)
    assert "openblas" not in info["blas threads"] or ": 1 thread," in lines["blas threads"]
    blas = __import__("numpy").show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    assert info["blas"].startswith(blas)


def test_info_gives_the_frameworks_versions_and_keras_backend(tmp_path):
    from importlib import metadata
    from pycudnnrnn.tools import environment
    env = {"KERAS_HOME": str(tmp_path)}  # no keras.json
    lines = {}
    for backend in ("jax", ""):
        proc = _run("info", env={**env, "KERAS_BACKEND": backend})
        lines[backend] = {key.strip(): value.strip() for key, _, value in
                          (line.partition("  ") for line in proc.stdout.splitlines())}
    info = lines["jax"]
    for name, distribution in (("flax", "flax"), ("optax", "optax"),
                               ("orbax", "orbax-checkpoint"), ("keras", "keras")):
        try:
            assert info[name].startswith(metadata.version(distribution)), info[name]
        except metadata.PackageNotFoundError:
            assert info[name].startswith("not installed (`pip install '.["), info[name]
    if not info["keras"].startswith("not installed"):
        assert info["keras"].endswith("(backend jax, from KERAS_BACKEND); pycudnnrnn.keras "
                                      "runs the op on this backend (it does on jax, torch and "
                                      "tensorflow)"), info["keras"]
        default = lines[""]["keras"]  # Keras's own default, TensorFlow
        assert "(backend tensorflow, from Keras's default" in default, default
        import importlib.util
        if importlib.util.find_spec("tensorflow") is None:
            assert "set KERAS_BACKEND=jax, torch or tensorflow and install that extra" in \
                default, default
    for distribution in ("tensorflow", "tensorflow-cpu", None):
        if distribution is None:
            assert info["tensorflow"].startswith("not installed (`pip install"), info["tensorflow"]
            break
        try:
            assert info["tensorflow"].startswith(metadata.version(distribution)), \
                info["tensorflow"]
            break
        except metadata.PackageNotFoundError:
            continue
    assert set(environment.collect()) >= {"flax", "optax", "orbax", "keras", "tensorflow"}


def test_info_gives_the_gpu_extras_advice_once(monkeypatch):
    """Without CuPy (and cuDNN), the advice to install the GPU extra came three times."""
    from pycudnnrnn.cudnn import loader
    from pycudnnrnn.errors import CudnnUnavailableError
    from pycudnnrnn.tools import environment

    def no_cudnn():
        raise CudnnUnavailableError("could not load cuDNN 9; tried:\n  a (no such file)\n  "
                                    "libcudnn.so.9 (not found)\nTo fix: " + loader.INSTALL_HINT)

    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` fails
    monkeypatch.setattr(loader, "load", no_cudnn)
    info = environment.collect()
    text = "\n".join(info.values())
    assert text.count("'.[cuda12]'") == 1, text
    assert info["cupy"].startswith("not installed: CUDA arrays need the GPU extra")
    assert info["gpus"] == "unknown (no CuPy)"
    assert info["backend for CUDA arrays"] == "unavailable: CuPy is not installed (see above)"
    assert info["cudnn library"] == "none found (the GPU extra on the cupy line brings it)"


@pytest.mark.parametrize("command", ["info", "check", "bench"])
def test_every_command_has_help(command):
    proc = _run(command, "--help")
    assert proc.returncode == 0 and f"usage: pycudnnrnn {command}" in proc.stdout


@pytest.mark.parametrize("command", ["info", "check", "bench"])
def test_an_unknown_option_shows_its_commands_usage(command):
    proc = _run(command, "--no-such-option")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"usage: pycudnnrnn {command} ")
    assert proc.stderr.strip().splitlines()[-1] == (
        f"pycudnnrnn {command}: error: unrecognized arguments: --no-such-option")
    # before the command, it is the top level's
    proc = _run("--no-such-option", command)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: pycudnnrnn [-h]")


def test_bench_help_says_how_to_compare_the_drop_in_with_nn_lstm():
    proc = _run("bench", "--help")
    assert "--sides drop-in,torch" in proc.stdout
    for side in ("op ", "drop-in ", "torch "):
        assert f"\n  {side}" in proc.stdout, side


@pytest.mark.parametrize("args, named", [
    (["bench", "--sides", "numpy"], "argument --sides: expected a comma-separated list of op, "
                                    "drop-in, torch, got 'numpy'"),
    (["bench", "--sides", ","], "argument --sides: expected a comma-separated list"),
    (["bench", "--sides", "op", "--no-torch"], "--no-torch: not with --sides"),
])
def test_bad_sides_are_usage_errors(args, named):
    proc = _run(*args)
    assert proc.returncode == 2 and named in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert proc.stderr.startswith("usage: pycudnnrnn bench ")


# --- without a GPU: say so plainly ------------------------------------------------------

class _NoDriverRuntime:
    """CuPy's runtime as it answers on a machine without an NVIDIA driver."""

    @staticmethod
    def getDeviceCount():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient "
                           "for CUDA runtime version")


def _fake_cupy_without_driver(monkeypatch, libcuda_loads):
    import ctypes
    import types
    from pycudnnrnn.core import gpu
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=_NoDriverRuntime())
    monkeypatch.setitem(sys.modules, "cupy", fake)
    real_cdll = ctypes.CDLL

    def cdll(name, *args, **kwargs):
        if name == "libcuda.so.1":
            if libcuda_loads:
                return object()
            raise OSError("libcuda.so.1: cannot open shared object file")
        return real_cdll(name, *args, **kwargs)

    from pycudnnrnn.core import driver
    monkeypatch.setattr(driver.ctypes, "CDLL", cdll)
    return gpu


def test_no_driver_is_named_as_such_with_cudas_reason_after_it(monkeypatch):
    from pycudnnrnn.errors import CudnnUnavailableError
    backend = _fake_cupy_without_driver(monkeypatch, libcuda_loads=False)
    with pytest.raises(CudnnUnavailableError) as info:
        backend.cupy()
    message = str(info.value)
    assert message.startswith("no NVIDIA GPU or driver was found")
    assert message.index("no NVIDIA GPU") < message.index("CUDA driver version is insufficient")


def test_a_driver_that_cannot_run_cuda_is_not_called_missing(monkeypatch):
    from pycudnnrnn.errors import CudnnUnavailableError
    backend = _fake_cupy_without_driver(monkeypatch, libcuda_loads=True)
    with pytest.raises(CudnnUnavailableError, match="driver found") as info:
        backend.cupy()
    assert "no NVIDIA GPU or driver" not in str(info.value)
    assert "CUDA driver version is insufficient" in str(info.value)


def _cupy_but_no_driver_here():
    import ctypes
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False  # then the reason given is the missing CuPy (tested above)
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


no_driver_here = pytest.mark.skipif(not _cupy_but_no_driver_here(),
                                    reason="needs CuPy installed on a machine without an "
                                           "NVIDIA driver")


@no_driver_here
def test_info_says_no_gpu_or_driver_was_found():
    proc = _run("info")
    lines = {line.split("  ")[0]: line for line in proc.stdout.splitlines()}
    for field in ("gpus", "backend for CUDA arrays"):
        assert "no NVIDIA GPU or driver was found" in lines[field], lines[field]


@no_driver_here
def test_check_on_the_gpu_says_no_gpu_or_driver_was_found():
    proc = _run("check", "--backend", "gpu")
    assert proc.returncode == 2
    assert "--backend gpu: no NVIDIA GPU or driver was found" in proc.stderr, proc.stderr


@no_driver_here
def test_gpu_test_skip_reason_says_no_gpu_or_driver_was_found():
    from conftest import _gpu_reason
    assert "no NVIDIA GPU or driver was found" in _gpu_reason()


# --- every bad command line: exit 2 at once, one line naming the option, no traceback -----

@pytest.mark.parametrize("args,named", [
    (["bench", "--seq-lengths", "0"], "argument --seq-lengths: expected positive integers"),
    (["bench", "--seq-lengths=-5"], "argument --seq-lengths: expected positive integers"),
    (["bench", "--json", "/nonexistent/x.json"], "--json /nonexistent/x.json: the folder"),
    (["bench", "--plot", "/nonexistent/x.png"], "--plot /nonexistent/x.png: the folder"),
    (["check", "--hidden-size", "100000"], "--hidden-size 100000: too large"),
    (["check", "--lengths", "1,2", "--max-time", "99999999"], "--max-time 99999999: too large"),
    (["bench", "--hidden-size", "100000", "--input-size", "100000"],
     "--input-size 100000 --hidden-size 100000: too large"),
    (["bench", "--batch", "1000000000"], "--batch 1000000000: too large"),
    (["check", "--layers", "100000"], "--layers 100000: too large"),
    (["bench", "--layers", "100000"], "--layers 100000: too large"),
    (["check", "--seed=-1"], "argument --seed: expected a non-negative integer, got -1"),
    (["bench", "--warmup=-1"], "argument --warmup: expected a non-negative integer, got -1"),
    (["check", "--num-proj=-1"], "argument --num-proj: expected a non-negative integer"),
    (["check", "--lengths=-1,3"], "argument --lengths: expected non-negative integers"),
    # A value that starts with "-" was read as another option: "expected one argument".
    (["check", "--lengths", "-1,2"], "argument --lengths: expected non-negative integers, got -1,2"),
    (["bench", "--seq-lengths", "-4"], "argument --seq-lengths: expected positive integers, got -4"),
    (["bench", "--json", ""], "--json: expected a file path, got ''"),  # ran, wrote nothing, 0
    (["bench", "--plot", ""], "--plot: expected a file path, got ''"),
])
def test_bad_command_lines_exit_2_at_once_naming_the_option(args, named):
    # The timeout is the bound: without the up-front checks these ran a whole benchmark
    # first, or for minutes, or did not end.
    proc = subprocess.run([sys.executable, "-m", "pycudnnrnn", *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pycudnnrnn {args[0]}: error: ") and named in last, last
    assert proc.stdout == ""  # refused before any work


def test_too_large_names_the_bytes_needed():
    proc = _run("check", "--layers", "100000")
    last = proc.stderr.strip().splitlines()[-1]
    assert " bytes), more than the 1.0 GiB that check allows" in last


def test_size_estimate_is_instant_for_many_layers_and_grows_linearly():
    from pycudnnrnn.tools import cli
    args = cli._parser().parse_args(["check", "--layers", "1000000"])
    one = cli.estimated_bytes(args, max_time=7, batch=4, itemsize=8, params_copies=3)
    args.layers = 2000000
    two = cli.estimated_bytes(args, max_time=7, batch=4, itemsize=8, params_copies=3)
    assert 1.99 < two / one < 2.01


def test_size_estimate_covers_what_forward_really_allocates():
    import numpy as np
    import pycudnnrnn
    from pycudnnrnn.tools import cli
    args = cli._parser().parse_args(["bench", "--layers", "3", "--input-size", "5",
                                     "--hidden-size", "6", "--direction", "bidirectional"])
    T, B = 7, 4
    n = pycudnnrnn.params_size(num_layers=3, num_units=6, input_size=5, direction="bidirectional")
    x, h, c = np.zeros((T, B, 5)), np.zeros((6, B, 6)), np.zeros((6, B, 6))
    y, hy, cy, reserve = pycudnnrnn.forward(x, h, c, np.zeros(n), direction="bidirectional")
    allocated = sum(a.nbytes for a in (x, h, c, y, hy, cy, reserve)) + 8 * n
    assert cli.estimated_bytes(args, max_time=T, batch=B, itemsize=8, params_copies=0) > allocated


def test_a_library_memory_error_is_a_usage_error(monkeypatch, capsys):
    from pycudnnrnn.tools import cli, selfcheck

    def refuse(cfg):
        raise MemoryError("Unable to allocate 3.8 GiB for an array")

    monkeypatch.setattr(selfcheck, "run", refuse)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["check", "--backend", "cpu"])
    assert exit_info.value.code == 2
    assert "not enough memory for these sizes: Unable to allocate 3.8 GiB" in capsys.readouterr().err


def test_an_unexpected_error_is_not_mistaken_for_a_failed_check(monkeypatch, capsys):
    from pycudnnrnn.tools import cli, selfcheck

    def broken(cfg):
        raise KeyError("a bug")

    monkeypatch.setattr(selfcheck, "run", broken)
    assert cli.main(["check", "--backend", "cpu"]) == cli.EXIT_INTERNAL != 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "unexpected error" in err


# --- installing: NumPy alone; the GPU packages are extras, named when they are missing ----

def test_the_core_needs_no_gpu_package_and_the_gpu_packages_are_extras():
    import tomllib
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    # NumPy, ml_dtypes for its bfloat16 dtype, threadpoolctl to find NumPy's BLAS (pure
    # Python): no GPU package.
    assert sorted(d.split(">")[0] for d in project["dependencies"]) == [
        "ml_dtypes", "numpy", "threadpoolctl"]
    extras = project["optional-dependencies"]
    names = lambda extra: sorted(d.split(">")[0] for d in extras[extra])
    assert names("cuda12") == ["cupy-cuda12x", "nvidia-cudnn-cu12"]
    assert names("cuda13") == ["cupy-cuda13x", "nvidia-cudnn-cu13"]
    assert not [d for d in extras["test"] if d.startswith("cupy")]  # CI has no GPU


def test_a_cuda_array_without_cupy_names_the_extra_to_install(monkeypatch):
    import pycudnnrnn
    from pycudnnrnn.errors import CudnnUnavailableError

    class CudaArray:
        shape, ndim, dtype = (4, 3, 3), 3, "float32"

        def __dlpack_device__(self):
            return (2, 0)

    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    a = CudaArray()
    with pytest.raises(CudnnUnavailableError) as info:
        pycudnnrnn.forward(a, a, a, a)
    assert "pip install '.[cuda12]'" in str(info.value)
    assert "pip install '.[cuda13]'" in str(info.value)


def test_missing_cudnn_names_the_extra_to_install():
    from pycudnnrnn.cudnn import loader
    assert "pip install '.[cuda12]'" in loader.INSTALL_HINT


def test_make_installs_the_cuda_extra_only_where_an_nvidia_gpu_answers(tmp_path):
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fake_smi = tmp_path / "nvidia-smi"

    def installs(target, smi_status):
        fake_smi.write_text(f"#!/bin/sh\nexit {smi_status}\n")
        fake_smi.chmod(0o755)
        path = f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"
        proc = subprocess.run([make, "-n", "-B", "VENV=venv", target], cwd=root,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PATH": path})
        assert proc.returncode == 0, proc.stderr
        return [line.split(" -e ")[1] for line in proc.stdout.splitlines() if " -e " in line]

    assert installs("demo", 1) == ["'.'"]  # no GPU: NumPy alone
    assert installs("demo", 0) == ["'.[cuda12]'"]
    assert installs("test", 1) == ["'.'", "'.[test]'"]
    assert installs("test", 0) == ["'.[cuda12]'", "'.[test]'"]


def test_info_reads_the_driver_version_and_lists_gpus(tmp_path, monkeypatch):
    """The GPU-side fields, from what the driver and CuPy report (no GPU needed)."""
    import types
    from pycudnnrnn.core import gpu
    from pycudnnrnn.tools import environment
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  "
                       "Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Sep 25 2025\n")
    assert environment._nvidia_driver(str(version)) == "580.95.05"
    assert environment._nvidia_driver(str(tmp_path / "none")).startswith("none found")
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        getDeviceProperties=lambda i: {"name": b"NVIDIA H200", "totalGlobalMem": 150 * 2**30,
                                       "major": 9, "minor": 0})
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))
    monkeypatch.setattr(gpu, "cupy", lambda: fake)
    assert environment._gpus() == "NVIDIA H200 (150 GiB, sm_90)"


def test_info_without_cudnn_says_how_to_get_it(monkeypatch):
    import types
    from pycudnnrnn.tools import environment
    from pycudnnrnn.cudnn import loader
    # CuPy there (without CuPy, the cupy line gives the advice: tested above)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__="14.0.0"))
    monkeypatch.setattr(loader, "nvidia_wheel_roots", lambda: [])
    monkeypatch.setattr(loader, "SONAME", "libcudnn_no_such_library.so.9")
    monkeypatch.delenv(loader.ENV_VAR, raising=False)
    loader.load.cache_clear()
    try:
        info = environment.collect()
    finally:
        loader.load.cache_clear()
    assert info["cudnn"] == "not loadable"
    assert info["cudnn library"].startswith("none found. To fix: install the GPU extra")


def test_cli_sizes_runs_against_the_librarys_memory_figure(monkeypatch, capsys):
    """The CLI read MemAvailable itself: a cgroup's smaller room let a run start that the
    library then refused."""
    from pycudnnrnn.core import memory
    from pycudnnrnn.tools import cli
    monkeypatch.setattr(memory, "available_bytes", lambda: (10_000, "the cgroup limit x"))
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--repeat", "1"])
    assert info.value.code == 2
    assert "too large" in capsys.readouterr().err


def test_version_and_one_default_direction_and_defaults_in_help():
    from pycudnnrnn import __version__
    proc = _run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"pycudnnrnn {__version__}"
    from pycudnnrnn.tools import cli
    for command in ("check", "bench"):
        args = cli._parser().parse_args([command])
        assert args.direction == "unidirectional"  # check was bidirectional, bench not
        help_text = " ".join(_run(command, "--help").stdout.split())
        assert f"default: {args.dtype}" in help_text
    assert "default: linear_input" in " ".join(_run("check", "--help").stdout.split())


def test_an_output_that_cannot_be_written_is_one_line_after_the_run(tmp_path):
    """bench --json /dev/full finished, then exited 3 with a traceback."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    proc = _run("bench", "--backend", "cpu", "--seq-lengths", "2", "--layers", "1",
                "--input-size", "2", "--hidden-size", "2", "--batch", "2", "--repeat", "1",
                "--warmup", "0", "--no-torch", "--json", "/dev/full")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "pycudnnrnn bench: error: --json /dev/full: could not write it: No space left on device")
    assert "lstm 1L uni T2 B2" in proc.stdout  # the figures were printed first


def test_the_size_check_asks_for_at_least_what_the_library_will():
    """--layers 300000 passed the CLI's size check, then failed inside the run: the
    CLI's figure left out the per-layer Python objects the library counts."""
    from pycudnnrnn.core import checks
    from pycudnnrnn.cpu import rnn as cpu_rnn
    from pycudnnrnn.tools import cli
    args = cli._parser().parse_args(["bench", "--layers", "300000", "--input-size", "1",
                                     "--hidden-size", "1", "--batch", "1"])
    problem = checks.make_problem(max_time=64, batch_size=1, sequence_lengths=None,
                                  dtype="float32", time_major=True, is_training=True,
                                  rnn_mode="lstm", num_layers=300000, num_units=1,
                                  input_size=1, input_mode="linear_input",
                                  direction="unidirectional", num_proj=0, dropout=0.0,
                                  seed=0, seed2=0)
    library = cpu_rnn.forward_nbytes(problem) + cpu_rnn.backprop_nbytes(problem)
    assert cli.estimated_bytes(args, max_time=64, batch=1, itemsize=4, params_copies=0) >= \
        library


def test_a_memory_error_without_a_message_still_says_why(monkeypatch, capsys):
    from pycudnnrnn.tools import cli, selfcheck

    def fail(config):
        raise MemoryError()
    monkeypatch.setattr(selfcheck, "run", fail)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["check", "--backend", "cpu"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        "not enough memory for these sizes: an allocation failed")


@pytest.mark.parametrize("option, value", [("--layers", "999999999999999999999999999999"),
                                           ("--hidden-size", str(2 ** 40))])
def test_absurd_sizes_are_usage_errors_at_once(option, value):
    """--layers 10**30 ran for minutes (the memory estimate listed every layer's entries);
    a size beyond cuDNN's 32-bit ints is refused before any work, naming it."""
    proc = subprocess.run([sys.executable, "-m", "pycudnnrnn", "check", option, value],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "expected an int in [1, 2147483647]" in proc.stderr
    assert len(proc.stderr.strip().splitlines()[-1]) < 300


def test_bench_times_each_side_in_a_process_of_its_own_taking_turns():
    """In one process PyTorch's idle OpenMP threads slow NumPy's BLAS: the figures lied.
    The command's own process imports no side's library, and the sides alternate."""
    pytest.importorskip("torch")
    script = textwrap.dedent("""
        import sys
        from pycudnnrnn.tools import bench
        case = bench.Case(num_layers=1, bidirectional=False, max_time=2, batch_size=2,
                          input_size=3, hidden_size=4)
        rows = bench.run([case], sides=["op", "torch"], repeat=2, warmup=0, rounds=3)
        print("torch" in sys.modules, [r["side"] for r in rows])
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "['op',", "'torch']"], proc.stdout
    turns = ["op" if "NumPy backend" in line else "torch" for line in proc.stderr.splitlines()
             if line.startswith("[")]
    assert turns == ["op", "torch", "torch", "op", "op", "torch"], proc.stderr
