"""Where every matrix and bias lives in the opaque ``params`` buffer.

The buffer mirrors cuDNN's weight space, in the order JAX's ``jax.experimental.rnn``
documents after testing it against cuDNN::

    [ matrices of pseudo-layer 0 | matrices of pseudo-layer 1 | ... |
      biases of pseudo-layer 0   | biases of pseudo-layer 1   | ... ]

Pseudo-layer ``k = layer * D + direction``. Within one pseudo-layer the matrices are
the input matrices gate by gate, then the recurrent matrices gate by gate, then (LSTM
with projection) the projection matrix; the biases are the input biases gate by gate,
then the recurrent biases gate by gate. Every matrix is row-major ``[out, in]``.

Example: a one-layer unidirectional GRU with input_size 3 and num_units 2 has
``3·(2·3) + 3·(2·2) = 30`` matrix elements followed by ``2·3·2 = 12`` bias elements;
``W_z`` (the update gate's input matrix) is ``params[6:12].reshape(2, 3)``.

Two placements are not documented by NVIDIA and are made here and nowhere else: the
projection matrix ``[P, H]`` follows the recurrent matrices of its pseudo-layer, and
``skip_input`` removes layer 0's input matrices while keeping its input biases. Both were
checked against cuDNN 9.19 on a GPU (``cudnnGetRNNWeightParams``, every mode and option,
2026-11-30; see docs/gpu-validation.md), and the cuDNN backend checks this table again
for every new RNN descriptor.

Because the canonical lists (see ``canonical_shapes``) are in the same order as the
buffer, converting between them is a concatenation or a split.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import threading

from .config import GATES, RNNConfig

#: Most table entries (pieces, or pseudo-layers of blocks) each cache below holds in
#: all. A bound on entries rather than on configurations: one 100 000-layer table alone
#: is 1.6 million pieces (about 1 GiB). A table larger than this is built but not kept.
CACHE_ENTRIES = 1 << 15


def _cached_by_size(function):
    """An LRU cache of `function(config)`, bounded by the total length of what it holds.

    The key drops dropout and seed, which do not change the layout, so calls that differ
    only in them share an entry. Thread-safe; ``cache_clear()`` empties it and
    ``cache_entries()`` says how many entries it holds.
    """
    cache, lock, held = collections.OrderedDict(), threading.Lock(), [0]

    @functools.wraps(function)
    def cached(config: RNNConfig):
        key = config if not (config.dropout or config.seed) else config.with_dropout(0.0, 0)
        with lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        value = function(key)
        if len(value) <= CACHE_ENTRIES:
            with lock:
                if key not in cache:
                    cache[key] = value
                    held[0] += len(value)
                    while held[0] > CACHE_ENTRIES:
                        held[0] -= len(cache.popitem(last=False)[1])
        return value

    def cache_clear():
        with lock:
            cache.clear()
            held[0] = 0

    cached.cache_clear = cache_clear
    cached.cache_entries = lambda: held[0]
    return cached


@dataclasses.dataclass(frozen=True)
class Piece:
    """One matrix or bias vector of the params buffer.

    Attributes
    ----------
    kind : {"weight", "bias"}
    pseudo_layer : int
    role : {"input", "recurrent", "projection"}
    gate : str or None
        Gate name from ``pycudnnrnn.core.config.GATES``; None for the projection.
    shape : tuple of int
    offset : int
        Element offset in the buffer.
    """

    kind: str
    pseudo_layer: int
    role: str
    gate: str | None
    shape: tuple
    offset: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def stop(self) -> int:
        return self.offset + self.size


@dataclasses.dataclass(frozen=True)
class Block:
    """A run of consecutive pieces of one pseudo-layer, viewed as one array.

    The gate matrices of one role are consecutive, so ``params[offset:stop]`` reshaped
    to `shape` stacks them as ``[G·H, in]`` (or ``[G·H]`` for biases), gates in cuDNN
    order. That is how the backends use the buffer.
    """

    offset: int
    shape: tuple

    @property
    def stop(self) -> int:
        return self.offset + math.prod(self.shape)

    def view(self, params):
        """The block of `params` (NumPy or CuPy 1-D array) as a reshaped view."""
        return params[self.offset:self.stop].reshape(self.shape)

    def __repr__(self):
        return f"Block({self._view_text()})"

    def _view_text(self) -> str:
        return f"params[{self.offset}:{self.stop}].reshape({', '.join(map(str, self.shape))})"


@dataclasses.dataclass(frozen=True)
class PseudoLayerBlocks:
    """The stacked blocks of one pseudo-layer; absent ones are None."""

    w_input: Block | None
    w_recurrent: Block
    w_projection: Block | None
    b_input: Block
    b_recurrent: Block

    def __repr__(self):
        """Each block as the view of params it is; absent ones left out."""
        blocks = ", ".join(f"{field.name}={block._view_text()}"
                           for field in dataclasses.fields(self)
                           if (block := getattr(self, field.name)) is not None)
        return f"PseudoLayerBlocks({blocks})"


def _pseudo_layer_shapes(config: RNNConfig, k: int):
    """(role, gate, shape) of the matrices, then of the biases, of pseudo-layer k."""
    gates = GATES[config.rnn_mode]
    H, P = config.num_units, config.state_size
    layer = k // config.num_dirs
    matrices = []
    if config.has_input_matrices(layer):
        matrices += [("input", g, (H, config.layer_input_size(layer))) for g in gates]
    matrices += [("recurrent", g, (H, P)) for g in gates]
    if config.num_proj:
        matrices.append(("projection", None, (P, H)))
    biases = [("input", g, (H,)) for g in gates] + [("recurrent", g, (H,)) for g in gates]
    return matrices, biases


@_cached_by_size
def pieces(config: RNNConfig) -> tuple[Piece, ...]:
    """The whole offset table: all matrices, then all biases, in buffer order."""
    per_layer = [_pseudo_layer_shapes(config, k) for k in range(config.num_pseudo_layers)]
    table, offset = [], 0
    for kind, index in (("weight", 0), ("bias", 1)):
        for k, shapes in enumerate(per_layer):
            for role, gate, shape in shapes[index]:
                piece = Piece(kind, k, role, gate, shape, offset)
                table.append(piece)
                offset = piece.stop
    return tuple(table)


def params_size(config: RNNConfig) -> int:
    """Number of elements of the params buffer, from sizes alone (no table is built).

    The sum over ``pieces(config)``; ``tests/test_layout.py`` holds the two together.
    """
    G, H, P, D, L = (config.num_gates, config.num_units, config.state_size, config.num_dirs,
                     config.num_layers)
    per_pseudo_layer = G * H * P + (P * H if config.num_proj else 0) + 2 * G * H
    input_matrices = (0 if config.skip_input else G * H * config.input_size) + \
        (L - 1) * G * H * D * P
    return D * (L * per_pseudo_layer + input_matrices)


def canonical_shapes(config: RNNConfig) -> tuple[list[tuple], list[tuple]]:
    """Shapes of the canonical ``weights`` and ``biases`` lists, in order."""
    table = pieces(config)
    return ([p.shape for p in table if p.kind == "weight"],
            [p.shape for p in table if p.kind == "bias"])


@_cached_by_size
def pseudo_layer_blocks(config: RNNConfig) -> tuple[PseudoLayerBlocks, ...]:
    """For each pseudo-layer, its matrices and biases as stacked blocks."""
    runs = collections.defaultdict(list)  # one pass over the table: linear in layers
    for p in pieces(config):
        runs[p.pseudo_layer, p.kind, p.role].append(p)

    def block(k, kind, role):
        run = runs.get((k, kind, role))
        if not run:
            return None
        rows = sum(p.shape[0] for p in run)
        return Block(run[0].offset, (rows,) + run[0].shape[1:])

    return tuple(PseudoLayerBlocks(
        w_input=block(k, "weight", "input"),
        w_recurrent=block(k, "weight", "recurrent"),
        w_projection=block(k, "weight", "projection"),
        b_input=block(k, "bias", "input"),
        b_recurrent=block(k, "bias", "recurrent"),
    ) for k in range(config.num_pseudo_layers))


#: The names of a pseudo-layer's blocks, ``PseudoLayerBlocks``' fields.
BLOCK_NAMES = tuple(field.name for field in dataclasses.fields(PseudoLayerBlocks))


def tiles(pseudo_layers) -> list:
    """The params buffer cut at every block's edges, in order: ``(offset, stop, k,
    name)`` for pseudo-layer k's block `name`, and ``(offset, stop, None, None)`` for a
    gap no block covers. What one ``split`` of the buffer into every block needs (its
    gradient is then one concatenation, where a slice per block would each add a
    zero-padded copy of the whole buffer)."""
    blocks = sorted((b.offset, b.stop, k, name) for k, layer in enumerate(pseudo_layers)
                    for name in BLOCK_NAMES if (b := getattr(layer, name)) is not None)
    found, previous = [], 0
    for offset, stop, k, name in blocks:
        if offset != previous:
            found.append((previous, offset, None, None))
        found.append((offset, stop, k, name))
        previous = stop
    return found


def layer(config: RNNConfig, index: int) -> tuple[RNNConfig, slice, slice]:
    """Layer `index` of `config` as a network of its own (one layer, no dropout), and the
    slices of the params buffer that hold its matrices and its biases.

    Concatenated, the two slices are that one-layer network's params buffer: a layer's
    pseudo-layers are consecutive in both halves of the buffer. Sizes alone, as
    ``params_size``: they may be symbolic (a ``torch.compile`` trace's).
    """
    if not 0 <= index < config.num_layers:
        raise IndexError(f"layer {index} of a {config.num_layers}-layer network")
    G, H, P, D = config.num_gates, config.num_units, config.state_size, config.num_dirs

    def matrices(layer):  # elements of one pseudo-layer's matrices
        inputs = G * H * config.layer_input_size(layer) if config.has_input_matrices(layer) \
            else 0
        return inputs + G * H * P + (P * H if config.num_proj else 0)

    before = D * (matrices(0) + (index - 1) * matrices(1)) if index else 0
    all_matrices = D * (matrices(0) + (config.num_layers - 1) * matrices(1))
    biases = D * 2 * G * H  # one layer's
    alone = dataclasses.replace(config, num_layers=1, input_size=config.layer_input_size(index),
                                skip_input=config.skip_input and index == 0, dropout=0.0,
                                seed=0)
    return (alone, slice(before, before + D * matrices(index)),
            slice(all_matrices + index * biases, all_matrices + (index + 1) * biases))


def split(params, config: RNNConfig):
    """Canonical ``(weights, biases)`` lists as views of a 1-D `params` array."""
    weights, biases = [], []
    for p in pieces(config):
        (weights if p.kind == "weight" else biases).append(
            params[p.offset:p.stop].reshape(p.shape))
    return weights, biases
