"""CPU benchmark: forward and forward+backprop of the NumPy backend (and PyTorch's CPU
RNNs on the same problems, when torch is importable). Prints figures; asserts nothing.

    python benchmarks/cpu_bench.py [--repeat N] [--threads N]
"""

import argparse
import os
import platform
import time

import numpy as np

import pycudnnrnn

CONFIGS = [
    # name, mode, layers, bidirectional, T, B, input, hidden, ragged
    ("lstm 2L bidir T64 B32 256", "lstm", 2, True, 64, 32, 256, 256, False),
    ("lstm 2L bidir T64 B32 256 ragged", "lstm", 2, True, 64, 32, 256, 256, True),
    ("gru 2L bidir T64 B32 256", "gru", 2, True, 64, 32, 256, 256, False),
    ("lstm 1L uni T128 B16 128", "lstm", 1, False, 128, 16, 128, 128, False),
    ("rnn_tanh 1L uni T256 B8 64", "rnn_tanh", 1, False, 256, 8, 64, 64, False),
]


def _median_ms(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def bench_numpy(mode, layers, bidir, T, B, I, H, ragged, repeat):
    rng = np.random.default_rng(0)
    D = 2 if bidir else 1
    attrs = dict(rnn_mode=mode, direction="bidirectional" if bidir else "unidirectional")
    n = pycudnnrnn.params_size(num_layers=layers, num_units=H, input_size=I, **attrs)
    f32 = lambda *shape: rng.uniform(-0.1, 0.1, shape).astype(np.float32)
    x, h, c, p = f32(T, B, I), f32(layers * D, B, H), f32(layers * D, B, H), f32(n)
    lengths = rng.integers(T // 2, T + 1, B) if ragged else None
    if mode != "lstm":
        c = None
    fwd = lambda: pycudnnrnn.forward(x, h, c, p, lengths, **attrs)
    out = fwd()
    grads = [np.ones_like(a) for a in out[:3]]

    def fwd_bwd():
        y, hy, cy, reserve = fwd()
        pycudnnrnn.backprop(x, h, c, p, lengths, y, hy, cy, *grads, reserve, **attrs)

    return _median_ms(fwd, repeat), _median_ms(fwd_bwd, repeat)


def bench_torch(torch, mode, layers, bidir, T, B, I, H, ragged, repeat):
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(mode)
    kwargs = {} if cls else {"nonlinearity": mode.split("_")[1]}
    cls = cls or torch.nn.RNN
    net = cls(I, H, num_layers=layers, bidirectional=bidir, **kwargs)
    x = torch.rand(T, B, I) * 0.2 - 0.1
    if ragged:
        lengths = torch.from_numpy(np.random.default_rng(0).integers(T // 2, T + 1, B))
        x_in = lambda: torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    else:
        x_in = lambda: x

    def fwd():
        with torch.no_grad():
            net(x_in())

    def fwd_bwd():
        out = net(x_in())
        y = out[0].data if ragged else out[0]
        net.zero_grad()
        y.sum().backward()

    x.requires_grad_(True)
    return _median_ms(fwd, repeat), _median_ms(fwd_bwd, repeat)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    try:
        import torch
        if args.threads:
            torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    print(f"pycudnnrnn {pycudnnrnn.__version__}, numpy {np.__version__}, "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs"
          + (f", torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else ""))
    header = f"{'configuration (float32)':36s} {'numpy fwd':>10s} {'fwd+bwd':>9s}"
    if torch:
        header += f" {'torch fwd':>10s} {'fwd+bwd':>9s}"
    print(header + "   (median ms)")
    # All NumPy runs first: torch's OpenMP threads keep spinning after each call and
    # would steal the cores from OpenBLAS if the two alternated.
    ours = {name: bench_numpy(*cfg, args.repeat) for name, *cfg in CONFIGS}
    for name, *cfg in CONFIGS:
        line = "{:36s} {:10.2f} {:9.2f}".format(name, *ours[name])
        if torch:
            line += " {:10.2f} {:9.2f}".format(*bench_torch(torch, *cfg, args.repeat))
        print(line, flush=True)


if __name__ == "__main__":
    main()
