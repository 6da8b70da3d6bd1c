"""What every pycudnnrnn module shares: dropout seeds, and running the route ``route`` picks.

``SeededRNN`` is a mixin of the drop-in ``LSTM``/``GRU``/``RNN`` (over ``torch.nn.RNNBase``
and its named weights) and of ``FlatRNN``, the base of the TensorFlow-flavoured
``CudnnRNN`` (one flat cuDNN-layout ``params``). They differ only in how they hold their
weights, read their arguments and shape their results.

When it runs which forward:

* training mode: the training forward with dropout (when ``dropout > 0`` and there are
  at least two layers);
* eval mode with a gradient needed (a tensor requires grad, grad mode on): the training
  forward *without* dropout, so that backward works (input saliency, adversarial
  examples) and eval results are unchanged;
* eval mode otherwise: inference (no reserve space, less memory).

Dropout seeds: on the CPU every training call with dropout draws its seed from PyTorch's
default generator, so each step has a fresh mask and ``torch.manual_seed`` reproduces a
run; a call without dropout draws nothing. On CUDA each module keeps one seed (given, or
made from ``torch.manual_seed``'s seed and the module's place in the process when it is
built, drawing nothing: ``_module_seed``): cuDNN keeps one dropout state per (device,
seed), initialises it once and advances it at every training call, as PyTorch's own RNNs
do, instead of re-seeding (6 MiB of state and a slow initialisation) per step. Either
way a forward run again from the same PyTorch generator state (``torch.utils.checkpoint``'s
recomputation) draws the same masks: on the CPU the seed comes from the generator, on
CUDA the op names each forward by the generator's state (``op_backends.dropout_key``).
Under ``second_order_dropout()`` no seed is drawn: ``torch.nn.functional.dropout`` draws
the masks between one op call per layer (``layerwise``), again from the generator (so a
recomputation inside the context draws them again too).
"""

from __future__ import annotations

import itertools
import math
import operator
import weakref

import torch

from ..core import layout
from ..core.checks import make_config
from ..core.config import Attributes
from . import op_backends, torch_kernels
from .functional import check_devices, lengths_tensor
from .ops import check_call
from .route import Route, choose, run_op

_SEED_BOUND = 2 ** 62


_MASK64 = 2 ** 64 - 1
_modules_seeded = itertools.count()


def _module_seed() -> int:
    """A CUDA dropout seed for a new module (or copy), in [0, 2**62): PyTorch's seed
    (``torch.manual_seed``'s, so a seeded run repeats) mixed with the module's place among
    those made in this process (so no two share a dropout state), by splitmix64.

    Nothing is drawn from PyTorch's generator: building or copying a module leaves its
    stream as torch.nn's RNNs leave it, and the weights of every layer built after one
    are the same with either. (Asked at construction, never inside a trace.)
    """
    x = (torch.initial_seed() + next(_modules_seeded) * 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 2


def _draw_seed(shape=()):
    """A dropout seed tensor from PyTorch's default generator (torch.manual_seed fixes it).

    On the CPU always (also under ``with torch.device("meta")``: a seed needs a value).
    """
    return torch.randint(0, _SEED_BOUND, shape, dtype=torch.int64, device="cpu")


class SeededRNN:
    """Mixin: the module's dropout seed, and one op call with the right forward.

    The class using it sets ``dropout``, ``training`` (as any module) and calls
    ``_init_seed`` in its constructor.
    """

    def _init_seed(self, seed):
        # Made even without dropout: `dropout` may be set later, and modules must not share.
        if seed is not None and (isinstance(seed, bool) or not hasattr(seed, "__index__")):
            raise TypeError(f"seed: expected an integer or None, got {seed!r}")
        self.seed_drawn = seed is None
        self.gpu_seed = _module_seed() if seed is None else operator.index(seed)
        self._hold_seed()

    def _hold_seed(self):
        # The seed's CUDA plan and dropout state live as long as the module, not longer.
        op_backends.acquire_seed(self.gpu_seed)
        weakref.finalize(self, op_backends.release_seed, self.gpu_seed)

    def __setstate__(self, state):
        # A copy (copy.deepcopy, pickle) is a module of its own: a seed not given is made
        # again (modules must not share dropout states), and the copy holds its seed.
        super().__setstate__(state)
        if getattr(self, "seed_drawn", True):
            self.gpu_seed = _module_seed()
        self._hold_seed()

    def _run(self, input, h0, c0, weights, has_biases, sequence_lengths, attributes,
             num_layers, zero_states=False, torch_states=False, packed=None):
        """``(output, h_n, c_n)`` of checked arguments on the route ``route.choose`` picks,
        c_n empty unless LSTM (output a PackedSequence on torch.nn's packed kernel).

        `weights` and `has_biases` as for ``autograd.apply``; `attributes` the call's
        ``Attributes`` but dropout and is_training, which this picks from the mode and
        whether a gradient is needed; `zero_states`: h0 and c0 are zeros;
        `torch_states`: the states in and out are ``[L·D, B, ·]`` when batch-major too
        (torch.nn's layout), else the op's ``[B, L·D, ·]``; `packed`: the PackedSequence
        a drop-in was given (its rows padded in `input`).
        """
        dropout = float(self.dropout) if self.training and num_layers > 1 else 0.0
        way = choose(input, h0, weights, has_biases, attributes.replace(dropout=dropout),
                     module=self, packed=packed is not None)
        if way is Route.EMPTY_BATCH:  # nothing to run (the op needs a batch), as torch.nn
            return _empty_batch(input, h0, c0, weights, attributes.time_major,
                                attributes.num_dirs * h0.shape[-1])
        if way is Route.TORCH_PACKED:
            # torch.nn's own call, on the rows in the order it packed them: a seed gives the
            # masks torch.nn's gives (it draws them on the packed rows, equal lengths too)
            return torch_kernels.packed(packed, h0, c0, weights, has_biases, attributes.rnn_mode,
                                        attributes.num_dirs == 2, float(self.dropout))
        if way is Route.TORCH_KERNELS:
            if not torch_states:
                # CudnnRNN: the op's checks of the shapes and dtypes first (the drop-ins
                # made torch.nn's own checks before this)
                check_call(input, h0, c0, weights[0],
                           attributes.replace(dropout=dropout, is_training=True))
            # torch.nn's own call: its kernels, its dropout masks (from its generator)
            return torch_kernels.rnn(input, h0, c0, weights, has_biases, sequence_lengths,
                                     attributes.rnn_mode, attributes.direction,
                                     attributes.time_major,
                                     dropout, self.training, zero_states=zero_states,
                                     torch_states=torch_states,
                                     order=None if packed is None else packed.sorted_indices)
        if dropout == 1 and has_biases is not None:  # torch.nn's weights: a drop-in
            # torch.nn's p = 1 zeroes the input of every layer after the first; cuDNN takes
            # p < 1. Those layers' input matrices times zero compute the same, gradients too.
            weights = _first_layer_input_only(weights, num_layers, attributes.num_dirs)
            dropout = 0.0
        transpose = torch_states and not attributes.time_major
        if transpose:  # the op's batch-major states are [B, L·D, ·]
            h0, c0 = h0.transpose(0, 1), None if c0 is None else c0.transpose(0, 1)
        # A trace records the forward that keeps what backward needs, whatever the grad
        # mode and what requires grad then: torch.jit.trace checks its graph again under
        # no_grad, and a traced model may be called with a gradient later (torch.nn's
        # traces backpropagate: a frozen model's, to its input too).
        grad = torch.jit.is_tracing() or torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (input, h0, c0, *weights))
        attributes = attributes.replace(dropout=dropout, is_training=self.training or grad)
        seed = None if way is Route.LAYERWISE else self._seed(input, dropout)
        output, h_n, c_n = run_op(way, input, h0, c0, weights, has_biases, sequence_lengths,
                                  seed, attributes)
        if transpose:
            h_n = h_n.transpose(0, 1).contiguous()
            c_n = c_n.transpose(0, 1).contiguous() if c0 is not None else c_n
        return output, h_n, c_n

    def _seed(self, input, dropout):
        """The op's seed: a 0-d int64 CPU tensor (a graph input: a fresh one per step does
        not recompile), or None when no mask is drawn (eval mode, one layer, no dropout):
        then the call holds no CPU tensor for the seed, and CUDA graphs can take it."""
        if dropout == 0:
            return None
        if not op_backends.on_gpu(input):  # a fresh mask per step, from PyTorch's generator
            return _draw_seed()
        return torch.tensor(self.gpu_seed, dtype=torch.int64)  # cuDNN advances its state


def _first_layer_input_only(weights, num_layers, directions):
    """torch.nn's `weights` with the input matrices (``weight_ih``) of every layer after
    the first times zero. They come a layer and direction at a time, ``weight_ih`` first."""
    group = len(weights) // (num_layers * directions)
    return [w * 0 if k >= group * directions and k % group == 0 else w
            for k, w in enumerate(weights)]


def _empty_batch(data, h0, c0, weights, time_major, width):
    """The results for a batch of 0 sequences, connected to every argument for autograd
    (their gradients are zeros, as torch.nn's)."""
    tie = torch_kernels.zero_tie(data, *weights)
    T = data.shape[0] if time_major else data.shape[1]
    shape = (T, 0, width) if time_major else (0, T, width)
    output = data.new_zeros(shape) + tie
    return output, h0 + tie, data.new_empty((0,)) if c0 is None else c0 + tie


class FlatRNN(SeededRNN, torch.nn.Module):
    """A multi-layer RNN over one flat cuDNN-layout ``params`` parameter.

    Parameters
    ----------
    rnn_mode : {"lstm", "gru", "rnn_tanh", "rnn_relu"}
    input_size, hidden_size, num_layers : int
    bidirectional : bool
    input_mode : {"linear_input", "skip_input", "auto_select"}
    num_proj : int
        LSTM projection size (0 = none).
    dropout : float
        Between layers, in training mode only.
    seed : int or None
        The cuDNN dropout state's seed on CUDA; None draws one from PyTorch's generator.
    device, dtype
        Of ``params``.
    """

    def __init__(self, rnn_mode, input_size, hidden_size, num_layers=1, *, bidirectional=False,
                 input_mode="linear_input", num_proj=0, dropout=0.0, seed=None,
                 device=None, dtype=None):
        super().__init__()
        direction = "bidirectional" if bidirectional else "unidirectional"
        self.config = make_config(rnn_mode=rnn_mode, num_layers=num_layers,
                                  num_units=hidden_size, input_size=input_size,
                                  input_mode=input_mode, direction=direction,
                                  num_proj=num_proj, dropout=dropout)
        self.layer_attrs = dict(rnn_mode=rnn_mode, input_mode=input_mode, direction=direction,
                                num_proj=num_proj)
        self.dropout = float(dropout)
        self._init_seed(seed)
        n = layout.params_size(self.config)
        self.params = torch.nn.Parameter(torch.empty(n, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        """Uniform in ±1/√hidden_size, as PyTorch's RNNs."""
        bound = 1.0 / math.sqrt(self.config.num_units)
        with torch.no_grad():
            self.params.uniform_(-bound, bound)

    @property
    def attrs(self) -> dict:
        """``rnn_mode, num_layers, num_units, input_size, direction, num_proj`` of params."""
        c = self.config
        return dict(rnn_mode=c.rnn_mode, num_layers=c.num_layers, num_units=c.num_units,
                    input_size=c.input_size, direction=self.layer_attrs["direction"],
                    num_proj=c.num_proj)

    @property
    def num_directions(self) -> int:
        return self.config.num_dirs

    def run(self, input, h0, c0, sequence_lengths, time_major):
        """The op on `params`: ``(output, h_n, c_n)``, c_n empty unless LSTM.

        Every tensor is checked to be on the device of `input` (meta refused).
        """
        check_devices(input.device, [("input", input), ("hx (h_0)", h0), ("hx (c_0)", c0),
                                         ("params", self.params)])
        if input.device.type == "meta":
            raise TypeError("input: expected a tensor with data, got a tensor on the meta "
                            "device (it has no values to compute with)")
        attributes = Attributes(time_major=time_major, **self.layer_attrs)
        return self._run(input, h0, c0, [self.params], None, lengths_tensor(sequence_lengths),
                         attributes, self.config.num_layers)
