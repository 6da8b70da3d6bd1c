"""What importing an adapter adds to importing its framework, each in a fresh process.

    python benchmarks/import_cost.py [--rounds 7] [--frameworks torch jax ...] [--clock cpu]
                                     [--json]

For each framework two kinds of process run, alternating (A B, then B A, ...), each
timing its own imports with ``time.perf_counter``:

* ``alone``: ``import FRAMEWORK``;
* ``adapter``: ``import FRAMEWORK; import pycudnnrnn.ADAPTER``.

Printed per framework: the median and the range (min-max) of each, and the difference:
the median and range of the per-round differences (``adapter`` minus ``alone`` of the
same round). ``in-process`` is the adapter's import alone as the ``adapter`` processes
timed it after their framework's (less noisy than a difference of two processes).
``--clock cpu`` sums the processes' CPU time (``time.process_time``) in place of the wall
clock's: steadier on a machine others load. Frameworks that are not installed are left
out. Prints; asserts nothing.
"""

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

#: name: (the framework's modules, the adapter, environment)
FRAMEWORKS = {
    "torch": (("torch",), "pycudnnrnn.torch", {}),
    "jax": (("jax",), "pycudnnrnn.jax", {}),
    "flax": (("jax", "flax.nnx"), "pycudnnrnn.flax", {}),
    "keras-jax": (("keras",), "pycudnnrnn.keras", {"KERAS_BACKEND": "jax"}),
    "keras-torch": (("keras",), "pycudnnrnn.keras", {"KERAS_BACKEND": "torch"}),
    "tensorflow": (("tensorflow",), "pycudnnrnn.tensorflow", {"TF_CPP_MIN_LOG_LEVEL": "3"}),
    "keras-tensorflow": (("keras",), "pycudnnrnn.keras", {"KERAS_BACKEND": "tensorflow",
                                                           "TF_CPP_MIN_LOG_LEVEL": "3"}),
}
SIDES = ("alone", "adapter")
#: what each Keras backend needs besides Keras
_BACKEND_NEEDS = {"keras-jax": ("jax",), "keras-torch": ("torch",),
                  "keras-tensorflow": ("tensorflow",)}


def available(name):
    """Whether `name`'s framework (and, for Keras, its backend) is installed."""
    modules, _, _ = FRAMEWORKS[name]
    needed = [m.split(".")[0] for m in modules] + list(_BACKEND_NEEDS.get(name, ()))
    return all(importlib.util.find_spec(m) is not None for m in needed)


def worker(name, side):
    """Time this process's imports, as JSON: ``{"framework_s", "adapter_s", "total_s"}``
    on the wall clock, and the same keys with ``cpu_`` in front in CPU time."""
    modules, adapter, _ = FRAMEWORKS[name]
    clocks = lambda: (time.perf_counter(), time.process_time())  # noqa: E731
    start = clocks()
    for module in modules:
        importlib.import_module(module)
    framework_done = end = clocks()
    if side == "adapter":
        importlib.import_module(adapter)
        end = clocks()
    figures = {}
    for k, prefix in enumerate(("", "cpu_")):
        figures.update({f"{prefix}framework_s": framework_done[k] - start[k],
                        f"{prefix}adapter_s": end[k] - framework_done[k],
                        f"{prefix}total_s": end[k] - start[k]})
    print(json.dumps(figures))


def measure(names, rounds):
    """``{name: {side: [per-round worker results]}}``; the sides alternate in order, one
    process each, the frameworks in turn within each round."""
    times = {name: {side: [] for side in SIDES} for name in names}
    for round_ in range(rounds):
        for name in names:
            env = {**os.environ, **FRAMEWORKS[name][2]}
            for side in (SIDES if round_ % 2 == 0 else SIDES[::-1]):
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                                       name, side], capture_output=True, text=True, env=env)
                if proc.returncode:
                    raise RuntimeError(f"{name} {side}: exit {proc.returncode}\n"
                                       f"{proc.stderr[-3000:]}")
                times[name][side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return times


def _stats(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summary(times, clock="wall"):
    """Per framework: ``alone``, ``adapter``, ``difference`` and ``in_process`` as
    ``{"median", "min", "max"}`` in seconds of `clock` (``wall`` or ``cpu``)."""
    prefix = "cpu_" if clock == "cpu" else ""
    rows = {}
    for name, sides in times.items():
        alone = [r[prefix + "total_s"] for r in sides["alone"]]
        adapter = [r[prefix + "total_s"] for r in sides["adapter"]]
        rows[name] = {"alone": _stats(alone), "adapter": _stats(adapter),
                      "difference": _stats([b - a for a, b in zip(alone, adapter)]),
                      "in_process": _stats([r[prefix + "adapter_s"] for r in sides["adapter"]]),
                      "rounds": len(alone), "clock": clock}
    return rows


def table(rows):
    fmt = lambda s: f"{s['median']:6.2f} ({s['min']:.2f}-{s['max']:.2f})"  # noqa: E731
    diff = lambda s: f"{s['median']:+6.2f} ({s['min']:+.2f} to {s['max']:+.2f})"  # noqa: E731
    lines = [f"{'framework':<12} {'import FRAMEWORK alone s':>24} {'+ pycudnnrnn adapter s':>24}"
             f" {'difference s':>24} {'in-process s':>20}"]
    for name, row in rows.items():
        lines.append(f"{name:<12} {fmt(row['alone']):>24} {fmt(row['adapter']):>24} "
                     f"{diff(row['difference']):>24} {fmt(row['in_process']):>20}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--frameworks", nargs="+", choices=list(FRAMEWORKS),
                        default=list(FRAMEWORKS))
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall-clock time, or the processes' CPU time")
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return
    names = [name for name in args.frameworks if available(name)]
    rows = summary(measure(names, args.rounds), args.clock)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{args.rounds} rounds, each side in a fresh process, alternating; seconds "
              f"({args.clock} clock), median (min-max)")
        print(table(rows))


if __name__ == "__main__":
    main()
