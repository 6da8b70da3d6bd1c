"""A char-level model's training step with pycudnnrnn.torch.LSTM beside torch.nn.LSTM.

    python benchmarks/torch_bench.py [--device cpu|cuda] [--repeat N] [--small]
                                     [--backend inductor|aot_eager]

The model: embedding → 2-layer LSTM (128 hidden) → linear over the vocabulary, trained
with cross-entropy and SGD; the same weights for all. Prints, in one process and taking
turns (so that load on the machine falls on all alike), the medians in ms of:

* the step with ``torch.nn.LSTM``, with the drop-in eager, and with the drop-in compiled
  (``fullgraph=True``), as multiples of nn.LSTM's;
* the RNN alone (forward and backward): the drop-in module against a bare
  ``pycudnnrnn.torch.rnn`` call on the same flat buffer, i.e. what the module adds.

Medians and minima (the minimum is the least disturbed by other load). Asserts nothing.
On a GPU the times are synchronised (torch.cuda.synchronize) per step.
"""

import argparse
import os
import platform
import statistics
import time

import torch

import pycudnnrnn
import pycudnnrnn.torch as prt

SIZES = dict(vocab=96, embed=128, hidden=128, layers=2, T=100, B=32)
SMALL = dict(SIZES, T=32, B=16)


class CharModel(torch.nn.Module):
    def __init__(self, rnn, vocab, embed, hidden):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, embed)
        self.rnn = rnn
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens):
        return self.head(self.rnn(self.embed(tokens))[0])


def _models(size, device):
    torch.manual_seed(0)
    reference = CharModel(torch.nn.LSTM(size["embed"], size["hidden"], size["layers"]),
                          size["vocab"], size["embed"], size["hidden"]).to(device)
    ours = CharModel(prt.LSTM(size["embed"], size["hidden"], size["layers"]),
                     size["vocab"], size["embed"], size["hidden"]).to(device)
    ours.load_state_dict(reference.state_dict())  # torch.nn's keys on both
    return reference, ours


def _stepper(model, forward, tokens, targets, vocab):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = forward(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        optimizer.step()
    return step


def _rnn_steppers(module, x):
    """Forward+backward of the RNN alone: the module, and a bare rnn() on its buffer."""
    flat = module.params.detach().clone().requires_grad_()
    L, H = module.num_layers, module.hidden_size
    zeros = torch.zeros(L, x.shape[1], H, device=x.device)

    def through_module():
        module.zero_grad(set_to_none=True)
        module(x)[0].sum().backward()

    def bare():
        flat.grad = None
        prt.rnn(x, zeros, zeros, flat)[0].sum().backward()
    return through_module, bare


def _time(steps, device, repeat, warmup=2):
    """(median, min) ms of each step; the steps take turns, starting each round with
    another one (so that none always runs right after another's allocations)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for step in steps:
        for _ in range(warmup):
            step()
    sync()
    times = [[] for _ in steps]
    for round_ in range(repeat):
        for k in range(len(steps)):
            k = (k + round_) % len(steps)
            start = time.perf_counter()
            steps[k]()
            sync()
            times[k].append(time.perf_counter() - start)
    return [(1e3 * statistics.median(t), 1e3 * min(t)) for t in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--small", action="store_true", help=f"{SMALL} instead of {SIZES}")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    args = parser.parse_args()
    size, device = (SMALL if args.small else SIZES), args.device
    reference, ours = _models(size, device)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, size["vocab"], (size["T"], size["B"]), generator=g).to(device)
    targets = torch.randint(0, size["vocab"], (size["T"], size["B"]), generator=g).to(device)
    compiled = torch.compile(ours, backend=args.backend, fullgraph=True)
    step = lambda model, forward: _stepper(model, forward, tokens, targets, size["vocab"])

    started = time.perf_counter()
    # Inductor's disk caches do not key on a custom op's fake: compile afresh, so that a
    # graph cached with another version of this library is not reused.
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    with inductor_config.patch(fx_graph_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):
        step(ours, compiled)()  # the first call compiles
    compile_s = time.perf_counter() - started
    x = ours.embed(tokens).detach()
    module_step, bare_step = _rnn_steppers(ours.rnn, x)
    names = ["torch.nn.LSTM", "pycudnnrnn.torch.LSTM (eager)",
             f"pycudnnrnn.torch.LSTM (compiled, {args.backend})",
             "RNN alone: pycudnnrnn.torch.LSTM module", "RNN alone: bare pycudnnrnn.torch.rnn"]
    steps = [step(reference, reference), step(ours, ours), step(ours, compiled), module_step,
             bare_step]
    times = _time(steps, device, args.repeat)

    where = torch.cuda.get_device_name() if device == "cuda" else \
        f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads"
    print(f"pycudnnrnn {pycudnnrnn.__version__}, torch {torch.__version__}, python "
          f"{platform.python_version()}, {device}: {where}")
    print(f"char-level model training step: embedding {size['embed']} → {size['layers']}-layer "
          f"LSTM {size['hidden']} hidden → linear {size['vocab']}, T={size['T']} B={size['B']}, "
          f"float32; median of {args.repeat}; compile took {compile_s:.1f} s")
    width = max(len(name) for name in names)
    print(f"  {'':<{width}}  {'median':>9}     {'min':>9}")
    row = lambda name, t, base, what: print(
        f"  {name:<{width}}  {t[0]:9.2f} ms  {t[1]:9.2f} ms  {t[0] / base[0]:5.3f}x "
        f"(min {t[1] / base[1]:5.3f}x) {what}")
    for name, t in zip(names[:3], times[:3]):
        row(name, t, times[0], "nn.LSTM")
    print("the module's own overhead (forward + backward of the RNN, same flat buffer):")
    for name, t in zip(names[3:], times[3:]):
        row(name, t, times[4], "the bare call")
    print(f"  the module adds {100 * (times[3][0] / times[4][0] - 1):+.1f} % (median), "
          f"{100 * (times[3][1] / times[4][1] - 1):+.1f} % (min)")


if __name__ == "__main__":
    main()
