"""The public functions: find the backend, check the arguments, run the backend.

Data flows one way: public function → ``pycudnnrnn.core.checks`` → backend → result; ``forward``
and ``backprop`` go through a cached ``pycudnnrnn.plan.RNNPlan`` (checked in full when
the plan is built, by shape, dtype and device on every call).
The backend follows the arrays: CPU arrays (NumPy, or DLPack arrays on the CPU) run on
``pycudnnrnn.cpu.rnn``; CUDA arrays (CuPy, or anything whose
``__dlpack_device__`` is CUDA) on cuDNN.
"""

from __future__ import annotations

import contextlib

import numpy as np

from . import plan
from .core import checks, dtypes, gpu, layout
from .core.arrays import host_lengths, readable_kind, results_like, to_backend
from .core.config import Attributes
from .cuda import foreign
from .results import BackpropResult, ForwardResult


class _Route:
    """Where a call runs, and how its arrays get there and back.

    CPU arrays (NumPy, or any DLPack array on the CPU, such as a PyTorch CPU tensor) go
    to the NumPy backend; CUDA arrays go to the cuDNN backend as CuPy arrays. Both ways
    through DLPack, without a copy; results return in the array type of the call's first
    array. ``arrays`` holds the converted arguments by name (None stays None), ready for
    the checks and the backend.
    """

    def __init__(self, arrays: dict):
        kinds = {}
        for name, a in arrays.items():
            if a is not None:
                arrays[name], kinds[name] = readable_kind(name, a)
        if len(set(kinds.values())) > 1:
            detail = ", ".join(f"{n} on {k}" for n, k in kinds.items())
            raise TypeError(f"arrays must all be NumPy (CPU) or all CUDA, got {detail}")
        self.cuda = "cuda" in kinds.values()
        self.device = None  # a CUDA device number when on the GPU
        self.template = next((a for a in arrays.values() if a is not None), None)
        self.stream, self.foreign = None, ()
        self.xp = xp = gpu.cupy() if self.cuda else np
        if not self.cuda:
            self.arrays = {n: a if a is None else to_backend(xp, n, a) for n, a in arrays.items()}
            return
        devices = {n: _cuda_device(xp, a) for n, a in arrays.items() if a is not None}
        if len(set(devices.values())) > 1:
            detail = ", ".join(f"{n} on cuda:{d}" for n, d in devices.items())
            raise TypeError(f"arrays must all be on one CUDA device, got {detail}")
        self.device = next(iter(devices.values()))
        # Other libraries' arrays: run on a PyTorch caller's stream (its allocator
        # reuses freed memory in that stream's order); others are kept alive until the
        # work reading them is done (foreign.keep_until_done).
        self.stream = foreign.caller_stream(xp, self.template, self.device)
        others = [a for a in arrays.values() if a is not None and not isinstance(a, xp.ndarray)]
        if self.stream is None:
            self.foreign = tuple(others)
        # Imported on the call's stream: a DLPack export makes the importer's stream wait
        # on the exporter's current one when they differ (PyTorch's, CuPy's). On one
        # stream no event is made, and no wait crosses a capture's boundary. (CuPy's
        # own arrays cross no DLPack: nothing to enter for them.)
        with self.on_stream() if others else contextlib.nullcontext():
            self.arrays = {n: a if a is None else to_backend(xp, n, a)
                           for n, a in arrays.items()}

    def on_stream(self):
        """Where the call's GPU work goes: the arrays' device, made current for the whole
        call (CuPy's current stream, events and DLPack exports are per device), and on it
        the caller's stream, or CuPy's current one."""
        if not self.cuda:
            return contextlib.nullcontext()
        entered = contextlib.ExitStack()
        entered.enter_context(self.xp.cuda.Device(self.device))
        if self.stream is not None:
            entered.enter_context(self.stream)
        return entered

    def outputs(self, results):
        """Backend results in the caller's array type (None stays None)."""
        if self.foreign:
            foreign.keep_until_done(self.xp, self.foreign)
        if type(self.template) is self.xp.ndarray and not any(
                type(r) is dtypes.Bfloat16Bits for r in results):
            return results  # the backend's own arrays, as they are (results_like's answer)
        return results_like(self.template, self.xp, results)


def _cuda_device(cupy, array) -> int:
    """The CUDA device of a readable CUDA `array`, read before it is imported: a CuPy
    array's, a PyTorch tensor's (its ``device``: PyTorch's ``__dlpack_device__`` is
    Python and costs ~5 us), any other's ``__dlpack_device__``."""
    if isinstance(array, cupy.ndarray):
        return array.device.id
    if type(array).__module__.split(".")[0] == "torch":
        return array.device.index
    return int(array.__dlpack_device__()[1])


def _config(rnn_mode, num_layers, num_units, input_size, input_mode, direction, num_proj):
    return checks.make_config(rnn_mode=rnn_mode, num_layers=num_layers, num_units=num_units,
                              input_size=input_size, input_mode=input_mode,
                              direction=direction, num_proj=num_proj)


def params_size(*, rnn_mode="lstm", num_layers, num_units, input_size,
                input_mode="linear_input", direction="unidirectional", num_proj=0) -> int:
    """Number of elements of the opaque params buffer (TensorFlow's ``CudnnRNNParamsSize``).

    Parameters
    ----------
    rnn_mode : {"lstm", "gru", "rnn_tanh", "rnn_relu"}, default "lstm"
        The cell.
    num_layers : int
        L, the layers stacked (a bidirectional layer is two pseudo-layers).
    num_units : int
        H, the hidden size.
    input_size : int
        The input's last dimension (layer 0's input width).
    input_mode : {"linear_input", "skip_input", "auto_select"}, default "linear_input"
        Whether layer 0 multiplies its input by a matrix or adds it to every gate as it is
        (``skip_input`` needs input_size == num_units; ``auto_select`` picks it then).
    direction : {"unidirectional", "bidirectional"}, default "unidirectional"
    num_proj : int, default 0
        LSTM projection size P (0 < num_proj < num_units); 0 for none.

    Returns
    -------
    int
        Elements (not bytes) of ``params``.
    """
    return layout.params_size(_config(rnn_mode, num_layers, num_units, input_size, input_mode,
                                      direction, num_proj))


def canonical_to_params(weights, biases, *, rnn_mode="lstm", num_layers, num_units, input_size,
                        input_mode="linear_input", direction="unidirectional", num_proj=0):
    """Pack canonical weights and biases into one opaque params buffer.

    Parameters
    ----------
    weights : sequence of arrays
        The matrices, in the order and shapes ``params_to_canonical`` gives (TensorFlow's
        ``CudnnRNNParamsToCanonicalV2``): for each pseudo-layer (layer·D + direction), the
        input matrices gate by gate, ``[H, in_width]`` (in_width = input_size for layer 0,
        D·P after; none for layer 0 with skip_input), then the recurrent matrices
        ``[H, P]``, then, for LSTM with projection, the projection ``[P, H]``.
    biases : sequence of arrays
        The vectors, each ``[H]``: for each pseudo-layer, the input biases gate by gate,
        then the recurrent biases gate by gate.
    rnn_mode : str, default "lstm"
        See ``params_size`` for the attributes.
    num_layers : int
        L, the layers stacked.
    num_units : int
        H, the hidden size.
    input_size : int
        Layer 0's input width.
    input_mode : str, default "linear_input"
    direction : str, default "unidirectional"
    num_proj : int, default 0

    Returns
    -------
    array
        1-D params of length ``params_size``, of the pieces' array type and dtype.
    """
    config = _config(rnn_mode, num_layers, num_units, input_size, input_mode, direction, num_proj)
    weights, biases = checks.array_list("weights", weights), checks.array_list("biases", biases)
    names = [f"weights[{i}]" for i in range(len(weights))] + \
        [f"biases[{i}]" for i in range(len(biases))]
    route = _Route(dict(zip(names, weights + biases)))
    pieces = [route.arrays[n] for n in names]
    arrays = checks.check_canonical(pieces[:len(weights)], pieces[len(weights):], config)
    bits = type(arrays[0]) is dtypes.Bfloat16Bits  # bfloat16 with a CuPy older than 14
    with route.on_stream():
        params = route.xp.concatenate([(a.bits if bits else a).reshape(-1) for a in arrays])
        return route.outputs((dtypes.Bfloat16Bits(params) if bits else params,))[0]


def params_to_canonical(params, *, rnn_mode="lstm", num_layers, num_units, input_size,
                        input_mode="linear_input", direction="unidirectional", num_proj=0):
    """Split an opaque params buffer into canonical weights and biases.

    Parameters
    ----------
    params : array
        1-D, of length ``params_size``.
    rnn_mode : str, default "lstm"
        See ``params_size`` for the attributes.
    num_layers : int
        L, the layers stacked.
    num_units : int
        H, the hidden size.
    input_size : int
        Layer 0's input width.
    input_mode : str, default "linear_input"
    direction : str, default "unidirectional"
    num_proj : int, default 0

    Returns
    -------
    weights, biases : list of arrays
        Views of `params`, in the order ``canonical_to_params`` takes.
    """
    config = _config(rnn_mode, num_layers, num_units, input_size, input_mode, direction, num_proj)
    route = _Route({"params": params})
    checks.check_params(route.arrays["params"], config)
    weights, biases = layout.split(route.arrays["params"], config)
    with route.on_stream():  # the arrays' device: the keep-alive event and the export's
        views = route.outputs((*weights, *biases))
    return list(views[:len(weights)]), list(views[len(weights):])


def forward(input, input_h, input_c, params, sequence_lengths=None, *, rnn_mode="lstm",
            input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
            seed2=0, num_proj=0, time_major=True, is_training=True, num_layers=None,
            num_units=None, input_size=None) -> ForwardResult:
    """Run the RNN forward (TensorFlow's ``CudnnRNNV3``).

    Parameters
    ----------
    input : array
        ``[T, B, input_size]`` (``[B, T, input_size]`` if not `time_major`).
    input_h : array
        Initial hidden state ``[L·D, B, P]`` (``[B, L·D, P]`` if not `time_major`);
        P is `num_proj` when set, else num_units. Its shape gives num_layers.
    input_c : array or None
        Initial cell state (LSTM only) ``[L·D, B, H]``, likewise; ignored otherwise.
    params : array
        1-D opaque weights, see ``canonical_to_params``.
    sequence_lengths : array of int, optional
        ``[B]`` lengths in ``[0, T]``, in any order; None means all T.
    rnn_mode : {"lstm", "gru", "rnn_tanh", "rnn_relu"}, default "lstm"
        The cell.
    input_mode : {"linear_input", "skip_input", "auto_select"}, default "linear_input"
        Whether layer 0 multiplies its input by a matrix or adds it to every gate as it is
        (``skip_input`` needs input_size == num_units; ``auto_select`` picks it then).
    direction : {"unidirectional", "bidirectional"}, default "unidirectional"
    num_proj : int, default 0
        LSTM projection size P (0 < num_proj < num_units); 0 for none.
    dropout : float, default 0.0
        Drop probability of each layer's input after the first, in training only.
    seed : int, default 0
        High 32 bits of the dropout seed.
    seed2 : int, default 0
        Low 32 bits: the dropout seed is ``(seed << 32) | (seed2 & 0xffffffff)``.
    time_major : bool, default True
        Layout of data and states (states are really batch-major when False).
    is_training : bool, default True
        Apply dropout and return a reserve_space for ``backprop``.
    num_layers, num_units, input_size : int, optional
        Read from the shapes; when given (as in the attribute dict ``pycudnnrnn.convert``
        returns, so that ``forward(..., **attrs)`` works), they must agree with them.

    Returns
    -------
    ForwardResult
        Named tuple ``(output, output_h, output_c, reserve_space)``: output
        ``[T, B, D·P]``, zero past each sequence's length; the final states, shaped like
        the initial ones (output_c empty ``(0,)`` unless LSTM); reserve_space, opaque uint8
        for ``backprop``, empty when not `is_training`.
    """
    lstm = checks.rnn_mode(rnn_mode) == "lstm"
    route = _Route(dict(input=input, input_h=input_h, input_c=input_c if lstm else None,
                        params=params))
    attributes = Attributes(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj,
                            time_major, is_training)
    with route.on_stream():
        run = plan.for_call(route.arrays, host_lengths(sequence_lengths), attributes,
                            route.device, num_layers=num_layers, num_units=num_units,
                            input_size=input_size)
        return ForwardResult(*route.outputs(run.run_forward(route.arrays, reference="input")))


def backprop(input, input_h, input_c, params, sequence_lengths, output, output_h, output_c,
             output_backprop, output_h_backprop, output_c_backprop, reserve_space, *,
             rnn_mode="lstm", input_mode="linear_input", direction="unidirectional",
             dropout=0.0, seed=0, seed2=0, num_proj=0, time_major=True, num_layers=None,
             num_units=None, input_size=None, gradients="all") -> BackpropResult:
    """Backprop of data and weights (TensorFlow's ``CudnnRNNBackpropV3``).

    Parameters
    ----------
    input, input_h, input_c, params, sequence_lengths
        As given to ``forward``.
    output, output_h, output_c, reserve_space
        As ``forward`` returned them (with ``is_training=True``). reserve_space must come
        from a forward call with the same attributes, dtype, shapes and lengths (checked:
        a ValueError otherwise) and on the same data (not checked: another call's reserve
        space gives that call's gradients). See "reserve_space" in ``docs/semantics.md``.
    output_backprop, output_h_backprop, output_c_backprop : array
        Gradients of the loss with respect to the outputs; output_c_backprop is ignored
        unless LSTM, and output_backprop past each sequence's length is ignored.
    rnn_mode : str, default "lstm"
        The attributes of the forward call, with its defaults; see ``forward``.
    input_mode : str, default "linear_input"
    direction : str, default "unidirectional"
    dropout : float, default 0.0
    seed : int, default 0
    seed2 : int, default 0
    num_proj : int, default 0
    time_major : bool, default True
    num_layers, num_units, input_size : int, optional
        As in ``forward``: checked against the shapes when given.
    gradients : {"all", "data", "weights"}, default "all"
        Which gradients to compute. ``"data"``: input_backprop and the state gradients
        only (cuDNN skips ``cudnnRNNBackwardWeights``; the NumPy backend skips the
        weight-gradient products), for input saliency or frozen weights. ``"weights"``:
        params_backprop only (cuDNN still runs its data pass, which the weight pass
        needs; the NumPy backend skips the first layer's input gradient).

    Returns
    -------
    BackpropResult
        Named tuple ``(input_backprop, input_h_backprop, input_c_backprop,
        params_backprop)``: gradients shaped like input, input_h, input_c (empty ``(0,)``
        unless LSTM) and params; those that `gradients` leaves out are None.
    """
    lstm = checks.rnn_mode(rnn_mode) == "lstm"
    route = _Route(dict(input=input, input_h=input_h, input_c=input_c if lstm else None,
                        params=params, output=output, output_h=output_h,
                        output_c=output_c if lstm else None, output_backprop=output_backprop,
                        output_h_backprop=output_h_backprop,
                        output_c_backprop=output_c_backprop if lstm else None,
                        reserve_space=reserve_space))
    attributes = Attributes(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj,
                            time_major, is_training=True)
    with route.on_stream():
        run = plan.for_call(route.arrays, host_lengths(sequence_lengths), attributes,
                            route.device, num_layers=num_layers, num_units=num_units,
                            input_size=input_size)
        return BackpropResult(*route.outputs(run.run_backprop(route.arrays, reference="input",
                                                              gradients=gradients)))
