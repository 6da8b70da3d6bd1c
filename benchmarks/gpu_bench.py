"""GPU benchmark: pycudnnrnn (plans, functional API, graphs) next to PyTorch's cuDNN RNNs.

    PYTHONPATH=. python3 benchmarks/gpu_bench.py [--json PATH] [--rounds N]

Every row times ours and PyTorch's in interleaved rounds (A, B, A, B, ...) in one process
and reports the median per call and the spread (quartiles) over rounds: host µs per call
for the small cases (wall clock, one sync per round), ms per call for the large ones, and
the peak extra device memory of one forward+backprop. Asserts nothing.
"""

import argparse
import json
import statistics
import time

import numpy as np

import pycudnnrnn
from pycudnnrnn.core import dtypes

# (name, rnn_mode, layers, bidirectional, T, B, input, hidden, dtype)
LARGE = [
    ("lstm 2L bi T128 B64 512 f32 (module step)", "lstm", 2, True, 128, 64, 512, 512, "float32"),
    ("lstm 2L bi T256 B64 512 f32", "lstm", 2, True, 256, 64, 512, 512, "float32"),
    ("gru 2L bi T256 B64 512 f32", "gru", 2, True, 256, 64, 512, 512, "float32"),
    ("lstm 2L bi T256 B64 512 f16", "lstm", 2, True, 256, 64, 512, 512, "float16"),
    ("lstm 4L uni T512 B128 1024 f16", "lstm", 4, False, 512, 128, 1024, 1024, "float16"),
]
# Its own part of the report: it needs cuDNN >= 9.13 (and a PyTorch that runs it).
BFLOAT16 = [("lstm 2L bi T256 B64 512 bf16", "lstm", 2, True, 256, 64, 512, 512, "bfloat16")]


def interleaved(functions: dict, rounds: int, calls: int, sync=lambda: None,
                clock=time.perf_counter) -> dict:
    """{name: (median, first quartile, third quartile)} of µs per call over `rounds`
    rounds, each running every function `calls` times in turn (then `sync()`), timed by
    `clock` (wall time by default)."""
    samples = {name: [] for name in functions}
    for _ in range(rounds):
        for name, fn in functions.items():
            sync()
            start = clock()
            for _ in range(calls):
                fn()
            sync()
            samples[name].append((clock() - start) / calls * 1e6)
    return {name: _spread(values) for name, values in samples.items()}


def _spread(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return statistics.median(values), q[0], q[2]


def format_rows(title: str, rows: dict, unit: str = "us") -> str:
    lines = [title]
    for name, (median, q1, q3) in rows.items():
        lines.append(f"  {name:<34} {median:10.1f} {unit}  (IQR {q1:.1f}-{q3:.1f})")
    return "\n".join(lines)


class Problem:
    """One RNN problem with arrays in CuPy and an equal PyTorch module."""

    def __init__(self, cupy, torch, mode, layers, bidirectional, T, B, I, H, dtype,
                 is_training=True):
        self.cupy, self.torch = cupy, torch
        D = 2 if bidirectional else 1
        attrs = dict(rnn_mode=mode, direction="bidirectional" if bidirectional else
                     "unidirectional")
        rng = np.random.default_rng(0)
        n = pycudnnrnn.params_size(num_layers=layers, num_units=H, input_size=I, **attrs)
        host_dtype = dtypes.by_name(dtype)
        put = lambda *shape: cupy.asarray(rng.uniform(-0.1, 0.1, shape).astype(host_dtype))
        self.x, self.h, self.w = put(T, B, I), put(layers * D, B, H), put(n)
        self.c = put(layers * D, B, H) if mode == "lstm" else None
        self.attrs = attrs
        self.plan = pycudnnrnn.RNNPlan(num_layers=layers, num_units=H, input_size=I,
                                       max_time=T, batch_size=B, dtype=dtype, device="cuda",
                                       is_training=is_training, **attrs)
        self.is_training = is_training
        out = self.plan.forward(self.x, self.h, self.c, self.w)
        self.grads = [cupy.ones_like(a) for a in out[:3]]
        cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[mode]
        self.net = cls(I, H, num_layers=layers, bidirectional=bidirectional).to(
            "cuda", getattr(torch, dtype))
        to_torch = dtypes.torch_from_dlpack  # bfloat16 too
        self.tx = to_torch(self.x).clone().requires_grad_()
        self.th = to_torch(self.h).clone()
        self.tc = to_torch(self.c).clone() if self.c is not None else None

    def ours_forward(self):
        return self.plan.forward(self.x, self.h, self.c, self.w)

    def functional_forward(self):
        return pycudnnrnn.forward(self.x, self.h, self.c, self.w, **self.attrs,
                                  is_training=self.is_training)

    def ours_step(self, forward=None):
        y, hy, cy, reserve = (forward or self.ours_forward)()
        return self.plan.backprop(self.x, self.h, self.c, self.w, y, hy, cy, *self.grads,
                                  reserve)

    def functional_step(self):
        y, hy, cy, reserve = self.functional_forward()
        return pycudnnrnn.backprop(self.x, self.h, self.c, self.w, None, y, hy, cy,
                                   *self.grads, reserve, **self.attrs)

    def torch_forward(self):
        state = (self.th, self.tc) if self.tc is not None else self.th
        with self.torch.no_grad():
            return self.net(self.tx, state)

    def torch_step(self):
        state = (self.th, self.tc) if self.tc is not None else self.th
        self.net(self.tx, state)[0].sum().backward()


def small_rows(cupy, torch, rounds):
    sync = cupy.cuda.Device().synchronize
    tiny = Problem(cupy, torch, "lstm", 1, False, 1, 1, 8, 8, "float32", is_training=False)
    rows = interleaved({"forward plan": tiny.ours_forward,
                        "forward functional": tiny.functional_forward,
                        "forward PyTorch (no_grad)": tiny.torch_forward}, rounds, 200, sync)
    text = [format_rows("tiny LSTM T1 B1 H8 f32, forward (inference), host us per call", rows)]
    train = Problem(cupy, torch, "lstm", 1, False, 1, 1, 8, 8, "float32")
    step_rows = interleaved({"fwd+bwd plan": train.ours_step,
                             "fwd+bwd functional": train.functional_step,
                             "fwd+bwd PyTorch": train.torch_step}, rounds, 100, sync)
    text.append(format_rows("same, forward + backprop, host us per call", step_rows))

    from pycudnnrnn import graphs
    captured = graphs.capture(tiny.ours_forward)

    def replay():
        captured.replay()

    graph_rows = interleaved({"forward graph replay": replay,
                              "forward plan": tiny.ours_forward}, rounds, 200,
                             lambda: (captured.stream.synchronize(), sync()))
    text.append(format_rows("same, forward as a replayed CUDA graph", graph_rows))

    decode = Problem(cupy, torch, "lstm", 1, False, 1, 1, 512, 512, "float32",
                     is_training=False)
    state = {"h": decode.h, "c": decode.c, "th": decode.th, "tc": decode.tc}

    def ours_step():
        _, state["h"], state["c"], _ = decode.plan.forward(decode.x, state["h"], state["c"],
                                                           decode.w)

    def torch_step():
        with torch.no_grad():
            _, (state["th"], state["tc"]) = decode.net(decode.tx, (state["th"], state["tc"]))

    decode_rows = interleaved({"decode plan": ours_step, "decode PyTorch": torch_step},
                              rounds, 200, sync)
    text.append(format_rows("decode loop, LSTM B1 H512, T=1 per call, state carried, "
                            "us per step", decode_rows))
    return "\n".join(text), {"tiny_forward": rows, "tiny_step": step_rows,
                             "graph": graph_rows, "decode": decode_rows}


def large_rows(cupy, torch, rounds, cases=LARGE):
    sync = cupy.cuda.Device().synchronize
    text, figures = [], {}
    for name, *spec in cases:
        p = Problem(cupy, torch, *spec)
        rows = interleaved({"fwd+bwd plan": p.ours_step, "fwd+bwd PyTorch": p.torch_step},
                           rounds, 3, sync)
        rows = {k: tuple(v / 1000 for v in vals) for k, vals in rows.items()}
        ratio = rows["fwd+bwd plan"][0] / rows["fwd+bwd PyTorch"][0]
        text.append(format_rows(f"{name}: ms per fwd+bwd (ours/PyTorch {ratio:.2f})", rows,
                                "ms"))
        figures[name] = rows
        del p
    return "\n".join(text), figures


def memory_rows(cupy, torch):
    """Peak device memory beyond the inputs, one fwd+bwd, of the 4-layer f16 case."""
    name, *spec = LARGE[-1]
    p = Problem(cupy, torch, *spec)
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        p.ours_step()
        cupy.cuda.Device().synchronize()
    ours = pool.total_bytes() / 2**20  # every block the step needed at once, at most
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    p.torch_step()
    torch.cuda.synchronize()
    theirs = (torch.cuda.max_memory_allocated() - base) / 2**20
    return (f"{name}: extra device memory of one fwd+bwd: ours {ours:.0f} MiB (CuPy pool "
            f"high-water), PyTorch {theirs:.0f} MiB (peak allocated)",
            {"ours_mib": ours, "torch_mib": theirs})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import cupy
    import torch
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    report, figures = [], {}
    for label, part in (("small", lambda: small_rows(cupy, torch, args.rounds)),
                        ("large", lambda: large_rows(cupy, torch, max(3, args.rounds // 2))),
                        ("bfloat16", lambda: large_rows(cupy, torch, max(3, args.rounds // 2),
                                                        BFLOAT16)),
                        ("memory", lambda: memory_rows(cupy, torch))):
        try:
            text, figures[label] = part()
        except Exception as exc:  # report what failed, keep the other parts
            text, figures[label] = f"{label}: failed ({type(exc).__name__}: {exc})", None
        print(text, flush=True)
        report.append(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
