"""Ours against each framework's own RNN on the CPU, each side in a process of its own.

    python benchmarks/peers.py [--paths torch,...] [--sizes small,medium,large]
                               [--cells lstm,gru,rnn_tanh] [--kinds step,forward]
                               [--lengths full,ragged] [--rounds 3] [--seconds 0.4]
                               [--control] [--json PATH] [--plot FOLDER] [--quick]

Paths (ours ÷ theirs):

=================  ==============================================  ==========================
``torch``          ``pycudnnrnn.torch.LSTM``/``GRU``/``RNN``       ``torch.nn``'s, eager
``torch-compile``  the same, ``torch.compile(fullgraph=True)``     ``torch.compile``'d nn's
``numpy``          the NumPy backend's forward + backprop         ``torch.nn``'s forward +
                                                                   backward
``flax``           ``pycudnnrnn.flax.LSTM``/``GRU``/``SimpleRNN``  ``nnx.RNN`` of Flax's cell
                   under ``nnx.jit``                               (``OptimizedLSTMCell``, …)
``keras-jax``      ``pycudnnrnn.keras.LSTM``/``GRU``               ``keras.layers``'
``keras-torch``    the same on Keras's PyTorch backend
``keras-tensorflow`` the same on Keras's TensorFlow backend
=================  ==============================================  ==========================

Each row is one configuration (cell, direction, lengths full or ragged, size) and one
kind: ``step`` (forward, loss, gradient and an SGD update, or ``train_on_batch``) or
``forward`` (inference alone). A process times every row of one path, size and kind for
one side (imports and compilation paid once), a round runs ours then theirs (the next
round theirs first), and a row's figure is the median over rounds of each process's
median call; the spread is the largest round median over the smallest. In one process,
one library's idle thread pool slows the other's: the figures would lie.

``--control`` runs the peer on both sides (an A/A run): its ratios are what the
machine's noise alone makes of two identical sides, the yardstick for a row near 1.

Sizes: small T32 B16 I32 H64, medium T64 B32 I128 H256, large T128 B64 I512 H512; two
layers when bidirectional (the NumPy row's medium case, as ``docs/performance.md``
recorded it). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = {"small": dict(T=32, B=16, I=32, H=64), "medium": dict(T=64, B=32, I=128, H=256),
         "large": dict(T=128, B=64, I=512, H=512)}
CELLS = ("lstm", "gru", "rnn_tanh")
PATHS = ("torch", "torch-compile", "numpy", "flax", "keras-jax", "keras-torch",
         "keras-tensorflow")
KINDS = {"torch": ("step", "forward"), "torch-compile": ("step",), "numpy": ("step",),
         "flax": ("step", "forward"), "keras-jax": ("step",), "keras-torch": ("step",),
         "keras-tensorflow": ("step",)}
KERAS_CELLS = ("lstm", "gru")  # pycudnnrnn.keras has no SimpleRNN


def rows(paths, sizes, cells, kinds=("step", "forward"), lengths=("full", "ragged")):
    """``(path, size, kind, cell, bidirectional, ragged)`` of every row asked for."""
    for path in paths:
        for size in sizes:
            for kind in (k for k in KINDS[path] if k in kinds):
                for cell in cells:
                    if path.startswith("keras") and cell not in KERAS_CELLS:
                        continue
                    for bidirectional in (False, True):
                        for ragged in (r for r in (False, True)
                                       if ("ragged" if r else "full") in lengths):
                            yield path, size, kind, cell, bidirectional, ragged


# --------------------------------------------------------------------------- one process

def _lengths(T, B):
    """Ragged lengths: from T down to T/4, unsorted, none of length 0 (peers refuse it)."""
    return [T - (b * 37 % B) * (3 * T // 4) // max(B - 1, 1) for b in range(B)]


def _timed(call, seconds):
    """The median time of `call` (ms), over back-to-back calls filling `seconds`, after as
    many filling half that (allocator pools, oneDNN primitives and caches warm up: a
    row's first calls may take several times the later ones)."""
    end = time.perf_counter() + seconds / 2
    for k in range(1000):
        call()
        if k >= 3 and time.perf_counter() > end:
            break
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _torch_calls(side, kind, cell, bidirectional, ragged, size, compiled=False):
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    import pycudnnrnn.torch as prt
    T, B, I, H = (size[k] for k in "TBIH")
    layers = 2 if bidirectional else 1
    name = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN"}[cell]
    torch.manual_seed(0)
    module = getattr(torch.nn if side == "theirs" else prt, name)(
        I, H, num_layers=layers, bidirectional=bidirectional, batch_first=True)
    x = torch.randn(B, T, I)
    lengths = torch.tensor(_lengths(T, B)) if ragged else None
    if side == "ours":
        run = lambda x: module(x, sequence_lengths=lengths)[0]  # noqa: E731
    elif ragged:
        def run(x):
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            return pad_packed_sequence(module(packed)[0], batch_first=True, total_length=T)[0]
    else:
        run = lambda x: module(x)[0]  # noqa: E731
    if compiled:
        # Inductor's disk caches do not key on a custom op's fake (its reserve size): a
        # graph cached with another version of this library would be reused.
        from torch._functorch import config as functorch_config
        from torch._inductor import config as inductor_config
        inductor_config.fx_graph_cache = False
        functorch_config.enable_autograd_cache = False
        # Each row's function is the same code object: without a reset, a process's rows
        # pass Dynamo's recompile limit (8), which fullgraph=True makes an error.
        torch._dynamo.reset()
        run = torch.compile(run, fullgraph=side == "ours")
    if kind == "forward":
        module.eval()

        def call():
            with torch.no_grad():
                run(x)
        return call
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)

    def call():
        optimizer.zero_grad(set_to_none=True)
        run(x).square().mean().backward()
        optimizer.step()
    return call


def _numpy_calls(side, kind, cell, bidirectional, ragged, size):
    import numpy as np
    T, B, I, H = (size[k] for k in "TBIH")
    layers = 2 if bidirectional else 1
    if side == "theirs":
        return _torch_forward_backward(cell, bidirectional, ragged, size)
    import pycudnnrnn
    rng = np.random.default_rng(0)
    attrs = dict(rnn_mode=cell, direction="bidirectional" if bidirectional else "unidirectional")
    n = pycudnnrnn.params_size(num_layers=layers, num_units=H, input_size=I, **attrs)
    params = rng.uniform(-0.1, 0.1, n).astype(np.float32)
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    h0 = np.zeros((layers * (2 if bidirectional else 1), B, H), np.float32)
    c0 = h0 if cell == "lstm" else None
    lengths = np.array(_lengths(T, B)) if ragged else None

    def call():
        y, hy, cy, reserve = pycudnnrnn.forward(x, h0, c0, params, lengths, **attrs)
        pycudnnrnn.backprop(x, h0, c0, params, lengths, y, hy, cy, np.ones_like(y),
                            np.zeros_like(hy), None if cy is None else np.zeros_like(cy),
                            reserve, **attrs)
    return call


def _torch_forward_backward(cell, bidirectional, ragged, size):
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    T, B, I, H = (size[k] for k in "TBIH")
    name = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN"}[cell]
    torch.manual_seed(0)
    module = getattr(torch.nn, name)(I, H, num_layers=2 if bidirectional else 1,
                                     bidirectional=bidirectional)
    x = torch.randn(T, B, I, requires_grad=True)
    lengths = torch.tensor(_lengths(T, B)) if ragged else None

    def call():
        module.zero_grad(set_to_none=True)
        x.grad = None
        if ragged:
            packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
            y = pad_packed_sequence(module(packed)[0], total_length=T)[0]
        else:
            y = module(x)[0]
        y.sum().backward()
    return call


def _flax_calls(side, kind, cell, bidirectional, ragged, size):
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from pycudnnrnn import flax as rnn_flax
    T, B, I, H = (size[k] for k in "TBIH")
    layers = 2 if bidirectional else 1
    if side == "ours":
        cls = {"lstm": rnn_flax.LSTM, "gru": rnn_flax.GRU, "rnn_tanh": rnn_flax.SimpleRNN}[cell]
        model = cls(I, H, num_layers=layers, bidirectional=bidirectional, rngs=nnx.Rngs(0))
        apply = lambda model, x, lengths: model(x, seq_lengths=lengths)  # noqa: E731
    else:
        make = {"lstm": nnx.OptimizedLSTMCell, "gru": nnx.GRUCell,
                "rnn_tanh": nnx.SimpleCell}[cell]
        rngs = nnx.Rngs(0)

        def layer(width):
            if not bidirectional:
                return nnx.RNN(make(width, H, rngs=rngs))
            return nnx.Bidirectional(nnx.RNN(make(width, H, rngs=rngs)),
                                     nnx.RNN(make(width, H, rngs=rngs)))
        model = nnx.List([layer(I if l == 0 else 2 * H) for l in range(layers)])

        def apply(model, x, lengths):
            for rnn in model:
                x = rnn(x, seq_lengths=lengths)
            return x
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, I))
    lengths = jnp.asarray(_lengths(T, B), jnp.int32) if ragged else None
    if kind == "forward":
        forward = nnx.jit(apply)
        return lambda: jax.block_until_ready(forward(model, x, lengths))
    optimizer = nnx.Optimizer(model, optax.sgd(0.01), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x, lengths):
        loss = lambda model: jnp.mean(apply(model, x, lengths) ** 2)  # noqa: E731
        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value
    return lambda: jax.block_until_ready(step(model, optimizer, x, lengths))


def _keras_calls(side, kind, cell, bidirectional, ragged, size):
    import keras
    import numpy as np
    from pycudnnrnn import keras as ours
    T, B, I, H = (size[k] for k in "TBIH")
    layers_module = ours if side == "ours" else keras.layers
    cls = {"lstm": layers_module.LSTM, "gru": layers_module.GRU}[cell]
    keras.utils.set_random_seed(0)
    inputs = keras.Input((T, I))
    h = keras.layers.Masking()(inputs) if ragged else inputs
    for layer in range(2 if bidirectional else 1):
        rnn = cls(H, return_sequences=True)
        h = layers_module.Bidirectional(rnn)(h) if bidirectional else rnn(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, I)).astype("float32")
    if ragged:
        x[np.arange(T)[None, :] >= np.array(_lengths(T, B))[:, None]] = 0.0
    y = rng.standard_normal((B, T, 1)).astype("float32")
    return lambda: model.train_on_batch(x, y)


def worker(path, size, kind, side, configs, seconds):
    """Times each of `configs` (cell, bidirectional, ragged) for one side; JSON out."""
    if path.startswith("keras"):
        os.environ["KERAS_BACKEND"] = path.split("-")[1]
    size = SIZES[size]
    make = {"torch": _torch_calls, "numpy": _numpy_calls, "flax": _flax_calls,
            "keras-jax": _keras_calls, "keras-torch": _keras_calls,
            "keras-tensorflow": _keras_calls,
            "torch-compile": lambda *a: _torch_calls(*a, compiled=True)}[path]
    results = []
    for cell, bidirectional, ragged in configs:
        call = make(side, kind, cell, bidirectional, ragged, size)
        results.append(_timed(call, seconds))
    print(json.dumps(results))


# --------------------------------------------------------------------------- the driver

def _run_side(path, size, kind, side, configs, seconds):
    command = [sys.executable, os.path.abspath(__file__), "--worker", path, size, kind, side,
               json.dumps(configs), str(seconds)]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{path} {size} {kind} {side}: exit {proc.returncode}\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(selected, rounds, seconds, progress=print, control=False):
    """``{row: {"ours": [ms per round], "theirs": [...]}}`` for the rows `selected`.

    `control`: the peer on both sides (an A/A run), so that the ratios show what this
    machine's noise alone makes of two identical sides.
    """
    groups = {}
    for path, size, kind, cell, bidirectional, ragged in selected:
        groups.setdefault((path, size, kind), []).append((cell, bidirectional, ragged))
    figures = {}
    for (path, size, kind), configs in groups.items():
        times = {"ours": [], "theirs": []}
        for round_ in range(rounds):
            for side in (("ours", "theirs") if round_ % 2 == 0 else ("theirs", "ours")):
                times[side].append(_run_side(path, size, kind, "theirs" if control else side,
                                             configs, seconds))
        for k, config in enumerate(configs):
            figures[(path, size, kind, *config)] = {
                side: [t[k] for t in times[side]] for side in times}
        progress(f"  {path} {size} {kind}: {len(configs)} rows, {rounds} rounds")
    return figures


def summary(figures):
    """One dict per row: medians, spreads (max/min of the round medians), the ratio."""
    out = []
    for (path, size, kind, cell, bidirectional, ragged), times in figures.items():
        ours, theirs = (statistics.median(times[s]) for s in ("ours", "theirs"))
        out.append(dict(path=path, size=size, kind=kind, cell=cell,
                        bidirectional=bidirectional, ragged=ragged, ours_ms=ours,
                        theirs_ms=theirs, ratio=ours / theirs,
                        ours_spread=max(times["ours"]) / min(times["ours"]),
                        theirs_spread=max(times["theirs"]) / min(times["theirs"])))
    return out


def table(results):
    lines = [f"{'path':<14} {'size':<7} {'kind':<8} {'cell':<9} {'dirs':<5} {'lengths':<8} "
             f"{'ours ms':>9} {'(spread)':>8} {'theirs ms':>10} {'(spread)':>8} {'ratio':>6}"]
    for r in results:
        lines.append(f"{r['path']:<14} {r['size']:<7} {r['kind']:<8} {r['cell']:<9} "
                     f"{'bi' if r['bidirectional'] else 'uni':<5} "
                     f"{'ragged' if r['ragged'] else 'full':<8} {r['ours_ms']:9.2f} "
                     f"{r['ours_spread']:7.2f}x {r['theirs_ms']:10.2f} "
                     f"{r['theirs_spread']:7.2f}x {r['ratio']:6.2f}")
    return "\n".join(lines)


def plot(results, folder):
    """docs/performance.md's figures of `results` in `folder`, drawn by
    benchmarks/plot_performance.py: one per path and an overview; their file names."""
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "plot_performance", os.path.join(here, "plot_performance.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.makedirs(folder, exist_ok=True)
    return module.plot_all(results, folder)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--cells", default=",".join(CELLS))
    parser.add_argument("--kinds", default="step,forward",
                        help="step (a training step), forward (inference alone)")
    parser.add_argument("--lengths", default="full,ragged")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.4,
                        help="time per row per process (back-to-back calls)")
    parser.add_argument("--quick", action="store_true",
                        help="LSTM only, small and medium, 2 rounds: a few minutes")
    parser.add_argument("--control", action="store_true",
                        help="the peer on both sides (A/A): the ratios this machine's noise "
                             "makes of identical sides")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--plot", metavar="FOLDER",
                        help="draw docs/performance.md's figures of the rows here (PNG: "
                             "one per path and an overview)")
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        path, size, kind, side, configs, seconds = args.worker
        worker(path, size, kind, side, [tuple(c) for c in json.loads(configs)], float(seconds))
        return
    if args.quick:
        args.cells, args.sizes, args.rounds = "lstm", "small,medium", 2
    selected = list(rows(args.paths.split(","), args.sizes.split(","), args.cells.split(","),
                         args.kinds.split(","), args.lengths.split(",")))
    print(f"{len(selected)} rows, {args.rounds} rounds, each side in a process of its own; "
          f"{os.cpu_count()} CPUs" + ("; control: the peer on both sides" if args.control else ""))
    results = summary(measure(selected, args.rounds, args.seconds, control=args.control))
    if args.control:  # an A/A run: the JSON and the chart say so
        for row in results:
            row["control"] = True
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
