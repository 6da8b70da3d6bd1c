"""Timing forward and forward+backprop, ours and PyTorch's, on the CPU or a GPU.

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


def pytorch(case: Case, device: str):
    """PyTorch's (forward, forward+backward) on the same problem, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.allow_tf32 = False  # compare strict float32 with strict float32
    dev = "cpu" if device == "cpu" else "cuda"
    dtype = getattr(torch, case.dtype)
    if case.rnn_mode == "lstm":
        cls, kwargs = torch.nn.LSTM, {}
    elif case.rnn_mode == "gru":
        cls, kwargs = torch.nn.GRU, {}
    else:
        cls, kwargs = torch.nn.RNN, {"nonlinearity": case.rnn_mode.split("_")[1]}
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


class Progress:
    """A one-line progress bar on stderr, shown only on a terminal or when forced."""

    def __init__(self, total: int, enabled: bool | None = None):
        self.total, self.done, self.last = total, 0, 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled

    def step(self, label: str):
        self.done += 1
        if self.enabled:
            width = 30
            filled = int(width * self.done / self.total)
            line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label}"
            # The whole label, padded to wipe a longer previous one (no cursor codes, so a
            # log file reads the same).
            sys.stderr.write("\r" + line.ljust(self.last))
            self.last = len(line)
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def run(cases, devices=("cpu",), *, repeat=10, warmup=2, with_torch=True, progress=None):
    """Time every case on every device; PyTorch's figures joined where it is installed.

    Returns a list of dicts: the case's fields, ``device``, ``fwd_ms``, ``fwd_bwd_ms`` and,
    with torch, ``torch_fwd_ms``, ``torch_fwd_bwd_ms``: medians, each with ``_min`` and
    ``_max`` beside it (e.g. ``fwd_ms_min``).
    """
    cases = list(cases)
    bar = Progress(len(cases) * len(devices), progress)
    results = []
    # All of ours first: PyTorch's OpenMP threads keep spinning after its calls and would
    # take the cores from NumPy's BLAS if the two alternated.
    for device in devices:
        for case in cases:
            fwd, fwd_bwd = ours(case, device)
            results.append(dict(dataclasses.asdict(case), name=case.name, device=device,
                                **spread("fwd_ms", times_ms(fwd, device, repeat, warmup)),
                                **spread("fwd_bwd_ms", times_ms(fwd_bwd, device, repeat, warmup))))
            bar.step(f"{device} {case.name}")
    if with_torch:
        for row, (device, case) in zip(results, [(d, c) for d in devices for c in cases]):
            fns = pytorch(case, device)
            if fns is not None:
                row.update(spread("torch_fwd_ms", times_ms(fns[0], device, repeat, warmup)))
                row.update(spread("torch_fwd_bwd_ms", times_ms(fns[1], device, repeat, warmup)))
    return results


_COLUMNS = (("fwd_ms", "fwd"), ("fwd_bwd_ms", "fwd+bwd"), ("torch_fwd_ms", "torch fwd"),
            ("torch_fwd_bwd_ms", "torch f+b"))


def format_table(results) -> str:
    """The results as a text table: the median and [min-max] milliseconds of each figure."""
    columns = [(key, title) for key, title in _COLUMNS if any(key in r for r in results)]
    head = ["configuration", "device"]
    for _, title in columns:
        head += [f"{title} ms", "[min-max]"]
    rows = [head]
    for r in results:
        row = [r["name"], r["device"]]
        for key, _ in columns:
            if key in r:
                low, high = r.get(f"{key}_min", r[key]), r.get(f"{key}_max", r[key])
                row += [f"{r[key]:.3f}", f"[{low:.3f}-{high:.3f}]"]
            else:
                row += ["-", ""]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    # Names and spreads left-aligned, medians right-aligned under their titles.
    align = lambda i: "<" if i < 2 or i % 2 == 1 else ">"
    return "\n".join(" ".join(f"{cell:{align(i)}{widths[i]}}" for i, cell in enumerate(row)).rstrip()
                     for row in rows)


def plot(results, path: str):
    """Time against sequence length, one line per device, metric and library, with bars
    from the fastest to the slowest run (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {}
    for r in results:
        for key, label in (("fwd_ms", "forward"), ("fwd_bwd_ms", "forward+backprop"),
                           ("torch_fwd_ms", "PyTorch forward"),
                           ("torch_fwd_bwd_ms", "PyTorch forward+backward")):
            if key in r:
                series.setdefault((r["device"], label), []).append(
                    (r["max_time"], r[key], r.get(f"{key}_min", r[key]),
                     r.get(f"{key}_max", r[key])))
    for (device, label), points in sorted(series.items()):
        T, median, low, high = map(np.asarray, zip(*sorted(points)))
        # The bars span the fastest and slowest run: a spread that is large against the
        # median says the machine was busy, and the medians alone would hide it.
        ax.errorbar(T, median, yerr=(median - low, high - median), marker="o", capsize=3,
                    linestyle="--" if "PyTorch" in label else "-", label=f"{label} ({device})")
    first = results[0]
    ax.set_title(f"{first['rnn_mode']}, {first['num_layers']} layers, batch {first['batch_size']}, "
                 f"{first['input_size']}->{first['hidden_size']}, {first['dtype']}")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("time (ms): median, bars from min to max")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    lengths = sorted({r["max_time"] for r in results})
    ax.set_xticks(lengths, [str(T) for T in lengths])
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
