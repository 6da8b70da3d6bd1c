"""Keras benchmark: a training step of a model on pycudnnrnn.keras's LSTM/GRU, side by side
with the same model on Keras's own layers, on the same weights and batches.

    KERAS_BACKEND=jax   python benchmarks/keras_bench.py [--repeat N] [--size cpu|gpu]
    KERAS_BACKEND=torch python benchmarks/keras_bench.py

A step is ``model.train_on_batch`` (forward, loss, gradient, Adam update; on JAX one
jitted function, compiled before timing) on a fixed batch; ``predict_on_batch`` (the
inference forward) is timed too. The model is ``[Masking] → RNN → Dense``, the RNN one
layer or a ``Bidirectional`` pair (ours: ``pycudnnrnn.keras.Bidirectional``, one call), masked (right-padded, a quarter of the steps padding on
average) or not. Rounds are interleaved: each round times every implementation once.
Prints medians and min-max in ms; asserts nothing. Keras picks the device (on PyTorch
CUDA when it has one, on JAX JAX's default device).
"""

import argparse
import os
import platform
import time

import keras
import numpy as np

import pycudnnrnn
from pycudnnrnn import keras as ours

SIZES = {  # (rnn, bidirectional, masked, T, B, I, H)
    "cpu": [("lstm", False, False, 32, 16, 32, 64), ("lstm", False, True, 32, 16, 32, 64),
            ("gru", False, True, 32, 16, 32, 64), ("lstm", True, True, 32, 16, 32, 64),
            ("gru", True, False, 64, 8, 32, 128)],
    "gpu": [("lstm", False, False, 128, 64, 256, 256), ("lstm", False, True, 128, 64, 256, 256),
            ("gru", False, True, 128, 64, 256, 256), ("lstm", True, True, 128, 64, 512, 512),
            ("gru", True, False, 512, 16, 128, 1024)],
}
LAYERS = {"Keras": {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU,
                    "bi": keras.layers.Bidirectional},
          "pycudnnrnn": {"lstm": ours.LSTM, "gru": ours.GRU, "bi": ours.Bidirectional}}


def build(layers, mode, bidirectional, masked, T, I, H):
    inputs = keras.Input((T, I))
    x = keras.layers.Masking(0.0)(inputs) if masked else inputs
    rnn = layers[mode](H, return_sequences=True)
    x = (layers["bi"](rnn) if bidirectional else rnn)(x)
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return model


def timed(call):
    start = time.perf_counter()
    keras.ops.convert_to_numpy(call())  # waits for the device
    return time.perf_counter() - start


def bench_case(mode, bidirectional, masked, T, B, I, H, repeat):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, I)).astype("float32")
    if masked:
        lengths = rng.integers(T // 2, T + 1, size=B)
        x[np.arange(T)[None, :] >= lengths[:, None]] = 0.0
    y = rng.standard_normal((B, T, 1)).astype("float32")
    models = {name: build(layers, mode, bidirectional, masked, T, I, H)
              for name, layers in LAYERS.items()}
    models["pycudnnrnn"].set_weights(models["Keras"].get_weights())
    runs = {}
    for name, model in models.items():
        for kind, call in (("predict", lambda m=model: m.predict_on_batch(x)),
                           ("train step", lambda m=model: m.train_on_batch(x, y))):
            for _ in range(2):  # compile and warm up
                timed(call)
            runs[(name, kind)] = (call, [])
    for _ in range(repeat):
        for call, times in runs.values():
            times.append(timed(call))
    return runs


def cell(times):
    t = np.asarray(times) * 1e3
    return f"{np.median(t):9.2f} ({t.min():.2f}-{t.max():.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="problem sizes (default: gpu when Keras's backend has a GPU)")
    args = parser.parse_args()
    backend = keras.backend.backend()
    if backend == "jax":
        import jax
        device = jax.devices()[0]
        where, gpu = f"jax {jax.__version__}, {device.device_kind}", device.platform == "gpu"
    else:
        import torch
        gpu = torch.cuda.is_available()
        where = f"torch {torch.__version__}, " + (torch.cuda.get_device_name() if gpu else "cpu")
    size = args.size or ("gpu" if gpu else "cpu")
    print(f"pycudnnrnn {pycudnnrnn.__version__}, keras {keras.__version__} ({where}), python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs; float32, median (min-max) "
          f"ms of {args.repeat} interleaved rounds")
    print(f"{'case':<34}{'layers':<12}{'predict ms':>26}{'train step ms':>26}{'step / ours':>13}",
          flush=True)
    for mode, bi, masked, T, B, I, H in SIZES[size]:
        label = (f"{mode.upper()} {'bi' if bi else 'uni'}{' masked' if masked else ''} "
                 f"T{T} B{B} I{I} H{H}")
        runs = bench_case(mode, bi, masked, T, B, I, H, args.repeat)
        ours_step = np.median(runs[("pycudnnrnn", "train step")][1])
        for name in LAYERS:
            ratio = np.median(runs[(name, "train step")][1]) / ours_step
            print(f"{label:<34}{name:<12}{cell(runs[(name, 'predict')][1]):>26}"
                  f"{cell(runs[(name, 'train step')][1]):>26}{ratio:>12.2f}x", flush=True)


if __name__ == "__main__":
    main()
