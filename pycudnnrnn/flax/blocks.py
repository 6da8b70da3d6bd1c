"""The params buffer seen as Flax sees an RNN cell: kernels ``[in, G·H]``, biases ``[G·H]``.

Flax's cells multiply ``x @ kernel`` with a kernel of shape ``[in_features, G·H]``, gates
side by side along the last axis, in the same order as cuDNN (LSTM i, f, g, o; GRU r, z,
n). cuDNN keeps the same gates stacked as ``[G·H, in]`` (``pycudnnrnn.core.layout``), so each
Flax kernel is the transpose of one stacked block of the buffer, and nothing is
reordered. Per pseudo-layer (``k = layer · D + direction``) a :class:`Blocks` holds:

=============  ==============  =====================================================
name           shape           cuDNN piece
=============  ==============  =====================================================
``kernel_i``   ``[in, G·H]``   input matrices (``in`` = input_size, or D·P after layer 0)
``kernel_h``   ``[P, G·H]``    recurrent matrices
``kernel_p``   ``[H, P]``      projection matrix (LSTM with ``num_proj``), else None
``bias_i``     ``[G·H]``       input biases  (cuDNN's ``b_W``)
``bias_h``     ``[G·H]``       recurrent biases (cuDNN's ``b_R``)
=============  ==============  =====================================================

Everything here is JAX: slicing and concatenation, so gradients pass through.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ..core import checks, layout
from ..core.config import RNNConfig


@dataclasses.dataclass
class Blocks:
    """One pseudo-layer's weights in Flax's orientation (see the module docstring)."""

    kernel_i: jax.Array
    kernel_h: jax.Array
    kernel_p: jax.Array | None
    bias_i: jax.Array
    bias_h: jax.Array

    def astype(self, dtype) -> "Blocks":
        cast = lambda a: None if a is None else jnp.asarray(a, dtype)
        return Blocks(*(cast(getattr(self, f.name)) for f in dataclasses.fields(self)))


@functools.lru_cache(maxsize=256)
def config(rnn_mode: str, num_layers: int, num_units: int, input_size: int,
           bidirectional: bool, num_proj: int) -> RNNConfig:
    """The ``RNNConfig`` of a module (always linear input: Flax's cells have input kernels)."""
    return checks.make_config(rnn_mode=rnn_mode, num_layers=num_layers, num_units=num_units,
                              input_size=input_size, input_mode="linear_input",
                              direction="bidirectional" if bidirectional else "unidirectional",
                              num_proj=num_proj)


def unpack(params, cfg: RNNConfig) -> list[Blocks]:
    """The flat `params` as one :class:`Blocks` per pseudo-layer (views, transposed)."""
    result = []
    for b in layout.pseudo_layer_blocks(cfg):
        view = lambda block: None if block is None else block.view(params)
        result.append(Blocks(kernel_i=view(b.w_input).T, kernel_h=view(b.w_recurrent).T,
                             kernel_p=None if b.w_projection is None else view(b.w_projection).T,
                             bias_i=view(b.b_input), bias_h=view(b.b_recurrent)))
    return result


def pack(blocks: list[Blocks], cfg: RNNConfig) -> jax.Array:
    """The flat params of `blocks` (the inverse of :func:`unpack`), in cuDNN's layout."""
    pieces = []
    for b, where in zip(blocks, layout.pseudo_layer_blocks(cfg)):
        pieces += [(where.w_input, b.kernel_i.T), (where.w_recurrent, b.kernel_h.T),
                   (where.b_input, b.bias_i), (where.b_recurrent, b.bias_h)]
        if where.w_projection is not None:
            pieces.append((where.w_projection, b.kernel_p.T))
    for where, array in pieces:
        if tuple(array.shape) != tuple(where.shape):
            raise ValueError(f"weights: expected a block of shape {where.shape}, got "
                             f"{tuple(array.shape)}")
    pieces.sort(key=lambda piece: piece[0].offset)  # the blocks tile the buffer in order
    flat = jnp.concatenate([jnp.ravel(array) for _, array in pieces])
    assert flat.shape == (layout.params_size(cfg),), (flat.shape, layout.params_size(cfg))
    return flat


def layer_slices(cfg: RNNConfig, layer: int) -> tuple[slice, slice]:
    """Where the matrices and the biases of `layer` (all its directions) lie in params.

    Concatenated, the two slices are the params of a one-layer network with that layer's
    input width: cuDNN puts all matrices first, then all biases, pseudo-layer by
    pseudo-layer, so a layer's pieces are two contiguous runs in the same order.
    """
    D = cfg.num_dirs
    mine = [p for p in layout.pieces(cfg) if p.pseudo_layer // D == layer]
    weights = [p for p in mine if p.kind == "weight"]
    biases = [p for p in mine if p.kind == "bias"]
    return (slice(weights[0].offset, weights[-1].stop), slice(biases[0].offset, biases[-1].stop))


def _orthogonal(key, shape, dtype):
    """Flax's orthogonal initializer, drawn in float32 and cast (as Flax's own
    ``modified_orthogonal`` does: a QR in half precision is not available everywhere)."""
    return jax.nn.initializers.orthogonal()(key, shape, jnp.float32).astype(dtype)


def initialize(rngs, cfg: RNNConfig, param_dtype) -> jax.Array:
    """Fresh params drawn as Flax's own cells draw theirs, layer by layer.

    Each pseudo-layer takes keys from ``rngs.params()`` in the order its Flax cell would
    (``OptimizedLSTMCell``, ``GRUCell``, ``SimpleCell``; one key for every ``Linear``
    kernel and bias, zeros or not), so this module and a list of those cells built in
    order from equal ``nnx.Rngs`` start from the same weights. Input kernels (and the
    projection) are LeCun normal, recurrent kernels orthogonal, biases zero.
    """
    lecun = jax.nn.initializers.lecun_normal()
    G, H, P = cfg.num_gates, cfg.num_units, cfg.state_size
    blocks = []
    for k in range(cfg.num_pseudo_layers):
        width = cfg.layer_input_size(k // cfg.num_dirs)
        zeros = jnp.zeros((G * H,), param_dtype)
        draw_i = lambda: lecun(rngs.params(), (width, G * H), param_dtype)
        draw_h = lambda: _orthogonal(rngs.params(), (P, G * H), param_dtype)
        if cfg.rnn_mode == "lstm":  # dense_i (no bias), dense_h (kernel, bias)
            kernel_i = draw_i()
            kernel_h = draw_h()
            rngs.params()
            kernel_p = lecun(rngs.params(), (H, P), param_dtype) if cfg.num_proj else None
        elif cfg.rnn_mode == "gru":  # dense_i (kernel, bias), dense_h (no bias)
            kernel_i = draw_i()
            rngs.params()
            kernel_h = draw_h()
            kernel_p = None
        else:  # SimpleCell makes dense_h (no bias) first, then dense_i (kernel, bias)
            kernel_h = draw_h()
            kernel_i = draw_i()
            rngs.params()
            kernel_p = None
        blocks.append(Blocks(kernel_i, kernel_h, kernel_p, zeros, zeros))
    return pack(blocks, cfg)
