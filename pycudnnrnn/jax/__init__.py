"""pycudnnrnn as a native JAX operation: ``jit``, ``grad``, ``vmap`` and ``lax.scan``.

On the CPU, ``rnn`` is written in JAX's own operations (``pycudnnrnn.jax.scan``), which
XLA compiles with the rest of the program; JAX differentiates, batches and shards them.
Elsewhere, and on the CPU when dropout draws masks (which only the NumPy backend's
generator gives), it lowers to two XLA custom calls (``pycudnnrnn.jax.targets``) whose
handlers are ctypes callbacks, registered with ``jax.ffi.register_ffi_target`` for the
CPU (NumPy backend on host buffers) and for CUDA (cuDNN on XLA's stream); what follows
is about them. Nothing is compiled.

* Shapes, dtypes and attributes are checked at trace time by ``pycudnnrnn.core.checks``
  (``ValueError``/``TypeError`` naming the argument); ``sequence_lengths`` is an
  operand, so it may be traced: its values are checked by the handler, and a bad one
  raises the handler's message from the computation.
* ``reserve_space`` is a result of the forward call, and the workspace a result of each
  call, so XLA allocates them. Both are sized at trace time for the platform of JAX's
  default device: cuDNN's sizes on a GPU, the NumPy backend's otherwise.
* Gradients: ``jax.custom_vjp`` onto ``pycudnnrnn.backprop``'s target, with respect to
  input, input_h, input_c and params (lengths are integers, not differentiable). Second
  derivatives (``jax.hessian``, ``jvp`` or ``grad`` of ``grad``): each custom call is a
  ``jax.custom_jvp`` whose tangent comes from ``scan`` (see ``derivatives``).
* ``shard_map``: the operands are made to vary over the same manual mesh axes (a
  replicated ``params`` is cast to varying, so its gradient is summed over the axes, as
  for JAX's own operations) and the results vary over them too.
* ``vmap``: inference (``is_training=False``) folds the mapped axis into the batch, one
  call for all; training maps the call sequentially, because under ``vmap(grad(...))``
  every mapped element needs its own params gradient, which a folded call (one sum over
  the whole batch) cannot give. A mapped ``params`` is always mapped sequentially.

This module is the face; the code is in one module per job: ``op`` (``rnn``: checks and
the route), ``calls`` (the custom calls: registration, attributes, buffer sizes),
``derivatives`` (first and second order), ``batching`` (``vmap``), ``sharding``
(``shard_map``), ``scan`` (the RNN in JAX's operations), ``targets`` (the handlers) and
``xla_ffi`` (XLA's FFI structs in ctypes).

``import pycudnnrnn`` does not import this module (nor JAX). Without JAX, importing it
raises an ``ImportError`` naming the extra, ``pip install '.[jax]'``.
"""

from __future__ import annotations

from ..core.extras import require as _require

_require("pycudnnrnn.jax", "jax", "jax")  # missing: an ImportError naming the extra

from . import scan, targets
from .batching import inference as _inference
from .calls import register
from .calls import buffer_sizes as _buffer_sizes
from .calls import checked_problem as _problem
from .calls import ffi_attributes as _ffi_attributes
from .op import rnn
from .targets import BACKPROP, CHECK_LENGTHS, FORWARD

__all__ = ["rnn"]

# The private names above are those tests and benchmarks/gpu_host_bench.py reach here by.
