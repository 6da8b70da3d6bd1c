"""A Keras model with pycudnnrnn's LSTM: two training steps under MirroredStrategy over
two logical CPU devices, and the same steps on one; prints "same" when the losses and
weights agree. Run by tests/test_tensorflow.py in a process of its own (logical devices
are fixed before TensorFlow starts)."""

import os

os.environ["KERAS_BACKEND"] = "tensorflow"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

import pycudnnrnn.keras as pk  # noqa: E402

rng = np.random.default_rng(0)
x = rng.standard_normal((8, 6, 3)).astype("float32")
mask = np.arange(6)[None, :] < np.array([6, 4, 0, 2, 6, 5, 1, 3])[:, None]
x = x * mask[..., None]
y = rng.standard_normal((8, 1)).astype("float32")


def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6, 3)), keras.layers.Masking(0.0), pk.LSTM(5),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


single = build()
one = single.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2
with strategy.scope():
    mirrored = build()
two = mirrored.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
assert mirrored.layers[1].runs_on_our_op(training=True)
np.testing.assert_allclose(two, one, rtol=1e-5)
for a, b in zip(mirrored.get_weights(), single.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
print("same", one, two)
