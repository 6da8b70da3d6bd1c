"""Flax benchmark: a jitted training step of ``pycudnnrnn.flax.LSTM`` side by side with
``nnx.RNN(nnx.OptimizedLSTMCell)`` layers (Flax's own, a ``lax.scan``) on the same weights.

    python benchmarks/flax_bench.py [--repeat N] [--platform cpu|gpu] [--cases cpu|gpu]

A step is the loss over the valid steps of a ragged batch, its gradient with respect to
every ``nnx.Param`` and an Adam update (``nnx.Optimizer``), all in one ``nnx.jit``. Rounds
are interleaved (each round times every implementation once); the table shows the median
and the min-max of the rounds. Prints; asserts nothing.
"""

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import pycudnnrnn
from pycudnnrnn import flax as rnn_flax

CASES = {  # (layers, bidirectional, T, B, in_features, hidden); the CPU's are smaller
    "cpu": [(1, False, 32, 16, 32, 64), (2, True, 32, 16, 64, 64)],
    "gpu": [(1, False, 128, 64, 256, 256), (2, True, 128, 64, 512, 512),
            (1, False, 512, 16, 128, 1024)],
    "tiny": [(1, True, 4, 2, 3, 4)],  # the test suite's smoke run
}


class FlaxStack(nnx.Module):
    """Flax's layers, run in order as a Flax user stacks them."""

    def __init__(self, layers):
        self.layers = nnx.List([layer if isinstance(layer, nnx.Bidirectional)
                                else nnx.RNN(layer) for layer in layers])

    def __call__(self, x, seq_lengths):
        for layer in self.layers:
            x = layer(x, seq_lengths=seq_lengths)
        return x


def models(L, bidirectional, I, H):
    """name → model(x, seq_lengths) → outputs; both start from the same weights."""
    ours = rnn_flax.LSTM(I, H, num_layers=L, bidirectional=bidirectional, rngs=nnx.Rngs(0))
    return {"pycudnnrnn.flax.LSTM": ours,
            "nnx.RNN(OptimizedLSTMCell)": FlaxStack(ours.to_flax())}


def train_step(model, x, lengths, target):
    """A fresh optimizer and the jitted step for `model`; returns step() → loss."""
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    valid = (jnp.arange(x.shape[1])[None, :] < lengths[:, None])[..., None]

    def loss_fn(model):
        error = (model(x, seq_lengths=lengths) - target) ** 2
        return jnp.sum(jnp.where(valid, error, 0)) / jnp.sum(valid)

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    return lambda: step(model, optimizer)


def timed(step):
    start = time.perf_counter()
    jax.block_until_ready(step())
    return time.perf_counter() - start


def bench_case(L, bidirectional, T, B, I, H, device, repeat):
    """name → list of step times in seconds (compiled and warmed up first)."""
    D = 2 if bidirectional else 1
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    with jax.default_device(device):
        x = jax.random.normal(keys[0], (B, T, I))
        lengths = jax.random.randint(keys[1], (B,), T // 2, T + 1).at[0].set(T)
        target = jax.random.normal(keys[2], (B, T, D * H))
        steps = {name: train_step(model, x, lengths, target)
                 for name, model in models(L, bidirectional, I, H).items()}
        for step in steps.values():
            timed(step)
        times = {name: [] for name in steps}
        for _ in range(repeat):
            for name, step in steps.items():
                times[name].append(timed(step))
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--platform", default=jax.default_backend())
    parser.add_argument("--cases", choices=sorted(CASES), default=None,
                        help="default: the platform's ('gpu' for any accelerator)")
    args = parser.parse_args(argv)
    device = jax.devices(args.platform)[0]
    cases = CASES[args.cases or ("cpu" if device.platform == "cpu" else "gpu")]
    print(f"pycudnnrnn {pycudnnrnn.__version__}, jax {jax.__version__}, flax "
          f"{__import__('flax').__version__}, python {platform.python_version()}, device "
          f"{device.device_kind} ({device.platform}); float32 training step (Adam), median "
          f"(min-max) of {args.repeat} interleaved rounds")
    print(f"{'case':<26}{'implementation':<30}{'train step ms':>26}{'step / ours':>13}",
          flush=True)
    for L, bi, T, B, I, H in cases:
        label = f"L{L} {'bi' if bi else 'uni'} T{T} B{B} I{I} H{H}"
        times = bench_case(L, bi, T, B, I, H, device, args.repeat)
        ours = np.median(times["pycudnnrnn.flax.LSTM"])
        for name, t in times.items():
            t = np.asarray(t) * 1e3
            cell = f"{np.median(t):9.2f} ({t.min():.2f}-{t.max():.2f})"
            print(f"{label:<26}{name:<30}{cell:>26}{np.median(t) / 1e3 / ours:>12.2f}x",
                  flush=True)  # a run cut short keeps its finished rows


if __name__ == "__main__":
    main()
