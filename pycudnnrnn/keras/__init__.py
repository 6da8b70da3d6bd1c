"""Keras 3 ``LSTM`` and ``GRU`` layers whose recurrence is pycudnnrnn's op.

``pycudnnrnn.keras.LSTM`` and ``GRU`` subclass ``keras.layers.LSTM`` / ``GRU`` and
override only ``inner_loop``: on the JAX backend it calls ``pycudnnrnn.jax.rnn``, on the
PyTorch backend ``pycudnnrnn.torch.rnn`` (NumPy on the CPU, cuDNN on CUDA); a
configuration cuDNN does not compute, and the TensorFlow backend, run Keras's own loop.
``Bidirectional`` runs a pair of them as one bidirectional call. ``replace_layers`` rebuilds a model with them in place of Keras's, weights included.

``import pycudnnrnn`` does not import this module (nor Keras).
"""

from .layers import GRU, LSTM, Bidirectional
from .models import replace_layers

__all__ = ["LSTM", "GRU", "Bidirectional", "replace_layers"]
