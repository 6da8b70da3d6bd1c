"""The RNN as PyTorch operators: ``torch.ops.pycudnnrnn.forward`` and ``.backprop``.

Both are ``torch.library.custom_op`` s, so ``torch.compile(fullgraph=True)``, ``torch.export``
and CUDA graphs see one opaque node per call rather than Python they cannot trace. Each
has a fake (shapes, dtypes and the reserve space's size without running anything), a vmap
rule and, for the forwards, an autocast rule; ``pycudnnrnn.torch.autograd`` gives the
forwards their autograd formulas. ``forward_weights`` and ``backprop_weights`` take
torch.nn's list of weights (the drop-in modules' parameters) in place of ``params``.

Arguments are the functional API's, with two changes for tracing: the dropout seed is
an optional 0-d int64 tensor holding the combined 64-bit seed (None means seed 0: what
the modules and ``pycudnnrnn.torch.rnn`` pass when no dropout mask is drawn; otherwise
they pass a CPU tensor), and
``sequence_lengths`` an optional integer tensor. As tensors, a fresh seed per step and new
lengths are graph inputs: plain ``torch.compile`` traces them without recompiling (a
Python int or list would be baked into the graph, or guarded on). Under
``mode="reduce-overhead"``, CUDA graphs engage when no sequence_lengths are given and no
dropout mask is drawn; lengths and a dropout seed are host tensors (cuDNN's descriptors
and dropout state need host values, and a captured graph would hold the lengths it was
captured with), so Inductor's CUDA-graph trees skip graphs with them. Outputs are always
fresh tensors (never views of the inputs); the reserve space's size depends on shapes
and attributes alone, never on the lengths (``op_backends.reserve_nbytes``).
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Optional

import torch
from torch import Tensor

from .. import errors
from ..core import layout
from ..core.config import Attributes
from . import flat_weights, op_backends

_LIB = "pycudnnrnn"

# torch._dynamo, imported on a stack of its own. A custom op imports torch._dynamo on its
# first call (PyTorch wraps its kernels in ``torch._disable_dynamo``), and that import
# (``torch.fx.wrap`` keeps its own frame, whose callers are the importer's) puts every
# frame on the caller's stack in a reference cycle, the user's module with them: the
# module then outlived its last reference until the next garbage collection, and under
# DistributedDataParallel that kept the process group alive into interpreter exit, where
# gloo aborted. Importing torch._dynamo with this package fixed that but cost seconds at
# every ``import pycudnnrnn.torch`` (docs/performance.md); so the first call that needs
# it imports it on a thread of its own, whose frames hold nothing of the caller's.


def import_dynamo():
    """Import ``torch._dynamo`` before a first op call, holding none of the caller's frames.

    The import runs on a new thread, the caller waiting; where that could deadlock (the
    calling thread is itself importing a module, whose import lock the thread could need)
    or a thread cannot start, it runs here, as PyTorch would import it. Nothing to do when
    torch._dynamo is imported already (``torch.compile`` and ``torch.export`` import it).
    """
    if "torch._dynamo" in sys.modules:
        return
    with _DYNAMO_LOCK:
        if "torch._dynamo" in sys.modules:
            return
        # (Not while the interpreter finalizes: Python 3.11 then never starts a thread,
        # and the caller would wait for it forever.)
        if not (_importing() or sys.is_finalizing()):
            failed = []

            def run():
                try:
                    importlib.import_module("torch._dynamo")
                except BaseException:  # noqa: B902  (raised again below, on the caller's)
                    failed.append(True)

            try:
                thread = threading.Thread(target=run, name="pycudnnrnn: import torch._dynamo",
                                          daemon=True)
                thread.start()
                thread.join()
            except RuntimeError:  # no thread at interpreter shutdown
                pass
            if "torch._dynamo" in sys.modules and not failed:
                return
        importlib.import_module("torch._dynamo")  # here: its error, if any, is the caller's


_DYNAMO_LOCK = threading.Lock()


def _importing():
    """Whether the calling thread is executing an import (a module's body, at any depth)."""
    frame = sys._getframe(1)
    try:
        while frame is not None:
            if frame.f_globals.get("__name__") in ("importlib._bootstrap", "_frozen_importlib"):
                return True
            frame = frame.f_back
        return False
    finally:
        del frame  # a frame held here would put this one in a cycle: what this avoids


def _import_dynamo_first(op):
    """Have `op`'s kernels call ``import_dynamo`` first: for direct callers of the op
    (``torch.ops.pycudnnrnn.forward``), whom ``autograd.apply`` does not see. Through
    PyTorch's kernel table of a ``custom_op`` (private): where it is not there, they are
    left as they are."""
    table = getattr(op, "_backend_fns", None)
    if not isinstance(table, dict):
        return
    for key, kernel in list(table.items()):
        table[key] = _after_dynamo(kernel)


def _after_dynamo(kernel):
    def first_imports_dynamo(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            import_dynamo()
        return kernel(*args, **kwargs)
    first_imports_dynamo.__wrapped__ = kernel
    return first_imports_dynamo


@torch.library.custom_op(f"{_LIB}::forward", mutates_args=())
def forward(input: Tensor, input_h: Tensor, input_c: Optional[Tensor], params: Tensor,
            sequence_lengths: Optional[Tensor], seed: Optional[Tensor], rnn_mode: str,
            input_mode: str, direction: str, dropout: float, num_proj: int, time_major: bool,
            is_training: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``pycudnnrnn.forward``: (output, output_h, output_c, reserve_space)."""
    attributes = schema_attributes(rnn_mode, input_mode, direction, dropout, num_proj,
                                   time_major, is_training)
    outputs = op_backends.run_forward(input, input_h, input_c, params, sequence_lengths, seed,
                                      attributes)
    return _fresh_all(outputs, _tensors(input, input_h, input_c, params))


@forward.register_fake
def _forward_fake(input, input_h, input_c, params, sequence_lengths, seed, rnn_mode, input_mode,
                  direction, dropout, num_proj, time_major, is_training):
    _refuse_meta(input=input, input_h=input_h, input_c=input_c, params=params,
                 sequence_lengths=sequence_lengths, seed=seed)
    attributes = schema_attributes(rnn_mode, input_mode, direction, dropout, num_proj,
                                   time_major, is_training)
    problem = op_backends.problem(input, input_h, input_c, params, attributes)
    return _forward_results(problem, input, input_h, input_c)


@torch.library.custom_op(f"{_LIB}::forward_weights", mutates_args=())
def forward_weights(input: Tensor, input_h: Tensor, input_c: Optional[Tensor],
                    weights: list[Tensor], has_biases: bool,
                    sequence_lengths: Optional[Tensor], seed: Optional[Tensor], rnn_mode: str,
                    direction: str, dropout: float, num_proj: int,
                    time_major: bool, is_training: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``forward`` with torch.nn's weights (``_flat_weights`` order) for ``params``.

    The CPU's PyTorch kernels run on the weights as they are. Elsewhere, when they are
    views of one cuDNN-layout buffer (the modules make them so) that buffer is the params,
    without a copy; otherwise they are concatenated once.
    """
    attributes = schema_attributes(rnn_mode, "linear_input", direction, dropout, num_proj,
                                   time_major, is_training)
    params = _weights_params(input, input_h, input_c, weights, has_biases, attributes)
    outputs = op_backends.run_forward(input, input_h, input_c, params, sequence_lengths, seed,
                                      attributes)
    return _fresh_all(outputs, _tensors(input, input_h, input_c, *weights))


@forward_weights.register_fake
def _forward_weights_fake(input, input_h, input_c, weights, has_biases, sequence_lengths, seed,
                          rnn_mode, direction, dropout, num_proj, time_major, is_training):
    _refuse_meta(input=input, input_h=input_h, input_c=input_c, sequence_lengths=sequence_lengths,
                 seed=seed, **{f"weights[{k}]": w for k, w in enumerate(weights)})
    attributes = schema_attributes(rnn_mode, "linear_input", direction, dropout, num_proj,
                                   time_major, is_training)
    problem, _ = flat_weights.weights_problem(input, input_h, input_c, weights, has_biases,
                                              attributes)
    return _forward_results(problem, input, input_h, input_c)


def _forward_results(problem, input, input_h, input_c):
    """Fake (output, output_h, output_c, reserve) of a validated forward `problem`."""
    c = problem.config
    output = input.new_empty(problem.data_shape(c.num_dirs * c.state_size))
    output_c = input_c.new_empty(input_c.shape) if c.is_lstm else input.new_empty((0,))
    nbytes = _fake_reserve_nbytes(problem, input)
    if nbytes is None:  # a size the graph learns at run time (CUDA graphs then leave it out)
        nbytes = torch.library.get_ctx().new_dynamic_size()
    reserve = input.new_empty((nbytes,), dtype=torch.uint8)
    return output, input_h.new_empty(input_h.shape), output_c, reserve


def _fake_reserve_nbytes(problem, like):
    """``op_backends.reserve_nbytes``, or None where no GPU can tell it (tracing for CUDA on
    a machine without one: a PyTorch without CUDA, or no cuDNN)."""
    try:
        return op_backends.reserve_nbytes(problem, like)
    except errors.CudnnError:
        raise
    except (errors.CudnnUnavailableError, RuntimeError, AssertionError):
        return None  # AssertionError: "Torch not compiled with CUDA enabled"


def _weights_params(input, input_h, input_c, weights, has_biases, attributes):
    """torch.nn's `weights` as the kernels' params (``flat_weights.Weights``), checked."""
    problem, slots = flat_weights.weights_problem(input, input_h, input_c, weights, has_biases,
                                                  attributes)
    return flat_weights.Weights([w.detach() for w in weights], slots,
                                layout.params_size(problem.config), has_biases, problem)


@torch.library.custom_op(f"{_LIB}::backprop", mutates_args=())
def backprop(input: Tensor, input_h: Tensor, input_c: Optional[Tensor], params: Tensor,
             sequence_lengths: Optional[Tensor], seed: Optional[Tensor], output: Tensor,
             output_h: Tensor, output_c: Tensor, output_backprop: Tensor,
             output_h_backprop: Tensor, output_c_backprop: Tensor, reserve_space: Tensor,
             rnn_mode: str, input_mode: str, direction: str, dropout: float, num_proj: int,
             time_major: bool, gradients: str, trust_reserve: bool = False
             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``pycudnnrnn.backprop``; the gradients `gradients` leaves out are empty ``(0,)``.

    `trust_reserve` is for the forward ops' autograd formula, which passes the forward's
    own reserve space: on CUDA its header is then not read back from the GPU (a sync,
    refused under CUDA-graph capture) when the tensor object is not forward's (CUDA-graph
    trees rebuild them). Left False, a reserve space of unknown origin is checked.
    """
    attributes = schema_attributes(rnn_mode, input_mode, direction, dropout, num_proj,
                                   time_major, True)
    return _run_backprop(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                         output_c, output_backprop, output_h_backprop, output_c_backprop,
                         reserve_space, attributes, gradients, [params], trust_reserve)


@backprop.register_fake
def _backprop_fake(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                   output_c, output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                   rnn_mode, input_mode, direction, dropout, num_proj, time_major, gradients,
                   trust_reserve=False):
    _refuse_meta(input=input, input_h=input_h, input_c=input_c, params=params,
                 sequence_lengths=sequence_lengths, seed=seed, output=output,
                 output_backprop=output_backprop, reserve_space=reserve_space)
    return _backprop_results(input, input_h, input_c, params.shape, rnn_mode, gradients)


@torch.library.custom_op(f"{_LIB}::backprop_weights", mutates_args=())
def backprop_weights(input: Tensor, input_h: Tensor, input_c: Optional[Tensor],
                     weights: list[Tensor], has_biases: bool,
                     sequence_lengths: Optional[Tensor], seed: Optional[Tensor], output: Tensor,
                     output_h: Tensor, output_c: Tensor,
                     output_backprop: Tensor, output_h_backprop: Tensor,
                     output_c_backprop: Tensor, reserve_space: Tensor, rnn_mode: str,
                     direction: str, dropout: float, num_proj: int, time_major: bool,
                     gradients: str, trust_reserve: bool = False
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``backprop`` with torch.nn's weights; the params gradient is flat (cuDNN's layout);
    `trust_reserve` as for ``backprop``."""
    attributes = schema_attributes(rnn_mode, "linear_input", direction, dropout, num_proj,
                                   time_major, True)
    params = _weights_params(input, input_h, input_c, weights, has_biases, attributes)
    return _run_backprop(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                         output_c, output_backprop, output_h_backprop, output_c_backprop,
                         reserve_space, attributes, gradients, weights, trust_reserve)


@backprop_weights.register_fake
def _backprop_weights_fake(input, input_h, input_c, weights, has_biases, sequence_lengths, seed,
                           output, output_h, output_c, output_backprop, output_h_backprop,
                           output_c_backprop, reserve_space, rnn_mode, direction, dropout,
                           num_proj, time_major, gradients, trust_reserve=False):
    _refuse_meta(input=input, input_h=input_h, input_c=input_c, sequence_lengths=sequence_lengths,
                 seed=seed, output=output, output_backprop=output_backprop,
                 reserve_space=reserve_space, **{f"weights[{k}]": w for k, w in enumerate(weights)})
    attributes = schema_attributes(rnn_mode, "linear_input", direction, dropout, num_proj,
                                   time_major, True)
    problem, _ = flat_weights.weights_problem(input, input_h, input_c, weights, has_biases,
                                              attributes)
    size = (layout.params_size(problem.config),)
    return _backprop_results(input, input_h, input_c, size, rnn_mode, gradients)


def _run_backprop(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                  output_c, output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                  attributes, gradients, weights, trust_reserve):
    lstm = attributes.lstm
    grads = op_backends.run_backprop(input, input_h, input_c if lstm else None, params,
                                     sequence_lengths, seed, output, output_h,
                                     output_c if lstm else None, output_backprop, output_h_backprop,
                                     output_c_backprop if lstm else None, reserve_space,
                                     attributes, gradients, trust_reserve)
    given = _Storages(_tensors(input, input_h, input_c, *weights, output, output_h, output_c,
                               output_backprop, output_h_backprop, output_c_backprop,
                               reserve_space))
    return tuple(input.new_empty((0,)) if g is None else _fresh(g, given) for g in grads)


def _backprop_results(input, input_h, input_c, params_shape, rnn_mode, gradients):
    data, weights = gradients in ("all", "data"), gradients in ("all", "weights")
    lstm = rnn_mode == "lstm"
    like = lambda t, wanted: t.new_empty(t.shape) if wanted else input.new_empty((0,))
    return (like(input, data), like(input_h, data),
            like(input_c, data) if lstm else input.new_empty((0,)),
            input.new_empty(params_shape) if weights else input.new_empty((0,)))


def _vmap_by_loop(op):
    """A vmap rule for `op`: one call per batch element, results stacked on axis 0.

    What PyTorch's fallback does for ops it can batch, which it cannot for ops with a
    list of tensors (the weights); registered for all four ops alike.
    """
    def select(value, dim, k):
        if isinstance(value, list):
            dims = dim if isinstance(dim, (list, tuple)) else [dim] * len(value)
            return [select(v, d, k) for v, d in zip(value, dims)]
        return value if dim is None or value is None else value.select(dim, k)

    def rule(info, in_dims, *args):
        calls = [op(*(select(a, d, k) for a, d in zip(args, in_dims)))
                 for k in range(info.batch_size)]
        return tuple(torch.stack(parts) for parts in zip(*calls)), (0,) * len(calls[0])

    torch.library.register_vmap(op, rule)


for _op in (forward, forward_weights, backprop, backprop_weights):
    _vmap_by_loop(_op)
    _import_dynamo_first(_op)


# torch.autograd's own batching (``torch.autograd.grad(is_grads_batched=True)``, the
# ``vectorize=True`` of ``torch.autograd.functional.jacobian`` and ``hessian``) is older
# than torch.func's vmap: its batched tensors have a dispatch key of their own, which
# ``register_vmap`` does not reach. Its fallback runs an op once per batch element, but
# not an op that takes a list of tensors: the ``_weights`` ops run as ``forward`` and
# ``backprop`` on the weights laid out in one flat params, which that fallback takes.

def _flat_params_of(input, input_h, input_c, weights, has_biases, attributes):
    """torch.nn's `weights` as the flat params (checked as ``_weights_params`` checks
    them): the buffer they are views of, or their concatenation where some are batched
    (a batched tensor has no storage)."""
    problem, slots = flat_weights.weights_problem(input, input_h, input_c, weights, has_biases,
                                                  attributes)
    size = layout.params_size(problem.config)
    if any(torch._C._functorch.is_legacy_batchedtensor(w) for w in weights):
        return flat_weights.concatenated(weights, slots, size)
    return flat_weights.flat_params(weights, slots, size)


def _forward_weights_batched(input, input_h, input_c, weights, has_biases, sequence_lengths,
                             seed, rnn_mode, direction, dropout, num_proj, time_major,
                             is_training):
    attributes = schema_attributes(rnn_mode, "linear_input", direction, dropout, num_proj,
                                   time_major, is_training)
    params = _flat_params_of(input, input_h, input_c, weights, has_biases, attributes)
    return forward(input, input_h, input_c, params, sequence_lengths, seed, rnn_mode,
                   "linear_input", direction, dropout, num_proj, time_major, is_training)


def _backprop_weights_batched(input, input_h, input_c, weights, has_biases, sequence_lengths,
                              seed, output, output_h, output_c, output_backprop,
                              output_h_backprop, output_c_backprop, reserve_space, rnn_mode,
                              direction, dropout, num_proj, time_major, gradients,
                              trust_reserve=False):
    attributes = schema_attributes(rnn_mode, "linear_input", direction, dropout, num_proj,
                                   time_major, True)
    params = _flat_params_of(input, input_h, input_c, weights, has_biases, attributes)
    return backprop(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                    output_c, output_backprop, output_h_backprop, output_c_backprop,
                    reserve_space, rnn_mode, "linear_input", direction, dropout, num_proj,
                    time_major, gradients, trust_reserve)


_BATCHED_LIBRARY = torch.library.Library(_LIB, "FRAGMENT")
_BATCHED_LIBRARY.impl("forward_weights", _forward_weights_batched, "Batched")
_BATCHED_LIBRARY.impl("backprop_weights", _backprop_weights_batched, "Batched")


def _refuse_meta(**tensors):
    """Refuse meta tensors: PyTorch runs the fake on them, whose results hold no values.

    Fake tensors (tracing) are not refused: they report the device they stand for.
    """
    from torch._subclasses.fake_tensor import FakeTensor
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device.type == "meta" and \
                not isinstance(t, FakeTensor):
            raise TypeError(f"{name}: expected a tensor with data (CPU or CUDA), got a tensor on "
                            f"the meta device; a meta tensor has no values to compute with "
                            f"(for shapes alone use torch.export or FakeTensorMode)")


# The adapter above the ops carries a call's attributes as one ``Attributes`` (its seed
# and seed2 unused: the seed travels as a tensor, a graph input) and, beside it,
# `has_biases`: None where the weights are ``[params]``, the flat cuDNN-layout buffer,
# else torch.nn's ``bias`` for its list of weights. The ops' schema takes scalars: the
# functions below are where one becomes the other, and the ops' bodies (and fakes) make
# one ``Attributes`` of their scalars, which ``op_backends`` and ``flat_weights`` take.

def schema_attributes(rnn_mode, input_mode, direction, dropout, num_proj, time_major,
                      is_training) -> Attributes:
    """The schema's scalar attributes as one ``Attributes`` (seed and seed2 0: the op's
    seed is a tensor); backprop's, which has no is_training, are training's (True).

    Made once per distinct attributes and then remembered: every op call makes one, and a
    frozen dataclass costs several times a dict to build. Keyed on the values' types too
    (True and 1, 0 and 0.0 are one key, not one attribute).
    """
    key = (rnn_mode, input_mode, direction, dropout, num_proj, time_major, is_training,
           type(dropout), type(num_proj), type(time_major), type(is_training))
    try:
        found = _schema_attributes.get(key)
    except TypeError:  # an unhashable value: the checks will name it
        found, key = None, None
    if found is None:
        found = Attributes(rnn_mode=rnn_mode, input_mode=input_mode, direction=direction,
                           dropout=dropout, num_proj=num_proj, time_major=time_major,
                           is_training=is_training)
        if key is not None:
            if len(_schema_attributes) >= 256:  # a bound: a process uses a few
                _schema_attributes.clear()
            _schema_attributes[key] = found
    return found


_schema_attributes: dict = {}  # the schema's scalars (and their types) → their Attributes


def check_call(input, input_h, input_c, params, attributes, **sizes):
    """The op's checks of a forward's shapes and dtypes (``op_backends.problem``), raising
    its errors; `sizes`: ``num_layers``, ``num_units``, ``input_size`` to hold them to."""
    return op_backends.problem(input, input_h, input_c, params, attributes, **sizes)


def call_forward(input, input_h, input_c, weights, has_biases, sequence_lengths, seed,
                 attributes):
    """``forward`` on ``[params]`` (`has_biases` None) or ``forward_weights`` on torch.nn's
    `weights`: ``(output, output_h, output_c, reserve_space)``."""
    a = attributes
    if has_biases is None:
        return forward(input, input_h, input_c, weights[0], sequence_lengths, seed, a.rnn_mode,
                       a.input_mode, a.direction, a.dropout, a.num_proj, a.time_major,
                       a.is_training)
    return forward_weights(input, input_h, input_c, list(weights), has_biases, sequence_lengths,
                           seed, a.rnn_mode, a.direction, a.dropout, a.num_proj, a.time_major,
                           a.is_training)


def call_backprop(input, input_h, input_c, weights, has_biases, sequence_lengths, seed, results,
                  grads, reserve_space, attributes, gradients):
    """The backprop op for ``call_forward``'s call, whose `results` ``(output, output_h,
    output_c)`` and `reserve_space` it trusts as that forward's own: ``(dx, dh, dc,
    dparams)``, dparams flat (cuDNN's layout) either way."""
    a = attributes
    if has_biases is None:
        return backprop(input, input_h, input_c, weights[0], sequence_lengths, seed, *results,
                        *grads, reserve_space, a.rnn_mode, a.input_mode, a.direction, a.dropout,
                        a.num_proj, a.time_major, gradients, True)
    return backprop_weights(input, input_h, input_c, weights, has_biases, sequence_lengths, seed,
                            *results, *grads, reserve_space, a.rnn_mode, a.direction, a.dropout,
                            a.num_proj, a.time_major, gradients, True)


def _tensors(*tensors):
    return (t for t in tensors if t is not None)


class _Storages:
    """The storage addresses of an op's input tensors, read once, when first asked."""

    def __init__(self, tensors):
        self._tensors, self._pointers = tensors, None

    def __contains__(self, pointer):
        if self._pointers is None:
            self._pointers = {t.untyped_storage().data_ptr() for t in self._tensors
                              if t.numel()}
        return pointer in self._pointers


def _fresh(result, inputs: _Storages):
    # A custom op may not return an input or a view of one. The backends return new
    # arrays today; this keeps the op's contract whatever a backend or plan returns.
    if not result.numel():
        return result
    if result.untyped_storage().data_ptr() in inputs:
        return result.clone()
    return result


def _fresh_all(results, inputs):
    inputs = _Storages(inputs)
    return tuple(_fresh(r, inputs) for r in results)


# --------------------------------------------------------------------------- autocast

def autocast_dtype(device_type):
    """The dtype autocast runs RNNs in on `device_type`, or None when it is off there."""
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def autocast(tensor, dtype):
    """`tensor` as autocast casts an RNN's inputs: floating tensors (not float64) to `dtype`."""
    if dtype is None or not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() \
            or tensor.dtype in (torch.float64, dtype):
        return tensor
    return tensor.to(dtype)


def _register_autocast(op_name):
    """Run the op in autocast's dtype, as autocast runs ``aten::lstm``: every floating
    argument (weights included) cast to ``torch.get_autocast_dtype`` of the device."""
    for device_type in ("cpu", "cuda"):
        key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
        op = getattr(torch.ops.pycudnnrnn, op_name).default

        def kernel(_keys, *args, op=op, keyset=keyset, device_type=device_type):
            dtype = torch.get_autocast_dtype(device_type)
            cast = lambda a: [autocast(t, dtype) for t in a] if isinstance(a, list) \
                else autocast(a, dtype)
            with torch._C._ExcludeDispatchKeyGuard(keyset):
                return op(*(cast(a) for a in args))

        _AUTOCAST_LIBRARY.impl(op_name, kernel, key, with_keyset=True)


_AUTOCAST_LIBRARY = torch.library.Library(_LIB, "FRAGMENT")
_register_autocast("forward")
_register_autocast("forward_weights")
