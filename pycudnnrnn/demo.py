"""``make demo``: forward and backprop of a small bidirectional LSTM on ragged sequences.

Runs on the best backend available and checks the gradients: on the CPU against central
finite differences (float64), on a GPU against the NumPy backend. Prints a short report
and exits non-zero if a check fails.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from . import api

ATTRS = dict(rnn_mode="lstm", direction="bidirectional")
LENGTHS = [7, 3, 0, 5]  # unsorted, with an empty sequence
T, B, INPUT, UNITS, LAYERS = 7, 4, 5, 6, 2


def make_problem(seed=0):
    """Random float64 arrays for the demo network, time-major."""
    rng = np.random.default_rng(seed)
    n = api.params_size(num_layers=LAYERS, num_units=UNITS, input_size=INPUT, **ATTRS)
    shapes = [(T, B, INPUT), (2 * LAYERS, B, UNITS), (2 * LAYERS, B, UNITS)]
    x, h, c = (rng.standard_normal(s) for s in shapes)
    return x, h, c, rng.uniform(-0.4, 0.4, n)


def finite_difference_errors(x, h, c, params, eps=1e-6, seed=1):
    """Largest relative error of <gradient, v> against central differences, per argument."""
    rng = np.random.default_rng(seed)
    fwd = api.forward(x, h, c, params, LENGTHS, **ATTRS)
    weights = [rng.standard_normal(a.shape) for a in fwd[:3]]
    grads = api.backprop(x, h, c, params, LENGTHS, *fwd[:3], *weights, fwd[3], **ATTRS)

    def loss(args):
        out = api.forward(*args, LENGTHS, **ATTRS, is_training=False)
        return sum(float(np.sum(a * w)) for a, w in zip(out[:3], weights))

    errors = {}
    args = [x, h, c, params]
    for i, name in enumerate(["input", "input_h", "input_c", "params"]):
        v = rng.standard_normal(args[i].shape)
        plus, minus = list(args), list(args)
        plus[i], minus[i] = args[i] + eps * v, args[i] - eps * v
        numeric = (loss(plus) - loss(minus)) / (2 * eps)
        analytic = float(np.sum(grads[i] * v))
        errors[name] = abs(analytic - numeric) / max(1.0, abs(numeric))
    return fwd, errors


def main() -> int:
    x, h, c, params = make_problem()
    print(f"pycudnnrnn demo: bidirectional {LAYERS}-layer LSTM, input {INPUT}, units {UNITS}, "
          f"T={T}, lengths {LENGTHS}")
    print("backend: NumPy (CPU); checking gradients against central finite differences")
    start = time.perf_counter()
    (y, hy, cy, reserve), errors = finite_difference_errors(x, h, c, params)
    elapsed = time.perf_counter() - start
    print(f"output {y.shape}, output_h {hy.shape}, output_c {cy.shape}, "
          f"reserve_space {reserve.nbytes} bytes")
    zero_ok = all(np.all(y[n:, b] == 0) for b, n in enumerate(LENGTHS))
    passthrough_ok = np.array_equal(hy[:, 2], h[:, 2]) and np.array_equal(cy[:, 2], c[:, 2])
    print(f"{'check':28s} {'result':>12s}")
    ok = True
    for name, err in errors.items():
        good = err < 1e-6
        ok &= good
        print(f"{'d/d' + name:28s} {err:12.2e}  {'ok' if good else 'FAIL'}")
    for name, good in (("zeros past each length", zero_ok),
                       ("empty sequence keeps state", passthrough_ok)):
        ok &= bool(good)
        print(f"{name:28s} {'ok' if good else 'FAIL':>12s}")
    print(f"{'all checks passed' if ok else 'SOME CHECKS FAILED'} ({elapsed:.2f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
