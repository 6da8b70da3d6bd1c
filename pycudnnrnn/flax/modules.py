"""``LSTM``, ``GRU`` and ``SimpleRNN``: Flax NNX modules on ``pycudnnrnn.jax.rnn``.

One base class holds the constructor's checks, the one ``nnx.Param`` (the params buffer
in cuDNN's layout), the carry's conversion and the call; the three classes only name
their mode. The call follows ``nnx.RNN``'s (batch-major inputs ``[*batch, T, F]`` by
default, ``seq_lengths``, ``initial_carry``, ``return_carry``, ``time_major``) and
dropout follows ``nnx.Dropout``'s (``deterministic``, ``rngs``, ``model.eval()``).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .. import jax as rnn_jax
from ..core import checks
from ..jax.targets import WARN_LENGTHS
from . import blocks as _blocks
from . import conversion as _conversion

__all__ = ["LSTM", "GRU", "SimpleRNN"]

_FLOAT_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


def _positive_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


class _RNN(nnx.Module):
    """What ``LSTM``, ``GRU`` and ``SimpleRNN`` share (see their docstrings)."""

    _rnn_mode: str = ""

    def __init__(self, in_features, hidden_features, *, num_layers=1, bidirectional=False,
                 dropout_rate=0.0, num_proj=0, dtype=None, param_dtype=jnp.float32, rngs):
        if not isinstance(rngs, nnx.Rngs):
            raise TypeError(f"rngs: expected nnx.Rngs (its params stream draws the weights), "
                            f"got {type(rngs).__name__}")
        self.in_features = _positive_int("in_features", in_features)
        self.hidden_features = _positive_int("hidden_features", hidden_features)
        self.num_layers = _positive_int("num_layers", num_layers)
        if not isinstance(bidirectional, bool):
            raise TypeError(f"bidirectional: expected a bool, got {bidirectional!r}")
        self.bidirectional = bidirectional
        if isinstance(dropout_rate, bool) or not isinstance(dropout_rate, numbers.Real):
            raise TypeError(f"dropout_rate: expected a float in [0, 1), got {dropout_rate!r}")
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"dropout_rate: expected a float in [0, 1), got {dropout_rate!r}")
        self.dropout_rate = float(dropout_rate)
        self.num_proj = _positive_int("num_proj", num_proj, 0)
        if self.num_proj and self.num_proj >= self.hidden_features:
            raise ValueError(f"num_proj: expected 0 < num_proj < hidden_features="
                             f"{self.hidden_features}, got {self.num_proj}")
        for name, value in (("dtype", dtype), ("param_dtype", param_dtype)):
            if (value is not None or name == "param_dtype") and \
                    jnp.dtype(value) not in map(jnp.dtype, _FLOAT_DTYPES):
                raise TypeError(f"{name}: expected float16, bfloat16, float32 or float64, "
                                f"got {value!r}")
        self.dtype = dtype
        self.param_dtype = param_dtype
        # Like nnx.Dropout: training unless told otherwise (model.eval(), nnx.view or the
        # call's deterministic=True); the stream is forked so the module owns its count.
        self.deterministic = False
        self.rngs = rngs["dropout"].fork() if self.dropout_rate else nnx.data(None)
        self.params = nnx.Param(_blocks.initialize(rngs, self._config(), param_dtype))

    # ------------------------------------------------------------------ sizes

    def _config(self):
        return _blocks.config(self._rnn_mode, self.num_layers, self.hidden_features,
                              self.in_features, self.bidirectional, self.num_proj)

    @property
    def _num_dirs(self):
        return 2 if self.bidirectional else 1

    @property
    def _state_size(self):
        return self.num_proj or self.hidden_features

    @property
    def _lstm(self):
        return self._rnn_mode == "lstm"

    def set_view(self, deterministic: bool | None = None):
        """For ``nnx.view``: ``deterministic=True`` turns dropout off.

        Parameters
        ----------
        deterministic : bool, optional
        """
        if deterministic is not None:
            self.deterministic = deterministic

    # ------------------------------------------------------------------ carry

    def initialize_carry(self, input_shape, rngs=None, carry_init=None):
        """The initial carry, as Flax's cells make theirs (see the class docstring).

        Parameters
        ----------
        input_shape : tuple of int
            The shape of one time step of the input, ``(*batch, in_features)``, as
            ``nnx.RNN`` gives it to its cell.
        rngs : nnx.Rngs or nnx.RngStream, optional
            For `carry_init` (the ``carry`` stream of an ``nnx.Rngs``); unused for zeros.
        carry_init : initializer, optional
            ``carry_init(key, shape, dtype)`` for every state array (c before h, as
            Flax's LSTM cells); default zeros. Arrays are in ``param_dtype``.
        """
        batch_shape = tuple(input_shape[:-1])
        h, c = self._zero_states(math.prod(batch_shape), self.param_dtype)
        carry = self._carry_from_states(h, c, batch_shape)
        if carry_init is None:
            return carry
        stream = rngs.carry if isinstance(rngs, nnx.Rngs) else rngs
        if stream is None:
            raise ValueError("rngs: carry_init needs rngs to draw the initial carry")
        return jax.tree.map(lambda z: carry_init(stream(), z.shape, z.dtype), carry)

    def _carry_from_states(self, h, c, batch_shape):
        """cuDNN's stacked states ``[L·D, B, ·]`` → the nested carry."""
        per_pseudo_layer = []
        for k in range(h.shape[0]):
            h_k = h[k].reshape(batch_shape + h.shape[2:])
            per_pseudo_layer.append((c[k].reshape(batch_shape + c.shape[2:]), h_k)
                                    if self._lstm else h_k)
        D = self._num_dirs
        layers = [per_pseudo_layer[l * D] if D == 1 else tuple(per_pseudo_layer[l * D:l * D + D])
                  for l in range(self.num_layers)]
        return layers[0] if self.num_layers == 1 else tuple(layers)

    def _states_from_carry(self, carry, batch_shape, dtype):
        """The nested carry → cuDNN's stacked ``h [L·D, B, P]`` (and ``c [L·D, B, H]``)."""
        L, D, B = self.num_layers, self._num_dirs, math.prod(batch_shape)
        where = "initial_carry"

        def pieces(node, count, path, what):
            if count == 1:
                return [(node, path)]
            if not isinstance(node, (tuple, list)) or len(node) != count:
                got = f"{type(node).__name__} of {len(node)}" \
                    if isinstance(node, (tuple, list)) else type(node).__name__
                raise ValueError(f"{where}{path}: expected a tuple of {count} (one per "
                                 f"{what}), got {got}")
            return [(n, f"{path}[{i}]") for i, n in enumerate(node)]

        hs, cs = [], []
        for layer, path in pieces(carry, L, "", "layer"):
            for cell_carry, cell_path in pieces(layer, D, path, "direction"):
                if self._lstm:
                    if not isinstance(cell_carry, (tuple, list)) or len(cell_carry) != 2:
                        raise ValueError(f"{where}{cell_path}: an LSTM carry is Flax's (c, h), "
                                         f"got {type(cell_carry).__name__}")
                    c, h = cell_carry
                    cs.append(self._state(c, batch_shape, self.hidden_features,
                                          f"{where}{cell_path}[0] (c)"))
                    hs.append(self._state(h, batch_shape, self._state_size,
                                          f"{where}{cell_path}[1] (h)"))
                else:
                    hs.append(self._state(cell_carry, batch_shape, self._state_size,
                                          f"{where}{cell_path}"))
        h = jnp.stack(hs).reshape(L * D, B, self._state_size).astype(dtype)
        c = jnp.stack(cs).reshape(L * D, B, self.hidden_features).astype(dtype) \
            if self._lstm else None
        return h, c

    @staticmethod
    def _state(x, batch_shape, width, name):
        shape = getattr(x, "shape", None)
        if shape is None:
            raise TypeError(f"{name}: expected an array, got {type(x).__name__}")
        if tuple(shape) != tuple(batch_shape) + (width,):
            raise ValueError(f"{name}: expected shape {tuple(batch_shape) + (width,)}, "
                             f"got {tuple(shape)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name}: expected a floating dtype, got {x.dtype}")
        return x

    # ------------------------------------------------------------------ the call

    def __call__(self, inputs, *, seq_lengths=None, initial_carry=None, return_carry=False,
                 time_major=False, deterministic=None, rngs=None):
        """Run the network over `inputs`, as ``nnx.RNN`` does.

        Parameters
        ----------
        inputs : jax.Array
            ``[*batch, T, in_features]``, or ``[T, *batch, in_features]`` when
            `time_major` (any number of batch dimensions, none included).
        seq_lengths : jax.Array of int, optional
            Shape ``batch``: the valid length of each sequence, right-padded, 0 allowed;
            may be traced. Outputs at padded steps are 0 and the carry is that after each
            sequence's last valid step (the initial carry for length 0).
        initial_carry : optional
            The carry (see the class docstring); default zeros.
        return_carry : bool, default False
            Return ``(carry, outputs)`` instead of ``outputs``.
        time_major : bool, default False
        deterministic : bool, optional
            True: no dropout. Default: the module's ``deterministic`` attribute (False
            until ``model.eval()`` or ``nnx.view(model, deterministic=True)``).
        rngs : nnx.Rngs, nnx.RngStream or jax.Array, optional
            Where the dropout masks come from; default the stream the module was built
            with (its ``dropout`` stream, else its default one).

        Returns
        -------
        outputs : jax.Array
            ``[*batch, T, D·P]`` (``[T, *batch, D·P]`` time-major), D = 2 when
            bidirectional (forward then backward features, as ``nnx.Bidirectional``
            concatenates them), P = num_proj or hidden_features.
        carry
            Only with `return_carry`.
        """
        inputs = self._check_inputs(inputs)
        time_axis = 0 if time_major else inputs.ndim - 2
        batch_shape = inputs.shape[1:-1] if time_major else inputs.shape[:-2]
        T, B = inputs.shape[time_axis], math.prod(batch_shape)
        dtype = jnp.dtype(self.dtype) if self.dtype is not None else \
            jnp.result_type(inputs.dtype, self.params.dtype)  # Flax's promote_dtype
        x = inputs.astype(dtype).reshape((T, B, self.in_features) if time_major
                                         else (B, T, self.in_features))
        lengths, bad = self._check_lengths(seq_lengths, batch_shape, T)
        if initial_carry is None:
            h0, c0 = self._zero_states(B, dtype)
        else:
            h0, c0 = self._states_from_carry(initial_carry, batch_shape, dtype)
        params = self.params[...].astype(dtype)
        deterministic = self.deterministic if deterministic is None else deterministic
        if self.dropout_rate and not deterministic and self.num_layers > 1:
            y, h, c = self._layer_by_layer(x, h0, c0, params, lengths, time_major,
                                           self._dropout_key(rngs))
        else:
            y, h, c = self._run(x, h0, c0, params, lengths, time_major, self._config())
        if bad is not None:  # rows whose traced length was out of range: NaN, not an error
            nan = jnp.asarray(jnp.nan, y.dtype)
            y = jnp.where(bad[None, :, None] if time_major else bad[:, None, None], nan, y)
            h = jnp.where(bad[None, :, None], nan, h)
            c = jnp.where(bad[None, :, None], nan, c) if self._lstm else None
        y = y.reshape((T,) + batch_shape + y.shape[-1:] if time_major
                      else batch_shape + (T,) + y.shape[-1:])
        if not return_carry:
            return y
        return self._carry_from_states(h, c if self._lstm else None, batch_shape), y

    def _zero_states(self, B, dtype):
        LD = self._num_dirs * self.num_layers
        h = jnp.zeros((LD, B, self._state_size), dtype)
        return h, jnp.zeros((LD, B, self.hidden_features), dtype) if self._lstm else None

    def _check_inputs(self, inputs):
        if not hasattr(inputs, "shape") or not hasattr(inputs, "dtype"):
            raise TypeError(f"inputs: expected an array, got {type(inputs).__name__}")
        inputs = jnp.asarray(inputs)
        if inputs.ndim < 2:
            raise ValueError(f"inputs: expected [*batch, time, {self.in_features}] (at least "
                             f"2 dimensions), got shape {inputs.shape}")
        if inputs.shape[-1] != self.in_features:
            raise ValueError(f"inputs: expected {self.in_features} features (in_features) on "
                             f"the last axis, got shape {inputs.shape}")
        return inputs

    @staticmethod
    def _check_lengths(seq_lengths, batch_shape, max_time):
        """``(lengths [B] in their own integer type, bad rows or None)``.

        Known lengths out of ``[0, max_time]`` are refused by ``pycudnnrnn.jax.rnn`` (as
        given: int64 ``2**32 + 3`` is no 3). Traced ones cannot be refused without failing
        the whole computation, whose poisoned results ``nnx.jit`` would then write into
        the module (every later call, and its params, would raise). So they run as
        length 0, their rows come out NaN (``bad``), and a ``RuntimeWarning`` names the
        first of them when the computation runs; the rest of the batch and the module's
        state are what they would be.
        """
        if seq_lengths is None:
            return None, None
        lengths = jnp.asarray(seq_lengths)
        if not jnp.issubdtype(lengths.dtype, jnp.integer):
            raise TypeError(f"seq_lengths: expected integers, got dtype {lengths.dtype}")
        if lengths.shape != tuple(batch_shape):
            raise ValueError(f"seq_lengths: expected shape {tuple(batch_shape)} (the batch "
                             f"dimensions of inputs), got {lengths.shape}")
        lengths = lengths.reshape(-1)
        if not isinstance(seq_lengths, jax.core.Tracer):  # known: refused by value now
            checks.check_lengths(np.asarray(seq_lengths).reshape(-1), lengths.shape[0],
                                 max_time)
            return lengths, None
        # Compared in their own type, widened to 32 bits (max_time may not fit in 8 or 16)
        wide = lengths if lengths.dtype.itemsize >= 4 else lengths.astype(jnp.int32)
        bad = (wide > max_time) | (wide < 0) if jnp.issubdtype(
            wide.dtype, jnp.signedinteger) else wide > max_time
        jax.lax.cond(bad.any(), lambda: _warn_bad_lengths(lengths, max_time), lambda: None)
        return jnp.where(bad, jnp.zeros_like(lengths), lengths), bad

    def _dropout_key(self, rngs):
        """A key for this call's masks, as ``nnx.Dropout`` picks one."""
        rngs = self.rngs if rngs is None else rngs
        if isinstance(rngs, nnx.Rngs):
            return rngs["dropout"]()
        if isinstance(rngs, nnx.RngStream):
            return rngs()
        if isinstance(rngs, jax.Array):
            return rngs
        if rngs is None:
            raise ValueError("rngs: deterministic is False and dropout_rate > 0, but no rngs "
                             "was given to the call or the constructor")
        raise TypeError(f"rngs: expected nnx.Rngs, nnx.RngStream or a jax.Array key, got "
                        f"{type(rngs).__name__}")

    def _run(self, x, h0, c0, params, lengths, time_major, cfg):
        """One call of the op on stacked states ``[L·D, B, ·]``; returns the same layout."""
        if not time_major:  # the op's batch-major states are [B, L·D, ·]
            h0, c0 = jnp.swapaxes(h0, 0, 1), None if c0 is None else jnp.swapaxes(c0, 0, 1)
        y, h, c = rnn_jax.rnn(x, h0, c0, params, lengths, rnn_mode=cfg.rnn_mode,
                              direction="bidirectional" if cfg.bidirectional
                              else "unidirectional", num_proj=cfg.num_proj,
                              time_major=time_major, check_lengths=False)  # guarded above
        if not time_major:
            h = jnp.swapaxes(h, 0, 1)
            c = jnp.swapaxes(c, 0, 1) if self._lstm else None
        return y, h, c

    def _layer_by_layer(self, x, h0, c0, params, lengths, time_major, key):
        """Training with dropout: one call per layer, an ``nnx.Dropout``-style mask between.

        The op's seeds are compile-time attributes, so masks drawn by cuDNN (or the NumPy
        backend) would repeat at every step of a jitted loop; masks drawn here from a
        (traced) key change with the key, as Flax's do. cuDNN applies dropout where this
        does: on the input of every layer after the first.
        """
        D, keep = self._num_dirs, 1.0 - self.dropout_rate
        keys = jax.random.split(key, self.num_layers - 1)
        hs, cs = [], []
        for layer in range(self.num_layers):
            if layer:
                mask = jax.random.bernoulli(keys[layer - 1], keep, x.shape)
                x = jax.lax.select(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros_like(x))
            weights, biases = _blocks.layer_slices(self._config(), layer)
            cfg = _blocks.config(self._rnn_mode, 1, self.hidden_features, x.shape[-1],
                                 self.bidirectional, self.num_proj)
            states = slice(layer * D, layer * D + D)
            x, h, c = self._run(x, h0[states], None if c0 is None else c0[states],
                                jnp.concatenate([params[weights], params[biases]]), lengths,
                                time_major, cfg)
            hs.append(h)
            cs.append(c)
        return x, jnp.concatenate(hs), jnp.concatenate(cs) if self._lstm else None

    @classmethod
    def from_flax(cls, layers, *, dropout_rate=0.0, rngs=None):
        """The network of Flax cells `layers`, with their weights (a copy).

        Parameters
        ----------
        layers : cell, or list of layers
            One Flax cell (``OptimizedLSTMCell``/``LSTMCell`` for ``LSTM``, ``GRUCell``,
            ``SimpleCell`` with tanh or relu), or a list of layers from input to output,
            each a cell, an ``nnx.RNN`` of one, or an ``nnx.Bidirectional`` of two
            ``nnx.RNN`` (all layers uni- or all bidirectional; the default concatenating
            merge). Layer ``l > 0`` takes the previous layer's output width.
        dropout_rate : float, default 0.0
            Dropout between layers (Flax's stack has it, if at all, outside the cells).
        rngs : nnx.Rngs, optional
            For the dropout stream only; the weights come from `layers`.

        Returns
        -------
        LSTM, GRU or SimpleRNN
            With ``dtype`` and ``param_dtype`` of the first cell.
        """
        return _conversion.from_flax(cls, layers, dropout_rate=dropout_rate, rngs=rngs)

    def to_flax(self, *, cell_type=None):
        """Flax layers computing what this module computes (the inverse of ``from_flax``).

        Parameters
        ----------
        cell_type : type, optional
            For ``LSTM``: ``nnx.OptimizedLSTMCell`` or ``nnx.LSTMCell``; default the class
            ``from_flax`` was given, else ``nnx.OptimizedLSTMCell``.

        Returns
        -------
        cell or list
            For a module made by ``from_flax``, what it was given, in the same form: one
            cell for one cell; a list of layers, each a cell, an ``nnx.RNN`` or an
            ``nnx.Bidirectional`` (their options too) as it was. Otherwise a list with one
            entry per layer: a cell when unidirectional, an ``nnx.Bidirectional`` of two
            ``nnx.RNN`` otherwise. Run a cell as ``nnx.RNN(cell)``.
        """
        return _conversion.to_flax(self, cell_type=cell_type)


def _warn_bad_lengths(lengths, max_time):
    """``checks.warn_out_of_range_lengths`` when the computation runs (under ``lax.cond``:
    only when a length is bad). On the CPU an FFI call: a host callback, even one never
    called, puts every call of the program on JAX's slower dispatch (~0.6 ms a small
    training step); elsewhere a ``jax.debug.callback``."""
    def on_cpu(lengths):
        rnn_jax.register()
        warn = jax.ffi.ffi_call(WARN_LENGTHS, (), has_side_effect=True,
                                vmap_method="broadcast_all")
        warn(lengths, max_time=np.int64(max_time))

    def elsewhere(lengths):
        jax.debug.callback(checks.warn_out_of_range_lengths, lengths, max_time)
    jax.lax.platform_dependent(lengths, cpu=on_cpu, default=elsewhere)


class LSTM(_RNN):
    """A (stacked, optionally bidirectional, optionally projected) LSTM on cuDNN.

    Computes what ``nnx.RNN(nnx.OptimizedLSTMCell(...))`` layers compute (gates i, f, g,
    o; sigmoid and tanh), with cuDNN's two biases per gate, in one ``nnx.Param`` named
    ``params`` holding cuDNN's weight buffer (``pycudnnrnn.params_to_canonical`` splits
    it; ``from_flax``/``to_flax`` convert).

    Parameters
    ----------
    in_features, hidden_features : int
    num_layers : int, default 1
    bidirectional : bool, default False
    dropout_rate : float, default 0.0
        Dropout on the input of every layer after the first (cuDNN's and PyTorch's
        placement; none on the output), ``nnx.Dropout``-style.
    num_proj : int, default 0
        LSTM projection size (0 < num_proj < hidden_features): h is ``W_p · m``.
    dtype : dtype, optional
        Computation dtype (float16, bfloat16, float32, float64); default: promoted from
        the inputs and params, as Flax does.
    param_dtype : dtype, default float32
    rngs : nnx.Rngs
        ``params`` for the weights; ``dropout`` (or the default stream) for dropout.

    Notes
    -----
    The carry is Flax's, nested: a cell's carry is ``(c, h)`` (LSTM; h of width P) or
    ``h``; a bidirectional layer's is ``(forward, backward)`` as ``nnx.Bidirectional``'s;
    the module's is its layer's carry when ``num_layers == 1``, else a tuple of one
    carry per layer. Each array has shape ``[*batch, width]``.
    """

    _rnn_mode = "lstm"

    @staticmethod
    def _mode_for(mode):
        return mode if mode == "lstm" else None

    @staticmethod
    def _cell_names():
        return "OptimizedLSTMCell or LSTMCell"


class GRU(_RNN):
    """A (stacked, optionally bidirectional) GRU on cuDNN: Flax's ``GRUCell`` plus biases.

    cuDNN's GRU is ``nnx.GRUCell``'s with a recurrent bias per gate (``b_Rh`` inside the
    reset product; zero in a fresh module and in ``from_flax``). Parameters and carry as
    for :class:`LSTM`, without ``num_proj``; a GRU's carry per cell is ``h``.
    """

    _rnn_mode = "gru"

    def __init__(self, in_features, hidden_features, *, num_layers=1, bidirectional=False,
                 dropout_rate=0.0, dtype=None, param_dtype=jnp.float32, rngs):
        super().__init__(in_features, hidden_features, num_layers=num_layers,
                         bidirectional=bidirectional, dropout_rate=dropout_rate,
                         dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    @staticmethod
    def _mode_for(mode):
        return mode if mode == "gru" else None

    @staticmethod
    def _cell_names():
        return "GRUCell"


class SimpleRNN(_RNN):
    """A (stacked, optionally bidirectional) tanh or relu RNN: Flax's ``SimpleCell``.

    Parameters as for :class:`LSTM` (without ``num_proj``), and

    Parameters
    ----------
    activation : {"tanh", "relu"}, default "tanh"
    """

    def __init__(self, in_features, hidden_features, *, activation="tanh", num_layers=1,
                 bidirectional=False, dropout_rate=0.0, dtype=None, param_dtype=jnp.float32,
                 rngs):
        if activation not in ("tanh", "relu"):
            raise ValueError(f"activation: expected 'tanh' or 'relu', got {activation!r}")
        self.activation = activation
        super().__init__(in_features, hidden_features, num_layers=num_layers,
                         bidirectional=bidirectional, dropout_rate=dropout_rate,
                         dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    @property
    def _rnn_mode(self):
        return "rnn_" + self.activation

    @staticmethod
    def _mode_for(mode):
        return mode if mode.startswith("rnn_") else None

    @staticmethod
    def _cell_names():
        return "SimpleCell"
