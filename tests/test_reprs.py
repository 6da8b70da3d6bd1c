"""What a notebook shows for the objects it displays: one short line each, shapes and
dtypes rather than values."""

import numpy as np
import pytest

import pycudnnrnn as rnn
from pycudnnrnn.core import checks, layout


def _forward_and_backprop(T=5, B=3, I=4, H=6, **attrs):
    rng = np.random.default_rng(0)
    D = 2 if attrs.get("direction") == "bidirectional" else 1
    n = rnn.params_size(num_layers=2, num_units=H, input_size=I, **attrs)
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    h = np.zeros((2 * D, B, H), np.float32)
    p = rng.uniform(-0.1, 0.1, n).astype(np.float32)
    result = rnn.forward(x, h, h, p, **attrs)
    grads = rnn.backprop(x, h, h, p, None, *result[:3], *(np.ones_like(a) for a in result[:3]),
                         result.reserve_space, **attrs)
    return result, grads


def test_results_show_dtypes_and_shapes_not_values():
    result, grads = _forward_and_backprop(direction="bidirectional")
    nbytes = result.reserve_space.shape[0]
    assert repr(result) == ("ForwardResult(output=float32[5, 3, 12], output_h=float32[4, 3, 6], "
                            f"output_c=float32[4, 3, 6], reserve_space=uint8[{nbytes}])")
    assert repr(grads) == ("BackpropResult(input_backprop=float32[5, 3, 4], input_h_backprop="
                           "float32[4, 3, 6], input_c_backprop=float32[4, 3, 6], "
                           f"params_backprop=float32[{grads.params_backprop.size}])")
    y, hy, cy, reserve = result  # still a named tuple
    assert y is result.output and result._fields[-1] == "reserve_space"


def test_a_large_result_stays_one_short_line():
    result, grads = _forward_and_backprop(T=200, B=64, I=32, H=64)
    for shown in (repr(result), repr(grads), str(result)):
        assert "\n" not in shown and len(shown) < 200 and "array" not in shown, shown


def test_results_name_a_library_other_than_numpy():
    torch = pytest.importorskip("torch")
    t = torch.zeros(2, 3, dtype=torch.float64)
    shown = repr(rnn.ForwardResult(t, t, torch.zeros(0), None))
    assert shown == ("ForwardResult(output=torch float64[2, 3], output_h=torch float64[2, 3], "
                     "output_c=torch float32[0], reserve_space=None)")
    bfloat16 = rnn.BackpropResult(*[np.zeros((2, 3), checks.dtypes.by_name("bfloat16"))] * 4)
    assert repr(bfloat16).startswith("BackpropResult(input_backprop=bfloat16[2, 3], ")


@pytest.mark.parametrize("kwargs", [
    dict(num_layers=2, num_units=6, input_size=4, max_time=5, batch_size=3),
    dict(num_layers=2, num_units=6, input_size=4, max_time=5, batch_size=3,
         sequence_lengths=[5, 2, 0], direction="bidirectional", dtype="float64"),
    dict(num_layers=3, num_units=8, input_size=8, max_time=7, batch_size=2, rnn_mode="gru",
         input_mode="skip_input", is_training=False, time_major=False, dtype="bfloat16"),
    dict(num_layers=3, num_units=8, input_size=4, max_time=5, batch_size=3, dropout=0.5,
         seed=3, seed2=9, num_proj=4),
])
def test_a_plans_repr_is_its_constructor_call(kwargs):
    plan = rnn.RNNPlan(**kwargs)
    shown = repr(plan)
    assert "\n" not in shown and len(shown) < 250, shown
    again = eval(shown, {"RNNPlan": rnn.RNNPlan})  # the same plan, shown the same way
    assert repr(again) == shown and again.problem.config == plan.problem.config
    a, b = again.problem, plan.problem
    assert (a.max_time, a.batch_size, a.time_major, a.dtype, a.is_training) == (
        b.max_time, b.batch_size, b.time_major, b.dtype, b.is_training)
    assert (a.lengths is None and b.lengths is None) or np.array_equal(a.lengths, b.lengths)
    assert shown.startswith(f"RNNPlan(num_layers={kwargs['num_layers']}, ")


def test_a_plan_with_many_lengths_stays_one_short_line():
    lengths = np.arange(5000) % 41
    plan = rnn.RNNPlan(num_layers=1, num_units=4, input_size=3, max_time=40, batch_size=5000,
                       sequence_lengths=lengths, is_training=False)
    for shown in (repr(plan), repr(plan.problem)):
        assert "\n" not in shown and len(shown) < 300, shown
        assert "(5000 lengths in [0, 40])" in shown, shown
    assert repr(plan) == ("RNNPlan(num_layers=1, num_units=4, input_size=3, max_time=40, "
                          "batch_size=5000, sequence_lengths=[0, 1, ..., 38] (5000 lengths in "
                          "[0, 40]), dtype='float32', device='cpu', is_training=False)")


def test_a_config_shows_its_sizes_and_only_what_differs_from_the_defaults():
    def config(**attrs):
        return checks.make_config(**{**dict(rnn_mode="lstm", num_layers=2, num_units=6,
                                            input_size=4, input_mode="linear_input",
                                            direction="unidirectional", num_proj=0), **attrs})

    assert repr(config()) == "RNNConfig(rnn_mode='lstm', num_layers=2, num_units=6, input_size=4)"
    assert repr(config(direction="bidirectional", num_proj=3, dropout=0.25)) == (
        "RNNConfig(rnn_mode='lstm', bidirectional=True, num_layers=2, num_units=6, "
        "input_size=4, num_proj=3, dropout=0.25)")


def test_layout_objects_are_one_short_line_each():
    config = checks.make_config(rnn_mode="lstm", num_layers=2, num_units=64, input_size=32,
                                input_mode="linear_input", direction="bidirectional",
                                num_proj=16)
    objects = [*layout.pieces(config)[:3], *layout.pseudo_layer_blocks(config)]
    objects.append(layout.pseudo_layer_blocks(config)[0].w_input)
    for shown in map(repr, objects):
        assert "\n" not in shown and len(shown) < 300 and "array" not in shown, shown
    block = layout.pseudo_layer_blocks(config)[1].w_recurrent  # what it is, as code reads it
    assert repr(block) == f"Block(params[{block.offset}:{block.stop}].reshape(256, 16))"
