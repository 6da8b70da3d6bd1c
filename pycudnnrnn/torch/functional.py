"""``pycudnnrnn.torch.rnn``: the differentiable forward on tensors, and its argument checks.

The checks (``check_devices``, ``lengths_tensor``, ``seed_tensor``) serve the modules too:
every tensor on the input's device (meta refused by name), lengths that are integers,
a seed that is an integer or a 0-d integer tensor. ``InputValueError`` and
``InputTypeError`` (``errors``, named here too) are what the modules raise for bad calls.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.checks import dropout_seed
from ..core.config import Attributes
from . import layerwise, torch_kernels
from .errors import InputTypeError, InputValueError  # noqa: F401  (named here too)
from .ops import check_call
from .route import Route, choose, run_op


def check_devices(device, names_and_tensors):
    """Every tensor on `device`, else an ``InputTypeError`` naming it (meta refused)."""
    for name, t in names_and_tensors:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise InputTypeError(f"{name}: expected a torch.Tensor, got {type(t).__qualname__}")
        if t.device.type == "meta":
            where = "" if device.type == "meta" else f" on {device}"
            raise InputTypeError(f"{name}: expected a tensor with data{where}, got a tensor "
                                 f"on the meta device (it has no values to compute with)")
        if t.device != device:
            raise InputTypeError(f"{name}: expected device {device} (that of input), got "
                                 f"{t.device}")


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
        takes a new seed per call without recompiling). The op is given no seed (None)
        when no mask is drawn: not training, no dropout, or one layer. Under
        ``second_order_dropout()`` the masks come from PyTorch's generator instead.
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
    # is_training as given, for the op's checks to name a bad one; a bool past them
    attributes = Attributes(rnn_mode=rnn_mode, input_mode=input_mode, direction=direction,
                            dropout=float(dropout), num_proj=int(num_proj),
                            time_major=bool(time_major), is_training=is_training)
    sizes = {name: value for name, value in (("num_layers", num_layers), ("num_units", num_units),
                                             ("input_size", input_size)) if value is not None}
    if sizes:
        check_call(input, input_h, input_c, params, attributes, **sizes)
    lengths, seed = lengths_tensor(sequence_lengths), seed_tensor(seed, seed2)
    input_c = input_c if lstm else None
    way = choose(input, input_h, [input_h, params] + ([input_c] if lstm else []), None,
                 attributes)
    if way is Route.TORCH_KERNELS:
        # The op's checks of the shapes first (torch_kernels.rnn checks the lengths)
        check_call(input, input_h, input_c, params, attributes)
        return torch_kernels.rnn(input, input_h, input_c, [params], None, lengths, rnn_mode,
                                 direction, time_major, is_training=bool(is_training))
    if not layerwise.draws_masks(input_h, attributes, malformed=True):
        seed = None  # no CPU tensor for a seed nothing uses (CUDA graphs can take the call)
    return run_op(way, input, input_h, input_c, [params], None, lengths, seed,
                  attributes.replace(is_training=bool(is_training)))
