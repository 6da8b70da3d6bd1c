"""Flax's own RNN cells ↔ per-pseudo-layer :class:`~pycudnnrnn.flax.blocks.Blocks`.

What each Flax cell computes, and where its weights go in cuDNN's two-bias form:

=====================  ==========================================  ==========================
Flax cell              math (Flax 0.12 source)                     biases
=====================  ==========================================  ==========================
``OptimizedLSTMCell``  ``dense_i(x) + dense_h(h)`` split i, f, g,  ``dense_h.bias`` → ``b_R``;
/ ``LSTMCell``         o; carry ``(c, h)``                         ``b_W`` = 0. Back: the sum
``GRUCell``            ``n = tanh(W_in x + b_in + r·(W_hn h))``    ``dense_i.bias`` → ``b_W``;
                       (``dense_h`` has no bias)                   ``b_R`` = 0 (see below)
``SimpleCell``         ``act(dense_i(x) + dense_h(h))``            ``dense_i.bias`` → ``b_W``
=====================  ==========================================  ==========================

cuDNN's GRU is the reset-after form with a recurrent bias inside the reset product,
``n = tanh(W_h x + b_Wh + r·(R_h h + b_Rh))``: Flax's ``GRUCell`` is that with ``b_R = 0``.
Going back, ``b_Rr`` and ``b_Rz`` add to the input bias exactly; a nonzero ``b_Rh`` cannot,
so then the cell's ``dense_h`` is given a bias (``GRUCell`` adds ``dense_h``'s output into
``r·(…)`` whole, so with a bias it computes cuDNN's formula, as its docstring writes it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .blocks import Blocks

#: Our rnn_mode for each Flax cell class.
CELL_MODES = {nnx.OptimizedLSTMCell: "lstm", nnx.LSTMCell: "lstm", nnx.GRUCell: "gru",
              nnx.SimpleCell: "simple"}
_LSTM_GATES = ("i", "f", "g", "o")


def cell_mode(cell) -> str:
    """``"lstm"``, ``"gru"``, ``"rnn_tanh"`` or ``"rnn_relu"`` for a Flax cell we can run.

    Raises
    ------
    TypeError
        For anything but Flax's four cells.
    ValueError
        For a cell whose functions differ from cuDNN's (gate_fn other than sigmoid,
        activation other than tanh, a SimpleCell other than tanh/relu or with
        ``residual=True``).
    """
    mode = CELL_MODES.get(type(cell))
    if mode is None:
        raise TypeError(f"layers: expected Flax's OptimizedLSTMCell, LSTMCell, GRUCell or "
                        f"SimpleCell (alone, in an nnx.RNN or in an nnx.Bidirectional), got "
                        f"{type(cell).__qualname__}")
    if mode == "simple":
        if cell.residual:
            raise ValueError("layers: SimpleCell(residual=True) adds h to the pre-activation, "
                             "which cuDNN's RNN does not")
        acts = {jnp.tanh: "rnn_tanh", nnx.tanh: "rnn_tanh", jax.nn.relu: "rnn_relu",
                nnx.relu: "rnn_relu"}
        if cell.activation_fn not in acts:
            raise ValueError(f"layers: cuDNN's RNN has tanh or relu, got a SimpleCell with "
                             f"activation_fn={cell.activation_fn!r}")
        return acts[cell.activation_fn]
    if cell.gate_fn not in (jax.nn.sigmoid, nnx.sigmoid) or \
            cell.activation_fn not in (jnp.tanh, nnx.tanh):
        raise ValueError(f"layers: cuDNN's {mode.upper()} has sigmoid gates and tanh, got a "
                         f"{type(cell).__name__} with gate_fn={cell.gate_fn!r} and "
                         f"activation_fn={cell.activation_fn!r}")
    return mode


def _value(param):
    return None if param is None else param[...]


def cell_blocks(cell) -> Blocks:
    """The weights of one Flax cell in cuDNN's two-bias form."""
    if isinstance(cell, nnx.LSTMCell):
        kernel_i = jnp.concatenate([getattr(cell, "i" + g + ("_" if g == "f" else "")).kernel[...]
                                    for g in _LSTM_GATES], axis=-1)
        kernel_h = jnp.concatenate([getattr(cell, "h" + g).kernel[...] for g in _LSTM_GATES], -1)
        bias_h = jnp.concatenate([getattr(cell, "h" + g).bias[...] for g in _LSTM_GATES])
        return Blocks(kernel_i, kernel_h, None, jnp.zeros_like(bias_h), bias_h)
    kernel_i, kernel_h = cell.dense_i.kernel[...], cell.dense_h.kernel[...]
    bias_i, bias_h = _value(cell.dense_i.bias), _value(cell.dense_h.bias)
    zeros = jnp.zeros((kernel_h.shape[-1],), kernel_h.dtype)
    return Blocks(kernel_i, kernel_h, None, zeros if bias_i is None else bias_i,
                  zeros if bias_h is None else bias_h)


def make_cell(blocks: Blocks, rnn_mode: str, *, cell_type=None, dtype=None, param_dtype):
    """A Flax cell computing what one pseudo-layer of `blocks` computes.

    Parameters
    ----------
    blocks : Blocks
        Without a projection (Flax's cells have none).
    rnn_mode : str
    cell_type : type, optional
        ``nnx.OptimizedLSTMCell`` (the default for LSTM) or ``nnx.LSTMCell``; for the other
        modes only their one cell class.
    dtype, param_dtype
        The cell's.
    """
    kind = {"lstm": nnx.OptimizedLSTMCell, "gru": nnx.GRUCell}.get(rnn_mode, nnx.SimpleCell)
    cell_type = cell_type or kind
    allowed = (nnx.OptimizedLSTMCell, nnx.LSTMCell) if rnn_mode == "lstm" else (kind,)
    if cell_type not in allowed:
        raise ValueError(f"cell_type: a {rnn_mode} layer converts to "
                         f"{' or '.join(c.__name__ for c in allowed)}, got {cell_type!r}")
    in_features, H = blocks.kernel_i.shape[0], blocks.kernel_h.shape[0]
    options = dict(dtype=dtype, param_dtype=param_dtype)
    if rnn_mode.startswith("rnn_"):
        options["activation_fn"] = nnx.relu if rnn_mode == "rnn_relu" else nnx.tanh
    # Built abstract (shapes only: no initializer runs), then every Param is set.
    cell = nnx.eval_shape(lambda: cell_type(in_features, H, rngs=nnx.Rngs(0), **options))
    put = lambda variable, array: variable.set_value(jnp.asarray(array, param_dtype))
    if rnn_mode == "lstm":
        bias = blocks.bias_i + blocks.bias_h  # Flax's LSTM has one bias per gate
        if cell_type is nnx.LSTMCell:
            for g, k_i, k_h, b in zip(_LSTM_GATES, jnp.split(blocks.kernel_i, 4, -1),
                                      jnp.split(blocks.kernel_h, 4, -1), jnp.split(bias, 4)):
                put(getattr(cell, "i" + g + ("_" if g == "f" else "")).kernel, k_i)
                put(getattr(cell, "h" + g).kernel, k_h)
                put(getattr(cell, "h" + g).bias, b)
        else:
            put(cell.dense_i.kernel, blocks.kernel_i)
            put(cell.dense_h.kernel, blocks.kernel_h)
            put(cell.dense_h.bias, bias)
        return cell
    put(cell.dense_i.kernel, blocks.kernel_i)
    put(cell.dense_h.kernel, blocks.kernel_h)
    if rnn_mode == "gru":
        H3 = blocks.bias_h.shape[0]
        b_rh = blocks.bias_h[2 * H3 // 3:]
        if np.any(np.asarray(b_rh, np.float32) != 0):  # see the module docstring
            cell.dense_h = nnx.eval_shape(lambda: nnx.Linear(
                H, H3, use_bias=True, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0)))
            put(cell.dense_h.kernel, blocks.kernel_h)
            put(cell.dense_h.bias, blocks.bias_h)
            put(cell.dense_i.bias, blocks.bias_i)
        else:
            put(cell.dense_i.bias, blocks.bias_i + blocks.bias_h.at[2 * H3 // 3:].set(0))
        return cell
    put(cell.dense_i.bias, blocks.bias_i + blocks.bias_h)
    return cell
