"""GPU benchmark: forward and backprop through cuDNN, host overhead per call, and the same
through PyTorch's ``nn.LSTM`` / ``nn.GRU`` (cuDNN too) when torch is installed.

    PYTHONPATH=. python3 benchmarks/gpu_bench.py [--json PATH] [--repeat N]

Prints a table; asserts nothing. GPU times come from CUDA events, medians of `repeat`.
"""

import argparse
import json
import time

import numpy as np

import pycudnnrnn

CONFIGS = [
    # name, mode, layers, bidirectional, T, B, input, hidden, dtype
    ("lstm 2L bidir T64 B32 256 f32", "lstm", 2, True, 64, 32, 256, 256, "float32"),
    ("lstm 2L bidir T256 B64 512 f32", "lstm", 2, True, 256, 64, 512, 512, "float32"),
    ("lstm 2L bidir T256 B64 512 f16", "lstm", 2, True, 256, 64, 512, 512, "float16"),
    ("gru 2L bidir T256 B64 512 f32", "gru", 2, True, 256, 64, 512, 512, "float32"),
]


def _gpu_median_ms(cupy, fn, repeat):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def _host_us(cupy, fn, calls=300):
    for _ in range(10):
        fn()
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    cupy.cuda.Device().synchronize()
    return 1e6 * (time.perf_counter() - start) / calls


def _ours(cupy, mode, layers, bidir, T, B, I, H, dtype):
    rng = cupy.random.default_rng(0)
    D = 2 if bidir else 1
    attrs = dict(rnn_mode=mode, direction="bidirectional" if bidir else "unidirectional")
    n = pycudnnrnn.params_size(num_layers=layers, num_units=H, input_size=I, **attrs)
    f = lambda *s: (rng.random(s, dtype=cupy.float32) * 0.2 - 0.1).astype(dtype)
    x, h, c, p = f(T, B, I), f(layers * D, B, H), f(layers * D, B, H), f(n)
    c = c if mode == "lstm" else None
    out = pycudnnrnn.forward(x, h, c, p, **attrs)
    grads = [cupy.ones_like(a) for a in out[:3]]
    fwd = lambda: pycudnnrnn.forward(x, h, c, p, **attrs)
    bwd = lambda: pycudnnrnn.backprop(x, h, c, p, None, *out[:3], *grads, out[3], **attrs)
    return fwd, bwd


def _torch(torch, mode, layers, bidir, T, B, I, H, dtype):
    cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
    net = cls(I, H, num_layers=layers, bidirectional=bidir).cuda().to(getattr(torch, dtype))
    x = (torch.rand(T, B, I, device="cuda", dtype=getattr(torch, dtype)) * 0.2 - 0.1).requires_grad_()
    fwd = lambda: net(x)
    out = net(x)[0]
    grad = torch.ones_like(out)

    def bwd():
        y = net(x)[0]
        y.backward(grad)

    return fwd, bwd


def run(repeat=20):
    import cupy
    try:
        import torch
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    except ImportError:
        torch = None
    rows = []
    for name, *cfg in CONFIGS:
        fwd, bwd = _ours(cupy, *cfg)
        row = dict(config=name, fwd_ms=_gpu_median_ms(cupy, fwd, repeat),
                   bwd_ms=_gpu_median_ms(cupy, bwd, repeat))
        if torch is not None:
            tf, tb = _torch(torch, *cfg)
            row["torch_fwd_ms"] = _gpu_median_ms(cupy, tf, repeat)
            row["torch_fwd_bwd_ms"] = _gpu_median_ms(cupy, tb, repeat)
        rows.append(row)
    tiny = ("lstm", 1, False, 1, 1, 8, 8, "float32")
    fwd, bwd = _ours(cupy, *tiny)
    overhead = dict(config="tiny lstm T1 B1 H8 (host us/call)", fwd_us=_host_us(cupy, fwd),
                    bwd_us=_host_us(cupy, bwd))
    if torch is not None:
        tf, tb = _torch(torch, *tiny)
        with torch.no_grad():
            overhead["torch_fwd_us"] = _host_us(cupy, tf)
        overhead["torch_fwd_bwd_us"] = _host_us(cupy, tb)
    return dict(rows=rows, overhead=overhead, torch=None if torch is None else torch.__version__)


def format_table(result):
    lines = [f"{'configuration':34s} {'fwd ms':>8s} {'bwd ms':>8s} {'torch fwd':>10s} "
             f"{'torch f+b':>10s}"]
    for r in result["rows"]:
        lines.append(f"{r['config']:34s} {r['fwd_ms']:8.3f} {r['bwd_ms']:8.3f} "
                     f"{r.get('torch_fwd_ms', float('nan')):10.3f} "
                     f"{r.get('torch_fwd_bwd_ms', float('nan')):10.3f}")
    o = result["overhead"]
    lines.append(f"{o['config']:34s} {o['fwd_us']:8.1f} {o['bwd_us']:8.1f} "
                 f"{o.get('torch_fwd_us', float('nan')):10.1f} "
                 f"{o.get('torch_fwd_bwd_us', float('nan')):10.1f}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    result = run(args.repeat)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(format_table(result))


if __name__ == "__main__":
    main()
