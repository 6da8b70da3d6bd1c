"""The GPU hazards of issue 17, each pinned by a test that failed before its fix.

Each runs on the stand-in GPU of ``fake_cuda``, which lives in time (queued work,
poisoned reuse of freed memory, cuDNN writing its ``[in,out]`` reserve space, dropout
state that advances) and, where it takes the ``device`` fixture, on a real GPU too
(marked ``gpu``, in ``make gpu-check``). ``docs/gpu.md`` states each guarantee.
"""

import gc
import hashlib
import threading

import numpy as np
import pytest

import fake_cuda
import pycudnnrnn
from pycudnnrnn.core.config import Attributes
from conftest import make_case
from pycudnnrnn import plan as plans


def _put_all(device, case):
    return [None if a is None else device.put(a)
            for a in (case.input, case.input_h, case.input_c, case.params)]


def _grads(device, out, seed=0):
    rng = np.random.default_rng(seed)
    return [device.put(rng.standard_normal(a.shape).astype(a.dtype)) for a in out[:3]]


def _digest(device, array):
    return hashlib.sha256(device.get(array).tobytes()).hexdigest()


# ----------------------------------------------------------------- 1: the reserve space

def test_one_reserve_space_serves_any_number_of_backprops(device):
    """cuDNN's backward calls take reserveSpace [in,out]: backprop hands them a copy, so
    the caller's reserve space is unchanged (hashed around two backprops) and a second
    backprop from one forward (retain_graph, a JAX vjp called twice) equals the first."""
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", num_units=8,
                     dtype=np.float32)
    args = _put_all(device, case)
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    grads = _grads(device, out)
    before = _digest(device, out[3])
    first = pycudnnrnn.backprop(*args, case.sequence_lengths, *out[:3], *grads, out[3],
                                **case.attrs)
    first = [device.get(g) for g in first]
    second = pycudnnrnn.backprop(*args, case.sequence_lengths, *out[:3], *grads, out[3],
                                 **case.attrs)
    assert _digest(device, out[3]) == before
    for name, a, b in zip(("input", "input_h", "input_c", "params"), first, second):
        assert np.isfinite(a).all(), name
        np.testing.assert_array_equal(device.get(b), a, err_msg=name)


def test_a_reserve_noted_by_two_buffers_is_known_while_either_lives():
    """A trusted backprop notes the reserve space by its own argument (a view, a tensor
    rebuilt around forward's memory): when that object dies, forward's note stays, so a
    later backprop with forward's buffer reads no header back from the GPU."""
    from pycudnnrnn.core import reserve_header
    forward = np.zeros(64, np.uint8)
    pointer, head, other = forward.ctypes.data, b"h" * 32, b"o" * 32
    reserve_header.remember(forward, pointer, head)
    view = forward[:]
    reserve_header.remember(view, pointer, head)
    reserve_header.remember(view, pointer, head)  # noted again: still one note of it
    del view
    gc.collect()
    assert reserve_header.known(pointer) == head
    later = forward[:]
    reserve_header.remember(later, pointer, other)  # another forward wrote the memory
    assert reserve_header.known(pointer) == other
    del later
    gc.collect()
    assert reserve_header.known(pointer) is None  # forward's note was of the old header
    del forward


def test_a_noted_buffer_freed_while_the_notes_are_being_changed_does_not_deadlock():
    """A garbage collection may run inside ``remember`` (it allocates while holding the
    notes' lock) and free a noted buffer, whose callback then takes the lock on this
    same thread: it must not wait for itself."""
    from pycudnnrnn.core import reserve_header
    pointers = []

    def free_one_inside_the_lock():
        buffer = np.zeros(8, np.uint8)
        pointers.append(buffer.ctypes.data)
        reserve_header.remember(buffer, pointers[0], b"h" * 32)
        with reserve_header._known_lock:  # as a collection inside remember would
            del buffer                    # its callback runs here, on this thread

    thread = threading.Thread(target=free_one_inside_the_lock, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the callback of a freed buffer waited for its own lock"
    assert reserve_header.known(pointers[0]) is None


# ----------------------------------------------------------------- 5, 6: streams and syncs

def _ragged_plan(case, **overrides):
    kwargs = dict(num_layers=case.size["num_layers"], num_units=case.size["num_units"],
                  input_size=case.size["input_size"], max_time=case.input.shape[0],
                  batch_size=case.input.shape[1], sequence_lengths=case.sequence_lengths,
                  dtype=case.input.dtype.name, device="cuda", rnn_mode=case.attrs["rnn_mode"],
                  direction=case.attrs["direction"])
    return pycudnnrnn.RNNPlan(**{**kwargs, **overrides})


def test_building_a_plan_makes_no_host_sync(fake_gpu):
    """Its uploads (lengths, row index, padding mask, header) are queued on the current
    stream, and an event marks them: a run on another stream waits for that event."""
    from pycudnnrnn.core import gpu
    cp = gpu.cupy()
    case = make_case("gru", "bidirectional", num_layers=2, lengths="zero", num_units=6)
    fake_cuda.reset_counts()
    plan = _ragged_plan(case)
    assert fake_cuda.COUNTS["sync"] == 0
    args = [fake_cuda._device(a) for a in (case.input, case.input_h, case.params)]
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        y = plan.forward(args[0], args[1], None, args[2])[0]
        side.synchronize()
        np.testing.assert_allclose(fake_cuda.to_host(y), case.forward()[0], rtol=1e-12,
                                   atol=1e-12)


def test_plan_buffers_outlive_work_queued_on_another_stream(fake_gpu):
    """A plan built on one stream and run on another, then dropped (an LRU eviction):
    its device buffers are not reused before the other stream's work is done."""
    from pycudnnrnn.core import gpu
    cp = gpu.cupy()
    case = make_case("lstm", num_layers=2, lengths="ragged", num_units=6)
    plan = _ragged_plan(case)
    args = [fake_cuda._device(a) for a in (case.input, case.input_h, case.input_c,
                                          case.params)]
    plan.forward(*args)  # the first run settles the plan's uploads
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        y = plan.forward(*args)[0]  # queued on `side`
    del plan
    gc.collect()
    junk = [cp.zeros(n, cp.uint8) for n in range(1, 4096, 64)]  # the freed blocks, rewritten
    with side:
        side.synchronize()
        np.testing.assert_allclose(fake_cuda.to_host(y), case.forward()[0], rtol=1e-12,
                                   atol=1e-12)
    assert junk


def test_no_cudnn_handle_is_destroyed_behind_a_capture(fake_gpu):
    """cudnnDestroy synchronizes the device, which invalidates a capture in progress on
    any thread: handles live as long as the process (one per thread and device), so
    neither a thread's exit nor clear_caches destroys one."""
    from pycudnnrnn.core import gpu
    cp = gpu.cupy()
    case = make_case("gru", num_units=4)
    args = [fake_cuda._device(a) for a in (case.input, case.input_h, case.params)]
    started, finish = threading.Event(), threading.Event()

    def work():
        pycudnnrnn.forward(args[0], args[1], None, args[2], **case.attrs)  # a handle here
        started.set()
        finish.wait()

    thread = threading.Thread(target=work)
    thread.start()
    started.wait()
    pycudnnrnn.forward(args[0], args[1], None, args[2], **case.attrs)  # and one here
    fake_cuda.synchronize_all()
    stream = cp.cuda.Stream(non_blocking=True)
    stream.begin_capture()
    finish.set()
    thread.join()  # the thread's state (and what it kept) is gone
    gc.collect()
    plans.clear_caches()
    gc.collect()
    stream.end_capture()  # raises if a handle was destroyed meanwhile


# ----------------------------------------------------------------- 2: graphs

def _cupy(device):
    from pycudnnrnn.core import gpu
    return gpu.cupy() if device.kind == "stand-in" else pytest.importorskip("cupy")


def _same(device, got, want, name):
    if device.kind == "stand-in":  # the same computation, replayed: the same bits
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_captured_graph_keeps_what_its_replays_use(device):
    """Capture the functional API, evict every cache, let the pool hand their memory to
    someone who fills it, replay: the replay equals an eager step, since the graph keeps
    the plans whose device lengths, row index, mask and header it reads."""
    from pycudnnrnn import graphs
    cp = _cupy(device)
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", num_units=8,
                     dtype=np.float32)
    x, h, c, w = _put_all(device, case)
    lengths = case.sequence_lengths
    dy, dh, dc = _grads(device, case.forward())

    def step():
        y, hy, cy, reserve = pycudnnrnn.forward(x, h, c, w, lengths, **case.attrs)
        return (y, hy, cy) + tuple(pycudnnrnn.backprop(x, h, c, w, lengths, y, hy, cy, dy, dh,
                                                       dc, reserve, **case.attrs))

    step()
    captured = graphs.capture(step)
    plans.clear_caches()
    gc.collect()
    junk = [cp.empty(n, cp.uint8) for n in range(64, 8192, 64)]
    for j in junk:
        j[...] = 7
    rng = np.random.default_rng(3)
    with captured.stream:
        x[...] = device.put(rng.standard_normal(x.shape).astype(np.float32))
        captured.replay()
    captured.stream.synchronize()
    replayed = [device.get(a) for a in captured.outputs]
    eager = [device.get(a) for a in step()]
    for i, (got, want) in enumerate(zip(replayed, eager)):
        _same(device, got, want, f"output {i}")


# ----------------------------------------------------------------- 3: dropout under remat

@pytest.fixture
def xla_stand_in(fake_gpu, monkeypatch):
    """The stand-in GPU with the CuPy views of raw pointers the XLA CUDA handlers take."""
    import ctypes
    from pycudnnrnn.core import gpu
    cp = gpu.cupy()
    monkeypatch.setattr(cp.cuda, "UnownedMemory", lambda ptr, size, owner, device:
                        (ctypes.c_char * size).from_address(ptr), raising=False)
    monkeypatch.setattr(cp.cuda, "MemoryPointer", lambda memory, offset: memory, raising=False)
    return fake_gpu


def _xla_forward(case, attributes, sizes):
    from fake_xla import FakeCallFrame
    from pycudnnrnn.jax import targets, xla_ffi
    want = case.forward(is_training=False)
    results = [np.full(a.shape, np.nan, a.dtype) for a in want[:3] if a.size]
    results += [np.zeros(n, np.uint8) for n in sizes]
    operands = [a for a in (case.input, case.input_h, case.input_c, case.params) if a is not None]
    frame = FakeCallFrame(operands, results, attributes)
    assert frame.call(xla_ffi.make_handler(targets.cuda_forward)) is None, frame.errors
    return results


def test_a_recomputed_xla_forward_draws_the_same_dropout_masks(xla_stand_in):
    """XLA may run a forward again (jax.checkpoint, remat) and pairs the recomputed
    residuals with the first run's loss: on CUDA, a forward's masks depend only on its
    seed, as on the CPU, never on how many forwards ran before."""
    from pycudnnrnn import jax as rnn_jax
    from pycudnnrnn.jax import targets
    case = make_case("lstm", "bidirectional", num_layers=2, num_units=8, dropout=0.5,
                     dtype=np.float32)
    op = Attributes(**{"seed": 3, "seed2": 4, "is_training": True, **case.attrs})
    problem = rnn_jax._problem(op, case.input, case.input_h, case.input_c, case.params)
    sizes = targets.buffer_sizes(problem, cuda=True)
    first = _xla_forward(case, rnn_jax._ffi_attributes(op, False), sizes)
    again = _xla_forward(case, rnn_jax._ffi_attributes(op, False), sizes)
    plain = case.forward(dropout=0.0)[0]
    assert not np.allclose(first[0], plain)  # dropout did act
    for a, b in zip(first[:3], again[:3]):
        np.testing.assert_array_equal(a, b)


def test_a_keyed_forward_run_again_draws_its_masks_and_leaves_the_state(device):
    """A framework's recomputation (torch.utils.checkpoint) runs a forward again: given
    its key, it draws that forward's masks, and later forwards draw what they would
    have drawn without it; a key too old to replay warns."""
    from pycudnnrnn.cuda import resources
    case = make_case("lstm", num_layers=2, num_units=8, dropout=0.5, dtype=np.float32)
    args = _put_all(device, case)

    def outputs(p, keys):
        return [device.get(p.forward(*args, dropout_key=k)[0]) for k in keys]

    p = _plan_of(case, seed=7)
    a, b, again, c = outputs(p, ["a", "b", "a", "c"])
    np.testing.assert_array_equal(again, a)
    assert not np.array_equal(a, b)
    del p
    gc.collect()
    plans.clear_caches()  # the seed's states are made again: the same sequence of masks
    p = _plan_of(case, seed=7)
    reference = outputs(p, ["a", "b", "c"])
    for got, want in zip((a, b, c), reference):
        np.testing.assert_array_equal(got, want)
    outputs(p, range(resources.DROPOUT_REPLAYS_KEPT))
    with pytest.warns(RuntimeWarning, match="no longer kept"):
        outputs(p, ["a"])


# ----------------------------------------------------------------- 8: smaller ones

def _plan_of(case, **overrides):
    tm = case.attrs["time_major"]
    T, B = case.input.shape[:2] if tm else case.input.shape[1::-1]
    kwargs = dict(num_layers=case.size["num_layers"], num_units=case.size["num_units"],
                  input_size=case.size["input_size"], max_time=T, batch_size=B,
                  sequence_lengths=case.sequence_lengths, dtype=case.input.dtype.name,
                  device="cuda", **{k: v for k, v in case.attrs.items()})
    return pycudnnrnn.RNNPlan(**{**kwargs, **overrides})


def test_input_backprop_padding_is_zero_whatever_the_buffer_held(device):
    """cuDNN need not write dx past each length: backprop zeroes it, also in a caller's
    buffer (out=) that held NaN."""
    case = make_case("gru", "bidirectional", num_layers=2, lengths=[4, 2, 3], num_units=8,
                     time_major=False)
    p = _plan_of(case)
    args = [None if a is None else device.put(a)
            for a in (case.input, case.input_h, case.input_c, case.params)]
    out = p.forward(*args)
    grads = _grads(device, out)
    dx = device.put(np.full(p.input_shape, np.nan))
    got = p.backprop(*args, *out[:3], *grads, out[3], out=(dx, None, None, None))[0]
    assert got is dx
    want = case.backprop(case.forward(), *[device.get(g) for g in grads])[0]
    np.testing.assert_allclose(device.get(dx), want, rtol=1e-10, atol=1e-12)


def test_ragged_batch_major_bfloat16_with_an_empty_row_through_a_plan(device):
    """The padding zero is a device array of the data's dtype, not an ml_dtypes scalar
    (CuPy's bfloat16 support is minimal; its kernels need not take one)."""
    import ml_dtypes
    if device.kind == "cuda":
        _skip_without_gpu_bfloat16()
    case = make_case("lstm", "bidirectional", num_layers=2, lengths=[4, 0, 2], num_units=8,
                     time_major=False, dtype=ml_dtypes.bfloat16)
    p = _plan_of(case)
    args = [device.put(a) for a in (case.input, case.input_h, case.input_c, case.params)]
    out = p.forward(*args)
    grads = _grads(device, out)
    back = p.backprop(*args, *out[:3], *grads, out[3])
    want_out = case.forward()
    want_back = case.backprop(want_out, *[device.get(g) for g in grads])
    for got, want in zip(list(out[:3]) + list(back), list(want_out[:3]) + list(want_back)):
        got = device.get(got).astype(np.float64)
        want = np.asarray(want, np.float64)
        np.testing.assert_allclose(got, want, rtol=4e-2, atol=4e-2 * max(1, np.abs(want).max()))


def test_the_layout_check_allocates_no_weight_space(fake_gpu):
    """cudnnGetRNNWeightParams only computes addresses: the check once per new RNN
    descriptor allocates nothing the size of the weights (400 MB at 100M parameters)."""
    case = make_case("lstm", num_layers=2, num_units=64, input_size=64, T=2, B=2)
    fake_cuda.reset_counts()
    p = _plan_of(case)
    assert "cudnnGetRNNWeightParams" in fake_gpu.calls
    assert fake_cuda.COUNTS["device_alloc_bytes"] < p.params_size * 8 // 4


# ----------------------------------------------------------------- 4: foreign arrays

def test_foreign_inputs_live_until_the_work_reading_them_is_done(fake_gpu):
    """Another library's arrays (taken through DLPack) on its own stream: the caller
    drops its temporaries right after the call, and its allocator hands their memory to
    its next request on its stream, which fills it, while cuDNN's work is still queued
    on CuPy's stream. The functional API keeps them alive until that work is done."""
    from pycudnnrnn.core import gpu
    cp = gpu.cupy()
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", num_units=8)
    theirs, ours = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with theirs:  # the framework's allocations, on its stream
        foreign = [fake_cuda.FakeFrameworkArray(fake_cuda._device(a))
                   for a in (case.input, case.input_h, case.input_c, case.params)]
    with ours:
        out = pycudnnrnn.forward(*foreign, case.sequence_lengths, **case.attrs)
    del foreign
    gc.collect()
    with theirs:
        junk = [cp.empty(n, cp.uint8) for n in range(64, 8192, 64)]
        for j in junk:
            j[...] = 7
    with ours:
        ours.synchronize()
        for got, want in zip(out[:3], case.forward()[:3]):
            np.testing.assert_allclose(fake_cuda.to_host(got), want, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------- 7: JAX's buffers

def test_jax_buffers_are_sized_for_the_platform(fake_gpu):
    """On CUDA, XLA's reserve space and workspace are the cuDNN plan's, not the larger
    of the CPU's and cuDNN's (the NumPy backend keeps 16-bit data's reserve in float32:
    twice cuDNN's for a float16 LSTM)."""
    from pycudnnrnn.jax import targets
    case = make_case("lstm", num_layers=4, num_units=32, input_size=32, T=16, B=8,
                     dtype=np.float16)
    from pycudnnrnn import jax as rnn_jax
    op = Attributes(**{"seed": 0, "seed2": 0, "is_training": True, **case.attrs})
    problem = rnn_jax._problem(op, case.input, case.input_h, case.input_c, case.params)
    cuda = plans.RNNPlan.from_problem(problem, 0)
    cpu = plans.RNNPlan.from_problem(problem, None)
    assert cpu.reserve_nbytes > cuda.reserve_nbytes  # the case that over-allocated
    assert targets.buffer_sizes(problem, cuda=True) == (cuda.reserve_nbytes,
                                                        cuda.workspace_nbytes)
    assert targets.buffer_sizes(problem, cuda=False) == (cpu.reserve_nbytes, 0)


# ----------------------------------------------------------------- JAX's temporaries

def test_xla_temporaries_are_xlas_and_freed_behind_their_queued_work(xla_stand_in):
    """A CUDA call's temporaries come from XLA's allocator, none from CuPy's pool (XLA
    preallocates most of the GPU), and go back to XLA as the call returns, its cuDNN
    work still queued on XLA's stream: XLA may hand them at once to the next call
    there. Two calls back to back (batch-major states and XLA's workspace too small:
    temporaries in both), one sync, and both are right."""
    import ctypes
    from fake_xla import FakeCallFrame
    from pycudnnrnn import jax as rnn_jax
    from pycudnnrnn.jax import targets, xla_ffi
    handler = xla_ffi.make_handler(targets.cuda_forward)

    def frame_of(case):
        op = Attributes(**{"seed": 0, "seed2": 0, "is_training": True, **case.attrs})
        reserve = targets.buffer_sizes(rnn_jax._problem(op, case.input, case.input_h, case.input_c,
                                                  case.params), cuda=True)[0]
        want = [a for a in case.forward()[:3] if a.size]
        results = [np.full(a.shape, np.nan, a.dtype) for a in want]
        results += [np.zeros(reserve, np.uint8), np.zeros(1, np.uint8)]  # workspace: 1 byte
        operands = [a for a in (case.input, case.input_h, case.input_c, case.params)
                    if a is not None]
        return FakeCallFrame(operands, results, rnn_jax._ffi_attributes(op, False)), results, want

    cases = [make_case("lstm", "bidirectional", num_units=8, time_major=False,
                       dtype=np.float32),
             make_case("gru", num_layers=2, num_units=8, time_major=False, dtype=np.float32)]
    for case in cases:  # builds the plans (their own buffers: CuPy's pool, kept)
        assert frame_of(case)[0].call(handler) is None
    calls = [frame_of(case) for case in cases]
    fake_cuda.reset_counts()
    for frame, _, _ in calls:  # queued, not run: no sync between the calls
        assert handler(ctypes.pointer(frame.frame)) is None, frame.errors
        assert frame.allocations and not frame.live and not frame.misuse
    fake_cuda.synchronize_all()
    assert fake_cuda.COUNTS["pool_alloc"] == 0
    for _, results, want in calls:
        for got, expected in zip(results, want):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------- on a real GPU only
#
# What only real hardware can settle, for `make gpu-check` (its report gives a verdict
# per hazard from these and the `device`-fixture tests above). CI skips them.

def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    return torch


def _jax_devices():
    jax = pytest.importorskip("jax")
    try:
        return jax, jax.devices("cuda")[0], jax.devices("cpu")[0]
    except RuntimeError:
        pytest.skip("JAX sees no CUDA device")


@pytest.mark.gpu
def test_gpu_jacrev_on_cuda_equals_the_cpu():
    """Hazard 1 through JAX: jacrev runs one backprop per output element from one
    forward's reserve space (vmap over cotangents, a loop-invariant reserve)."""
    jax, cuda, cpu = _jax_devices()
    from pycudnnrnn import jax as rnn_jax
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", T=3, B=2,
                     input_size=2, num_units=3, dtype=np.float32)
    lengths = np.asarray(case.sequence_lengths, np.int32)

    def output(params, x, h, c):
        return rnn_jax.rnn(x, h, c, params, lengths, **case.attrs)[0]

    jacobians = []
    for device in (cuda, cpu):
        with jax.default_device(device):  # XLA's buffers are sized for that platform
            args = [jax.device_put(a, device) for a in
                    (case.params, case.input, case.input_h, case.input_c)]
            jacobians.append(np.asarray(jax.jit(jax.jacrev(output))(*args)))
    np.testing.assert_allclose(jacobians[0], jacobians[1], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_gpu_jax_grad_with_and_without_checkpoint_at_dropout():
    """Hazard 3: the recomputed forward of jax.checkpoint draws the first one's masks."""
    jax, cuda, _ = _jax_devices()
    from pycudnnrnn import jax as rnn_jax
    case = make_case("lstm", "bidirectional", num_layers=3, num_units=16, input_size=8,
                     T=8, B=4, dtype=np.float32)
    attrs = {**case.attrs, "dropout": 0.5, "seed": 1, "seed2": 2}

    def loss(params, x, h, c):
        y = rnn_jax.rnn(x, h, c, params, None, **attrs)[0]
        return (y * y).sum()

    with jax.default_device(cuda):
        args = [jax.device_put(a, cuda) for a in
                (case.params, case.input, case.input_h, case.input_c)]
        plain = np.asarray(jax.jit(jax.grad(loss))(*args))
        remat = np.asarray(jax.jit(jax.grad(jax.checkpoint(loss)))(*args))
        undropped = np.asarray(jax.jit(jax.grad(
            lambda *a: (rnn_jax.rnn(a[1], a[2], a[3], a[0], None, **case.attrs)[0] ** 2).sum()))(*args))
    assert not np.allclose(plain, undropped)  # dropout acted
    np.testing.assert_allclose(remat, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_jax_reserve_is_the_plans():
    """Hazard 7: XLA's reserve space on CUDA is the cuDNN plan's reserve_nbytes (float16,
    4 layers, T=512, B=128, H=1024: the issue's case)."""
    jax, cuda, _ = _jax_devices()
    import jax.numpy as jnp
    from pycudnnrnn import jax as rnn_jax
    T, B, H, L = 512, 128, 1024, 4
    shapes = dict(input=(T, B, H), input_h=(L, B, H), input_c=(L, B, H))
    n = pycudnnrnn.params_size(num_layers=L, num_units=H, input_size=H)
    arrays = [jax.ShapeDtypeStruct(s, jnp.float16) for s in shapes.values()]
    params = jax.ShapeDtypeStruct((n,), jnp.float16)
    op = Attributes(rnn_mode="lstm", input_mode="linear_input", direction="unidirectional",
                     dropout=0.0, seed=0, seed2=0, num_proj=0, time_major=True,
                     is_training=True)
    problem = rnn_jax._problem(op, *arrays, params)
    with jax.default_device(cuda):
        reserve, workspace = rnn_jax._buffer_sizes(problem)
    plan = plans.RNNPlan.from_problem(problem, 0)
    cpu = plans.RNNPlan.from_problem(problem, None)
    print(f"JAX reserve {reserve / 2**20:.0f} MiB, plan {plan.reserve_nbytes / 2**20:.0f} MiB, "
          f"CPU {cpu.reserve_nbytes / 2**20:.0f} MiB; workspace {workspace / 2**20:.0f} MiB")
    assert (reserve, workspace) == (plan.reserve_nbytes, plan.workspace_nbytes)


@pytest.mark.gpu
def test_gpu_functional_api_on_a_torch_side_stream():
    """Hazard 4: PyTorch temporaries freed right after each call on a side stream, their
    memory refilled there; results equal a synchronized run's."""
    torch = _torch_cuda()
    case = make_case("gru", "bidirectional", num_layers=2, lengths="ragged", T=16, B=8,
                     input_size=16, num_units=32, dtype=np.float32)
    lengths = case.sequence_lengths
    cuda = lambda a: torch.from_numpy(a).cuda()
    params, h = cuda(case.params), cuda(case.input_h)
    want = pycudnnrnn.forward(cuda(case.input), h, None, params, lengths, **case.attrs)[0]
    torch.cuda.synchronize()
    want = want.cpu().numpy()
    side, results = torch.cuda.Stream(), []
    with torch.cuda.stream(side):
        for _ in range(20):
            x = cuda(case.input)
            y = pycudnnrnn.forward(x, h, None, params, lengths, **case.attrs)[0]
            del x
            junk = torch.full((1 << 18,), float("nan"), device="cuda")  # reuses x's block
            results.append(y.clone())
            del junk
    torch.cuda.synchronize()
    for got in results:
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-6, atol=1e-6)


def _skip_without_gpu_bfloat16():
    """bfloat16 on the real GPU needs cuDNN >= 9.13 and CuPy 14."""
    from pycudnnrnn.cudnn import descriptors, loader
    cupy = pytest.importorskip("cupy")
    if tuple(loader.version()) < descriptors.BFLOAT16_SINCE or \
            int(cupy.__version__.split(".")[0]) < 14:
        pytest.skip("needs cuDNN >= 9.13 and CuPy 14 for bfloat16")


@pytest.mark.gpu
def test_gpu_ragged_batch_major_bfloat16_with_an_empty_row_through_pytorch():
    """Hazard 8 through PyTorch tensors (the plan's twin is above)."""
    import ml_dtypes
    torch = _torch_cuda()
    _skip_without_gpu_bfloat16()
    case = make_case("lstm", "bidirectional", num_layers=2, lengths=[4, 0, 2], num_units=8,
                     time_major=False, dtype=ml_dtypes.bfloat16)
    to_t = lambda a: torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
    y, hy, cy, _ = pycudnnrnn.forward(*[to_t(a) for a in (case.input, case.input_h,
                                                          case.input_c, case.params)],
                                      case.sequence_lengths, **case.attrs)
    for got, want in zip((y, hy, cy), case.forward()[:3]):
        got = got.float().cpu().numpy()
        want = np.asarray(want, np.float64)
        np.testing.assert_allclose(got, want, rtol=4e-2, atol=4e-2 * max(1, np.abs(want).max()))


@pytest.mark.gpu
@pytest.mark.parametrize("config", ["plain", "dropout", "lengths"])
def test_gpu_torch_compile_reduce_overhead_trains_three_steps(config):
    """Hazard 8: three training steps under torch.compile(mode="reduce-overhead").

    "plain" (no sequence_lengths, no dropout: the call holds no CPU tensor, the seed is
    None): CUDA-graph trees skipped the graph (a CPU seed tensor among its inputs, the
    reserve's size learnt at run time); now none is skipped ("skipping cudagraphs" in
    their log, or a skip counted) and no pycudnnrnn op is left out of a graph partition.
    "dropout" and "lengths" (lengths with an empty row): the seed and the lengths are
    host tensors cuDNN needs on the host, so the trees may skip graphs or leave the op
    out of them; the steps must still train and equal eager ones (the same masks: each
    step starts from the same generator state, which names the dropout forward, and a
    second forward under that name replays its masks). What the log said goes to the
    report."""
    import logging
    torch = _torch_cuda()
    from torch._dynamo.utils import counters
    from pycudnnrnn.torch import CudnnRNN
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect(logging.DEBUG)
    try:
        torch._logging.set_logs(cudagraphs=True, perf_hints=True)  # skips and partitions
    except Exception:  # noqa: BLE001: an older logging API; the counters still tell
        pass
    logging.getLogger("torch").addHandler(handler)
    counters.clear()
    torch._dynamo.reset()
    torch.manual_seed(0)
    dropout = 0.3 if config == "dropout" else 0.0
    # One seed for both modules: they share its cuDNN dropout state, so a compiled
    # forward under an eager one's name replays that one's masks.
    models = [CudnnRNN(8, 16, 2, rnn_mode="lstm", dropout=dropout, seed=11).cuda()
              for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    x = torch.randn(6, 4, 8, device="cuda")
    lengths = torch.tensor([6, 4, 0, 5]) if config == "lengths" else None

    def make_step(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def step():
            optimizer.zero_grad(set_to_none=True)
            out = model(x, sequence_lengths=lengths)[0]
            loss = out.square().mean()
            loss.backward()
            optimizer.step()
            return loss.detach()
        return step

    eager, compiled = make_step(models[0]), torch.compile(make_step(models[1]),
                                                          mode="reduce-overhead")
    before = models[1].params.detach().clone()
    eager_losses, losses = [], []
    try:
        for k in range(3):
            torch.manual_seed(100 + k)
            eager_losses.append(float(eager()))
            torch.manual_seed(100 + k)
            losses.append(float(compiled()))
    finally:
        logging.getLogger("torch").removeHandler(handler)
        try:
            torch._logging.set_logs()
        except Exception:  # noqa: BLE001
            pass
    skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
    said = [m for m in messages if "skipping cudagraphs" in m or
            ("reason=" in m and "pycudnnrnn" in m)]
    print(f"torch.compile reduce-overhead ({config}): losses {losses}, eager {eager_losses}, "
          f"cudagraph_skips {skips}, what the log said: {said or 'nothing'}")
    assert all(np.isfinite(losses)) and not torch.equal(before, models[1].params.detach())
    assert len(set(losses)) == 3  # trained (and with dropout, fresh masks each step)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(models[1].params, models[0].params, rtol=1e-4, atol=1e-5)
    if config == "plain":  # no host tensor in the call: CUDA graphs must engage
        assert skips == 0 and not said, said


@pytest.mark.gpu
@pytest.mark.parametrize("reentrant", [False, True])
def test_gpu_torch_checkpoint_at_dropout_equals_plain(reentrant):
    """Hazard 3 through PyTorch: torch.utils.checkpoint runs a module's forward again in
    backward; cuDNN's dropout state had advanced, so the recomputed forward drew new
    masks and backprop paired them with the first forward's loss. Each forward is named
    by PyTorch's CUDA generator state, which checkpoint restores: the gradients equal a
    plain run's from the same generator state."""
    torch = _torch_cuda()
    from torch.utils.checkpoint import checkpoint
    import pycudnnrnn.torch as prt
    torch.manual_seed(0)
    model = prt.LSTM(6, 8, 2, dropout=0.5, device="cuda", dtype=torch.float64)
    x = torch.randn(5, 3, 6, device="cuda", dtype=torch.float64, requires_grad=True)
    inputs = [x, *model.parameters()]

    def loss_and_grads(run):
        for t in inputs:
            t.grad = None
        torch.manual_seed(3)
        loss = run(x).square().sum()
        loss.backward()
        return (loss.detach(), *(t.grad for t in inputs))

    plain = loss_and_grads(lambda x: model(x)[0])
    checkpointed = loss_and_grads(
        lambda x: checkpoint(lambda x: model(x)[0], x, use_reentrant=reentrant))
    for got, want in zip(checkpointed, plain):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not torch.equal(model(x)[0], model(x)[0])  # fresh masks each call


def test_an_unknown_reserve_space_under_capture_is_a_clear_error(fake_gpu):
    """Hazard 6: a reserve space this process did not note (a copy, or a framework's
    tensor object rebuilt at each replay) has its header read back, a sync, which a
    capturing stream refuses: the error says so and what to do."""
    from pycudnnrnn.core import gpu
    cp = gpu.cupy()
    case = make_case("lstm", num_units=4)
    p = _plan_of(case)
    args = [fake_cuda._device(a) for a in (case.input, case.input_h, case.input_c,
                                          case.params)]
    out = p.forward(*args)
    grads = [fake_cuda._device(np.ones(a.shape)) for a in out[:3]]
    copy = fake_cuda._device(fake_cuda.to_host(out[3]))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(ValueError, match="trust_reserve"):
                p.backprop(*args, *out[:3], *grads, copy)
        finally:
            stream.end_capture()


@pytest.mark.gpu
def test_gpu_whether_cudnn_writes_the_reserve_space(cuda_only, monkeypatch):
    """The measurement behind hazard 1's copy: cuDNN's backward calls handed the caller's
    reserve space itself. The first backprop must equal one from a copy (what the
    backend does); whether cuDNN changed the reserve's bytes, and whether a second
    in-place backprop still agreed, goes to the report: if cuDNN never writes it, the
    copy (one reserve-sized read and write per backprop) could go."""
    from pycudnnrnn.cuda import reserve as cuda_reserve
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", T=12, B=6,
                     input_size=8, num_units=16, dtype=np.float32)
    args = _put_all(cuda_only, case)
    out = pycudnnrnn.forward(*args, case.sequence_lengths, **case.attrs)
    grads = _grads(cuda_only, out)

    def backprop():
        return [cuda_only.get(g) for g in pycudnnrnn.backprop(
            *args, case.sequence_lengths, *out[:3], *grads, out[3], **case.attrs)]

    copied = backprop()
    before = _digest(cuda_only, out[3])
    monkeypatch.setattr(cuda_reserve.ReserveSpace, "copy",
                        lambda self, reserve, workspace:
                        reserve[cuda_reserve.HEADER:cuda_reserve.HEADER + self.reserve_bytes])
    in_place = backprop()
    written = _digest(cuda_only, out[3]) != before
    again = backprop()
    second_agrees = all(np.array_equal(a, b) for a, b in zip(again, in_place))
    print(f"cuDNN reserve space: written by backward {'yes' if written else 'no'}; "
          f"a second in-place backprop {'agreed' if second_agrees else 'DIFFERED'}")
    for a, b in zip(in_place, copied):
        np.testing.assert_array_equal(a, b)


@pytest.fixture
def cuda_only(monkeypatch):
    from conftest import Device
    yield Device("cuda", monkeypatch)
    plans.clear_caches()


# ------------------------------ review 2026-12-07, finding 9: cuDNN's flag left alone

@pytest.mark.gpu
def test_gpu_penalty_step_leaves_cudnns_flag_to_other_threads(monkeypatch):
    """The fact ``other_thread_saw_cudnn_off``: a second thread, inside
    ``torch.backends.cudnn.flags(enabled=True)`` from before a penalty step, samples
    PyTorch's cuDNN flag at the step's recompute, then leaves its block. It must see the
    flag on, and the step must still differentiate twice (the recompute never takes
    cuDNN's RNN); its gradients are torch.nn's with cuDNN off."""
    import threading
    torch = _torch_cuda()
    import pycudnnrnn.torch as prt
    from pycudnnrnn.torch import second_order
    torch.manual_seed(0)
    reference = torch.nn.LSTM(3, 4, 2, bidirectional=True, dtype=torch.float64, device="cuda")
    ours = prt.LSTM.from_torch(reference)
    x = torch.randn(5, 2, 3, dtype=torch.float64, device="cuda")

    def penalty_grads(module):
        leaf = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(module(leaf)[0].tanh().sum(), leaf, create_graph=True)
        return torch.autograd.grad(g.square().sum(), [leaf, *module.parameters()])

    with torch.backends.cudnn.flags(enabled=False):
        want = penalty_grads(reference)
    entered, handed, done, saw = threading.Event(), threading.Event(), threading.Event(), []

    def other():
        with torch.backends.cudnn.flags(enabled=True):
            entered.set()
            handed.wait()
            saw.append(torch.backends.cudnn.enabled)
        done.set()

    real = second_order.recompute

    def hooked(*args):
        if not handed.is_set():
            handed.set()
            done.wait(60)
        return real(*args)
    monkeypatch.setattr(second_order, "recompute", hooked)
    thread = threading.Thread(target=other)
    thread.start()
    entered.wait(60)
    try:
        got = penalty_grads(ours)
    finally:
        recomputed = handed.is_set()
        handed.set()
        thread.join()
    other_thread_saw_cudnn_off = saw != [True]
    print(f"other_thread_saw_cudnn_off={other_thread_saw_cudnn_off}")
    assert recomputed
    assert not other_thread_saw_cudnn_off
    assert torch.backends.cudnn.enabled
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)


# ----------------------------------------------------------------- review 2026-12-07, finding 1
#
# The functional API on PyTorch tensors under `graphs.capture` and `torch.cuda.graph`: the
# DLPack import and export must not wait across the capture's boundary (CUDA errors 905,
# 906 and then cudaErrorStreamCaptureInvalidated before the fix).

def _gru_on_torch(torch):
    case = make_case("gru", lengths="ragged", T=6, B=3, input_size=8, num_units=16,
                     dtype=np.float32)
    x, h, w = (torch.from_numpy(a).cuda() for a in (case.input, case.input_h, case.params))
    call = lambda: pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs)
    return case, x, call


@pytest.mark.gpu
def test_gpu_graphs_capture_of_the_functional_api_on_torch_tensors():
    """Finding 1 under ``graphs.capture``: it captures, and a replay after a new input
    equals an eager call on it."""
    torch = _torch_cuda()
    from pycudnnrnn import graphs
    case, x, call = _gru_on_torch(torch)
    call()
    captured = graphs.capture(call)
    x.copy_(torch.randn_like(x))
    torch.cuda.synchronize()
    captured.replay()
    captured.stream.synchronize()
    torch.testing.assert_close(captured.outputs[0], call()[0], rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_torch_cuda_graph_of_the_functional_api_on_torch_tensors():
    """Finding 1 under ``torch.cuda.graph`` (PyTorch's recipe: a warm-up on a side
    stream first): it captures, and a replay after a new input equals an eager call."""
    torch = _torch_cuda()
    case, x, call = _gru_on_torch(torch)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # the warm-up: the plan is built outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = call()[0]
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, call()[0], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------- review 2026-12-07, finding 11
#
# `graphs.capture` with arrays on another device than the current one: refused (their
# work would run outside the capture, and replays would leave the outputs stale).

@pytest.mark.gpu
def test_gpu_graphs_capture_refuses_arrays_on_another_device():
    """Finding 11: arrays on cuda:1 with cuda:0 current are a ValueError naming what to
    do; inside ``cupy.cuda.Device(1)`` the capture replays right."""
    cupy = pytest.importorskip("cupy")
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA devices")
    from pycudnnrnn import graphs
    case = make_case("gru", lengths="ragged", T=6, B=3, input_size=8, num_units=16,
                     dtype=np.float32)
    with cupy.cuda.Device(1):
        x, h, w = (cupy.asarray(a) for a in (case.input, case.input_h, case.params))
    call = lambda: pycudnnrnn.forward(x, h, None, w, case.sequence_lengths, **case.attrs)
    with cupy.cuda.Device(0), pytest.raises(ValueError, match=r"cupy\.cuda\.Device\(1\)"):
        graphs.capture(call)
    with cupy.cuda.Device(1):
        captured = graphs.capture(call)
        new_x = np.random.default_rng(3).standard_normal(case.input.shape).astype(np.float32)
        x.set(new_x)
        cupy.cuda.Device(1).synchronize()
        captured.replay()
        captured.stream.synchronize()
        got = cupy.asnumpy(captured.outputs[0])
    want = pycudnnrnn.forward(new_x, case.input_h, None, case.params, case.sequence_lengths,
                              **case.attrs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------- review 3 (2026-12-07):
# one owner of device-memory lifetimes (issue 47 item 1). Each test is the review's "Show
# it on a GPU" step of its finding; the stand-in tests are in test_gpu_lifetime.py.

_SPIN = r'''
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
'''


def _spin(cupy, seconds):
    """Keep CuPy's current stream busy for about `seconds` (one thread spinning)."""
    kernel = cupy.RawKernel(_SPIN, "spin")
    khz = cupy.cuda.Device().attributes["ClockRate"]
    kernel((1,), (1,), (np.int64(khz * 1000 * seconds),))


def _ragged_gpu_case(**overrides):
    return make_case(**{"rnn_mode": "lstm", "direction": "bidirectional", "T": 12, "B": 6,
                        "input_size": 8, "num_units": 16, "dtype": np.float32,
                        "lengths": [12, 3, 9, 1, 7, 12], **overrides})


def _changed_on_gpu(cupy, blocks, value):
    return sum(bool((cupy.asnumpy(b) != value).any()) for b in blocks)


def _own_process(script, **env):
    """Run `script` in a Python process of its own (the repository importable), with
    `env` added to the environment; its output, once it exits with 0."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "tests")]),
           **env}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.gpu
def test_gpu_finding_2_a_cupy_capture_on_cupys_pool_keeps_the_calls_temporaries(cuda_only):
    """Finding 2: capture the functional API with ``Stream.begin_capture`` on CuPy's
    default pool, then allocate and fill arrays of every size up to 64 KiB, and of the
    workspace's, on the capture stream, and replay: no array may change."""
    import cupy
    case = _ragged_gpu_case(rnn_mode="gru")
    x, h, _, w = _put_all(cuda_only, case)
    lengths = case.sequence_lengths
    pycudnnrnn.forward(x, h, None, w, lengths, **case.attrs)  # the plan built
    cupy.cuda.Device().synchronize()
    work = pycudnnrnn.RNNPlan(num_layers=1, num_units=16, input_size=8, max_time=12,
                              batch_size=6, sequence_lengths=lengths, rnn_mode="gru",
                              direction="bidirectional", dtype="float32",
                              device="cuda").workspace_nbytes
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        y = pycudnnrnn.forward(x, h, None, w, lengths, **case.attrs)[0]
        graph = stream.end_capture()
        junk = [cupy.full(n, 0x5A, cupy.uint8) for n in [*range(512, 64 * 1024 + 1, 512),
                                                         work]]
        graph.launch(stream)
        stream.synchronize()
    assert _changed_on_gpu(cupy, junk, 0x5A) == 0
    want = pycudnnrnn.forward(case.input, case.input_h, None, case.params, lengths,
                              **case.attrs)[0]
    np.testing.assert_allclose(cupy.asnumpy(y), want, rtol=1e-4, atol=1e-5)


_FINDING_5 = r'''
import threading
import numpy as np
import cupy
import pycudnnrnn
from test_gpu_hazards import _ragged_gpu_case, _spin

assert cupy.cuda.get_current_stream().ptr == 2, "the per-thread default stream is not on"
case = _ragged_gpu_case()
args = [cupy.asarray(a) for a in (case.input, case.input_h, case.input_c, case.params)]
cupy.cuda.get_current_stream().synchronize()
warmed, built, result = threading.Event(), threading.Event(), {}


def warm_up():
    """This thread's cuDNN handle and the configuration's descriptors, made before the
    spin: a first call may synchronize, which would hide the race."""
    cupy.asnumpy(pycudnnrnn.forward(*args, None, **case.attrs)[0])  # another plan


def b():  # runs the plan at once on its own per-thread default stream
    try:
        warm_up()
    finally:
        warmed.set()
    built.wait()
    result["y"] = cupy.asnumpy(result["plan"].forward(*args)[0])


thread = threading.Thread(target=b)
thread.start()
warm_up()
warmed.wait()
junk = [cupy.full(n, 0x7F, cupy.uint8) for n in range(64, 8192, 64)]
del junk  # freed into this thread's arena, 0x7F
_spin(cupy, 0.5)
result["plan"] = pycudnnrnn.RNNPlan(num_layers=1, num_units=16, input_size=8, max_time=12,
                                    batch_size=6, sequence_lengths=case.sequence_lengths,
                                    direction="bidirectional", dtype="float32",
                                    device="cuda")  # its uploads queued behind the spin
built.set()
thread.join()
want = case.forward()[0]
np.testing.assert_allclose(result["y"], want, rtol=1e-4, atol=1e-5)
print("OK")
'''


@pytest.mark.gpu
def test_gpu_finding_5_a_plan_built_on_one_threads_default_stream_runs_on_anothers():
    """Finding 5: with CuPy's per-thread default stream, thread A builds a ragged plan
    behind a 0.5 s spin (its uploads queued there) over freed 0x7F blocks; thread B runs
    it at once: B's run must wait for A's uploads (pointer 2 on both threads). Both
    threads first run another plan of the configuration, so that nothing the build or
    the run makes for the first time (a cuDNN handle) synchronizes behind the spin."""
    pytest.importorskip("cupy")
    assert "OK" in _own_process(_FINDING_5, CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1")


@pytest.mark.gpu
def test_gpu_finding_6_a_seeds_dropout_states_outlive_a_queued_forward(cuda_only):
    """Finding 6: a seed's states made on the null stream, drawn by a forward queued on
    a second plan's home H behind a 0.5 s spin; both plans dropped, caches cleared, and
    six blocks of the states' size filled with 0x5A on the null stream: none changes."""
    import cupy
    case = make_case("lstm", num_units=16, input_size=8, T=6, B=4, dtype=np.float32,
                     dropout=0.5)
    x, h, c, w = _put_all(cuda_only, case)
    size = dict(num_layers=1, num_units=16, input_size=8, max_time=6, batch_size=4,
                dtype="float32", device="cuda", dropout=0.5, seed=7)
    first = pycudnnrnn.RNNPlan(**size)  # the seed's states, on the null stream
    nbytes = first._executor.rnn.dropout.states.buffer.nbytes
    cupy.cuda.Device().synchronize()
    home = cupy.cuda.Stream(non_blocking=True)
    with home:
        second = pycudnnrnn.RNNPlan(**size, sequence_lengths=[6, 2, 5, 3])
        _spin(cupy, 0.5)
        second.forward(x, h, c, w)
    del first, second
    plans.clear_caches()
    gc.collect()
    junk = [cupy.full(nbytes, 0x5A, cupy.uint8) for _ in range(6)]
    cupy.cuda.Device().synchronize()
    assert _changed_on_gpu(cupy, junk, 0x5A) == 0


_FINDING_8 = r'''
import gc
import numpy as np
import cupy
import pycudnnrnn
from pycudnnrnn import graphs
from test_gpu_hazards import _ragged_gpu_case, _spin

case = _ragged_gpu_case()
x, h, c, w = (cupy.asarray(a) for a in (case.input, case.input_h, case.input_c, case.params))
plan = pycudnnrnn.RNNPlan(num_layers=1, num_units=16, input_size=8, max_time=12,
                          batch_size=6, sequence_lengths=case.sequence_lengths,
                          direction="bidirectional", dtype="float32", device="cuda")
captured = graphs.capture(lambda: plan.forward(x, h, c, w)[0])
stream, y = captured.stream, captured.outputs
with stream:
    _spin(cupy, 0.5)
    captured.replay()  # queued behind the spin
del captured, plan
gc.collect()
junk = [cupy.full(n, 0x7F, cupy.uint8) for n in range(64, 8192, 64)]  # the home's blocks
stream.synchronize()
np.testing.assert_allclose(cupy.asnumpy(y), case.forward()[0], rtol=1e-4, atol=1e-5)
print("OK")
'''


@pytest.mark.gpu
def test_gpu_finding_8_a_dropped_captured_graph_keeps_its_plans_under_a_queued_replay():
    """Finding 8: a ``graphs.capture`` of a ragged plan replayed behind a 0.5 s spin, the
    graph and the plan dropped, the home stream's freed blocks filled with 0x7F: the
    replay still equals the CPU (in a process of its own: a crash also shows it)."""
    pytest.importorskip("cupy")
    assert "OK" in _own_process(_FINDING_8)


@pytest.mark.gpu
def test_gpu_finding_7_a_plan_on_cuda1_dropped_with_cuda0_current(cuda_only):
    """Finding 7 (two GPUs): a ragged plan on cuda:1, whose home is cuda:1's legacy
    stream, runs on a side stream behind a 0.5 s spin; it is dropped with cuda:0
    current, and cuda:1's legacy stream fills freed blocks with 0x7F: the side stream's
    result still equals the CPU."""
    import cupy
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    case = _ragged_gpu_case()
    with cupy.cuda.Device(1):
        args = [cupy.asarray(a) for a in (case.input, case.input_h, case.input_c,
                                          case.params)]
        plan = pycudnnrnn.RNNPlan(num_layers=1, num_units=16, input_size=8, max_time=12,
                                  batch_size=6, sequence_lengths=case.sequence_lengths,
                                  direction="bidirectional", dtype="float32",
                                  device="cuda:1")
        cupy.cuda.Device().synchronize()
        side = cupy.cuda.Stream(non_blocking=True)
        with side:
            _spin(cupy, 0.5)
            y = plan.forward(*args)[0]
    with cupy.cuda.Device(0):
        del plan
        plans.clear_caches()
        gc.collect()
    with cupy.cuda.Device(1):
        junk = [cupy.full(n, 0x7F, cupy.uint8) for n in range(64, 8192, 64)]
        side.synchronize()
        got = cupy.asnumpy(y)
    np.testing.assert_allclose(got, case.forward()[0], rtol=1e-4, atol=1e-5)
    assert junk


@pytest.mark.gpu
def test_gpu_finding_7_a_graph_on_cuda1_dropped_with_cuda0_current(cuda_only):
    """Finding 7's kin (two GPUs): a ``graphs.capture`` on cuda:1 replayed behind a 0.5 s
    spin, dropped with cuda:0 current. Its release event must be made on cuda:1 (CUDA
    records an event only on a stream of its device), or its plan is kept for good; and
    cuda:1's legacy stream filling freed blocks with 0x7F must not change the replay."""
    import cupy
    from pycudnnrnn.cuda import graphs
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    case = _ragged_gpu_case()
    kept = len(graphs._never_released)
    with cupy.cuda.Device(1):
        x, h, c, w = (cupy.asarray(a) for a in (case.input, case.input_h, case.input_c,
                                                case.params))
        plan = pycudnnrnn.RNNPlan(num_layers=1, num_units=16, input_size=8, max_time=12,
                                  batch_size=6, sequence_lengths=case.sequence_lengths,
                                  direction="bidirectional", dtype="float32",
                                  device="cuda:1")
        captured = graphs.capture(lambda: plan.forward(x, h, c, w)[0])
        stream, y = captured.stream, captured.outputs
        with stream:
            _spin(cupy, 0.5)
            captured.replay()
    with cupy.cuda.Device(0):
        del captured, plan
        gc.collect()
    assert len(graphs._never_released) == kept
    with cupy.cuda.Device(1):
        junk = [cupy.full(n, 0x7F, cupy.uint8) for n in range(64, 8192, 64)]
        stream.synchronize()
        got = cupy.asnumpy(y)
    np.testing.assert_allclose(got, case.forward()[0], rtol=1e-4, atol=1e-5)
    assert junk


# ----------------------------------------------------------------- review 3, finding 3: a plan first built in a capture

@pytest.mark.gpu
@pytest.mark.parametrize("dropout", [0.0, 0.5])
@pytest.mark.parametrize("mode", ["relaxed", "global"])
def test_gpu_a_plan_first_built_during_a_capture(cuda_only, mode, dropout):
    """Review 3, finding 3, on a GPU: a configuration no call has used (with dropout, a
    seed no plan holds) first called inside ``s.begin_capture(mode)``. Whether the call
    or ``end_capture`` raised goes to the report. Then an eager run on `s` before any
    replay, the replay, and an eager run on another stream equal what a plan built
    outside any capture computes: the CPU's; with dropout, a fresh seed's first three
    eager forwards (the replay draws the first masks, the eager runs after it the next)."""
    import cupy
    case = make_case("lstm", "bidirectional", num_layers=2, lengths="ragged", T=7, B=5,
                     input_size=4, num_units=6, dropout=dropout)
    # A seed of this test's own: a captured plan is pinned, its states with it.
    attrs = dict(case.attrs, seed=4703 + ["relaxed", "global"].index(mode))
    args = _put_all(cuda_only, case)

    def forward():
        return pycudnnrnn.forward(*args, case.sequence_lengths, **attrs)[0]

    if dropout:
        want = [cuda_only.get(forward()) for _ in range(3)]  # a fresh seed's draws
        plans.clear_caches()
        gc.collect()
        from pycudnnrnn.cuda import resources
        assert not [s for s in resources.LIVE_DROPOUT_STATES if s.seed == attrs["seed"]]
    else:
        want = [case.forward()[0]] * 3
    cupy.cuda.Device().synchronize()  # the inputs are there before `s` reads them
    capture_mode = {"relaxed": cupy.cuda.runtime.streamCaptureModeRelaxed,
                    "global": cupy.cuda.runtime.streamCaptureModeGlobal}[mode]
    s, other = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    said, graph = [], None
    with s:
        s.begin_capture(mode=capture_mode)
        try:
            y = forward()
        except Exception as error:
            said.append(f"the call raised {error!r}")
        try:
            graph = s.end_capture()
        except Exception as error:
            said.append(f"end_capture raised {error!r}")
        print(f"a new plan (dropout {dropout}) first built in a {mode} capture: "
              + ("; ".join(said) or "nothing raised"))
        assert not said
        if not dropout:  # an eager run would draw the masks the replay is to draw
            np.testing.assert_allclose(cuda_only.get(forward()), want[0], rtol=1e-9,
                                       atol=1e-10, err_msg="eager on s before a replay")
        graph.launch(s)
        np.testing.assert_allclose(cuda_only.get(y), want[0], rtol=1e-9, atol=1e-10,
                                   err_msg="the replay")
        np.testing.assert_allclose(cuda_only.get(forward()), want[1], rtol=1e-9, atol=1e-10,
                                   err_msg="eager on s after the replay")
    with other:
        np.testing.assert_allclose(cuda_only.get(forward()), want[2], rtol=1e-9, atol=1e-10,
                                   err_msg="eager on another stream")


# ----------------------------------------------------------------- review 2026-12-07, finding 4
# JAX's checked forward path compared XLA's forward-sized workspace with backprop's size,
# found it too small and took a second cuDNN workspace from XLA's allocator.

@pytest.mark.gpu
def test_gpu_jax_checked_training_forward_takes_no_second_workspace(monkeypatch):
    """A jitted ragged batch-major training forward (the checked path) asks XLA's
    allocator for no cuDNN workspace: it runs in the one XLA traced for it."""
    jax, cuda, _ = _jax_devices()
    from pycudnnrnn import jax as rnn_jax
    from pycudnnrnn.jax import targets, xla_ffi
    case = make_case("gru", "bidirectional", lengths="ragged", time_major=False, T=8, B=4,
                     input_size=8, num_units=16, dtype=np.float32)
    lengths = np.asarray(case.sequence_lengths, np.int32)
    requests, used = [], []
    allocate, for_call = xla_ffi.Scratch.allocate, plans.for_call
    monkeypatch.setattr(xla_ffi.Scratch, "allocate", lambda self, size, alignment=1:
                        requests.append(size) or allocate(self, size, alignment))
    monkeypatch.setattr(plans, "for_call",
                        lambda *a, **k: used.append(for_call(*a, **k)) or used[-1])
    with jax.default_device(cuda):
        args = [jax.device_put(a, cuda) for a in (case.input, case.input_h, case.params)]
        run = jax.jit(lambda x, h, p: rnn_jax.rnn(x, h, None, p, lengths, **case.attrs,
                                                  is_training=True)[0])
        np.asarray(run(*args))
    plan = used[-1]  # the handler's
    workspace = plan.forward_workspace_nbytes
    padding = targets._ALIGNMENT - xla_ffi.Scratch.MAX_ALIGNMENT
    print(f"forward workspace {workspace} B; XLA scratch requests {requests}")
    assert workspace + padding not in requests, requests
