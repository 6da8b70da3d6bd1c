"""pycudnnrnn.keras on TensorFlow where TensorFlow's cuDNN kernel can run (the stand-in
kernel of ``fake_tf_cudnn`` here): the layers take the params buffer and the kernel, and
give what they give on TensorFlow's operations. Prints "same" when they agree: outputs
and weight gradients of an eager call with a mask (the kernel runs), and the weights
after a ``fit`` (traced: the selector's default, TensorFlow's operations, runs). Where
the kernel runs, each layer refuses XLA, as Keras's own LSTM does on a GPU. Run by
tests/test_tensorflow_cudnn.py in a process of its own (Keras's backend is fixed at its
import)."""

import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import fake_tf_cudnn  # noqa: E402
import pycudnnrnn.keras as pk  # noqa: E402
from pycudnnrnn.tensorflow import cudnn  # noqa: E402

rng = np.random.default_rng(0)
x = rng.standard_normal((5, 6, 3)).astype("float32")
mask = np.arange(6)[None, :] < np.array([6, 4, 0, 2, 5])[:, None]
mask[3, 0] = False  # a hole: the steps are compacted for the kernel
y = rng.standard_normal((5, 1)).astype("float32")


def build():
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((6, 3)), keras.layers.Masking(0.0),
        pk.Bidirectional(pk.LSTM(4, return_sequences=True)), pk.GRU(3),
        keras.layers.Dense(1)])


def call_and_gradients():
    model = build()
    with tf.GradientTape() as tape:
        out = model(x * mask[..., None])
        loss = tf.reduce_sum(out ** 2)
    return [out.numpy()] + [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]


def supports_jit():
    """Whether each of our layers lets Keras compile it with XLA, after a call."""
    model = build()
    model(x)
    return [layer.supports_jit for layer in model._flatten_layers()
            if isinstance(layer, (pk.LSTM, pk.GRU))]


def fit():
    model = build()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=False)
    model.fit(x * mask[..., None], y, batch_size=5, epochs=2, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights]


def agree(got, want):
    return len(got) == len(want) and all(
        np.allclose(g, w, rtol=1e-4, atol=1e-6) for g, w in zip(got, want))


ops_route = call_and_gradients(), fit()
if not all(supports_jit()):
    sys.exit("on TensorFlow's operations a layer refused XLA")
cudnn._kernel = fake_tf_cudnn.CudnnRNNV3
cudnn._visible_gpus = lambda: ["GPU:0 (stand-in)"]
cudnn._device_type = lambda tensor: "GPU"
kernel_route = call_and_gradients()
assert fake_tf_cudnn.CALLS, "the layers did not reach the kernel"
fitted = fit()
if any(supports_jit()):  # Keras's own LSTM refuses XLA where cuDNN runs it, the same way
    sys.exit("on the kernel a layer let jit_compile='auto' choose XLA, which skips cuDNN")
for name, got, want in (("call", kernel_route, ops_route[0]), ("fit", fitted, ops_route[1])):
    if not agree(got, want):
        sys.exit(f"{name}: the kernel route differs from TensorFlow's operations")
print("same")
