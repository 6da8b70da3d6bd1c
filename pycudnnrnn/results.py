"""The named results of ``forward`` and ``backprop``.

Named tuples: read them by name (``result.output_h``) or unpack them as before
(``y, hy, cy, reserve = forward(...)``).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class ForwardResult(NamedTuple):
    """What ``pycudnnrnn.forward`` returns, in the caller's array type.

    Attributes
    ----------
    output : array
        ``[T, B, D·P]`` (``[B, T, D·P]`` if not time_major); zero past each length.
    output_h : array
        Final hidden states, shaped like input_h.
    output_c : array
        Final cell states, shaped like input_c (LSTM); empty ``(0,)`` otherwise.
    reserve_space : array
        Opaque uint8 for ``backprop``; empty when not is_training.
    """

    output: Any
    output_h: Any
    output_c: Any
    reserve_space: Any


class BackpropResult(NamedTuple):
    """What ``pycudnnrnn.backprop`` returns, in the caller's array type.

    Attributes
    ----------
    input_backprop : array
        Gradient of the input, shaped like it; zero past each length.
    input_h_backprop : array
        Gradient of input_h, shaped like it.
    input_c_backprop : array
        Gradient of input_c (LSTM); empty ``(0,)`` otherwise.
    params_backprop : array
        Gradient of params, 1-D like it.
    """

    input_backprop: Any
    input_h_backprop: Any
    input_c_backprop: Any
    params_backprop: Any
