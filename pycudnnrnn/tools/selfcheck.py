"""``pycudnnrnn check``: run forward and backprop once and verify them.

On the CPU, gradients are compared with central finite differences of forward, in
float64 (a lower --dtype is then compared with float64). On a GPU, every output and
gradient is compared with the NumPy backend. The semantics of lengths are checked too:
zeros past each length, and empty sequences passing their state through.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from .. import api
from ..core import dtypes

#: Test hook (not a user option): scale params_backprop by this factor to prove that
#: ``check`` notices a wrong gradient.
CORRUPT_ENV = "PYCUDNNRNN_CHECK_CORRUPT_GRADIENT"
TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-2, "bfloat16": 4e-2}
FD_TOLERANCE = 1e-6


@dataclasses.dataclass
class CheckConfig:
    """What to run: the op's attributes, sizes, lengths, dtype and backend."""

    rnn_mode: str = "lstm"
    direction: str = "bidirectional"
    input_mode: str = "linear_input"
    num_layers: int = 2
    input_size: int = 5
    hidden_size: int = 6
    num_proj: int = 0
    max_time: int = 7
    lengths: tuple = (7, 3, 0, 5)
    time_major: bool = True
    dtype: str = "float64"
    backend: str = "cpu"
    seed: int = 0

    @property
    def attrs(self):
        return dict(rnn_mode=self.rnn_mode, direction=self.direction, input_mode=self.input_mode,
                    num_proj=self.num_proj, time_major=self.time_major)


@dataclasses.dataclass
class Row:
    name: str
    error: float | None
    tolerance: float | None
    ok: bool


def make_inputs(cfg: CheckConfig, dtype="float64"):
    """Random input, input_h, input_c, params (NumPy), laid out as `cfg` says."""
    rng = np.random.default_rng(cfg.seed)
    D = 2 if cfg.direction == "bidirectional" else 1
    B, T, P = len(cfg.lengths), cfg.max_time, cfg.num_proj or cfg.hidden_size
    n = api.params_size(rnn_mode=cfg.rnn_mode, num_layers=cfg.num_layers, num_units=cfg.hidden_size,
                        input_size=cfg.input_size, input_mode=cfg.input_mode,
                        direction=cfg.direction, num_proj=cfg.num_proj)
    x = rng.standard_normal((T, B, cfg.input_size))
    h = rng.standard_normal((cfg.num_layers * D, B, P))
    c = rng.standard_normal((cfg.num_layers * D, B, cfg.hidden_size))
    if not cfg.time_major:
        x, h, c = (np.ascontiguousarray(a.swapaxes(0, 1)) for a in (x, h, c))
    if cfg.rnn_mode != "lstm":
        c = None
    p = rng.uniform(-0.4, 0.4, n)
    dtype = dtypes.by_name(dtype) if isinstance(dtype, str) else dtype
    cast = lambda a: None if a is None else a.astype(dtype)
    return cast(x), cast(h), cast(c), cast(p)


def _run(cfg, args, xp=np, seed=1):
    """forward, then backprop of a random linear loss; all on the arrays' backend."""
    lengths = list(cfg.lengths)
    fwd = api.forward(*args, lengths, **cfg.attrs)
    rng = np.random.default_rng(seed)
    weights = [xp.asarray(rng.standard_normal(a.shape).astype(a.dtype)) for a in fwd[:3]]
    grads = list(api.backprop(*args, lengths, *fwd[:3], *weights, fwd[3], **cfg.attrs))
    factor = float(os.environ.get(CORRUPT_ENV, "1"))
    if factor != 1:
        grads[3] = grads[3] * factor
    return fwd, weights, grads


def _to_host(a):
    return a if isinstance(a, np.ndarray) else a.get()


def _relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max(initial=0) / max(1.0, np.abs(b).max(initial=0)))


def _semantics(cfg, args, fwd):
    """Rows for: zeros past each length, and empty sequences keeping their state."""
    y, hy = _to_host(fwd[0]), _to_host(fwd[1])
    h0 = args[1]
    if not cfg.time_major:
        y, hy, h0 = y.swapaxes(0, 1), hy.swapaxes(0, 1), h0.swapaxes(0, 1)
    zeros = all(np.all(y[n:, b] == 0) for b, n in enumerate(cfg.lengths))
    empty = [b for b, n in enumerate(cfg.lengths) if n == 0]
    kept = all(np.array_equal(hy[:, b], h0[:, b]) for b in empty)
    rows = [Row("zeros past each length", None, None, zeros)]
    if empty:
        rows.append(Row("empty sequence keeps state", None, None, kept))
    return rows


def check_cpu(cfg: CheckConfig):
    """Finite differences in float64; a lower dtype compared with float64."""
    args = make_inputs(cfg)
    fwd, weights, grads = _run(cfg, args)
    rows = []
    rng = np.random.default_rng(2)
    eps = 1e-6

    def loss(values):
        out = api.forward(*values, list(cfg.lengths), **cfg.attrs, is_training=False)
        return sum(float(np.sum(a * w)) for a, w in zip(out[:3], weights))

    for i, name in enumerate(["input", "input_h", "input_c", "params"]):
        if args[i] is None:
            continue
        v = rng.standard_normal(args[i].shape)
        plus, minus = list(args), list(args)
        plus[i], minus[i] = args[i] + eps * v, args[i] - eps * v
        numeric = (loss(plus) - loss(minus)) / (2 * eps)
        error = abs(float(np.sum(grads[i] * v)) - numeric) / max(1.0, abs(numeric))
        rows.append(Row(f"d/d{name} vs finite differences", error, FD_TOLERANCE,
                        error < FD_TOLERANCE))
    rows += _semantics(cfg, args, fwd)
    if cfg.dtype != "float64":
        low = [None if a is None else a.astype(dtypes.by_name(cfg.dtype)) for a in args]
        ref = [None if a is None else a.astype(np.float64) for a in low]
        fwd_low, _, grads_low = _run(cfg, low)
        fwd_ref, _, grads_ref = _run(cfg, ref)
        rows += _compare(fwd_low[:3] + tuple(grads_low), fwd_ref[:3] + tuple(grads_ref),
                         f"{cfg.dtype} vs float64", TOLERANCE[cfg.dtype])
    return rows


_NAMES = ["output", "output_h", "output_c", "input_backprop", "input_h_backprop",
          "input_c_backprop", "params_backprop"]


def _compare(got, want, what, tolerance):
    rows = []
    for name, a, b in zip(_NAMES, got, want):
        if _to_host(b).size == 0:
            continue
        error = _relative(_to_host(a), _to_host(b))
        rows.append(Row(f"{name} {what}", error, tolerance, error <= tolerance))
    return rows


def check_gpu(cfg: CheckConfig):
    """cuDNN against the NumPy backend, at the dtype's tolerance."""
    from ..core.gpu import cupy as find_cupy
    cupy = find_cupy()
    args = make_inputs(cfg, cfg.dtype)
    fwd_cpu, _, grads_cpu = _run(cfg, args)
    gpu_args = [None if a is None else cupy.asarray(a) for a in args]
    fwd_gpu, _, grads_gpu = _run(cfg, gpu_args, xp=cupy)
    rows = _compare(fwd_gpu[:3] + tuple(grads_gpu), fwd_cpu[:3] + tuple(grads_cpu),
                    "cuDNN vs NumPy", TOLERANCE[cfg.dtype])
    return rows + _semantics(cfg, args, fwd_gpu)


def run(cfg: CheckConfig):
    """All rows for `cfg` on its backend."""
    return check_gpu(cfg) if cfg.backend == "gpu" else check_cpu(cfg)
