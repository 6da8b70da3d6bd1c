"""A stand-in GPU for CI: runs the cuDNN backend's own code with host memory.

* ``FakeCupy`` is the slice of CuPy the backend uses, over NumPy arrays whose
  ``__dlpack_device__`` says CUDA, so the public API routes them to the cuDNN backend.
* ``FakeCudnn`` replaces the handful of cuDNN calls that need a GPU. Every call still
  goes through a ctypes function built from the project's prototype table, so argument
  marshalling is exercised for real; descriptors are real cuDNN objects (they need no
  GPU) and are read back through cuDNN. The RNN itself is computed by the NumPy backend
  on the rows cuDNN is handed, and the fake refuses what cuDNN refuses (zero lengths).

What this cannot show is cuDNN's own arithmetic and weight layout: the ``gpu`` tests do.
"""

import ctypes
import types

import ml_dtypes
import numpy as np

from pycudnnrnn import dtypes, layout, numpy_backend
from pycudnnrnn.checks import Problem
from pycudnnrnn.config import RNNConfig
from pycudnnrnn.cudnn import capi
from pycudnnrnn.cudnn.capi import api as real_api


class FakeDeviceArray(np.ndarray):
    """Host memory that says it lives on CUDA device 0."""

    def __dlpack_device__(self):
        return (2, 0)

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    @property
    def device(self):
        return types.SimpleNamespace(id=0)


def _device(a):
    return np.asarray(a).view(FakeDeviceArray)


class FakeCupy(types.ModuleType):
    """The CuPy functions and attributes the backend and the API use."""

    ndarray = FakeDeviceArray
    uint8, int32, float16, float32, float64 = np.uint8, np.int32, np.float16, np.float32, np.float64

    def __init__(self):
        super().__init__("fake_cupy")
        stream = types.SimpleNamespace(ptr=0)

        class Device:
            def __init__(self, id=0):
                self.id = 0

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return None

        self.cuda = types.SimpleNamespace(
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
            Device=Device, get_current_stream=lambda: stream)

    def empty(self, shape, dtype=np.float32):
        # Garbage, as on a GPU: NaN for floats, so a read of unwritten memory shows.
        return _device(np.full(shape, np.nan if dtypes.is_supported(dtype) else 0xAB, dtype))

    def zeros(self, shape, dtype=np.float32):
        return _device(np.zeros(shape, dtype))

    def empty_like(self, a):
        return self.empty(a.shape, a.dtype)

    def asarray(self, a, dtype=None):
        return _device(np.array(a, dtype=dtype))

    def ascontiguousarray(self, a):
        return _device(np.ascontiguousarray(a))

    def where(self, *args):
        return _device(np.where(*[np.asarray(a) for a in args]))

    def arange(self, *args, **kwargs):
        return _device(np.arange(*args, **kwargs))

    def asnumpy(self, a):
        return np.asarray(a).copy()

    def concatenate(self, arrays):
        return _device(np.concatenate([np.asarray(a) for a in arrays]))

    def from_dlpack(self, a):
        raise AssertionError("the fake GPU only takes FakeDeviceArray")


def _array(ptr, dtype, shape):
    """A NumPy view of host memory at `ptr`."""
    count = int(np.prod(shape))
    buffer = (ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(ptr)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


_DTYPES = {capi.CUDNN_DATA_HALF: np.float16, capi.CUDNN_DATA_FLOAT: np.float32,
           capi.CUDNN_DATA_DOUBLE: np.float64, capi.CUDNN_DATA_BFLOAT16: ml_dtypes.bfloat16}
_MODES = {capi.CUDNN_LSTM: "lstm", capi.CUDNN_GRU: "gru", capi.CUDNN_RNN_TANH: "rnn_tanh",
          capi.CUDNN_RNN_RELU: "rnn_relu"}
_RESERVE_BYTES = 64


class FakeCudnn:
    """Real cuDNN for descriptors; stand-ins, marshalled through ctypes, for GPU calls."""

    def __init__(self):
        self.calls = []
        self.state = {}  # reserve pointer → what forward computed, for the backward calls
        self._functions = {}

    def __getattr__(self, name):
        if name not in _GPU_CALLS:
            return getattr(real_api(), name)
        if name not in self._functions:
            restype, argtypes = capi.PROTOTYPES[name]

            def callback(*args):
                self.calls.append(name)
                getattr(self, "_" + name)(*args)  # looked up per call: tests may patch it
                return 0

            # Built from the project's prototype: ctypes converts every argument exactly
            # as it would for the real function, and rejects what it would reject.
            prototype = ctypes.CFUNCTYPE(restype, *argtypes)
            self._functions[name] = (prototype(callback), prototype)
        return self._functions[name][0]

    # --- descriptors, read back through real cuDNN
    @staticmethod
    def _rnn(desc):
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
        return config, _DTYPES[v["dataType"]]

    @staticmethod
    def _data(desc, batch_hint=4096):
        dtype, layout_, T, B, W = (ctypes.c_int() for _ in range(5))
        lengths = (ctypes.c_int * batch_hint)()
        fill = ctypes.create_string_buffer(8)
        real_api().cudnnGetRNNDataDescriptor(ctypes.c_void_p(desc), *map(ctypes.byref, (dtype, layout_, T, B, W)),
                                             batch_hint, lengths, ctypes.cast(fill, ctypes.c_void_p))
        return dict(dtype=_DTYPES[dtype.value], time_major=layout_.value == 0, T=T.value,
                    B=B.value, W=W.value, lengths=np.array(lengths[:B.value]))

    # --- the calls that need a GPU
    def _cudnnCreate(self, handle_ptr):
        handle_ptr[0] = 0x1000

    def _cudnnDestroy(self, handle):
        pass

    def _cudnnSetStream(self, handle, stream):
        pass

    def _cudnnDropoutGetStatesSize(self, handle, size):
        size[0] = 64

    def _cudnnSetDropoutDescriptor(self, desc, handle, dropout, states, size, seed):
        pass

    _cudnnRestoreDropoutDescriptor = _cudnnSetDropoutDescriptor

    def _cudnnGetRNNWeightSpaceSize(self, handle, desc, size):
        config, dtype = self._rnn(desc)
        size[0] = layout.params_size(config) * np.dtype(dtype).itemsize

    def _cudnnGetRNNWeightParams(self, handle, desc, k, size, space, lin, m_desc, m_addr, b_desc, b_addr):
        config, dtype = self._rnn(desc)
        itemsize = np.dtype(dtype).itemsize
        G = config.num_gates
        m_addr[0] = b_addr[0] = None
        for p in layout.pieces(config):
            p_lin = 2 * G if p.role == "projection" else \
                layout.GATES[config.rnn_mode].index(p.gate) + (G if p.role == "recurrent" else 0)
            if p.pseudo_layer != k or p_lin != lin:
                continue
            tensor = m_desc if p.kind == "weight" else b_desc
            dims = (1,) * (3 - len(p.shape)) + p.shape
            strides = [int(np.prod(dims[i + 1:])) for i in range(3)]
            real_api().cudnnSetTensorNdDescriptor(ctypes.c_void_p(tensor), capi.CUDNN_DATA_FLOAT, 3,
                                                  (ctypes.c_int * 3)(*dims), (ctypes.c_int * 3)(*strides))
            address = space + p.offset * itemsize
            if p.kind == "weight":
                m_addr[0] = address
            else:
                b_addr[0] = address

    def _cudnnGetRNNTempSpaceSizes(self, handle, desc, mode, x_desc, work, reserve):
        work[0] = 128
        reserve[0] = _RESERVE_BYTES if mode == capi.CUDNN_FWD_MODE_TRAINING else 0

    def _problem(self, desc, x_desc, dev_lengths, training):
        config, dtype = self._rnn(desc)
        x = self._data(x_desc)
        assert (x["lengths"] > 0).all(), "cuDNN rejects zero-length sequences"
        device_lengths = _array(ctypes.cast(dev_lengths, ctypes.c_void_p).value, np.int32, (x["B"],))
        np.testing.assert_array_equal(device_lengths, x["lengths"])  # devSeqLengths is a copy
        problem = Problem(config, x["T"], x["B"], x["time_major"], np.dtype(dtype), x["lengths"],
                          is_training=training)
        return problem, config, dtype

    def _views(self, problem, config, dtype, x, hx, cx, w):
        data = lambda ptr, width: ptr and _array(ptr, dtype, problem.data_shape(width))
        LD, B = config.num_pseudo_layers, problem.batch_size
        state = lambda ptr, width: None if not ptr else _array(ptr, dtype, (LD, B, width))
        return (data(x, config.input_size), state(hx, config.state_size),
                state(cx, config.num_units), _array(w, dtype, (layout.params_size(config),)))

    @staticmethod
    def _states(problem, *states):
        """cuDNN's [L·D, B, ·] states in the layout the NumPy backend expects, and back."""
        return [s if s is None or problem.time_major else s.swapaxes(0, 1) for s in states]

    def _cudnnRNNForward(self, handle, desc, mode, dev_lengths, x_desc, x, y_desc, y, h_desc, hx, hy,
                         c_desc, cx, cy, w_size, w, work_size, work, reserve_size, reserve):
        training = mode == capi.CUDNN_FWD_MODE_TRAINING
        problem, config, dtype = self._problem(desc, x_desc, dev_lengths, training)
        X, HX, CX, W = self._views(problem, config, dtype, x, hx, cx, w)
        assert w_size == W.nbytes
        out = numpy_backend.forward(problem, X, *self._states(problem, HX, CX), W)
        out_h, out_c = self._states(problem, out[1], out[2] if config.is_lstm else None)
        width = config.num_dirs * config.state_size
        _array(y, dtype, problem.data_shape(width))[...] = out[0]
        _array(hy, dtype, HX.shape)[...] = out_h
        if cy:
            _array(cy, dtype, CX.shape)[...] = out_c
        if training:  # keep copies: the backend's temporaries may be freed after the call
            assert reserve_size == _RESERVE_BYTES
            copy = lambda a: None if a is None else a.copy()
            self.state[reserve] = (problem, copy(X), copy(HX), copy(CX), copy(W), out)

    def _cudnnRNNBackwardData_v8(self, handle, desc, dev_lengths, y_desc, y, dy, x_desc, dx, h_desc,
                                 hx, dhy, dhx, c_desc, cx, dcy, dcx, w_size, w, work_size, work,
                                 reserve_size, reserve):
        problem, X, HX, CX, W, out = self.state[reserve]
        config, dtype = problem.config, problem.dtype
        width = config.num_dirs * config.state_size
        # the backend hands backward the same inputs and outputs forward saw and made
        np.testing.assert_array_equal(_array(y, dtype, problem.data_shape(width)), out[0])
        np.testing.assert_array_equal(self._views(problem, config, dtype, 0, hx, cx, w)[1], HX)
        np.testing.assert_array_equal(_array(w, dtype, W.shape), W)
        DY = _array(dy, dtype, problem.data_shape(width))
        DHY = _array(dhy, dtype, HX.shape)
        DCY = _array(dcy, dtype, CX.shape) if dcy else None
        grads = numpy_backend.backprop(problem, X, *self._states(problem, HX, CX), W, *out[:3], DY,
                                       *self._states(problem, DHY, DCY), out[3])
        g_h, g_c = self._states(problem, grads[1], grads[2] if config.is_lstm else None)
        _array(dx, dtype, X.shape)[...] = grads[0]
        _array(dhx, dtype, HX.shape)[...] = g_h
        if dcx:
            _array(dcx, dtype, CX.shape)[...] = g_c
        self.state[reserve] = self.state[reserve] + (grads[3],)

    def _cudnnRNNBackwardWeights_v8(self, handle, desc, add, dev_lengths, x_desc, x, h_desc, hx,
                                    y_desc, y, w_size, dw, work_size, work, reserve_size, reserve):
        assert add == capi.CUDNN_WGRAD_MODE_ADD
        problem, X = self.state[reserve][:2]
        np.testing.assert_array_equal(_array(x, problem.dtype, X.shape), X)
        dparams = self.state.pop(reserve)[-1]
        _array(dw, dparams.dtype, dparams.shape)[...] += dparams


_GPU_CALLS = {"cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnDropoutGetStatesSize",
              "cudnnSetDropoutDescriptor", "cudnnRestoreDropoutDescriptor",
              "cudnnGetRNNWeightSpaceSize", "cudnnGetRNNWeightParams", "cudnnGetRNNTempSpaceSizes",
              "cudnnRNNForward", "cudnnRNNBackwardData_v8", "cudnnRNNBackwardWeights_v8"}
