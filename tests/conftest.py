"""Shared builders: a random, reproducible RNN problem for any configuration."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import pycudnnrnn

LENGTHS = {"full": None, "ragged": [2, 4, 1], "zero": [4, 0, 3]}

# Two computations of one function by different paths (the cuDNN backend on the stand-in
# leaves zero-length rows out and runs a smaller batch; another batch size or memory layout
# takes another BLAS kernel) round differently, and how differently depends on the machine's
# BLAS kernel. They are compared within this many units in the last place.
ULPS = 16


def assert_ulp_close(got, want, ulps=ULPS, err_msg=""):
    """Same dtype and shape, values within `ulps` units in the last place of the dtype at
    the scale of `want` (its largest magnitude), NaN where `want` has NaN.

    The scale is the array's, not each element's: a matrix product rounds at the size of
    its terms, so a small element computed from large ones can differ by more than its own
    ulp. A layout, gate or mask mistake is off by far more.
    """
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), err_msg
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    np.testing.assert_array_equal(np.isnan(g), nan, err_msg=f"{err_msg}: NaN positions")
    scale = float(np.abs(w[~nan]).max(initial=0.0))
    ulp = float(ml_dtypes.finfo(want.dtype).eps) * 2.0 ** np.floor(np.log2(scale)) if scale else 0.0
    np.testing.assert_allclose(g[~nan], w[~nan], rtol=0, atol=ulps * ulp, err_msg=err_msg)


@dataclasses.dataclass
class Case:
    """Arguments of one forward call, time-major copies kept for the reference."""

    attrs: dict                # rnn_mode, input_mode, direction, num_proj, time_major, ...
    input: np.ndarray
    input_h: np.ndarray
    input_c: np.ndarray | None
    params: np.ndarray
    sequence_lengths: list | None
    size: dict                 # num_layers, num_units, input_size

    @property
    def layout_attrs(self):
        keys = ("rnn_mode", "input_mode", "direction", "num_proj")
        return {**{k: self.attrs[k] for k in keys}, **self.size}

    def forward(self, **overrides):
        args = dict(input=self.input, input_h=self.input_h, input_c=self.input_c,
                    params=self.params)
        attrs = dict(self.attrs)
        for key, value in overrides.items():
            (args if key in args else attrs)[key] = value
        return pycudnnrnn.forward(args["input"], args["input_h"], args["input_c"],
                                  args["params"], self.sequence_lengths, **attrs)

    def backprop(self, fwd, dy, dh, dc, **overrides):
        attrs = {k: v for k, v in {**self.attrs, **overrides}.items() if k != "is_training"}
        y, hy, cy, reserve = fwd
        return pycudnnrnn.backprop(self.input, self.input_h, self.input_c, self.params,
                                   self.sequence_lengths, y, hy, cy, dy, dh, dc, reserve, **attrs)

    def time_major_input(self):
        return self.input if self.attrs["time_major"] else self.input.swapaxes(0, 1)

    def time_major_state(self, s):
        return s if self.attrs["time_major"] else s.swapaxes(0, 1)


def on_thread(work):
    """What `work()` returns, run on a thread of its own (with CuPy's per-thread default
    stream on, that thread's own stream); its error is raised here."""
    import threading
    out = {}

    def run():
        try:
            out["value"] = work()
        except BaseException as error:  # noqa: BLE001 (raised on the test's thread)
            out["error"] = error
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def make_case(rnn_mode="lstm", direction="unidirectional", input_mode="linear_input",
              num_proj=0, num_layers=1, lengths="full", time_major=True, T=4, B=3,
              input_size=3, num_units=4, dtype=np.float64, seed=0, dropout=0.0,
              scale=0.5) -> Case:
    """A random problem; `lengths` is a key of LENGTHS or an explicit list."""
    rng = np.random.default_rng(seed)
    if input_mode == "skip_input":
        input_size = num_units
    D = 2 if direction == "bidirectional" else 1
    P = num_proj or num_units
    size = dict(num_layers=num_layers, num_units=num_units, input_size=input_size)
    attrs = dict(rnn_mode=rnn_mode, input_mode=input_mode, direction=direction,
                 num_proj=num_proj, time_major=time_major, dropout=dropout)
    n = pycudnnrnn.params_size(rnn_mode=rnn_mode, input_mode=input_mode, direction=direction,
                               num_proj=num_proj, **size)
    x = rng.standard_normal((T, B, input_size))
    h = rng.standard_normal((num_layers * D, B, P))
    c = rng.standard_normal((num_layers * D, B, num_units)) if rnn_mode == "lstm" else None
    params = rng.uniform(-scale, scale, n)
    if not time_major:
        x, h = x.swapaxes(0, 1).copy(), h.swapaxes(0, 1).copy()
        c = None if c is None else c.swapaxes(0, 1).copy()
    if isinstance(lengths, str):
        lengths = LENGTHS[lengths]
    if lengths is not None:
        lengths = [min(n, T) for n in lengths][:B] + [T] * max(0, B - len(lengths))
    cast = lambda a: None if a is None else a.astype(dtype)
    return Case(attrs, cast(x), cast(h), cast(c), cast(params), lengths, size)


@pytest.fixture
def fake_gpu(monkeypatch):
    """The stand-in GPU of fake_cuda; no plan built on it outlives the test."""
    import fake_cuda
    from pycudnnrnn import plan
    yield fake_cuda.install(monkeypatch)
    plan.clear_caches()


@pytest.fixture
def strict_gpu(fake_gpu):
    """The stand-in GPU in its strict mode: a device sync runs the streams newest first."""
    import fake_cuda
    fake_cuda.STRICT[0] = True
    yield fake_gpu
    fake_cuda.STRICT[0] = False


@pytest.fixture
def per_thread_gpu(fake_gpu):
    """The stand-in GPU with CuPy's per-thread default stream on (as
    ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``): each thread's default stream is its own,
    and every thread's has pointer 2."""
    import fake_cuda
    fake_cuda.PER_THREAD_DEFAULT_STREAM[0] = True
    yield fake_gpu
    fake_cuda.synchronize_all()  # every thread's stream has run before it goes off
    fake_cuda.PER_THREAD_DEFAULT_STREAM[0] = False


@pytest.fixture
def case_factory():
    return make_case


def benchmark_script(name):
    """A script of benchmarks/ as a module."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STEADY = ("host_to_device", "device_to_host", "sync")


class Device:
    """Moves arrays to and from one GPU, real or the stand-in of fake_cuda."""

    def __init__(self, kind, monkeypatch):
        import fake_cuda
        from pycudnnrnn import plan
        self.kind = kind
        if kind == "stand-in":
            fake_cuda.install(monkeypatch)
            self.array_type = fake_cuda.FakeDeviceArray
            self.get = fake_cuda.to_host  # after the current stream's work, as cupy.asnumpy
        else:
            import cupy
            self.array_type, self.get = cupy.ndarray, cupy.asnumpy
            plan.clear_caches()

    def put(self, a):
        """`a` on the device; bfloat16 moves as its bits (no host-side bfloat16 cast)."""
        if self.kind == "stand-in":
            import fake_cuda
            return fake_cuda._device(a)
        import cupy
        if a.dtype.name == "bfloat16":
            return cupy.asarray(a.view(np.uint16)).view(a.dtype)
        return cupy.asarray(a)

    def counts(self):
        """Host↔device copies and syncs since the last reset (stand-in only)."""
        import fake_cuda
        return {k: fake_cuda.COUNTS[k] for k in STEADY} if self.kind == "stand-in" else None


@pytest.fixture(params=["stand-in", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request, monkeypatch):
    """A GPU: the stand-in (always) and a real one (``gpu``: skipped without one)."""
    from pycudnnrnn import plan
    yield Device(request.param, monkeypatch)
    plan.clear_caches()


def _gpu_reason():
    """Why GPU tests cannot run here, or None when they can."""
    from pycudnnrnn.tools.environment import gpu_status
    usable, detail = gpu_status()  # no CuPy, no driver, no device, no cuDNN: says which
    return None if usable else f"no usable GPU with cuDNN 9: {detail}"


def _tensorflow_gpu_reason():
    """Why ``gpu("tensorflow")`` tests cannot run here (TensorFlow sees no GPU), or None."""
    try:
        import tensorflow as tf
    except ImportError:
        return "no TensorFlow"
    return None if tf.config.list_physical_devices("GPU") else "TensorFlow sees no GPU"


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    # gpu("tensorflow"): TensorFlow's own cuDNN kernel, which needs no CuPy
    tensorflow = [item for item in gpu_items
                  if item.get_closest_marker("gpu").args == ("tensorflow",)]
    reasons = {"cupy": None, "tensorflow": None}
    for item in gpu_items:
        kind = "tensorflow" if item in tensorflow else "cupy"
        if reasons[kind] is None:
            reasons[kind] = (_tensorflow_gpu_reason() if kind == "tensorflow"
                             else _gpu_reason()) or ""
        if reasons[kind]:
            item.add_marker(pytest.mark.skip(reason=reasons[kind]))

