"""pycudnnrnn.keras against Keras's own layers, on whichever backend KERAS_BACKEND names.

Keras fixes its backend at import, so ``tests/test_keras.py`` runs this file under
pytest once per backend, each in its own process (``KERAS_BACKEND=jax``, ``torch`` or
``tensorflow``).
Run it directly the same way::

    KERAS_BACKEND=jax python -m pytest -q tests/keras_cases.py

Every comparison copies Keras's weights into ours with ``set_weights`` and checks, with a
tolerance (the two compute in different orders), the outputs, the final states and the
gradients with respect to the inputs and every weight; and that the op ran (or, for a
configuration that falls back, that it did not).
"""

import os
import re

import keras
import numpy as np
import pytest

from pycudnnrnn import keras as ours
from pycudnnrnn.keras import loop

BACKEND = keras.backend.backend()
assert BACKEND in ("jax", "torch", "tensorflow"), BACKEND
KERAS = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}
OURS = {"lstm": ours.LSTM, "gru": ours.GRU}
MODES = ["lstm", "gru"]
B, T, F, H = 4, 5, 3, 6
RIGHT_PADDED = np.arange(T)[None, :] < np.array([5, 3, 0, 2])[:, None]  # an empty one too
HOLES = np.array([[1, 0, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0], [1, 1, 0, 0, 1]], bool)
TOL = dict(rtol=2e-5, atol=2e-6)


@pytest.fixture
def op_calls(monkeypatch):
    """The calls of pycudnnrnn's op, each (rnn_mode, input dtype, direction)."""
    calls, real = [], loop._op

    def counting(rnn_mode, x, *rest, direction="unidirectional"):
        calls.append((rnn_mode, keras.backend.standardize_dtype(x.dtype), direction))
        return real(rnn_mode, x, *rest, direction=direction)

    monkeypatch.setattr(loop, "_op", counting)
    tensorflow_op = loop._tensorflow_op  # Keras's TensorFlow backend: the op fed Keras's weights

    def counting_tensorflow(rnn_mode, x, *rest, direction="unidirectional"):
        calls.append((rnn_mode, keras.backend.standardize_dtype(x.dtype), direction))
        return tensorflow_op(rnn_mode, x, *rest, direction=direction)

    monkeypatch.setattr(loop, "_tensorflow_op", counting_tensorflow)
    return calls


def data(seed=0, shape=(B, T, F)):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def numpy(tree):
    if isinstance(tree, (list, tuple)):
        return [numpy(t) for t in tree]
    return keras.ops.convert_to_numpy(tree)


def flat(tree):
    return [a for t in tree for a in flat(t)] if isinstance(tree, (list, tuple)) else [tree]


def _cotangent(index, shape):
    return np.random.default_rng(7 + index).standard_normal(tuple(shape)).astype("float32")


def value_and_grads(layer, x, traced=False, **call):
    """Outputs and d(loss)/d(x, trainable weights) of a fixed random projection of them
    (on TensorFlow, `traced` by ``tf.function``).

    The loss weights every output element differently, so a gradient that is wrong in
    any element, step or state shows.
    """
    project = lambda outputs: sum(keras.ops.sum(keras.ops.cast(o, "float32") *
                                              keras.ops.convert_to_tensor(_cotangent(i, o.shape)))
                                  for i, o in enumerate(outputs))
    if BACKEND == "jax":
        import jax
        trainable = [v.value for v in layer.trainable_variables]
        frozen = [v.value for v in layer.non_trainable_variables]

        def loss(trainable, x):
            outputs = flat(layer.stateless_call(trainable, frozen, x, **call)[0])
            return project(outputs), outputs

        # eager, values and gradients in one pass (Keras's own scan, traced per call,
        # is what costs time here; jit would add a compilation per layer)
        (_, outputs), (dw, dx) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
            trainable, x)
        return numpy(outputs), numpy([dx] + list(dw))
    if BACKEND == "tensorflow":
        import tensorflow as tf
        def run(xt):
            with tf.GradientTape() as tape:
                tape.watch(xt)
                outputs = flat(layer(xt, **call))
                loss = project(outputs)
            return outputs, tape.gradient(loss, [xt] + [v.value for v in layer.trainable_variables])

        outputs, grads = (tf.function(run) if traced else run)(tf.constant(x))
        return numpy(outputs), numpy(list(grads))
    import torch
    xt = torch.tensor(x, requires_grad=True)
    outputs = flat(layer(xt, **call))
    grads = torch.autograd.grad(project(outputs), [xt] + [v.value for v in layer.trainable_variables])
    return numpy(outputs), numpy(list(grads))


def assert_close(got, want, what, **tol):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, (what, i, g.shape, w.shape)
        np.testing.assert_allclose(g, w, err_msg=f"{what} [{i}]", **{**TOL, **tol})


# --------------------------------------------------------------------------- the same function

def _stacked(cls, bi):
    """Masking → cls (sequences) → Bidirectional(cls): stacked, masks propagated."""
    inputs = keras.Input((T, F))
    x = keras.layers.Masking(0.0)(inputs)
    x = cls(H, return_sequences=True)(x)
    return keras.Model(inputs, bi(cls(5), merge_mode="sum")(x))


UNI, BI = {"unidirectional"}, {"bidirectional"}
CONFIGS = {  # name: (build from (layer class, Bidirectional class), call arguments, our calls)
    "right_padded_mask_with_empty": (lambda c, bi: c(H, return_sequences=True, return_state=True),
                                     {"mask": RIGHT_PADDED}, UNI),
    "mask_with_holes": (lambda c, bi: c(H, return_sequences=True, return_state=True),
                        {"mask": HOLES}, UNI),
    "go_backwards_mask_initial_state": (
        lambda c, bi: c(H, return_sequences=True, return_state=True, go_backwards=True),
        {"mask": RIGHT_PADDED, "initial_state": 1}, UNI),
    # Bidirectional returning sequences sets zero_output_for_mask=True on both layers
    "bidirectional_mask_with_holes": (
        lambda c, bi: bi(c(H, return_sequences=True)), {"mask": HOLES}, BI),
    # no mask: the last outputs, and the states
    "bidirectional_state": (lambda c, bi: bi(c(H, return_state=True)), {}, BI),
    # masked steps carry outputs (the initial h where none came before, on JAX)
    "bidirectional_holes_initial_state_unmerged": (
        lambda c, bi: bi(c(H, return_sequences=True, return_state=True), merge_mode=None),
        {"mask": HOLES, "initial_state": 2}, BI),
    # the last outputs alone: masked steps carry them (backward: the next unmasked step's)
    "bidirectional_holes_last_outputs": (lambda c, bi: bi(c(H)), {"mask": HOLES}, BI),
    # keras.layers.Bidirectional around ours: one call per direction
    "keras_bidirectional_around_ours": (
        lambda c, bi: keras.layers.Bidirectional(c(H, return_sequences=True)),
        {"mask": RIGHT_PADDED}, UNI),
    "stacked": (_stacked, {"padded": True}, UNI | BI),
}


def _call_args(mode, call, time=T):
    call = dict(call)
    x = data(shape=(B, time, F))
    if call.pop("padded", False):  # zero the padding for Masking
        x = x * RIGHT_PADDED[..., None]
    if "initial_state" in call:  # random states, for 1 or 2 directions
        states = (2 if mode == "lstm" else 1) * call["initial_state"]
        call["initial_state"] = [data(s + 1, (B, H)) for s in range(states)]
    return x, call


# Keras's own loop costs seconds per call and gradient on JAX (its scan is traced anew
# each time), so JAX runs the cases where the backends differ (our op's call; what a
# masked step before any unmasked one outputs) and the stacked model; PyTorch, quick,
# runs them all. The mask handling itself is keras.ops code, the same on both.
JAX_CASES = {("lstm", "right_padded_mask_with_empty"), ("gru", "right_padded_mask_with_empty"),
             ("lstm", "go_backwards_mask_initial_state"), ("gru", "go_backwards_mask_initial_state"),
             ("gru", "bidirectional_mask_with_holes"),
             ("lstm", "bidirectional_holes_initial_state_unmerged"), ("lstm", "stacked")}
CASES = [(m, c) for m in MODES for c in CONFIGS if BACKEND != "jax" or (m, c) in JAX_CASES]


@pytest.mark.parametrize("mode,config", CASES)
def test_same_outputs_states_and_gradients_as_keras(mode, config, op_calls):
    build, call, directions = CONFIGS[config]
    _assert_same_as_keras(mode, build, *_call_args(mode, call), directions, op_calls)


#: Long enough for 5 chunked loops on TensorFlow (``pycudnnrnn.tensorflow.graph``): the
#: masks' carried outputs and states cross from chunk to chunk.
LONG_T = 40
LONG_MASKS = {"right": np.arange(LONG_T)[None, :] < np.array([40, 23, 0, 9])[:, None],
              "holes": np.tile(HOLES, (1, LONG_T // T))}


@pytest.mark.skipif(BACKEND != "tensorflow", reason="chunked loops: TensorFlow only")
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config,mask", [("right_padded_mask_with_empty", "right"),
                                         ("mask_with_holes", "holes"),
                                         ("go_backwards_mask_initial_state", "right"),
                                         ("bidirectional_holes_initial_state_unmerged", "holes")])
def test_long_sequences_are_keras_own_too(mode, config, mask, traced, op_calls):
    """Right-padded masks run as they are, others with their unmasked steps moved first
    (``graph._Compacted``): eager and traced, each branch of its ``tf.cond``."""
    build, call, directions = CONFIGS[config]
    x, call = _call_args(mode, {**call, "mask": LONG_MASKS[mask]}, time=LONG_T)
    _assert_same_as_keras(mode, build, x, call, directions, op_calls, traced=traced)


def _assert_same_as_keras(mode, build, x, call, directions, op_calls, traced=False):
    reference = build(KERAS[mode], keras.layers.Bidirectional)
    layer = build(OURS[mode], ours.Bidirectional)
    reference(x, **call)
    layer(x, **call)
    layer.set_weights(reference.get_weights())
    op_calls.clear()
    want, want_grads = value_and_grads(reference, x, **call)
    assert not op_calls, "Keras's own layer ran our op"
    got, got_grads = value_and_grads(layer, x, traced=traced, **call)
    assert op_calls and {c[0] for c in op_calls} == {mode}
    assert {c[2] for c in op_calls} == directions
    assert_close(got, want, "outputs and states")
    assert_close(got_grads, want_grads, "gradients (inputs, then weights)")


def test_weights_are_keras_own(op_calls):
    """Same names, shapes and order as Keras's, and get_config round-trips."""
    for mode in MODES:
        reference, layer = KERAS[mode](H, name="rnn"), OURS[mode](H, name="rnn")
        reference.build((B, T, F))
        layer.build((B, T, F))
        assert [(v.path, v.shape) for v in layer.weights] == \
            [(v.path, v.shape) for v in reference.weights]
        config = layer.get_config()
        assert config == reference.get_config()
        assert type(OURS[mode].from_config(config)) is OURS[mode]


def test_stateful_carries_the_state(op_calls):
    x1, x2 = data(1, (2, T, F)), data(2, (2, T, F))
    for mode in MODES:
        reference = KERAS[mode](H, stateful=True, return_sequences=True)
        layer = OURS[mode](H, stateful=True, return_sequences=True)
        reference(x1)
        layer(x1)
        layer.set_weights(reference.get_weights())
        for state in reference.states + layer.states:
            state.assign(np.zeros(state.shape, "float32"))
        got = numpy([layer(x1), layer(x2)])
        want = numpy([reference(x1), reference(x2)])
        assert_close(got, want, f"{mode} stateful, two calls")
        assert_close(numpy(layer.states), numpy(reference.states), f"{mode} final states")
        fresh = OURS[mode](H, return_sequences=True)
        fresh(x2)
        fresh.set_weights(reference.get_weights())
        assert np.abs(numpy(fresh(x2)) - got[1]).max() > 1e-3, "the second call used the state"
        layer.reset_state()
        assert_close([numpy(layer(x2))], [numpy(fresh(x2))], f"{mode} after reset_state")
    assert op_calls


@pytest.mark.parametrize("mode", MODES)
def test_dropout(mode, op_calls):
    """Eval: no dropout. Training: the cell's own mask on the inputs, so with the same seed
    the very function Keras computes; implementation=1 (per-gate masks) falls back."""
    x = data()
    reference = KERAS[mode](H, dropout=0.5, seed=3, return_sequences=True)
    layer = OURS[mode](H, dropout=0.5, seed=3, return_sequences=True)
    plain = KERAS[mode](H, return_sequences=True)
    for l in (reference, layer, plain):
        l(x)  # each draws one mask (RNN.call prepares it even outside training)
    layer.set_weights(reference.get_weights())
    plain.set_weights(reference.get_weights())
    op_calls.clear()
    got = numpy(layer(x, training=True))
    assert op_calls
    want = numpy(reference(x, training=True))
    assert got.shape == (B, T, H)
    assert np.abs(got - numpy(plain(x))).max() > 1e-2, "training applied no dropout"
    assert_close([got], [want], "training, the same seed")
    assert_close([numpy(layer(x, training=False))], [numpy(plain(x))], "eval")
    per_gate = OURS[mode](H, dropout=0.5, implementation=1)
    assert per_gate.runs_on_our_op(training=False) and not per_gate.runs_on_our_op(training=True)
    # the two directions draw different masks: a fused pair would need two inputs
    pair = ours.Bidirectional(OURS[mode](H, dropout=0.5))
    assert pair.fuses(training=False) and not pair.fuses(training=True)
    assert not ours.Bidirectional(KERAS[mode](H)).fuses(training=False)


@pytest.mark.parametrize("mode", MODES)
def test_a_seeded_pair_draws_keras_masks_after_any_calls(mode, op_calls):
    """Keras's RNN.call draws each cell's dropout mask at every call, inference too: the
    fused pair skipped that, so after model(x) its training masks were others (outputs
    0.27-0.65 apart)."""
    x = data()
    make = lambda layers: layers.Bidirectional(
        {"lstm": layers.LSTM, "gru": layers.GRU}[mode](H, dropout=0.5, seed=3,
                                                      return_sequences=True))
    reference, pair = make(keras.layers), make(ours)
    reference(x), pair(x)
    pair.set_weights(reference.get_weights())
    for calls in ([False], [False, False], [None, True, False]):  # then a training call
        for training in calls:
            reference(x, training=training), pair(x, training=training)
        op_calls.clear()
        got = numpy(pair(x, training=True))
        assert_close([got], [numpy(reference(x, training=True))], f"{mode} after {calls}")
    assert op_calls  # each direction on our op (the pair fuses only without dropout)


def test_fit_with_validation_follows_keras_with_dropout_in_a_pair(op_calls):
    """validation_data runs inference between epochs: fit's losses drifted 0.07-0.19."""
    rng = np.random.default_rng(5)
    x, y = data(5, (16, T, F)), rng.standard_normal((16, 1)).astype("float32")

    def model(layers):
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((T, F)), layers.Bidirectional(
            layers.LSTM(H, dropout=0.4, seed=11)), keras.layers.Dense(1)])

    histories, weights = [], None
    for layers in (keras.layers, ours):
        m = model(layers)
        weights = weights or m.get_weights()
        m.set_weights(weights)
        m.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        histories.append(m.fit(x, y, batch_size=8, epochs=3, validation_data=(x, y),
                               shuffle=False, verbose=0).history)
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(histories[1][key], histories[0][key], rtol=1e-4, err_msg=key)
    assert op_calls


@pytest.mark.skipif(BACKEND != "tensorflow", reason="Keras's weights as they are: on "
                                                    "TensorFlow only")
@pytest.mark.parametrize("pair", [False, True], ids=["layer", "bidirectional"])
def test_tensorflow_feeds_the_op_keras_weights_and_mask_as_they_are(pair, op_calls,
                                                                    monkeypatch):
    """On TensorFlow the op is TensorFlow's operations: no params buffer is gathered and
    cut, and keras.ops moves no step to the front (those were half the operations of a
    small training step). The graph moves steps itself, where a mask is not
    right-padded."""
    def refused(*args, **kwargs):
        raise AssertionError("a params buffer gathered, or steps moved")
    monkeypatch.setattr(loop, "keras_params", refused)
    monkeypatch.setattr(loop, "_compact", refused)
    layer = ours.Bidirectional(ours.GRU(H, return_sequences=True)) if pair \
        else ours.GRU(H, return_sequences=True)
    y = numpy(layer(data(), mask=HOLES))
    assert op_calls and np.all(np.isfinite(y))


@pytest.mark.skipif(BACKEND != "jax", reason="lowered program: on JAX only")
@pytest.mark.parametrize("pair", [False, True], ids=["layer", "bidirectional"])
def test_a_mask_s_counts_reach_the_op_without_a_range_check(pair, op_calls):
    """A mask's counts are in [0, time] by construction: the lowered program has no custom
    call range-checking them (on the CPU it cost ~0.4 ms a small training step)."""
    import jax
    layer = ours.Bidirectional(ours.GRU(H)) if pair else ours.GRU(H)
    layer(data())  # built
    text = jax.jit(lambda x, mask: layer(x, mask=mask)).lower(data(), HOLES).as_text()
    assert op_calls and "pycudnnrnn_check_lengths" not in text


@pytest.mark.parametrize("pair", [False, True], ids=["layer", "bidirectional"])
def test_a_wrong_initial_state_or_mask_is_named(pair, op_calls):
    x = data()
    layer = ours.Bidirectional(ours.LSTM(H)) if pair else ours.LSTM(H)
    width = [np.zeros((B, H - 1), "float32")] * (4 if pair else 2)
    with pytest.raises(ValueError, match=r"initial_state: expected each state of shape "
                                         r"\(batch, units\) = \(4, 6\), got \(4, 5\)"):
        layer(x, initial_state=width)
    with pytest.raises(ValueError, match=r"mask: expected shape \(batch, time\) = \(4, 5\)"):
        layer(x, mask=np.ones((B, T + 1), bool))


@pytest.mark.parametrize("pair", [False, True], ids=["layer", "bidirectional"])
def test_a_mask_with_a_last_axis_of_one_is_taken_as_keras_takes_it(pair, op_calls):
    """Keras's backends add that axis to a [batch, time] mask themselves: [batch, time, 1]
    computes the same (it was refused as a mask of the wrong shape)."""
    x = data()
    layer = ours.Bidirectional(ours.LSTM(H, return_sequences=True)) if pair \
        else ours.LSTM(H, return_sequences=True)
    assert_close(numpy([layer(x, mask=RIGHT_PADDED[..., None])]),
                 numpy([layer(x, mask=RIGHT_PADDED)]), "mask", rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"mask: expected shape \(batch, time\) = \(4, 5\)"):
        layer(x, mask=np.ones((B, T, 2), bool))


FALLBACKS = {
    "relu": dict(activation="relu"),
    "hard_sigmoid": dict(recurrent_activation="hard_sigmoid"),
    "no_bias": dict(use_bias=False),
    "recurrent_dropout": dict(recurrent_dropout=0.3),
    "unroll": dict(unroll=True),
    "use_cudnn_false": dict(use_cudnn=False),
    "gru_reset_before": dict(reset_after=False),
}


# the choice is backend-independent code; JAX (slow in Keras's loop) checks two of them
FALLBACK_CASES = [n for n in FALLBACKS if BACKEND != "jax" or n in ("relu", "gru_reset_before")]


@pytest.mark.parametrize("name", FALLBACK_CASES)
def test_fallback_is_keras_own(name, op_calls):
    """What cuDNN does not compute runs Keras's loop: Keras's result, not an error."""
    mode = "gru" if name.startswith("gru") else "lstm"
    kwargs = dict(FALLBACKS[name], return_sequences=True)
    x = data()
    reference, layer = KERAS[mode](H, **kwargs), OURS[mode](H, **kwargs)
    reference(x)
    layer(x)
    layer.set_weights(reference.get_weights())
    assert not layer.runs_on_our_op(training=True)
    assert_close(numpy([layer(x, mask=RIGHT_PADDED)]), numpy([reference(x, mask=RIGHT_PADDED)]),
                 name, rtol=1e-6, atol=1e-7)
    assert not op_calls


@pytest.mark.parametrize("mode", MODES)
def test_mixed_bfloat16(mode, op_calls):
    """bfloat16 compute and float32 variables, on our op: close to the float32 layer (itself
    Keras's function, see above) in outputs and gradients."""
    x = data()
    reference = OURS[mode](H, return_sequences=True, return_state=True)
    layer = OURS[mode](H, return_sequences=True, return_state=True, dtype="mixed_bfloat16")
    reference(x)
    layer(x)
    layer.set_weights(reference.get_weights())
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in layer.weights)
    op_calls.clear()
    got, got_grads = value_and_grads(layer, x, mask=RIGHT_PADDED)
    assert {c[1] for c in op_calls} == {"bfloat16"}
    assert {keras.backend.standardize_dtype(g.dtype) for g in got} == {"bfloat16"}
    want, want_grads = value_and_grads(reference, x, mask=RIGHT_PADDED)
    assert_close([g.astype("float32") for g in got], want, "bfloat16 outputs", rtol=3e-2, atol=3e-2)
    # the weights' gradients are float32 (the variables'), their values bfloat16-accurate
    scale = max(np.abs(w).max() for w in want_grads)
    assert_close([g.astype("float32") for g in got_grads], want_grads, "bfloat16 gradients",
                 rtol=5e-2, atol=5e-2 * scale)


# --------------------------------------------------------------------------- models

def _model(lstm, gru, bi):
    inputs = keras.Input((T, F))
    x = keras.layers.Masking(0.0)(inputs)
    x = lstm(8, return_sequences=True, name="encoder")(x)
    x = bi(gru(4), name="summary")(x)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(x))


def test_save_and_load_round_trip(tmp_path, op_calls):
    x = data() * RIGHT_PADDED[..., None]
    model = _model(ours.LSTM, ours.GRU, ours.Bidirectional)
    want = numpy(model(x))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.get_layer("encoder")) is ours.LSTM
    assert type(loaded.get_layer("summary")) is ours.Bidirectional
    assert type(loaded.get_layer("summary").forward_layer) is ours.GRU
    op_calls.clear()
    assert_close([numpy(loaded(x))], [want], "loaded model", rtol=1e-6, atol=1e-7)
    assert op_calls


def test_replace_layers_keeps_names_weights_and_function(op_calls):
    x = data() * RIGHT_PADDED[..., None]
    model = _model(keras.layers.LSTM, keras.layers.GRU, keras.layers.Bidirectional)
    want = numpy(model(x))
    swapped = ours.replace_layers(model)
    assert type(swapped.get_layer("encoder")) is ours.LSTM
    summary = swapped.get_layer("summary")
    assert type(summary) is ours.Bidirectional
    assert type(summary.forward_layer) is ours.GRU and type(summary.backward_layer) is ours.GRU
    names = lambda m: [l.name for l in m.layers if not isinstance(l, keras.layers.InputLayer)]
    assert names(swapped) == names(model)  # clone_model renames the input layer only
    op_calls.clear()
    assert_close([numpy(swapped(x))], [want], "swapped model")
    assert op_calls


def test_fit_lowers_the_loss(op_calls):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, T, F)).astype("float32") * RIGHT_PADDED[rng.integers(0, B, 32), :, None]
    y = x.sum(axis=(1, 2))[:, None] / 4  # a function of the sequence a small RNN can learn
    keras.utils.set_random_seed(0)
    model = _model(ours.LSTM, ours.GRU, ours.Bidirectional)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=6, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.7 * losses[0], losses
    assert {c[0] for c in op_calls} == {"lstm", "gru"}


def test_keras_own_errors_for_bad_input():
    for mode in MODES:
        with pytest.raises(ValueError):
            OURS[mode](H)(np.zeros((B, F), "float32"))  # not a sequence: Keras's InputSpec


# --------------------------------------------------------------------------- the docs page

# Run once, on PyTorch: the page is backend-neutral, and Keras's own loop in it costs
# half a minute on JAX.
@pytest.mark.skipif(BACKEND != "torch", reason="docs page: on PyTorch only")
def test_docs_page_runs(tmp_path, monkeypatch, op_calls):
    """docs/keras.md's Python blocks, in order, as shown."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "docs", "keras.md")
    blocks = re.findall(r"```python\n(.*?)```", open(path, encoding="utf-8").read(), flags=re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for block in blocks:
        exec(compile(block, path, "exec"), namespace)
    assert {c[0] for c in op_calls} == {"lstm", "gru"}


def penalty_grads(layer):
    """``f(x) -> (loss, grads)``: the gradient, with respect to the layer's trainable
    weights, of a WGAN-GP loss: the critic's mean output plus (‖∂critic/∂x‖ - 1)² per
    sample (a second derivative), at the weights' current values."""
    if BACKEND == "jax":
        import jax
        import jax.numpy as jnp

        def loss(trainable, frozen, x):
            critic = lambda x: layer.stateless_call(trainable, frozen, x)[0].sum(-1)
            scores, pullback = jax.vjp(critic, x)
            (g,) = pullback(jnp.ones_like(scores))
            norms = jnp.sqrt((g ** 2).sum(axis=(1, 2)))
            return scores.mean() + ((norms - 1) ** 2).mean()
        step = jax.jit(jax.value_and_grad(loss))  # compiled once: eager is slower here

        def f(x):
            value, grads = step([v.value for v in layer.trainable_variables],
                                [v.value for v in layer.non_trainable_variables], x)
            return float(value), numpy(grads)
        return f
    if BACKEND == "tensorflow":
        import tensorflow as tf

        def f(x):
            xt = tf.constant(x)
            weights = [v.value for v in layer.trainable_variables]
            with tf.GradientTape() as outer:
                with tf.GradientTape() as inner:
                    inner.watch(xt)
                    scores = tf.reduce_sum(layer(xt), -1)
                    total = tf.reduce_sum(scores)
                g = inner.gradient(total, xt)
                norms = tf.sqrt(tf.reduce_sum(g ** 2, axis=(1, 2)))
                loss = tf.reduce_mean(scores) + tf.reduce_mean((norms - 1) ** 2)
            return float(loss), numpy(outer.gradient(loss, weights))
        return f
    import torch

    def f(x):
        xt = torch.tensor(x, requires_grad=True)
        scores = layer(xt).sum(-1)
        (g,) = torch.autograd.grad(scores.sum(), xt, create_graph=True)
        loss = scores.mean() + ((g.square().sum((1, 2)).sqrt() - 1) ** 2).mean()
        weights = [v.value for v in layer.trainable_variables]
        return float(loss.detach()), numpy(list(torch.autograd.grad(loss, weights)))
    return f


@pytest.fixture(params=["default", "op"])
def route(request, monkeypatch):
    """Where the layer's call runs on the CPU by default (JAX's scan; PyTorch's kernels),
    or the op a GPU runs (the custom call; the op's NumPy kernels)."""
    if request.param == "op":
        if BACKEND == "tensorflow":
            pytest.skip("one route on TensorFlow: its own operations, on every device")
        if BACKEND == "jax":
            from pycudnnrnn.jax import scan
            monkeypatch.setattr(scan, "applies", lambda problem: False)
        else:
            from pycudnnrnn.torch import torch_kernels as native
            monkeypatch.setattr(native._choice, "kernels", "numpy")
    return request.param


@pytest.mark.parametrize("mode", MODES)
def test_a_gradient_penalty_equals_keras_and_trains(mode, route, op_calls):
    """Second-order gradients through the op: the penalty's weight gradients equal Keras's
    own layer's, and a few steps of descent on them lower the loss."""
    x = data(4, (B, T, F)) * 0.5
    reference = ours.Bidirectional(KERAS[mode](H)) if mode == "gru" else KERAS[mode](H)
    layer = ours.Bidirectional(OURS[mode](H)) if mode == "gru" else OURS[mode](H)
    reference(x)
    layer(x)
    layer.set_weights(reference.get_weights())
    op_calls.clear()
    want_loss, want = penalty_grads(reference)(x)
    assert not op_calls
    losses, penalty = [], penalty_grads(layer)
    for step in range(4):
        loss, got = penalty(x)
        if step == 0:
            assert op_calls
            assert_close([np.float32(loss)], [np.float32(want_loss)], "penalty loss")
            assert_close(got, want, "penalty gradients", rtol=1e-4, atol=1e-5)
        losses.append(loss)
        for variable, grad in zip(layer.trainable_variables, got):
            variable.assign(numpy(variable.value) - 0.05 * grad)
    assert losses[-1] < losses[0], losses
