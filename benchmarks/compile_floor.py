"""The floor under ``peers.py``'s ``torch-compile`` rows, on the CPU.

What ``torch.compile`` adds to a training step through one custom op pair, before the op
computes anything.

    python benchmarks/compile_floor.py [--rounds 5] [--seconds 1]

Dynamo does not compile ``torch.nn``'s RNNs (``torch._dynamo.config.allow_rnn`` is False:
it breaks the graph there and runs them eagerly), so the peer of a ``torch-compile`` row
is nn's eager layer, while ours is one graph: the forward op and, in its backward, the
backprop op. Here the RNN of a small step (T32 B16 I32 H64, an LSTM's weights; forward,
loss, gradient, SGD update) is replaced by an op pair that only doubles its input:

* ``compiled``: two ``torch.library.custom_op`` s, forward with an autograd formula
  calling backprop (whose flat weight gradient is split into views, as ours is), under
  ``torch.compile(fullgraph=True)``;
* ``eager``: the same arithmetic as a ``torch.autograd.Function``, not compiled.

Each runs in a process of its own, the two alternating. Their difference is what the
compiled graph and the op boundary cost per step; the rest of a ``torch-compile`` row's
gap is what our kernels add to PyTorch's. Prints; asserts nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import peers

SIZE = peers.SIZES["small"]
KINDS = ("compiled", "eager")


def _ops():
    """The do-nothing op pair: forward (x·2 and a reserve space) and backprop (g·2 and a
    flat weight gradient of zeros), the forward differentiable through backprop."""
    import torch
    from torch import Tensor

    @torch.library.custom_op("pycudnnrnn_floor::forward", mutates_args=())
    def forward(x: Tensor, weights: list[Tensor]) -> tuple[Tensor, Tensor]:
        return x * 2, torch.zeros(32, dtype=torch.uint8)

    @forward.register_fake
    def _(x, weights):
        return x.new_empty(x.shape), x.new_empty((32,), dtype=torch.uint8)

    @torch.library.custom_op("pycudnnrnn_floor::backprop", mutates_args=())
    def backprop(grad: Tensor, weights: list[Tensor], reserve: Tensor) -> tuple[Tensor, Tensor]:
        return grad * 2, weights[0].new_zeros(sum(w.numel() for w in weights))

    @backprop.register_fake
    def _(grad, weights, reserve):
        return grad.new_empty(grad.shape), grad.new_empty((sum(w.numel() for w in weights),))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[1], output[1])

    def backward(ctx, grad, _):
        *weights, reserve = ctx.saved_tensors
        dx, flat = backprop(grad, weights, reserve)
        return dx, _views(flat, weights)

    forward.register_autograd(backward, setup_context=setup_context)
    return forward


def _views(flat, weights):
    """`flat` split into views shaped as `weights`."""
    views, offset = [], 0
    for w in weights:
        views.append(flat[offset:offset + w.numel()].view(w.shape))
        offset += w.numel()
    return views


def _eager_function():
    import torch

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *weights):
            ctx.save_for_backward(*weights, torch.zeros(32, dtype=torch.uint8))
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            *weights, _ = ctx.saved_tensors
            flat = weights[0].new_zeros(sum(w.numel() for w in weights))
            return (grad * 2, *_views(flat, weights))

    return lambda x, weights: Double.apply(x, *weights)


def worker(kind, seconds):
    """The median step time (ms) of `kind` in this process; printed as JSON."""
    import torch
    torch.manual_seed(0)
    T, B, I, H = (SIZE[k] for k in "TBIH")
    weights = list(torch.nn.LSTM(I, H, batch_first=True).parameters())
    x = torch.randn(B, T, I)
    if kind == "compiled":
        forward = _ops()
        run = torch.compile(lambda x: forward(x, weights)[0], fullgraph=True)
    else:
        run = (lambda double: lambda x: double(x, weights))(_eager_function())
    optimizer = torch.optim.SGD(weights, lr=0.01)

    def step():
        optimizer.zero_grad(set_to_none=True)
        run(x).square().mean().backward()
        optimizer.step()
    print(json.dumps(peers._timed(step, seconds)))


def measure(rounds, seconds):
    """``{kind: [ms per round]}``, each kind's process in turn, the order alternating."""
    times = {kind: [] for kind in KINDS}
    for round_ in range(rounds):
        for kind in (KINDS if round_ % 2 == 0 else KINDS[::-1]):
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", kind,
                                   str(seconds)], capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"{kind}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
            times[kind].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="time per process (back-to-back steps)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], float(args.worker[1]))
        return
    times = measure(args.rounds, args.seconds)
    medians = {kind: statistics.median(t) for kind, t in times.items()}
    for kind, t in times.items():
        print(f"{kind:<9} {medians[kind]:7.3f} ms  (rounds: "
              f"{', '.join(f'{v:.3f}' for v in t)}; spread {max(t) / min(t):.2f}x)")
    print(f"the compiled graph and the op boundary: "
          f"{medians['compiled'] - medians['eager']:+.3f} ms a step")


if __name__ == "__main__":
    main()
