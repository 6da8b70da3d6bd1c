"""cuDNN's weight-space layout beside pycudnnrnn.core.layout's, for every mode and option.

    PYTHONPATH=. python3 benchmarks/gpu_layout.py [--json PATH]

Needs a GPU. Prints each configuration whose tables differ, then a summary line; exits 1
if any differs. The JSON holds both whole tables of every configuration, so that a
disagreement can be fixed in ``pycudnnrnn/layout.py`` without another GPU run.
"""

import argparse
import itertools
import json
import sys

import numpy as np

from pycudnnrnn.core import layout
from pycudnnrnn.cuda import weight_space
from pycudnnrnn.core.checks import make_config

# Sizes that tell the pieces apart: input 5, hidden 8, projection 3; two layers, so the
# second layer's input width (D·P) shows too.
MODES = [("lstm", 0), ("lstm", 3), ("gru", 0), ("rnn_tanh", 0), ("rnn_relu", 0)]
GRID = list(itertools.product(MODES, ["unidirectional", "bidirectional"],
                              ["linear_input", "skip_input"]))


def compare(rnn_mode, num_proj, direction, input_mode, dtype=np.float32):
    """One configuration: both tables, as rows (pseudo_layer, linLayerID, kind, offset, size)."""
    config = make_config(rnn_mode=rnn_mode, num_layers=2, num_units=8,
                         input_size=8 if input_mode == "skip_input" else 5,
                         input_mode=input_mode, direction=direction, num_proj=num_proj)
    nbytes, table = weight_space.cudnn_weight_table(config, dtype)
    ours = weight_space.expected_table(config)
    ours_bytes = layout.params_size(config) * np.dtype(dtype).itemsize
    return {
        "config": dict(rnn_mode=rnn_mode, num_proj=num_proj, direction=direction,
                       input_mode=input_mode, num_layers=2, num_units=8,
                       input_size=config.input_size, dtype=np.dtype(dtype).name),
        "agree": nbytes == ours_bytes and sorted(table) == ours,
        "cudnn_bytes": nbytes, "ours_bytes": ours_bytes,
        "cudnn": [list(row) for row in sorted(table)], "ours": [list(row) for row in ours],
    }


def collect():
    return [compare(*mode, direction, input_mode) for mode, direction, input_mode in GRID]


def summary(results) -> str:
    lines = [f"differs: {r['config']}" for r in results if not r["agree"]]
    agree = sum(r["agree"] for r in results)
    lines.append(f"layout: {agree} of {len(results)} configurations agree with cuDNN")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write both tables of every configuration here")
    args = parser.parse_args()
    results = collect()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(summary(results))
    return 0 if all(r["agree"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
