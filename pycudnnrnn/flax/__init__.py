"""pycudnnrnn for Flax: NNX modules ``LSTM``, ``GRU`` and ``SimpleRNN`` on cuDNN's RNN.

Each module is a whole (stacked, optionally bidirectional) network in one op call,
``pycudnnrnn.jax.rnn``: cuDNN on a CUDA GPU; on the CPU, the same function in JAX's own
operations (the NumPy backend's custom call when dropout draws masks). The weights are one ``nnx.Param`` in cuDNN's layout; ``from_flax`` and
``to_flax`` convert from and to Flax's own cells (``nnx.OptimizedLSTMCell``,
``nnx.LSTMCell``, ``nnx.GRUCell``, ``nnx.SimpleCell``). See ``docs/flax.md``.

``import pycudnnrnn`` does not import this module (nor Flax). Without JAX or Flax,
importing it raises an ``ImportError`` naming the extra to install, ``flax``.
"""

from ..core.extras import require as _require

_require("pycudnnrnn.flax", "flax", "jax", "flax")  # missing: an ImportError naming the extra

from .modules import GRU, LSTM, SimpleRNN

__all__ = ["LSTM", "GRU", "SimpleRNN"]
