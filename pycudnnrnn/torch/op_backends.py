"""What runs inside the PyTorch ops: one backend call on the tensors' device.

The ops in ``pycudnnrnn.torch.ops`` know nothing of backends; they call the functions
here. ``run_forward`` and ``run_backprop`` take real tensors and return fresh ones;
``reserve_nbytes`` answers, without running anything, how large the reserve space of a
call will be: a function of shapes and attributes alone, never of the lengths.

* CPU tensors go through the functional API (its results are already new arrays, which
  PyTorch adopts through DLPack without a copy).
* CUDA tensors run on an ``RNNPlan`` (from the functional API's plan cache) into buffers
  PyTorch allocates: outputs, reserve space and forward's workspace come from PyTorch's
  caching allocator, and the plan runs on PyTorch's current stream, with anything CuPy
  allocates on the way also taken from PyTorch's allocator. So ``torch.cuda.memory``
  statistics and CUDA graph pools see every buffer, and a run makes no host↔device copy.
  Each training forward with dropout is named by a key from PyTorch's CUDA generator
  (``dropout_key``), so that a forward run again from the same generator state (as
  ``torch.utils.checkpoint`` recomputes) draws the same masks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import numpy as np
import torch

from .. import api, graphs, plan
from ..core import checks, gpu
from ..core.arrays import BackpropAddresses, ForwardAddresses, host_lengths
from ..core.config import Attributes
from ..core.lru import LRU
from . import torch_kernels

_NUMPY_DTYPES = {torch.float16: np.dtype(np.float16), torch.float32: np.dtype(np.float32),
                 torch.float64: np.dtype(np.float64)}


def numpy_dtype(dtype: torch.dtype):
    """NumPy's dtype for `dtype` (what the checks read), or `dtype` itself where NumPy has
    none (the checks then name it as unsupported)."""
    if dtype == torch.bfloat16:
        try:
            import ml_dtypes
        except ImportError:
            return dtype
        return np.dtype(ml_dtypes.bfloat16)
    found = _NUMPY_DTYPES.get(dtype)
    if found is None:  # integers, bool, complex: named in the checks' messages
        try:
            found = torch.empty(0, dtype=dtype).numpy().dtype
        except TypeError:
            return dtype
    return found


class _Shape:
    """What the argument checks read of an array (shape, ndim, dtype), for fake tensors.

    The sizes at `static` axes fix the configuration (layers, widths, params length):
    a traced graph specialises on them. Time and batch may stay symbolic.
    """

    def __init__(self, tensor, static=()):
        self.shape = tuple(int(d) if axis in static else d for axis, d in enumerate(tensor.shape))
        self.ndim, self.dtype = tensor.dim(), numpy_dtype(tensor.dtype)


def _shapes(input, input_h, input_c, params, attributes):
    lstm = attributes.lstm
    state_axes = (0 if attributes.time_major else 1, 2)
    return dict(input=_Shape(input, (2,)), input_h=_Shape(input_h, state_axes),
                input_c=_Shape(input_c, state_axes) if lstm and input_c is not None else None,
                params=params if not isinstance(params, torch.Tensor) else _Shape(params, (0,)))


def problem(input, input_h, input_c, params, attributes, **sizes):
    """The validated ``Problem`` of a forward call, from shapes and dtypes alone.

    `attributes`: the call's ``Attributes`` (its seeds unused: the checks see seed 0, the
    seed being a tensor); `sizes`: ``num_layers``, ``num_units``, ``input_size`` to hold
    the shapes to (``ops.check_call``).

    Works on fake tensors (it reads no data, and no sequence lengths: no size depends
    on them), and raises the functional API's own errors. `params` may be a tensor
    or anything with ``shape``, ``ndim`` and a NumPy ``dtype`` (see
    ``flat_weights.weights_problem``). Remembered for tensors of known sizes: the op's
    kernels ask at every call.
    """
    def build():
        shapes = _shapes(input, input_h, input_c, params, attributes)
        keywords = attributes.keywords()
        keywords.update(seed=0, seed2=0)
        return checks.check_forward(*shapes.values(), None, **keywords, **sizes)

    key = known_sizes_key(input, input_h, input_c, params, attributes_key(attributes),
                          tuple(sizes.items()))
    return build() if key is None else _problems.get(key, build)


_problems = LRU(64)


def attributes_key(attributes: Attributes) -> tuple:
    """`attributes`' values and their types as a cheap cache key part: a plain tuple,
    hashed and compared in C (a dataclass's ``__hash__`` and ``__eq__`` are Python). The
    types: True and 1 are equal keys but not the same argument (an int is_training is
    refused, and a key without its type let it pass after a call with True)."""
    values = tuple(vars(attributes).values())
    return values + tuple(map(type, values))


def known_sizes_key(*parts):
    """A cache key of tensors' shapes and dtypes and other hashable parts; None when a
    size is symbolic (a trace's: no key, lest it be specialised) or a part unhashable."""
    key = tuple(_sizes_key(part) for part in parts)
    try:
        hash(key)  # a symbolic size is unhashable (a SymInt refuses hash() without a guard)
    except TypeError:
        return None
    return key


def _sizes_key(part):
    if isinstance(part, torch.Tensor):
        return part.shape, part.dtype, part.device
    if isinstance(part, (list, tuple)) and part and isinstance(part[0], torch.Tensor):
        return tuple(map(_sizes_key, part))
    return part


def reserve_nbytes(problem, like: torch.Tensor):
    """Bytes of the reserve space forward returns for `problem` (without lengths) on the
    device of tensor `like`: the same whatever the lengths, so that the ops' fakes give
    it and a compiled graph has no size learnt at run time (CUDA graphs take none).

    On CUDA it is cuDNN's size when every row runs, the most any lengths need (a plan
    for lengths with empty rows uses its start), asked of cuDNN on the device (raising
    ``CudnnUnavailableError`` without one). Returns None when time or batch are
    symbolic (a dynamic-shape trace): cuDNN tells sizes for numbers only.
    """
    if not problem.is_training:
        return 0
    if not on_gpu(like):
        return torch_kernels.RESERVE_NBYTES if torch_kernels.runs_kernels(problem) else \
            plan.reserve_nbytes(problem, None)
    with _on_device(like), _library_memory(like):  # a plan may be built: see there
        return plan.reserve_nbytes(problem, _plan_device(like))


def seed_int(seed) -> int:
    """The op's seed (a 0-d int64 tensor, or None: seed 0) as a Python int."""
    return 0 if seed is None else int(seed)


def split_seed(seed) -> dict:
    """The op's 64-bit seed (a 0-d int64 tensor, or None: seed 0) as the API's ``seed``
    (high 32 bits) and ``seed2`` (low)."""
    value = seed_int(seed) & 0xFFFFFFFFFFFFFFFF
    return dict(seed=value >> 32, seed2=value & 0xFFFFFFFF)


def on_gpu(tensor) -> bool:
    """Whether the ops run `tensor` on cuDNN (a plan on a CUDA device)."""
    return tensor.device.type == "cuda"


def dropout_key(tensor):
    """This training forward's name for its masks: PyTorch's generator state on the
    device of `tensor`, which is then advanced, as a random op advances it.

    A forward run again from a restored generator state (``torch.utils.checkpoint``
    restores it before recomputing; so do ``torch.random.fork_rng`` and
    ``torch.cuda.manual_seed``) gets the same key, and so its masks. None while the
    stream captures a CUDA graph: the generator may not be read then.
    """
    if tensor.device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return None
        generator = torch.cuda.default_generators[_cuda_index(tensor)]
        offset = generator.get_offset()
        generator.set_offset(offset + 4)  # philox offsets step by 4
        return generator.initial_seed(), offset
    # The stand-in GPU's tests run CPU tensors on plans: a draw from the CPU's generator,
    # which torch.utils.checkpoint restores as it does CUDA's.
    return int(torch.randint(0, 2 ** 62, (), dtype=torch.int64))


# --------------------------------------------------------------------------- the runs

def run_forward(input, input_h, input_c, params, sequence_lengths, seed, attributes):
    """``pycudnnrnn.forward`` on tensors; returns (output, output_h, output_c, reserve).

    `params`: the flat params, or torch.nn's weights (``flat_weights.Weights``, checked),
    which the CPU's PyTorch kernels take as they are.
    """
    input, input_h, input_c, params = _detached(input, input_h, input_c, params)
    lengths = host_lengths(sequence_lengths)
    if not on_gpu(input) and input.dtype in torch_kernels.DTYPES:
        checked = _host_problem(input, input_h, input_c, params, lengths, attributes)
        if torch_kernels.runs_kernels(checked):
            return torch_kernels.forward_kernel(checked, input, input_h, input_c, params,
                                                _lengths_tensor(lengths), attributes)
    params = _flat(params)  # every other backend takes the flat params
    if not on_gpu(input):
        keywords = attributes.keywords()
        keywords.update(split_seed(seed))
        return api.forward(input, input_h, input_c, params, lengths, **keywords)
    with _on_device(input):
        return planned_forward(input, input_h, input_c, params, lengths, seed, attributes)


def run_backprop(input, input_h, input_c, params, sequence_lengths, seed, output, output_h,
                 output_c, output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                 attributes, gradients, trust_reserve=False):
    """``pycudnnrnn.backprop`` on tensors; skipped gradients come back as None.

    `params` as for ``run_forward``.

    `trust_reserve`: `reserve_space` is known to be the forward's (the ops' autograd
    formula), so on CUDA no header is read back from the GPU (a sync, refused under
    CUDA-graph capture) even when the tensor object is not forward's own; on the CPU's
    PyTorch kernels the forward's graph runs once (``torch_kernels.backprop_kernel``).
    """
    if not attributes.is_training:  # backprop's is training's (forward's attributes given)
        attributes = attributes.replace(is_training=True)
    arrays = _detached(input, input_h, input_c, params, output, output_h, output_c,
                       output_backprop, output_h_backprop, output_c_backprop)
    lengths = host_lengths(sequence_lengths)
    if not on_gpu(input) and torch_kernels.runs_backprop(reserve_space):  # PyTorch's kernels
        checked = _host_problem(*arrays[:4], lengths, attributes)
        _check_backprop_arrays(checked, arrays[4:])
        return torch_kernels.backprop_kernel(checked, *arrays[:4], _lengths_tensor(lengths),
                                             arrays[7:], reserve_space, attributes, gradients,
                                             own=trust_reserve)
    arrays[3] = _flat(arrays[3])  # every other backend takes the flat params
    if not on_gpu(input):
        keywords = attributes.keywords()
        del keywords["is_training"]  # (backprop has none: it is training's)
        keywords.update(split_seed(seed))
        return api.backprop(*arrays[:4], lengths, *arrays[4:], reserve_space, **keywords,
                            gradients=gradients)
    with _on_device(input):
        return planned_backprop(*arrays, reserve_space, lengths, seed, attributes, gradients,
                                trust_reserve)


class ModulePlans:
    """The latest training plan with dropout of each (device, seed), held for reuse.

    On CUDA each module has its own dropout seed. Holding its plan keeps that seed's cuDNN
    dropout state alive (the shared caches keep only a few seeds; a state initialised
    again would repeat its masks), and gives the module its plan back at the next call
    with the same shapes and lengths even when the functional API's small cache of
    dropout plans has dropped it (a rebuilt plan costs descriptors and a sync). One plan
    per live module with dropout and device (about 6 MiB of dropout state each; PyTorch's
    own RNNs share one state per device instead): modules ``acquire`` their seed when
    built and ``release`` it when collected, and a seed no live module holds is dropped.
    """

    def __init__(self):
        self._held, self._holders = {}, {}
        self._lock = threading.Lock()

    def acquire(self, seed: int):
        """A module with this seed exists (seeds may be shared: they are counted)."""
        with self._lock:
            self._holders[seed] = self._holders.get(seed, 0) + 1

    def release(self, seed: int):
        """A module with this seed is gone; the last one drops the seed's plans."""
        with self._lock:
            self._holders[seed] = self._holders.get(seed, 1) - 1
            if self._holders[seed] <= 0:
                del self._holders[seed]
                for device_seed in [k for k in self._held if k[1] == seed]:
                    del self._held[device_seed]

    def get(self, device, seed: int, key, build):
        """The held plan for (device, seed) if it was built for `key`, else ``build()``."""
        held = self._held.get((device, seed))
        if held is not None and held[0] == key:
            return held[1]
        run = build()
        with self._lock:
            if seed in self._holders:  # a functional call's seed is not held
                self._held[(device, seed)] = (key, run)
        return run

    def __len__(self):
        return len(self._held)


_module_plans = ModulePlans()
acquire_seed, release_seed = _module_plans.acquire, _module_plans.release


def planned_forward(input, input_h, input_c, params, lengths, seed, attributes):
    """Forward on a cached ``RNNPlan``, into buffers PyTorch allocates (any device)."""
    run = _plan(input, input_h, input_c, params, lengths, seed, attributes)
    is_training, lstm = attributes.is_training, attributes.lstm
    reserve = _empty((_reserve_nbytes(run, input),), input, torch.uint8) if is_training \
        else None
    out = (_empty(run.output_shape, input), _empty(run.output_h_shape, input),
           _empty(run.output_c_shape, input) if lstm else None, _used(reserve, run))
    key = dropout_key(input) if is_training and attributes.dropout > 0 else None
    workspace = _workspace(run.forward_workspace_nbytes, input)
    if run.runs_in_place and _plain(lstm, (input, input_h, params), (input_c,)):
        # The common case: cuDNN runs on the tensors' addresses, none crosses DLPack.
        run.forward_at(ForwardAddresses(*map(_address, (
            input, input_h, input_c if lstm else None, params, *out[:3], workspace,
            reserve))), dropout_key=key)
    else:
        # Each tensor crosses DLPack once, into the plan; the results are `out` already,
        # so they are not exported back (return_results=False).
        run.forward(input, input_h, input_c, params, out=out, workspace=workspace,
                    return_results=False, check_overlaps=False,  # fresh buffers: no overlap
                    dropout_key=key)
    if is_training:
        # Noted by the tensor (the plan saw at most a DLPack view, which dies now), so
        # that backward reads no header back from the GPU.
        run.trust_reserve(reserve, reserve.data_ptr())
    return (out[0], out[1], out[2] if lstm else input.new_empty((0,)),
            reserve if is_training else input.new_empty((0,), dtype=torch.uint8))


def _address(tensor) -> int:
    """A tensor's device address for ``forward_at`` and ``backprop_at``; 0 for None."""
    return 0 if tensor is None else tensor.data_ptr()


def _plain(lstm, tensors, cell_states) -> bool:
    """Whether `tensors`, and an LSTM's `cell_states` (others' are not read), are what
    ``RNNPlan.forward_at`` and ``backprop_at`` take on trust: contiguous, of one dtype,
    on one device (the first one's dtype is the plan's key's), no
    negative bit (a lazy sign, which the DLPack path resolves). Else the plan's own
    checks run, and say what is wrong."""
    if lstm:
        if any(t is None for t in cell_states):
            return False
        tensors = (*tensors, *cell_states)
    dtype, device = tensors[0].dtype, tensors[0].device
    return all(t.dtype == dtype and t.device == device and t.is_contiguous() and not t.is_neg()
               for t in tensors)


def planned_backprop(input, input_h, input_c, params, output, output_h, output_c,
                     output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                     lengths, seed, attributes, gradients, trust_reserve=False):
    """Backprop on a cached ``RNNPlan``, into buffers PyTorch allocates (any device);
    `attributes` a forward's (its is_training unread: backprop's plan is training's)."""
    if not attributes.is_training:
        attributes = attributes.replace(is_training=True)
    run = _plan(input, input_h, input_c, params, lengths, seed, attributes)
    lstm = attributes.lstm
    data, weights = gradients in ("all", "data"), gradients in ("all", "weights")
    out = (_empty(run.input_shape, input) if data else None,
           _empty(run.output_h_shape, input) if data else None,
           _empty(run.output_c_shape, input) if data and lstm else None,
           _empty((run.params_size,), input) if weights else None)
    reserve_space, workspace = _used(reserve_space, run), _workspace(run.workspace_nbytes, input)
    results = ((output, run.output_shape), (output_h, run.output_h_shape),
               (output_backprop, run.output_shape), (output_h_backprop, run.output_h_shape))
    if lstm:
        results += ((output_c, run.output_c_shape), (output_c_backprop, run.output_c_shape))
    if data and run.runs_in_place and _plain_reserve(reserve_space, input) and all(
            t is not None and t.shape == shape for t, shape in results) and _plain(
            lstm, (input, input_h, params, output, output_backprop, output_h_backprop),
            (input_c, output_c_backprop)):
        # The common case, as in planned_forward: on the tensors' addresses (the plan's
        # key fixed the inputs' shapes; the results' and their gradients' are checked above).
        if trust_reserve:
            run.trust_reserve(reserve_space, reserve_space.data_ptr())
        c = (lambda t: t) if lstm else (lambda t: None)  # noqa: E731
        if run.backprop_at(BackpropAddresses(*map(_address, (
                input, input_h, c(input_c), params, output, output_backprop,
                output_h_backprop, c(output_c_backprop), *out, workspace)),
                0 if workspace is None else workspace.numel(), reserve_space.data_ptr(),
                reserve_space.numel())):
            return _gradients(out, (True, True, True, True if weights else None), input)
        # a reserve space this process did not note: the checked path reads its header
    grads = run.backprop(input, input_h, input_c, params, output, output_h, output_c,
                         output_backprop, output_h_backprop, output_c_backprop,
                         reserve_space, out=out, workspace=workspace, gradients=gradients,
                         trust_reserve=trust_reserve, return_results=False,
                         check_overlaps=False)
    return _gradients(out, grads, input)


def _gradients(out, computed, like):
    """Ours where computed; an empty tensor for the c gradient of other cells."""
    return tuple(None if g is None else o if o is not None else like.new_empty((0,))
                 for g, o in zip(computed, out))


def _plain_reserve(reserve_space, like) -> bool:
    """A reserve space ``backprop_at`` can take: 1-D contiguous bytes on `like`'s device."""
    return reserve_space is not None and reserve_space.dtype == torch.uint8 and \
        reserve_space.dim() == 1 and \
        reserve_space.is_contiguous() and reserve_space.device == like.device


def _plan(input, input_h, input_c, params, lengths, seed, attributes: Attributes):
    """The plan for a call of `attributes` (their seeds unread: `seed`, the op's tensor,
    is the call's)."""
    device = _plan_device(input)

    def build():
        with _library_memory(input):
            return plan.for_call(_shapes(input, input_h, input_c, params, attributes), lengths,
                                 attributes.replace(**split_seed(seed)), device)

    if device is None:
        return build()
    # The attributes as given (values and types), seeds included: a training plan's seed
    # is the call's `seed`, keyed beside them.
    values = attributes_key(attributes)
    if not (attributes.is_training and attributes.dropout > 0):
        # Keyed on the tensors' own shape and dtype objects: no per-call conversion to
        # what for_call's key reads (that runs on a miss, with the checks).
        key = (device, input.dtype, input.shape, input_h.shape,
               None if input_c is None else input_c.shape, params.shape,
               plan.lengths_key(lengths), gpu.get_allow_tf32(), values, seed_int(seed))
        return plan.for_adapter(key, build)
    key = (str(input.dtype), tuple(None if t is None else tuple(t.shape)
                                   for t in (input, input_h, input_c, params)),
           None if lengths is None else lengths.tolist(), values, seed_int(seed),
           gpu.get_allow_tf32())
    return _module_plans.get(device, seed_int(seed), key, build)


def _plan_device(tensor):
    """The device index a plan for `tensor` is built on; None on the CPU."""
    return _cuda_index(tensor) if on_gpu(tensor) else None


def _empty(shape, like, dtype=None):
    return torch.empty(tuple(shape), dtype=dtype or like.dtype, device=like.device)


def _workspace(nbytes, like):
    return _empty((nbytes,), like, torch.uint8) if nbytes else None


def _reserve_nbytes(run, like):
    """The reserve tensor's size for `run`: the ops' fakes' (``reserve_nbytes``)."""
    if run.problem.lengths is None:
        return run.reserve_nbytes  # the plan is the one every row runs on
    nbytes = reserve_nbytes(dataclasses.replace(run.problem, lengths=None), like)
    if nbytes < run.reserve_nbytes:  # not expected of cuDNN: say so
        raise RuntimeError(f"pycudnnrnn: the plan for these sequence lengths needs a "
                           f"{run.reserve_nbytes}-byte reserve space, more than the "
                           f"{nbytes} bytes of every row running, the size the ops allocate")
    return nbytes


def _used(reserve, run):
    """The start of reserve tensor `reserve` that `run` uses (all of it, unless lengths
    leave rows out), or None."""
    if reserve is None or reserve.numel() == run.reserve_nbytes:
        return reserve
    return reserve[:run.reserve_nbytes]


def _cuda_index(tensor) -> int:
    """The CUDA device of `tensor` ("cuda" without an index: PyTorch's current one)."""
    index = tensor.device.index
    return index if index is not None else torch.cuda.current_device()


@contextlib.contextmanager
def _on_device(tensor):
    """Run CuPy on PyTorch's current stream and allocator when `tensor` is on CUDA."""
    if tensor.device.type != "cuda":
        yield
        return
    cupy = gpu.cupy()
    device = _cuda_index(tensor)
    stream = torch.cuda.current_stream(device)
    allocator = _allocator(cupy, device, stream)
    with cupy.cuda.Device(device), gpu.external_stream(cupy, stream.cuda_stream, device), \
            cupy.cuda.using_allocator(allocator.malloc):
        yield


def _library_memory(tensor):
    """CuPy's own pool, inside ``_on_device``, for what outlives the call (a plan's
    buffers, its dropout states): PyTorch's allocator may be a CUDA graph's private pool
    then (CUDA-graph trees warm up in theirs), which must hold only what the graph's
    outputs hold."""
    if tensor.device.type != "cuda":
        return contextlib.nullcontext()
    cupy = gpu.cupy()
    return cupy.cuda.using_allocator(cupy.get_default_memory_pool().malloc)


_allocators: dict = {}  # (device, stream handle) → CuPy allocator on PyTorch's
_MAX_ALLOCATORS = 256   # streams come from PyTorch's pools: few; a bound all the same


def _allocator(cupy, device: int, stream):
    """CuPy's allocator taking PyTorch's caching allocator on `stream`, one per (device,
    stream), made once: not a new allocator object per call."""
    key = (device, stream.cuda_stream)
    allocator = _allocators.get(key)
    if allocator is None:
        allocator = cupy.cuda.memory.PythonFunctionAllocator(
            lambda size, device_id: torch.cuda.caching_allocator_alloc(size, device_id, stream),
            lambda pointer, device_id: torch.cuda.caching_allocator_delete(pointer))
        if len(_allocators) >= _MAX_ALLOCATORS:
            _allocators.clear()
        _allocators[key] = allocator
    return allocator


# PyTorch's allocator keeps a call's temporaries for a graph: under torch.cuda.graph it
# takes them from the graph's private pool (see ``graphs.keeps_blocks_for_graphs``).
graphs.keeps_blocks_for_graphs(
    lambda allocator: any(allocator == a.malloc for a in list(_allocators.values())))


def _host_problem(input, input_h, input_c, params, lengths, attributes):
    """The validated ``Problem`` of a CPU call, its lengths checked and in it (the reserve
    space's identity covers them)."""
    checked = problem(input, input_h, input_c, params, attributes) \
        if isinstance(params, torch.Tensor) else params.problem
    if lengths is None:
        return checked
    return dataclasses.replace(checked, lengths=checks.check_lengths(
        lengths, checked.batch_size, checked.max_time))


_BACKPROP_ARRAYS = ("output", "output_h", "output_c", "output_backprop", "output_h_backprop",
                    "output_c_backprop")


def _check_backprop_arrays(problem, arrays):
    """Forward's results and their gradients (in ``_BACKPROP_ARRAYS`` order) checked as
    every backend checks them: each of `problem`'s dtype and shape."""
    shaped = {name: None if a is None else _Shape(a) for name, a in zip(_BACKPROP_ARRAYS, arrays)}
    checks.check_arrays(shaped, checks.backprop_shapes(problem), problem.dtype)


def _lengths_tensor(lengths):
    """Host lengths (checked, or None) as the int64 tensor PyTorch's kernels take."""
    return None if lengths is None else torch.as_tensor(np.asarray(lengths, np.int64))


def _flat(params):
    """The flat params: `params` itself, or those of ``flat_weights.Weights``."""
    return params if isinstance(params, torch.Tensor) else params.flat()


def _detached(*tensors):
    # An op's kernel still sees requires_grad on its arguments, and DLPack refuses those.
    # (flat_weights.Weights hold detached tensors already.)
    return [t.detach() if isinstance(t, torch.Tensor) else t for t in tensors]
