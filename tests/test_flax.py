"""pycudnnrnn.flax: the NNX modules held against Flax's own ``nnx.RNN`` cells (CPU here).

The reference is Flax itself: the same weights in ``OptimizedLSTMCell``/``LSTMCell``,
``GRUCell`` or ``SimpleCell`` layers run by ``nnx.RNN`` / ``nnx.Bidirectional`` (a
``lax.scan``), against one call of our op. The two take different paths, so they agree
within float32 tolerance, and only where Flax's answer is defined: Flax keeps computing
past a sequence's end and picks the carry at ``length - 1`` (for length 0, the last step),
so padded steps and empty sequences are checked against the contract instead (outputs 0,
carry = the initial carry).
"""

import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")
import jax.numpy as jnp  # noqa: E402

from pycudnnrnn import flax as rnn_flax  # noqa: E402
from pycudnnrnn.flax import blocks as _blocks  # noqa: E402
from pycudnnrnn.flax import cells as _cells  # noqa: E402

B, T, I, H = 3, 5, 3, 4
LENGTHS = {"full": None, "ragged": [5, 2, 4], "zero": [3, 0, 5]}
TOL = dict(rtol=2e-5, atol=2e-5)

CLASSES = {"lstm": rnn_flax.LSTM, "lstm_cell": rnn_flax.LSTM, "gru": rnn_flax.GRU,
           "rnn_tanh": rnn_flax.SimpleRNN, "rnn_relu": rnn_flax.SimpleRNN}


class Stack(nnx.Module):
    """Flax layers (cells or nnx.Bidirectional), run in order as the reference network."""

    def __init__(self, layers):
        self.layers = nnx.List(layers)

    def __call__(self, x, seq_lengths=None, initial_carry=None):
        carries = []
        for i, layer in enumerate(self.layers):
            run = layer if isinstance(layer, nnx.Bidirectional) else nnx.RNN(layer)
            carry, x = run(x, seq_lengths=seq_lengths, return_carry=True,
                           initial_carry=None if initial_carry is None else initial_carry[i])
            carries.append(carry)
        return tuple(carries), x


# Flax's reference, jitted: eager nnx.RNN compiles its scan anew at every call.
run_stack = nnx.jit(lambda stack, x, seq_lengths: stack(x, seq_lengths=seq_lengths))


def flax_cell(mode, in_features, rngs):
    kind = {"lstm": nnx.OptimizedLSTMCell, "lstm_cell": nnx.LSTMCell, "gru": nnx.GRUCell}
    if mode.startswith("rnn_"):
        act = nnx.relu if mode == "rnn_relu" else nnx.tanh
        return nnx.SimpleCell(in_features, H, activation_fn=act, dtype=None, rngs=rngs)
    return kind[mode](in_features, H, rngs=rngs)


def flax_layers(mode, num_layers, bidirectional, seed=0):
    """Flax cells, layer by layer as a Flax user stacks them, with random weights and
    nonzero biases (a fresh cell's are zero and would hide a misplaced bias). The cells
    are built abstract and filled from NumPy: Flax's initializers (tested apart) would
    only cost compile time here."""
    rng, D = np.random.default_rng(seed), 2 if bidirectional else 1
    layers = []
    for layer in range(num_layers):
        width = I if layer == 0 else D * H
        cells = [nnx.eval_shape(lambda: flax_cell(mode, width, nnx.Rngs(0))) for _ in range(D)]
        for cell in cells:
            for path, var in nnx.iter_graph(cell):
                if isinstance(var, nnx.Param):
                    scale = 0.3 if path[-1] == "bias" else var.shape[0] ** -0.5
                    var.set_value(jnp.asarray(scale * rng.standard_normal(var.shape),
                                              jnp.float32))
        layers.append(cells[0] if D == 1 else
                      nnx.Bidirectional(nnx.RNN(cells[0]), nnx.RNN(cells[1])))
    return layers


def as_module(module, grads):
    """`module` with its nnx.Param values replaced by `grads` (a copy)."""
    graphdef, _, rest = nnx.split(module, nnx.Param, ...)
    return nnx.merge(graphdef, grads, rest)


def our_carry_to_flax(carry, num_layers):
    """Our carry (a layer's carry alone when num_layers == 1) as Stack's per-layer tuple."""
    return (carry,) if num_layers == 1 else carry


def random_carry(module, key):
    return module.initialize_carry((B, module.in_features), rngs=nnx.Rngs(carry=key),
                                   carry_init=jax.nn.initializers.normal(1.0))


def valid_mask(lengths):
    if lengths is None:
        return jnp.ones((B, T, 1))
    return (jnp.arange(T)[None, :] < jnp.asarray(lengths)[:, None])[..., None].astype(jnp.float32)


def valid_rows(lengths):
    return np.ones(B, bool) if lengths is None else np.asarray(lengths) > 0


CASES = {  # every mode, uni and bidirectional, 1 and 2 layers, each kind of lengths
    "lstm-2layer-bi-zero": ("lstm", 2, True, "zero"),
    "lstmcell-2layer-ragged": ("lstm_cell", 2, False, "ragged"),
    "gru-2layer-bi-zero": ("gru", 2, True, "zero"),
    "rnn_tanh-2layer-zero": ("rnn_tanh", 2, False, "zero"),
    "rnn_relu-bi-full": ("rnn_relu", 1, True, "full"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_flax_outputs_carry_and_gradients(name):
    """Outputs at valid steps, final carries and gradients (inputs, initial carry, every
    weight) equal Flax's on the same weights; padded steps are 0 and an empty sequence
    keeps its initial carry."""
    mode, L, bi, lengths_key = CASES[name]
    layers = flax_layers(mode, L, bi)
    ours = CLASSES[mode].from_flax(layers)
    reference = Stack(layers)
    lengths = LENGTHS[lengths_key]
    seq = None if lengths is None else jnp.asarray(lengths, jnp.int32)
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, I))
    carry0 = random_carry(ours, jax.random.PRNGKey(2))
    mask, rows = valid_mask(lengths), valid_rows(lengths)
    w_out = jax.random.normal(jax.random.PRNGKey(3), (B, T, (2 if bi else 1) * H))

    def loss(outputs, carry):
        leaves = jax.tree.leaves(carry)
        return jnp.sum(outputs * mask * w_out) + sum(
            jnp.sum(leaf[rows] * (i + 1)) for i, leaf in enumerate(leaves))

    def ours_loss(model, x, carry0):
        carry, y = model(x, seq_lengths=seq, initial_carry=carry0, return_carry=True)
        return loss(y, our_carry_to_flax(carry, L)), (carry, y)

    def flax_loss(model, x, carry0):
        carry, y = model(x, seq_lengths=seq, initial_carry=our_carry_to_flax(carry0, L))
        return loss(y, carry), (carry, y)

    grad = lambda f: nnx.jit(nnx.grad(f, argnums=(0, 1, 2), has_aux=True))
    (g_ours, gx_ours, gc_ours), (carry, y) = grad(ours_loss)(ours, x, carry0)
    (g_flax, gx_flax, gc_flax), (carry_f, y_f) = grad(flax_loss)(reference, x, carry0)

    np.testing.assert_allclose(y * mask, y_f * mask, **TOL)
    np.testing.assert_array_equal(y * (1 - mask), 0)
    for a, b, start in zip(jax.tree.leaves(our_carry_to_flax(carry, L)), jax.tree.leaves(carry_f),
                           jax.tree.leaves(our_carry_to_flax(carry0, L))):
        np.testing.assert_allclose(a[rows], b[rows], **TOL)
        np.testing.assert_allclose(a[~rows], start[~rows], **TOL)  # length 0: unchanged
    np.testing.assert_allclose(gx_ours, gx_flax, **TOL)
    for a, b in zip(jax.tree.leaves(gc_ours), jax.tree.leaves(our_carry_to_flax(gc_flax, L))):
        np.testing.assert_allclose(a, b, **TOL)
    # Weight gradients: Flax's, read through the same conversion as its weights.
    ours_blocks = _blocks.unpack(g_ours.params[...], ours._config())
    flax_cells = [c for layer in as_module(reference, g_flax).layers
                  for c in ([layer.forward_rnn.cell, layer.backward_rnn.cell]
                            if isinstance(layer, nnx.Bidirectional) else [layer])]
    assert len(flax_cells) == len(ours_blocks)
    for mine, cell in zip(ours_blocks, flax_cells):
        theirs = _cells.cell_blocks(cell)
        np.testing.assert_allclose(mine.kernel_i, theirs.kernel_i, **TOL)
        np.testing.assert_allclose(mine.kernel_h, theirs.kernel_h, **TOL)
        if mode.startswith("lstm"):  # Flax's one bias is the sum of cuDNN's two
            np.testing.assert_allclose(mine.bias_h, theirs.bias_h, **TOL)
            np.testing.assert_allclose(mine.bias_i, theirs.bias_h, **TOL)
        else:  # Flax's one bias is the input bias
            np.testing.assert_allclose(mine.bias_i, theirs.bias_i, **TOL)


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_fresh_module_is_initialized_as_flax_cells(mode):
    """A fresh module draws Flax's initializers in its cells' order: from equal nnx.Rngs
    it starts where a stack of Flax cells built in order starts (LeCun normal input
    kernels, orthogonal recurrent kernels, zero biases)."""
    cls = CLASSES[mode]
    extra = {"activation": "tanh"} if mode == "rnn_tanh" else {}
    ours = cls(I, H, num_layers=2, bidirectional=True, rngs=nnx.Rngs(7), **extra)
    rngs = nnx.Rngs(7)
    cells = [flax_cell(mode, I if k < 2 else 2 * H, rngs) for k in range(4)]
    layers = [nnx.Bidirectional(nnx.RNN(cells[0]), nnx.RNN(cells[1])),
              nnx.Bidirectional(nnx.RNN(cells[2]), nnx.RNN(cells[3]))]
    np.testing.assert_allclose(ours.params[...], cls.from_flax(layers).params[...],
                               rtol=1e-6, atol=1e-7)
    kernel_h = _blocks.unpack(ours.params[...], ours._config())[0].kernel_h
    G = kernel_h.shape[1] // H
    np.testing.assert_allclose(kernel_h @ kernel_h.T, np.eye(H), atol=1e-5)  # orthogonal rows
    assert G == {"lstm": 4, "gru": 3, "rnn_tanh": 1}[mode]


@pytest.mark.parametrize("mode, num_layers, bidirectional",
                         [("lstm", 2, True), ("lstm_cell", 1, False), ("gru", 2, True),
                          ("rnn_relu", 1, False)])
def test_to_flax_gives_the_cells_back(mode, num_layers, bidirectional):
    """from_flax then to_flax returns Flax's weights exactly; after training (nonzero
    recurrent biases of every kind) to_flax still computes what the module computes."""
    layers = flax_layers(mode, num_layers, bidirectional)
    ours = CLASSES[mode].from_flax(layers)
    back = ours.to_flax(cell_type=nnx.LSTMCell if mode == "lstm_cell" else None)
    assert [type(b) for b in back] == [type(layer) for layer in layers]
    for a, b in zip(nnx.to_flat_state(nnx.state(Stack(layers), nnx.Param)),
                    nnx.to_flat_state(nnx.state(Stack(back), nnx.Param))):
        assert a[0] == b[0]
        np.testing.assert_array_equal(a[1][...], b[1][...])
    # Every bias of cuDNN's buffer nonzero, as training leaves it (GRU: b_Rh too).
    flat = ours.params[...]
    noise = 0.2 * jax.random.normal(jax.random.PRNGKey(5), flat.shape)
    ours.params[...] = flat + noise
    x = jax.random.normal(jax.random.PRNGKey(6), (B, T, I))
    seq = jnp.asarray(LENGTHS["ragged"], jnp.int32)
    mask = valid_mask(LENGTHS["ragged"])
    _, y_flax = run_stack(Stack(ours.to_flax()), x, seq)
    np.testing.assert_allclose(ours(x, seq_lengths=seq) * mask, y_flax * mask, **TOL)


def test_extra_batch_dims_time_major_and_unbatched():
    """Any number of batch dimensions (none too) and time-major inputs, as nnx.RNN."""
    cell = flax_layers("gru", 1, False)[0]
    ours = rnn_flax.GRU.from_flax(cell)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, T, I))
    np.testing.assert_allclose(ours(x), nnx.RNN(cell)(x), **TOL)
    x_tm = jnp.moveaxis(x, 2, 0)
    np.testing.assert_allclose(ours(x_tm, time_major=True),
                               nnx.RNN(cell, time_major=True)(x_tm), **TOL)
    carry, y = ours(x[0, 0], return_carry=True)
    carry_f, y_f = nnx.RNN(cell, return_carry=True)(x[0, 0])
    assert y.shape == (T, H) and carry.shape == (H,)
    np.testing.assert_allclose(carry, carry_f, **TOL)


# --------------------------------------------------------------------------- training

def test_jitted_training_step_lowers_the_loss():
    """nnx.jit + nnx.value_and_grad + nnx.Optimizer (optax), with dropout on."""
    optax = pytest.importorskip("optax")
    model = rnn_flax.LSTM(I, H, num_layers=2, dropout_rate=0.2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(2e-2), wrt=nnx.Param)
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, I))
    target = jnp.tanh(jnp.cumsum(x, axis=1))[..., :1]
    seq = jnp.asarray(LENGTHS["zero"], jnp.int32)

    def mse(model, seq):
        return jnp.mean((model(x, seq_lengths=seq)[..., :1] - target) ** 2)

    @nnx.jit
    def step(model, optimizer, seq):  # seq_lengths traced: an operand of the op
        value, grads = nnx.value_and_grad(mse)(model, seq)
        optimizer.update(model, grads)
        return value

    model.eval()
    before = mse(model, seq)
    model.train()
    for _ in range(15):
        step(model, optimizer, seq)
    model.eval()
    assert float(mse(model, seq)) < 0.8 * float(before)


def test_vmap_and_scan_over_batches():
    """nnx.vmap over a stack of batches and nnx.scan over chunks of time (the carry
    carried) give what one call gives; gradients flow through both."""
    model = rnn_flax.SimpleRNN(I, H, num_layers=2, rngs=nnx.Rngs(0))
    xs = jax.random.normal(jax.random.PRNGKey(1), (4, B, T, I))

    mapped = nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(model, xs)
    whole = model(xs.reshape(4 * B, T, I)).reshape(4, B, T, H)
    np.testing.assert_allclose(mapped, whole, **TOL)

    @nnx.scan(in_axes=(None, nnx.Carry, 0), out_axes=(nnx.Carry, 0))
    def chunk(m, carry, x):
        carry, y = m(x, initial_carry=carry, return_carry=True)
        return carry, y

    x = xs[0]
    chunks = jnp.stack([x[:, :2], x[:, 2:4]])  # two chunks of 2 steps
    carry, ys = chunk(model, model.initialize_carry((B, I)), chunks)
    carry_whole, y_whole = model(x[:, :4], return_carry=True)
    np.testing.assert_allclose(jnp.concatenate(list(ys), axis=1), y_whole, **TOL)
    for a, b in zip(jax.tree.leaves(carry), jax.tree.leaves(carry_whole)):
        np.testing.assert_allclose(a, b, **TOL)

    mapped_sum = lambda m: jnp.sum(nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(m, xs))
    grads = nnx.grad(mapped_sum)(model)
    grads_whole = nnx.grad(lambda m: jnp.sum(m(xs.reshape(4 * B, T, I))))(model)
    np.testing.assert_allclose(grads.params[...], grads_whole.params[...], rtol=1e-4, atol=1e-4)


def test_dropout_semantics():
    """Eval is deterministic (and Flax's stack); in training masks come from the rngs,
    change from call to call (also under nnx.jit), and with the same masks between layers
    values and gradients equal Flax's stack (so the layer-by-layer path is the network)."""
    layers = flax_layers("lstm", 2, True)
    model = rnn_flax.LSTM.from_flax(layers, dropout_rate=0.5, rngs=nnx.Rngs(dropout=3))
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, I))
    seq = jnp.asarray(LENGTHS["zero"], jnp.int32)
    mask = valid_mask(LENGTHS["zero"])
    eval_y = model(x, seq_lengths=seq, deterministic=True)
    np.testing.assert_allclose(eval_y * mask, run_stack(Stack(layers), x, seq)[1] * mask, **TOL)
    np.testing.assert_array_equal(nnx.view(model, deterministic=True)(x, seq_lengths=seq), eval_y)

    train = nnx.jit(lambda m: m(x, seq_lengths=seq))
    first, second = train(model), train(model)  # the stream advances inside nnx.jit
    assert not np.allclose(first, second) and not np.allclose(first, eval_y)

    # The masks are nnx.Dropout's (keep 1 - rate, scale 1 / keep) on each later layer's
    # input, from one key split per layer.
    key = jax.random.PRNGKey(9)
    keys = jax.random.split(key, 1)

    def reference(layers, x):
        for i, layer in enumerate(layers):
            if i:
                keep = jax.random.bernoulli(keys[i - 1], 0.5, x.shape)
                x = jnp.where(keep, x / 0.5, 0)
            x = layer(x, seq_lengths=seq)
        return x

    ours_loss = lambda m: jnp.sum(m(x, seq_lengths=seq, rngs=key) * mask)
    flax_loss = lambda s: jnp.sum(reference(s.layers, x) * mask)
    stack = Stack(layers)
    (loss_ours, g_ours), (loss_flax, g_flax) = (nnx.jit(nnx.value_and_grad(ours_loss))(model),
                                                nnx.jit(nnx.value_and_grad(flax_loss))(stack))
    np.testing.assert_allclose(loss_ours, loss_flax, rtol=1e-5)
    g_ours = g_ours.params[...]
    g_flax = rnn_flax.LSTM.from_flax(list(as_module(stack, g_flax).layers))
    g_flax = g_flax.params[...]
    for mine, theirs in zip(_blocks.unpack(g_ours, model._config()),
                            _blocks.unpack(g_flax, model._config())):
        np.testing.assert_allclose(mine.kernel_i, theirs.kernel_i, **TOL)
        np.testing.assert_allclose(mine.bias_h, theirs.bias_h, **TOL)


def _no_rngs_model():
    model = rnn_flax.GRU(I, H, num_layers=2, dropout_rate=0.5, rngs=nnx.Rngs(0))
    model.rngs = nnx.data(None)
    return model


def test_state_save_and_restore_with_orbax(tmp_path):
    """nnx.state → Orbax checkpoint → a fresh (abstract) module: the same network."""
    ocp = pytest.importorskip("orbax.checkpoint")
    model = rnn_flax.GRU(I, H, num_layers=2, bidirectional=True, dropout_rate=0.1,
                         rngs=nnx.Rngs(0))
    model.params[...] = model.params[...] + 0.1
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", nnx.state(model))
    checkpointer.wait_until_finished()
    abstract = nnx.eval_shape(lambda: rnn_flax.GRU(I, H, num_layers=2, bidirectional=True,
                                                   dropout_rate=0.1, rngs=nnx.Rngs(1)))
    graphdef, abstract_state = nnx.split(abstract)
    restored = nnx.merge(graphdef, checkpointer.restore(tmp_path / "state", abstract_state))
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, I))
    np.testing.assert_array_equal(restored(x, deterministic=True), model(x, deterministic=True))
    np.testing.assert_array_equal(restored(x), model(x))  # the dropout stream's count too


# --------------------------------------------------------------------------- dtypes, projection

def test_bfloat16_through_the_module():
    """dtype=bfloat16 computes in bfloat16 (outputs and carry), close to float32;
    gradients reach the float32 params."""
    model = rnn_flax.LSTM.from_flax(flax_layers("lstm", 2, True))
    half = rnn_flax.LSTM.from_flax(flax_layers("lstm", 2, True))
    half.dtype = jnp.bfloat16
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, I))
    carry16, y16 = half(x, return_carry=True)
    assert y16.dtype == jnp.bfloat16 and jax.tree.leaves(carry16)[0].dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float32), model(x), rtol=3e-2, atol=3e-2)
    g16 = nnx.grad(lambda m: jnp.sum(m(x).astype(jnp.float32)))(half).params[...]
    g32 = nnx.grad(lambda m: jnp.sum(m(x)))(model).params[...]
    assert g16.dtype == jnp.float32
    np.testing.assert_allclose(g16, g32, rtol=0.1, atol=0.1)
    fresh = rnn_flax.GRU(I, H, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert fresh.params.dtype == jnp.bfloat16 and fresh(x).dtype == jnp.bfloat16


def _projected_lstm_reference(params, cfg, x, carry0):
    """The LSTM with projection of the contract, step by step in jnp (one direction,
    one layer): h' = W_p (o ⊙ tanh(c'))."""
    b = _blocks.unpack(params, cfg)[0]
    c, h = carry0
    ys = []
    for t in range(x.shape[1]):
        gates = x[:, t] @ b.kernel_i + b.bias_i + h @ b.kernel_h + b.bias_h
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = (jax.nn.sigmoid(o) * jnp.tanh(c)) @ b.kernel_p
        ys.append(h)
    return (c, h), jnp.stack(ys, axis=1)


def test_projection():
    """num_proj: outputs and h have width num_proj, c width hidden_features; values and
    gradients against the contract's equations; to_flax refuses (Flax has no projection)."""
    model = rnn_flax.LSTM(I, H, num_proj=2, rngs=nnx.Rngs(0))
    model.params[...] = model.params[...] + 0.1  # nonzero biases
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, I))
    carry0 = random_carry(model, jax.random.PRNGKey(2))
    assert carry0[0].shape == (B, H) and carry0[1].shape == (B, 2)
    carry, y = model(x, initial_carry=carry0, return_carry=True)
    reference = jax.jit(lambda p: _projected_lstm_reference(p, model._config(), x, carry0))
    carry_r, y_r = reference(model.params[...])
    np.testing.assert_allclose(y, y_r, **TOL)
    for a, b in zip(carry, carry_r):
        np.testing.assert_allclose(a, b, **TOL)
    g = nnx.grad(lambda m: jnp.sum(m(x, initial_carry=carry0) ** 2))(model).params[...]
    g_r = jax.jit(jax.grad(lambda p: jnp.sum(reference(p)[1] ** 2)))(model.params[...])
    np.testing.assert_allclose(g, g_r, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="num_proj"):
        model.to_flax()


# --------------------------------------------------------------------------- errors

def test_bad_arguments_name_themselves():
    model = rnn_flax.LSTM(I, H, num_layers=2, bidirectional=True, rngs=nnx.Rngs(0))
    x = jnp.ones((B, T, I))
    with pytest.raises(ValueError, match="inputs: expected 3 features"):
        model(jnp.ones((B, T, I + 1)))
    with pytest.raises(ValueError, match="inputs: expected"):
        model(jnp.ones((I,)))
    with pytest.raises(ValueError, match="seq_lengths: expected shape"):
        model(x, seq_lengths=jnp.array([1, 2]))
    with pytest.raises(TypeError, match="seq_lengths: expected integers"):
        model(x, seq_lengths=jnp.array([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="sequence_lengths"):
        model(x, seq_lengths=jnp.array([1, 9, 3]))
    carry = model.initialize_carry((B, I))
    with pytest.raises(ValueError, match=r"initial_carry: expected a tuple of 2 \(one per layer"):
        model(x, initial_carry=(carry[0],))
    with pytest.raises(ValueError, match=r"initial_carry\[0\]\[1\]: an LSTM carry is Flax's"):
        model(x, initial_carry=(carry[0][:1] + (carry[0][1][1],), carry[1]))
    bad = (carry[0], ((carry[1][0][0], carry[1][0][1][:, :2]), carry[1][1]))
    with pytest.raises(ValueError, match=r"initial_carry\[1\]\[0\]\[1\] \(h\): expected shape"):
        model(x, initial_carry=bad)
    with pytest.raises(ValueError, match="num_proj"):
        rnn_flax.LSTM(I, H, num_proj=H, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError):
        rnn_flax.GRU(I, H, num_proj=2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="dropout_rate"):
        rnn_flax.GRU(I, H, dropout_rate=1.0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="activation"):
        rnn_flax.SimpleRNN(I, H, activation="sigmoid", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="hidden_features"):
        rnn_flax.LSTM(I, 0, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="dtype"):
        rnn_flax.LSTM(I, H, dtype=jnp.int32, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="rngs"):
        _no_rngs_model()(x)


def test_from_flax_refuses_what_cudnn_does_not_compute():
    rngs = nnx.Rngs(0)
    with pytest.raises(TypeError, match="GRUCell"):
        rnn_flax.GRU.from_flax(nnx.OptimizedLSTMCell(I, H, rngs=rngs))
    with pytest.raises(ValueError, match="residual"):
        rnn_flax.SimpleRNN.from_flax(nnx.SimpleCell(I, H, residual=True, rngs=rngs))
    with pytest.raises(ValueError, match="gate_fn"):
        rnn_flax.LSTM.from_flax(nnx.LSTMCell(I, H, gate_fn=nnx.hard_sigmoid, rngs=rngs))
    with pytest.raises(ValueError, match=r"layers\[1\]: expected a cell with in_features=4"):
        rnn_flax.LSTM.from_flax([nnx.LSTMCell(I, H, rngs=rngs), nnx.LSTMCell(3, H, rngs=rngs)])
    with pytest.raises(ValueError, match="mix"):
        rnn_flax.GRU.from_flax([nnx.Bidirectional(nnx.RNN(nnx.GRUCell(I, H, rngs=rngs)),
                                                  nnx.RNN(nnx.GRUCell(I, H, rngs=rngs))),
                                nnx.GRUCell(2 * H, H, rngs=rngs)])
    with pytest.raises(ValueError, match="reverse"):
        rnn_flax.GRU.from_flax([nnx.RNN(nnx.GRUCell(I, H, rngs=rngs), reverse=True)])
    with pytest.raises(TypeError, match="layers"):
        rnn_flax.GRU.from_flax([nnx.Linear(I, H, rngs=rngs)])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_gpu_module_equals_the_cpu_module(mode):
    """On a CUDA device (cuDNN) the module gives the CPU's outputs, carry and gradients
    (no TF32: float32 throughout)."""
    try:
        gpu = jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("JAX has no CUDA device")
    model = CLASSES[mode].from_flax(flax_layers(mode, 2, True))
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, I))
    seq = jnp.asarray(LENGTHS["zero"], jnp.int32)

    def loss(model, x, seq):
        carry, y = model(x, seq_lengths=seq, return_carry=True)
        return jnp.sum(y ** 2) + sum(jnp.sum(c ** 2) for c in jax.tree.leaves(carry)), (carry, y)

    step = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    (_, cpu_aux), cpu_grads = step(model, x, seq)
    graphdef, state = nnx.split(model)
    on_gpu = nnx.merge(graphdef, jax.device_put(state, gpu))
    (_, gpu_aux), gpu_grads = step(on_gpu, jax.device_put(x, gpu), jax.device_put(seq, gpu))
    assert list(gpu_aux[1].devices())[0].platform == "gpu"
    for a, b in zip(jax.tree.leaves((gpu_aux, gpu_grads)), jax.tree.leaves((cpu_aux, cpu_grads))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-4)


def test_docs_examples_run():
    """The Python examples of docs/flax.md run, in order, as shown."""
    pytest.importorskip("optax")
    import re
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "docs", "flax.md")
    blocks = re.findall(r"```python\n(.*?)```", open(path, encoding="utf-8").read(), flags=re.S)
    assert len(blocks) >= 3
    namespace = {}
    for block in blocks:
        exec(compile(block, path, "exec"), namespace)
    assert namespace["losses"][-1] < namespace["losses"][0]



# --------------------------------------------------------------------------- lengths

@pytest.mark.parametrize("lengths, dtype, shown", [
    ([2 ** 32 + 3, 2, 1], "int64", "4294967299"),  # wrapped to 3 by an int32 cast, and ran
    ([2 ** 31 + 1, 2, 1], "uint32", "2147483649"),  # refused as "got -2147483647"
    ([-1, 2, 1], "int64", "-1"),
])
def test_lengths_out_of_range_are_refused_as_given(lengths, dtype, shown):
    model = rnn_flax.LSTM(I, H, rngs=nnx.Rngs(0))
    x = jnp.ones((B, T, I))
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match=rf"got {shown}\b"):
            model(x, seq_lengths=np.array(lengths, dtype))
        y = model(x, seq_lengths=np.array([T, 2, 0], dtype))  # in range, any integer type
    np.testing.assert_allclose(y, model(x, seq_lengths=jnp.array([T, 2, 0])), **TOL)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_a_bad_batch_under_nnx_jit_leaves_the_module_usable(mode):
    """A traced length out of range used to fail the computation, whose failed arrays
    nnx.jit then wrote into the module: every later call, and model.params, raised."""
    model = CLASSES[mode](I, H, num_layers=2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, __import__("optax").sgd(0.1), wrt=nnx.Param)
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, I))

    @nnx.jit
    def step(model, optimizer, x, lengths):
        def loss(model):
            carry, y = model(x, seq_lengths=lengths, return_carry=True)
            return jnp.mean(y ** 2), (carry, y)
        (value, (carry, y)), grads = nnx.value_and_grad(loss, has_aux=True)(model)
        optimizer.update(model, grads)
        return value, carry, y

    good = jnp.array([T, 2, 3])
    before = np.asarray(model.params[...])
    want = model(x, seq_lengths=good)
    with pytest.warns(RuntimeWarning, match=r"seq_lengths: expected values in \[0, 5\].*"
                                            r"got 9 at index 1"):
        value, carry, y = step(model, optimizer, x, jnp.array([T, 9, 3]))
        jax.block_until_ready(y)
    y = np.asarray(y)
    assert np.isnan(value) and np.isnan(y[1]).all() and not np.isnan(y[[0, 2]]).any()
    assert all(np.isnan(np.asarray(leaf)[1]).all() and not np.isnan(np.asarray(leaf)[[0, 2]]).any()
               for leaf in jax.tree.leaves(carry)), "the carry of that row alone"
    params = np.asarray(model.params[...])  # readable, finite: the other rows' gradient
    assert np.isfinite(params).all() and not np.array_equal(params, before)
    model.params[...] = before
    np.testing.assert_allclose(model(x, seq_lengths=good), want, **TOL)  # eager, and
    value, _, y = step(model, optimizer, x, good)  # jitted again
    np.testing.assert_allclose(y, want, **TOL)


def test_traced_lengths_leave_no_host_callback_in_the_cpu_program():
    """The warning for a bad traced length is an FFI call on the CPU: a host callback,
    even one never called, put every call on JAX's slower dispatch (~0.6 ms a small
    training step, a third of it)."""
    model = CLASSES["gru"](I, H, rngs=nnx.Rngs(0))
    graph, state = nnx.split(model)
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, I))
    call = lambda state, lengths: nnx.merge(graph, state)(x, seq_lengths=lengths)  # noqa: E731
    text = jax.jit(call).lower(state, jnp.array([T, 2, 3])).as_text()
    assert "pycudnnrnn_warn_lengths" in text and "callback" not in text


# --------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("mode", ["lstm", "lstm_cell", "gru", "rnn_tanh"])
def test_one_cell_in_one_cell_of_its_class_out(mode):
    cell = flax_cell(mode, I, nnx.Rngs(0))
    back = CLASSES[mode].from_flax(cell).to_flax()
    assert type(back) is type(cell)
    for a, b in zip(nnx.to_flat_state(nnx.state(cell, nnx.Param)),
                    nnx.to_flat_state(nnx.state(back, nnx.Param))):
        assert a[0] == b[0]
        np.testing.assert_array_equal(a[1][...], b[1][...])


def test_layers_come_back_in_their_own_form():
    """nnx.RNN stays nnx.RNN (its options too), a bare cell a cell, LSTMCell LSTMCell;
    through nnx.split/merge as well."""
    layers = [nnx.RNN(nnx.LSTMCell(I, H, rngs=nnx.Rngs(0)), time_major=True, unroll=2),
              nnx.LSTMCell(H, H, rngs=nnx.Rngs(1))]
    ours = rnn_flax.LSTM.from_flax(layers)
    graph, state = nnx.split(ours)
    back = nnx.merge(graph, state).to_flax()
    assert isinstance(back, list) and [type(b) for b in back] == [nnx.RNN, nnx.LSTMCell]
    assert type(back[0].cell) is nnx.LSTMCell and back[0].time_major and back[0].unroll == 2
    assert [type(c) for c in ours.to_flax(cell_type=nnx.OptimizedLSTMCell)[1:]] == \
        [nnx.OptimizedLSTMCell]  # asked for explicitly
    pair = [nnx.Bidirectional(nnx.RNN(flax_cell("gru", I, nnx.Rngs(2))),
                              nnx.RNN(flax_cell("gru", I, nnx.Rngs(3))), return_carry=True)]
    back = rnn_flax.GRU.from_flax(pair).to_flax()
    assert type(back[0]) is nnx.Bidirectional and back[0].return_carry
    built = rnn_flax.LSTM(I, H, num_layers=2, rngs=nnx.Rngs(0)).to_flax()  # not from Flax
    assert [type(b) for b in built] == [nnx.OptimizedLSTMCell] * 2


def test_known_lengths_out_of_range_are_refused_under_nnx_jit_too():
    """A NumPy constant inside nnx.jit reached the op unchecked (a tracer after asarray)."""
    model = rnn_flax.GRU(I, H, rngs=nnx.Rngs(0))
    x = jnp.ones((B, T, I))
    call = nnx.jit(lambda m, x: m(x, seq_lengths=np.array([T + 4, 2, 1])))
    with pytest.raises(ValueError, match=r"got 9 at index 0"):
        call(model, x)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16"])
def test_traced_narrow_lengths_are_compared_without_wrapping(dtype):
    """int8 lengths against max_time 200 wrapped: valid rows came out NaN."""
    model = rnn_flax.LSTM(I, H, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 200, I))
    lengths = jnp.asarray([100, 2], dtype)
    y = nnx.jit(lambda m, x, l: m(x, seq_lengths=l))(model, x, lengths)
    assert not np.isnan(np.asarray(y)).any()
    np.testing.assert_allclose(y, model(x, seq_lengths=np.array([100, 2])), **TOL)
