"""cuDNN on a GPU inside TensorFlow: TensorFlow's own ``CudnnRNNV3`` kernel, fed our params.

TensorFlow's kernel builds its cuDNN descriptor with the settings that fix the weight
space as ours does (double bias, hiddenSize = num_units, projSize = the state's width,
the same cell, direction and input modes), so our params buffer goes in as it is.
TensorFlow registers the kernel's gradient (``CudnnRNNBackpropV3``). What the kernel
gets wrong or does otherwise is fixed around it here (TensorFlow's cudnn_rnn_ops.cc):

* Always batch-major. The kernel turns on cuDNN's padded I/O for a time-major call only
  where some row is shorter than the time axis, and caches cuDNN's descriptor per node
  by sizes, not by that flag: a node whose first call had full rows would run later
  ragged ones with padded I/O off (tensorflow/tensorflow#41630). A batch-major call
  always has it on, as tf_keras's LSTM and GRU call the kernel.
* Batch-major states: the kernel reads ``input_h`` of documented shape [B, L·D, P] as
  [L·D, B, P] memory, and writes ``output_h`` so. The states go in and come out as
  that memory, reshaped (not transposed) to the documented shape.
* A row of length 0: cuDNN refuses it. The kernel gets length 1 for it, a zero input
  and a zero initial state; its output is put back to zero and its final states to the
  initial ones. No value of that row reaches the weights, and its gradients are exact.
* Padding is zeroed before the kernel (it may hold NaN). ``sequence_lengths`` absent:
  every row runs every step (the kernel takes lengths always).
* ``auto_select``: the kernel compares input_size with the state's width (num_proj
  when projecting); ours with num_units (``core.checks``). The input mode goes in
  resolved.
* ``is_training=False``: TensorFlow's gradient refuses a kernel run for inference. The
  kernel always runs in training mode (dropout 0 when not training), so a tape still
  differentiates; the cost is cuDNN's reserve space and its training forward.
* Second order: TensorFlow has no gradient of ``CudnnRNNBackpropV3``. A second
  derivative through this route is a ``LookupError`` that says so, never None.
* Non-LSTM ``output_c``: the kernel returns a scalar; the op's is empty ``(0,)``.

TF32: the kernel follows ``tf.config.experimental.enable_tensor_float_32_execution``
(on by default), as Keras's own layers do. Dropout masks are cuDNN's, drawn from the
seeds by the kernel's own generator: not the TensorFlow-ops route's masks.
"""

from __future__ import annotations

import collections
import functools

import tensorflow as tf

#: TensorFlow's kernel. Called through this one name: the tests put a stand-in here.
_kernel = tf.raw_ops.CudnnRNNV3

#: What this route takes. bfloat16 stays on TensorFlow's operations: the kernel computes
#: it in float32, and its bfloat16 backward hands cuDNN a new, unfilled buffer as the
#: reserve space (cudnn_rnn_ops.cc, ``DoBackward<Eigen::bfloat16>``).
DTYPES = (tf.float16, tf.float32, tf.float64)

SECOND_ORDER = ("pycudnnrnn.tensorflow: no second derivative through cuDNN on the GPU "
                "(TensorFlow has no gradient of CudnnRNNBackpropV3); for one, run the op "
                "under tf.device('/CPU:0')")

#: The kernel's static part: its attributes (input mode resolved), and whether an LSTM.
Kernel = collections.namedtuple(
    "Kernel", "rnn_mode input_mode direction dropout seed seed2 num_proj time_major lstm")

_INT32 = range(-(1 << 31), 1 << 31)


@functools.lru_cache(maxsize=1)
def _visible_gpus():
    """TensorFlow's GPUs, which do not change in a process (the tests pretend one)."""
    return tf.config.list_physical_devices("GPU")


def _device_type(tensor):
    """Where an eager call runs: the ``tf.device`` scope's type, else `tensor`'s."""
    try:
        from tensorflow.python.eager import context
        scope = context.context().device_name
    except (ImportError, AttributeError):  # (a private name: the input decides then)
        scope = ""
    return tf.DeviceSpec.from_string(scope or tensor.device).device_type


def serves_dtype(dtype) -> bool:
    """Whether the kernel takes `dtype` (a name or a dtype)."""
    return tf.as_dtype(dtype) in DTYPES


def kernel(op, config, dtype, tensor_seed, own_masks):
    """The kernel's static part for this call, or None where it cannot serve it.

    Parameters
    ----------
    op : Attributes
        The call's checked attributes.
    config : RNNConfig
    dtype : tf.DType
    tensor_seed : bool
        The dropout seed is a tensor: cuDNN's dropout takes integer attributes alone.
    own_masks : bool
        The caller must draw the dropout masks itself (the raw pair keeps them in its
        reserve space for backprop): cuDNN's masks would not be those.
    """
    dropout = op.dropout if op.is_training and config.num_layers > 1 else 0.0
    if not serves_dtype(dtype):
        return None
    if dropout and (tensor_seed or own_masks or op.seed not in _INT32
                    or op.seed2 not in _INT32):
        return None
    return Kernel(op.rnn_mode, "skip_input" if config.skip_input else "linear_input",
                  op.direction, dropout, op.seed if dropout else 0,
                  op.seed2 if dropout else 0, config.num_proj, op.time_major, config.is_lstm)


def runs_here(input) -> bool:
    """Whether the kernel may run this call: eagerly, on a GPU; traced, where TensorFlow
    sees a GPU (the implementation selector then places it)."""
    if not _visible_gpus():
        return False
    return not tf.executing_eagerly() or _device_type(input) == "GPU"


def rnn(static, input, input_h, input_c, params, lengths):
    """``(output, output_h, output_c)`` by TensorFlow's kernel, as ``graph.rnn`` computes
    them. `static` is a ``Kernel``; `lengths` an int32 [B] tensor in range, or None."""
    dtype = input.dtype
    swap = lambda a: tf.transpose(a, [1, 0, 2])  # noqa: E731
    x = swap(input) if static.time_major else input  # [B, T, F]: the kernel's layout
    # ours <-> time-major [L·D, B, P] (a transposition: its own inverse)
    states = (lambda a: a) if static.time_major else swap
    h0 = states(input_h)
    c0 = states(input_c) if static.lstm else None
    shape = tf.shape(x)
    if lengths is None:
        kernel_lengths, running, started = tf.fill(shape[:1], shape[1]), None, None
    else:
        running = tf.sequence_mask(lengths, shape[1])[..., None]  # [B, T, 1]
        started = (lengths > 0)[None, :, None]  # [1, B, 1], for the states
        x = tf.where(running, x, tf.zeros_like(x))  # padding may hold anything, even NaN
        kernel_lengths = tf.maximum(lengths, 1)  # cuDNN refuses 0: such a row runs zeros
    h_in, c_in = h0, c0
    if started is not None:  # a row that never runs: no value of its state reaches cuDNN
        h_in = tf.where(started, h0, tf.zeros_like(h0))
        c_in = None if c0 is None else tf.where(started, c0, tf.zeros_like(c0))
    # the kernel's batch-major states: [B, L·D, P] in shape, [L·D, B, P] in memory
    memory = lambda s: tf.reshape(s, [-1, s.shape[0], s.shape[2]])  # noqa: E731
    output, output_h, output_c, _, _ = _kernel(
        input=_first_order(x), input_h=memory(_first_order(h_in)),
        input_c=memory(_first_order(c_in)) if static.lstm else tf.zeros((), dtype),
        params=_first_order(params), sequence_lengths=kernel_lengths,
        rnn_mode=static.rnn_mode, input_mode=static.input_mode, direction=static.direction,
        dropout=static.dropout, seed=static.seed, seed2=static.seed2,
        num_proj=static.num_proj, is_training=True, time_major=False)
    output_h = tf.reshape(output_h, tf.shape(h0))
    output_c = tf.reshape(output_c, tf.shape(c0)) if static.lstm else None
    if running is not None:  # (also the step a row of length 0 ran on zeros)
        output = tf.where(running, output, tf.zeros_like(output))
        output_h = tf.where(started, output_h, h0)
        output_c = tf.where(started, output_c, c0) if static.lstm else None
    output_c = states(output_c) if static.lstm else tf.zeros((0,), dtype)
    return swap(output) if static.time_major else output, states(output_h), output_c


@tf.custom_gradient
def _first_order(tensor):
    """`tensor`, whose gradient is a ``PreventGradient``: a second derivative through the
    kernel fails with ``SECOND_ORDER`` before it reaches CudnnRNNBackpropV3."""
    return tf.identity(tensor), lambda grad: tf.raw_ops.PreventGradient(
        input=grad, message=SECOND_ORDER)
