"""Training step of pycudnnrnn.torch.LSTM, eager and compiled, beside torch.nn.LSTM's.

    python benchmarks/torch_bench.py [--device cpu|cuda] [--repeat N] [--small]
                                     [--backend inductor|aot_eager]

One step = forward, a loss, backward (input and weight gradients) and SGD; the same
weights in all three. Prints medians in ms (the three take turns) and the ratios to nn.LSTM; asserts nothing.
On a GPU the times are synchronised (torch.cuda.synchronize) around each step.
"""

import argparse
import os
import platform
import statistics
import time

import torch

import pycudnnrnn
import pycudnnrnn.torch as prt

# The GPU case: 2-layer bidirectional LSTM, T=128, B=64, 512 units, float32.
FULL = dict(T=128, B=64, I=512, H=512, L=2)
SMALL = dict(T=32, B=16, I=128, H=128, L=2)


def _step(model, x, target, optimizer):
    optimizer.zero_grad(set_to_none=True)
    output = model(x)[0]
    loss = (output - target).square().mean()
    loss.backward()
    optimizer.step()
    return loss


def _time(steps, device, repeat, warmup):
    """Median ms of each step; the steps take turns, so load on the machine hits all alike."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for step in steps:
        for _ in range(warmup):
            step()
    sync()
    times = [[] for _ in steps]
    for _ in range(repeat):
        for step, samples in zip(steps, times):
            start = time.perf_counter()
            step()
            sync()
            samples.append(time.perf_counter() - start)
    return [1e3 * statistics.median(samples) for samples in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--small", action="store_true", help=f"{SMALL} instead of {FULL}")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    args = parser.parse_args()
    size = SMALL if args.small else FULL
    device = args.device
    torch.manual_seed(0)
    reference = torch.nn.LSTM(size["I"], size["H"], size["L"], bidirectional=True,
                              device=device)
    ours = prt.LSTM.from_torch(reference)
    x = torch.randn(size["T"], size["B"], size["I"], device=device)
    target = torch.randn(size["T"], size["B"], 2 * size["H"], device=device)
    compiled = torch.compile(ours, backend=args.backend, fullgraph=True)

    def stepper(model, parameters):
        optimizer = torch.optim.SGD(parameters, lr=1e-3)
        return lambda: _step(model, x, target, optimizer)

    started = time.perf_counter()
    # Inductor's disk caches do not key on a custom op's fake: compile afresh, so that a
    # graph cached with another version of this library is not reused.
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    with inductor_config.patch(fx_graph_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):
        stepper(compiled, ours.parameters())()  # the first call compiles
    compile_s = time.perf_counter() - started
    names = ["torch.nn.LSTM", "pycudnnrnn.torch.LSTM (eager)",
             f"pycudnnrnn.torch.LSTM (compiled, {args.backend})"]
    steps = [stepper(reference, reference.parameters()), stepper(ours, ours.parameters()),
             stepper(compiled, ours.parameters())]
    rows = list(zip(names, _time(steps, device, args.repeat, 2)))

    where = torch.cuda.get_device_name() if device == "cuda" else \
        f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads"
    print(f"pycudnnrnn {pycudnnrnn.__version__}, torch {torch.__version__}, python "
          f"{platform.python_version()}, {device}: {where}")
    print(f"training step, 2-layer bidirectional LSTM float32, T={size['T']} B={size['B']} "
          f"I={size['I']} H={size['H']}; median of {args.repeat}; compile took {compile_s:.1f} s")
    base = rows[0][1]
    width = max(len(name) for name, _ in rows)
    for name, ms in rows:
        print(f"  {name:<{width}}  {ms:9.2f} ms  {ms / base:5.2f}x nn.LSTM")


if __name__ == "__main__":
    main()
