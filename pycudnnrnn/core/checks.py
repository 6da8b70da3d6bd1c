"""Every argument check, in one place, before any computation.

A plan is built from ``check_forward`` (a functional call's arrays) or ``make_problem``
(an ``RNNPlan``'s sizes), the params functions from ``make_config``; the resulting
``Problem`` goes to a backend, which may then trust every attribute. Every run checks
its arrays against the plan with ``check_arrays`` over ``forward_shapes`` (and
``backprop_shapes``, ``check_reserve_space``), so a backend may trust every shape and
dtype too. Checks read only
``.shape``, ``.ndim`` and ``.dtype``, so they work for any array type; sequence
lengths arrive here already on the host.

Errors are ``ValueError`` (shape, length, attribute value) or ``TypeError`` (dtype,
type), and each message names the argument, what was expected and what was given.
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings

import numpy as np

from . import dtypes, layout
from .config import DIRECTIONS, INPUT_MODES, RNN_MODES, Attributes, Problem, RNNConfig

_DTYPE_NAMES = f"{', '.join(dtypes.NAMES[:-1])} or {dtypes.NAMES[-1]}"


def _type_name(value) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _choice(name, value, allowed):
    if type(value) is str and value in allowed:  # the common case: no message to build
        return value
    options = ", ".join(repr(a) for a in allowed)
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str, one of {options}, got {_type_name(value)}")
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {options}, got {value!r}")
    return value


def rnn_mode(value) -> str:
    """A valid rnn_mode, checked first: the public functions branch on it."""
    return _choice("rnn_mode", value, RNN_MODES)


def array_list(name, value) -> list:
    """`value` (weights or biases of the canonical form) as a list; a TypeError unless it
    is a sequence of arrays rather than None, a string or one array."""
    one_array = isinstance(value, np.ndarray) or hasattr(value, "__dlpack__")
    if value is None or isinstance(value, (str, bytes)) or one_array or \
            not hasattr(value, "__iter__"):
        what = "one array" if one_array else _type_name(value)
        raise TypeError(f"{name}: expected a list of arrays (as params_to_canonical returns "
                        f"them), got {what}")
    return list(value)


#: The largest size taken (layers, widths, time, batch): cuDNN takes them as 32-bit ints,
#: and the CPU backend computes the same function.
SIZE_MAX = 2 ** 31 - 1


def _integer(name, value, minimum=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def _size(name, value, minimum=1):
    """A size: an int in [minimum, SIZE_MAX]."""
    value = _integer(name, value, minimum)
    if value > SIZE_MAX:
        raise ValueError(f"{name}: expected an int in [{minimum}, {SIZE_MAX}] (cuDNN takes "
                         f"sizes as 32-bit ints), got {value}")
    return value


def _boolean(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def dropout_seed(seed, seed2) -> int:
    """TensorFlow's two seeds as one 64-bit seed: ``(seed << 32) | (seed2 & 0xffffffff)``."""
    seed, seed2 = _integer("seed", seed), _integer("seed2", seed2)
    return ((seed << 32) | (seed2 & 0xFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF


def check_attributes(attributes: Attributes) -> Attributes:
    """Validate the op's attributes alone (no sizes); the same with plain Python values.

    What a framework checks once, when it traces or builds a call: the sizes that
    ``num_proj`` and ``skip_input`` must fit are checked with the arrays, by
    ``check_forward``.
    """
    a = attributes
    _choice("rnn_mode", a.rnn_mode, RNN_MODES)
    _choice("input_mode", a.input_mode, INPUT_MODES)
    _choice("direction", a.direction, DIRECTIONS)
    dropout = _dropout(a.dropout)
    seed, seed2 = _integer("seed", a.seed), _integer("seed2", a.seed2)
    num_proj = _size("num_proj", a.num_proj, 0)
    if num_proj and a.rnn_mode != "lstm":
        raise ValueError(f"num_proj: a projection needs rnn_mode='lstm', got num_proj={num_proj} "
                         f"with rnn_mode={a.rnn_mode!r}")
    return Attributes(a.rnn_mode, a.input_mode, a.direction, dropout, seed, seed2, num_proj,
                      _boolean("time_major", a.time_major),
                      _boolean("is_training", a.is_training))


def _dropout(dropout) -> float:
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real):
        raise TypeError(f"dropout: expected a float in [0, 1), got {type(dropout).__name__} {dropout!r}")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout: expected a float in [0, 1), got {dropout!r}")
    return float(dropout)


def make_config(*, rnn_mode, num_layers, num_units, input_size, input_mode, direction,
                num_proj, dropout=0.0, seed=0, seed2=0) -> RNNConfig:
    """Validate the op's attributes and sizes and build an ``RNNConfig``."""
    _choice("rnn_mode", rnn_mode, RNN_MODES)
    _choice("input_mode", input_mode, INPUT_MODES)
    _choice("direction", direction, DIRECTIONS)
    num_layers = _size("num_layers", num_layers)
    num_units = _size("num_units", num_units)
    input_size = _size("input_size", input_size)
    num_proj = _size("num_proj", num_proj, 0)
    dropout = _dropout(dropout)
    if num_proj and rnn_mode != "lstm":
        raise ValueError(f"num_proj: a projection needs rnn_mode='lstm', got num_proj={num_proj} "
                         f"with rnn_mode={rnn_mode!r}")
    if num_proj and num_proj >= num_units:
        raise ValueError(f"num_proj: expected 0 < num_proj < num_units={num_units}, got {num_proj}")
    if input_mode == "auto_select":
        skip = input_size == num_units
    else:
        skip = input_mode == "skip_input"
        if skip and input_size != num_units:
            raise ValueError(f"input_mode: 'skip_input' needs input_size == num_units, got "
                             f"input_size={input_size} and num_units={num_units}")
    return RNNConfig(rnn_mode=rnn_mode, skip_input=skip, bidirectional=direction == "bidirectional",
                     num_layers=num_layers, num_units=num_units, input_size=input_size,
                     num_proj=num_proj, dropout=dropout, seed=dropout_seed(seed, seed2))


def _dtype(name, array, expected=None, reference="input"):
    if array is None:
        raise TypeError(f"{name}: expected an array, got None")
    dtype = np.dtype(array.dtype)
    if expected is None:
        if not dtypes.is_supported(dtype):
            raise TypeError(f"{name}: expected dtype {_DTYPE_NAMES}, got {dtype}")
    elif dtype != expected:
        raise TypeError(f"{name}: expected dtype {expected} (the dtype of {reference}), got {dtype}")
    return dtype


def _ndim(name, array, ndim, what):
    if array.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array {what}, got shape {tuple(array.shape)}")


def _shape(name, array, expected, what):
    if tuple(array.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} {what}, got {tuple(array.shape)}")


def check_lengths(sequence_lengths, batch_size, max_time):
    """Validate host sequence lengths; None stays None (every sequence has length T)."""
    if sequence_lengths is None:
        return None
    lengths = np.asarray(sequence_lengths)
    if lengths.dtype == object and lengths.ndim == 1 and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in lengths):
        lengths = _python_integers(lengths, max_time)  # beyond int64: out of range
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"sequence_lengths: expected integers, got dtype {lengths.dtype}")
    if lengths.shape != (batch_size,):
        raise ValueError(f"sequence_lengths: expected shape ({batch_size},) (the batch size), "
                         f"got {lengths.shape}")
    bad = (lengths < 0) | (lengths > max_time)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(f"sequence_lengths: expected values in [0, {max_time}] (max_time), "
                         f"got {int(lengths[b])} at index {b}")
    return lengths.astype(np.int64)


def warn_out_of_range_lengths(lengths, max_time):
    """A ``RuntimeWarning`` naming the first of traced `lengths` [B] out of
    ``[0, max_time]``, whose rows ``pycudnnrnn.flax`` runs as NaN rather than fail the
    computation (``_RNN._check_lengths`` there); nothing when all are in range."""
    lengths = np.asarray(lengths).reshape(-1)  # (any batch axes: vmap's too)
    bad = (lengths < 0) | (lengths > max_time)
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        warnings.warn(f"seq_lengths: expected values in [0, {max_time}] (the time steps), got "
                      f"{int(lengths[index])} at index {index} of the flattened "
                      f"batch, under a transform: {int(bad.sum())} such rows come out NaN "
                      f"(outputs and carry) instead of an error, which would have failed the "
                      f"computation and left its failed arrays in the module",
                      RuntimeWarning, stacklevel=2)


def _python_integers(lengths, max_time):
    """Python integers too large for int64 (NumPy gives them dtype object): the first one
    out of [0, max_time] is a ValueError, as for any other integer."""
    for b, value in enumerate(lengths):
        if not 0 <= value <= max_time:
            raise ValueError(f"sequence_lengths: expected values in [0, {max_time}] "
                             f"(max_time), got {value} at index {b}")
    return lengths.astype(np.int64)


def check_params(params, config: RNNConfig, dtype=None):
    """A 1-D float params buffer of length params_size (and of `dtype`, if given)."""
    _dtype("params", params, dtype)
    _ndim("params", params, 1, "[params_size]")
    expected = layout.params_size(config)
    if params.shape[0] != expected:
        raise ValueError(f"params: expected {expected} elements (params_size for this "
                         f"configuration), got {params.shape[0]}")


def _input_size_for(config: RNNConfig, n: int, input_mode: str) -> int | None:
    """The input_size that would make params_size `n`, all else equal; None if none.

    params_size is a + b·input_size with layer 0's input matrices (a alone without them,
    with input_size = num_units: skip_input, or auto_select's pick), so at most one fits.
    """
    H = config.num_units
    if input_mode != "linear_input" and \
            layout.params_size(dataclasses.replace(config, skip_input=True, input_size=H)) == n:
        return H
    if input_mode == "skip_input":
        return None
    linear = dataclasses.replace(config, skip_input=False, input_size=0)
    base = layout.params_size(linear)
    per_input = layout.params_size(dataclasses.replace(linear, input_size=1)) - base
    size, remainder = divmod(n - base, per_input)
    if remainder or size < 1 or (input_mode == "auto_select" and size == H):
        return None
    return size


def _layer_counts_fitting(config: RNNConfig, n: int) -> list:
    """``(num_layers, bidirectional)`` pairs other than `config`'s whose params_size is `n`,
    all else equal (params_size grows with the layer count: the search stops past `n`)."""
    fits = []
    for bidirectional in (config.bidirectional, not config.bidirectional):
        for layers in range(1, 1 << 16):
            size = layout.params_size(dataclasses.replace(
                config, num_layers=layers, bidirectional=bidirectional))
            if size > n:
                break
            if size == n and (layers, bidirectional) != (config.num_layers,
                                                         config.bidirectional):
                fits.append((layers, bidirectional))
    return fits


def _explain_params_length(params, config: RNNConfig, input_mode, input_shape, state_shape):
    """A params length that fits another layer count, direction or input_size: say which
    argument differs, and how the shapes were read (the params themselves look right)."""
    if params is None or getattr(params, "ndim", None) != 1:
        return  # check_params reports it
    n, expected = params.shape[0], layout.params_size(config)
    if n == expected:
        return
    L, D = config.num_layers, config.num_dirs
    read = (f"the shapes give num_layers={L} (input_h {state_shape}, L·D={L * D} with D={D}) "
            f"and input_size={config.input_size} (input {input_shape}), which need {expected}")
    for layers, bidirectional in _layer_counts_fitting(config, n):
        if bidirectional != config.bidirectional and layers * (2 if bidirectional else 1) == L * D:
            wanted = "bidirectional" if bidirectional else "unidirectional"
            raise ValueError(f"direction: params has {n} elements, params_size for "
                             f"direction={wanted!r} with num_layers={layers}; {read}: pass "
                             f"direction={wanted!r}")
        if bidirectional == config.bidirectional:
            raise ValueError(f"input_h: expected L·D={layers * D} (params has {n} elements, "
                             f"params_size for num_layers={layers}), got shape {state_shape}; "
                             f"{read}")
    implied = _input_size_for(config, n, input_mode)
    if implied is not None:
        raise ValueError(f"input: expected last dimension {implied} (params has {n} elements, "
                         f"params_size for input_size={implied}), got shape {input_shape} "
                         f"(input_size={config.input_size} needs {expected} elements)")


def _blame_state_layers(input_h, input_c, time_major, D, params, rnn_mode, input_size,
                        input_mode, direction, num_proj):
    """input_h and input_c give different layer counts: when params fits input_c's and not
    input_h's, input_h is the one to name (the check reads L·D from input_h first)."""
    axis = 0 if time_major else 1
    h_layers, c_layers = input_h.shape[axis] // D, input_c.shape[axis] // D
    n = getattr(params, "shape", (None,))[0] if getattr(params, "ndim", None) == 1 else None
    if h_layers == c_layers or n is None or c_layers == 0 or input_c.shape[axis] % D:
        return

    def size(layers):
        try:
            return layout.params_size(make_config(
                rnn_mode=rnn_mode, num_layers=layers, num_units=input_c.shape[2],
                input_size=input_size, input_mode=input_mode, direction=direction,
                num_proj=num_proj, dropout=0.0, seed=0, seed2=0))
        except (TypeError, ValueError):
            return None
    if size(c_layers) == n != size(h_layers):
        raise ValueError(f"input_h: expected L·D={input_c.shape[axis]} as in input_c and params "
                         f"(params has {n} elements, params_size for num_layers={c_layers}), "
                         f"got shape {tuple(input_h.shape)}")


def _state_mismatch(name, given, expected, what, time_major, input_shape):
    """The ValueError for a state whose shape disagrees with input_h's or input's, saying
    where L·D and B were read from (and the likely cause: batch-major data read as
    time-major)."""
    message = (f"{name}: expected shape {tuple(expected)} {what} (L·D from input_h's shape, B "
               f"from input's), got {tuple(given)}")
    b_axis = 1 if time_major else 0
    if len(given) == 3 and given[b_axis] == input_shape[1 - b_axis] != input_shape[b_axis]:
        layout_name, flag = ("[T, B, input_size]", "False") if time_major else \
            ("[B, T, input_size]", "True")
        message += (f"; input {tuple(input_shape)} reads as {layout_name} (time_major="
                    f"{time_major}) with B={input_shape[b_axis]}, but {name}'s batch "
                    f"matches its other dimension: for that layout pass time_major={flag}")
    return ValueError(message)


def _describe(piece: layout.Piece) -> str:
    if piece.role == "projection":
        return f"pseudo-layer {piece.pseudo_layer} projection matrix"
    kind = "matrix" if piece.kind == "weight" else "bias"
    return f"pseudo-layer {piece.pseudo_layer} {piece.role} {kind} of gate {piece.gate!r}"


def check_canonical(weights, biases, config: RNNConfig) -> list:
    """Canonical weights and biases of the right count, shapes and one dtype.

    Returns them as one list in buffer order.
    """
    table = layout.pieces(config)
    named = []
    for kind, name, given in (("weight", "weights", list(weights)), ("bias", "biases", list(biases))):
        expected = [p for p in table if p.kind == kind]
        if len(given) != len(expected):
            raise ValueError(f"{name}: expected {len(expected)} arrays for this configuration, "
                             f"got {len(given)}")
        named += [(f"{name}[{i}]", a, p) for i, (a, p) in enumerate(zip(given, expected))]
    dtype = _dtype(named[0][0], named[0][1])
    for name, array, piece in named:
        _dtype(name, array, dtype, reference=named[0][0])
        _shape(name, array, piece.shape, f"({_describe(piece)})")
    return [array for _, array, _ in named]


def _given_size(name, given, found, where):
    """A size the caller also gave as an attribute (None: not given) must be the shapes'."""
    if given is not None and _integer(name, given, 1) != found:
        raise ValueError(f"{name}: given {given}, but {where} gives {found}")


def check_forward(input, input_h, input_c, params, sequence_lengths, *, rnn_mode, input_mode,
                  direction, dropout, seed, seed2, num_proj, time_major, is_training,
                  num_layers=None, num_units=None, input_size=None) -> Problem:
    """Validate the arguments of ``pycudnnrnn.forward``; return the ``Problem``.

    The sizes come from the shapes; `num_layers`, `num_units` and `input_size`, when given
    (as in the attribute dict of ``pycudnnrnn.convert``), must agree with them.
    """
    _choice("rnn_mode", rnn_mode, RNN_MODES)
    _choice("direction", direction, DIRECTIONS)
    time_major = _boolean("time_major", time_major)
    is_training = _boolean("is_training", is_training)
    given_num_layers, given_num_units, given_input_size = num_layers, num_units, input_size
    lstm = rnn_mode == "lstm"
    D = 2 if direction == "bidirectional" else 1
    layout_name = "[T, B, input_size]" if time_major else "[B, T, input_size]"
    state_name = "[L·D, B, {}]" if time_major else "[B, L·D, {}]"

    dtype = _dtype("input", input)
    _ndim("input", input, 3, layout_name)
    T, B = input.shape[:2] if time_major else input.shape[1::-1]
    input_size = input.shape[2]
    if T == 0 or B == 0 or input_size == 0:
        raise ValueError(f"input: expected non-empty max_time, batch and input_size, got shape "
                         f"{tuple(input.shape)} ({layout_name})")

    _dtype("input_h", input_h, dtype)
    _ndim("input_h", input_h, 3, state_name.format("P"))
    LD = input_h.shape[0] if time_major else input_h.shape[1]
    P = input_h.shape[2]
    if LD == 0 or LD % D or P == 0:
        raise ValueError(f"input_h: expected shape {state_name.format('P')} with L·D a positive "
                         f"multiple of D={D} and P > 0, got {tuple(input_h.shape)}")
    num_layers = LD // D
    state = (LD, B) if time_major else (B, LD)
    if tuple(input_h.shape) != state + (P,):
        raise _state_mismatch("input_h", input_h.shape, state + (P,), state_name.format("P"),
                              time_major, tuple(input.shape))

    if lstm:
        if input_c is None:
            raise TypeError("input_c: expected an array for rnn_mode='lstm', got None")
        _dtype("input_c", input_c, dtype)
        _ndim("input_c", input_c, 3, state_name.format("H"))
        H = input_c.shape[2]
        if tuple(input_c.shape) != state + (H,):
            _blame_state_layers(input_h, input_c, time_major, D, params, rnn_mode,
                                input_size, input_mode, direction, num_proj)
            raise _state_mismatch("input_c", input_c.shape, state + (H,),
                                  state_name.format("H"), time_major, tuple(input.shape))
    else:
        H = P
    num_proj = _integer("num_proj", num_proj, 0)
    if num_proj and lstm and P != num_proj:
        raise ValueError(f"input_h: expected last dimension num_proj={num_proj}, got shape "
                         f"{tuple(input_h.shape)}")
    if lstm and not num_proj and P != H:
        raise ValueError(f"input_h: expected last dimension num_units={H} (input_c's; no "
                         f"projection since num_proj=0), got shape {tuple(input_h.shape)}")

    _given_size("input_size", given_input_size, input_size,
                f"input's shape {tuple(input.shape)} {layout_name}")
    _given_size("num_layers", given_num_layers, num_layers,
                f"input_h's shape {tuple(input_h.shape)} {state_name.format('P')} with D={D}")
    _given_size("num_units", given_num_units, H,
                f"input_c's shape {tuple(input_c.shape)} {state_name.format('H')}" if lstm else
                f"input_h's shape {tuple(input_h.shape)} {state_name.format('H')}")
    config = make_config(rnn_mode=rnn_mode, num_layers=num_layers, num_units=H,
                         input_size=input_size, input_mode=input_mode, direction=direction,
                         num_proj=num_proj, dropout=dropout, seed=seed, seed2=seed2)

    _explain_params_length(params, config, input_mode, tuple(input.shape),
                           tuple(input_h.shape))
    check_params(params, config, dtype)
    lengths = check_lengths(sequence_lengths, B, T)
    return Problem(config, T, B, time_major, dtype, lengths, is_training)


GRADIENTS = ("all", "data", "weights")


def check_gradients(gradients) -> str:
    """Which gradients ``backprop`` computes: "all", "data" or "weights"."""
    return _choice("gradients", gradients, GRADIENTS)


def forward_shapes(problem: Problem) -> list:
    """(name, expected shape, what it is) of forward's arrays for `problem`."""
    c = problem.config
    data_what = "([T, B, input_size])" if problem.time_major else "([B, T, input_size])"
    state_what = "([L·D, B, {}])" if problem.time_major else "([B, L·D, {}])"
    shapes = [("input", problem.data_shape(c.input_size), data_what),
              ("input_h", problem.state_shape(c.state_size), state_what.format("P")),
              ("params", (layout.params_size(c),), "(params_size)")]
    if c.is_lstm:
        shapes.append(("input_c", problem.state_shape(c.num_units), state_what.format("H")))
    return shapes


def backprop_shapes(problem: Problem) -> list:
    """(name, expected shape, what it is) of the arrays backprop adds to forward's."""
    c = problem.config
    out_shape = problem.data_shape(c.num_dirs * c.state_size)
    h_shape = problem.state_shape(c.state_size)
    c_shape = problem.state_shape(c.num_units)
    data_what = "([T, B, D·P])" if problem.time_major else "([B, T, D·P])"
    state_what = "(the shape of input_h)"
    shapes = [("output", out_shape, data_what), ("output_h", h_shape, state_what),
              ("output_backprop", out_shape, data_what),
              ("output_h_backprop", h_shape, state_what)]
    if c.is_lstm:
        shapes += [("output_c", c_shape, "(the shape of input_c)"),
                   ("output_c_backprop", c_shape, "(the shape of input_c)")]
    return shapes


def check_arrays(arrays: dict, shapes, dtype, reference="input"):
    """Each array named in `shapes` (name, shape, what) has that shape and `dtype`
    (`reference`'s)."""
    for name, shape, what in shapes:
        array = arrays[name]
        if array is not None and array.shape == shape and array.dtype == dtype:
            continue  # the common case, once per array of every plan run: kept cheap
        _dtype(name, array, dtype, reference)
        _shape(name, array, shape, what)


def check_reserve_space(reserve_space):
    """A 1-D, non-empty reserve_space (the backend then checks its header)."""
    if reserve_space is None:
        raise TypeError("reserve_space: expected the array forward(..., is_training=True) "
                        "returned, got None")
    if reserve_space.ndim != 1:
        raise ValueError(f"reserve_space: expected a 1-D array from forward, got shape "
                         f"{tuple(reserve_space.shape)}")
    if reserve_space.shape[0] == 0:
        raise ValueError("reserve_space: expected the array forward(..., is_training=True) "
                         "returned, got an empty one (forward ran with is_training=False)")


def make_problem(*, max_time, batch_size, sequence_lengths, dtype, time_major, is_training,
                 **attributes) -> Problem:
    """Validate what an ``RNNPlan`` is built from (the op's attributes and the sizes)."""
    config = make_config(**attributes)
    max_time = _size("max_time", max_time)
    batch_size = _size("batch_size", batch_size)
    if dtype is None:  # the documented default (np.dtype(None) would be float64)
        dtype = "float32"
    if dtypes.is_bfloat16(dtype):  # "bfloat16" works before ml_dtypes is imported
        dtype = dtypes.bfloat16("dtype")
    try:
        dtype = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype: expected {_DTYPE_NAMES}, got {dtype!r}") from exc
    if not dtypes.is_supported(dtype):
        raise TypeError(f"dtype: expected {_DTYPE_NAMES}, got {dtype}")
    return Problem(config, max_time, batch_size, _boolean("time_major", time_major), dtype,
                   check_lengths(sequence_lengths, batch_size, max_time),
                   _boolean("is_training", is_training))
