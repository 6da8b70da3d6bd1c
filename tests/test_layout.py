"""The params layout: sizes, canonical order and shapes, and round trips."""

import itertools

import numpy as np
import pytest

import pycudnnrnn
from pycudnnrnn.core import layout
from pycudnnrnn.core.checks import make_config

CONFIGS = [
    dict(rnn_mode=m, direction=d, input_mode=i, num_proj=p, num_layers=l, num_units=4,
         input_size=4 if i == "skip_input" else 3)
    for m, d, i, p, l in itertools.product(
        ["lstm", "gru", "rnn_tanh", "rnn_relu"], ["unidirectional", "bidirectional"],
        ["linear_input", "skip_input"], [0, 2], [1, 2, 3])
    if not (p and m != "lstm")
]


def _canonical(attrs):
    defaults = dict(rnn_mode="lstm", input_mode="linear_input", direction="unidirectional",
                    num_proj=0)
    cfg = make_config(**{**defaults, **attrs})
    return layout.canonical_shapes(cfg)


@pytest.mark.parametrize("attrs", CONFIGS)
def test_size_is_the_sum_of_the_canonical_pieces(attrs):
    weights, biases = _canonical(attrs)
    total = sum(int(np.prod(s)) for s in weights + biases)
    assert pycudnnrnn.params_size(**attrs) == total


@pytest.mark.parametrize("attrs", CONFIGS)
def test_round_trip_is_the_identity(attrs):
    n = pycudnnrnn.params_size(**attrs)
    params = np.random.default_rng(0).standard_normal(n)
    weights, biases = pycudnnrnn.params_to_canonical(params, **attrs)
    assert ([w.shape for w in weights], [b.shape for b in biases]) == _canonical(attrs)
    back = pycudnnrnn.canonical_to_params(weights, biases, **attrs)
    np.testing.assert_array_equal(back, params)
    again = pycudnnrnn.params_to_canonical(back, **attrs)
    for a, b in zip(weights + biases, again[0] + again[1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("attrs", CONFIGS)
def test_pieces_tile_the_buffer_matrices_first(attrs):
    table = layout.pieces(make_config(**attrs))
    assert table[-1].stop == pycudnnrnn.params_size(**attrs)
    offset = 0
    for piece in table:
        assert piece.offset == offset
        offset = piece.stop
    kinds = [p.kind for p in table]
    assert kinds == sorted(kinds, key=lambda k: k == "bias"), "all matrices precede all biases"


@pytest.mark.parametrize("attrs", CONFIGS)
def test_each_layer_alone_is_its_slices_of_the_buffer(attrs):
    """A layer's two slices, concatenated, are its one-layer network's buffer: each
    piece there is the same piece (role, gate, shape) of the whole network's."""
    config = make_config(**attrs)
    D = config.num_dirs
    params = np.arange(pycudnnrnn.params_size(**attrs))
    taken = []
    for index in range(config.num_layers):
        alone, matrices, biases = layout.layer(config, index)
        assert (alone.num_layers, alone.dropout) == (1, 0.0)
        assert alone.input_size == (config.input_size if index == 0 else D * config.state_size)
        own = np.concatenate([params[matrices], params[biases]])
        assert own.size == layout.params_size(alone)
        whole = [p for p in layout.pieces(config) if p.pseudo_layer // D == index]
        for piece, original in zip(layout.pieces(alone), whole, strict=True):
            assert (piece.kind, piece.role, piece.gate, piece.shape) == \
                (original.kind, original.role, original.gate, original.shape)
            np.testing.assert_array_equal(own[piece.offset:piece.stop],
                                          params[original.offset:original.stop])
        taken += [own]
    np.testing.assert_array_equal(np.sort(np.concatenate(taken)), params)
    for index in (-1, config.num_layers):
        with pytest.raises(IndexError):
            layout.layer(config, index)


def test_canonical_order_and_shapes_by_hand():
    """Bidirectional 2-layer LSTM, input 3, units 4, projection 2 (H=4, P=2, D=2)."""
    attrs = dict(rnn_mode="lstm", num_layers=2, num_units=4, input_size=3,
                 direction="bidirectional", num_proj=2)
    weights, biases = _canonical(attrs)
    layer0 = [(4, 3)] * 4 + [(4, 2)] * 4 + [(2, 4)]
    layer1 = [(4, 4)] * 4 + [(4, 2)] * 4 + [(2, 4)]   # in_width = D·P = 4
    assert weights == layer0 + layer0 + layer1 + layer1
    assert biases == [(4,)] * 32
    # TensorFlow's documented formula for the same network without projection:
    # per pseudo-layer G·(H·in + H·H) matrices and 2·G·H biases
    plain = dict(attrs, num_proj=0)
    expected = 2 * (4 * (4 * 3 + 16) + 32) + 2 * (4 * (4 * 8 + 16) + 32)
    assert pycudnnrnn.params_size(**plain) == expected


def test_canonical_order_gru_by_hand_and_views():
    attrs = dict(rnn_mode="gru", num_layers=1, num_units=2, input_size=3)
    params = np.arange(pycudnnrnn.params_size(**attrs), dtype=np.float64)
    weights, biases = pycudnnrnn.params_to_canonical(params, **attrs)
    assert params.size == 30 + 12
    np.testing.assert_array_equal(weights[1], np.arange(6, 12).reshape(2, 3))  # W_z
    np.testing.assert_array_equal(weights[3], np.arange(18, 22).reshape(2, 2))  # R_r
    np.testing.assert_array_equal(biases[5], [40, 41])  # b_Rh
    weights[0][0, 0] = -1  # views of params, not copies
    assert params[0] == -1


def test_skip_input_drops_layer0_input_matrices_only():
    attrs = dict(rnn_mode="gru", num_layers=2, num_units=4, input_size=4,
                 direction="bidirectional")
    linear, _ = _canonical(dict(attrs, input_mode="linear_input"))
    skip, skip_biases = _canonical(dict(attrs, input_mode="skip_input"))
    assert len(linear) - len(skip) == 2 * 3  # two directions × three gates
    assert skip[:3] == [(4, 4)] * 3  # recurrent matrices open the list
    assert len(skip_biases) == 4 * 6
    auto, _ = _canonical(dict(attrs, input_mode="auto_select"))
    assert auto == skip


def test_blocks_stack_gates_of_one_role():
    cfg = make_config(rnn_mode="lstm", num_layers=1, num_units=3, input_size=2,
                      input_mode="linear_input", direction="unidirectional", num_proj=0)
    params = np.random.default_rng(1).standard_normal(layout.params_size(cfg))
    weights, biases = layout.split(params, cfg)
    blocks = layout.pseudo_layer_blocks(cfg)[0]
    np.testing.assert_array_equal(blocks.w_input.view(params), np.concatenate(weights[:4]))
    np.testing.assert_array_equal(blocks.w_recurrent.view(params), np.concatenate(weights[4:8]))
    np.testing.assert_array_equal(blocks.b_recurrent.view(params), np.concatenate(biases[4:]))
    assert blocks.w_projection is None


# --------------------------------------------------------------------------- bounded work

class _TooMuchWork(Exception):
    pass


def _lines_run(function, limit):
    """Lines of pycudnnrnn's own code `function()` executes: a count of work, not a time.

    Stops with _TooMuchWork past `limit`, so that a quadratic regression fails quickly.
    """
    import sys
    count = [0]

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
            if count[0] > limit:
                raise _TooMuchWork(count[0])
        return local

    def trace(frame, event, arg):
        return local if "pycudnnrnn" in frame.f_code.co_filename else None

    sys.settrace(trace)
    try:
        function()
    finally:
        sys.settrace(None)
    return count[0]


def _first_forward(num_layers):
    attrs = dict(rnn_mode="lstm", direction="bidirectional")
    n = pycudnnrnn.params_size(num_layers=num_layers, num_units=1, input_size=1, **attrs)
    x, h = np.zeros((1, 1, 1)), np.zeros((2 * num_layers, 1, 1))
    layout.pieces.cache_clear()
    layout.pseudo_layer_blocks.cache_clear()
    return lambda: pycudnnrnn.forward(x, h, h, np.zeros(n), **attrs)


def test_first_forward_work_is_linear_in_layers():
    """The first forward builds the layout tables once, in one pass (it was quadratic:
    every pseudo-layer scanned the whole table, 4.8 s at 2000 layers)."""
    per_layer = _lines_run(_first_forward(1000), limit=10 ** 6) / 1000
    lines = _lines_run(_first_forward(2000), limit=int(2.2 * 2000 * per_layer))
    assert lines <= 2.2 * 2000 * per_layer


def test_params_size_does_not_grow_with_layers():
    """params_size is arithmetic: 100 000 layers cost what one does, and cache nothing
    (it took 12.7 s and kept 940 MiB)."""
    attrs = dict(rnn_mode="lstm", num_units=8, input_size=4, direction="bidirectional")
    one = _lines_run(lambda: pycudnnrnn.params_size(num_layers=1, **attrs), limit=10 ** 4)
    many = _lines_run(lambda: pycudnnrnn.params_size(num_layers=100_000, **attrs), limit=one)
    assert many == one
    held = layout.pieces.cache_entries()
    pycudnnrnn.params_size(num_layers=100_001, **attrs)
    assert layout.pieces.cache_entries() == held


def test_layout_caches_hold_a_bounded_number_of_entries(monkeypatch):
    monkeypatch.setattr(layout, "CACHE_ENTRIES", 500)

    def config(num_layers, seed=0):
        return make_config(rnn_mode="gru", num_layers=num_layers, num_units=2, input_size=2,
                           input_mode="linear_input", direction="bidirectional", num_proj=0,
                           dropout=0.5, seed=seed)

    for cache in (layout.pieces, layout.pseudo_layer_blocks):
        cache.cache_clear()
        big = config(layout.CACHE_ENTRIES)  # more entries than the cache may hold
        assert len(cache(big)) > layout.CACHE_ENTRIES
        assert cache.cache_entries() == 0, "a table over the bound is not kept"
        for layers in range(1, 60):
            cache(config(layers))
            assert cache.cache_entries() <= layout.CACHE_ENTRIES
        assert cache(config(3, seed=1)) is cache(config(3, seed=2)), "seeds share the layout"


@pytest.mark.parametrize("attrs", CONFIGS)
def test_tiles_cut_the_buffer_at_every_block_edge(attrs):
    """``layout.tiles``, what the JAX and TensorFlow adapters split params by: in order,
    no overlap, no gap, to the buffer's end, each block once with its own size."""
    config = make_config(**attrs)
    blocks = layout.pseudo_layer_blocks(config)
    tiles = layout.tiles(blocks)
    assert [t[0] for t in tiles] == [0] + [t[1] for t in tiles[:-1]]
    assert tiles[-1][1] == layout.params_size(config)
    named = {(k, name): stop - offset for offset, stop, k, name in tiles if k is not None}
    want = {(k, name): int(np.prod(block.shape)) for k, layer in enumerate(blocks)
            for name in layout.BLOCK_NAMES if (block := getattr(layer, name)) is not None}
    assert named == want
