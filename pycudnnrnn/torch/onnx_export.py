"""The op under ``torch.onnx.export``: ONNX's own ``LSTM``, ``GRU`` and ``RNN`` operators.

While an export runs (``torch.onnx.is_in_onnx_export()``; both exporters), ``apply``
calls ``rnn`` here instead of the op: one ONNX recurrent node per layer
(``torch.onnx.ops.symbolic_multi_out``), whose weights are the module's, sliced and put
in ONNX's gate order. So an exported model runs in any ONNX runtime, as
``torch.nn``'s RNNs do:

* LSTM: ONNX orders the gates ``i, o, f, c`` (cuDNN and torch.nn: ``i, f, c, o``);
* GRU: ``z, r, h`` (cuDNN: ``r, z, h``), with ``linear_before_reset=1``, cuDNN's GRU;
* tanh and relu RNN: ``activations`` names the nonlinearity;
* ``skip_input``: layer 0's input matrices are identities, which is what skipping them
  computes (cuDNN adds the input to every gate; I = H);
* sequence lengths: ONNX's ``sequence_lens`` (output zero past each length, the final
  state at each sequence's last step, as the op), and a row of length 0 keeps its initial
  state, as in the op (ONNX runtimes zero it: a ``Where`` puts it back).

What ONNX's operators cannot express is refused at export, naming it: an LSTM
projection (``proj_size``/``num_proj``: ONNX's LSTM has none, and ``torch.nn.LSTM``'s own
export of one does not run), and dropout between layers in training mode.
"""

from __future__ import annotations

import math
import sys

import torch

from ..core import layout
from ..core.checks import make_config

#: ONNX's order of the gates, as indices into cuDNN's (``core.config.GATES``).
_ONNX_GATES = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2), "rnn_tanh": (0,), "rnn_relu": (0,)}
_OPERATOR = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN", "rnn_relu": "RNN"}


def exporting() -> bool:
    """Whether ``torch.onnx.export`` is tracing the call now."""
    onnx = sys.modules.get("torch.onnx")
    if onnx is None:  # not imported: no export runs (and none is imported for asking)
        return False
    if onnx.is_in_onnx_export():
        return True
    # Dynamo (torch.export's strict mode, the ONNX exporter's second try) reads that
    # function as False, but not the flag behind it: without it a refusal below would be
    # lost behind the second try's "no ONNX function for pycudnnrnn.forward". Should the
    # flag move, this is False and the first try alone sees the export.
    flags = sys.modules.get("torch.onnx._internal.exporter._flags")
    return bool(getattr(flags, "_is_onnx_exporting", False))


def rnn(input, input_h, input_c, weights, has_biases, sequence_lengths, attributes):
    """``(output, output_h, output_c)`` as ONNX nodes; arguments as ``autograd.apply``'s."""
    rnn_mode, direction, time_major = (attributes.rnn_mode, attributes.direction,
                                       attributes.time_major)
    if attributes.num_proj:
        raise NotImplementedError(
            "pycudnnrnn: ONNX export of an LSTM with a projection (proj_size / num_proj > 0): "
            "ONNX's LSTM operator has no projection (torch.nn.LSTM(proj_size=...)'s own export "
            "does not run in onnxruntime either). Export a model without one")
    if attributes.is_training and attributes.dropout > 0 and \
            input_h.shape[0 if time_major else 1] > attributes.num_dirs:
        raise NotImplementedError(
            "pycudnnrnn: ONNX export of dropout between layers in training mode: ONNX's "
            "recurrent operators have no dropout. Call model.eval() before exporting")
    lstm = rnn_mode == "lstm"
    if not time_major:  # ONNX's layout 0: [T, B, ·] data, [D, B, ·] states
        input, input_h = input.transpose(0, 1), input_h.transpose(0, 1)
        input_c = input_c.transpose(0, 1) if lstm else input_c
    D = 2 if direction == "bidirectional" else 1
    # No projection: the states' width is hidden_size.
    config = make_config(rnn_mode=rnn_mode, num_layers=int(input_h.shape[0]) // D,
                         num_units=int(input_h.shape[2]), input_size=int(input.shape[2]),
                         input_mode=attributes.input_mode, direction=direction, num_proj=0)
    layers = _layer_weights(weights, has_biases, config)
    lengths = None if sequence_lengths is None else sequence_lengths.to(torch.int32)
    # Sizes: SymInts under torch.export, tensors under TorchScript's tracing (whose ONNX
    # graph takes them as they are); the shapes only describe the node's results.
    T, B, H = (int(n) if isinstance(n, torch.Tensor) else n
               for n in (input.shape[0], input.shape[1], config.num_units))
    x, hs, cs = input, [], []
    for l, (W, R, bias) in enumerate(layers):
        states = [input_h[l * D:(l + 1) * D]] + ([input_c[l * D:(l + 1) * D]] if lstm else [])
        attrs = dict(hidden_size=H, direction="bidirectional" if D == 2 else "forward")
        if rnn_mode == "gru":
            attrs["linear_before_reset"] = 1
        elif not lstm:
            attrs["activations"] = ["Tanh" if rnn_mode == "rnn_tanh" else "Relu"] * D
        shapes = [(T, D, B, H), (D, B, H)] + ([(D, B, H)] if lstm else [])
        outputs = _node(_OPERATOR[rnn_mode], [x, W, R, bias, lengths, *states], attrs, shapes)
        x = outputs[0].transpose(1, 2).flatten(2)  # [T, D, B, H] -> [T, B, D·H]
        finals = outputs[1:]
        if lengths is not None:  # ONNX zeroes the state of a row of length 0; cuDNN keeps it
            empty = (lengths == 0).view(1, -1, 1)
            finals = [torch.where(empty, initial, final) for initial, final in zip(states, finals)]
        hs.append(finals[0])
        cs += [finals[1]] if lstm else []
    output_h = torch.cat(hs)
    output_c = torch.cat(cs) if lstm else input_h.new_empty((0,))
    if not time_major:
        x, output_h = x.transpose(0, 1), output_h.transpose(0, 1)
        output_c = output_c.transpose(0, 1) if lstm else output_c
    return x, output_h, output_c


def _node(operator, inputs, attrs, shapes):
    """The results of one ONNX node `operator` (the default domain) of the export."""
    if not torch.jit.is_tracing():  # torch.export, under torch.onnx.export(dynamo=True)
        return torch.onnx.ops.symbolic_multi_out(operator, inputs, attrs,
                                                 dtypes=[inputs[0].dtype] * len(shapes),
                                                 shapes=shapes)
    return _TracedNode.apply(operator, tuple(attrs.items()), tuple(shapes), *inputs)


class _TracedNode(torch.autograd.Function):
    """One ONNX node for TorchScript's exporter (dynamo=False), which exports a Function
    by its ``symbolic``; while tracing, results of the node's shapes."""

    @staticmethod
    def forward(ctx, operator, attrs, shapes, *inputs):
        return tuple(inputs[0].new_zeros(shape) for shape in shapes)

    @staticmethod
    def symbolic(g, operator, attrs, shapes, *inputs):
        suffix = lambda value: "s" if isinstance(value, (str, list)) else "i"  # noqa: E731
        return g.op(operator, *(_absent(g) if i is None else i for i in inputs),
                    outputs=len(shapes),
                    **{f"{name}_{suffix(value)}": value for name, value in attrs})


def _absent(g):
    """An optional input left out (sequence_lens without lengths), as TorchScript's
    exporter writes one: a None constant of optional tensor type. (A constant tensor of
    full lengths would fix the batch size in the graph.)"""
    node = g.op("prim::Constant")
    node.setType(torch._C.OptionalType.ofTensor())
    return node


def _layer_weights(weights, has_biases, config):
    """``[(W, R, B), ...]`` per layer in ONNX's shapes: ``W [D, G·H, in]``, ``R [D, G·H,
    H]``, ``B [D, 2·G·H]`` (input biases, then recurrent), gates in ONNX's order."""
    pieces = _pseudo_layers(weights, has_biases, config)
    D, order = config.num_dirs, _ONNX_GATES[config.rnn_mode]
    layers = []
    for l in range(config.num_layers):
        W, R, B = [], [], []
        for w_in, w_rec, b_in, b_rec in pieces[l * D:(l + 1) * D]:
            rows, H = w_rec.shape
            if w_in is None:  # skip input: the input is added to every gate
                w_in = torch.eye(H, dtype=w_rec.dtype, device=w_rec.device).repeat(rows // H, 1)
            zeros = w_rec.new_zeros(rows)
            W.append(_reorder(w_in, order))
            R.append(_reorder(w_rec, order))
            B.append(torch.cat([_reorder(zeros if b_in is None else b_in, order),
                                _reorder(zeros if b_rec is None else b_rec, order)]))
        layers.append((torch.stack(W), torch.stack(R), torch.stack(B)))
    return layers


def _pseudo_layers(weights, has_biases, config):
    """``(w_input or None, w_recurrent, b_input or None, b_recurrent or None)`` of each
    pseudo-layer: torch.nn's weights as they are, or views of the flat params."""
    if has_biases is None:  # the flat params: cuDNN's layout
        params = weights[0]
        view = lambda block: None if block is None else params[
            block.offset:block.offset + math.prod(block.shape)].view(block.shape)
        return [(view(b.w_input), view(b.w_recurrent), view(b.b_input), view(b.b_recurrent))
                for b in layout.pseudo_layer_blocks(config)]
    per_layer = 4 if has_biases else 2
    return [(weights[k], weights[k + 1], weights[k + 2] if has_biases else None,
             weights[k + 3] if has_biases else None)
            for k in range(0, len(weights), per_layer)]


def _reorder(tensor, order):
    """`tensor`'s gate blocks (its rows, in cuDNN's order) in ONNX's `order`."""
    if order == tuple(range(len(order))):
        return tensor
    blocks = tensor.chunk(len(order))
    return torch.cat([blocks[g] for g in order])
