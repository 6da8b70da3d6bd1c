"""The named results of ``forward`` and ``backprop``.

Named tuples: read them by name (``result.output_h``) or unpack them as before
(``y, hy, cy, reserve = forward(...)``). Their repr shows each array's dtype and shape,
not its values: ``ForwardResult(output=float32[40, 5, 32], ...)``.
"""

from __future__ import annotations

from typing import Any, NamedTuple


def describe(array) -> str:
    """An array as its dtype and shape, ``float32[40, 5, 32]``; its library first when it
    is not NumPy's (``torch float32[40, 5, 32]``)."""
    if array is None:
        return "None"
    shape, dtype = getattr(array, "shape", None), getattr(array, "dtype", None)
    if shape is None or dtype is None:
        return type(array).__name__
    library = type(array).__module__.split(".")[0]
    library = {"numpy": "", "jaxlib": "jax "}.get(library, library + " ")
    dtype = str(dtype).rsplit(".", 1)[-1]  # torch.float32 -> float32
    return f"{library}{dtype}[{', '.join(str(n) for n in shape)}]"


def _repr(result) -> str:
    fields = ", ".join(f"{name}={describe(value)}" for name, value in zip(result._fields, result))
    return f"{type(result).__name__}({fields})"


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

    def __repr__(self):
        return _repr(self)


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

    def __repr__(self):
        return _repr(self)
