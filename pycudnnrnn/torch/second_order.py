"""Second-order gradients of the ops: what cuDNN has not, computed only when asked for.

cuDNN's RNN has a forward and a first-order backward, nothing more. The op's backward
stays cuDNN's (or the CPU kernels'). Where it runs with grad mode on (``create_graph=True``,
torch.func's transforms), the backprop op runs inside ``_FirstOrder``: an
``autograd.Function`` whose results are the op's gradients and whose own backward (and
``jvp``) runs only when something differentiates those gradients again (a gradient
penalty, a Hessian-vector product, MAML). That backward recomputes the call's forward on
PyTorch's twice-differentiable kernels, takes its first-order gradient with a graph, and
differentiates that. On the CPU those are its fused RNN kernels (``torch_kernels.rnn``).
On CUDA they would take PyTorch's cuDNN RNN, which has no second order either, unless
PyTorch's one process-wide cuDNN flag were off, which would change every thread's
kernels meanwhile: there the recompute runs a step at a time in differentiable ops
(``step_by_step``), which never consult cuDNN.

Why recompute then, rather than write backward in differentiable operations every time:
a first-order step (``create_graph`` off, or on with no second derivative taken) pays
nothing but an autograd node, and the second order comes from kernels PyTorch keeps
correct for every cell, direction, projection and ragged batch. The cost, paid once per
call differentiated twice, is a forward and a first-order backward on those kernels, and
their backward: about what PyTorch's path with cuDNN off spends on that call.

The forward's own forward-mode rule (``jvp``, for torch.func's ``jvp``, ``jacfwd`` and
``hessian``) is recomputed the same way (``forward_jvp``).

Dropout between layers is refused there: a multi-layer call draws its masks inside (cuDNN,
or the NumPy backend) and they cannot be read back, and a second derivative with other
masks would be the derivative of another function. Under ``second_order_dropout()`` the
forward runs a layer at a time with PyTorch's masks between (``layerwise``): each call
has no dropout, and autograd keeps the masks.
"""

from __future__ import annotations

import functools

import torch

from . import torch_kernels


def first_order(run, attributes, has_biases, data, weights, grads, extras):
    """``run(*data, weights, *grads, extras)``'s first-order gradients
    ``[dx, dh, dc, *weight_grads]`` (None where not computed), differentiable once more
    where a transform or ``create_graph`` may differentiate them (see the module docstring).

    `attributes`, `has_biases`: the forward's (``ops.call_forward``);
    `data`: ``(input, input_h, input_c)`` of the forward (input_c None unless LSTM);
    `weights`: ``[params]`` or torch.nn's list; `grads`: the output gradients backward was
    given (None for none); `extras`: the other tensors `run` needs (lengths, seed, the
    forward's results and reserve space), which are not differentiated.
    """
    inputs = (*data, *weights, *grads)
    transformed = torch._C._functorch.maybe_current_level() is not None
    if not transformed and not (torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)):
        return run(*data, weights, *grads, extras)
    call = _Call(run, attributes, has_biases, len(weights), extras[0], data[1])
    if not transformed and any(_legacy_batched(t) for t in inputs):
        return _recorded(call, data, weights, grads)
    results = _FirstOrder.apply(call, *inputs, *extras)
    results = iter(results if isinstance(results, tuple) else (results,))
    return [next(results) if p else None for p in call.present]


def _legacy_batched(t) -> bool:
    """Whether `t` is batched by torch.autograd's own vmap (``is_grads_batched=True``,
    ``vectorize=True``), which is not torch.func's."""
    return isinstance(t, torch.Tensor) and torch._C._functorch.is_legacy_batchedtensor(t)


def _recorded(call, data, weights, grads):
    """``first_order``'s results ``[dx, dh, dc, *weight_grads]`` (all of them), by
    autograd with a graph on PyTorch's kernels, recomputed.

    For tensors batched by torch.autograd's own vmap: its batched tensors keep a graph of
    the operators it dispatches, not of an ``autograd.Function`` (``_FirstOrder``'s node
    is lost when the batch is taken out). The inputs that require grad take part through
    aliases, so each result is a partial derivative (as in ``_by_autograd``).
    """
    refuse_dropout(call)
    inputs = [*data, *weights]
    aliases = [t.view_as(t) if _floating(t) and t.requires_grad else
               t.detach().requires_grad_() if _floating(t) else t for t in inputs]
    variables = [a for a in aliases if _floating(a)]
    with torch.enable_grad():
        outputs = recompute(call, aliases[:3], aliases[3:])
        used = [(o, g) for o, g in zip(outputs, grads) if _floating(g) and o.requires_grad]
        found = torch.autograd.grad([o for o, _ in used], variables, [g for _, g in used],
                                    create_graph=True, allow_unused=True) if used else \
            [None] * len(variables)
    found = iter(torch.zeros_like(v) if f is None else f for v, f in zip(variables, found))
    return [next(found) if _floating(t) else None for t in inputs]


class _Call:
    """One op call, as ``_FirstOrder`` needs it besides its tensors."""

    def __init__(self, run, attributes, has_biases, num_weights, sequence_lengths, input_h):
        self.attributes, self.has_biases = attributes, has_biases
        self.run, self.num_weights, self.sequence_lengths = run, num_weights, sequence_lengths
        self.num_layers = input_h.shape[0 if attributes.time_major else 1] // attributes.num_dirs
        self.present = None  # which first-order results the forward computed

    def split(self, args):
        """``(inputs, extras)`` of ``_FirstOrder``'s tensor arguments."""
        count = 3 + self.num_weights + 3
        return list(args[:count]), list(args[count:])


class _FirstOrder(torch.autograd.Function):
    """The first-order gradients as a function of the forward's inputs and the output
    gradients: the backprop op computes them; their derivatives (``backward``: vector-
    Jacobian, ``jvp``: Jacobian-vector) come from ``gradient``, recomputed.

    ``apply(call, *data, *weights, *grads, *extras)`` gives the present results.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(call, *args):
        inputs, extras = call.split(args)
        n = call.num_weights
        data, weights, grads = inputs[:3], inputs[3:3 + n], inputs[3 + n:]
        results = call.run(*data, weights, *grads, extras)
        call.present = [r is not None for r in results]
        return tuple(r for r in results if r is not None)

    @staticmethod
    def setup_context(ctx, inputs, output):
        call, args = inputs[0], inputs[1:]
        ctx.call = call
        tensors, _ = call.split(args)
        ctx.save_for_backward(*tensors)
        ctx.save_for_forward(*tensors)
        # A result nothing differentiates gets None, not zeros: its first order is then
        # not recomputed (``_by_autograd``).
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, *cotangents):
        differentiate = _by_autograd if torch._C._functorch.maybe_current_level() is None \
            else _by_functorch
        return _backward(ctx, cotangents, differentiate)

    @staticmethod
    def jvp(ctx, _, *tangents):
        call = ctx.call
        inputs = ctx.saved_tensors
        # Only the inputs with a tangent move.
        moving = [_floating(t) and d is not None for t, d in zip(inputs, tangents)]
        _, rebuild = _variables(inputs, moving)
        function = functools.partial(gradient, call, rebuild)
        found = _jvp(function, [t for t, m in zip(inputs, moving) if m],
                     [d for d, m in zip(tangents, moving) if m])
        found = _spread_results(found, inputs, call)
        return tuple(f for f, p in zip(found, call.present) if p)


def _backward(ctx, cotangents, differentiate):
    """``_FirstOrder.backward`` by `differentiate` (``_by_autograd`` or ``_by_functorch``)."""
    call = ctx.call
    inputs = ctx.saved_tensors
    cotangents = _first_results(_spread(cotangents, call.present), inputs, call)
    wanted = ctx.needs_input_grad[1:]
    found = iter(differentiate(call, inputs, cotangents))
    grads = [next(found) if _floating(t) else None for t in inputs]
    grads = [g if w else None for g, w in zip(grads, wanted)]
    return (None, *grads) + (None,) * (len(wanted) - len(inputs))


def _by_functorch(call, inputs, cotangents):
    """``gradient``'s vector-Jacobian product with `cotangents` (None for zero), one
    result per floating input, by torch.func (inside its transforms)."""
    variables, rebuild = _variables(inputs)
    results, pullback = torch.func.vjp(functools.partial(gradient, call, rebuild), *variables)
    return pullback(tuple(torch.zeros_like(r) if c is None else c
                          for r, c in zip(results, cotangents)))


def _by_autograd(call, inputs, cotangents):
    """``_by_functorch``'s product by autograd (outside torch.func's transforms), which
    PyTorch's kernels on packed rows (a ragged batch) take and torch.func does not.

    With grad mode on (this backward under ``create_graph=True``: a third derivative, or
    ``torch.autograd.functional.hvp``, which differentiates with respect to the
    cotangents) the results are differentiable in turn: the inputs that require grad
    take part through aliases (views) of them. Gradients are taken with respect to the
    aliases, so each is a partial derivative: a path from one input back to another
    (an output gradient computed from the outputs, and so from the input) does not
    pass through the other's alias, and is not counted here as well as by autograd.
    """
    refuse_dropout(call)
    # A pullback of torch.func.vjp called after its transform returned runs this on its
    # saved tensors, wrappers of a level now gone: their values, as autograd knows them
    # here (a wrapper's requires_grad is its gone level's; its view would not be).
    inputs = [_unwrap_if_dead(t) for t in inputs]
    cotangents = [_unwrap_if_dead(c) for c in cotangents]
    higher = torch.is_grad_enabled()
    leaves = [t if not _floating(t) else t.view_as(t) if higher and t.requires_grad
              else t.detach().requires_grad_() for t in inputs]
    n = call.num_weights
    data, weights, grads = leaves[:3], leaves[3:3 + n], leaves[3 + n:]
    primal = [t for t in (*data, *weights) if _floating(t)]
    with torch.enable_grad():
        outputs = recompute(call, data, weights)
        used = [(o, g) for o, g in zip(outputs, grads) if _floating(g) and o.requires_grad]
        # Only the first-order results something differentiates (a penalty on the input's
        # gradient leaves the weights' alone: their first order is not recomputed).
        needed = [(t, c) for t, c in zip(primal, cotangents) if c is not None]
        first = torch.autograd.grad([o for o, _ in used], [t for t, _ in needed],
                                    [g for _, g in used], create_graph=True,
                                    allow_unused=True) if needed and used else []
        pairs = [(f, c) for f, (_, c) in zip(first, needed)
                 if f is not None and f.requires_grad]
        variables = [t for t in leaves if _floating(t)]
        found = torch.autograd.grad([f for f, _ in pairs], variables, [c for _, c in pairs],
                                    allow_unused=True, create_graph=higher) \
            if pairs else [None] * len(variables)
    return [torch.zeros_like(v) if g is None else g for v, g in zip(variables, found)]


def forward_jvp(attributes, has_biases, data, sequence_lengths, weights, tangents):
    """The forward's ``(output, output_h, output_c)`` tangents (forward mode: torch.func's
    ``jvp``, ``jacfwd``, ``hessian``) for the `tangents` of `data` and `weights` (None for
    zero), recomputed on PyTorch's kernels."""
    data = (*data[:2], data[2] if attributes.lstm else None)
    call = _Call(None, attributes, has_biases, len(weights), sequence_lengths, data[1])
    refuse_dropout(call)
    inputs = [*data, *weights]
    moving = [_floating(t) and d is not None for t, d in zip(inputs, tangents)]
    variables, rebuild = _variables(inputs, moving)
    tangents = [d for d, m in zip(tangents, moving) if m]

    def forward(*variables):
        values = rebuild(variables)
        return tuple(recompute(call, values[:3], values[3:]))
    return _jvp(forward, variables, tangents)


def _jvp(function, primals, tangents):
    """`function`'s Jacobian-vector product at `primals`, by reverse mode twice: the
    vector-Jacobian product is linear in its vector, and its own vector-Jacobian
    product with `tangents` is the Jacobian's product with them. (Forward mode through
    PyTorch's RNN kernels fails under jacfwd's vmap: their in-place arithmetic meets
    batched tangents on unbatched states.)"""
    outputs, pullback = torch.func.vjp(function, *primals)
    vectors = tuple(torch.zeros_like(o) for o in outputs)
    _, pullback_twice = torch.func.vjp(lambda *v: pullback(v), *vectors)
    return pullback_twice(tuple(tangents))


def gradient(call, rebuild, *variables):
    """The first-order gradients ``vjp`` of the forward at the data and weights, with the
    output gradients, all among `variables` (``rebuild`` puts back the absent ones): one
    per floating data and weight input, in order, recomputed on PyTorch's kernels."""
    refuse_dropout(call)
    inputs = rebuild(variables)
    n = call.num_weights
    data, weights, grads = inputs[:3], inputs[3:3 + n], inputs[3 + n:]
    primal = [t for t in (*data, *weights) if _floating(t)]

    def forward(*primal):
        found = iter(primal)
        d = [next(found) if _floating(t) else t for t in data]
        w = [next(found) for _ in weights]
        return tuple(recompute(call, d, w))

    outputs, pullback = torch.func.vjp(forward, *primal)
    cotangents = tuple(torch.zeros_like(o) if not _floating(g) else g
                       for o, g in zip(outputs, grads))
    return tuple(pullback(cotangents))


def _variables(inputs, moving=None):
    """The floating tensors of `inputs` (those `moving` marks, if given), and a function
    that takes new values for them and puts the others back."""
    moving = [_floating(t) for t in inputs] if moving is None else moving
    variables = [t for t, m in zip(inputs, moving) if m]

    def rebuild(values):
        found = iter(values)
        return [next(found) if m else t for t, m in zip(inputs, moving)]
    return variables, rebuild


def _first_results(cotangents, inputs, call):
    """`cotangents` (one per first-order result: dx, dh, dc, weights') for the floating data
    and weight inputs ``gradient`` differentiates, in its order."""
    n = call.num_weights
    return [c for c, t in zip(cotangents, inputs[:3 + n]) if _floating(t)]


def _spread_results(found, inputs, call):
    """``gradient``'s results, one per first-order result (None for absent inputs)."""
    n = call.num_weights
    it = iter(found)
    return [next(it) if _floating(t) else None for t in inputs[:3 + n]]


def _unwrap_if_dead(t):
    """`t`, or the tensor it wraps where it is a wrapper of torch.func levels gone (as
    many as have gone: each unwrap takes off one)."""
    while isinstance(t, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(t):
        inner = torch._C._functorch.unwrap_if_dead(t)
        if inner is t:
            break
        t = inner
    return t


def _floating(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _spread(cotangents, present):
    """The cotangents, one per first-order result, None where the result was absent."""
    it = iter(cotangents)
    return [next(it) if p else None for p in present]


def recompute(call, data, weights):
    """The op's ``(output, output_h, output_c)`` on PyTorch's kernels, from `data`
    ``(input, input_h, input_c)`` and `weights`, as ``call`` ran it.

    On the CPU PyTorch's fused RNN kernels (``torch_kernels.rnn``). On CUDA those would
    take cuDNN's RNN, which has no second order, unless PyTorch's process-wide cuDNN
    flag were off: every thread's cuDNN ops would change kernels meanwhile. There it runs
    a step at a time in differentiable ops (``step_by_step``), which never consult cuDNN.
    """
    input, input_h, input_c = data
    if torch._C._functorch.maybe_current_level() is not None:
        # Under vmap PyTorch's kernels update the states in place: an unbatched state (an
        # h_0 not mapped over, or zeros) meeting a batched input or weights there fails
        # ("output with shape [...] doesn't match the broadcast shape"). Tied to them by a
        # zero that depends on them, the states are batched where they are; values and
        # derivatives are the same.
        tie = torch_kernels.zero_tie(input, *weights)
        input_h = input_h + tie
        input_c = None if input_c is None else input_c + tie
    a = call.attributes
    run = step_by_step if input.is_cuda else torch_kernels.rnn
    return run(input, input_h, input_c, list(weights), call.has_biases, call.sequence_lengths,
               a.rnn_mode, a.direction, a.time_major, input_mode=a.input_mode)


def step_by_step(input, input_h, input_c, weights, has_biases, sequence_lengths, rnn_mode,
                 direction, time_major, input_mode="linear_input"):
    """``torch_kernels.rnn``'s results (no dropout), a layer, direction and step at a time
    in differentiable PyTorch ops: matrix products and the cells' pointwise functions, as
    ``torch.nn``'s RNNs compute them (a GRU's reset gate after the product, an LSTM's
    projection). None consults cuDNN, so a CUDA call needs no switch of PyTorch's flag.

    Rows sorted by length, longest first: a step runs the rows still going, as PyTorch's
    kernel for packed rows does; padding is never read, and a row of length 0 keeps its
    states and outputs zeros. A reverse direction runs each row reversed within its
    length. Arguments as ``torch_kernels.rnn``'s.
    """
    lstm = rnn_mode == "lstm"
    bidirectional = direction == "bidirectional"
    directions = 2 if bidirectional else 1
    x = input if time_major else input.transpose(0, 1)  # [T, B, ·] from here on
    states = [input_h, input_c] if lstm else [input_h]
    states = [s if time_major else s.transpose(0, 1) for s in states]  # [L·D, B, ·]
    T, B = x.shape[:2]
    num_layers = states[0].shape[0] // directions
    if has_biases is None:
        weights, has_biases = [w for _, w in torch_kernels._torch_weights(
            weights[0], rnn_mode, bidirectional, num_layers, input.shape[-1],
            states[-1], states[0], input_mode)], True
    per = torch_kernels._per_direction(weights, states[0])  # w_ih, w_hh, the biases, w_hr
    lengths = torch.full((B,), T) if sequence_lengths is None else \
        sequence_lengths.cpu().to(torch.int64)
    ragged = bool((lengths < T).any())
    if ragged:
        order = torch.sort(lengths, descending=True, stable=True).indices
        lengths = lengths[order]
        rows = order.to(x.device)
        x = x.index_select(1, rows)
        states = [s.index_select(1, rows) for s in states]
        # padding zeroed: its products (with zero gradients) must not be NaN
        valid = (torch.arange(T)[:, None] < lengths).to(x.device)[..., None]
        x = torch.where(valid, x, 0.0)
    going = (lengths[None, :] > torch.arange(T)[:, None]).sum(1).tolist()  # rows per step
    cell = _CELLS[rnn_mode]

    def run(k, source):  # layer and direction k, forward in time
        w = weights[k * per:(k + 1) * per]
        b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
        w_hr = w[-1] if len(w) in (3, 5) else None  # an LSTM's projection
        gates = torch.nn.functional.linear(source, w[0], b_ih)  # every step's at once
        return _direction(cell, gates, [s[k] for s in states], w[1], b_hh, w_hr, going)

    output, finals = torch_kernels._layers(x, lengths, len(states[0]), bidirectional, run)
    finals = [torch.stack([f[i] for f in finals]) for i in range(len(states))]
    if ragged:  # the caller's order again
        unsort = torch.argsort(rows)
        output, finals = output.index_select(1, unsort), [f.index_select(1, unsort)
                                                          for f in finals]
    if not time_major:
        output, finals = output.transpose(0, 1), [f.transpose(0, 1) for f in finals]
    return output, finals[0], finals[1] if lstm else output.new_empty((0,))


def _direction(cell, gates, states, w_hh, b_hh, w_hr, going):
    """``(output [T, B, ·], final states)`` of one layer and direction forward in time:
    `gates` the input's part of every step's gates, `states` ``[h, c]`` (``[h]``) of the
    rows sorted by length; `going[t]` rows run step t."""
    T, B = gates.shape[:2]
    outputs = []
    # (one unbind: indexing a step at a time would differentiate into a zeroed [T, B, ·]
    # per step)
    for step, rows in zip(gates.unbind(0), going):
        if rows == 0:
            break
        now = [s[:rows] for s in states] if rows < B else states
        new = cell(step[:rows] if rows < B else step, now,
                   torch.nn.functional.linear(now[0], w_hh, b_hh), w_hr)
        outputs.append(new[0] if rows == B else
                       torch.nn.functional.pad(new[0], (0, 0, 0, B - rows)))
        states = new if rows == B else [torch.cat([n, s[rows:]]) for n, s in zip(new, states)]
    rest = gates.new_zeros((T - len(outputs), B, states[0].shape[-1]))  # no row runs
    return torch.cat([torch.stack(outputs), rest]) if outputs else rest, states


def _lstm_cell(gates, states, recurrent, w_hr):
    gates = gates + recurrent
    # One sigmoid over all four (the cell gate's is not used): fewer nodes to differentiate
    input_gate, forget_gate, _, output_gate = gates.sigmoid().chunk(4, 1)
    c = forget_gate * states[1] + input_gate * gates.chunk(4, 1)[2].tanh()
    h = output_gate * c.tanh()
    return [h if w_hr is None else torch.nn.functional.linear(h, w_hr), c]


def _gru_cell(gates, states, recurrent, w_hr):
    i_r, i_z, i_n = gates.chunk(3, 1)
    h_r, h_z, h_n = recurrent.chunk(3, 1)
    reset, update = (i_r + h_r).sigmoid(), (i_z + h_z).sigmoid()
    new = (i_n + reset * h_n).tanh()  # the reset gate after the product, as cuDNN's
    return [new + update * (states[0] - new)]


_CELLS = {"lstm": _lstm_cell, "gru": _gru_cell,
          "rnn_tanh": lambda gates, states, recurrent, w_hr: [(gates + recurrent).tanh()],
          "rnn_relu": lambda gates, states, recurrent, w_hr: [(gates + recurrent).relu()]}


def refuse_dropout(call):
    """Raise where the forward drew dropout masks (between layers) that cannot be drawn
    again."""
    if not (call.attributes.is_training and call.attributes.dropout > 0 and
            call.num_layers > 1):
        return
    raise NotImplementedError(
        "pycudnnrnn: a second derivative (double backward: a gradient penalty, a "
        "Hessian-vector product) or a forward-mode one (torch.func.jvp, jacfwd, hessian) "
        "through dropout between layers needs the forward's dropout masks, and this "
        "forward drew them inside one multi-layer call (cuDNN's, or the NumPy kernels'), "
        "where they cannot be read back. Run the forward that is differentiated twice "
        "under pycudnnrnn.torch.second_order_dropout(): one call per layer, PyTorch's "
        "masks between, which autograd keeps. Or run it with dropout=0 (model.eval()), or "
        "on PyTorch's own kernels (on CUDA: under torch.backends.cudnn.flags(enabled=False))")
