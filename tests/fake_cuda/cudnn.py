"""``FakeCudnn``: real cuDNN for descriptors, stand-ins for the calls that need a GPU.

Every call still goes through a ctypes function built from the project's prototype table,
so argument marshalling is exercised for real. The RNN itself is computed by the NumPy
backend on the rows cuDNN is handed, queued on the handle's stream; dropout draws masks
and advances the states; the reserve space and the workspace behave as cuDNN's do (see
the package's docstring). Also here: cuDNN's weight-slot table in its documented order,
independent of ``pycudnnrnn.core.layout``.
"""

import collections
import ctypes
import hashlib

import ml_dtypes
import numpy as np

from pycudnnrnn.core.config import GATES, Problem, RNNConfig
from pycudnnrnn.cpu import rnn as cpu_rnn
from pycudnnrnn.cudnn import capi
from pycudnnrnn.cudnn.capi import api as real_api

from .devices import current_device
from .state import CALLS, CAPTURING, COUNTS, POISON
from .streams import _invalidate_captures, _submit, synchronize_all


def _array(ptr, dtype, shape):
    """A NumPy view of host memory at `ptr`."""
    count = int(np.prod(shape))
    buffer = (ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(ptr)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


_DTYPES = {capi.CUDNN_DATA_HALF: np.float16, capi.CUDNN_DATA_FLOAT: np.float32,
           capi.CUDNN_DATA_DOUBLE: np.float64, capi.CUDNN_DATA_BFLOAT16: ml_dtypes.bfloat16}
_MODES = {capi.CUDNN_LSTM: "lstm", capi.CUDNN_GRU: "gru", capi.CUDNN_RNN_TANH: "rnn_tanh",
          capi.CUDNN_RNN_RELU: "rnn_relu"}
DROPOUT_STATES_BYTES = 64


def temp_space_bytes(config: RNNConfig, dtype, max_time: int, batch: int, training: bool,
                     device: int = 0):
    """(workspace, reserve) bytes the stand-in's cuDNN asks for on `device`: growing with
    the problem, as cuDNN's do (the reserve holds every gate of every step and layer),
    and with the device number (GPUs of different kinds ask for different sizes)."""
    cells = max_time * batch * config.num_pseudo_layers * config.num_units
    itemsize = np.dtype(dtype).itemsize
    work = 1024 * (1 + device) + cells * itemsize
    reserve = 64 * (1 + device) + cells * config.num_gates * itemsize if training else 0
    return work, reserve


class FakeCudnn:
    """Real cuDNN for descriptors; stand-ins, marshalled through ctypes, for GPU calls."""

    def __init__(self):
        self.calls = []
        self.state = {}     # token in the reserve space → what forward (or backward data) left
        self.streams = {}   # handle → the stream cudnnSetStream gave it
        self.devices = {}   # handle → the device current when it was created
        self.dropouts = {}  # dropout descriptor → (dropout, states pointer, states bytes)
        self._tokens = iter(range(1, 1 << 62))
        self._handles = iter(range(0x1000, 1 << 40, 0x10))
        self._functions = {}
        self._failure = None

    def __getattr__(self, name):
        if name not in _GPU_CALLS:
            return getattr(real_api(), name)
        if name not in self._functions:
            restype, argtypes = capi.PROTOTYPES[name]

            def callback(*args):
                self.calls.append(name)
                CALLS.append(name)
                try:
                    getattr(self, "_" + name)(*args)  # looked up per call: tests may patch it
                except Exception as exc:  # ctypes would swallow it: raise it after the call
                    self._failure = exc
                    return 4000  # CUDNN_STATUS_INTERNAL_ERROR
                return 0

            # Built from the project's prototype: ctypes converts every argument exactly
            # as it would for the real function, and rejects what it would reject.
            prototype = ctypes.CFUNCTYPE(restype, *argtypes)
            function = prototype(callback)

            def call(*args):
                status = function(*args)
                if self._failure is not None:
                    failure, self._failure = self._failure, None
                    raise failure
                return status

            self._functions[name] = (call, function)
        return self._functions[name][0]

    # --- descriptors, read back through real cuDNN
    def _rnn(self, desc):
        """(RNNConfig without dropout, dtype, (dropout, states pointer) or None)."""
        names = ["algo", "cellMode", "biasMode", "dirMode", "inputMode", "dataType", "mathPrec",
                 "mathType", "inputSize", "hiddenSize", "projSize", "numLayers"]
        values = [ctypes.c_int() for _ in names]
        dropout, aux = ctypes.c_void_p(), ctypes.c_uint32()
        real_api().cudnnGetRNNDescriptor_v8(ctypes.c_void_p(desc), *map(ctypes.byref, values),
                                            ctypes.byref(dropout), ctypes.byref(aux))
        v = {n: x.value for n, x in zip(names, values)}
        assert v["biasMode"] == capi.CUDNN_RNN_DOUBLE_BIAS and aux.value == 1
        H, P = v["hiddenSize"], v["projSize"]
        config = RNNConfig(rnn_mode=_MODES[v["cellMode"]], skip_input=v["inputMode"] == 1,
                           bidirectional=v["dirMode"] == 1, num_layers=v["numLayers"],
                           num_units=H, input_size=v["inputSize"], num_proj=0 if P == H else P)
        return config, _DTYPES[v["dataType"]], self.dropouts.get(dropout.value)

    @staticmethod
    def _data(desc, batch_hint=4096):
        dtype, layout_, T, B, W = (ctypes.c_int() for _ in range(5))
        lengths = (ctypes.c_int * batch_hint)()
        fill = ctypes.create_string_buffer(8)
        real_api().cudnnGetRNNDataDescriptor(ctypes.c_void_p(desc), *map(ctypes.byref, (dtype, layout_, T, B, W)),
                                             batch_hint, lengths, ctypes.cast(fill, ctypes.c_void_p))
        return dict(dtype=_DTYPES[dtype.value], time_major=layout_.value == 0, T=T.value,
                    B=B.value, W=W.value, lengths=np.array(lengths[:B.value]))

    def _stream(self, handle):
        return self.streams.get(handle, 0)

    # --- the calls that need a GPU
    def _cudnnCreate(self, handle_ptr):
        handle_ptr[0] = next(self._handles)
        self.devices[handle_ptr[0]] = current_device()

    def _cudnnDestroy(self, handle):
        # cuDNN's cudnnDestroy calls cudaDeviceSynchronize: illegal while a stream
        # captures (CUDA then invalidates the capture), a sync otherwise.
        if CAPTURING:
            _invalidate_captures("cudnnDestroy synchronized the device during a capture")
        else:
            COUNTS["sync"] += 1
            synchronize_all()
        self.streams.pop(handle, None)

    def _cudnnSetStream(self, handle, stream):
        self.streams[handle] = stream or 0

    def _cudnnDropoutGetStatesSize(self, handle, size):
        size[0] = DROPOUT_STATES_BYTES

    def _cudnnSetDropoutDescriptor(self, desc, handle, dropout, states, size, seed):
        self.dropouts[desc] = (dropout, states) if states and dropout else None
        if states and size:
            def initialise():  # a kernel: the RNG's seed and its position
                _array(states, np.uint8, (size,))[...] = 0
                _array(states, np.uint64, (2,))[...] = (seed, 0)
            _submit(self._stream(handle), initialise)

    def _cudnnRestoreDropoutDescriptor(self, desc, handle, dropout, states, size, seed):
        self.dropouts[desc] = (dropout, states) if states and dropout else None  # states as they are

    def _cudnnGetRNNWeightSpaceSize(self, handle, desc, size):
        config, dtype, _ = self._rnn(desc)
        size[0] = weight_space_elements(config) * np.dtype(dtype).itemsize

    def _cudnnGetRNNWeightParams(self, handle, desc, k, size, space, lin, m_desc, m_addr, b_desc, b_addr):
        config, dtype, _ = self._rnn(desc)
        itemsize = np.dtype(dtype).itemsize
        m_addr[0] = b_addr[0] = None
        for slot in weight_slots(config):
            if slot.pseudo_layer != k or slot.lin_layer_id != lin:
                continue
            tensor = m_desc if slot.kind == "weight" else b_desc
            dims = (1,) * (3 - len(slot.shape)) + slot.shape
            strides = [int(np.prod(dims[i + 1:])) for i in range(3)]
            real_api().cudnnSetTensorNdDescriptor(ctypes.c_void_p(tensor), capi.CUDNN_DATA_FLOAT, 3,
                                                  (ctypes.c_int * 3)(*dims), (ctypes.c_int * 3)(*strides))
            address = space + slot.offset * itemsize
            if slot.kind == "weight":
                m_addr[0] = address
            else:
                b_addr[0] = address

    def _cudnnGetRNNTempSpaceSizes(self, handle, desc, mode, x_desc, work, reserve):
        config, dtype, _ = self._rnn(desc)
        x = self._data(x_desc)
        work[0], reserve[0] = temp_space_bytes(config, dtype, x["T"], x["B"],
                                               mode == capi.CUDNN_FWD_MODE_TRAINING,
                                               self.devices.get(handle, 0))

    def _call(self, handle, desc, x_desc, dev_lengths, training, work_size, reserve_size):
        """What a compute call reads on the host when it is made: the descriptors."""
        config, dtype, dropout = self._rnn(desc)
        x = self._data(x_desc)
        assert (x["lengths"] > 0).all(), "cuDNN rejects zero-length sequences"
        work, reserve = temp_space_bytes(config, dtype, x["T"], x["B"], training,
                                         self.devices.get(handle, 0))
        assert work_size >= work, f"workspace of {work_size} bytes, cuDNN needs {work}"
        assert reserve_size >= reserve, f"reserve of {reserve_size} bytes, cuDNN needs {reserve}"
        return config, np.dtype(dtype), dropout, x, ctypes.cast(dev_lengths, ctypes.c_void_p).value

    @staticmethod
    def _problem(config, dtype, x, lengths_ptr, training):
        """The problem a queued call computes, reading devSeqLengths now (cuDNN reads them
        from the device while it runs)."""
        device_lengths = _array(lengths_ptr, np.int32, (x["B"],))
        np.testing.assert_array_equal(device_lengths, x["lengths"],
                                      err_msg="devSeqLengths, read when cuDNN ran")
        return Problem(config, x["T"], x["B"], x["time_major"], dtype, x["lengths"],
                       is_training=training)

    def _views(self, problem, config, dtype, x, hx, cx, w):
        data = lambda ptr, width: ptr and _array(ptr, dtype, problem.data_shape(width))
        LD, B = config.num_pseudo_layers, problem.batch_size
        state = lambda ptr, width: None if not ptr else _array(ptr, dtype, (LD, B, width))
        return (data(x, config.input_size), state(hx, config.state_size),
                state(cx, config.num_units), _array(w, dtype, (weight_space_elements(config),)))

    @staticmethod
    def _states(problem, *states):
        """cuDNN's [L·D, B, ·] states in the layout the NumPy backend expects, and back."""
        return [s if s is None or problem.time_major else s.swapaxes(0, 1) for s in states]

    @staticmethod
    def _scribble(work, work_size):
        if work and work_size:
            _array(work, np.uint8, (work_size,)).fill(POISON)

    def _cudnnRNNForward(self, handle, desc, mode, dev_lengths, x_desc, x, y_desc, y, h_desc, hx, hy,
                         c_desc, cx, cy, w_size, w, work_size, work, reserve_size, reserve):
        training = mode == capi.CUDNN_FWD_MODE_TRAINING
        config, dtype, dropout, xd, lengths_ptr = self._call(handle, desc, x_desc, dev_lengths, training,
                                                             work_size, reserve_size)

        def run():
            problem = self._problem(config, dtype, xd, lengths_ptr, training)
            if training and dropout is not None:  # masks from the RNG's state, which advances
                rate, states = dropout
                position = _array(states, np.uint64, (2,))
                seed = int.from_bytes(hashlib.blake2b(position.tobytes(), digest_size=8).digest(),
                                      "little")
                position[1] += 1
                problem = Problem(config.with_dropout(rate, seed), xd["T"], xd["B"],
                                  xd["time_major"], dtype, xd["lengths"], is_training=True)
            X, HX, CX, W = self._views(problem, config, dtype, x, hx, cx, w)
            assert w_size == W.nbytes
            self._scribble(work, work_size)
            out = cpu_rnn.forward(problem, X, *self._states(problem, HX, CX), W)
            out_h, out_c = self._states(problem, out[1], out[2] if config.is_lstm else None)
            width = config.num_dirs * config.state_size
            _array(y, dtype, problem.data_shape(width))[...] = out[0]
            _array(hy, dtype, HX.shape)[...] = out_h
            if cy:
                _array(cy, dtype, CX.shape)[...] = out_c
            if training:  # keep copies: the backend's temporaries may be freed after the call
                copy = lambda a: None if a is None else a.copy()
                token = next(self._tokens)  # in the reserve space, so a copy of it works too
                _array(reserve, np.int64, (1,))[0] = token
                self.state[token] = ("forward", problem, copy(X), copy(HX), copy(CX), copy(W),
                                     out)

        _submit(self._stream(handle), run)

    def _cudnnRNNBackwardData_v8(self, handle, desc, dev_lengths, y_desc, y, dy, x_desc, dx, h_desc,
                                 hx, dhy, dhx, c_desc, cx, dcy, dcx, w_size, w, work_size, work,
                                 reserve_size, reserve):
        config, dtype, _, xd, lengths_ptr = self._call(handle, desc, x_desc, dev_lengths, True,
                                                       work_size, reserve_size)

        def run():
            self._problem(config, dtype, xd, lengths_ptr, True)
            token = int(_array(reserve, np.int64, (1,))[0])
            record = self.state.get(token)
            self._scribble(work, work_size)
            if record is None or record[0] != "forward":
                # No forward's record in this reserve space (BackwardData overwrote it): what
                # cuDNN would compute from it is garbage.
                problem = Problem(config, xd["T"], xd["B"], xd["time_major"], dtype,
                                  xd["lengths"], is_training=True)
                for ptr, shape in ((dx, problem.data_shape(config.input_size)),
                                   (dhx, (config.num_pseudo_layers, xd["B"], config.state_size)),
                                   (dcx, (config.num_pseudo_layers, xd["B"], config.num_units))):
                    if ptr:
                        _array(ptr, dtype, shape)[...] = np.nan
                return
            problem, X, HX, CX, W, out = record[1:]
            width = config.num_dirs * config.state_size
            # the backend hands backward the same inputs and outputs forward saw and made
            np.testing.assert_array_equal(_array(y, dtype, problem.data_shape(width)), out[0],
                                          err_msg="y handed to backward data")
            np.testing.assert_array_equal(self._views(problem, config, dtype, 0, hx, cx, w)[1], HX,
                                          err_msg="hx handed to backward data")
            np.testing.assert_array_equal(_array(w, dtype, W.shape), W,
                                          err_msg="weights handed to backward data")
            DY = _array(dy, dtype, problem.data_shape(width))
            DHY = _array(dhy, dtype, HX.shape)
            DCY = _array(dcy, dtype, CX.shape) if dcy else None
            grads = cpu_rnn.backprop(problem, X, *self._states(problem, HX, CX), W, *out[:3], DY,
                                           *self._states(problem, DHY, DCY), out[3])
            g_h, g_c = self._states(problem, grads[1], grads[2] if config.is_lstm else None)
            # dx at the valid steps only: nothing in cuDNN's documentation says it
            # writes dx past each length, so the stand-in leaves that as it was.
            valid = _valid_steps(problem)
            _array(dx, dtype, X.shape)[valid] = (grads[0] + _padding_poison(problem, DY))[valid]
            _array(dhx, dtype, HX.shape)[...] = g_h
            if dcx:
                _array(dcx, dtype, CX.shape)[...] = g_c
            # reserveSpace is [in,out] here: its gate activations become gate gradients,
            # which is what the weight pass reads.
            after = next(self._tokens)
            _array(reserve, np.int64, (1,))[0] = after
            self.state[after] = ("data", problem, X, grads[3])

        _submit(self._stream(handle), run)

    def _cudnnRNNBackwardWeights_v8(self, handle, desc, add, dev_lengths, x_desc, x, h_desc, hx,
                                    y_desc, y, w_size, dw, work_size, work, reserve_size, reserve):
        assert add == capi.CUDNN_WGRAD_MODE_ADD
        config, dtype, _, xd, lengths_ptr = self._call(handle, desc, x_desc, dev_lengths, True,
                                                       work_size, reserve_size)

        def run():
            self._problem(config, dtype, xd, lengths_ptr, True)
            token = int(_array(reserve, np.int64, (1,))[0])
            record = self.state.get(token)
            self._scribble(work, work_size)
            target = _array(dw, dtype, (weight_space_elements(config),))
            if record is None or record[0] != "data":  # no backward data ran on this reserve
                target[...] = np.nan
                return
            problem, X, dparams = record[1:]
            np.testing.assert_array_equal(_array(x, problem.dtype, X.shape), X,
                                          err_msg="x handed to backward weights")
            target[...] += dparams + _padding_poison(problem, X)

        _submit(self._stream(handle), run)


def _valid_steps(problem):
    """[T, B] (or [B, T]) True at the steps before each sequence's length."""
    steps = np.arange(problem.max_time)[:, None] < problem.full_lengths[None, :]
    return steps if problem.time_major else steps.T


def _padding_poison(problem, data):
    """What the padding of `data` adds to a product over every (t, b) slot with zero
    gradients there: 0, or NaN when the padding holds NaN or Inf (as cuDNN's GEMMs do)."""
    lengths = problem.full_lengths
    steps = np.arange(problem.max_time)[:, None] >= lengths[None, :]  # [T, B] padding
    padding = steps if problem.time_major else steps.T
    return data.dtype.type(0) * np.asarray(data)[padding].sum(dtype=data.dtype)


# ----------------------------------------------------------------- cuDNN's weight slots

WeightSlot = collections.namedtuple("WeightSlot", "pseudo_layer lin_layer_id kind offset shape")


def weight_slots(config: RNNConfig) -> list:
    """cuDNN's weight space as its documentation orders it, independent of layout.py.

    Every matrix first, pseudo-layer by pseudo-layer and by linLayerID within one (input
    matrices of the gates 0..G-1, recurrent ones G..2G-1, the LSTM projection 2G; skip
    input has no layer-0 input matrices), then every bias likewise (no projection bias).
    Gate order (GATES): LSTM i, f, c, o; GRU r, z, h. Offsets in elements.
    """
    G, H, P, D = len(GATES[config.rnn_mode]), config.num_units, config.state_size, config.num_dirs
    slots, offset = [], 0
    for kind in ("weight", "bias"):
        for k in range(config.num_layers * D):
            layer = k // D
            width = config.input_size if layer == 0 else D * P
            for lin in range(2 * G + (1 if config.num_proj else 0)):
                if lin == 2 * G:
                    shape = (P, H) if kind == "weight" else None
                elif lin < G:
                    absent = kind == "weight" and config.skip_input and layer == 0
                    shape = None if absent else ((H, width) if kind == "weight" else (H,))
                else:
                    shape = (H, P) if kind == "weight" else (H,)
                if shape is None:
                    continue
                slots.append(WeightSlot(k, lin, kind, offset, shape))
                offset += int(np.prod(shape))
    return slots


def weight_space_elements(config: RNNConfig) -> int:
    last = weight_slots(config)[-1]
    return last.offset + int(np.prod(last.shape))

_GPU_CALLS = {"cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnDropoutGetStatesSize",
              "cudnnSetDropoutDescriptor", "cudnnRestoreDropoutDescriptor",
              "cudnnGetRNNWeightSpaceSize", "cudnnGetRNNWeightParams", "cudnnGetRNNTempSpaceSizes",
              "cudnnRNNForward", "cudnnRNNBackwardData_v8", "cudnnRNNBackwardWeights_v8"}
