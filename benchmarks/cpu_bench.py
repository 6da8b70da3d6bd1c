"""CPU benchmark: the NumPy backend against PyTorch's CPU RNNs (when torch is importable).

    python benchmarks/cpu_bench.py [--repeat N]

Prints a table of medians; asserts nothing. docs/performance.md records its figures.
"""

import argparse
import os
import platform

import numpy as np

import pycudnnrnn
from pycudnnrnn.bench import Case, format_table, run

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
    try:
        import torch
        versions = f", torch {torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        versions = ", torch not installed"
    print(f"pycudnnrnn {pycudnnrnn.__version__}, numpy {np.__version__}, python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs{versions}")
    print(format_table(run(CASES, ["cpu"], repeat=args.repeat, warmup=1)))


if __name__ == "__main__":
    main()
