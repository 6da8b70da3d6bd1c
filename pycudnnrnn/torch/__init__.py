"""PyTorch over pycudnnrnn: operators, drop-in ``nn`` modules, and ``CudnnRNN``.

* ``LSTM``, ``GRU``, ``RNN``: drop-in replacements for ``torch.nn``'s, subclasses of
  ``torch.nn.RNNBase`` whose weights are views of one cuDNN-layout buffer
  (``pycudnnrnn.torch.modules``); ``InputValueError`` and ``InputTypeError``, what they
  raise for bad calls (both the library's and torch.nn's exception types);
* ``CudnnRNN``: the same network with TensorFlow's attributes (``cudnn_rnn``);
* ``rnn`` and ``torch.ops.pycudnnrnn.forward`` / ``backprop``: the operators, which
  ``torch.compile``, ``torch.export`` and CUDA graphs accept (``ops``).

Eager CPU calls run on PyTorch's own fused RNN kernels, the ones ``torch.nn``'s RNNs
call (``torch_kernels``). Compiled, exported and transformed CPU calls run the op, whose CPU
kernels run those same kernels for float32 and float64 without a dropout mask, and the
NumPy backend otherwise; ``set_cpu_kernels("numpy")`` sends every CPU call to the NumPy
backend. CUDA tensors run on cuDNN, through DLPack without copies. Importing this package
imports torch (``import pycudnnrnn`` does not); without PyTorch it raises an
``ImportError`` naming the extra, ``pip install '.[torch]'``.
"""

from ..core.extras import require as _require

_require("pycudnnrnn.torch", "torch", "torch")  # missing: an ImportError naming the extra

from .cudnn_rnn import CudnnRNN, CudnnRNNFunction
from .errors import InputTypeError, InputValueError
from .functional import rnn
from .layerwise import second_order_dropout
from .modules import GRU, LSTM, RNN
from .torch_kernels import cpu_kernels, set_cpu_kernels

__all__ = ["LSTM", "GRU", "RNN", "CudnnRNN", "CudnnRNNFunction", "rnn", "InputValueError",
           "InputTypeError", "set_cpu_kernels", "cpu_kernels", "second_order_dropout"]
