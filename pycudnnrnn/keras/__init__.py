"""Keras 3 ``LSTM`` and ``GRU`` layers whose recurrence is pycudnnrnn's op.

``pycudnnrnn.keras.LSTM`` and ``GRU`` subclass ``keras.layers.LSTM`` and ``GRU``. They
override only ``inner_loop``: on the JAX backend it calls ``pycudnnrnn.jax.rnn``, on the
PyTorch backend ``pycudnnrnn.torch.rnn``. On the CPU, the JAX backend runs a
``lax.scan`` that XLA compiles; the PyTorch backend runs float32 and float64 on
PyTorch's fused RNN kernels, and float16 and bfloat16 on the NumPy backend. On CUDA
both run cuDNN. A configuration cuDNN does not compute, and the TensorFlow backend, run
Keras's own loop. ``Bidirectional`` runs a pair of them as one bidirectional call.
``replace_layers`` rebuilds a model with them in place of Keras's, weights included.

``import pycudnnrnn`` does not import this module (nor Keras). Importing it without Keras,
or without the framework of Keras's backend, raises an ``ImportError`` that names the
extra to install.
"""

from ..core.extras import require_keras as _require_keras

_require_keras()  # Keras or its backend missing: an ImportError naming the extra

from .layers import GRU, LSTM, Bidirectional
from .models import replace_layers

__all__ = ["LSTM", "GRU", "Bidirectional", "replace_layers"]
