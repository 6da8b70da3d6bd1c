"""Flax's own cells to and from ``LSTM``, ``GRU`` and ``SimpleRNN`` (``from_flax`` and
``to_flax``): the layers' form (a cell, ``nnx.RNN`` or ``nnx.Bidirectional``) and their
checks; ``cells`` converts one cell's weights, ``blocks`` packs them in cuDNN's layout.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from . import blocks as _blocks
from . import cells as _cells


def from_flax(cls, layers, *, dropout_rate=0.0, rngs=None):
    """``cls.from_flax(layers, ...)`` for `cls` one of ``LSTM``, ``GRU`` and
    ``SimpleRNN`` (see that method)."""
    single = not isinstance(layers, (list, tuple))
    if single:
        layers = [layers]
    if not layers:
        raise ValueError("layers: expected at least one layer, got an empty list")
    directions = [_directions(layer, i) for i, layer in enumerate(layers)]
    if len({len(d) for d in directions}) != 1:
        raise ValueError("layers: cuDNN stacks layers of one kind; got a mix of "
                         "unidirectional and nnx.Bidirectional layers")
    cells = [c for d in directions for c in d]
    modes = {_cells.cell_mode(c) for c in cells}
    mode = modes.pop()
    if modes:
        raise ValueError("layers: all cells must be of one kind, got "
                         f"{sorted({type(c).__name__ for c in cells})}")
    expected = cls._mode_for(mode)
    if expected is None:
        raise TypeError(f"layers: {cls.__name__}.from_flax takes "
                        f"{cls._cell_names()}, got {type(cells[0]).__name__}")
    first = cells[0]
    H, D = first.hidden_features, len(directions[0])
    for i, d in enumerate(directions):
        for cell in d:
            width = first.in_features if i == 0 else D * H
            if cell.hidden_features != H or cell.in_features != width:
                raise ValueError(f"layers[{i}]: expected a cell with in_features={width} "
                                 f"and hidden_features={H}, got in_features="
                                 f"{cell.in_features}, hidden_features={cell.hidden_features}")
    blocks = [_cells.cell_blocks(c) for c in cells]
    param_dtype = jnp.result_type(*[b.kernel_i for b in blocks])
    options = dict(num_layers=len(layers), bidirectional=D == 2, dropout_rate=dropout_rate,
                   dtype=first.dtype, param_dtype=param_dtype)
    if mode.startswith("rnn_"):
        options["activation"] = mode[4:]
    # Built abstract (no initializer runs), then given the cells' weights.
    module = nnx.eval_shape(lambda: cls(first.in_features, H, rngs=nnx.Rngs(0), **options))
    # The dropout stream is the caller's, as nnx.Dropout(rngs=...) takes it (none
    # without rngs: the call must then bring one, or be deterministic).
    module.rngs = rngs["dropout"].fork() if dropout_rate and rngs is not None \
        else nnx.data(None)
    module.params.set_value(_blocks.pack([b.astype(param_dtype) for b in blocks],
                                         module._config()))
    # What to_flax gives back: the same form (a cell for a cell, nnx.RNN for nnx.RNN,
    # with their options) and the same cell class (LSTMCell stays LSTMCell).
    module._flax_form = _FlaxForm(single, tuple(map(_layer_form, layers)), type(first))
    return module


def to_flax(module, *, cell_type=None):
    """``module.to_flax(...)`` (see that method)."""
    if module.num_proj:
        raise ValueError(f"num_proj: Flax's LSTM cells have no projection, got "
                         f"num_proj={module.num_proj}")
    form = getattr(module, "_flax_form", None)
    if cell_type is None and form is not None and module._lstm:
        cell_type = form.cell_type
    cells = [_cells.make_cell(b, module._rnn_mode, cell_type=cell_type, dtype=module.dtype,
                              param_dtype=module.param_dtype)
             for b in _blocks.unpack(module.params[...], module._config())]
    D = module._num_dirs
    per_layer = [cells[D * l:D * l + D] for l in range(module.num_layers)]
    if form is None:
        return [_rebuild(("bidirectional", (), (), ()) if D == 2 else ("cell",), layer)
                for layer in per_layer]
    layers = [_rebuild(f, layer) for f, layer in zip(form.layers, per_layer)]
    return layers[0] if form.single else layers


@dataclasses.dataclass(frozen=True)
class _FlaxForm:
    """What ``from_flax`` was given, for ``to_flax``: one cell or a list (`single`), each
    layer as ``_layer_form`` describes it, and the cells' class. (Not a pytree: nnx keeps
    it as a static attribute.)"""

    single: bool
    layers: tuple
    cell_type: type


_RNN_OPTIONS = ("time_major", "return_carry", "reverse", "keep_order", "unroll")


def _options(layer, names):
    """`layer`'s options `names` as ``((name, value), ...)``: hashable, as the static
    ``_FlaxForm`` must be."""
    return tuple((name, getattr(layer, name)) for name in names)


def _layer_form(layer):
    """``("cell",)``, ``("rnn", options)`` or ``("bidirectional", options, forward RNN's
    options, backward RNN's options)``."""
    if isinstance(layer, nnx.Bidirectional):
        return ("bidirectional", _options(layer, ("time_major", "return_carry")),
                _options(layer.forward_rnn, _RNN_OPTIONS),
                _options(layer.backward_rnn, _RNN_OPTIONS))
    if isinstance(layer, nnx.RNN):
        return ("rnn", _options(layer, _RNN_OPTIONS))
    return ("cell",)


def _rebuild(form, cells):
    """One layer of `form` (``_layer_form``) around its `cells` (one, or two)."""
    if form[0] == "cell":
        return cells[0]
    if form[0] == "rnn":
        return nnx.RNN(cells[0], **dict(form[1]))
    _, options, forward, backward = form
    return nnx.Bidirectional(nnx.RNN(cells[0], **dict(forward)),
                             nnx.RNN(cells[1], **dict(backward)), **dict(options))


def _directions(layer, index):
    """The cells of one layer: ``[cell]`` or ``[forward, backward]``."""
    if isinstance(layer, nnx.Bidirectional):
        if layer.merge_fn.__name__ != "_concatenate":
            raise ValueError(f"layers[{index}]: an nnx.Bidirectional must concatenate its "
                             f"directions (the default merge_fn), got {layer.merge_fn!r}")
        return [_rnn_cell(layer.forward_rnn, index, backward=False),
                _rnn_cell(layer.backward_rnn, index, backward=True)]
    return [_rnn_cell(layer, index, backward=False)]


def _rnn_cell(layer, index, backward):
    """The cell of one direction: an ``nnx.RNN``'s, or `layer` itself if a cell."""
    if isinstance(layer, nnx.RNN):
        if layer.reverse and not backward:
            raise ValueError(f"layers[{index}]: an nnx.RNN(reverse=True) layer alone runs "
                             "backward only, which cuDNN's stack has no layer for")
        return layer.cell
    return layer
