"""A deliberately naive RNN, written equation by equation from SPEC.md.

One sequence at a time, one step at a time, straight from the canonical weight lists:
nothing here shares code or tricks with the backend it checks.
"""

import numpy as np

import pycudnnrnn


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _cell(mode, x, h, c, W, R, bW, bR, Wp):
    """One step of one sequence. W/R/bW/bR are per-gate lists in canonical order."""
    def pre(g, with_rec_bias=True):
        return W[g] @ x + bW[g] + R[g] @ h + bR[g]

    if mode == "lstm":
        i, f, o = sigmoid(pre(0)), sigmoid(pre(1)), sigmoid(pre(3))
        g = np.tanh(pre(2))
        c = f * c + i * g
        m = o * np.tanh(c)
        return (m if Wp is None else Wp @ m), c
    if mode == "gru":
        r, z = sigmoid(pre(0)), sigmoid(pre(1))
        n = np.tanh(W[2] @ x + bW[2] + r * (R[2] @ h + bR[2]))
        return (1 - z) * n + z * h, c
    a = pre(0)
    return (np.tanh(a) if mode == "rnn_tanh" else np.maximum(a, 0)), c


def reference_forward(x, h0, c0, params, lengths, *, rnn_mode, direction, input_mode="linear_input",
                      num_proj=0, masks=None):
    """Time-major x [T, B, I], h0/c0 [L·D, B, ·]; returns output, output_h, output_c."""
    T, B, I = x.shape
    D = 2 if direction == "bidirectional" else 1
    LD, _, P = h0.shape
    L = LD // D
    H = c0.shape[2] if rnn_mode == "lstm" else P
    skip = input_mode == "skip_input" or (input_mode == "auto_select" and I == H)
    attrs = dict(rnn_mode=rnn_mode, num_layers=L, num_units=H, input_size=I, direction=direction,
                 input_mode=input_mode, num_proj=num_proj)
    weights, biases = pycudnnrnn.params_to_canonical(params, **attrs)
    G = {"lstm": 4, "gru": 3}.get(rnn_mode, 1)
    weights, biases = list(weights), list(biases)
    lengths = [T] * B if lengths is None else list(lengths)

    hN, cN = h0.astype(float).copy(), c0.astype(float).copy() if c0 is not None else None
    layer_in = x.astype(float)
    for layer in range(L):
        if masks is not None and layer > 0:
            layer_in = layer_in * masks[layer]
        layer_out = np.zeros((T, B, D * P))
        for d in range(D):
            k = layer * D + d
            if skip and layer == 0:
                W = [np.eye(H)] * G
            else:
                W = [weights.pop(0) for _ in range(G)]
            R = [weights.pop(0) for _ in range(G)]
            Wp = weights.pop(0) if num_proj else None
            bW = [biases.pop(0) for _ in range(G)]
            bR = [biases.pop(0) for _ in range(G)]
            for b in range(B):
                h = h0[k, b].astype(float)
                c = c0[k, b].astype(float) if c0 is not None else None
                steps = range(lengths[b]) if d == 0 else reversed(range(lengths[b]))
                for t in steps:
                    h, c = _cell(rnn_mode, layer_in[t, b], h, c, W, R, bW, bR, Wp)
                    layer_out[t, b, d * P:(d + 1) * P] = h
                hN[k, b] = h
                if c is not None:
                    cN[k, b] = c
        layer_in = layer_out
    return layer_in, hN, cN
