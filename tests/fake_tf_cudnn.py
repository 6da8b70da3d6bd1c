"""A stand-in for TensorFlow's ``CudnnRNNV3`` GPU kernel, quirks included.

It computes with ``pycudnnrnn.tensorflow.graph.rnn`` and behaves as TensorFlow's kernel
does where ``pycudnnrnn.tensorflow.cudnn`` must fix it (tensorflow/core/kernels/
cudnn_rnn_ops.cc, and the descriptor in xla/stream_executor/cuda/cuda_dnn.cc):

* ``time_major=False``: the input and output are batch-major, but ``input_h`` and
  ``input_c`` (shape [B, L·D, P]) are read as [L·D, B, P] memory, and the final states
  are written back as that memory.
* A sequence length of 0 is refused (cuDNN's BAD_PARAM; an ``InvalidArgumentError``
  here). ``sequence_lengths`` is required.
* ``time_major=True`` with a row shorter than the time axis is refused. The kernel turns
  on cuDNN's padded I/O only then (``ShouldUsePaddedIO``: batch-major calls always),
  but caches cuDNN's descriptor per node by sizes, not by that flag: a node whose first
  call had full rows runs later ragged ones with padded I/O off, which cuDNN fails
  (tensorflow/tensorflow#41630, whose fix keyed the cache by max_seq_length alone).
* ``auto_select``: skip_input when input_size equals ``input_h``'s last size (num_proj
  when projecting), not num_units.
* A non-LSTM ``output_c`` is a scalar; with ``is_training=False`` so is the reserve
  space, and TensorFlow's gradient refuses the call (``ValueError``).
* The gradient of the input past each row's length is what cuDNN leaves in memory
  TensorFlow does not clear: NaN here.
* TensorFlow has no gradient of ``CudnnRNNBackpropV3``: a second derivative is a
  ``LookupError``.

``CALLS`` records each call's attributes (once per trace inside a ``tf.function``).
"""

import tensorflow as tf

from pycudnnrnn.core import checks
from pycudnnrnn.tensorflow import graph

CALLS = []

NO_SECOND_ORDER = "No gradient defined for operation CudnnRNNBackpropV3 (stand-in)"


def CudnnRNNV3(input, input_h, input_c, params, sequence_lengths, rnn_mode="lstm",
               input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
               seed2=0, num_proj=0, is_training=True, time_major=True, name=None):
    """``tf.raw_ops.CudnnRNNV3``'s arguments and results, as its GPU kernel computes them."""
    CALLS.append(dict(rnn_mode=rnn_mode, input_mode=input_mode, direction=direction,
                      dropout=dropout, seed=seed, seed2=seed2, num_proj=num_proj,
                      is_training=is_training, time_major=time_major))
    lstm = rnn_mode == "lstm"
    dirs = 2 if direction == "bidirectional" else 1
    dtype = input.dtype
    P = input_h.shape[2]
    H = input_c.shape[2] if lstm else P
    LD = input_h.shape[0 if time_major else 1]
    if input_mode == "auto_select":  # TensorFlow's rule: the state's width, not num_units
        input_mode = "skip_input" if input.shape[2] == P else "linear_input"
    config = checks.make_config(  # (skip_input with input_size != num_units: refused)
        rnn_mode=rnn_mode, num_layers=LD // dirs, num_units=H, input_size=input.shape[2],
        input_mode=input_mode, direction=direction, num_proj=num_proj,
        dropout=dropout, seed=seed, seed2=seed2)
    lengths = tf.cast(sequence_lengths, tf.int32)
    refused = [tf.debugging.assert_positive(
        lengths, message="CudnnRNNV3 (stand-in): cuDNN refuses a sequence length of 0")]
    if time_major:
        refused.append(tf.debugging.assert_equal(
            lengths, tf.shape(input)[0], message="CudnnRNNV3 (stand-in): time-major with "
            "ragged lengths may run on a descriptor cached with padded I/O off"))
    with tf.control_dependencies(refused):
        lengths = tf.identity(lengths)
    x = input if time_major else tf.transpose(input, [1, 0, 2])
    shape = tf.shape(x)
    memory = lambda s: s if time_major else tf.reshape(s, [LD, shape[1], s.shape[2]])  # noqa: E731
    written = lambda s: s if time_major else tf.reshape(s, [shape[1], LD, s.shape[2]])  # noqa: E731
    cdt = tf.float32 if dtype.size == 2 else dtype
    combined = checks.dropout_seed(seed, seed2)
    seed_tensor = tf.constant(combined - (1 << 64) if combined >> 63 else combined, tf.int64)
    masks = graph.masks(config, is_training, (shape[0], shape[1]), seed_tensor, cdt)

    def compute(x, h, c, p):
        y, hy, cy = graph.rnn(config, True, x, memory(h), memory(c) if lstm else None, p,
                              lengths, masks)
        return y, hy, (cy if lstm else tf.zeros((), dtype))

    @tf.custom_gradient
    def run(x, h, c, p):
        def gradient(dy, dh, dc):
            if not is_training:  # (cudnn_rnn_grad.py)
                raise ValueError("To use CudnnRNNV3 in gradients, is_training must be set "
                                 "to True.")
            with tf.GradientTape() as tape:
                tape.watch([x, h, c, p])
                results = compute(x, h, c, p)
            grads = tape.gradient(results, [x, h, c, p], output_gradients=[dy, dh, dc],
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            ran = tf.transpose(tf.sequence_mask(lengths, shape[0]))[..., None]
            grads[0] = tf.where(ran, grads[0], tf.fill(tf.shape(grads[0]),
                                                       tf.constant(float("nan"), dtype)))
            return [tf.raw_ops.PreventGradient(input=g, message=NO_SECOND_ORDER)
                    for g in grads]
        return compute(x, h, c, p), gradient

    y, hy, cy = run(x, input_h, input_c, params)
    if not time_major:
        y = tf.transpose(y, [1, 0, 2])
        hy = written(hy)
        cy = written(cy) if lstm else cy
    reserve = tf.zeros((1,) if is_training else (), dtype)
    return y, hy, cy, reserve, tf.zeros((), tf.int8)
