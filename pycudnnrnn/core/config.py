"""The static description of one RNN: what the op's attributes and shapes determine.

`Attributes` are the op's nine attributes as a caller gives them, one hashable object
that the adapters pass whole (``checks.check_attributes`` validates one and
``checks.check_forward`` turns it and the arrays into a `Problem`). `RNNConfig` is built
only by ``pycudnnrnn.core.checks`` (which validates it) and read by everything else:
the params layout, both backends and the descriptor cache, for which it is the hashable
key. `Problem` adds the data's shapes, dtype and lengths: what a validated call (or a
plan) hands a backend.
"""

from __future__ import annotations

import dataclasses

import numpy as np

RNN_MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
INPUT_MODES = ("linear_input", "skip_input", "auto_select")
DIRECTIONS = ("unidirectional", "bidirectional")

#: Gate names in cuDNN's (and TensorFlow's canonical) order, per mode.
GATES = {
    "lstm": ("i", "f", "c", "o"),
    "gru": ("r", "z", "h"),
    "rnn_tanh": ("h",),
    "rnn_relu": ("h",),
}


@dataclasses.dataclass(frozen=True)
class Attributes:
    """The op's attributes, with TensorFlow's names and the library's defaults.

    Hashable: the static part of a call, what a framework's trace or cache is keyed by.
    Made as the caller gives them; ``checks.check_attributes`` gives a validated copy.

    Attributes
    ----------
    rnn_mode, input_mode, direction : str
    dropout : float
    seed, seed2 : int
        TensorFlow's two dropout seeds (``checks.dropout_seed`` combines them).
    num_proj : int
    time_major, is_training : bool
    """

    rnn_mode: str = "lstm"
    input_mode: str = "linear_input"
    direction: str = "unidirectional"
    dropout: float = 0.0
    seed: int = 0
    seed2: int = 0
    num_proj: int = 0
    time_major: bool = True
    is_training: bool = True

    @property
    def lstm(self) -> bool:
        return self.rnn_mode == "lstm"

    @property
    def num_dirs(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    def keywords(self) -> dict:
        """The attributes as keyword arguments of ``pycudnnrnn.forward``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes) -> "Attributes":
        """A copy with `changes`, as ``dataclasses.replace`` makes it but a quarter of
        its cost (no ``__init__`` again: a PyTorch call's path replaces twice)."""
        if not changes.keys() <= _ATTRIBUTE_NAMES:
            unknown = sorted(changes.keys() - _ATTRIBUTE_NAMES)[0]
            raise TypeError(f"Attributes has no attribute {unknown!r}")
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__, **changes)
        return copy

    def without_dropout(self) -> "Attributes":
        """The same call with no masks to draw: what inference and a single layer run."""
        return self.replace(dropout=0.0, seed=0, seed2=0)


_ATTRIBUTE_NAMES = frozenset(field.name for field in dataclasses.fields(Attributes))


@dataclasses.dataclass(frozen=True)
class RNNConfig:
    """Everything that fixes the params layout and the computation, but no data.

    Attributes
    ----------
    rnn_mode : {"lstm", "gru", "rnn_tanh", "rnn_relu"}
    skip_input : bool
        True for ``skip_input`` (``auto_select`` already resolved).
    bidirectional : bool
    num_layers, num_units, input_size : int
    num_proj : int
        0 when there is no projection.
    dropout : float
        Probability of dropping a unit of a layer's input (layers after the first).
    seed : int
        The combined 64-bit dropout seed.
    """

    rnn_mode: str
    skip_input: bool
    bidirectional: bool
    num_layers: int
    num_units: int
    input_size: int
    num_proj: int = 0
    dropout: float = 0.0
    seed: int = 0

    @property
    def num_dirs(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def num_gates(self) -> int:
        return len(GATES[self.rnn_mode])

    @property
    def state_size(self) -> int:
        """P: the width of h (num_proj with a projection, else num_units)."""
        return self.num_proj or self.num_units

    @property
    def num_pseudo_layers(self) -> int:
        return self.num_layers * self.num_dirs

    @property
    def is_lstm(self) -> bool:
        return self.rnn_mode == "lstm"

    def layer_input_size(self, layer: int) -> int:
        """Width of the input of `layer`: input_size for layer 0, D·P after."""
        return self.input_size if layer == 0 else self.num_dirs * self.state_size

    def has_input_matrices(self, layer: int) -> bool:
        """Whether `layer` has input matrices (skip_input drops them on layer 0)."""
        return not (self.skip_input and layer == 0)

    def with_dropout(self, dropout: float, seed: int) -> "RNNConfig":
        return dataclasses.replace(self, dropout=dropout, seed=seed)

    def __repr__(self):
        """The sizes and mode, then only what differs from the defaults."""
        fields = [f"rnn_mode={self.rnn_mode!r}"] + \
            (["skip_input=True"] if self.skip_input else []) + \
            (["bidirectional=True"] if self.bidirectional else []) + \
            [f"num_layers={self.num_layers}", f"num_units={self.num_units}",
             f"input_size={self.input_size}"] + \
            [f"{name}={getattr(self, name)!r}" for name in ("num_proj", "dropout", "seed")
             if getattr(self, name)]
        return f"RNNConfig({', '.join(fields)})"


def describe_lengths(lengths) -> str:
    """Sequence lengths in a repr: all of a few, else the first and last with the count
    and range (a batch of thousands stays one short line)."""
    if lengths is None:
        return "None"
    values = [int(n) for n in lengths]
    if len(values) <= 8:
        return str(values)
    return (f"[{values[0]}, {values[1]}, ..., {values[-1]}] ({len(values)} lengths in "
            f"[{min(values)}, {max(values)}])")


@dataclasses.dataclass(frozen=True)
class Problem:
    """A validated call: the configuration plus the data's shapes.

    Attributes
    ----------
    config : RNNConfig
    max_time, batch_size : int
        T and B.
    time_major : bool
    dtype : numpy.dtype
        The data's dtype (float16, bfloat16, float32 or float64).
    lengths : numpy.ndarray or None
        int64 [B] sequence lengths; None when every sequence has length T.
    is_training : bool
    """

    config: RNNConfig
    max_time: int
    batch_size: int
    time_major: bool
    dtype: np.dtype
    lengths: np.ndarray | None
    is_training: bool = True

    def data_shape(self, width: int) -> tuple:
        """Shape of input/output-like data of the given last dimension."""
        T, B = self.max_time, self.batch_size
        return (T, B, width) if self.time_major else (B, T, width)

    def state_shape(self, width: int) -> tuple:
        """Shape of input_h/input_c-like states of the given last dimension."""
        LD, B = self.config.num_pseudo_layers, self.batch_size
        return (LD, B, width) if self.time_major else (B, LD, width)

    def __repr__(self):
        return (f"Problem({self.config!r}, max_time={self.max_time}, batch_size="
                f"{self.batch_size}, time_major={self.time_major}, dtype={np.dtype(self.dtype).name}, "
                f"lengths={describe_lengths(self.lengths)}, is_training={self.is_training})")

    @property
    def dropout_layers(self) -> range:
        """The layers whose input dropout masks: every layer after the first, in
        training with dropout; none otherwise."""
        if self.is_training and self.config.dropout > 0:
            return range(1, self.config.num_layers)
        return range(0)

    @property
    def full_lengths(self) -> np.ndarray:
        """The lengths as an array, T for every sequence when none were given."""
        if self.lengths is None:
            return np.full(self.batch_size, self.max_time, dtype=np.int64)
        return self.lengths
