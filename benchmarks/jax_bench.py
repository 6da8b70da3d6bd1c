"""JAX benchmark: a jitted LSTM training step through pycudnnrnn.jax, side by side with
``jax.experimental.rnn.lstm`` (cuDNN; GPU only) and a ``lax.scan`` LSTM
(``jax.experimental.rnn.lstm_ref``, JAX's own reference), on the same weights.

    python benchmarks/jax_bench.py [--repeat N] [--round-ms MS] [--platform cpu|gpu]

A step is loss, gradient with respect to the weights and an SGD update, all in one
``jax.jit``; the forward alone (inference) is timed too. Rounds are interleaved (each
round times every implementation once). A round of one program is as many back-to-back
calls as fill ``--round-ms`` (counted once, after warm-up), and its time is the mean per
call: a single call of a few milliseconds measures the scheduler of a shared machine
more than the program. The table shows medians with the fastest and slowest round, and
the training step's max/min (its spread). Prints; asserts nothing.
"""

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import rnn as jax_rnn

import pycudnnrnn
from pycudnnrnn import jax as rnn_jax

CASES = {  # (layers, bidirectional, T, B, input_size, hidden); the CPU's are smaller
    "cpu": [(1, False, 32, 16, 32, 64), (2, True, 32, 16, 64, 64), (1, False, 64, 8, 32, 128)],
    "gpu": [(1, False, 128, 64, 256, 256), (2, True, 128, 64, 512, 512),
            (1, False, 512, 16, 128, 1024)],
}


def implementations(I, H, L, bidirectional):
    """name → fn(x [B, T, I], h0, c0 [L·D, B, H], weights, lengths) → (y, h, c)."""
    direction = "bidirectional" if bidirectional else "unidirectional"

    def ours(x, h0, c0, w, lengths, is_training=True):
        y, h, c = rnn_jax.rnn(x, jnp.swapaxes(h0, 0, 1), jnp.swapaxes(c0, 0, 1), w, lengths,
                              direction=direction, time_major=False, is_training=is_training)
        return y, jnp.swapaxes(h, 0, 1), jnp.swapaxes(c, 0, 1)

    def cudnn(x, h0, c0, w, lengths, is_training=True):
        return jax_rnn.lstm(x, h0, c0, w, lengths, I, H, L, 0.0, bidirectional)

    def scan(x, h0, c0, w, lengths, is_training=True):
        W_ih, W_hh, b_ih, b_hh = jax_rnn.unpack_lstm_weights(w, I, H, L, bidirectional)
        return jax_rnn.lstm_ref(x, h0, c0, W_ih, W_hh, b_ih, b_hh, lengths, I, H, L, 0.0,
                                bidirectional)

    return {"pycudnnrnn.jax": ours, "jax.experimental.rnn.lstm": cudnn, "lax.scan LSTM": scan}


def programs(fn, target):
    """The jitted inference forward and training step of one implementation."""
    def loss(w, x, h0, c0, lengths):
        y, h, c = fn(x, h0, c0, w, lengths)
        return jnp.mean((y - target) ** 2) + jnp.mean(h ** 2) + jnp.mean(c ** 2)

    @jax.jit
    def step(w, x, h0, c0, lengths):
        value, grad = jax.value_and_grad(loss)(w, x, h0, c0, lengths)
        return w - 0.1 * grad, value

    forward = jax.jit(lambda w, x, h0, c0, lengths: fn(x, h0, c0, w, lengths,
                                                       is_training=False)[0])
    return {"forward": forward, "train step": step}


def timed(program, args, calls=1):
    """Seconds per call of `calls` back-to-back calls, each waited for."""
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(program(*args))
    return (time.perf_counter() - start) / calls


def calls_per_round(program, args, round_seconds):
    """How many calls of `program` fill `round_seconds` (at least one)."""
    return max(1, round(round_seconds / min(timed(program, args) for _ in range(3))))


def bench_case(L, bidirectional, T, B, I, H, device, repeat, round_seconds):
    D = 2 if bidirectional else 1
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    put = lambda a: jax.device_put(a, device)  # noqa: E731
    x = put(jax.random.normal(keys[0], (B, T, I)))
    h0, c0 = (put(jax.random.normal(k, (L * D, B, H))) for k in keys[1:3])
    w = put(jax_rnn.init_lstm_weight(keys[3], I, H, L, bidirectional))
    lengths = put(jnp.full((B,), T, jnp.int32))
    target = put(jax.random.normal(keys[4], (B, T, D * H)))
    args = (w, x, h0, c0, lengths)
    runs, skipped = {}, {}
    for name, fn in implementations(I, H, L, bidirectional).items():
        for kind, program in programs(fn, target).items():
            try:
                timed(program, args)  # compile and warm up
            except Exception as exc:  # e.g. no CPU lowering of jax.experimental.rnn.lstm
                skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:70]}"
                break
            runs[(name, kind)] = (program, calls_per_round(program, args, round_seconds), [])
    for _ in range(repeat):
        for program, calls, times in runs.values():
            times.append(timed(program, args, calls))
    return runs, skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--round-ms", type=float, default=50.0,
                        help="the least time a round of one program lasts (default 50)")
    parser.add_argument("--platform", default=jax.default_backend())
    args = parser.parse_args()
    device = jax.devices(args.platform)[0]
    print(f"pycudnnrnn {pycudnnrnn.__version__}, jax {jax.__version__}, python "
          f"{platform.python_version()}, device {device.device_kind} ({device.platform}); "
          f"float32, ms per call: median (min-max) of {args.repeat} interleaved rounds "
          f"of >= {args.round_ms:g} ms")
    print(f"{'case':<26}{'implementation':<28}{'forward ms':>22}{'train step ms':>24}"
          f"{'max/min':>9}{'step / ours':>13}", flush=True)
    for L, bi, T, B, I, H in CASES.get(device.platform, CASES["gpu"]):
        label = f"L{L} {'bi' if bi else 'uni'} T{T} B{B} I{I} H{H}"
        runs, skipped = bench_case(L, bi, T, B, I, H, device, args.repeat, args.round_ms / 1e3)
        ours = np.median(runs[("pycudnnrnn.jax", "train step")][2])
        for name in implementations(I, H, L, bi):
            if name in skipped:
                print(f"{label:<26}{name:<28}  n/a: {skipped[name]}", flush=True)
                continue
            cells = []
            for kind in ("forward", "train step"):
                t = np.asarray(runs[(name, kind)][2]) * 1e3
                cells.append(f"{np.median(t):8.2f} ({t.min():.2f}-{t.max():.2f})")
            steps = np.asarray(runs[(name, "train step")][2])
            ratio = np.median(steps) / ours
            print(f"{label:<26}{name:<28}{cells[0]:>22}{cells[1]:>24}"
                  f"{steps.max() / steps.min():>9.2f}{ratio:>12.2f}x",
                  flush=True)  # a run cut short by a time limit keeps its finished rows


if __name__ == "__main__":
    main()
