"""GPU benchmark: cuDNN through pycudnnrnn against PyTorch's cuDNN RNNs, plus host overhead.

    PYTHONPATH=. python3 benchmarks/gpu_bench.py [--json PATH] [--repeat N]

Forward and forward+backprop medians from CUDA events, then the wall-clock cost per call
of a tiny problem (where the host-side work dominates). Asserts nothing.
"""

import argparse
import json

from pycudnnrnn import bench
from pycudnnrnn.bench import Case

CASES = [
    Case("lstm", 2, True, 64, 32, 256, 256, "float32"),
    Case("lstm", 2, True, 256, 64, 512, 512, "float32"),
    Case("lstm", 2, True, 256, 64, 512, 512, "float16"),
    Case("gru", 2, True, 256, 64, 512, 512, "float32"),
    Case("lstm", 2, True, 256, 64, 512, 512, "float32", ragged=True),
]
TINY = Case("lstm", 1, False, 1, 1, 8, 8, "float32")


def overhead():
    """Host microseconds per call on a tiny problem, ours and PyTorch's."""
    row = {"name": TINY.name}
    for label, fns in (("", bench.ours(TINY, "gpu")), ("torch_", bench.pytorch(TINY, "gpu"))):
        if fns is not None:
            row[f"{label}fwd_us"] = bench.host_overhead_us(fns[0], "gpu")
            row[f"{label}fwd_bwd_us"] = bench.host_overhead_us(fns[1], "gpu")
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    results = bench.run(CASES, ["gpu"], repeat=args.repeat, warmup=3)
    tiny = overhead()
    print(bench.format_table(results))
    print(f"host overhead per call, {tiny['name']}: "
          + ", ".join(f"{k} {v:.1f} us" for k, v in tiny.items() if k != "name"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "overhead": tiny}, f, indent=2)


if __name__ == "__main__":
    main()
