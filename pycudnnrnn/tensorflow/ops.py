"""The op on TensorFlow tensors: ``rnn``, and the raw pair as ``tf.raw_ops`` names them.

The public functions are not converted by AutoGraph (``_not_converted``): they hold no
Python control flow on tensors, and a conversion reads their source again from disk,
which an edited or missing file makes wrong.

Every call is checked when it is made (eagerly) or traced (``tf.function``): the
attributes, and each shape TensorFlow knows then, by ``pycudnnrnn.core.checks``, whose
messages name the argument. Sizes unknown at trace time (a dynamic batch or time) are
checked when the graph runs, as TensorFlow's own ops check theirs
(``InvalidArgumentError``). The computation is ``graph.rnn``: an eager call runs it as
one ``tf.function`` per static part of a call, and a traced call adds its operations to
the caller's graph. TensorFlow differentiates it. Where TensorFlow has a GPU, TensorFlow's
own cuDNN kernel serves the calls it can (``cudnn``); ``_route`` decides which.
"""

from __future__ import annotations

import functools
import hashlib
import uuid

import numpy as np
import tensorflow as tf

from ..core import checks
from ..core.config import Attributes
from . import cudnn, graph

#: The first bytes of every reserve space the forward makes in training.
_MAGIC = b"pcrnn-tf"


def _not_converted(function):
    """`function`, which a ``tf.function``'s AutoGraph calls as it is."""
    return functools.wraps(function)(tf.autograph.experimental.do_not_convert(function))


class _Spec:
    """What a check reads of a tensor (``shape``, ``ndim``, ``dtype``), with each size
    TensorFlow does not know yet replaced by `unknown`."""

    def __init__(self, tensor, unknown):
        self.shape = tuple(unknown if d is None else d for d in tensor.shape.as_list())
        self.ndim = len(self.shape)
        self.dtype = tensor.dtype.as_numpy_dtype


def _tensor(name, value):
    """`value` as a tensor (None stays None); a TypeError naming `name` otherwise."""
    if value is None:
        return None
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name}: expected a tensor or array, got "
                        f"{type(value).__qualname__}") from error
    if tensor.shape.rank is None:
        raise ValueError(f"{name}: expected a tensor of known rank, got one of unknown shape")
    return tensor


def _static_sizes(input, input_h, input_c, time_major, lstm):
    """Sizes the params layout needs (features, L·D, P, H) must be known at trace time."""
    for name, tensor, axes in (("input", input, [2]),
                               ("input_h", input_h, [0 if time_major else 1, 2]),
                               ("input_c", input_c, [2] if lstm else [])):
        if tensor is None:
            continue  # (the checks name what is missing)
        dims = tensor.shape.as_list()
        for axis in axes:
            if axis < len(dims) and dims[axis] is None:
                raise ValueError(
                    f"{name}: dimension {axis} must be known when the call is traced (it "
                    f"fixes the params layout), got shape {tensor.shape}; give the "
                    f"tf.function an input_signature with that size")


def _unknown_batch(input, input_h, time_major):
    """A stand-in for a batch size not known yet: one the state may know, else 1."""
    for tensor, axis in ((input, 1 if time_major else 0), (input_h, 1 if time_major else 0)):
        if tensor is None:
            continue
        dims = tensor.shape.as_list()
        if len(dims) > axis and dims[axis] is not None:
            return dims[axis]
    return 1


def _check(op, input, input_h, input_c, params, lengths, sizes):
    """``(RNNConfig, lengths checked now or None)`` after checking what is known now.

    Lengths are checked now when their values, the batch and the time are all known;
    otherwise when the graph runs (``_lengths_tensor``)."""
    _static_sizes(input, input_h, input_c, op.time_major, op.lstm)
    batch = _unknown_batch(input, input_h, op.time_major)
    specs = [None if t is None else _Spec(t, batch) for t in (input, input_h, input_c)]
    if len(specs[0].shape) == 3:  # (a wrong rank is the check's to name)
        time_axis = 0 if op.time_major else 1
        if input.shape[time_axis] is None:  # unknown T: any T > 0 will do for the checks
            specs[0].shape = specs[0].shape[:time_axis] + (1,) + specs[0].shape[time_axis + 1:]
    params_spec = _Spec(params, None)
    if params_spec.ndim == 1 and params_spec.shape[0] is None:
        params_spec = None  # checked when the graph runs (tf.split)
    known = len(specs[0].shape) == 3 and None not in input.shape.as_list()[:2]
    static = tf.get_static_value(lengths) if lengths is not None and known else None
    problem = checks.check_forward(
        *specs, _ParamsOrSkip(params_spec, params), static, **op.keywords(), **sizes)
    return problem.config, problem.lengths


class _ParamsOrSkip:
    """params for the checks: its spec, or (length unknown) one that fits any layout."""

    def __init__(self, spec, params):
        self._spec, self._params = spec, params

    def __getattr__(self, name):
        if self._spec is not None:
            return getattr(self._spec, name)
        return {"ndim": 1, "dtype": self._params.dtype.as_numpy_dtype}[name]

    @property
    def shape(self):
        if self._spec is not None:
            return self._spec.shape
        return (_AnySize(),)


class _AnySize(int):
    """A length equal to any other: a params buffer whose size TensorFlow does not know."""

    def __new__(cls):
        return super().__new__(cls, 0)

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


def _seed_tensor(seed, seed2):
    """The combined 64-bit dropout seed as an int64 scalar: from TensorFlow's two seeds,
    or `seed` already a scalar integer tensor (a new seed per call, no new trace)."""
    if isinstance(seed, (tf.Tensor, tf.Variable)):
        if seed.shape.rank != 0 or not seed.dtype.is_integer:
            raise TypeError(f"seed: expected an int or a scalar integer tensor holding the "
                            f"combined 64-bit seed, got a tensor of shape {seed.shape} and "
                            f"dtype {seed.dtype.name}")
        return tf.cast(seed, tf.int64)
    combined = checks.dropout_seed(seed, seed2)
    return tf.constant(combined - (1 << 64) if combined >> 63 else combined, tf.int64)


def _lengths_tensor(sequence_lengths, checked, batch, max_time):
    """int32 lengths for the graph (None where every row runs every step): `checked`,
    the lengths ``_check`` checked, as a constant; else `sequence_lengths`, checked when
    the graph runs."""
    if sequence_lengths is None:
        return None
    if checked is not None:
        return None if bool((checked == max_time).all()) else tf.constant(checked, tf.int32)
    lengths = tf.cast(sequence_lengths, tf.int32)
    checked = [
        tf.debugging.assert_equal(tf.shape(lengths), tf.reshape(batch, [1]), message=(
            "sequence_lengths: expected shape [batch] (the batch size of input)")),
        tf.debugging.assert_greater_equal(lengths, 0, message=(
            "sequence_lengths: expected values in [0, max_time], got a negative one")),
        tf.debugging.assert_less_equal(lengths, tf.cast(max_time, tf.int32), message=(
            "sequence_lengths: expected values in [0, max_time], got one above max_time"))]
    with tf.control_dependencies(checked):  # checked before any op reads them
        return tf.identity(lengths)


def _arguments(input, input_h, input_c, params, sequence_lengths, op):
    input = _tensor("input", input)
    input_h = _tensor("input_h", input_h)
    input_c = _tensor("input_c", input_c) if op.lstm else None
    params = _tensor("params", params)
    if sequence_lengths is not None and not isinstance(sequence_lengths, (tf.Tensor,
                                                                          tf.Variable)):
        checked = np.asarray(sequence_lengths)
        if checked.dtype.kind not in "iu":
            raise TypeError(f"sequence_lengths: expected integers, got dtype {checked.dtype}")
        sequence_lengths = tf.constant(checked.astype(np.int64))
    elif sequence_lengths is not None and not sequence_lengths.dtype.is_integer:
        raise TypeError(f"sequence_lengths: expected integers, got dtype "
                        f"{sequence_lengths.dtype.name}")
    return input, input_h, input_c, params, sequence_lengths


def _forward(op, input, input_h, input_c, params, sequence_lengths, seed, sizes=None,
             tensor_seed=False, own_masks=True):
    """``(config, output, output_h, output_c, masks)`` of a checked call; the masks, if the
    call draws its own (``_run``), are drawn from `seed`."""
    config, checked = _check(op, input, input_h, input_c, params, sequence_lengths,
                             sizes or {})
    time_axis, batch_axis = (0, 1) if op.time_major else (1, 0)
    shape = tf.shape(input)
    draw = lambda: graph.masks(  # noqa: E731
        config, op.is_training, (shape[time_axis], shape[batch_axis]), seed,
        tf.float32 if input.dtype.size == 2 else input.dtype)
    output, output_h, output_c, masks = _run(
        op, config, input, input_h, input_c, params, sequence_lengths, checked, draw,
        tensor_seed, own_masks)
    return config, output, output_h, output_c, masks


def _route(op, config, input, tensor_seed, own_masks):
    """The one place that picks what computes a call: a ``cudnn.Kernel`` where TensorFlow's
    cuDNN kernel serves it, else None (``graph.rnn``, TensorFlow's operations).

    Eagerly the kernel runs where the call runs on a GPU. Traced where TensorFlow sees a
    GPU, the graph holds both, and TensorFlow's implementation selector runs the one for
    the device it places the call on (``_selected``). With no GPU nothing changes: the
    operations join the caller's graph, as they always did.
    """
    if not cudnn.runs_here(input):
        return None
    return cudnn.kernel(op, config, input.dtype, tensor_seed, own_masks)


def _run(op, config, input, input_h, input_c, params, sequence_lengths, checked, masks,
         tensor_seed=False, own_masks=True):
    """``(output, output_h, output_c, masks)``: by TensorFlow's kernel or ``graph.rnn``
    (``_route``). `masks` gives the dropout masks (``{layer: mask}``) when called: an
    eager call on the kernel draws none (cuDNN draws its own)."""
    time_axis, batch_axis = (0, 1) if op.time_major else (1, 0)
    shape = tf.shape(input)
    max_time = input.shape[time_axis] or shape[time_axis]
    lengths = _lengths_tensor(sequence_lengths, checked, shape[batch_axis], max_time)
    kernel = _route(op, config, input, tensor_seed, own_masks)
    eager = tf.executing_eagerly()
    masks = {} if kernel is not None and eager else masks()
    static = (config, op.time_major, lengths is not None, tuple(sorted(masks)))
    # Eagerly, one graph per static part (not a Python loop of kernels); inside a trace,
    # the ops join the caller's graph: a nested function there costs a call per run and
    # its gradient's, about a quarter of a small Keras training step.
    if kernel is None:
        function = _function(*static) if eager else functools.partial(_traced, *static)
    else:
        function = _kernel_function(kernel, *static[2:]) if eager else \
            functools.partial(_selected, static, kernel)
    args = [input, input_h] + ([input_c] if config.is_lstm else []) + [params]
    output, output_h, output_c = function(*args, *([lengths] if lengths is not None else []),
                                          *(masks[k] for k in sorted(masks)))
    if not eager:  # the sizes a trace knows (a relaxed trace forgets them)
        output.set_shape(input.shape[:2].concatenate([config.num_dirs * config.state_size]))
        output_h.set_shape(input_h.shape)
        if config.is_lstm:
            output_c.set_shape(input_c.shape)
    return output, output_h, output_c, masks


@functools.lru_cache(maxsize=128)
def _function(config, time_major, has_lengths, masked_layers):
    """``graph.rnn`` for one static part of a call, as a ``tf.function`` (so an eager
    call runs one graph, not a Python loop of kernels), shapes relaxed.

    A ``functools.partial``, not a closure: TensorFlow counts traces by the Python
    function's code, and would take one trace per configuration for retracing."""
    run = functools.partial(_traced, config, time_major, has_lengths, masked_layers)
    return tf.function(run, reduce_retracing=True, autograph=False)


@functools.lru_cache(maxsize=128)
def _kernel_function(kernel, has_lengths, masked_layers):
    """``cudnn.rnn`` for one static part of an eager call, run op by op (a score of
    operations around one kernel), not as a ``tf.function``: under a tape that records
    another tape's gradient (nested tapes, a persistent tape asked inside its context),
    TensorFlow builds the gradient of a function's backward function when it records
    it, and that of the kernel's backward is refused: even a first order gradient would
    fail. Op by op, only a second derivative that flows through the kernel fails."""
    return functools.partial(_kernel_traced, kernel, has_lengths, masked_layers)


def _unpack(lstm, has_lengths, masked_layers, args):
    """``(input, input_h, input_c, params, lengths, masks)`` from a call's flat arguments."""
    args = list(args)
    input, input_h = args.pop(0), args.pop(0)
    input_c = args.pop(0) if lstm else None
    params = args.pop(0)
    lengths = args.pop(0) if has_lengths else None
    return input, input_h, input_c, params, lengths, dict(zip(masked_layers, args))


def _traced(config, time_major, has_lengths, masked_layers, *args):
    """The body of ``_function``'s ``tf.function``: its flat arguments to ``graph.rnn``.

    The dropout masks are constants to the gradient. No caller asks for theirs, and the
    kernel's twin (``_selected``) has none: a gradient here would give this backward
    function more outputs than the twin's, and Grappler's implementation selector
    refuses such a pair and skips the whole graph."""
    input, input_h, input_c, params, lengths, masks = _unpack(config.is_lstm, has_lengths,
                                                              masked_layers, args)
    masks = {layer: tf.stop_gradient(mask) for layer, mask in masks.items()}
    return graph.rnn(config, time_major, input, input_h, input_c, params, lengths, masks)


def _kernel_traced(kernel, has_lengths, masked_layers, *args):
    """``_traced``'s twin for TensorFlow's kernel: the same arguments (cuDNN draws its own
    dropout masks: those given are not used) to ``cudnn.rnn``."""
    input, input_h, input_c, params, lengths, _ = _unpack(kernel.lstm, has_lengths,
                                                          masked_layers, args)
    return cudnn.rnn(kernel, input, input_h, input_c, params, lengths)


def _selected(static, kernel, *args):
    """A traced call where TensorFlow sees a GPU: both implementations, for TensorFlow's
    implementation selector (``api_implements``, as ``ctc_ops.ctc_loss_v3`` and tf_keras's
    LSTM use it), which runs the one for the device the call is placed on.

    The graph calls TensorFlow's operations (``_traced``) and holds the kernel's twin
    and its gradient functions in its library. The default must be the CPU's: under a
    tape outside the caller's function, forward and backward run as separate functions,
    the swap fails its signature check, and what runs is the default. The name is new
    per call, so that two calls never pair with each other's twin.
    """
    name = "pycudnnrnn_rnn_" + uuid.uuid4().hex
    cpu, gpu = (tf.function(function, autograph=False, experimental_attributes={
        "api_implements": name, "api_preferred_device": device})
        for function, device in ((functools.partial(_traced, *static), "CPU"),
                                 (functools.partial(_kernel_traced, kernel, *static[2:]),
                                  "GPU")))
    outputs = cpu(*args)
    twin = gpu.get_concrete_function(*args)
    twin.add_to_graph()
    twin.add_gradient_functions_to_graph()
    return outputs


def _attributes(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj, time_major,
                is_training):
    """A validated ``Attributes`` (a tensor seed is checked by ``_seed_tensor``)."""
    tensor_seed = isinstance(seed, (tf.Tensor, tf.Variable))
    return checks.check_attributes(Attributes(rnn_mode, input_mode, direction, dropout,
                                              0 if tensor_seed else seed, seed2, num_proj,
                                              time_major, is_training))


@_not_converted
def rnn(input, input_h, input_c, params, sequence_lengths=None, *, rnn_mode="lstm",
        input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0,
        num_proj=0, time_major=True, is_training=True, num_layers=None, num_units=None,
        input_size=None):
    """Differentiable ``pycudnnrnn.forward`` on TensorFlow tensors: ``(output, output_h,
    output_c)``.

    Parameters
    ----------
    input, input_h, input_c, params : tf.Tensor or array
        As for ``pycudnnrnn.forward`` (input_c None unless LSTM). The batch and time may
        be unknown when a ``tf.function`` traces; the feature sizes may not.
    sequence_lengths : tensor or list of int, optional
    rnn_mode, input_mode, direction, dropout, num_proj, time_major
        The op's attributes, see ``pycudnnrnn.forward``.
    seed, seed2 : int
        The dropout seed, as for ``pycudnnrnn.forward``; or `seed` a scalar integer tensor
        holding the combined 64-bit seed (a new seed per call without a new trace).
    is_training : bool
        False: no dropout.
    num_layers, num_units, input_size : int, optional
        Checked against the shapes when given.

    Returns
    -------
    output, output_h, output_c : tf.Tensor
        output_c is empty ``(0,)`` unless LSTM. A ``GradientTape`` differentiates them
        with respect to every floating argument, to any order; on a GPU, where cuDNN
        computes them, to the first order (``pycudnnrnn.tensorflow.cudnn``).
    """
    op = _attributes(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj,
                     time_major, is_training)
    arguments = _arguments(input, input_h, input_c, params, sequence_lengths, op)
    sizes = {name: value for name, value in (("num_layers", num_layers),
                                             ("num_units", num_units),
                                             ("input_size", input_size)) if value is not None}
    _, output, output_h, output_c, _ = _forward(
        op, *arguments, _seed_tensor(seed, seed2), sizes,
        tensor_seed=isinstance(seed, (tf.Tensor, tf.Variable)), own_masks=False)
    return output, output_h, output_c


# --------------------------------------------------------------------------- the raw pair

def _header(op, config, dtype) -> tf.Tensor:
    """The reserve space's first 16 bytes: the magic and a digest of the call's static
    part (attributes, sizes, dtype), so backprop refuses another call's reserve."""
    key = repr((config, op.replace(seed=0, seed2=0), tf.as_dtype(dtype).name)).encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return tf.constant(np.frombuffer(_MAGIC + digest, np.uint8))


@_not_converted
def cudnn_rnn_v3(input, input_h, input_c, params, sequence_lengths=None, *,
                 rnn_mode="lstm", input_mode="linear_input", direction="unidirectional",
                 dropout=0.0, seed=0, seed2=0, num_proj=0, is_training=True,
                 time_major=True, name=None):
    """``tf.raw_ops.CudnnRNNV3`` where TensorFlow has no kernel, with its arguments and
    results: ``(output, output_h, output_c, reserve_space, host_reserved)``.

    `reserve_space` (uint8) is what ``cudnn_rnn_backprop_v3`` reads back: a header that
    identifies the call, then the dropout masks; empty when `is_training` is False.
    `host_reserved` is an empty int8 tensor (TensorFlow's carries cuDNN's host state).
    `input_c` is taken and ignored but for an LSTM, as TensorFlow's op takes it. `name`
    is TensorFlow's name scope.
    """
    with tf.name_scope(name or "CudnnRNNV3"):
        op = _attributes(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj,
                         time_major, is_training)
        arguments = _arguments(input, input_h, input_c, params, sequence_lengths, op)
        config, output, output_h, output_c, masks = _forward(op, *arguments,
                                                             _seed_tensor(seed, seed2))
        if op.is_training:
            pieces = [_header(op, config, output.dtype)]
            pieces += [tf.reshape(tf.cast(masks[k] > 0, tf.uint8), [-1]) for k in sorted(masks)]
            reserve = tf.concat(pieces, 0)
        else:
            reserve = tf.zeros((0,), tf.uint8)
        return output, output_h, output_c, reserve, tf.zeros((0,), tf.int8)


@_not_converted
def cudnn_rnn_backprop_v3(input, input_h, input_c, params, sequence_lengths, output,
                          output_h, output_c, output_backprop, output_h_backprop,
                          output_c_backprop, reserve_space, host_reserved=None, *,
                          rnn_mode="lstm", input_mode="linear_input",
                          direction="unidirectional", dropout=0.0, seed=0, seed2=0,
                          num_proj=0, time_major=True, name=None):
    """``tf.raw_ops.CudnnRNNBackpropV3`` where TensorFlow has no kernel:
    ``(input_backprop, input_h_backprop, input_c_backprop, params_backprop)``.

    The gradients of the forward that made `reserve_space`, at `output_backprop`,
    `output_h_backprop` and `output_c_backprop` (that forward's masks: it is recomputed
    with them). input_c_backprop is empty ``(0,)`` unless LSTM. An empty `reserve_space`
    (a forward with is_training=False), one of another call or of the wrong size is
    refused: a ValueError where TensorFlow knows it when the call is traced, an
    InvalidArgumentError when the graph runs otherwise.
    """
    del output, output_h, output_c, host_reserved  # recomputed: only the masks are kept
    with tf.name_scope(name or "CudnnRNNBackpropV3"):
        op = _attributes(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj,
                         time_major, True)
        input, input_h, input_c, params, sequence_lengths = _arguments(
            input, input_h, input_c, params, sequence_lengths, op)
        reserve_space = _tensor("reserve_space", reserve_space)
        config, checked = _check(op, input, input_h, input_c, params, sequence_lengths, {})
        masks = _read_masks(op, config, input, reserve_space)
        sources = [input, input_h, params] + ([input_c] if op.lstm else [])
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(sources)
            results = _run(op, config, input, input_h, input_c, params, sequence_lengths,
                           checked, lambda: masks)
        wanted = [output_backprop, output_h_backprop] + ([output_c_backprop] if op.lstm else [])
        targets = list(results[:len(wanted)])
        grads = tape.gradient(targets, sources, output_gradients=[
            tf.convert_to_tensor(g, t.dtype) for g, t in zip(wanted, targets)],
            unconnected_gradients=tf.UnconnectedGradients.ZERO)
        d_input_c = grads[3] if op.lstm else tf.zeros((0,), input.dtype)
        return grads[0], grads[1], d_input_c, grads[2]


def _read_masks(op, config, input, reserve_space):
    """The forward's dropout masks, scaled, from `reserve_space` (checked first)."""
    if reserve_space.dtype != tf.uint8 or reserve_space.shape.rank != 1:
        raise TypeError(f"reserve_space: expected the 1-D uint8 tensor that cudnn_rnn_v3 "
                        f"returns, got dtype {reserve_space.dtype.name} and shape "
                        f"{reserve_space.shape}")
    if reserve_space.shape[0] == 0:
        raise ValueError("reserve_space: empty: the forward ran with is_training=False, "
                         "which keeps nothing for backprop; run it with is_training=True")
    time_axis, batch_axis = (0, 1) if op.time_major else (1, 0)
    shape = tf.shape(input)
    T, B = shape[time_axis], shape[batch_axis]
    dropped = graph.dropped_layers(config, True)
    width = config.num_dirs * config.state_size
    expected = 16 + len(dropped) * T * B * width
    header = _header(op, config, input.dtype)
    static_size = tf.get_static_value(expected)
    if reserve_space.shape[0] is not None and static_size is not None and \
            reserve_space.shape[0] != static_size:
        raise ValueError(f"reserve_space: expected {int(static_size)} bytes (the forward "
                         f"of this call's attributes and shapes), got {reserve_space.shape[0]}")
    size_checked = tf.debugging.assert_equal(tf.size(reserve_space), expected, message=(
        "reserve_space: not the size the forward of this call's attributes and shapes makes"))
    with tf.control_dependencies([size_checked]):
        head_checked = tf.debugging.assert_equal(reserve_space[:16], header, message=(
            "reserve_space: made by another call (other attributes, sizes or dtype), or not "
            "by cudnn_rnn_v3"))
    with tf.control_dependencies([size_checked, head_checked]):  # before any mask is read
        reserve_space = tf.identity(reserve_space)
    cdt = tf.float32 if input.dtype.size == 2 else input.dtype
    scale = tf.cast(1.0 / (1.0 - op.dropout), cdt) if dropped else None
    masks, start = {}, 16
    for k, layer in enumerate(dropped):
        size = T * B * width
        piece = reserve_space[start + k * size:start + (k + 1) * size]
        masks[layer] = tf.reshape(tf.cast(piece, cdt), tf.stack([T, B, width])) * scale
    return masks
