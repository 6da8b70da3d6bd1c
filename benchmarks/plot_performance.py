"""The figures and tables of docs/performance.md, from the rows ``peers.py`` measured.

    python benchmarks/plot_performance.py [--page docs/performance.md] [--json ROWS.json]
                                          [--out docs/images] [--tables]

Reads the rows from the page's tables (each follows a ``<!-- peers: PATH KIND -->``
comment) or from the JSON that ``peers.py --json`` writes, and draws one figure per
framework (``peers-PATH.png``: ours ÷ theirs for every row, log scale, a line at 1) and
one of all of them (``peers-overview.png``), each 1000 × 500 pixels. ``--tables`` prints
the page's tables instead (to paste after a new run). Times nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

# Each path of peers.py: its title in the figures and the page, in the page's order.
TITLES = {
    "torch": "PyTorch, eager: pycudnnrnn.torch against torch.nn",
    "torch-compile": "torch.compile: pycudnnrnn.torch against torch.nn",
    "flax": "Flax: pycudnnrnn.flax against nnx.RNN",
    "keras-jax": "Keras on JAX: pycudnnrnn.keras against keras.layers",
    "keras-torch": "Keras on PyTorch: pycudnnrnn.keras against keras.layers",
    "keras-tensorflow": "Keras on TensorFlow: pycudnnrnn.keras against keras.layers",
    "numpy": "NumPy backend against torch.nn (forward + backward)",
}
SHORT = {"torch": "PyTorch eager", "torch-compile": "torch.compile", "flax": "Flax",
         "keras-jax": "Keras on JAX", "keras-torch": "Keras on PyTorch",
         "keras-tensorflow": "Keras on TensorFlow",
         "numpy": "NumPy backend"}
SIZES = ("small", "medium", "large")
CELLS = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "tanh RNN"}
KIND_WORDS = {"step": "training step", "forward": "forward (inference)"}
COLORS = {"small": "#1f77b4", "medium": "#ff7f0e", "large": "#2ca02c"}
MARKERS = {"step": "o", "forward": "^"}
MARKER = re.compile(r"<!--\s*peers:\s*(\S+)\s+(\S+)\s*-->")


# --------------------------------------------------------------------------- the tables

def _label(row):
    return (f"{CELLS[row['cell']]} {'bi' if row['bidirectional'] else 'uni'} "
            f"{'ragged' if row['ragged'] else 'full'}")


def markdown(rows):
    """The page's tables: one per path and kind, a marker comment before each."""
    out = []
    for path in TITLES:
        for kind in ("step", "forward"):
            mine = [r for r in rows if r["path"] == path and r["kind"] == kind]
            if not mine:
                continue
            out += [f"<!-- peers: {path} {kind} -->", "",
                    "| size | row | ours ÷ theirs | ours ms (spread) | theirs ms (spread) |",
                    "|---|---|---:|---:|---:|"]
            for r in mine:
                out.append(f"| {r['size']} | {_label(r)} | {r['ratio']:.2f} | "
                           f"{r['ours_ms']:.2f} ({r['ours_spread']:.2f}) | "
                           f"{r['theirs_ms']:.2f} ({r['theirs_spread']:.2f}) |")
            out.append("")
    return "\n".join(out)


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _ms(cell):
    value, spread = re.fullmatch(r"([\d.]+)\s*\(([\d.]+)\)", cell).groups()
    return float(value), float(spread)


def read_tables(text):
    """The rows of every marked table in `text`, as ``peers.py --json`` writes them."""
    rows = []
    lines = text.splitlines()
    cell_names = {v: k for k, v in CELLS.items()}
    for n, line in enumerate(lines):
        found = MARKER.search(line)
        if not found:
            continue
        path, kind = found.groups()
        body = n + 1
        while body < len(lines) and not lines[body].strip():
            body += 1
        for row_line in lines[body + 2:]:  # past the header and the alignment row
            if not row_line.strip().startswith("|"):
                break
            size, label, ratio, ours, theirs = _cells(row_line)
            *cell, dirs, lengths = label.split()
            ours_ms, ours_spread = _ms(ours)
            theirs_ms, theirs_spread = _ms(theirs)
            rows.append(dict(path=path, size=size, kind=kind, cell=cell_names[" ".join(cell)],
                             bidirectional=dirs == "bi", ragged=lengths == "ragged",
                             ours_ms=ours_ms, theirs_ms=theirs_ms, ratio=float(ratio),
                             ours_spread=ours_spread, theirs_spread=theirs_spread))
    return rows


# --------------------------------------------------------------------------- the figures

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 13, "axes.titlesize": 15, "axes.labelsize": 13,
                         "legend.fontsize": 12})
    return plt


def _ratio_axis(ax, ratios, axis="y"):
    """A log-scale ratio axis labelled in plain numbers, a line at 1, a band of ±10 %."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    low, high = min(ratios + [0.9]), max(ratios + [1.1])
    candidates = ((0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 1.75, 2) if high / low <= 2.5
                  else (0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1, 1.4, 2, 3, 4, 5))
    ticks = [t for t in candidates if low / 1.15 <= t <= high * 1.15]
    span = ax.axhspan if axis == "y" else ax.axvspan
    line = ax.axhline if axis == "y" else ax.axvline
    span(1 / 1.1, 1.1, color="0.9", zorder=0, label="within ±10 %: level")
    line(1.0, color="black", linewidth=1.2, zorder=1)
    scale = ax.set_yscale if axis == "y" else ax.set_xscale
    scale("log")
    limits = ax.set_ylim if axis == "y" else ax.set_xlim
    limits(low / 1.15, high * 1.15)
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(FixedLocator(ticks))
    target.set_minor_locator(NullLocator())
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))


def _legend(fig, kinds, sizes):
    """Below the axes, in one row."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Line2D([], [], color=COLORS[s], marker="o", linestyle="", markersize=8,
                      label=s) for s in sizes]
    if len(kinds) > 1:
        handles += [Line2D([], [], color="0.3", marker=MARKERS[k], linestyle="",
                           markersize=8, markerfacecolor="white" if k == "forward" else "0.3",
                           label=KIND_WORDS[k]) for k in kinds]
    handles.append(Patch(color="0.9", label="within ±10 %: level"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=12,
               frameon=False, handletextpad=0.3, columnspacing=1.4)


def _control(rows):
    """Whether `rows` come from an A/A run (``peers.py --control``: the peer on both sides)."""
    return any(r.get("control") for r in rows)


def _point(ax, x, row):
    forward = row["kind"] == "forward"
    ax.plot(x, row["ratio"], linestyle="", marker=MARKERS[row["kind"]], markersize=8,
            color=COLORS[row["size"]], markerfacecolor="white" if forward else COLORS[row["size"]],
            markeredgewidth=1.6, zorder=3)


def plot_path(rows, path, filename):
    """One framework: every row's ratio by configuration, colour for size, shape for kind."""
    plt = _pyplot()
    mine = [r for r in rows if r["path"] == path]
    configs = []
    for r in mine:
        key = (r["cell"], r["bidirectional"], r["ragged"])
        if key not in configs:
            configs.append(key)
    configs.sort(key=lambda k: (list(CELLS).index(k[0]), k[1], k[2]))
    sizes = [s for s in SIZES if any(r["size"] == s for r in mine)]
    kinds = [k for k in ("step", "forward") if any(r["kind"] == k for r in mine)]
    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    width = 0.7 / max(len(sizes) * len(kinds), 1)
    for r in mine:
        slot = sizes.index(r["size"]) * len(kinds) + kinds.index(r["kind"])
        x = configs.index((r["cell"], r["bidirectional"], r["ragged"]))
        _point(ax, x - 0.35 + width * (slot + 0.5), r)
    _ratio_axis(ax, [r["ratio"] for r in mine])
    ax.set_xticks(range(len(configs)),
                  [f"{CELLS[c].split()[0]}\n{'bi' if b else 'uni'} {'ragged' if g else 'full'}"
                   for c, b, g in configs], fontsize=11)
    for x in range(1, len(configs)):
        ax.axvline(x - 0.5, color="0.85", linewidth=0.6, zorder=0)
    ax.set_xlim(-0.5, len(configs) - 0.5)
    level = sum(r["ratio"] <= 1.05 for r in mine)
    if _control(mine):
        ax.set_ylabel("the peer ÷ the peer (log; noise alone)")
        ax.set_title(f"A/A control, the peer on both sides: {SHORT[path]}")
    else:
        ax.set_ylabel("ours ÷ theirs (log; below 1: ours faster)")
        # two lines: the longest names outrun the figure's width on one
        ax.set_title(f"{TITLES[path]}\n{level} of {len(mine)} rows at or below 1.05")
    _legend(fig, kinds, sizes)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(filename, dpi=100)
    plt.close(fig)


def plot_overview(rows, filename):
    """Every framework on one axis: each row a point, colour for size, shape for kind."""
    plt = _pyplot()
    paths = [p for p in TITLES if any(r["path"] == p for r in rows)]
    sizes = [s for s in SIZES if any(r["size"] == s for r in rows)]
    kinds = [k for k in ("step", "forward") if any(r["kind"] == k for r in rows)]
    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    for y, path in enumerate(paths):
        mine = [r for r in rows if r["path"] == path]
        for r in mine:
            offset = (sizes.index(r["size"]) - (len(sizes) - 1) / 2) * 0.22
            offset += 0.07 if r["kind"] == "forward" else 0.0
            forward = r["kind"] == "forward"
            ax.plot(r["ratio"], y + offset, linestyle="", marker=MARKERS[r["kind"]],
                    markersize=6, color=COLORS[r["size"]], alpha=0.8,
                    markerfacecolor="white" if forward else COLORS[r["size"]], zorder=3)
    _ratio_axis(ax, [r["ratio"] for r in rows], axis="x")
    labels = []
    for path in paths:
        mine = [r for r in rows if r["path"] == path]
        labels.append(f"{SHORT[path]}\n{sum(r['ratio'] <= 1.05 for r in mine)} of "
                      f"{len(mine)} ≤ 1.05")
    ax.set_yticks(range(len(paths)), labels)
    ax.set_ylim(len(paths) - 0.5, -0.5)
    for y in range(1, len(paths)):
        ax.axhline(y - 0.5, color="0.85", linewidth=0.6, zorder=0)
    if _control(rows):
        ax.set_xlabel("the peer ÷ the peer, one point per row (log; noise alone)")
        ax.set_title("A/A control: each framework's own RNN layer on both sides")
    else:
        ax.set_xlabel("ours ÷ theirs, one point per row (log; left of 1: ours faster)")
        ax.set_title("pycudnnrnn against each framework's own RNN layer, on the CPU")
    _legend(fig, kinds, sizes)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(filename, dpi=100)
    plt.close(fig)


def plot_all(rows, folder):
    """``peers-overview.png`` and one ``peers-PATH.png`` per path in `rows`; their names."""
    names = [os.path.join(folder, "peers-overview.png")]
    plot_overview(rows, names[0])
    for path in TITLES:
        if any(r["path"] == path for r in rows):
            names.append(os.path.join(folder, f"peers-{path}.png"))
            plot_path(rows, path, names[-1])
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--page", default=os.path.join(here, os.pardir, "docs", "performance.md"),
                        help="read the rows from this page's marked tables")
    parser.add_argument("--json", help="read the rows from peers.py's --json output instead")
    parser.add_argument("--out", default=os.path.join(here, os.pardir, "docs", "images"),
                        help="the folder the figures go to")
    parser.add_argument("--tables", action="store_true",
                        help="print the page's tables from the rows instead of drawing")
    args = parser.parse_args(argv)
    if args.json:
        with open(args.json) as f:
            rows = json.load(f)
    else:
        with open(args.page, encoding="utf-8") as f:
            rows = read_tables(f.read())
    if not rows:
        sys.exit("no rows found (the page's tables follow a <!-- peers: PATH KIND --> line)")
    if args.tables:
        print(markdown(rows))
        return
    for name in plot_all(rows, args.out):
        print(os.path.relpath(name))


if __name__ == "__main__":
    main()
