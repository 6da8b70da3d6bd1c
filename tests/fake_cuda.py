"""A stand-in GPU for CI: runs the cuDNN backend's own code with host memory.

* ``FakeCupy`` is the slice of CuPy the backend uses, over NumPy arrays whose
  ``__dlpack_device__`` says CUDA, so the public API routes them to the cuDNN backend.
* ``FakeCudnn`` replaces the handful of cuDNN calls that need a GPU. Every call still
  goes through a ctypes function built from the project's prototype table, so argument
  marshalling is exercised for real; descriptors are real cuDNN objects (they need no
  GPU) and are read back through cuDNN. The RNN itself is computed by the NumPy backend
  on the rows cuDNN is handed, and the fake refuses what cuDNN refuses (zero lengths).

What it adds to catch GPU bugs a CPU test would miss:

* its own weight-slot table in cuDNN's documented order (all matrices, then all biases;
  per pseudo-layer, by linLayerID), not ``pycudnnrnn.layout``'s; ``test_fake_cuda.py``
  holds it against the table cuDNN 9.19 gave on an H200 (``tests/data/gpu-layout.json``);
* padding behaves as in cuDNN's products over every (t, b) slot: a NaN in the padding of
  x or dy handed to cuDNN spreads into the gradients (0 · NaN = NaN), so the backend must
  zero it; fresh device memory is NaN, as garbage would be;
* counters (``COUNTS``) of host↔device copies and syncs (host data turned into device
  arrays, device data read back, scalars read from device arrays, synchronize) and of
  device allocations and copies; while a stream captures a graph (``FakeStream``),
  transfers and syncs raise, as CUDA refuses them.

``install(monkeypatch)`` is the one way in: it replaces ``pycudnnrnn.gpu.cupy`` and
``pycudnnrnn.cudnn.capi.api``, the only two places the library finds CuPy and cuDNN.
What this cannot show is cuDNN's own arithmetic: the ``gpu`` tests do.
"""

import collections
import ctypes
import functools
import types

import ml_dtypes
import numpy as np

from pycudnnrnn import dtypes, gpu, numpy_backend, plan
from pycudnnrnn.config import GATES, Problem, RNNConfig
from pycudnnrnn.cudnn import capi
from pycudnnrnn.cudnn.capi import api as real_api

#: Host↔device traffic of the stand-in GPU since the last ``reset_counts()``.
COUNTS: collections.Counter = collections.Counter()

#: Whether a stream is capturing a graph: transfers and syncs then fail, as in CUDA.
CAPTURING = []


def reset_counts():
    COUNTS.clear()


def _count(kind):
    if CAPTURING:
        raise RuntimeError(f"the current stream is capturing, so {kind} is disallowed")
    COUNTS[kind] += 1


def install(monkeypatch):
    """Put the stand-in GPU in place of CuPy and cuDNN's GPU calls; returns the FakeCudnn."""
    fake_cupy, fake_api = FakeCupy(), FakeCudnn()
    monkeypatch.setattr(gpu, "cupy", lambda: fake_cupy)
    monkeypatch.setattr(capi, "api", lambda: fake_api)
    plan.clear_caches()  # nothing built on another GPU (or this one, earlier) is reused
    reset_counts()
    CALLS.clear()
    CAPTURING.clear()
    return fake_api


class _Pointer:
    __slots__ = ("ptr",)


class FakeDeviceArray(np.ndarray):
    """Host memory that says it lives on CUDA device 0; reading it on the host counts."""

    def __dlpack_device__(self):
        return (2, 0)

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray) and not isinstance(value, FakeDeviceArray) and value.size > 1:
            _count("host_to_device")
        super().__setitem__(key, value)

    def __array_wrap__(self, array, context=None, return_scalar=False):
        return array.view(FakeDeviceArray)  # results stay on the device, even 0-d ones

    def __getitem__(self, key):
        item = super().__getitem__(key)
        return item if isinstance(item, np.ndarray) else np.asarray(item).view(FakeDeviceArray)

    def _read(self, convert):
        _count("device_to_host")
        _count("sync")
        return convert(np.asarray(self).view(np.ndarray))

    def __bool__(self):
        return self._read(bool)

    def __float__(self):
        return self._read(float)

    def __int__(self):
        return self._read(int)

    def item(self, *args):
        return self._read(lambda a: a.item(*args))

    def tolist(self):
        return self._read(lambda a: a.tolist())

    def get(self):
        return self._read(np.array)

    def copy(self, order="C"):
        COUNTS["device_copy"] += 1
        return super().copy(order)

    @property
    def data(self):
        pointer = _Pointer()
        pointer.ptr = self.ctypes.data
        return pointer

    @property
    def device(self):
        return types.SimpleNamespace(id=0)


def _device(a):
    return np.asarray(a).view(FakeDeviceArray)


class _NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class FakeGraph:
    """What the stand-in captured: the cuDNN calls made (it cannot replay NumPy work)."""

    def __init__(self, calls):
        self.calls, self.launches = calls, 0

    def launch(self, stream=None):
        self.launches += 1


class FakeStream(_NoContext):
    """A stream whose capture makes transfers and syncs fail, as CUDA's does."""

    def __init__(self, non_blocking=False):
        self.ptr = 0

    def synchronize(self):
        _count("sync")

    def begin_capture(self, mode=None):
        CAPTURING.append(len(CALLS))

    def end_capture(self):
        start = CAPTURING.pop()
        return FakeGraph(CALLS[start:])


#: Every stand-in cuDNN GPU call, in order (FakeCudnn.calls is per instance).
CALLS = []


@functools.lru_cache(maxsize=None)
def _garbage(dtype):
    """What fresh memory of `dtype` holds: NaN for the floats (cached: dtype names are slow)."""
    return np.nan if dtypes.is_supported(dtype) else 0xAB


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

        def synchronize():
            _count("sync")

        stream.synchronize = synchronize
        Device.synchronize = staticmethod(synchronize)
        self.cuda = types.SimpleNamespace(
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, getDevice=lambda: 0,
                                          deviceSynchronize=synchronize),
            Device=Device, get_current_stream=lambda: stream, Stream=FakeStream,
            MemoryPool=lambda: types.SimpleNamespace(malloc=None),
            using_allocator=lambda allocator: _NoContext())

    def empty(self, shape, dtype=np.float32):
        # Garbage, as on a GPU: NaN for floats, so a read of unwritten memory shows.
        COUNTS["device_alloc"] += 1
        return _device(np.full(shape, _garbage(np.dtype(dtype)), dtype))

    def zeros(self, shape, dtype=np.float32):
        COUNTS["device_alloc"] += 1
        return _device(np.zeros(shape, dtype))

    def empty_like(self, a):
        return self.empty(a.shape, a.dtype)

    def asarray(self, a, dtype=None):
        if not isinstance(a, FakeDeviceArray):
            _count("host_to_device")
        return _device(np.array(a, dtype=dtype))

    def ascontiguousarray(self, a):
        if not a.flags.c_contiguous:
            COUNTS["device_copy"] += 1
        return _device(np.ascontiguousarray(a))

    def where(self, *args):
        COUNTS["device_alloc"] += 1
        return _device(np.where(*[np.asarray(a) for a in args]))

    def arange(self, *args, **kwargs):
        return _device(np.arange(*args, **kwargs))

    def asnumpy(self, a):
        _count("device_to_host")
        _count("sync")
        return np.asarray(a).view(np.ndarray).copy()

    def concatenate(self, arrays):
        return _device(np.concatenate([np.asarray(a) for a in arrays]))

    def from_dlpack(self, a):
        if isinstance(a, FakeFrameworkArray):  # a fresh view, as CuPy's import makes
            return a.array.view(FakeDeviceArray)
        raise AssertionError("the fake GPU only takes FakeDeviceArray or FakeFrameworkArray")


class FakeFrameworkArray:
    """Another library's array on the stand-in GPU, taken in through DLPack."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("the stand-in imports it through FakeCupy.from_dlpack")


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
        self.state = {}  # token in the reserve space → what forward computed, for backward
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
        size[0] = weight_space_elements(config) * np.dtype(dtype).itemsize

    def _cudnnGetRNNWeightParams(self, handle, desc, k, size, space, lin, m_desc, m_addr, b_desc, b_addr):
        config, dtype = self._rnn(desc)
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
                state(cx, config.num_units), _array(w, dtype, (weight_space_elements(config),)))

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
            token = len(self.state) + 1  # in the reserve space, so a copy of it works too
            _array(reserve, np.int64, (1,))[0] = token
            self.state[token] = (problem, copy(X), copy(HX), copy(CX), copy(W), out)

    def _cudnnRNNBackwardData_v8(self, handle, desc, dev_lengths, y_desc, y, dy, x_desc, dx, h_desc,
                                 hx, dhy, dhx, c_desc, cx, dcy, dcx, w_size, w, work_size, work,
                                 reserve_size, reserve):
        token = int(_array(reserve, np.int64, (1,))[0])
        problem, X, HX, CX, W, out = self.state[token][:6]
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
        _array(dx, dtype, X.shape)[...] = grads[0] + _padding_poison(problem, DY)
        _array(dhx, dtype, HX.shape)[...] = g_h
        if dcx:
            _array(dcx, dtype, CX.shape)[...] = g_c
        self.state[token] = self.state[token][:6] + (grads[3],)

    def _cudnnRNNBackwardWeights_v8(self, handle, desc, add, dev_lengths, x_desc, x, h_desc, hx,
                                    y_desc, y, w_size, dw, work_size, work, reserve_size, reserve):
        assert add == capi.CUDNN_WGRAD_MODE_ADD
        token = int(_array(reserve, np.int64, (1,))[0])
        problem, X = self.state[token][:2]
        np.testing.assert_array_equal(_array(x, problem.dtype, X.shape), X)
        dparams = self.state[token][6]
        _array(dw, dparams.dtype, dparams.shape)[...] += dparams + _padding_poison(problem, X)


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
