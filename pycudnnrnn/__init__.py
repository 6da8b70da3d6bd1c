"""pycudnnrnn: cuDNN's recurrent networks for any array library, with a NumPy twin.

The functional API mirrors TensorFlow's ``CudnnRNNV3`` / ``CudnnRNNBackpropV3`` op pair:
:func:`forward` and :func:`backprop` over an opaque :func:`params_size`-long buffer,
which :func:`canonical_to_params` and :func:`params_to_canonical` convert.
"""

from .api import backprop, canonical_to_params, forward, params_size, params_to_canonical

__version__ = "0.1.0"

__all__ = ["params_size", "canonical_to_params", "params_to_canonical", "forward", "backprop",
           "__version__"]
