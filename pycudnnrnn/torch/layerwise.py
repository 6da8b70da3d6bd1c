"""Dropout between layers that can be differentiated twice: one op call per layer.

A multi-layer cuDNN call draws its dropout masks inside and keeps them where nothing can
read them, so a second derivative through them cannot be taken (``second_order``).
Inside ``second_order_dropout()`` a training forward with dropout between layers runs
instead as one op call per layer, each without dropout, with
``torch.nn.functional.dropout`` on every layer's output but the last: where torch.nn's
own kernels put it, with PyTorch's generator. Autograd keeps those masks, so the first,
second and higher derivatives all use the forward's masks.

What it costs: a multi-layer cuDNN call overlaps its layers, and here they run one after
another; the dropped outputs are kept for backward. Outside the context nothing changes.
"""

from __future__ import annotations

import collections
import contextlib
import threading

import torch

from ..core import layout
from ..core.config import RNNConfig
from .ops import check_call

_lock = threading.Lock()
_depth = 0  # how many second_order_dropout() contexts are open, on any thread
_on = False  # _depth > 0: what forwards read (a torch.compile trace guards on its value)


class second_order_dropout(contextlib.ContextDecorator):
    """Run RNN forwards with dropout between layers so that they can be differentiated
    twice (a gradient penalty, a Hessian-vector product, MAML).

    Inside, a training forward of ``pycudnnrnn.torch``'s modules and ``rnn`` with dropout
    between layers runs one cuDNN call per layer, and draws the masks between them with
    ``torch.nn.functional.dropout`` (PyTorch's generator: ``torch.manual_seed`` repeats
    them). The layers then do not overlap on the GPU. Forwards without dropout between
    layers are unchanged.

    A forward that ``torch.utils.checkpoint`` runs again in backward must run inside too
    (pass the context as its ``context_fn``, or keep the backward inside): outside, it
    would draw other masks. (A reentrant checkpoint's needs neither: ``by_layer``.)
    Process-wide, as ``torch.backends.cudnn.flags``; reentrant;
    ``@second_order_dropout()`` decorates a function.

    Examples
    --------
    >>> import torch, pycudnnrnn.torch as prt
    >>> lstm = prt.LSTM(3, 4, num_layers=2, dropout=0.2)
    >>> x = torch.randn(5, 2, 3, requires_grad=True)
    >>> with prt.second_order_dropout():
    ...     (g,) = torch.autograd.grad(lstm(x)[0].sum(), x, create_graph=True)
    ...     g.square().sum().backward()
    """

    def __enter__(self):
        global _depth, _on
        with _lock:
            _depth += 1
            _on = True
        return self

    def __exit__(self, *exc):
        global _depth, _on
        with _lock:
            if _depth == 0:
                raise RuntimeError("second_order_dropout: exited more often than entered")
            _depth -= 1
            _on = _depth > 0
        return False


def active() -> bool:
    """Whether a ``second_order_dropout()`` context is open."""
    return _on


# A checkpoint (torch.utils.checkpoint) runs a forward again in backward, with PyTorch's
# generators as they were, and a reentrant one with no context_fn: a backward outside
# the context recomputed a forward that ran inside it as one multi-layer call, with other
# masks (its gradients silently off). So a forward that draws masks remembers how it ran
# (the module and the state of the generator its masks come from), and a forward during
# a backward runs as the remembered call did, whatever the context is then. A forward
# outside the context forgets its call: a later recomputation of it is one call too.

_MAX_REMEMBERED = 4096  # calls whose backward has not run yet (two integers each)
_remembered = collections.OrderedDict()  # _call_key(...) → None, the newest last


def by_layer(owner, device, draws) -> bool:
    """Whether a forward runs layer by layer: inside ``second_order_dropout()``, or as a
    checkpoint's recomputation, in a backward, of a forward that ran so.

    `owner`: the module called (None for ``rnn``); `device`: its input's; `draws`:
    whether it draws dropout masks between layers. (Under a trace, whether the context
    is open alone.)
    """
    if not draws or torch.compiler.is_compiling() or \
            torch._C._are_functorch_transforms_active() or (
            device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        # a generator's state is not read under a trace, a torch.func transform (whose
        # tensors have no storage to read) or a capture
        return active()
    in_backward = torch._C._current_autograd_node() is not None
    if not (active() or _remembered):
        return False
    key = _call_key(owner, device)
    with _lock:
        if in_backward:  # a checkpoint's recomputation: as the forward it repeats ran
            return key in _remembered
        if active():
            _remembered[key] = None
            _remembered.move_to_end(key)
            while len(_remembered) > _MAX_REMEMBERED:
                _remembered.popitem(last=False)
            return True
        _remembered.pop(key, None)
        return False


def _call_key(owner, device):
    """The module `owner` and the state of the generator that draws masks on `device`."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        generator = torch.cuda.default_generators[index]
    else:
        generator = torch.default_generator
    return id(owner), hash(generator.get_state().numpy().tobytes())


def draws_masks(input_h, attributes, malformed=False) -> bool:
    """Whether a forward with `attributes` draws dropout masks: in training, with dropout,
    between layers (so with more than one: input_h's L·D above D). `malformed`: what an
    input_h that is not a 3-D tensor counts as (the op then names what is wrong)."""
    a = attributes
    if not (a.is_training and a.dropout > 0):
        return False
    if not isinstance(input_h, torch.Tensor) or input_h.dim() != 3:
        return malformed
    return input_h.shape[0 if a.time_major else 1] > a.num_dirs


def rnn(run, input, input_h, input_c, weights, has_biases, sequence_lengths, attributes):
    """``(output, output_h, output_c)`` of a forward, layer by layer: ``run(input,
    input_h, input_c, weights, has_biases, sequence_lengths, seed, attributes)`` runs each
    layer alone, and dropout is drawn on its output before the next one. Arguments as for
    ``autograd.apply`` (`weights` ``[params]`` or torch.nn's list)."""
    D = attributes.num_dirs
    axis = 0 if attributes.time_major else 1
    num_layers = input_h.shape[axis] // D
    layers = _layer_weights(input, input_h, input_c, weights, has_biases, attributes,
                            num_layers)
    first = attributes.replace(dropout=0.0)
    later = first.replace(input_mode="linear_input")
    output, states_h, states_c = input, [], []
    for index, layer_weights in enumerate(layers):
        if index:
            output = torch.nn.functional.dropout(output, attributes.dropout, training=True)
        h, c = (None if s is None else s.narrow(axis, index * D, D) for s in (input_h, input_c))
        output, output_h, output_c = run(output, h, c, layer_weights, has_biases,
                                         sequence_lengths, None, later if index else first)
        states_h.append(output_h)
        states_c.append(output_c)
    output_c = torch.cat(states_c, axis) if input_c is not None else output_c
    return output, torch.cat(states_h, axis), output_c


def _layer_weights(input, input_h, input_c, weights, has_biases, attributes, num_layers):
    """Each layer's weights, in the form the call took them: ``[params]`` (its slices of
    the cuDNN-layout buffer) or its share of torch.nn's list."""
    if has_biases is not None:  # torch.nn's list: a layer's weights, direction by direction
        share = len(weights) // num_layers
        return [weights[k * share:(k + 1) * share] for k in range(num_layers)]
    (params,) = weights
    config = _config(input, input_h, input_c, params, attributes, num_layers)
    pieces = []
    for index in range(num_layers):
        _, matrices, biases = layout.layer(config, index)
        pieces.append([torch.cat([params[matrices], params[biases]])])
    return pieces


def _config(input, input_h, input_c, params, attributes, num_layers):
    """The ``RNNConfig`` of a call on a flat `params` buffer."""
    a = attributes
    if not torch.compiler.is_compiling():  # checked, and remembered for these sizes
        return check_call(input, input_h, input_c, params, a.replace(is_training=True)).config
    # Under a trace, from the sizes alone (which may be symbolic, and which the problem's
    # cache and checks do not take); each layer's own call checks its sizes.
    num_units = (input_c if a.lstm else input_h).shape[-1]
    input_size = input.shape[-1]
    skip = input_size == num_units if a.input_mode == "auto_select" else \
        a.input_mode == "skip_input"
    config = RNNConfig(a.rnn_mode, skip, a.num_dirs == 2, num_layers, num_units, input_size,
                       a.num_proj)
    # A buffer with a tail no layer reads, or one for more layers than input_h has,
    # passes every layer's own check: refused here, as the op refuses it.
    axis = 0 if a.time_major else 1
    _check_size("params", "elements", params.shape[0], layout.params_size(config))
    if input_c is not None:
        _check_size("input_c", "layers and directions", input_c.shape[axis],
                    input_h.shape[axis])
    return config


def _check_size(name, what, got, expected):
    """A ValueError where `got` is not `expected` (sizes under a trace: a symbolic one is
    checked when the graph runs, with a message that names no value)."""
    if isinstance(got, int) and isinstance(expected, int):
        if got != expected:
            raise ValueError(f"{name}: expected {expected} {what} (input_h's network), "
                             f"got {got}")
        return
    torch._check(got == expected, lambda: f"{name}: {what} do not match input_h's network")
