"""A WGAN-GP critic step through an LSTM: pycudnnrnn's drop-in beside torch.nn's.

    python benchmarks/second_order_bench.py [--device cuda|cpu] [--rounds N] [--repeat N]
                                            [--small] [--json PATH]

The critic: a 2-layer LSTM over a sequence, then a linear score of its last output. One
step is WGAN-GP's: scores of real and fake batches, the gradient of the critic at points
between them (``create_graph=True``), the penalty ``λ (‖∇‖ - 1)²``, then backward through
all of it (a second derivative) and an optimizer step. Rows, each side beside its peer:

* ``penalty step``: the drop-in (cuDNN's forward and first order; the second order
  recomputed on PyTorch's kernels) against ``torch.nn.LSTM`` under
  ``torch.backends.cudnn.flags(enabled=False)``, the only way PyTorch differentiates its
  RNNs twice on a GPU;
* ``penalty + dropout``: the penalty step with dropout between the layers: the drop-in
  under ``pycudnnrnn.torch.second_order_dropout()`` (a cuDNN call per layer, PyTorch's
  masks between) against ``torch.nn.LSTM`` with cuDNN off and the same dropout;
* ``first-order step``: the same critic trained without the penalty, the drop-in
  against ``torch.nn.LSTM`` with cuDNN: what the second order must not cost.

Each side runs in a process of its own (one library's idle threads and caches would slow
the other's), the sides taking turns over ``--rounds`` rounds; the median of each side's
per-round medians is printed. On the CPU, the drop-in's side runs the op on its NumPy
kernels (the route whose first order a GPU's cuDNN gives, ``set_cpu_kernels("numpy")``):
a check that the script runs, not a measure of a GPU. Asserts nothing.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

SIZES = dict(T=64, B=64, features=32, hidden=256, layers=2)
SMALL = dict(T=12, B=8, features=4, hidden=16, layers=2)
SIDES = {  # name: (row, library, cuDNN on for torch.nn, penalty, dropout between layers)
    "ours-penalty": ("penalty step", "pycudnnrnn", True, True, 0.0),
    "torch-penalty": ("penalty step", "torch.nn (cuDNN off)", False, True, 0.0),
    "ours-dropout": ("penalty + dropout", "pycudnnrnn", True, True, 0.2),
    "torch-dropout": ("penalty + dropout", "torch.nn (cuDNN off)", False, True, 0.2),
    "ours-first": ("first-order step", "pycudnnrnn", True, False, 0.0),
    "torch-first": ("first-order step", "torch.nn (cuDNN)", True, False, 0.0),
}
PENALTY_WEIGHT = 10.0


def _critic(torch, size, ours, device, dropout):
    import pycudnnrnn.torch as prt
    torch.manual_seed(0)
    cls = prt.LSTM if ours else torch.nn.LSTM
    rnn = cls(size["features"], size["hidden"], size["layers"], dropout=dropout, device=device)
    head = torch.nn.Linear(size["hidden"], 1, device=device)
    return rnn, head


def _step(torch, size, side, device):
    """One training step of the critic for `side`, as a function of nothing."""
    import contextlib

    import pycudnnrnn.torch as prt
    _, library, cudnn, penalty, dropout = SIDES[side]
    ours = library == "pycudnnrnn"
    rnn, head = _critic(torch, size, ours, device, dropout)
    # The drop-in's masks must be PyTorch's where they are differentiated twice
    masks = prt.second_order_dropout if ours and dropout else contextlib.nullcontext
    params = list(rnn.parameters()) + list(head.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-4)
    g = torch.Generator().manual_seed(1)
    shape = (size["T"], size["B"], size["features"])
    real, fake = (torch.randn(shape, generator=g).to(device) for _ in range(2))
    alpha = torch.rand((1, size["B"], 1), generator=g).to(device)
    score = lambda x: head(rnn(x)[0][-1]).squeeze(-1)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.backends.cudnn.flags(enabled=cudnn):
            loss = score(fake).mean() - score(real).mean()
            if penalty:
                between = (alpha * real + (1 - alpha) * fake).requires_grad_()
                with masks():  # only the forward differentiated twice (docs/pytorch.md)
                    scores = score(between)
                (grad,) = torch.autograd.grad(scores.sum(), between, create_graph=True)
                norms = grad.square().sum((0, 2)).sqrt()
                loss = loss + PENALTY_WEIGHT * ((norms - 1) ** 2).mean()
            loss.backward()
        optimizer.step()
    return step


def time_side(side, size, device, repeat, warmup=3):
    """Median and minimum ms of `side`'s step, in this process."""
    import torch
    if device == "cpu" and side.startswith("ours"):
        from pycudnnrnn.torch import torch_kernels as native
        native.set_cpu_kernels("numpy")
    step = _step(torch, size, side, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        sync()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times), min(times)


def _environment(device):
    import torch

    import pycudnnrnn
    where = torch.cuda.get_device_name() if device == "cuda" else \
        f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads"
    return (f"pycudnnrnn {pycudnnrnn.__version__}, torch {torch.__version__}, python "
            f"{platform.python_version()}, {device}: {where}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda where PyTorch has it, else cpu")
    parser.add_argument("--rounds", type=int, default=3, help="processes per side")
    parser.add_argument("--repeat", type=int, default=10, help="timed steps per process")
    parser.add_argument("--small", action="store_true", help=f"{SMALL} instead of {SIZES}")
    parser.add_argument("--json", help="write the figures there too")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one side, here
    args = parser.parse_args()
    size = SMALL if args.small else SIZES
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.side:
        print(json.dumps(time_side(args.side, size, args.device, args.repeat)))
        return

    print(_environment(args.device), flush=True)
    print(f"WGAN-GP critic: {size['layers']}-layer LSTM {size['features']}→{size['hidden']}, "
          f"T={size['T']} B={size['B']}, λ={PENALTY_WEIGHT}; {args.rounds} processes per "
          f"side, {args.repeat} steps each", flush=True)
    found = {side: [] for side in SIDES}
    for round_ in range(args.rounds):
        order = list(SIDES) if round_ % 2 == 0 else list(reversed(SIDES))
        for side in order:  # each in a fresh process, taking turns
            command = [sys.executable, __file__, "--side", side, "--device", args.device,
                       "--repeat", str(args.repeat)] + (["--small"] if args.small else [])
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            found[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
            row = SIDES[side][0]
            pair = [s for s in SIDES if SIDES[s][0] == row]
            if len({len(found[s]) for s in pair}) == 1:  # a row's sides ran alike: show it
                _print_rows({s: found[s] for s in pair})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": size, "device": args.device, "times_ms": found}, f, indent=1)


def _print_rows(found):
    """One line per row: each side's median of medians (ms) and ours as a multiple."""
    rows = {}
    for side, runs in found.items():
        if runs:
            rows.setdefault(SIDES[side][0], []).append(
                (SIDES[side][1], statistics.median(m for m, _ in runs), len(runs)))
    for row, sides in rows.items():
        text = "  ".join(f"{library} {ms:8.2f} ms" for library, ms, _ in sides)
        if len(sides) == 2:
            text += f"   pycudnnrnn / peer {sides[0][1] / sides[1][1]:.2f}×"
        print(f"{row:17} {text}  (rounds: {sides[0][2]})", flush=True)


if __name__ == "__main__":
    main()
