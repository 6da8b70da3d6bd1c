"""Moving trained RNN weights between frameworks and pycudnnrnn's opaque params.

Everything goes through the canonical form (``pycudnnrnn.params_to_canonical``):
per pseudo-layer, gate matrices ``[H, in]`` and two biases per gate, gates in cuDNN
order (LSTM i, f, c, o; GRU r, z, h). NumPy does the work; a framework is imported only
inside the function that needs it, and none is a dependency.

=================  ==================================  ==================================
framework          matrices                            biases
=================  ==================================  ==================================
PyTorch nn.LSTM    ``weight_ih_l{k}`` [4H, in] i,f,g,o  ``bias_ih``, ``bias_hh`` (two, as
/ GRU / RNN        ``weight_hh_l{k}`` [4H, P]           cuDNN); GRU r, z, n; ``_reverse``
                   ``weight_hr_l{k}`` [P, H] (proj)     for the backward direction
Keras LSTM         ``kernel`` [in, 4H] i,f,c,o          one ``bias`` [4H]: becomes the
                   ``recurrent_kernel`` [H, 4H]         input bias, recurrent bias zero
Keras GRU          ``kernel`` [in, 3H] **z, r, h**      ``bias`` [2, 3H]: input, recurrent
(reset_after)      ``recurrent_kernel`` [H, 3H]         (only ``reset_after=True``)
TensorFlow         ``CudnnRNNParamsToCanonicalV2``      the same lists: identity
=================  ==================================  ==================================
"""

from __future__ import annotations

import numpy as np

from . import api
from .core import checks, dtypes

_TORCH_CLASSES = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN", "rnn_relu": "RNN"}
_NUM_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


# --------------------------------------------------------------------------- PyTorch

def _torch_mode(module) -> str:
    kind = type(module).__name__
    if kind == "LSTM":
        return "lstm"
    if kind == "GRU":
        return "gru"
    if kind == "RNN":
        return "rnn_" + module.nonlinearity
    raise TypeError(f"module: expected torch.nn.LSTM, GRU or RNN, got {type(module).__qualname__}")


def from_torch(module):
    """Convert a PyTorch ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` to opaque params.

    Parameters
    ----------
    module : torch.nn.LSTM, torch.nn.GRU or torch.nn.RNN
        With or without ``proj_size`` (LSTM). A module built with ``bias=False`` gets
        zero biases (the same function). ``batch_first`` only concerns data layout: pass
        ``time_major=not module.batch_first`` to ``pycudnnrnn.forward``.

    Returns
    -------
    params : torch.Tensor
        1-D, on the module's device and in its dtype, detached.
    attrs : dict
        ``rnn_mode, num_layers, num_units, input_size, direction, num_proj``, ready for
        ``pycudnnrnn.params_size`` and friends, ``to_torch``, and ``forward`` /
        ``backprop`` (which check the three sizes against the arrays' shapes).
    """
    import torch

    mode = _torch_mode(module)
    G = _NUM_GATES[mode]
    attrs = dict(rnn_mode=mode, num_layers=module.num_layers, num_units=module.hidden_size,
                 input_size=module.input_size,
                 direction="bidirectional" if module.bidirectional else "unidirectional",
                 num_proj=getattr(module, "proj_size", 0) or 0)
    first = next(module.parameters())
    weights, biases = [], []
    for layer in range(module.num_layers):
        for suffix in ("", "_reverse") if module.bidirectional else ("",):
            get = lambda name: getattr(module, f"{name}_l{layer}{suffix}").detach()
            weights += list(get("weight_ih").chunk(G)) + list(get("weight_hh").chunk(G))
            if attrs["num_proj"]:
                weights.append(get("weight_hr"))
            if module.bias:
                biases += list(get("bias_ih").chunk(G)) + list(get("bias_hh").chunk(G))
            else:
                zero = torch.zeros(module.hidden_size, dtype=first.dtype, device=first.device)
                biases += [zero] * (2 * G)
    flat = torch.cat([t.reshape(-1) for t in weights + biases])
    expected = api.params_size(**attrs)
    assert flat.numel() == expected, (flat.numel(), expected)  # the layout's own invariant
    return flat, attrs


def to_torch(params, *, rnn_mode="lstm", num_layers, num_units, input_size,
             direction="unidirectional", num_proj=0, input_mode="linear_input"):
    """Build the PyTorch module whose weights are `params` (the inverse of from_torch).

    Parameters
    ----------
    params : array or torch.Tensor
        1-D opaque params (NumPy, CuPy, or a tensor); the module gets its dtype and
        device (NumPy → CPU).
    rnn_mode, num_layers, num_units, input_size, direction, num_proj
        As for ``pycudnnrnn.params_size``, with its defaults (the dict ``from_torch``
        returns fits).
    input_mode : str, default "linear_input"
        PyTorch's RNNs always multiply their input by a matrix, so params laid out for
        ``skip_input`` (or ``auto_select`` with input_size == num_units) are refused.

    Returns
    -------
    torch.nn.Module
        ``nn.LSTM`` (with ``proj_size`` when num_proj > 0), ``nn.GRU`` or ``nn.RNN``, with
        biases, in training mode, not batch-first.
    """
    import torch

    if checks.make_config(rnn_mode=rnn_mode, num_layers=num_layers, num_units=num_units,
                          input_size=input_size, input_mode=input_mode, direction=direction,
                          num_proj=num_proj).skip_input:
        raise ValueError(f"input_mode: PyTorch's RNNs have input matrices, so params laid out "
                         f"for skip input cannot convert, got input_mode={input_mode!r} with "
                         f"input_size={input_size} and num_units={num_units}")
    attrs = dict(rnn_mode=rnn_mode, num_layers=num_layers, num_units=num_units,
                 input_size=input_size, direction=direction, num_proj=num_proj)
    if not isinstance(params, torch.Tensor):
        plain_numpy = isinstance(params, np.ndarray) and not dtypes.is_bfloat16(params.dtype)
        params = torch.from_numpy(params) if plain_numpy else dtypes.torch_from_dlpack(params)
    weights, biases = api.params_to_canonical(params, **attrs)
    mode, G = attrs["rnn_mode"], _NUM_GATES[attrs["rnn_mode"]]
    kwargs = dict(num_layers=attrs["num_layers"], bidirectional=attrs["direction"] == "bidirectional",
                  dtype=params.dtype, device=params.device)
    if mode.startswith("rnn_"):
        kwargs["nonlinearity"] = mode[4:]
    if attrs["num_proj"]:
        kwargs["proj_size"] = attrs["num_proj"]
    module = getattr(torch.nn, _TORCH_CLASSES[mode])(attrs["input_size"], attrs["num_units"], **kwargs)
    w, b = iter(weights), iter(biases)
    take = lambda it, n: torch.cat([next(it) for _ in range(n)])
    with torch.no_grad():
        for layer in range(attrs["num_layers"]):
            for suffix in ("", "_reverse") if kwargs["bidirectional"] else ("",):
                target = lambda name: getattr(module, f"{name}_l{layer}{suffix}")
                target("weight_ih").copy_(take(w, G))
                target("weight_hh").copy_(take(w, G))
                if attrs["num_proj"]:
                    target("weight_hr").copy_(next(w))
                target("bias_ih").copy_(take(b, G))
                target("bias_hh").copy_(take(b, G))
    return module


# --------------------------------------------------------------------------- Keras

def _host(params):
    """`params` as a NumPy array; a PyTorch CPU bfloat16 tensor without a copy."""
    if isinstance(params, np.ndarray):
        return params
    if dtypes.is_bfloat16(getattr(params, "dtype", None)):
        return dtypes.numpy_from_dlpack("params", params)
    return np.asarray(params)


_KERAS_GRU_ORDER = (1, 0, 2)  # Keras z, r, h  <->  cuDNN r, z, h (a swap: its own inverse)


def _keras_split(matrix, mode, H):
    """Keras [n, G·H] → cuDNN-ordered list of [H, n] gate matrices."""
    gates = [matrix[:, g * H:(g + 1) * H].T for g in range(_NUM_GATES[mode])]
    return [gates[i] for i in _KERAS_GRU_ORDER] if mode == "gru" else gates


def _keras_join(gates, mode):
    """cuDNN-ordered list of [H, n] gate matrices (or [H] biases) → Keras [n, G·H] ([G·H])."""
    gates = [gates[i] for i in _KERAS_GRU_ORDER] if mode == "gru" else list(gates)
    return np.concatenate([g.T for g in gates], axis=-1) if gates[0].ndim == 2 else np.concatenate(gates)


def _check_keras_mode(rnn_mode, reset_after):
    if rnn_mode not in ("lstm", "gru"):
        raise ValueError(f"rnn_mode: Keras conversion supports 'lstm' and 'gru', got {rnn_mode!r}")
    if rnn_mode == "gru" and not reset_after:
        raise ValueError("reset_after: cuDNN's GRU is the reset-after form (the reset gate "
                         "multiplies R_h·h + b_Rh), so only Keras GRU(reset_after=True) weights "
                         "convert; a reset_after=False GRU computes a different function")


def from_keras(weights, *, rnn_mode, direction="unidirectional", reset_after=True):
    """Convert Keras ``LSTM`` / ``GRU(reset_after=True)`` weights to opaque params.

    Parameters
    ----------
    weights : list of arrays, or list of such lists
        ``layer.get_weights()`` of one LSTM or GRU layer (``[kernel, recurrent_kernel,
        bias]``), of a ``Bidirectional`` wrapper (forward layer's, then backward layer's;
        with ``direction="bidirectional"``), or a list of those for stacked layers.
    rnn_mode : {"lstm", "gru"}
    direction : {"unidirectional", "bidirectional"}
    reset_after : bool
        Must be True for a GRU: cuDNN's GRU is the reset-after form.

    Returns
    -------
    params : numpy.ndarray
    attrs : dict
        ``rnn_mode, num_layers, num_units, input_size, direction, num_proj``.
    """
    _check_keras_mode(rnn_mode, reset_after)
    weights = list(weights)
    stacked = bool(weights) and isinstance(weights[0], (list, tuple))
    layers = [list(w) for w in weights] if stacked else [weights]
    D = 2 if direction == "bidirectional" else 1
    G = _NUM_GATES[rnn_mode]
    canonical_w, canonical_b = [], []
    for index, layer in enumerate(layers):
        if len(layer) != 3 * D:
            raise ValueError(f"weights: expected {3 * D} arrays per layer ([kernel, recurrent_kernel, "
                             f"bias] × {D} direction(s)), got {len(layer)} for layer {index}")
        for d in range(D):
            kernel, recurrent, bias = (np.asarray(a) for a in layer[3 * d:3 * d + 3])
            H = recurrent.shape[0]
            if rnn_mode == "gru" and bias.shape != (2, G * H):
                raise ValueError(f"weights: a GRU bias of shape {bias.shape} is reset_after=False "
                                 f"(or not a GRU); expected (2, {G * H}). " +
                                 "cuDNN's GRU is the reset-after form.")
            if rnn_mode == "lstm" and bias.shape != (G * H,):
                raise ValueError(f"weights: expected an LSTM bias of shape ({G * H},), got {bias.shape}")
            canonical_w += _keras_split(kernel, rnn_mode, H) + _keras_split(recurrent, rnn_mode, H)
            if rnn_mode == "gru":
                b_input, b_rec = bias[0][None, :], bias[1][None, :]
            else:  # Keras has one bias: it becomes the input bias, the recurrent one is zero
                b_input, b_rec = bias[None, :], np.zeros_like(bias)[None, :]
            canonical_b += [g[:, 0] for g in _keras_split(b_input, rnn_mode, H)]
            canonical_b += [g[:, 0] for g in _keras_split(b_rec, rnn_mode, H)]
    first_kernel = np.asarray(layers[0][0])
    attrs = dict(rnn_mode=rnn_mode, num_layers=len(layers), num_units=int(np.asarray(layers[0][1]).shape[0]),
                 input_size=int(first_kernel.shape[0]), direction=direction, num_proj=0)
    dtype = np.result_type(*canonical_w)
    params = api.canonical_to_params([np.ascontiguousarray(w, dtype) for w in canonical_w],
                                     [np.ascontiguousarray(b, dtype) for b in canonical_b], **attrs)
    return params, attrs


def to_keras(params, *, rnn_mode, num_layers, num_units, input_size,
             direction="unidirectional", num_proj=0, reset_after=True):
    """Keras weights for `params`: one ``set_weights`` list per stacked layer.

    Returns
    -------
    list of list of numpy.ndarray
        For each layer, ``[kernel, recurrent_kernel, bias]`` (twice, forward then
        backward, when bidirectional, as ``Bidirectional.set_weights`` takes them). An
        LSTM's two biases are summed into Keras's one.
    """
    _check_keras_mode(rnn_mode, reset_after)
    if num_proj:
        raise ValueError(f"num_proj: Keras LSTM has no projection, got num_proj={num_proj}")
    attrs = dict(rnn_mode=rnn_mode, num_layers=num_layers, num_units=num_units,
                 input_size=input_size, direction=direction, num_proj=0)
    weights, biases = api.params_to_canonical(_host(params), **attrs)
    G, D = _NUM_GATES[rnn_mode], 2 if direction == "bidirectional" else 1
    result = []
    for layer in range(num_layers):
        layer_weights = []
        for d in range(D):
            k = layer * D + d
            w = weights[2 * G * k:2 * G * (k + 1)]
            b = biases[2 * G * k:2 * G * (k + 1)]
            kernel, recurrent = _keras_join(w[:G], rnn_mode), _keras_join(w[G:], rnn_mode)
            b_input, b_rec = _keras_join(b[:G], rnn_mode), _keras_join(b[G:], rnn_mode)
            bias = np.stack([b_input, b_rec]) if rnn_mode == "gru" else b_input + b_rec
            layer_weights += [kernel, recurrent, bias]
        result.append(layer_weights)
    return result


# --------------------------------------------------------------------------- TensorFlow

def from_tf_canonical(weights, biases, **attrs):
    """TensorFlow's canonical lists → params: exactly ``pycudnnrnn.canonical_to_params``.

    TensorFlow's ``CudnnRNNParamsToCanonicalV2`` and ``CudnnRNNCanonicalToParamsV2`` use
    the same order and shapes as this library (see ``docs/tensorflow.md``).
    """
    return api.canonical_to_params(weights, biases, **attrs)


def to_tf_canonical(params, **attrs):
    """params → TensorFlow's canonical lists: exactly ``pycudnnrnn.params_to_canonical``."""
    return api.params_to_canonical(params, **attrs)
