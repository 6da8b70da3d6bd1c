"""CPU benchmark: the NumPy backend against PyTorch's CPU RNNs (when torch is importable).

    python benchmarks/cpu_bench.py [--repeat N]

Prints the environment, then a table of medians with their min and max; asserts nothing.
docs/performance.md records its figures.
"""

import argparse

from pycudnnrnn.tools.bench import Case, format_table, run
from pycudnnrnn.tools.environment import collect

CASES = [
    Case("lstm", 2, True, 64, 32, 256, 256),
    Case("lstm", 2, True, 64, 32, 256, 256, ragged=True),
    Case("gru", 2, True, 64, 32, 256, 256),
    Case("lstm", 1, False, 128, 16, 128, 128),
    Case("rnn_tanh", 1, False, 256, 8, 64, 64),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    info = collect()  # the same environment `pycudnnrnn info` and `bench --json` give
    print(", ".join(f"{key} {info[key]}" for key in
                    ("pycudnnrnn", "python", "numpy", "blas", "cpus", "thread settings", "torch")))
    print(format_table(run(CASES, ["cpu"], repeat=args.repeat, warmup=1)))


if __name__ == "__main__":
    main()
