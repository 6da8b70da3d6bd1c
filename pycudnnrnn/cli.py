"""The ``pycudnnrnn`` command: ``info``, ``check`` and ``bench``.

Bad options are usage errors (exit 2, no traceback); ``check`` exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys

from .config import DIRECTIONS, INPUT_MODES, RNN_MODES

DTYPES = ("float16", "bfloat16", "float32", "float64")


def _int_list(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _add_network_options(p, *, layers, input_size, hidden_size, bidirectional):
    p.add_argument("--mode", choices=RNN_MODES, default="lstm", help="cell (default: lstm)")
    p.add_argument("--direction", choices=DIRECTIONS,
                   default="bidirectional" if bidirectional else "unidirectional")
    p.add_argument("--layers", type=_positive, default=layers, help=f"default: {layers}")
    p.add_argument("--input-size", type=_positive, default=input_size, help=f"default: {input_size}")
    p.add_argument("--hidden-size", type=_positive, default=hidden_size,
                   help=f"num_units (default: {hidden_size})")


def _parser():
    parser = argparse.ArgumentParser(
        prog="pycudnnrnn", description="cuDNN's RNNs (TensorFlow's CudnnRNNV3 op pair) with a "
                                       "NumPy twin: environment, self-check, benchmark.")
    sub = parser.add_subparsers(dest="command", metavar="{info,check,bench}", required=True)

    sub.add_parser("info", help="versions, cuDNN, GPUs and backends (paste into bug reports)",
                   description="Print package, Python, NumPy and CuPy versions, the cuDNN "
                               "library and version (or why it does not load), the GPUs seen "
                               "and which backend runs which arrays.")

    check = sub.add_parser("check", help="run forward + backprop once and verify the gradients",
                           description="Run forward and backprop once and verify them: against "
                                       "central finite differences on the CPU, against the "
                                       "NumPy backend on a GPU. Exits 1 on a mismatch.")
    _add_network_options(check, layers=2, input_size=5, hidden_size=6, bidirectional=True)
    check.add_argument("--input-mode", choices=INPUT_MODES, default="linear_input")
    check.add_argument("--num-proj", type=int, default=0, help="LSTM projection (default: 0)")
    check.add_argument("--lengths", type=_int_list, default=[7, 3, 0, 5],
                       help="sequence lengths, comma-separated; the batch size is their count "
                            "(default: 7,3,0,5)")
    check.add_argument("--max-time", type=_positive, default=None,
                       help="T (default: the longest length, at least 1)")
    check.add_argument("--batch-major", action="store_true", help="time_major=False")
    check.add_argument("--dtype", choices=DTYPES, default="float64")
    check.add_argument("--backend", choices=("auto", "cpu", "gpu"), default="auto",
                       help="auto: the GPU when one is usable (default)")
    check.add_argument("--seed", type=int, default=0, help="for the random problem")

    bench = sub.add_parser("bench", help="time forward and forward+backprop (and PyTorch's)",
                           description="Time forward and forward+backprop over sequence lengths "
                                       "on the chosen backend(s), with warm-up and medians; "
                                       "compares with PyTorch when it is installed.")
    _add_network_options(bench, layers=2, input_size=256, hidden_size=256, bidirectional=True)
    bench.add_argument("--batch", type=_positive, default=32, help="default: 32")
    bench.add_argument("--seq-lengths", type=_int_list, default=[16, 32, 64],
                       help="T values, comma-separated (default: 16,32,64)")
    bench.add_argument("--ragged", action="store_true", help="lengths drawn from [T/2, T]")
    bench.add_argument("--dtype", choices=DTYPES, default="float32")
    bench.add_argument("--backend", choices=("auto", "cpu", "gpu", "all"), default="auto",
                       help="auto: the GPU when usable, else the CPU; all: every usable one")
    bench.add_argument("--repeat", type=_positive, default=10, help="timed runs (default: 10)")
    bench.add_argument("--warmup", type=int, default=2, help="untimed runs first (default: 2)")
    bench.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    bench.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    bench.add_argument("--plot", metavar="PATH", help="also plot time against T (PNG)")
    bench.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                       help="progress bar on stderr (auto: on a terminal)")
    return parser


def _devices(choice, parser, allow_all):
    from .environment import gpu_status
    usable, detail = gpu_status()
    if choice == "auto":
        return ["gpu" if usable else "cpu"]
    if choice in ("gpu", "all") and not usable:
        if choice == "all":
            return ["cpu"]
        parser.error(f"--backend gpu: no usable GPU ({detail})")
    return ["cpu", "gpu"] if choice == "all" and allow_all else [choice]


def _info(args, parser):
    from .environment import collect
    info = collect()
    width = max(map(len, info))
    for key, value in info.items():
        print(f"{key:{width}s}  {value}")
    return 0


def _check(args, parser):
    from . import selfcheck
    max_time = args.max_time or max(1, max(args.lengths))
    if max(args.lengths) > max_time or min(args.lengths) < 0:
        parser.error(f"--lengths: expected values in [0, {max_time}] (--max-time), got {args.lengths}")
    device = _devices(args.backend, parser, allow_all=False)[0]
    cfg = selfcheck.CheckConfig(rnn_mode=args.mode, direction=args.direction,
                                input_mode=args.input_mode, num_layers=args.layers,
                                input_size=args.input_size, hidden_size=args.hidden_size,
                                num_proj=args.num_proj, max_time=max_time,
                                lengths=tuple(args.lengths), time_major=not args.batch_major,
                                dtype=args.dtype, backend=device, seed=args.seed)
    try:
        rows = selfcheck.run(cfg)
    except (ValueError, TypeError) as exc:  # a configuration the library refuses
        parser.error(str(exc))
    how = "central finite differences (float64)" if device == "cpu" else "the NumPy backend"
    print(f"pycudnnrnn check: {args.direction} {args.layers}-layer {args.mode}, input "
          f"{args.input_size}, units {args.hidden_size}"
          + (f", projection {args.num_proj}" if args.num_proj else "")
          + f", T={max_time}, lengths {list(args.lengths)}, {args.dtype}, "
          f"{'time' if cfg.time_major else 'batch'}-major")
    print(f"backend: {'cuDNN (GPU)' if device == 'gpu' else 'NumPy (CPU)'}; checked against {how}")
    print(f"{'check':44s} {'error':>10s} {'tolerance':>10s}  result")
    for row in rows:
        error = "" if row.error is None else f"{row.error:.2e}"
        tol = "" if row.tolerance is None else f"{row.tolerance:.0e}"
        print(f"{row.name:44s} {error:>10s} {tol:>10s}  {'ok' if row.ok else 'FAIL'}")
    failed = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _bench(args, parser):
    from . import bench
    devices = _devices(args.backend, parser, allow_all=True)
    cases = [bench.Case(rnn_mode=args.mode, num_layers=args.layers,
                        bidirectional=args.direction == "bidirectional", max_time=T,
                        batch_size=args.batch, input_size=args.input_size,
                        hidden_size=args.hidden_size, dtype=args.dtype, ragged=args.ragged)
             for T in args.seq_lengths]
    progress = {"auto": None, "always": True, "never": False}[args.progress]
    results = bench.run(cases, devices, repeat=args.repeat, warmup=args.warmup,
                        with_torch=not args.no_torch, progress=progress)
    print(bench.format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results}, f, indent=2)
    if args.plot:
        bench.plot(results, args.plot)
    return 0


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command = {"info": _info, "check": _check, "bench": _bench}[args.command]
    return command(args, _subparser(parser, args.command))


def _subparser(parser, name):
    """The sub-command's parser, so usage errors show that command's usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    return parser


if __name__ == "__main__":
    sys.exit(main())
