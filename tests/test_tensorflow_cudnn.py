"""pycudnnrnn.tensorflow on a GPU: TensorFlow's own CudnnRNNV3 kernel, fed our params.

On the CPU, a stand-in for the kernel (``fake_tf_cudnn``, with TensorFlow's quirks) takes
its place, so that our code around it is tested: forward and tape gradients against the
NumPy backend, each fix the kernel needs, the route each call takes, and the graph a
trace makes where TensorFlow sees a GPU (both implementations, for TensorFlow's
implementation selector), saved and run where pycudnnrnn cannot be imported, and
pycudnnrnn.keras's layers on the kernel.

The tests marked ``gpu("tensorflow")`` run on a real GPU that TensorFlow sees (skipped
otherwise): the kernel itself against the CPU route, eagerly, in a ``tf.function`` with
a tape inside, and under a Keras ``fit``.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")

import fake_tf_cudnn  # noqa: E402
import pycudnnrnn  # noqa: E402
import pycudnnrnn.tensorflow as ptf  # noqa: E402
from conftest import (assert_ulp_close, case_id, cotangents, make_case,  # noqa: E402
                      run_saved_model_without_pycudnnrnn)
from pycudnnrnn.tensorflow import cudnn, ops  # noqa: E402

GRID = [dict(rnn_mode=m, direction="bidirectional", time_major=True, lengths="zero",
             num_layers=2) for m in ("lstm", "gru", "rnn_tanh", "rnn_relu")]
GRID += [dict(rnn_mode=m, direction="unidirectional", time_major=False, lengths="ragged",
              num_layers=2) for m in ("lstm", "gru", "rnn_tanh", "rnn_relu")]
GRID += [dict(rnn_mode="lstm", direction="bidirectional", time_major=False, lengths=None),
         dict(rnn_mode="lstm", num_proj=3, direction="bidirectional", time_major=False,
              lengths="zero", num_layers=2),
         dict(rnn_mode="gru", input_mode="skip_input", lengths="ragged"),
         # auto_select: ours is linear_input here (input_size 2 != num_units 4); the
         # kernel's would be skip_input (input_size == num_proj)
         dict(rnn_mode="lstm", input_mode="auto_select", num_proj=2, input_size=2,
              lengths="zero")]


def _tensors(case):
    return [None if a is None else tf.constant(a)
            for a in (case.input, case.input_h, case.input_c, case.params)]


@pytest.fixture
def kernel(monkeypatch):
    """The GPU route with the stand-in kernel: TensorFlow "sees" a GPU and an eager call
    "runs" on it. Returns the calls the kernel saw."""
    monkeypatch.setattr(cudnn, "_kernel", fake_tf_cudnn.CudnnRNNV3)
    monkeypatch.setattr(cudnn, "_visible_gpus", lambda: ["GPU:0 (stand-in)"])
    monkeypatch.setattr(cudnn, "_device_type", lambda tensor: "GPU")
    fake_tf_cudnn.CALLS.clear()
    ops._kernel_function.cache_clear()  # (a cached function holds the kernel it traced)
    yield fake_tf_cudnn.CALLS
    ops._kernel_function.cache_clear()


def _rnn_and_grads(case, **overrides):
    """``ptf.rnn``'s results and the tape's gradients of a fixed linear loss."""
    lstm = case.input_c is not None
    variables = [None if a is None else tf.Variable(a) for a in _tensors(case)]
    attrs = {**case.attrs, **overrides}
    dy, dh, dc = cotangents(case.forward()[:3])
    with tf.GradientTape() as tape:
        got = ptf.rnn(*variables, case.sequence_lengths, **attrs)
        loss = tf.reduce_sum(got[0] * dy) + tf.reduce_sum(got[1] * dh)
        if lstm:
            loss += tf.reduce_sum(got[2] * dc)
    grads = tape.gradient(loss, [v for v in variables if v is not None])
    return got, grads, (dy, dh, dc if lstm else None)


@pytest.mark.parametrize("config", GRID, ids=case_id)
def test_the_kernels_forward_and_tape_gradients_are_the_numpy_backends(kernel, config):
    """Through the kernel (batch-major states, zero lengths, no lengths, auto_select,
    non-LSTM output_c all fixed around it), the op is the NumPy backend's."""
    case = make_case(**config)
    want = case.forward()
    got, grads, cotangents = _rnn_and_grads(case)
    assert kernel, "the call did not reach the kernel"
    assert {c["time_major"] for c in kernel} == {False}  # (padded I/O always on)
    assert {c["input_mode"] for c in kernel} <= {"linear_input", "skip_input"}
    for g, w in zip(got, want[:3]):
        assert_ulp_close(g.numpy(), w)
    want_grads = case.backprop(want, *cotangents)
    lstm = case.input_c is not None
    wants = [want_grads.input_backprop, want_grads.input_h_backprop] + \
        ([want_grads.input_c_backprop] if lstm else []) + [want_grads.params_backprop]
    for g, w in zip(grads, wants, strict=True):
        assert_ulp_close(g.numpy(), w, ulps=64)


def test_nan_in_padding_and_in_a_zero_length_rows_state_reaches_nothing(kernel):
    """The padding (a zero-length row's first step is padding the kernel runs) and a
    never-used state may hold NaN: outputs, the weights' gradient and the input's
    gradient in the padding (what cuDNN leaves there) come out exact."""
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="zero")
    lengths = np.asarray(case.sequence_lengths)
    x = case.input.copy()
    x[lengths[None, :] <= np.arange(case.input.shape[0])[:, None]] = np.nan
    h = case.input_h.copy()
    h[:, lengths == 0] = np.nan
    tensors = [tf.constant(a) for a in (x, h, case.input_c, case.params)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        y, hy, cy = ptf.rnn(*tensors, case.sequence_lengths, **case.attrs)
        loss = tf.reduce_sum(y) + tf.reduce_sum(cy)
    dx, _, _, dp = tape.gradient(loss, tensors)
    assert kernel
    clean = make_case("lstm", "bidirectional", num_layers=2, lengths="zero")
    assert_ulp_close(y.numpy(), clean.forward()[0])
    np.testing.assert_array_equal(np.isnan(hy.numpy()[:, lengths == 0]), True)  # as it came
    assert np.isfinite(dp.numpy()).all()
    padding = lengths[None, :] <= np.arange(case.input.shape[0])[:, None]
    np.testing.assert_array_equal(dx.numpy()[padding], 0.0)


def test_an_inference_call_still_differentiates(kernel):
    """is_training=False: TensorFlow's gradient refuses a kernel run for inference, so the
    kernel runs in training mode (dropout 0) and a tape still differentiates."""
    case = make_case("gru", num_layers=2, dropout=0.5, lengths="ragged")
    got, grads, cotangents = _rnn_and_grads(case, is_training=False)
    assert [c["is_training"] for c in kernel] == [True] and kernel[0]["dropout"] == 0.0
    plain = make_case("gru", num_layers=2, lengths="ragged")
    want = plain.forward()
    assert_ulp_close(got[0].numpy(), want[0])
    assert_ulp_close(grads[-1].numpy(), plain.backprop(want, *cotangents).params_backprop,
                     ulps=64)


def test_dropout_reaches_the_kernel_unless_its_seed_is_a_tensor(kernel, monkeypatch):
    """cuDNN draws the masks from the integer seeds; a tensor seed (cuDNN's dropout takes
    attributes alone) stays on TensorFlow's operations, with their masks."""
    case = make_case("lstm", "bidirectional", num_layers=3, lengths="zero", dropout=0.5)
    x, h, c, p = _tensors(case)
    ptf.rnn(x, h, c, p, case.sequence_lengths, seed=7, seed2=3, **case.attrs)
    assert [(k["dropout"], k["seed"], k["seed2"]) for k in kernel] == [(0.5, 7, 3)]
    kernel.clear()
    got = ptf.rnn(x, h, c, p, case.sequence_lengths, seed=tf.constant(7 << 32, tf.int64),
                  **case.attrs)
    assert not kernel
    monkeypatch.setattr(cudnn, "_visible_gpus", lambda: [])  # TensorFlow's operations
    want = ptf.rnn(x, h, c, p, case.sequence_lengths, seed=7, **case.attrs)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_the_raw_pairs_masks_and_bfloat16_stay_on_tensorflows_operations(kernel):
    """The raw pair's dropout masks live in its reserve space for backprop: cuDNN's would
    not be those. bfloat16: TensorFlow's kernel backward does not read the forward's
    reserve space in that dtype. float16 goes to the kernel."""
    case = make_case("lstm", num_layers=2, dropout=0.5, lengths="zero")
    x, h, c, p = _tensors(case)
    forward = ptf.cudnn_rnn_v3(x, h, c, p, case.sequence_lengths, seed=5, **case.attrs)
    assert not kernel
    dy, dh, dc = cotangents(forward[:3])
    raw = ptf.cudnn_rnn_backprop_v3(x, h, c, p, case.sequence_lengths, *forward[:3], dy, dh,
                                    dc, forward[3], seed=5, **case.attrs)
    assert not kernel
    with tf.GradientTape() as tape:
        tape.watch([x, h, c, p])
        y = ptf.rnn(x, h, c, p, case.sequence_lengths, seed=tf.constant(5 << 32, tf.int64),
                    **case.attrs)  # (a tensor seed: TensorFlow's operations, these masks)
        loss = sum(tf.reduce_sum(a * g) for a, g in zip(y, (dy, dh, dc)))
    for got, want in zip(raw, tape.gradient(loss, [x, h, c, p])):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    for dtype, routed in (("bfloat16", False), ("float16", True)):
        kernel.clear()
        half = make_case("gru", lengths="zero", dtype=tf.as_dtype(dtype).as_numpy_dtype)
        got = ptf.rnn(*_tensors(half), half.sequence_lengths, **half.attrs)
        assert bool(kernel) is routed, dtype
        assert got[0].dtype == tf.as_dtype(dtype)


def test_a_second_derivative_through_the_kernel_is_a_clear_error(kernel):
    """TensorFlow has no gradient of CudnnRNNBackpropV3: a gradient penalty through the
    kernel fails, and the error says why and what to do; it is never None."""
    case = make_case("lstm", num_layers=1, lengths="zero")
    x, h, c, p = _tensors(case)
    # (raised where the outer tape records the first gradient: TensorFlow builds the
    # gradient of that gradient then)
    with pytest.raises(LookupError, match="pycudnnrnn.tensorflow: no second derivative"):
        with tf.GradientTape() as outer:
            outer.watch(p)
            with tf.GradientTape() as inner:
                inner.watch(x)
                score = tf.reduce_sum(ptf.rnn(x, h, c, p, case.sequence_lengths,
                                              **case.attrs)[0])
            penalty = tf.reduce_sum(inner.gradient(score, x) ** 2)
        outer.gradient(penalty, p)


def test_nested_and_persistent_tapes_take_first_order_gradients_through_the_kernel(kernel):
    """Only a second derivative that flows through the kernel is refused. A tape that
    records another tape's gradient without differentiating it (a training tape around a
    saliency gradient), and a persistent tape asked inside its context, give the first
    order gradients: an eager call must not build the gradient of its own gradient."""
    case = make_case("lstm", num_layers=1, lengths="zero")
    x, h, c, p = _tensors(case)
    params = tf.Variable(p)
    with tf.GradientTape() as outer:  # watches the variable
        with tf.GradientTape() as inner:
            inner.watch(x)
            y = ptf.rnn(x, h, c, params, case.sequence_lengths, **case.attrs)[0]
            score = tf.reduce_sum(y)
        saliency = inner.gradient(score, x)  # logged, not differentiated
        loss = tf.reduce_sum(y ** 2)
    dp = outer.gradient(loss, params)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        score = tf.reduce_sum(ptf.rnn(x, h, c, params, case.sequence_lengths,
                                      **case.attrs)[0])
        dx = tape.gradient(score, x)
    assert kernel
    with tf.GradientTape() as want_tape:
        want = tf.reduce_sum(ptf.rnn(x, h, c, params, case.sequence_lengths,
                                     **case.attrs)[0] ** 2)
    np.testing.assert_array_equal(dx.numpy(), saliency.numpy())
    np.testing.assert_allclose(dp.numpy(), want_tape.gradient(want, params).numpy(),
                               rtol=1e-12, atol=1e-14)


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="a GPU is here")
def test_the_route_is_tensorflows_operations_without_a_gpu():
    """With no GPU visible nothing changes: no kernel, eagerly or traced."""
    case = make_case("lstm", num_layers=1)
    x, h, c, p = _tensors(case)
    op = ops._attributes("lstm", "linear_input", "unidirectional", 0.0, 0, 0, 0, True, True)
    config, _ = ops._check(op, x, h, c, p, None, {})
    routes = [ops._route(op, config, x, False, False)]
    tf.function(lambda x: routes.append(ops._route(op, config, x, False, False)) or x)(x)
    assert routes == [None, None]


def _library(concrete):
    """``{name: (attributes, node ops)}`` of a concrete function's function library."""
    return {f.signature.name: ({k: v.s.decode() for k, v in f.attr.items() if v.s},
                               {n.op for n in f.node_def})
            for f in concrete.graph.as_graph_def().library.function}


def _implementations_run(function, *args):
    """``(results, devices)``: `function`'s results, and the preferred devices of the
    implementations its run called once TensorFlow (Grappler's implementation selector)
    had optimized its graph, as RunMetadata records it."""
    from tensorflow.python.eager import context
    devices = {}
    for name, (attributes, _) in _library(function.get_concrete_function(*args)).items():
        if "api_preferred_device" in attributes:
            devices[name] = attributes["api_preferred_device"]
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        results = function(*args)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    called = {n.attr["f"].func.name.split("_specialized_for_")[0]
              for graph in metadata.function_graphs for n in graph.post_optimization_graph.node
              if n.op in ("PartitionedCall", "StatefulPartitionedCall")}
    return results, {devices[name] for name in called if name in devices}


def test_a_trace_where_tensorflow_sees_a_gpu_holds_both_implementations(monkeypatch):
    """The selector's graph: the CPU implementation called, and TensorFlow's kernel in its
    twin (same api_implements, preferred device GPU) with its gradient functions in the
    library, for Grappler to swap by placement. On the CPU the CPU one runs."""
    monkeypatch.setattr(cudnn, "_visible_gpus", lambda: ["GPU:0 (stand-in)"])
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged",
                     time_major=False)
    args = _tensors(case)

    @tf.function
    def step(x, h, c, p):
        with tf.GradientTape() as tape:
            tape.watch(p)
            y = ptf.rnn(x, h, c, p, case.sequence_lengths, **case.attrs)[0]
        return y, tape.gradient(y, p)

    concrete = step.get_concrete_function(*args)
    library = _library(concrete)
    devices, names, kinds = {}, set(), {"CPU": set(), "GPU": set()}
    for name, (attributes, ops_) in library.items():
        if "api_implements" in attributes:
            device = attributes["api_preferred_device"]
            devices[name] = device
            names.add(attributes["api_implements"])
            kinds[device] |= ops_
    assert len(names) == 1  # one pair, to swap by placement
    assert {"CudnnRNNV3", "CudnnRNNBackpropV3"} <= kinds["GPU"]  # the kernel and its gradient
    assert not {"CudnnRNNV3", "CudnnRNNBackpropV3"} & kinds["CPU"]
    called = {n.attr["f"].func.name for n in concrete.graph.as_graph_def().node
              if n.op in ("PartitionedCall", "StatefulPartitionedCall")}
    assert called and {devices.get(name) for name in called} == {"CPU"}  # the default
    (y, dp), ran = _implementations_run(step, *args)
    assert ran == {"CPU"}
    assert_ulp_close(y.numpy(), case.forward()[0])
    with tf.GradientTape() as tape:
        tape.watch(args[3])
        want = ptf.rnn(*args, case.sequence_lengths, **case.attrs)[0]
    np.testing.assert_allclose(dp.numpy(), tape.gradient(want, args[3]).numpy(), rtol=1e-10)


def _grappler_signature_problems(library):
    """What Grappler's implementation selector refuses in a function library
    (function_api_info.cc, ValidateSignatures): functions of one ``api_implements`` and
    one kind (inference, forward, backward) whose argument dtypes differ, inputs for
    inference and forward functions, outputs for inference and backward ones. One such
    pair and the selector skips the whole graph: every call runs its default."""
    groups = {}
    for f in library.function:
        attrs = {k: v.s.decode() for k, v in f.attr.items() if v.s}
        if "api_implements" not in attrs:
            continue
        kind = ("backward" if "forward_function_name" in attrs else
                "forward" if "backward_function_name" in attrs else "inference")
        groups.setdefault((attrs["api_implements"], kind), []).append(f.signature)
    problems = []
    for (name, kind), signatures in groups.items():
        assert len(signatures) == 2, (name, kind, len(signatures))  # the pair, each kind
        first, second = ([[a.type for a in getattr(s, part)] for s in signatures]
                         for part in ("input_arg", "output_arg"))
        if kind != "backward" and first[0] != first[1]:
            problems.append((kind, "inputs"))
        if kind != "forward" and second[0] != second[1]:
            problems.append((kind, "outputs"))
    return sorted({kind for _, kind in groups}), problems


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_the_selectors_pair_has_one_signature_with_dropout_too(monkeypatch, dropout):
    """Both implementations take and give the same dtypes, for the inference, forward
    and backward functions alike. With dropout the CPU one takes masks that cuDNN does
    not: their gradient must not make its backward return more than the kernel's."""
    monkeypatch.setattr(cudnn, "_visible_gpus", lambda: ["GPU:0 (stand-in)"])
    case = make_case("lstm", num_layers=3, lengths="ragged", dropout=dropout)
    args = _tensors(case)

    @tf.function
    def step(x, h, c, p):
        with tf.GradientTape() as tape:
            tape.watch([x, h, c, p])
            y, hy, cy = ptf.rnn(x, h, c, p, case.sequence_lengths, seed=3, **case.attrs)
            loss = tf.reduce_sum(y) + tf.reduce_sum(hy) + tf.reduce_sum(cy)
        return tape.gradient(loss, [x, h, c, p])

    library = step.get_concrete_function(*args).graph.as_graph_def().library
    kinds, problems = _grappler_signature_problems(library)
    assert kinds == ["backward", "forward", "inference"]
    assert problems == []


def test_a_saved_gpu_trace_runs_where_pycudnnrnn_cannot_be_imported(monkeypatch, tmp_path):
    """A SavedModel traced where TensorFlow sees a GPU holds both implementations; loaded
    on the CPU without pycudnnrnn, the CPU one runs."""
    monkeypatch.setattr(cudnn, "_visible_gpus", lambda: ["GPU:0 (stand-in)"])
    case = make_case("gru", "bidirectional", num_layers=2, lengths="zero", dtype=np.float32)

    class Model(tf.Module):
        def __init__(self):
            self.params = tf.Variable(case.params)

        @tf.function(input_signature=[tf.TensorSpec([None, None, 3], tf.float32),
                                      tf.TensorSpec([None], tf.int32)])
        def __call__(self, x, lengths):
            h = tf.zeros([4, tf.shape(x)[1], 4])
            return ptf.rnn(x, h, None, self.params, lengths, rnn_mode="gru",
                           direction="bidirectional")[0]

    model = Model()
    assert any("CudnnRNNV3" in kinds for _, kinds in _library(
        model.__call__.get_concrete_function()).values())
    tf.saved_model.save(model, str(tmp_path / "model"))
    assert b"CudnnRNNV3" in (tmp_path / "model" / "saved_model.pb").read_bytes()  # the twin
    got = run_saved_model_without_pycudnnrnn(
        tmp_path, case.input, np.asarray(case.sequence_lengths, np.int32), cpu_only=True)
    want = pycudnnrnn.forward(case.input, np.zeros((4, 3, 4), np.float32), None,
                              case.params, case.sequence_lengths, rnn_mode="gru",
                              direction="bidirectional").output
    assert_ulp_close(got, want, ulps=64)


def test_keras_layers_take_the_kernel_where_it_runs():
    """pycudnnrnn.keras on TensorFlow where the kernel can run: the layers take the
    params buffer and the kernel (eagerly, with a mask with a hole) and give what
    TensorFlow's operations give, also after a fit (a process of its own: Keras's
    backend is fixed at its import)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "tensorflow_keras_kernel_script.py")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "same" in done.stdout


# ------------------------------------------------------------------ on a real GPU

gpu = pytest.mark.gpu("tensorflow")

#: float32 on cuDNN with TF32 off against the CPU route: a few ulps of float32 through a
#: few steps of matrix products.
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture
def strict_float32():
    """TF32 off while a gpu test compares float32 with the CPU route."""
    was = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(was)


def _on_cpu(function, *args):
    """`function`'s results on the CPU route (TensorFlow's operations), as NumPy."""
    with tf.device("/CPU:0"):
        return [np.asarray(r) for r in function(*args)]


def _gpu_case():
    return make_case("lstm", "bidirectional", num_layers=2, num_proj=3, lengths="zero",
                     time_major=False, dtype=np.float32, num_units=8, T=5, B=4)


@gpu
def test_gpu_eager_call_and_gradients_equal_the_cpu_route(strict_float32):
    case = _gpu_case()

    def run(x, h, c, p):
        with tf.GradientTape() as tape:
            tape.watch([x, h, c, p])
            y, hy, cy = ptf.rnn(x, h, c, p, case.sequence_lengths, **case.attrs)
            loss = tf.reduce_sum(y ** 2) + tf.reduce_sum(hy) + tf.reduce_sum(cy)
        return [y, hy, cy, *tape.gradient(loss, [x, h, c, p])]

    args = _tensors(case)
    ops._kernel_function.cache_clear()
    got = run(*args)
    assert ops._kernel_function.cache_info().currsize == 1, "the kernel did not run"
    for g, w in zip(got, _on_cpu(run, *args), strict=True):
        np.testing.assert_allclose(g.numpy(), w, **TOLERANCE)


@gpu
def test_gpu_tf_function_with_a_tape_inside_runs_the_kernel_as_the_cpu_route(strict_float32):
    """Inside a tf.function with the tape inside, TensorFlow's implementation selector
    swaps in the kernel; the results are the CPU route's."""
    case = _gpu_case()

    def body(x, h, c, p):
        with tf.GradientTape() as tape:
            tape.watch(p)
            y = ptf.rnn(x, h, c, p, case.sequence_lengths, **case.attrs)[0]
            loss = tf.reduce_sum(y ** 2)
        return y, tape.gradient(loss, p)

    args = _tensors(case)
    got, ran = _implementations_run(tf.function(body), *args)
    assert ran == {"GPU"}, "the implementation selector did not swap in the kernel"
    for g, w in zip(got, _on_cpu(body, *args), strict=True):
        np.testing.assert_allclose(g.numpy(), w, **TOLERANCE)


@gpu
def test_gpu_keras_fit_equals_the_cpu_route(strict_float32):
    """pycudnnrnn.keras's layers train the same steps on the GPU (the kernel) as on the
    CPU (TensorFlow's operations), with a mask."""
    import keras
    if keras.backend.backend() != "tensorflow":
        pytest.skip("Keras's backend is not TensorFlow")
    import pycudnnrnn.keras as pk
    rng = np.random.default_rng(0)
    lengths = np.array([6, 4, 0, 2, 5, 6, 1, 3])
    x = rng.standard_normal((8, 6, 3)).astype(np.float32)
    x *= (np.arange(6)[None, :] < lengths[:, None])[..., None]
    y = rng.standard_normal((8, 1)).astype(np.float32)

    def fit():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6, 3)), keras.layers.Masking(0.0),
                                  pk.Bidirectional(pk.LSTM(8, return_sequences=True)),
                                  pk.GRU(4), keras.layers.Dense(1)])
        # jit_compile=False: XLA compiles TensorFlow's operations, and no selector swaps
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=False)
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        return [np.asarray(w) for w in model.get_weights()]

    got = fit()
    with tf.device("/CPU:0"):
        want = fit()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, **TOLERANCE)
