"""pycudnnrnn.tensorflow: the op inside TensorFlow, against the NumPy backend.

Forward and gradients (tape, raw pair) equal ``pycudnnrnn.forward`` / ``backprop`` over a
grid of configurations; ``tf.function`` with unknown batch and time, XLA, second order,
dropout, errors, the functional API on tf tensors, a SavedModel run in a process that
cannot import pycudnnrnn, and ``MirroredStrategy`` over two CPU devices.
"""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")

import pycudnnrnn  # noqa: E402
import pycudnnrnn.tensorflow as ptf  # noqa: E402
from conftest import (assert_ulp_close, case_id, cotangents, make_case,  # noqa: E402
                      run_saved_model_without_pycudnnrnn)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

GRID = [dict(rnn_mode=m, direction=d, time_major=tm, lengths=lengths, num_layers=2)
        for m in ("lstm", "gru", "rnn_tanh", "rnn_relu")
        for d in ("unidirectional", "bidirectional")
        for tm, lengths in ((True, "zero"), (False, "ragged"), (True, "full"))]
GRID += [dict(rnn_mode="lstm", num_proj=3, direction="bidirectional", lengths="zero",
              num_layers=2),
         dict(rnn_mode="gru", input_mode="skip_input", lengths="ragged"),
         dict(rnn_mode="lstm", input_mode="auto_select", input_size=4, lengths="zero")]


def _tensors(case):
    return [None if a is None else tf.constant(a)
            for a in (case.input, case.input_h, case.input_c, case.params)]


@pytest.mark.parametrize("config", GRID, ids=case_id)
def test_forward_and_tape_gradients_are_the_numpy_backends(config):
    _assert_forward_and_tape_gradients_are_the_numpy_backends(make_case(**config))


def _assert_forward_and_tape_gradients_are_the_numpy_backends(case):
    want = case.forward()
    dy, dh, dc = cotangents(want[:3])
    want_grads = case.backprop(want, dy, dh, dc if case.input_c is not None else None)
    variables = [None if a is None else tf.Variable(a) for a in _tensors(case)]
    with tf.GradientTape() as tape:
        got = ptf.rnn(*variables, case.sequence_lengths, **case.attrs)
        loss = tf.reduce_sum(got[0] * dy) + tf.reduce_sum(got[1] * dh)
        if case.input_c is not None:
            loss += tf.reduce_sum(got[2] * dc)
    for g, w in zip(got, want[:3]):
        assert isinstance(g, tf.Tensor)
        assert_ulp_close(g.numpy(), w)
    sources = [v for v in variables if v is not None]
    grads = tape.gradient(loss, sources)
    names = ["input_backprop", "input_h_backprop"] + \
        (["input_c_backprop"] if case.input_c is not None else []) + ["params_backprop"]
    wants = [want_grads.input_backprop, want_grads.input_h_backprop] + \
        ([want_grads.input_c_backprop] if case.input_c is not None else []) + \
        [want_grads.params_backprop]
    order = [0, 1, 2, 3] if case.input_c is not None else [0, 1, 2]
    for name, k, w in zip(names, order, wants):
        assert grads[k] is not None, name
        assert_ulp_close(grads[k].numpy(), w, ulps=64, err_msg=name)


#: Sequences long enough to run as 5 chunked loops each (``graph._states``): gradients
#: cross from chunk to chunk, through ragged rows, a row of length 0 and a projection.
#: Ragged rows drop out of later chunks, down to none in the last chunk of the fourth.
LONG = [dict(rnn_mode="lstm", direction="bidirectional", num_proj=3, num_layers=2,
             lengths=[40, 0, 17]),
        dict(rnn_mode="gru", time_major=False, lengths=[33, 40, 8]),
        dict(rnn_mode="rnn_relu", input_mode="skip_input", lengths="full"),
        dict(rnn_mode="rnn_tanh", input_mode="skip_input", direction="bidirectional",
             lengths=[12, 25, 0])]


@pytest.mark.parametrize("config", LONG, ids=case_id)
def test_long_sequences_run_as_chunked_loops_with_the_same_results(config):
    case = make_case(**config, T=40)
    _assert_forward_and_tape_gradients_are_the_numpy_backends(case)
    tensors = _tensors(case)
    traced = tf.function(lambda *a: ptf.rnn(*a, case.sequence_lengths, **case.attrs))
    graph = traced.get_concrete_function(*tensors).graph
    loops = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
    directions = 2 if case.attrs["direction"] == "bidirectional" else 1
    assert len(loops) == 5 * directions * config.get("num_layers", 1)


def test_each_chunk_runs_the_rows_still_running_at_its_first_step(monkeypatch):
    """A ragged batch runs its rows longest first, and each chunked loop only the rows
    still running at its first step: a row that has ended costs nothing there."""
    from pycudnnrnn.tensorflow import graph
    rows = {"step": [], "step_backward": []}
    for name, seen in rows.items():
        method = getattr(graph._Cell, name)

        def spy(self, *args, _method=method, _seen=seen):
            _seen.append(int(args[-2].shape[0]))  # the state h, or its gradient
            return _method(self, *args)
        monkeypatch.setattr(graph._Cell, name, spy)
    case = make_case("lstm", lengths=[40, 0, 17, 25], T=40, B=4)
    tf.config.run_functions_eagerly(True)  # (concrete shapes, step by step)
    try:
        _assert_forward_and_tape_gradients_are_the_numpy_backends(case)
    finally:
        tf.config.run_functions_eagerly(False)
    # 5 chunks of 8 steps; running at steps 0, 8, 16, 24, 32: 3, 3, 3, 2 and 1 rows
    want = [3] * 24 + [2] * 8 + [1] * 8
    assert rows["step"][:40] == want
    assert rows["step_backward"][:40] == want[::-1]


def test_xla_compiles_long_sequences_as_one_loop_each():
    """TensorFlow 2.21's XLA fails on three alike loops in one function (tensorflow#122886):
    under ``jit_compile`` each direction runs as one loop, not as chunks."""
    case = make_case(**LONG[0], T=40)
    tensors = _tensors(case)

    def gradients(*tensors):
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            y = ptf.rnn(*tensors, case.sequence_lengths, **case.attrs)[0]
            loss = tf.reduce_sum(y * y)
        return [y] + tape.gradient(loss, list(tensors))

    compiled = tf.function(gradients, jit_compile=True)(*tensors)
    for got, want in zip(compiled, tf.function(gradients)(*tensors)):
        assert_ulp_close(got.numpy(), want.numpy(), ulps=64)


@pytest.mark.parametrize("config", GRID[:6] + GRID[-3:], ids=case_id)
def test_the_raw_pair_is_the_ops(config):
    """cudnn_rnn_v3 / cudnn_rnn_backprop_v3 with tf.raw_ops' arguments and results."""
    case = make_case(**config)
    want = case.forward()
    dy, dh, dc = cotangents(want[:3])
    lstm = case.input_c is not None
    want_grads = case.backprop(want, dy, dh, dc if lstm else None)
    x, h, c, p = _tensors(case)
    c = c if lstm else tf.zeros((0,), tf.float64)  # TensorFlow's op takes a dummy
    output, output_h, output_c, reserve, host = ptf.cudnn_rnn_v3(
        input=x, input_h=h, input_c=c, params=p, sequence_lengths=case.sequence_lengths,
        **case.attrs)
    assert reserve.dtype == tf.uint8 and host.dtype == tf.int8
    for g, w in zip((output, output_h, output_c), want[:3]):
        assert_ulp_close(g.numpy(), w)
    got = ptf.cudnn_rnn_backprop_v3(
        input=x, input_h=h, input_c=c, params=p, sequence_lengths=case.sequence_lengths,
        output=output, output_h=output_h, output_c=output_c, output_backprop=dy,
        output_h_backprop=dh, output_c_backprop=dc if lstm else np.zeros((0,)),
        reserve_space=reserve, host_reserved=host, **case.attrs)
    for g, w in zip(got, want_grads):
        assert_ulp_close(g.numpy(), w, ulps=64)


def test_backprop_refuses_an_inference_or_foreign_reserve():
    case = make_case("lstm", num_layers=2, dropout=0.5)
    x, h, c, p = _tensors(case)
    args = dict(input=x, input_h=h, input_c=c, params=p, **case.attrs)
    results = ptf.cudnn_rnn_v3(**args, is_training=False)
    grads = dict(output_backprop=results[0], output_h_backprop=results[1],
                 output_c_backprop=results[2])
    with pytest.raises(ValueError, match="reserve_space: empty.*is_training=False"):
        ptf.cudnn_rnn_backprop_v3(**args, sequence_lengths=None, output=None, output_h=None,
                                  output_c=None, **grads, reserve_space=results[3])
    other = ptf.cudnn_rnn_v3(**{**args, "dropout": 0.25})[3]  # another call, the same size
    with pytest.raises(tf.errors.InvalidArgumentError, match="reserve_space: made by another"):
        ptf.cudnn_rnn_backprop_v3(**args, sequence_lengths=None, output=None, output_h=None,
                                  output_c=None, **grads, reserve_space=other)
    traced = tf.function(lambda reserve: ptf.cudnn_rnn_backprop_v3(
        **args, sequence_lengths=None, output=None, output_h=None, output_c=None, **grads,
        reserve_space=reserve))  # in a graph: checked before any mask is read
    with pytest.raises(tf.errors.InvalidArgumentError, match="reserve_space: made by another"):
        traced(other)
    with pytest.raises(ValueError, match="reserve_space: expected .* bytes"):
        ptf.cudnn_rnn_backprop_v3(**args, sequence_lengths=None, output=None, output_h=None,
                                  output_c=None, **grads,
                                  reserve_space=ptf.cudnn_rnn_v3(**args)[3][:-1])


def test_dropout_is_seeded_and_backprop_uses_the_forwards_masks():
    case = make_case("lstm", "bidirectional", num_layers=3, dropout=0.5, lengths="zero")
    x, h, c, p = _tensors(case)
    attrs = dict(case.attrs, dropout=0.5)
    first = ptf.rnn(x, h, c, p, case.sequence_lengths, seed=7, **attrs)
    again = ptf.rnn(x, h, c, p, case.sequence_lengths, seed=7, **attrs)
    other = ptf.rnn(x, h, c, p, case.sequence_lengths, seed=8, **attrs)
    plain = ptf.rnn(x, h, c, p, case.sequence_lengths, **dict(attrs, dropout=0.0))
    inference = ptf.rnn(x, h, c, p, case.sequence_lengths, seed=7, is_training=False, **attrs)
    np.testing.assert_array_equal(first[0], again[0])
    assert not np.allclose(first[0], other[0]) and not np.allclose(first[0], plain[0])
    np.testing.assert_array_equal(inference[0], plain[0])
    # a seed tensor: the same masks as the same int, no new trace
    seeded = ptf.rnn(x, h, c, p, case.sequence_lengths, seed=tf.constant(7 << 32, tf.int64),
                     **attrs)
    np.testing.assert_array_equal(seeded[0], first[0])
    # the raw pair's backprop equals the tape's gradient of the same seeded forward
    dy, dh, dc = cotangents(first)
    forward = ptf.cudnn_rnn_v3(x, h, c, p, case.sequence_lengths, seed=7, **attrs)
    np.testing.assert_array_equal(forward[0], first[0])
    raw = ptf.cudnn_rnn_backprop_v3(x, h, c, p, case.sequence_lengths, *forward[:3], dy, dh,
                                    dc, forward[3], seed=7, **attrs)
    with tf.GradientTape() as tape:
        tape.watch([x, h, c, p])
        y = ptf.rnn(x, h, c, p, case.sequence_lengths, seed=7, **attrs)
        loss = sum(tf.reduce_sum(a * g) for a, g in zip(y, (dy, dh, dc)))
    for got, want in zip(raw, tape.gradient(loss, [x, h, c, p])):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_tf_function_with_unknown_batch_and_time_and_xla():
    case = make_case("gru", "bidirectional", num_layers=2, time_major=False, lengths=None)
    x, h, _, p = _tensors(case)
    spec = lambda *shape: tf.TensorSpec(shape, tf.float64)
    traced = tf.function(lambda x, h, p, n: ptf.rnn(x, h, None, p, n, **case.attrs),
                         input_signature=[spec(None, None, 3), spec(None, 4, 4), spec(None),
                                          tf.TensorSpec([None], tf.int32)])
    compiled = tf.function(lambda x, h, p: ptf.rnn(x, h, None, p, [3, 0, 2], **case.attrs),
                           jit_compile=True)
    for B, T in ((3, 4), (5, 2)):
        sub = make_case("gru", "bidirectional", num_layers=2, time_major=False, B=B, T=T,
                        lengths=[T, 0, 1, 2, T][:B])
        want = sub.forward()
        got = traced(*(tf.constant(a) for a in (sub.input, sub.input_h, sub.params)),
                     tf.constant(sub.sequence_lengths, tf.int32))
        for g, w in zip(got[:2], want[:2]):
            assert_ulp_close(g.numpy(), w)
    sub = make_case("gru", "bidirectional", num_layers=2, time_major=False, lengths=[3, 0, 2])
    for g, w in zip(compiled(*(tf.constant(a) for a in (sub.input, sub.input_h, sub.params))),
                    sub.forward()[:2]):
        assert_ulp_close(g.numpy(), w, ulps=64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sequence_lengths"):
        traced(x, h, p, tf.constant([1, 9, 2], tf.int32))
    # lengths known when the sizes are not: checked when the graph runs, not against T=1
    known = tf.function(lambda x, h, p: ptf.rnn(x, h, None, p, [4, 0, 2], **case.attrs),
                        input_signature=[spec(None, None, 3), spec(None, 4, 4), spec(None)])
    sub = make_case("gru", "bidirectional", num_layers=2, time_major=False, lengths=[4, 0, 2])
    got = known(*(tf.constant(a) for a in (sub.input, sub.input_h, sub.params)))
    for g, w in zip(got[:2], sub.forward()[:2]):
        assert_ulp_close(g.numpy(), w)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sequence_lengths"):
        known(x[:, :3], h, p)  # T = 3 < 4


def test_a_traced_call_adds_its_operations_to_the_callers_graph():
    """Inside a tf.function the op is the caller's own operations, not a call of a nested
    function (a call per run and per gradient: a quarter of a small Keras step); an
    eager call runs one graph per static part, traced once."""
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged")
    args = _tensors(case)
    lengths = tf.constant(case.sequence_lengths)

    @tf.function
    def step(x, h, c, p):
        with tf.GradientTape() as tape:
            tape.watch(p)
            y = ptf.rnn(x, h, c, p, lengths, **case.attrs)[0]
        return y, tape.gradient(y, p)
    graph = step.get_concrete_function(*args).graph
    kinds = {op.type for op in graph.get_operations()}
    assert not kinds & {"PartitionedCall", "StatefulPartitionedCall"}, kinds
    assert kinds & {"While", "StatelessWhile"}
    y, _ = step(*args)
    assert_ulp_close(y.numpy(), case.forward()[0])
    from pycudnnrnn.tensorflow import ops
    ops._function.cache_clear()
    for _ in range(2):
        assert_ulp_close(ptf.rnn(*args, lengths, **case.attrs)[0].numpy(), case.forward()[0])
    assert ops._function.cache_info().currsize == 1


def test_second_order_equals_differences_of_the_first():
    """A gradient penalty's gradient: d/dp of |dL/dx|², against central differences of
    the NumPy backend's first-order gradient."""
    case = make_case("lstm", "bidirectional", num_layers=2, num_proj=2, lengths="zero")
    x, h, c, p = _tensors(case)
    dy = cotangents(case.forward()[:1])[0]
    v = np.random.default_rng(3).standard_normal(case.params.shape)

    def penalty_numpy(params):
        fwd = pycudnnrnn.forward(case.input, case.input_h, case.input_c, params,
                                 case.sequence_lengths, **case.attrs)
        g = pycudnnrnn.backprop(case.input, case.input_h, case.input_c, params,
                                case.sequence_lengths, *fwd[:3], dy, np.zeros_like(fwd[1]),
                                np.zeros_like(fwd[2]), fwd[3], **case.attrs)
        return float((g.input_backprop ** 2).sum())

    with tf.GradientTape() as outer:
        outer.watch(p)
        with tf.GradientTape() as inner:
            inner.watch(x)
            loss = tf.reduce_sum(ptf.rnn(x, h, c, p, case.sequence_lengths,
                                         **case.attrs)[0] * dy)
        penalty = tf.reduce_sum(inner.gradient(loss, x) ** 2)
    got = float(tf.reduce_sum(outer.gradient(penalty, p) * v))
    eps = 1e-6
    want = (penalty_numpy(case.params + eps * v) - penalty_numpy(case.params - eps * v)) / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_dtypes_are_the_numpy_backends(dtype):
    np_dtype = tf.as_dtype(dtype).as_numpy_dtype
    case = make_case("lstm", "bidirectional", num_layers=2, num_proj=2, lengths="zero",
                     dtype=np_dtype)
    got = ptf.rnn(*_tensors(case), case.sequence_lengths, **case.attrs)
    for g, w in zip(got, case.forward()[:3]):
        assert g.dtype == tf.as_dtype(dtype)
        np.testing.assert_allclose(g.numpy().astype(np.float64), w.astype(np.float64),
                                   rtol=0, atol=2 * float(tf.as_dtype(dtype).as_numpy_dtype(
                                       np.finfo(np.float32).eps) if dtype == "float32" else
                                       {"float16": 1e-3, "bfloat16": 8e-3}[dtype]))


def test_zero_length_rows_and_nan_padding_reach_no_gradient():
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="zero")
    x = case.input.copy()
    x[2:, 1] = np.nan  # padding of the row of length 0 and beyond
    h = case.input_h.copy()
    h[:, 1] = np.nan  # the state of a row that never runs
    tensors = [tf.constant(a) for a in (x, h, case.input_c, case.params)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        y, hy, cy = ptf.rnn(*tensors, case.sequence_lengths, **case.attrs)
        loss = tf.reduce_sum(tf.where(tf.math.is_nan(y), tf.zeros_like(y), y)) + \
            tf.reduce_sum(cy)
    assert np.isfinite(tape.gradient(loss, tensors[3]).numpy()).all()
    assert (y.numpy()[:, 1] == 0).all()
    np.testing.assert_array_equal(np.isnan(hy.numpy()[:, 1]), True)  # given back as it came


def test_a_relu_row_run_past_its_end_cannot_turn_gradients_nan():
    """Every row runs every step: past a row's end a relu state may grow to inf, and
    ``0 · inf`` must not reach the weights' gradients."""
    case = make_case("rnn_relu", input_mode="skip_input", num_units=1, T=40, B=2,
                     lengths=[1, 40])
    params = np.full_like(case.params, 1e10)  # h ← relu(x + 1e10 (h + 2)): inf by step 31
    x = case.input.copy()
    x[:, 1] = -1e12  # the full row stays at 0
    case = dataclasses.replace(case, input=x, params=params)
    _assert_forward_and_tape_gradients_are_the_numpy_backends(case)


def test_a_relu_row_run_past_its_end_has_finite_second_derivatives():
    """A second derivative differentiates the forward loop itself, steps past a row's
    end included: the same as with those steps cut off."""
    attrs = dict(rnn_mode="rnn_relu", input_mode="skip_input")
    p = tf.constant(np.full(pycudnnrnn.params_size(num_layers=1, num_units=1, input_size=1,
                                                   **attrs), 10.0, np.float32))
    # relu(x + 10 (h + 2)): past float32's max some 38 steps past a row's end
    x = tf.constant(np.random.default_rng(0).standard_normal((48, 2, 1)), tf.float32)
    h = tf.zeros((1, 2, 1))

    def penalty_gradient(x):
        with tf.GradientTape() as outer:
            outer.watch(p)
            with tf.GradientTape() as inner:
                inner.watch(x)
                loss = tf.reduce_sum(ptf.rnn(x, h, None, p, [1, 2], **attrs)[0])
            penalty = tf.reduce_sum(inner.gradient(loss, x) ** 2)
        return outer.gradient(penalty, p).numpy()

    got = penalty_gradient(x)
    assert np.isfinite(got).all()
    assert_ulp_close(got, penalty_gradient(x[:2]))


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_ragged_rows_select_nothing_step_by_step(mode):
    """A row's final state is picked out after the loop, not kept step by step: no loop,
    forward or back, selects."""
    case = make_case(mode, "bidirectional", lengths="ragged")

    x, h, c, p = _tensors(case)

    def step(x, h, p):
        with tf.GradientTape() as tape:
            tape.watch([x, h, p])
            results = ptf.rnn(x, h, c, p, case.sequence_lengths, **case.attrs)
            loss = sum(tf.reduce_sum(r) for r in results)
        return tape.gradient(loss, [x, h, p])

    graph = tf.function(step).get_concrete_function(x, h, p).graph.as_graph_def()
    functions = {f.signature.name: f for f in graph.library.function}
    nodes = [*graph.node, *(node for f in graph.library.function for node in f.node_def)]
    bodies = {node.attr["body"].func.name for node in nodes
              if node.op in ("While", "StatelessWhile")}
    assert len(bodies) == 4  # forward and back, each direction
    for body in bodies:
        ops = {node.op for node in functions[body].node_def}
        assert not ops & {"Select", "SelectV2"}, body


def test_bad_input_is_named_at_trace_time():
    case = make_case("lstm", num_layers=1)
    x, h, c, p = _tensors(case)
    with pytest.raises(ValueError, match="rnn_mode"):
        ptf.rnn(x, h, c, p, rnn_mode="lsmt")
    with pytest.raises(ValueError, match="params: expected"):
        ptf.rnn(x, h, c, p[:-1])
    with pytest.raises(TypeError, match="input_h: expected dtype float64"):
        ptf.rnn(x, tf.cast(h, tf.float32), c, p)
    with pytest.raises(ValueError, match="sequence_lengths: expected values in"):
        ptf.rnn(x, h, c, p, [1, 9, 2])

    @tf.function(input_signature=[tf.TensorSpec([None, None, None], tf.float64)])
    def unknown_features(x):
        return ptf.rnn(x, h, c, p)
    with pytest.raises(ValueError, match="input: dimension 2 must be known"):
        unknown_features.get_concrete_function()


def test_the_functional_api_gives_tf_tensors_and_refuses_what_it_cannot_record():
    case = make_case("gru", num_layers=1)
    x, h, _, p = _tensors(case)
    result = pycudnnrnn.forward(x, h, None, p, rnn_mode="gru")
    assert isinstance(result.output, tf.Tensor)
    assert_ulp_close(result.output.numpy(), case.forward()[0])
    variable = tf.Variable(p)
    with tf.GradientTape():
        with pytest.raises(TypeError, match="params: .*GradientTape.*pycudnnrnn.tensorflow"):
            pycudnnrnn.forward(x, h, None, variable, rnn_mode="gru")
    with pytest.raises(TypeError, match="input: .*symbolic.*pycudnnrnn.tensorflow"):
        tf.function(lambda x: pycudnnrnn.forward(x, h, None, p, rnn_mode="gru").output)(x)


def test_a_saved_model_runs_where_pycudnnrnn_cannot_be_imported(tmp_path):
    """What TensorFlow Serving runs: TensorFlow's own operations, no Python callback."""
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", dtype=np.float32)

    class Model(tf.Module):
        def __init__(self):
            self.params = tf.Variable(case.params)

        @tf.function(input_signature=[tf.TensorSpec([None, None, 3], tf.float32),
                                      tf.TensorSpec([None], tf.int32)])
        def __call__(self, x, lengths):
            B = tf.shape(x)[1]
            h = tf.zeros([4, B, 4])
            return ptf.rnn(x, h, h, self.params, lengths, direction="bidirectional")[0]

    tf.saved_model.save(Model(), str(tmp_path / "model"))
    got = run_saved_model_without_pycudnnrnn(
        tmp_path, case.input, np.asarray(case.sequence_lengths, np.int32))
    want = pycudnnrnn.forward(case.input, np.zeros((4, 3, 4), np.float32),
                              np.zeros((4, 3, 4), np.float32), case.params,
                              case.sequence_lengths, direction="bidirectional").output
    assert_ulp_close(got, want, ulps=64)


def test_a_loaded_model_gives_the_gradients_of_the_saved_one(tmp_path):
    """A SavedModel is differentiable once loaded (fine-tuning it): with respect to its
    input and its variables, as the module was before saving."""
    case = make_case("gru", num_layers=1, lengths="ragged", dtype=np.float32)
    x = tf.constant(case.input)

    class Model(tf.Module):
        def __init__(self):
            self.params = tf.Variable(case.params)

        @tf.function(input_signature=[tf.TensorSpec(case.input.shape, tf.float32)])
        def __call__(self, x):
            h = tf.zeros(case.input_h.shape)
            return ptf.rnn(x, h, None, self.params, case.sequence_lengths, rnn_mode="gru")[0]

    def gradients(model):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(model(x) ** 2)
        return [g.numpy() for g in tape.gradient(loss, [x, model.params])]

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "model"))
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    for got, want in zip(gradients(loaded), gradients(model), strict=True):
        assert_ulp_close(got, want, ulps=64)


def test_mirrored_strategy_trains_as_one_device():
    """A Keras model with our layer under MirroredStrategy over two logical CPUs equals
    the same steps on one device (a process of its own: the devices are set at start)."""
    script = os.path.join(HERE, "tensorflow_mirrored_script.py")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "same" in done.stdout


def test_autograph_calls_the_op_as_it_is(monkeypatch):
    """A tf.function's AutoGraph converts what it calls by reading its source again; an
    edited file made it parse other lines (a TypeError from the wrong function). The op
    holds no Python control flow on tensors: AutoGraph leaves it alone."""
    from tensorflow.python.autograph.pyct import inspect_utils
    real = inspect_utils.getimmediatesource

    def other_source(obj):
        if getattr(obj, "__module__", "").startswith("pycudnnrnn"):
            return "def f(*args, **kwargs):\n    raise AssertionError('converted')\n"
        return real(obj)
    monkeypatch.setattr(inspect_utils, "getimmediatesource", other_source)
    case = make_case("gru", num_layers=2, lengths="zero")
    x, h, _, p = _tensors(case)
    traced = tf.function(lambda x: ptf.rnn(x, h, None, p, case.sequence_lengths,
                                           **case.attrs)[0])
    assert_ulp_close(traced(x).numpy(), case.forward()[0])
    raw = tf.function(lambda x: ptf.cudnn_rnn_v3(x, h, tf.zeros((0,), tf.float64), p,
                                                 **case.attrs)[0])
    assert_ulp_close(raw(x).numpy(), make_case("gru", num_layers=2, lengths=None).forward()[0])
