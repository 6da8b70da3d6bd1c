"""Timing forward and forward+backward on the CPU or a GPU: pycudnnrnn's op, its
PyTorch drop-in, and PyTorch's own RNN.

Used by ``pycudnnrnn bench`` and the scripts in ``benchmarks/``. Each figure is the
median of the timed runs after warm-up, with their minimum and maximum beside it:
wall-clock on the CPU, CUDA events on the GPU. Nothing here asserts a speed; it
measures and reports.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

from .. import api
from ..core import dtypes

METRICS = ("fwd_ms", "fwd_bwd_ms")


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark problem."""

    rnn_mode: str = "lstm"
    num_layers: int = 2
    bidirectional: bool = True
    max_time: int = 64
    batch_size: int = 32
    input_size: int = 256
    hidden_size: int = 256
    dtype: str = "float32"
    ragged: bool = False

    @property
    def name(self) -> str:
        return (f"{self.rnn_mode} {self.num_layers}L {'bidir' if self.bidirectional else 'uni'} "
                f"T{self.max_time} B{self.batch_size} {self.input_size}->{self.hidden_size} "
                f"{self.dtype}{' ragged' if self.ragged else ''}")

    def settings(self) -> dict:
        """The case under the names of ``pycudnnrnn bench``'s options."""
        return dict(mode=self.rnn_mode, direction=self.attrs["direction"],
                    layers=self.num_layers, seq_length=self.max_time, batch=self.batch_size,
                    input_size=self.input_size, hidden_size=self.hidden_size,
                    dtype=self.dtype, ragged=self.ragged)

    @property
    def attrs(self) -> dict:
        return dict(rnn_mode=self.rnn_mode,
                    direction="bidirectional" if self.bidirectional else "unidirectional")

    def lengths(self):
        """Lengths drawn uniformly from [T/2, T] when ragged, else None."""
        if not self.ragged:
            return None
        T = self.max_time
        return np.random.default_rng(0).integers(max(1, T // 2), T + 1, self.batch_size)


def _xp(device):
    if device == "cpu":
        return np
    from ..core.gpu import cupy
    return cupy()


def ours(case: Case, device: str):
    """(forward, forward+backprop) callables on `device` ("cpu" or "gpu")."""
    xp = _xp(device)
    rng = np.random.default_rng(0)
    D = 2 if case.bidirectional else 1
    n = api.params_size(num_layers=case.num_layers, num_units=case.hidden_size,
                        input_size=case.input_size, **case.attrs)

    def array(*shape):
        return xp.asarray(rng.uniform(-0.1, 0.1, shape).astype(dtypes.by_name(case.dtype)))

    x = array(case.max_time, case.batch_size, case.input_size)
    h = array(case.num_layers * D, case.batch_size, case.hidden_size)
    c = array(case.num_layers * D, case.batch_size, case.hidden_size) if case.rnn_mode == "lstm" else None
    p = array(n)
    lengths = case.lengths()
    out = api.forward(x, h, c, p, lengths, **case.attrs)
    grads = [xp.ones_like(a) for a in out[:3]]

    def forward():
        return api.forward(x, h, c, p, lengths, **case.attrs)

    def forward_backprop():
        y, hy, cy, reserve = forward()
        api.backprop(x, h, c, p, lengths, y, hy, cy, *grads, reserve, **case.attrs)

    return forward, forward_backprop


def _torch_module(case: Case, device: str, module: str):
    """(forward, forward+backward) of `module` ("torch.nn" or "pycudnnrnn.torch") on
    the problem; None without torch, or on a GPU this torch cannot use."""
    try:
        import torch
    except ImportError:
        return None
    if device != "cpu" and not torch.cuda.is_available():
        return None
    if module == "torch.nn":
        classes = torch.nn
        torch.backends.cudnn.allow_tf32 = False  # compare strict float32 with strict float32
    else:
        import pycudnnrnn.torch as classes
    dev = "cpu" if device == "cpu" else "cuda"
    dtype = getattr(torch, case.dtype)
    cls, kwargs = (getattr(classes, case.rnn_mode.upper()), {}) \
        if case.rnn_mode in ("lstm", "gru") else \
        (classes.RNN, {"nonlinearity": case.rnn_mode.split("_")[1]})
    torch.manual_seed(0)
    net = cls(case.input_size, case.hidden_size, num_layers=case.num_layers,
              bidirectional=case.bidirectional, **kwargs).to(dev, dtype)
    x = (torch.rand(case.max_time, case.batch_size, case.input_size, device=dev, dtype=dtype)
         * 0.2 - 0.1).requires_grad_()
    lengths = case.lengths()

    def run():
        if lengths is None:
            return net(x)[0]
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.from_numpy(lengths),
                                                         enforce_sorted=False)
        return net(packed)[0].data

    def forward():
        return run()

    def forward_backward():
        run().sum().backward()

    return forward, forward_backward


def pytorch(case: Case, device: str):
    """PyTorch's ``torch.nn`` RNN's (forward, forward+backward) on the same problem, or
    None without torch."""
    return _torch_module(case, device, "torch.nn")


def drop_in(case: Case, device: str):
    """The drop-in ``pycudnnrnn.torch`` RNN's (forward, forward+backward), or None
    without torch."""
    return _torch_module(case, device, "pycudnnrnn.torch")


#: What ``run`` can time: the op on NumPy (or CuPy) arrays, the PyTorch drop-in, and
#: PyTorch's own RNN.
SIDES = ("op", "drop-in", "torch")
_TIMERS = {"op": ours, "drop-in": drop_in, "torch": pytorch}


def label(side: str, device: str, rnn_mode: str = "lstm") -> str:
    """What a side is, as a user would name it: "pycudnnrnn, NumPy backend",
    "pycudnnrnn.torch.LSTM", "torch.nn.LSTM"."""
    cls = rnn_mode.upper() if rnn_mode in ("lstm", "gru") else "RNN"
    if side == "op":
        return "pycudnnrnn, NumPy backend" if device == "cpu" else "pycudnnrnn, cuDNN"
    return f"{'pycudnnrnn.torch' if side == 'drop-in' else 'torch.nn'}.{cls}"


def times_ms(fn, device: str, repeat: int, warmup: int) -> list:
    """Every timed run of `fn` in milliseconds: wall clock on the CPU, CUDA events on a GPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device == "cpu":
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - start))
    else:
        cupy = _xp(device)
        for _ in range(repeat):
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop))
    return times


def spread(key: str, times) -> dict:
    """``{key: median, key_min: ..., key_max: ...}`` of `times`."""
    return {key: float(np.median(times)), f"{key}_min": float(min(times)),
            f"{key}_max": float(max(times))}


def run(cases, devices=("cpu",), *, repeat=10, warmup=2, with_torch=True, sides=None,
        progress=True, rounds=2):
    """Time every case on every device, for each side; return one row per measurement.

    Each side runs in a process of its own: in one process, one library's idle thread
    pool (PyTorch's OpenMP threads, NumPy's BLAS) slows the other's, and the figures
    would lie. With more than one side the processes take turns for `rounds` rounds
    (ours then theirs, then theirs first), and a figure pools the timed runs of every
    round; one side alone runs once.

    `sides` is a list of ``SIDES`` (default: ``op``, and ``torch`` when `with_torch`); a
    PyTorch side is left out where torch is not installed. Each row is a dict: the
    case's settings under the command line's names (``mode``, ``direction``,
    ``layers``, ``seq_length``, ``batch``, ``input_size``, ``hidden_size``, ``dtype``,
    ``ragged``), ``configuration`` (its name), ``device``, ``side``, ``label`` (what was
    timed, e.g. "torch.nn.LSTM"), and ``fwd_ms``, ``fwd_bwd_ms``: medians, each with
    ``_min`` and ``_max`` beside it. With `progress`, a line per measurement on stderr as
    it is made.
    """
    cases, devices = list(cases), list(devices)
    sides = list(sides) if sides is not None else ["op"] + (["torch"] if with_torch else [])
    rounds = rounds if len(sides) > 1 else 1
    jobs = [(device, i) for device in devices for i in range(len(cases))]
    timed, step, total = {}, 0, rounds * len(sides) * len(jobs)
    for round_ in range(rounds):
        for side in (sides if round_ % 2 == 0 else sides[::-1]):
            for (device, i), result in zip(jobs, _in_a_process(side, jobs, cases, repeat,
                                                               warmup)):
                step += 1
                case, name = cases[i], label(side, device, cases[i].rnn_mode)
                where = f"[{step}/{total}] {device} {case.name}, {name}"
                if result is None:
                    _say(progress, f"{where}: skipped (no PyTorch"
                                   f"{'' if device == 'cpu' else ' with CUDA'})")
                    continue
                pooled = timed.setdefault((side, device, i), ([], []))
                for kept, new in zip(pooled, result):
                    kept.extend(new)
                _say(progress, f"{where}: fwd {float(np.median(result[0])):.3f} ms, "
                               f"fwd+bwd {float(np.median(result[1])):.3f} ms")
    rows = []
    for i in range(len(cases)):
        for device in devices:
            for side in sides:
                if (side, device, i) in timed:
                    forward, both = timed[side, device, i]
                    rows.append(dict(cases[i].settings(), configuration=cases[i].name,
                                     device=device, side=side,
                                     label=label(side, device, cases[i].rnn_mode),
                                     **spread("fwd_ms", forward),
                                     **spread("fwd_bwd_ms", both)))
    return rows


def _in_a_process(side, jobs, cases, repeat, warmup):
    """Each job's ``(forward times, forward+backward times)`` (or None: not timed), as a
    process of its own measures them, one by one as they come."""
    import json
    import os
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    order = {"side": side, "repeat": repeat, "warmup": warmup,
             "jobs": [[device, dataclasses.asdict(cases[i])] for device, i in jobs]}
    with subprocess.Popen([sys.executable, "-c", "from pycudnnrnn.tools.bench import "
                           "_worker; _worker()"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as proc:
        proc.stdin.write(json.dumps(order))
        proc.stdin.close()
        for line in proc.stdout:
            yield json.loads(line)
        error = proc.stderr.read()
    if proc.returncode:
        raise RuntimeError(f"the {side} side's process failed (exit {proc.returncode}):\n"
                           f"{error[-3000:]}")


def _worker():
    """``_in_a_process``'s other end: the order on stdin, a JSON line per job on stdout."""
    import json
    order = json.loads(sys.stdin.read())
    for device, settings in order["jobs"]:
        case = Case(**settings)
        fns = _TIMERS[order["side"]](case, device)
        result = None if fns is None else \
            [times_ms(fn, device, order["repeat"], order["warmup"]) for fn in fns]
        print(json.dumps(result), flush=True)


def _say(progress, line):
    if progress:
        print(line, file=sys.stderr, flush=True)


def format_table(results) -> str:
    """The results as a text table: what was timed, then the median and [min-max]
    milliseconds of forward and forward+backward; a configuration named once for its
    rows."""
    head = ["configuration", "device", "timed", "fwd ms", "[min-max]", "fwd+bwd ms", "[min-max]"]
    rows, group, seen = [head], None, set()
    for r in results:
        key = (r["configuration"], r["device"])
        if key != group or r["label"] in seen:  # a new group (or the same case again)
            group, seen = key, set()
            row = list(key)
        else:
            row = ["", ""]
        seen.add(r["label"])
        row.append(r["label"])
        for metric in ("fwd_ms", "fwd_bwd_ms"):
            low, high = r.get(f"{metric}_min", r[metric]), r.get(f"{metric}_max", r[metric])
            row += [f"{r[metric]:.3f}", f"[{low:.3f}-{high:.3f}]"]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    # Names and spreads left-aligned, medians right-aligned under their titles.
    align = lambda i: "<" if i < 3 or i % 2 == 0 else ">"
    return "\n".join(" ".join(f"{cell:{align(i)}{widths[i]}}" for i, cell in enumerate(row)).rstrip()
                     for row in rows)


def plot(results, path: str):
    """Time against sequence length, one line per device, metric and side, with bars
    from the fastest to the slowest run (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {}
    for r in results:
        for key, metric in (("fwd_ms", "forward"), ("fwd_bwd_ms", "forward+backward")):
            series.setdefault((r["device"], r["label"], metric), []).append(
                (r["seq_length"], r[key], r.get(f"{key}_min", r[key]),
                 r.get(f"{key}_max", r[key])))
    for (device, name, metric), points in sorted(series.items()):
        T, median, low, high = map(np.asarray, zip(*sorted(points)))
        # The bars span the fastest and slowest run: a spread that is large against the
        # median says the machine was busy, and the medians alone would hide it.
        ax.errorbar(T, median, yerr=(median - low, high - median), marker="o", capsize=3,
                    linestyle="--" if name.startswith("torch.nn") else "-",
                    label=f"{name}, {metric} ({device})")
    first = results[0]
    ax.set_title(f"{first['mode']}, {first['layers']} layers, {first['direction']}, batch "
                 f"{first['batch']}, {first['input_size']}->{first['hidden_size']}, "
                 f"{first['dtype']}")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("time (ms): median, bars from min to max")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    lengths = sorted({r["seq_length"] for r in results})
    ax.set_xticks(lengths, [str(T) for T in lengths])
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
