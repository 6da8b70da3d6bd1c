"""torch.nn's weights (``_flat_weights``) as the op's one flat cuDNN-layout params.

The drop-in modules hand the ops torch.nn's list of weights; here is where each lies in
the flat params (``weight_offsets``), the shape checks of such a list
(``weights_problem``), and the flat params itself (``flat_params``): the weights' own
buffer when they are views of one (no copy), else one concatenation.
"""

from __future__ import annotations

import math

import torch

from ..core import checks, layout
from ..core.config import GATES
from ..core.lru import LRU
from . import op_backends


class _FlatShape:
    """The shape, rank and dtype of the flat params that a list of weights makes."""

    def __init__(self, size, dtype):
        self.shape, self.ndim, self.dtype = (size,), 1, op_backends.numpy_dtype(dtype)


def weight_offsets(shapes, has_biases: bool, projection: bool):
    """Where each of torch.nn's weights starts in the flat params, from their shapes alone.

    `shapes` in ``_flat_weights`` order: per pseudo-layer (layer by layer, forward
    direction first) ``weight_ih``, ``weight_hh``, then ``bias_ih`` and ``bias_hh`` when
    `has_biases`, then ``weight_hr`` when `projection`. cuDNN's buffer holds the matrices
    of every pseudo-layer (input, recurrent, projection), then their biases (input,
    recurrent), each role's gates stacked as torch.nn stacks them; ``weights_problem``
    checks these offsets against ``pycudnnrnn.core.layout`` at every call. Plain integer
    arithmetic, so that ``torch.compile`` traces it where autograd splits the gradient.
    """
    per_layer = 2 + 2 * has_biases + projection
    matrices, biases = [], []
    for first in range(0, len(shapes), per_layer):
        matrices += [first, first + 1] + ([first + per_layer - 1] if projection else [])
        biases += [first + 2, first + 3] if has_biases else []
    offsets, offset = [0] * len(shapes), 0
    for k in matrices + biases:
        offsets[k] = offset
        offset = offset + math.prod(shapes[k])  # (not +=: a traced size is a tensor)
    return offsets


def layout_slots(config, has_biases):
    """(offset, shape) of each of torch.nn's weights by ``pycudnnrnn.core.layout``'s blocks."""
    slots = []
    for blocks in layout.pseudo_layer_blocks(config):
        chosen = [blocks.w_input, blocks.w_recurrent]
        chosen += [blocks.b_input, blocks.b_recurrent] if has_biases else []
        chosen += [blocks.w_projection] if blocks.w_projection is not None else []
        slots += [(b.offset, b.shape) for b in chosen]
    return slots


def weights_problem(input, input_h, input_c, weights, has_biases, attributes):
    """``(problem, slots)`` of a forward call whose parameters are torch.nn's `weights`.

    The sizes come from `input`, `input_h` and ``weights[0]`` (``weight_ih_l0``,
    ``[gates·hidden_size, input_size]``); each weight's shape is checked against its
    slot; `attributes`: the call's ``Attributes``. Reads no data: works on fake tensors.
    Remembered for tensors of known sizes (the op's kernels ask at every call).
    """
    key = op_backends.known_sizes_key(input, input_h, input_c, list(weights), has_biases,
                                      op_backends.attributes_key(attributes))
    build = lambda: _weights_problem(input, input_h, input_c, weights, has_biases,  # noqa: E731
                                     attributes)
    return build() if key is None else _problems.get(key, build)


_problems = LRU(64)


def _weights_problem(input, input_h, input_c, weights, has_biases, attributes):
    a = attributes
    if a.input_mode != "linear_input":
        raise ValueError(f"input_mode: torch.nn's weights have input matrices, so expected "
                         f"'linear_input', got {a.input_mode!r}")
    if not weights or any(not isinstance(w, torch.Tensor) for w in weights):
        raise TypeError("weights: expected a non-empty list of tensors")
    first = weights[0]
    gates = len(GATES[a.rnn_mode])
    directions = a.num_dirs
    layers_axis = 0 if a.time_major else 1
    if first.dim() != 2 or input_h.dim() != 3 or input.dim() != 3:
        raise ValueError(f"weights[0]: expected weight_ih_l0 [gates·hidden_size, input_size] "
                         f"with 3-D input and input_h, got shapes {tuple(first.shape)}, "
                         f"{tuple(input.shape)} and {tuple(input_h.shape)}")
    config = checks.make_config(
        rnn_mode=a.rnn_mode,
        num_layers=max(1, int(input_h.shape[layers_axis]) // directions),
        num_units=max(1, int(first.shape[0]) // gates), input_size=int(input.shape[2]),
        input_mode="linear_input", direction=a.direction, num_proj=a.num_proj)
    expected = layout_slots(config, has_biases)
    if len(weights) != len(expected):
        raise ValueError(f"weights: expected {len(expected)} tensors for this configuration, "
                         f"got {len(weights)}")
    for k, (w, (_, shape)) in enumerate(zip(weights, expected)):
        if tuple(w.shape) != shape:
            raise ValueError(f"weights[{k}]: expected shape {shape}, got {tuple(w.shape)}")
        if w.dtype != first.dtype or w.device != first.device:
            raise TypeError(f"weights[{k}]: expected dtype {first.dtype} on {first.device} (that "
                            f"of weights[0]), got {w.dtype} on {w.device}")
    offsets = weight_offsets([shape for _, shape in expected], has_biases, config.num_proj > 0)
    assert offsets == [offset for offset, _ in expected], "weight_offsets disagrees with layout"
    slots = list(zip(offsets, (shape for _, shape in expected)))
    params = _FlatShape(layout.params_size(config), first.dtype)
    return op_backends.problem(input, input_h, input_c, params, attributes), slots


class Weights:
    """torch.nn's weights (detached) where the ops' kernels take the flat params.

    With each weight's slot ``(offset, shape)`` in the flat params, the params' `size`,
    torch.nn's `has_biases` (``bias``), and the call's validated `problem`
    (``weights_problem``'s). The CPU's PyTorch kernels take the weights as they are; every
    other backend takes ``flat()``.
    """

    def __init__(self, tensors, slots, size, has_biases, problem):
        self.tensors, self.slots, self.size = tensors, slots, size
        self.has_biases, self.problem = has_biases, problem

    @property
    def offsets(self):
        return [offset for offset, _ in self.slots]

    def flat(self):
        """The flat params (``flat_params``)."""
        return flat_params(self.tensors, self.slots, self.size)


def flat_params(weights, slots, size):
    """The flat cuDNN-layout params holding `weights` at `slots`: without a copy when it can.

    `slots` are ``(offset, shape)`` pairs. When the weights are contiguous views at their
    slots of one buffer of `size` elements (as the modules' ``flatten_parameters`` lays
    them out), that buffer itself; a bias region no weight covers (``bias=False``) is
    zeroed in it first (it is the module's and is zero by contract; it lies outside every
    weight's view, so no input of the op that calls this changes). Otherwise (a
    parametrization, ``weight_norm``, ``torch.func.functional_call``, autocast) one
    concatenation, zeros where no weight is.
    """
    base = one_buffer(weights, slots, size)
    if base is not None:
        for start, stop in _gaps(slots, size):
            base[start:stop].zero_()
        return base
    return concatenated(weights, slots, size)


def concatenated(weights, slots, size):
    """The flat params holding `weights` at `slots`: one concatenation, zeros where no
    weight is (differentiable, and taken by any tensor: one torch.autograd batches)."""
    parts, offset = [], 0
    for (start, shape), w in sorted(zip(slots, weights), key=lambda pair: pair[0][0]):
        if start > offset:
            parts.append(w.new_zeros(start - offset))
        parts.append(w.reshape(-1))
        offset = start + math.prod(shape)
    if size > offset:
        parts.append(weights[0].new_zeros(size - offset))
    return torch.cat(parts)


def _gaps(slots, size):
    offset = 0
    for start, stop in sorted((o, o + math.prod(s)) for o, s in slots) + [(size, size)]:
        if start > offset:
            yield offset, start
        offset = max(offset, stop)


def one_buffer(weights, slots, size):
    """The whole buffer `weights` are views of at `slots`, or None if they are not."""
    first = weights[0]
    storage = first.untyped_storage()
    if first.storage_offset() != slots[0][0] or storage.nbytes() != size * first.element_size():
        return None  # exactly one buffer, all of it
    for w, (offset, _) in zip(weights, slots):
        if not (w.untyped_storage().data_ptr() == storage.data_ptr() and
                w.storage_offset() == offset and w.is_contiguous()):
            return None
    return first.new_empty(0).set_(storage, 0, (size,), (1,))
