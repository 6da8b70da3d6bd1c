"""Which way a forward of ``pycudnnrnn.torch`` runs: the one decision, and its table.

The drop-ins (``modules``), ``CudnnRNN`` (``base.FlatRNN``) and ``rnn`` (``functional``)
check their arguments, then ask ``choose``; each runs the `Route` it gets (the op's
routes through ``run_op``). Inside the op, ``op_backends.run_forward`` then picks its
backend (PyTorch's kernels, NumPy or cuDNN) by device and dtype: a choice of its own,
made where the op runs, whatever route called it.
"""

from __future__ import annotations

import enum

from . import layerwise, onnx_export, torch_kernels
from .autograd import apply, autocast_all


class Route(enum.Enum):
    """The ways out of a forward call, in the order ``choose`` tries them."""

    EMPTY_BATCH = "empty results, nothing runs"
    TORCH_PACKED = "torch.nn's own call on a PackedSequence (torch_kernels.packed)"
    TORCH_KERNELS = "PyTorch's own kernels (torch_kernels.rnn)"
    ONNX = "ONNX's recurrent operators (onnx_export.rnn)"
    LAYERWISE = "one op call per layer, PyTorch's masks between (layerwise.rnn)"
    OP = "the op (autograd.apply)"


def choose(input, input_h, tensors, has_biases, attributes, *, module=None,
           packed=False) -> Route:
    """The route of a forward on checked arguments, the first that applies:

    ============= ===================================================================
    Route         When
    ============= ===================================================================
    EMPTY_BATCH   a drop-in's batch of 0 sequences (`has_biases` not None): the op
                  needs a batch; torch.nn gives empty results
    TORCH_PACKED  a drop-in's PackedSequence (`packed`) that draws dropout masks, where
                  PyTorch's kernels take it (``torch_kernels.takes``): its masks fall on
                  the rows torch.nn's fall on
    TORCH_KERNELS ``torch_kernels.takes``: eager, CPU float32/float64 (CUDA with cuDNN
                  off), a linear input, `tensors` of the input's dtype, no trace,
                  transform or autocast; and the masks come from PyTorch's generator
                  either way (a `module`), or none is drawn (``rnn``, whose seed fixes
                  them on the op; a malformed input_h counts as drawing: the op names it)
    ONNX          ``torch.onnx.export`` is tracing the call
    LAYERWISE     dropout masks between layers, and ``layerwise.by_layer``: inside
                  ``second_order_dropout()``, or a checkpoint's recomputation of a
                  forward that ran so
    OP            otherwise: ``autograd.apply``, whose door is the op's own autograd
                  formula when Dynamo traces, else ``autograd._RNN``
    ============= ===================================================================

    `input_h`: in the op's layout for ``rnn`` (read for the masks), any for a `module`;
    `tensors`: those whose dtype PyTorch's kernels need to be the input's (the weights,
    and the states where not checked before); `has_biases` None for the flat params,
    else torch.nn's ``bias`` (a drop-in); `attributes` as the op would run: a `module`'s
    dropout is the one it runs with (0 unless training with two layers or more), so a
    module draws masks when it is above 0. A drop-in's p = 1 runs on the op as p = 0
    (``base``): no masks there.
    """
    drop_in = has_biases is not None
    if module is not None:
        draws = attributes.dropout > 0
        if drop_in and input.shape[1 if attributes.time_major else 0] == 0:
            return Route.EMPTY_BATCH
        if packed and draws and torch_kernels.takes(input, tensors):
            return Route.TORCH_PACKED
        if torch_kernels.takes(input, tensors, attributes.input_mode):
            return Route.TORCH_KERNELS
        draws = draws and not (drop_in and attributes.dropout == 1)
    else:
        if not layerwise.draws_masks(input_h, attributes, malformed=True) and \
                torch_kernels.takes(input, tensors, attributes.input_mode):
            return Route.TORCH_KERNELS
        draws = layerwise.draws_masks(input_h, attributes)
    if onnx_export.exporting():
        return Route.ONNX
    if draws and layerwise.by_layer(module, input.device, draws):
        return Route.LAYERWISE
    return Route.OP


def run_op(route, input, input_h, input_c, weights, has_biases, sequence_lengths, seed,
           attributes):
    """``(output, output_h, output_c)`` of the ONNX, LAYERWISE or OP `route` on checked
    arguments in the op's layout (`weights` ``[params]`` with `has_biases` None, or
    torch.nn's list), cast as autocast casts them (``autograd.autocast_all``)."""
    if route is Route.OP:
        return apply(input, input_h, input_c, weights, has_biases, sequence_lengths, seed,
                     attributes)
    # Cast once, before ONNX's nodes or the layers' calls (whose own casts then find
    # nothing left to cast).
    input, input_h, input_c, weights = autocast_all(input, input_h, input_c, weights)
    if route is Route.ONNX:  # ONNX's own recurrent operators, which any runtime runs
        return onnx_export.rnn(input, input_h, input_c, weights, has_biases, sequence_lengths,
                               attributes)
    assert route is Route.LAYERWISE, route
    return layerwise.rnn(apply, input, input_h, input_c, weights, has_biases, sequence_lengths,
                         attributes)
