"""The RNN as PyTorch operators: ``torch.ops.pycudnnrnn.forward`` and ``.backprop``.

Both are ``torch.library.custom_op`` s, so ``torch.compile(fullgraph=True)``, ``torch.export``
and CUDA graphs see one opaque node per call rather than Python they cannot trace. Each
has a fake (shapes, dtypes and the reserve space's size without running anything) and the
forward has an autograd formula that calls the backprop op for just the gradients needed.

Arguments are the functional API's, with two changes for tracing: the dropout seed is a
0-d int64 tensor (a Python int would be baked into a compiled graph, so a fresh seed per
step would recompile), and ``sequence_lengths`` is an optional integer tensor.
Outputs are always fresh tensors (never views of the inputs).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import torch._dynamo  # noqa: F401  (see below)
from torch import Tensor

from .. import layout
from ..checks import dropout_seed
from . import flat_weights, kernels

_LIB = "pycudnnrnn"

# Why torch._dynamo above: a custom op imports it on its first call, and that import (its
# torch.fx.wrap calls keep their frames) puts every caller's frame in a reference cycle, the
# user's module with them. The module then outlives its last reference until the next
# garbage collection; under DistributedDataParallel that kept the process group alive into
# interpreter exit, where gloo aborted. Imported here, the cost (about a second) moves from
# the first call to this import, with no user frames on the stack (when this package is
# imported at module level, as usual).


@torch.library.custom_op(f"{_LIB}::forward", mutates_args=())
def forward(input: Tensor, input_h: Tensor, input_c: Optional[Tensor], params: Tensor,
            sequence_lengths: Optional[Tensor], seed: Tensor, rnn_mode: str, input_mode: str,
            direction: str, dropout: float, num_proj: int, time_major: bool,
            is_training: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``pycudnnrnn.forward``: (output, output_h, output_c, reserve_space)."""
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, num_proj, time_major)
    outputs = kernels.run_forward(input, input_h, input_c, params, sequence_lengths, seed, attrs,
                                  is_training)
    return tuple(_fresh(o, list(_tensors(input, input_h, input_c, params))) for o in outputs)


@forward.register_fake
def _forward_fake(input, input_h, input_c, params, sequence_lengths, seed, rnn_mode, input_mode,
                  direction, dropout, num_proj, time_major, is_training):
    _refuse_meta(input=input, input_h=input_h, input_c=input_c, params=params,
                 sequence_lengths=sequence_lengths, seed=seed)
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, num_proj, time_major)
    problem = kernels.problem(input, input_h, input_c, params, attrs, is_training)
    return _forward_results(problem, input, input_h, input_c)


@torch.library.custom_op(f"{_LIB}::forward_weights", mutates_args=())
def forward_weights(input: Tensor, input_h: Tensor, input_c: Optional[Tensor],
                    weights: list[Tensor], has_biases: bool, sequence_lengths: Optional[Tensor],
                    seed: Tensor, rnn_mode: str, direction: str, dropout: float, num_proj: int,
                    time_major: bool, is_training: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``forward`` with torch.nn's weights (``_flat_weights`` order) for ``params``.

    When the weights are views of one cuDNN-layout buffer (the modules make them so) that
    buffer is the params, without a copy; otherwise they are concatenated once.
    """
    attrs = _attrs(rnn_mode, "linear_input", direction, dropout, num_proj, time_major)
    params = _weights_params(input, input_h, input_c, weights, has_biases, attrs, is_training)
    outputs = kernels.run_forward(input, input_h, input_c, params, sequence_lengths, seed, attrs,
                                  is_training)
    return tuple(_fresh(o, list(_tensors(input, input_h, input_c, *weights))) for o in outputs)


@forward_weights.register_fake
def _forward_weights_fake(input, input_h, input_c, weights, has_biases, sequence_lengths, seed,
                          rnn_mode, direction, dropout, num_proj, time_major, is_training):
    _refuse_meta(input=input, input_h=input_h, input_c=input_c, sequence_lengths=sequence_lengths,
                 seed=seed, **{f"weights[{k}]": w for k, w in enumerate(weights)})
    attrs = _attrs(rnn_mode, "linear_input", direction, dropout, num_proj, time_major)
    problem, _ = flat_weights.weights_problem(input, input_h, input_c, weights, has_biases, attrs,
                                         is_training)
    return _forward_results(problem, input, input_h, input_c)


def _forward_results(problem, input, input_h, input_c):
    """Fake (output, output_h, output_c, reserve) of a validated forward `problem`."""
    c = problem.config
    output = input.new_empty(problem.data_shape(c.num_dirs * c.state_size))
    output_c = input_c.new_empty(input_c.shape) if c.is_lstm else input.new_empty((0,))
    nbytes = kernels.reserve_nbytes(problem, input.device)
    if nbytes is None:  # only the device knows (cuDNN): a size the graph learns at run time
        nbytes = torch.library.get_ctx().new_dynamic_size()
    reserve = input.new_empty((nbytes,), dtype=torch.uint8)
    return output, input_h.new_empty(input_h.shape), output_c, reserve


def _weights_params(input, input_h, input_c, weights, has_biases, attrs, is_training):
    problem, slots = flat_weights.weights_problem(input, input_h, input_c, weights, has_biases, attrs,
                                             is_training)
    size = layout.params_size(problem.config)
    return flat_weights.flat_params([w.detach() for w in weights], slots, size)


@torch.library.custom_op(f"{_LIB}::backprop", mutates_args=())
def backprop(input: Tensor, input_h: Tensor, input_c: Optional[Tensor], params: Tensor,
             sequence_lengths: Optional[Tensor], seed: Tensor, output: Tensor, output_h: Tensor,
             output_c: Tensor, output_backprop: Tensor, output_h_backprop: Tensor,
             output_c_backprop: Tensor, reserve_space: Tensor, rnn_mode: str, input_mode: str,
             direction: str, dropout: float, num_proj: int, time_major: bool,
             gradients: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``pycudnnrnn.backprop``; the gradients `gradients` leaves out are empty ``(0,)``."""
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, num_proj, time_major)
    return _run_backprop(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                         output_c, output_backprop, output_h_backprop, output_c_backprop,
                         reserve_space, attrs, gradients, [params])


@backprop.register_fake
def _backprop_fake(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                   output_c, output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                   rnn_mode, input_mode, direction, dropout, num_proj, time_major, gradients):
    _refuse_meta(input=input, input_h=input_h, input_c=input_c, params=params,
                 sequence_lengths=sequence_lengths, seed=seed, output=output,
                 output_backprop=output_backprop, reserve_space=reserve_space)
    return _backprop_results(input, input_h, input_c, params.shape, rnn_mode, gradients)


@torch.library.custom_op(f"{_LIB}::backprop_weights", mutates_args=())
def backprop_weights(input: Tensor, input_h: Tensor, input_c: Optional[Tensor],
                     weights: list[Tensor], has_biases: bool, sequence_lengths: Optional[Tensor],
                     seed: Tensor, output: Tensor, output_h: Tensor, output_c: Tensor,
                     output_backprop: Tensor, output_h_backprop: Tensor,
                     output_c_backprop: Tensor, reserve_space: Tensor, rnn_mode: str,
                     direction: str, dropout: float, num_proj: int, time_major: bool,
                     gradients: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``backprop`` with torch.nn's weights; the params gradient is flat (cuDNN's layout)."""
    attrs = _attrs(rnn_mode, "linear_input", direction, dropout, num_proj, time_major)
    params = _weights_params(input, input_h, input_c, weights, has_biases, attrs, True)
    return _run_backprop(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                         output_c, output_backprop, output_h_backprop, output_c_backprop,
                         reserve_space, attrs, gradients, weights)


@backprop_weights.register_fake
def _backprop_weights_fake(input, input_h, input_c, weights, has_biases, sequence_lengths, seed,
                           output, output_h, output_c, output_backprop, output_h_backprop,
                           output_c_backprop, reserve_space, rnn_mode, direction, dropout,
                           num_proj, time_major, gradients):
    _refuse_meta(input=input, input_h=input_h, input_c=input_c, sequence_lengths=sequence_lengths,
                 seed=seed, output=output, output_backprop=output_backprop,
                 reserve_space=reserve_space, **{f"weights[{k}]": w for k, w in enumerate(weights)})
    attrs = _attrs(rnn_mode, "linear_input", direction, dropout, num_proj, time_major)
    problem, _ = flat_weights.weights_problem(input, input_h, input_c, weights, has_biases, attrs, True)
    size = (layout.params_size(problem.config),)
    return _backprop_results(input, input_h, input_c, size, rnn_mode, gradients)


def _run_backprop(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                  output_c, output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                  attrs, gradients, weights):
    lstm = attrs["rnn_mode"] == "lstm"
    grads = kernels.run_backprop(input, input_h, input_c if lstm else None, params,
                                 sequence_lengths, seed, output, output_h,
                                 output_c if lstm else None, output_backprop, output_h_backprop,
                                 output_c_backprop if lstm else None, reserve_space, attrs,
                                 gradients)
    given = list(_tensors(input, input_h, input_c, *weights, output, output_h, output_c,
                          output_backprop, output_h_backprop, output_c_backprop, reserve_space))
    return tuple(input.new_empty((0,)) if g is None else _fresh(g, given) for g in grads)


def _backprop_results(input, input_h, input_c, params_shape, rnn_mode, gradients):
    data, weights = gradients in ("all", "data"), gradients in ("all", "weights")
    lstm = rnn_mode == "lstm"
    like = lambda t, wanted: t.new_empty(t.shape) if wanted else input.new_empty((0,))
    return (like(input, data), like(input_h, data),
            like(input_c, data) if lstm else input.new_empty((0,)),
            input.new_empty(params_shape) if weights else input.new_empty((0,)))


class _NoDoubleBackward(torch.autograd.Function):
    """Identity on a gradient, tied to what it was computed from; its gradient is refused.

    The backprop ops run without autograd (a custom op under torch.func's grad transform
    needs an autograd formula that composes with it, and there is none to give): where
    backward runs with grad mode on (``create_graph=True``, torch.func) the results are
    tied back to the tensors that required grad, so that a double backward raises this
    clear error instead of silently treating the gradients as constants.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(grad, *sources):
        return grad.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(
            "pycudnnrnn: double backward (the gradient of a gradient: create_graph=True then "
            "backward again, gradient penalties, MAML) is not supported: cuDNN's RNN has no "
            "second derivative, and this library's gradients come from its backprop, which "
            "has none (as PyTorch's cuDNN RNNs). First-order gradients work")


def _backprop_without_autograd(op, *args):
    """`op` (a backprop op) on `args`, its results tied by ``_NoDoubleBackward``."""
    with torch.no_grad():
        results = op(*args)
    if not torch.is_grad_enabled():
        return results
    flat = [t for a in args for t in (a if isinstance(a, list) else [a])]
    sources = [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad]
    if not sources:
        return results
    return tuple(r if r.numel() == 0 else _NoDoubleBackward.apply(r, *sources) for r in results)


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


def _attrs(rnn_mode, input_mode, direction, dropout, num_proj, time_major):
    return dict(rnn_mode=rnn_mode, input_mode=input_mode, direction=direction, dropout=dropout,
                num_proj=num_proj, time_major=time_major)


def _tensors(*tensors):
    return (t for t in tensors if t is not None)


def _fresh(result, inputs):
    # A custom op may not return an input or a view of one. The backends return new
    # arrays today; this keeps the op's contract whatever a backend or plan returns.
    if not result.numel():
        return result
    pointer = result.untyped_storage().data_ptr()
    if any(pointer == t.untyped_storage().data_ptr() for t in inputs if t.numel()):
        return result.clone()
    return result


# --------------------------------------------------------------------------- autograd
#
# One backward (``_backward_core``) behind three doors: the autograd formulas of the two
# forward ops (what torch.compile and torch.export trace, and direct callers of the ops
# get), and ``_RNN``, an autograd.Function for eager calls, which torch.func's transforms
# need (a custom op's autograd formula does not compose with them, and Dynamo does not
# trace this kind of Function).

class _Saved:
    """What backward needs of one forward call."""

    def __init__(self, options, tensors, output, weights):
        (self.rnn_mode, self.input_mode, self.direction, self.dropout, self.num_proj,
         self.time_major, self.has_biases, self.is_training) = options
        self.slots = None
        if self.has_biases is not None:  # where each weight's gradient lies in the flat one
            shapes = [tuple(w.shape) for w in weights]
            offsets = flat_weights.weight_offsets(shapes, self.has_biases, self.num_proj > 0)
            self.slots = list(zip(offsets, shapes))
        self.num_weights = len(weights)
        self.tensors = (*tensors, *output, *weights)


def _save(ctx, options, tensors, output, weights):
    saved = _Saved(options, tensors, output, weights)
    ctx.save_for_backward(*saved.tensors)
    saved.tensors = None
    ctx.pycudnnrnn = saved


def _backward_core(ctx, needs_data, needs_weights, d_output, d_output_h, d_output_c):
    """``(dx, dh, dc, weight gradients)`` for the forward saved by ``_save``."""
    s = ctx.pycudnnrnn
    if not s.is_training:
        raise RuntimeError("pycudnnrnn: backward needs forward with is_training=True (the "
                           "modules do this by themselves when a gradient is needed)")
    saved = ctx.saved_tensors
    input, input_h, input_c, sequence_lengths, seed, out, out_h, out_c, reserve = saved[:9]
    weights = list(saved[9:])
    lstm = s.rnn_mode == "lstm"
    zeros = lambda grad, like: torch.zeros_like(like) if grad is None else grad.contiguous()
    grads = (zeros(d_output, out), zeros(d_output_h, out_h),
             zeros(d_output_c, out_c) if lstm else out_c)
    gradients = "all" if needs_data and needs_weights else "data" if needs_data else "weights"
    if s.has_biases is None:
        dx, dh, dc, dparams = _backprop_without_autograd(
            backprop, input, input_h, input_c, weights[0], sequence_lengths, seed, out, out_h, out_c,
            *grads, reserve, s.rnn_mode, s.input_mode, s.direction, s.dropout, s.num_proj,
            s.time_major, gradients)
        return dx, dh, dc if lstm else None, [dparams]
    dx, dh, dc, dparams = _backprop_without_autograd(
        backprop_weights, input, input_h, input_c, weights, s.has_biases, sequence_lengths, seed, out, out_h, out_c,
        *grads, reserve, s.rnn_mode, s.direction, s.dropout, s.num_proj, s.time_major, gradients)
    # Views of the one flat gradient, so that each weight's .grad is one too.
    weight_grads = [dparams[o:o + math.prod(shape)].view(shape) for o, shape in s.slots] \
        if needs_weights else [None] * s.num_weights
    return dx, dh, dc if lstm else None, weight_grads


def _keep(grads, needs):
    return [g if need else None for g, need in zip(grads, needs)]


def _forward_setup(ctx, inputs, output):
    (input, input_h, input_c, params, sequence_lengths, seed, rnn_mode, input_mode, direction,
     dropout, num_proj, time_major, is_training) = inputs
    options = (rnn_mode, input_mode, direction, dropout, num_proj, time_major, None, is_training)
    _save(ctx, options, (input, input_h, input_c, sequence_lengths, seed), output, [params])


def _forward_backward(ctx, d_output, d_output_h, d_output_c, d_reserve):
    needs = ctx.needs_input_grad
    dx, dh, dc, (dparams,) = _backward_core(ctx, any(needs[:3]), needs[3], d_output, d_output_h,
                                            d_output_c)
    return (*_keep([dx, dh, dc, dparams], needs[:4]),) + (None,) * 9


def _forward_weights_setup(ctx, inputs, output):
    (input, input_h, input_c, weights, has_biases, sequence_lengths, seed, rnn_mode, direction,
     dropout, num_proj, time_major, is_training) = inputs
    options = (rnn_mode, "linear_input", direction, dropout, num_proj, time_major, has_biases,
               is_training)
    _save(ctx, options, (input, input_h, input_c, sequence_lengths, seed), output, weights)


def _forward_weights_backward(ctx, d_output, d_output_h, d_output_c, d_reserve):
    needs = ctx.needs_input_grad  # needs[3]: one flag per weight
    weights_needed = list(needs[3]) if isinstance(needs[3], (list, tuple)) else \
        [needs[3]] * ctx.pycudnnrnn.num_weights
    dx, dh, dc, weight_grads = _backward_core(ctx, any(needs[:3]), any(weights_needed),
                                              d_output, d_output_h, d_output_c)
    return (*_keep([dx, dh, dc], needs[:3]), _keep(weight_grads, weights_needed)) + (None,) * 9


forward.register_autograd(_forward_backward, setup_context=_forward_setup)
forward_weights.register_autograd(_forward_weights_backward, setup_context=_forward_weights_setup)


class _RNN(torch.autograd.Function):
    """Either forward op as an autograd.Function with ``setup_context``, for torch.func.

    ``vmap`` runs the ops once per batch element (``generate_vmap_rule``). `options` is
    ``(rnn_mode, input_mode, direction, dropout, num_proj, time_major, has_biases,
    is_training)``; `weights` ``(params,)`` with `has_biases` None, or torch.nn's
    ``_flat_weights``.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(options, input, input_h, input_c, sequence_lengths, seed, *weights):
        return _call_op(options, input, input_h, input_c, sequence_lengths, seed, weights)

    @staticmethod
    def setup_context(ctx, inputs, output):
        options, input, input_h, input_c, sequence_lengths, seed = inputs[:6]
        _save(ctx, options, (input, input_h, input_c, sequence_lengths, seed), output,
              inputs[6:])

    @staticmethod
    def backward(ctx, d_output, d_output_h, d_output_c, d_reserve):
        needs = ctx.needs_input_grad  # options, input, input_h, input_c, lengths, seed, weights
        dx, dh, dc, weight_grads = _backward_core(ctx, any(needs[1:4]), any(needs[6:]),
                                                  d_output, d_output_h, d_output_c)
        return (None, *_keep([dx, dh, dc], needs[1:4]), None, None,
                *_keep(weight_grads, needs[6:]))


def _call_op(options, input, input_h, input_c, sequence_lengths, seed, weights):
    (rnn_mode, input_mode, direction, dropout, num_proj, time_major, has_biases,
     is_training) = options
    if has_biases is None:
        return forward(input, input_h, input_c, weights[0], sequence_lengths, seed, rnn_mode,
                       input_mode, direction, dropout, num_proj, time_major, is_training)
    return forward_weights(input, input_h, input_c, list(weights), has_biases, sequence_lengths,
                           seed, rnn_mode, direction, dropout, num_proj, time_major, is_training)


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


# --------------------------------------------------------------------------- one call

def apply(input, input_h, input_c, weights, sequence_lengths, seed, attrs, has_biases,
          is_training):
    """The differentiable forward on checked arguments: ``(output, output_h, output_c)``.

    What ``rnn`` and the modules call: under autocast every floating argument is cast to
    autocast's dtype first (the casts are differentiable, so gradients reach float32
    weights), then ``_RNN`` runs the op. `weights` as for ``_RNN``.
    """
    dtype = autocast_dtype(input.device.type)
    if dtype is not None:
        input, input_h, input_c = (autocast(t, dtype) for t in (input, input_h, input_c))
        weights = [autocast(w, dtype) for w in weights]
    options = (attrs["rnn_mode"], attrs["input_mode"], attrs["direction"],
               float(attrs["dropout"]), int(attrs["num_proj"]), bool(attrs["time_major"]),
               has_biases, bool(is_training))
    if torch.compiler.is_compiling():  # the ops' own autograd formulas: Dynamo traces them
        output, output_h, output_c, _ = _call_op(options, input, input_h, input_c,
                                                 sequence_lengths, seed, weights)
    else:
        output, output_h, output_c, _ = _RNN.apply(options, input, input_h, input_c,
                                                   sequence_lengths, seed, *weights)
    return output, output_h, output_c


def check_devices(device, names_and_tensors):
    """Every tensor on `device` (meta refused, naming the argument)."""
    for name, t in names_and_tensors:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__qualname__}")
        if t.device.type == "meta":
            raise TypeError(f"{name}: expected a tensor with data on {device}, got a tensor on "
                            f"the meta device (it has no values to compute with)")
        if t.device != device:
            raise TypeError(f"{name}: expected device {device} (that of input), got {t.device}")


def lengths_tensor(sequence_lengths):
    """`sequence_lengths` (a tensor, list or array of integers) as an integer tensor.

    Refuses what the functional API refuses: non-integers (floats, bools, strings), and
    tensors with no data (meta), with the argument's name.
    """
    if sequence_lengths is None:
        return None
    if isinstance(sequence_lengths, torch.Tensor):
        if sequence_lengths.device.type == "meta":
            raise TypeError("sequence_lengths: expected integers on the CPU (or CUDA), got a "
                            "tensor on the meta device (it has no values)")
        if sequence_lengths.is_floating_point() or sequence_lengths.is_complex() or \
                sequence_lengths.dtype == torch.bool:
            raise TypeError(f"sequence_lengths: expected integers, got dtype "
                            f"{sequence_lengths.dtype}")
        return sequence_lengths
    try:
        lengths = np.asarray(sequence_lengths)
    except (TypeError, ValueError, OverflowError) as error:
        raise TypeError(f"sequence_lengths: expected integers, got {sequence_lengths!r}") \
            from error
    # NumPy reads [True, 2] as integers; a bool is no length.
    has_bool = isinstance(sequence_lengths, (list, tuple)) and any(
        isinstance(v, (bool, np.bool_)) for v in np.asarray(sequence_lengths, dtype=object).flat)
    if lengths.dtype.kind not in "iu" or has_bool:
        raise TypeError(f"sequence_lengths: expected integers, got {sequence_lengths!r} (dtype "
                        f"{'bool' if has_bool else lengths.dtype})")
    if lengths.dtype.kind == "u" and lengths.size and int(lengths.max()) >= 2 ** 63:
        raise ValueError(f"sequence_lengths: expected values in [0, max_time], got "
                         f"{int(lengths.max())}")
    return torch.from_numpy(lengths.astype(np.int64))


def seed_tensor(seed, seed2):
    """The dropout seed as a 0-d int64 tensor (the combined 64-bit seed)."""
    if isinstance(seed, torch.Tensor):
        if seed.dim() != 0 or seed.is_floating_point() or seed.is_complex() or \
                seed.dtype == torch.bool or seed.device.type == "meta":
            raise TypeError(f"seed: expected an integer or a 0-d integer tensor holding the "
                            f"combined 64-bit seed, got a tensor of shape {tuple(seed.shape)}, "
                            f"dtype {seed.dtype} on {seed.device}")
        return seed.to(torch.int64)
    combined = dropout_seed(seed, seed2)
    return torch.tensor(combined - (1 << 64) if combined >> 63 else combined, dtype=torch.int64)


def rnn(input, input_h, input_c, params, sequence_lengths=None, *, rnn_mode="lstm",
        input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0,
        num_proj=0, time_major=True, is_training=True, num_layers=None, num_units=None,
        input_size=None):
    """Differentiable ``pycudnnrnn.forward`` on tensors: ``(output, output_h, output_c)``.

    Parameters
    ----------
    input, input_h, input_c, params : torch.Tensor
        As for ``pycudnnrnn.forward`` (input_c None unless LSTM).
    sequence_lengths : tensor or list of int, optional
    rnn_mode, input_mode, direction, dropout, num_proj, time_major
        The op's attributes, see ``pycudnnrnn.forward``.
    seed, seed2 : int
        The dropout seed, as for ``pycudnnrnn.forward``; or `seed` a 0-d int64 tensor
        holding the combined 64-bit seed (what the modules pass: a traced graph then
        takes a new seed per call without recompiling).
    is_training : bool
        False runs inference: no reserve space, and no backward.
    num_layers, num_units, input_size : int, optional
        As for ``pycudnnrnn.forward``: checked against the shapes when given (the
        attribute dicts of ``pycudnnrnn.convert`` carry them).

    Returns
    -------
    output, output_h, output_c : torch.Tensor
        output_c is empty ``(0,)`` unless LSTM. Gradients flow to every tensor argument,
        computed only for those that require them; ``torch.func`` transforms (``grad``,
        ``vjp``, ``jacrev``, ``vmap``) apply. Under ``torch.autocast`` the floating
        arguments are cast to autocast's dtype, as for ``torch.nn.LSTM``.
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__qualname__}")
    lstm = rnn_mode == "lstm"
    check_devices(input.device, [("input", input), ("input_h", input_h),
                                 ("input_c", input_c if lstm else None), ("params", params)])
    if input.device.type == "meta":
        raise TypeError("input: expected a tensor with data, got a tensor on the meta device "
                        "(it has no values to compute with)")
    attrs = _attrs(rnn_mode, input_mode, direction, float(dropout), int(num_proj),
                   bool(time_major))
    sizes = {name: value for name, value in (("num_layers", num_layers), ("num_units", num_units),
                                             ("input_size", input_size)) if value is not None}
    if sizes:
        kernels.problem(input, input_h, input_c, params, {**attrs, **sizes}, is_training)
    return apply(input, input_h, input_c if lstm else None, [params],
                 lengths_tensor(sequence_lengths), seed_tensor(seed, seed2), attrs, None,
                 bool(is_training))
