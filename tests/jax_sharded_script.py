"""pycudnnrnn.jax under shard_map and pmap on two CPU devices; run by test_jax.py.

A script of its own: the device count must be set before JAX starts its backends, which
the test process has done already. Prints "ok" when every check passed.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import pycudnnrnn  # noqa: E402
from pycudnnrnn import jax as prj  # noqa: E402

assert len(jax.devices()) == 2, jax.devices()
T, B, I, H, L = 5, 4, 3, 4, 2
rng = np.random.default_rng(0)
lstm = dict(rnn_mode="lstm", direction="bidirectional")
size = dict(num_layers=L, num_units=H, input_size=I)
x = rng.standard_normal((T, B, I), dtype=np.float32)
h = rng.standard_normal((2 * L, B, H), dtype=np.float32)
c = rng.standard_normal((2 * L, B, H), dtype=np.float32)
params = rng.uniform(-0.5, 0.5, pycudnnrnn.params_size(**lstm, **size)).astype(np.float32)
lengths = np.array([5, 0, 3, 2], np.int32)
mesh = jax.make_mesh((2,), ("b",))
batch = P(None, "b")  # [T, B, ...] and [L·D, B, ...]: split the batch


def put(a, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def close(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


# training: values and gradients; params is replicated, so JAX sums its gradient over "b"
def loss(params, x, h, c, lengths):
    output, output_h, output_c = prj.rnn(x, h, c, params, lengths, **lstm)
    return (output ** 2).sum() + (output_h * output_c).sum()


def local(params, x, h, c, lengths):
    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(params, x, h, c, lengths)
    return jax.lax.psum(value, "b"), *grads


sharded = jax.jit(jax.shard_map(local, mesh=mesh,
                                in_specs=(P(), batch, batch, batch, P("b")),
                                out_specs=(P(), P(), batch)))
got = sharded(put(params, P()), put(x, batch), put(h, batch), put(c, batch),
              put(lengths, P("b")))
value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x, h, c, lengths)
for g, w in zip(got, (value, *grads)):
    close(g, w)

# inference, a GRU without lengths
gru = dict(rnn_mode="gru", is_training=False)
gru_params = params[:pycudnnrnn.params_size(rnn_mode="gru", **size)]
infer = jax.jit(jax.shard_map(lambda p, x, h: prj.rnn(x, h, None, p, **gru)[:2], mesh=mesh,
                              in_specs=(P(), batch, batch), out_specs=(batch, batch)))
got = infer(put(gru_params, P()), put(x, batch), put(h[:L], batch))
for g, w in zip(got, prj.rnn(x, h[:L], None, gru_params, **gru)[:2]):
    close(g, w)

# pmap over the two halves of the batch
def halves(a, axis):
    return np.stack(np.split(a, 2, axis=axis))


outputs = jax.pmap(lambda x, h, c, n: prj.rnn(x, h, c, params, n, **lstm)[0])(
    halves(x, 1), halves(h, 1), halves(c, 1), halves(lengths, 0))
close(np.concatenate(list(np.asarray(outputs)), axis=1),
      prj.rnn(x, h, c, params, lengths, **lstm)[0])
# a second derivative through the custom calls (what a GPU runs), sharded as one call
prj.scan.applies = lambda problem: False


def penalty(params, x, h, c, lengths):
    g = jax.grad(loss, argnums=1)(params, x, h, c, lengths)
    return (g ** 2).sum()


sharded = jax.jit(jax.shard_map(  # params replicated: its gradient is summed over "b"
    jax.grad(penalty), mesh=mesh,
    in_specs=(P(), batch, batch, batch, P("b")), out_specs=P()))
got = sharded(put(params, P()), put(x, batch), put(h, batch), put(c, batch),
              put(lengths, P("b")))
close(got, jax.jit(jax.grad(penalty))(params, x, h, c, lengths))
print("ok")
