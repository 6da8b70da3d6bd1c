"""The ``pycudnnrnn`` command: ``info``, ``check`` and ``bench``.

Exit status: 0 success; 1 a check that failed; 2 a usage error (a bad option, a
configuration the library refuses, sizes too large for memory, an output folder that does
not exist), said in one line with no traceback and before any work, or an output file
that could not be written (said in one line, after the run); 3 an unexpected error (a
bug: the traceback is printed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import traceback

from ..core import dtypes
from ..core.config import DIRECTIONS, GATES, INPUT_MODES, RNN_MODES
from ..core.extras import install
from .bench import SIDES

DTYPES = dtypes.NAMES
#: ``check`` verifies by finite differences, whose work grows with the problem: it refuses
#: problems whose working set is larger than this (``bench`` times large problems).
CHECK_LIMIT_BYTES = 1 << 30
EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_INTERNAL = 1, 2, 3


def _integer(text, minimum, what):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def _positive(text):
    return _integer(text, 1, "a positive integer")


def _non_negative(text):
    return _integer(text, 0, "a non-negative integer")


def _int_list(minimum):
    """Type of a comma-separated list of integers >= `minimum`."""
    what = "positive" if minimum == 1 else "non-negative"

    def parse(text):
        try:
            values = [int(v) for v in text.split(",") if v.strip() != ""]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one integer")
        if min(values) < minimum:
            raise argparse.ArgumentTypeError(f"expected {what} integers, got {text}")
        return values

    return parse


def _sides(text):
    """Type of --sides: a comma-separated list of SIDES, each once."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in SIDES]
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(SIDES)}, "
                                         f"got {text!r}")
    return list(dict.fromkeys(values))


def _add_network_options(p, *, layers, input_size, hidden_size):
    p.add_argument("--mode", choices=RNN_MODES, default="lstm", help="cell (default: lstm)")
    p.add_argument("--direction", choices=DIRECTIONS, default="unidirectional",
                   help="default: unidirectional (the library's)")
    p.add_argument("--layers", type=_positive, default=layers, help=f"default: {layers}")
    p.add_argument("--input-size", type=_positive, default=input_size, help=f"default: {input_size}")
    p.add_argument("--hidden-size", type=_positive, default=hidden_size,
                   help=f"num_units (default: {hidden_size})")


def _parser():
    parser = argparse.ArgumentParser(
        prog="pycudnnrnn", description="cuDNN's RNNs (TensorFlow's CudnnRNNV3 op pair) with a "
                                       "NumPy twin: environment, self-check, benchmark.")
    from .. import __version__
    parser.add_argument("--version", action="version", version=f"pycudnnrnn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{info,check,bench}", required=True)

    sub.add_parser("info", help="versions, cuDNN, GPUs and backends (paste into bug reports)",
                   description="Print the package, Python, NumPy (and its BLAS), CuPy, "
                               "PyTorch, JAX, Flax, Optax, Orbax and Keras versions (and "
                               "Keras's backend), CPUs and thread settings, the "
                               "NVIDIA driver and CUDA versions, the cuDNN library and "
                               "version (or why it does not load), the GPUs seen and which "
                               "backend runs which arrays.")

    check = sub.add_parser("check", help="run forward + backprop once and verify the gradients",
                           description="Run forward and backprop once and verify them: against "
                                       "central finite differences on the CPU, against the "
                                       "NumPy backend on a GPU. Exits 1 on a mismatch.")
    _add_network_options(check, layers=2, input_size=5, hidden_size=6)
    check.add_argument("--input-mode", choices=INPUT_MODES, default="linear_input",
                       help="default: linear_input")
    check.add_argument("--num-proj", type=_non_negative, default=0, help="LSTM projection (default: 0)")
    check.add_argument("--lengths", type=_int_list(0), default=[7, 3, 0, 5],
                       help="sequence lengths, comma-separated; the batch size is their count "
                            "(default: 7,3,0,5)")
    check.add_argument("--max-time", type=_positive, default=None,
                       help="T (default: the longest length, at least 1)")
    check.add_argument("--batch-major", action="store_true", help="time_major=False")
    check.add_argument("--dtype", choices=DTYPES, default="float64", help="default: float64")
    check.add_argument("--backend", choices=("auto", "cpu", "gpu"), default="auto",
                       help="auto: the GPU when one is usable (default)")
    check.add_argument("--seed", type=_non_negative, default=0, help="for the random problem")

    bench = sub.add_parser(
        "bench", help="time forward and forward+backward, ours and PyTorch's",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Time forward and forward+backward over sequence lengths, after warm-up: the\n"
            "median of the timed runs with their minimum and maximum. Prints a line on\n"
            "stderr as each is measured, then a table.\n\n"
            "What is timed (--sides, comma-separated):\n"
            "  op       pycudnnrnn.forward and backprop: the NumPy backend on the CPU,\n"
            "           cuDNN on a GPU\n"
            "  drop-in  pycudnnrnn.torch.LSTM (or GRU, RNN), the drop-in for torch.nn's\n"
            "  torch    torch.nn.LSTM (or GRU, RNN)\n"
            "The default is op,torch (op alone without PyTorch). To compare the drop-in\n"
            "with nn.LSTM: --sides drop-in,torch.\n\n"
            "The default run takes 5-10 s on 2 idle CPU cores."))
    _add_network_options(bench, layers=2, input_size=128, hidden_size=128)
    bench.add_argument("--batch", type=_positive, default=16, help="default: 16")
    bench.add_argument("--seq-lengths", type=_int_list(1), default=[16, 32, 64],
                       help="T values, comma-separated (default: 16,32,64)")
    bench.add_argument("--ragged", action="store_true", help="lengths drawn from [T/2, T]")
    bench.add_argument("--dtype", choices=DTYPES, default="float32", help="default: float32")
    bench.add_argument("--backend", choices=("auto", "cpu", "gpu", "all"), default="auto",
                       help="auto: the GPU when usable, else the CPU; all: every usable one")
    bench.add_argument("--sides", type=_sides, default=None, metavar="LIST",
                       help=f"what to time, comma-separated, of {', '.join(SIDES)} "
                            "(default: op,torch; see above)")
    bench.add_argument("--no-torch", action="store_true", help="time the op alone (--sides op)")
    bench.add_argument("--repeat", type=_positive, default=2,
                       help="timed runs per round (default: 2)")
    bench.add_argument("--rounds", type=_positive, default=2,
                       help="rounds of the sides taking turns, each side in a process of its "
                            "own (default: 2)")
    bench.add_argument("--warmup", type=_non_negative, default=1, help="untimed runs first (default: 1)")
    bench.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    bench.add_argument("--plot", metavar="PATH", help="also plot time against T (PNG)")
    bench.add_argument("--progress", choices=("always", "never"), default="always",
                       help="a line on stderr per measurement (default: always)")
    return parser


# --------------------------------------------------------------------------- up-front checks

def _params_count(args, input_mode):
    """Elements of params (a closed formula: a huge --layers costs nothing to size).
    Raises the library's ValueError for a configuration it refuses."""
    from .. import api
    return api.params_size(rnn_mode=args.mode, num_layers=args.layers,
                           num_units=args.hidden_size, input_size=args.input_size,
                           input_mode=input_mode, direction=args.direction,
                           num_proj=getattr(args, "num_proj", 0))


def estimated_bytes(args, *, max_time, batch, itemsize, params_copies, input_mode="linear_input"):
    """A generous estimate of the memory one forward + backprop holds at once.

    params and its gradient (and `params_copies` more: finite differences), input and
    output with their gradients, the states, and what forward keeps for backprop (every
    step's gates and states), twice over for backprop's own buffers.
    """
    D = 2 if args.direction == "bidirectional" else 1
    H = args.hidden_size
    P = getattr(args, "num_proj", 0) or H
    G = len(GATES[args.mode])
    params = _params_count(args, input_mode)
    io = max_time * batch * (args.input_size + D * P)
    states = args.layers * D * batch * (H + P)
    kept = max_time * batch * args.layers * D * ((G + 2) * H + P)
    arrays = itemsize * ((2 + params_copies) * params + 3 * io + 4 * states + 2 * kept)
    return max(arrays, _library_bytes(args, max_time, batch, itemsize, input_mode))


def _library_bytes(args, max_time, batch, itemsize, input_mode):
    """What the NumPy backend's own estimates ask of a plan, a forward and a backprop
    (Python objects per layer included): a run this lets through is not refused later."""
    from ..core import checks
    from ..cpu import rnn as cpu_rnn
    problem = checks.make_problem(
        max_time=max_time, batch_size=batch, sequence_lengths=None,
        dtype={2: "float16", 4: "float32", 8: "float64"}[itemsize], time_major=True,
        is_training=True, rnn_mode=args.mode, num_layers=args.layers,
        num_units=args.hidden_size, input_size=args.input_size, input_mode=input_mode,
        direction=args.direction, num_proj=getattr(args, "num_proj", 0), dropout=0.0,
        seed=0, seed2=0)
    return cpu_rnn.plan_nbytes(problem) + cpu_rnn.forward_nbytes(problem) + \
        cpu_rnn.backprop_nbytes(problem)


def _available_bytes(device):
    """Memory free for the run on `device`, or None when it cannot be told."""
    if device == "gpu":
        from ..core.gpu import cupy
        return cupy().cuda.runtime.memGetInfo()[0]
    # The library's own figure (MemAvailable, lowered by a cgroup limit), so a run this
    # check lets through is not refused by the library once it has started.
    from ..core.memory import FALLBACK_BYTES, available_bytes
    available = available_bytes()[0]
    return None if available == FALLBACK_BYTES else available


def _human(nbytes):
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024


def _refuse_if_too_large(parser, args, needed, limit, what, size_options):
    """Usage error naming the size options given when `needed` bytes exceed `limit`."""
    if limit is None or needed <= limit:
        return
    given = [f"--{name.replace('_', '-')} {_shown(getattr(args, name))}" for name in size_options
             if getattr(args, name) != parser.get_default(name)] or \
            [f"--{name.replace('_', '-')} {_shown(getattr(args, name))}" for name in size_options]
    parser.error(f"{' '.join(given)}: too large, this run would need about {_human(needed)} "
                 f"({needed:,} bytes), more than the {_human(limit)} {what}")


def _shown(value):
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _writable_path(parser, option, path):
    """Usage error unless `path` can be written (checked before the run, not after it)."""
    if path is None:
        return
    if not path:
        parser.error(f"{option}: expected a file path, got ''")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"{option} {path}: is a folder, expected a file path")
    if not os.path.isdir(folder):
        parser.error(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        parser.error(f"{option} {path}: the folder {folder} is not writable")


def _library_refusal(parser, call):
    """Run `call`; a configuration the library refuses becomes a usage error."""
    try:
        return call()
    except (ValueError, TypeError) as exc:
        parser.error(str(exc).splitlines()[0])


def _devices(choice, parser, allow_all):
    from .environment import gpu_status
    usable, detail = gpu_status()
    if choice == "auto":
        return ["gpu" if usable else "cpu"]
    if choice in ("gpu", "all") and not usable:
        if choice == "all":
            return ["cpu"]
        parser.error(f"--backend gpu: {detail}")
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
    needed = _library_refusal(parser, lambda: estimated_bytes(
        args, max_time=max_time, batch=len(args.lengths), itemsize=8, params_copies=3,
        input_mode=args.input_mode))
    available = _available_bytes("cpu")  # finite differences or the NumPy reference: host
    limit = CHECK_LIMIT_BYTES if available is None else min(CHECK_LIMIT_BYTES, available)
    _refuse_if_too_large(parser, args, needed, limit,
                         "that check allows (finite differences grow with the size; bench times "
                         "large problems)" if limit == CHECK_LIMIT_BYTES else "of memory available",
                         ("layers", "input_size", "hidden_size", "num_proj", "lengths", "max_time"))
    cfg = selfcheck.CheckConfig(rnn_mode=args.mode, direction=args.direction,
                                input_mode=args.input_mode, num_layers=args.layers,
                                input_size=args.input_size, hidden_size=args.hidden_size,
                                num_proj=args.num_proj, max_time=max_time,
                                lengths=tuple(args.lengths), time_major=not args.batch_major,
                                dtype=args.dtype, backend=device, seed=args.seed)
    rows = _library_refusal(parser, lambda: selfcheck.run(cfg))
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
    return EXIT_CHECK_FAILED if failed else 0


def _bench(args, parser):
    from . import bench
    _writable_path(parser, "--json", args.json)
    _writable_path(parser, "--plot", args.plot)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot: needs matplotlib (pip install matplotlib)")
    has_torch = importlib.util.find_spec("torch") is not None
    if args.no_torch and args.sides:
        parser.error("--no-torch: not with --sides (leave drop-in and torch out of --sides)")
    sides = ["op"] if args.no_torch else args.sides or ["op"] + (["torch"] if has_torch else [])
    if not has_torch and set(sides) & {"drop-in", "torch"}:
        parser.error(f"--sides {','.join(sides)}: drop-in and torch need PyTorch, "
                     f"{install('torch')}")
    devices = _devices(args.backend, parser, allow_all=True)
    itemsize = dtypes.by_name(args.dtype).itemsize
    needed = _library_refusal(parser, lambda: estimated_bytes(
        args, max_time=max(args.seq_lengths), batch=args.batch, itemsize=itemsize,
        params_copies=0))
    for device in devices:
        _refuse_if_too_large(parser, args, needed, _available_bytes(device),
                             f"of memory available on the {device.upper()}",
                             ("layers", "input_size", "hidden_size", "batch", "seq_lengths"))
    cases = [bench.Case(rnn_mode=args.mode, num_layers=args.layers,
                        bidirectional=args.direction == "bidirectional", max_time=T,
                        batch_size=args.batch, input_size=args.input_size,
                        hidden_size=args.hidden_size, dtype=args.dtype, ragged=args.ragged)
             for T in args.seq_lengths]
    # The configuration was checked by the size estimate: an error now is not a usage error.
    results = bench.run(cases, devices, repeat=args.repeat, warmup=args.warmup, sides=sides,
                        rounds=args.rounds,
                        progress=args.progress == "always")
    print(bench.format_table(results))
    if args.json:
        from .environment import collect
        text = json.dumps({"environment": collect(), "results": results}, indent=2)
        _write_output(parser, "--json", args.json, lambda: _write_text(args.json, text))
    if args.plot:
        _write_output(parser, "--plot", args.plot, lambda: bench.plot(results, args.plot))
    return 0


def _write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def _write_output(parser, option, path, write):
    """Write an output file; a failure (a full disk, /dev/full) is said in one line."""
    try:
        write()
    except OSError as exc:
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {option} {path}: could not write it: "
                                f"{exc.strerror or exc}\n")


#: Options whose value is a list of integers: a value that starts with "-" (``-1,2``)
#: would otherwise be read by argparse as another option ("expected one argument").
_LIST_OPTIONS = ("--lengths", "--seq-lengths")


def _join_negative_lists(argv):
    joined, tokens = [], iter(argv)
    for token in tokens:
        if token in _LIST_OPTIONS:
            value = next(tokens, None)
            if value is not None and re.fullmatch(r"-[\d,\s-]*", value):
                joined.append(f"{token}={value}")
                continue
            joined += [token] + ([] if value is None else [value])
            continue
        joined.append(token)
    return joined


def main(argv=None) -> int:
    parser = _parser()
    argv = _join_negative_lists(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    sub = _subparser(parser, args.command)
    if unknown:  # said with the usage of the command they were given to
        before = argv.index(args.command) > argv.index(unknown[0])
        (parser if before else sub).error(f"unrecognized arguments: {' '.join(unknown)}")
    command = {"info": _info, "check": _check, "bench": _bench}[args.command]
    try:
        return command(args, sub)
    except MemoryError as exc:  # an allocation the up-front estimate let through
        sub.error(f"not enough memory for these sizes: {str(exc) or 'an allocation failed'}")
    except KeyboardInterrupt:
        print("pycudnnrnn: interrupted", file=sys.stderr)
        return 130
    except Exception:  # a bug: show everything, with a status of its own
        traceback.print_exc()
        print(f"pycudnnrnn {args.command}: unexpected error (a bug; please report it with the "
              "output of `pycudnnrnn info`)", file=sys.stderr)
        return EXIT_INTERNAL


def _subparser(parser, name):
    """The sub-command's parser, so usage errors show that command's usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    return parser


if __name__ == "__main__":
    sys.exit(main())
