"""pycudnnrnn inside TensorFlow: the op pair where TensorFlow has no kernel for it.

TensorFlow registers ``CudnnRNNV3`` and ``CudnnRNNBackpropV3`` for NVIDIA GPUs alone; on
a CPU they fail with "no registered kernels". This package computes the same function
in TensorFlow's own operations (``graph``), so that a ``GradientTape`` differentiates it
(to any order), a ``tf.function`` traces it (XLA's ``jit_compile`` too), and a
SavedModel stores it as TensorFlow's operations: the saved model runs where this library
is not installed (TensorFlow Serving, say). On a GPU, TensorFlow's own ``CudnnRNNV3``
kernel computes it (``cudnn``), with our params buffer as it is.

* ``rnn``: the differentiable forward, in the style of ``pycudnnrnn.torch.rnn`` and
  ``pycudnnrnn.jax.rnn``.
* ``cudnn_rnn_v3`` and ``cudnn_rnn_backprop_v3``: the raw pair, with the arguments and
  results of ``tf.raw_ops.CudnnRNNV3`` and ``tf.raw_ops.CudnnRNNBackpropV3``.

``import pycudnnrnn`` does not import this package (nor TensorFlow). Without TensorFlow,
importing it raises an ``ImportError`` naming the extra.
"""

from ..core.extras import require as _require

_require("pycudnnrnn.tensorflow", "tensorflow", "tensorflow")  # missing: names the extra

from .ops import cudnn_rnn_backprop_v3, cudnn_rnn_v3, rnn  # noqa: E402

__all__ = ["rnn", "cudnn_rnn_v3", "cudnn_rnn_backprop_v3"]
