"""Host-side cost of a GPU call, measured on the CPU with the stand-in GPU.

    PYTHONPATH=. python3 benchmarks/gpu_host_bench.py [--rounds N] [--full]

Times the cuDNN backend's own Python, on a tiny LSTM (T=1, B=1, H=8, float32) so that
nothing else counts: a plan's forward (inference) and forward + backprop, the same
through the functional API, the XLA CUDA handlers on call frames built in Python
(tests/fake_xla.py), and the PyTorch op. Interleaved rounds; median and quartiles of
µs per call. Asserts nothing.

What runs under it is the *light* stand-in (``fake_cuda.install_light``): the plan is
built on the full stand-in's cuDNN (real descriptors, its sizes), but a run's device
arrays are plain host memory, streams and events are trivial, and cuDNN's compute calls
and ``cudnnSetStream`` are ctypes functions over a C function that does nothing, bound
from the project's prototypes as the real ones are. So what is timed is our Python plus
ctypes' marshalling of each cuDNN call's arguments (which the real call pays too), plus a
small floor of the light stand-in itself (a NumPy ``empty`` per buffer, where CuPy's
allocator costs about as much). That was chosen over subtracting a measured floor of
the full stand-in from its figures: its emulation (queues, pool poisoning, counters,
a Python callback per cuDNN call) costs several times our own code, varies with what
the call does, and a difference of two noisy figures that large would say little about
a 25 µs target. ``--full`` times the same calls on the full stand-in (compute calls
made no-ops), whose figures include its emulation: an upper bound, comparable with
those recorded before.

The PyTorch op cannot run on CUDA tensors here (torch is a CPU build, and the CUDA path
asks torch.cuda for the current stream and the caching allocator). It is timed on CPU
tensors posed as tensors on the stand-in (as tests/test_torch_ops.py's
``torch_on_stand_in``): "kernel" is ``op_backends.planned_forward``, the op's CUDA body
(torch.empty for its buffers, the plan cache, the plan's run on the tensors' addresses:
this plan runs in place, so no DLPack import), without
``kernels._on_device`` (torch.cuda's stream and allocator, and CuPy's context for them);
"dispatched" adds ``torch.ops.pycudnnrnn.forward``'s dispatch in front of it.

The "floor" row times, on the light stand-in, only what a plan's inference forward asks
of CuPy and cuDNN (the device context, the current stream twice, four contiguity checks,
four buffers and their pointers, the ctypes call of cudnnRNNForward): "forward plan"
less it is our own Python.

Times are the thread's CPU time (``time.thread_time``), not wall time: on a shared
machine wall time also counts the time other processes hold the core (``--wall`` for
wall time).

Last, the host's GPU work per eager call is counted on the full stand-in (``host_work``):
events recorded, stream waits, syncs and pool allocations, for a plan's forward, its
forward + backprop and the functional forward, on the plan's home stream and on another
one. These are counts, not times: a change that adds an event or a wait shows here.
"""

import argparse
import contextlib
import os
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "benchmarks")]

import fake_cuda  # noqa: E402
import pycudnnrnn  # noqa: E402
from pycudnnrnn.core.config import Attributes
import pycudnnrnn.plan  # noqa: E402
from pycudnnrnn.cuda import waiter  # noqa: E402
from gpu_bench import format_rows, interleaved  # noqa: E402

COMPUTE = ("_cudnnRNNForward", "_cudnnRNNBackwardData_v8", "_cudnnRNNBackwardWeights_v8")
FLOOR = "floor of a plan forward"
ATTRS = dict(rnn_mode="lstm", input_mode="linear_input", direction="unidirectional",
             dropout=0.0, num_proj=0, time_major=True)


def _xla_forward_frame(x, h, c, w):
    """An inference forward call frame over host copies of the arrays, and the handler."""
    from fake_xla import FakeCallFrame
    from pycudnnrnn import jax as rnn_jax
    from pycudnnrnn.jax import targets, xla_ffi
    host = [np.asarray(a).view(np.ndarray).copy() for a in (x, h, c, w)]
    op = Attributes(seed=0, seed2=0, is_training=False, **ATTRS)
    problem = rnn_jax._problem(op, *host)
    reserve, workspace = targets.buffer_sizes(problem, cuda=True)
    results = [np.empty_like(host[0]), np.empty_like(host[1]), np.empty_like(host[2]),
               np.zeros(max(reserve, 1), np.uint8), np.zeros(max(workspace, 1), np.uint8)]
    frame = FakeCallFrame(host, results, rnn_jax._ffi_attributes(op, False))
    return frame, xla_ffi.make_handler(targets.cuda_forward)


def _xla_step(x, h, c, w):
    """A training forward and its backprop through the XLA CUDA handlers, on call frames
    over host copies of the arrays (each call writes the same buffers again)."""
    from fake_xla import FakeCallFrame
    from pycudnnrnn import jax as rnn_jax
    from pycudnnrnn.jax import targets, xla_ffi
    host = [np.asarray(a).view(np.ndarray).copy() for a in (x, h, c, w)]
    op = Attributes(seed=0, seed2=0, is_training=True, **ATTRS)
    reserve, workspace = targets.buffer_sizes(rnn_jax._problem(op, *host), cuda=True)
    outputs = [np.empty_like(a) for a in host[:3]]
    reserve = np.zeros(reserve, np.uint8)
    forward = FakeCallFrame(host, outputs + [reserve, np.zeros(workspace, np.uint8)],
                            rnn_jax._ffi_attributes(op, False))
    grads = [np.ones_like(a) for a in outputs]
    backward = FakeCallFrame(host + outputs + grads + [reserve],
                             [np.empty_like(a) for a in host] + [np.zeros(workspace, np.uint8)],
                             rnn_jax._ffi_attributes(op, False))
    handlers = [xla_ffi.make_handler(targets.cuda_forward),
                xla_ffi.make_handler(targets.cuda_backprop)]

    def step():
        forward.call(handlers[0])
        backward.call(handlers[1])
    return step


def _training_steps(training, x, h, c, w, grads):
    """Forward + backprop through the training plan, and the same through the functional
    API, on the same arrays."""

    def plan_step():
        y, hy, cy, reserve = training.forward(x, h, c, w)
        training.backprop(x, h, c, w, y, hy, cy, *grads, reserve)

    def functional_step():
        y, hy, cy, reserve = pycudnnrnn.forward(x, h, c, w)
        pycudnnrnn.backprop(x, h, c, w, None, y, hy, cy, *grads, reserve)

    return plan_step, functional_step


def _floor(cupy, plan, x, h, c, w):
    """What a plan's inference forward costs on the light stand-in beyond our Python: the
    CuPy and cuDNN calls it makes, with the same arguments."""
    import ctypes

    from pycudnnrnn.cudnn import capi
    executor, rnn_forward = plan._executor, capi.api().cudnnRNNForward
    descriptors = [d._handle for d in (executor.rnn, executor.x_desc, executor.y_desc,
                                       executor.h_desc, executor.c_desc)]
    handle = descriptors[0]  # any c_void_p: the call does nothing
    lengths = ctypes.cast(ctypes.c_void_p(executor.dev_lengths.data.ptr),
                          ctypes.POINTER(ctypes.c_int32))
    storage, work_bytes = executor.storage, max(executor.work_bytes, 1)

    def floor():
        with cupy.cuda.Device(0):
            cupy.cuda.get_current_stream()
            for a in (x, h, c, w):
                cupy.ascontiguousarray(a)
            y = cupy.empty(plan.output_shape, storage)
            hy, cy = cupy.empty_like(h), cupy.empty_like(c)
            work = cupy.empty(work_bytes, cupy.uint8)
            rd, xd, yd, hd, cd = descriptors
            rnn_forward(handle, rd, 0, lengths, xd, x.data.ptr, yd, y.data.ptr, hd, h.data.ptr,
                        hy.data.ptr, cd, c.data.ptr, cy.data.ptr, 0, w.data.ptr, 0,
                        work.data.ptr, 0, 0)
            cupy.cuda.get_current_stream()
    return floor


def _torch_forward(monkeypatch, cupy, x, h, c, w):
    """The PyTorch op on CPU tensors posed as the stand-in's: ({name: call} for forward,
    {name: call} for a training step's kernels), or None where torch cannot be imported."""
    try:
        import torch

        from pycudnnrnn.torch import op_backends as kernels
    except ImportError:
        return None
    from pycudnnrnn.core import arrays
    from pycudnnrnn.core.arrays import host_lengths
    monkeypatch.setattr(kernels, "_plan_device", lambda tensor: 0)
    kind = arrays.device_kind
    monkeypatch.setattr(arrays, "device_kind", lambda name, a, strict=True: "cuda" if isinstance(
        a, torch.Tensor) else kind(name, a, strict))
    take = type(cupy).from_dlpack

    def from_dlpack(self, a):  # the tensor's memory, as CuPy's import of a CUDA tensor
        return a.numpy().view(fake_cuda.LightDeviceArray) if isinstance(a, torch.Tensor) \
            else take(self, a)

    monkeypatch.setattr(type(cupy), "from_dlpack", from_dlpack)

    def run_forward(input, input_h, input_c, params, sequence_lengths, seed,
                    attributes):  # kernels.run_forward's CUDA branch, less _on_device
        input, input_h, input_c, params = kernels._detached(input, input_h, input_c, params)
        return kernels.planned_forward(input, input_h, input_c, params,
                                       host_lengths(sequence_lengths), seed, attributes)

    monkeypatch.setattr(kernels, "run_forward", run_forward)
    tx, th, tc, tw = (torch.from_numpy(np.asarray(a).view(np.ndarray).copy())
                      for a in (x, h, c, w))
    seed = torch.tensor(0)
    op = torch.ops.pycudnnrnn.forward
    names = ("rnn_mode", "input_mode", "direction", "dropout", "num_proj", "time_major")
    grads = [torch.ones_like(t) for t in (tx, th, tc)]
    training, inference = (Attributes(**ATTRS, is_training=t) for t in (True, False))

    def training_step():
        y, hy, cy, reserve = kernels.planned_forward(tx, th, tc, tw, None, seed, training)
        kernels.planned_backprop(tx, th, tc, tw, y, hy, cy, *grads, reserve, None, seed,
                                 training, "all", True)

    forward = {
        "forward PyTorch op, kernel": lambda: kernels.planned_forward(
            tx, th, tc, tw, None, seed, inference),
        "forward PyTorch op, dispatched": lambda: op(
            tx, th, tc, tw, None, seed, *(ATTRS[n] for n in names), False),
    }
    return forward, {"fwd+bwd PyTorch op, kernels": training_step}


HOST_WORK = ("events", "waits", "syncs", "allocations")


def host_work(calls: int = 4) -> dict:
    """{row: {kind: count per call}} of the GPU work the host asks for per eager call, on
    the full stand-in, after a first call (the plan built, its uploads done): events
    recorded, stream waits (``cudaStreamWaitEvent``), syncs, blocks taken from a pool."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        fake_cuda.install(monkeypatch)
        counted = {"events": 0, "waits": 0}
        record, wait = fake_cuda.FakeEvent.record, fake_cuda.streams._wait

        def counting_record(self, stream=None):
            counted["events"] += 1
            return record(self, stream)

        def counting_wait(ptr, event, flags=0):
            counted["waits"] += 1
            return wait(ptr, event, flags)

        monkeypatch.setattr(fake_cuda.FakeEvent, "record", counting_record)
        monkeypatch.setattr(fake_cuda.streams, "_wait", counting_wait)
        cp = pycudnnrnn.core.gpu.cupy()
        rng = np.random.default_rng(0)
        n = pycudnnrnn.params_size(num_layers=1, num_units=8, input_size=8, rnn_mode="lstm")
        x, h, c = (fake_cuda._device(rng.standard_normal((1, 1, 8)).astype(np.float32))
                   for _ in range(3))
        w = fake_cuda._device(rng.standard_normal(n).astype(np.float32))
        size = dict(num_layers=1, num_units=8, input_size=8, max_time=1, batch_size=1,
                    device="cuda")
        inference = pycudnnrnn.RNNPlan(**size, is_training=False)
        training = pycudnnrnn.RNNPlan(**size)
        dropout = pycudnnrnn.RNNPlan(**size, dropout=0.5, seed=1)
        grads = [fake_cuda._device(np.ones(a.shape, np.float32)) for a in (x, h, c)]

        plan_step, functional_step = _training_steps(training, x, h, c, w, grads)

        def dropout_step():
            y, hy, cy, reserve = dropout.forward(x, h, c, w)
            dropout.backprop(x, h, c, w, y, hy, cy, *grads, reserve)

        rows = {"forward plan": lambda: inference.forward(x, h, c, w),
                "fwd+bwd plan": plan_step,
                "fwd+bwd plan, dropout": dropout_step,
                "forward functional": lambda: pycudnnrnn.forward(x, h, c, w,
                                                                 is_training=False),
                "fwd+bwd functional": functional_step}
        other = cp.cuda.Stream(non_blocking=True)
        counts = {}
        for where, stream in (("home stream", None), ("another stream", other)):
            for name, call in rows.items():
                with stream if stream is not None else contextlib.nullcontext():
                    call()  # built (the functional API's plans) and run once
                    fake_cuda.synchronize_all()
                    fake_cuda.reset_counts()
                    counted.update(events=0, waits=0)
                    for _ in range(calls):
                        call()
                    fake_cuda.synchronize_all()
                counts[f"{name}, {where}"] = {
                    "events": counted["events"] / calls, "waits": counted["waits"] / calls,
                    "syncs": fake_cuda.COUNTS["sync"] / calls,
                    "allocations": fake_cuda.COUNTS["pool_alloc"] / calls}
        del inference, training, dropout
        pycudnnrnn.plan.clear_caches()
        fake_cuda.synchronize_all()
        waiter.wait_released()  # plans run on another stream: let go of by the waiter
    return counts


def format_host_work(counts: dict) -> str:
    lines = ["host GPU work per eager call on the full stand-in, LSTM T1 B1 H8 f32 "
             "(per call, after the first)",
             f"  {'':<38}" + "".join(f"{k:>12}" for k in HOST_WORK)]
    for name, row in counts.items():
        lines.append(f"  {name:<38}" + "".join(f"{row[k]:12.2f}" for k in HOST_WORK))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--full", action="store_true",
                        help="the full stand-in (its emulation included), compute calls no-ops")
    parser.add_argument("--wall", action="store_true", help="wall time, not CPU time")
    args = parser.parse_args()
    clock = time.perf_counter if args.wall else time.thread_time
    with pytest.MonkeyPatch.context() as monkeypatch:
        if args.full:
            fake = fake_cuda.install(monkeypatch)
            for name in COMPUTE:
                monkeypatch.setattr(fake, name, lambda *a: None)
            put = fake_cuda._device
        else:
            fake_cuda.install_light(monkeypatch)
            put = pycudnnrnn.core.gpu.cupy().asarray
        rng = np.random.default_rng(0)
        n = pycudnnrnn.params_size(num_layers=1, num_units=8, input_size=8, rnn_mode="lstm")
        x, h, c = (put(rng.standard_normal(s).astype(np.float32))
                   for s in ((1, 1, 8), (1, 1, 8), (1, 1, 8)))
        w = put(rng.standard_normal(n).astype(np.float32))
        inference = pycudnnrnn.RNNPlan(num_layers=1, num_units=8, input_size=8, max_time=1,
                                       batch_size=1, device="cuda", is_training=False)
        training = pycudnnrnn.RNNPlan(num_layers=1, num_units=8, input_size=8, max_time=1,
                                      batch_size=1, device="cuda")
        out = training.forward(x, h, c, w)
        grads = [put(np.ones(a.shape, a.dtype)) for a in out[:3]]

        plan_step, functional_step = _training_steps(training, x, h, c, w, grads)

        frame, handler = _xla_forward_frame(x, h, c, w)
        calls = {
            "forward plan": lambda: inference.forward(x, h, c, w),
            "forward functional": lambda: pycudnnrnn.forward(x, h, c, w, is_training=False),
            "forward XLA handler": lambda: frame.call(handler),
        }
        torch_calls = None if args.full else _torch_forward(
            monkeypatch, pycudnnrnn.core.gpu.cupy(), x, h, c, w)
        calls.update(torch_calls[0] if torch_calls else {})
        if not args.full:
            calls[FLOOR] = _floor(
                pycudnnrnn.core.gpu.cupy(), inference, x, h, c, w)
        forward = interleaved(calls, args.rounds, 500, clock=clock)
        step = interleaved({"fwd+bwd plan": plan_step, "fwd+bwd functional": functional_step,
                            "fwd+bwd XLA handlers": _xla_step(x, h, c, w),
                            **(torch_calls[1] if torch_calls else {})},
                           args.rounds, 200, clock=clock)
        pycudnnrnn.plan.clear_caches()  # no stand-in plan outlives the stand-in
    stand_in = "full stand-in GPU (its emulation included)" if args.full else \
        "light stand-in GPU"
    print(format_rows(f"host us per call ({'wall' if args.wall else 'CPU'} time) on the "
                      f"{stand_in}, LSTM T1 B1 H8 f32, forward (inference)", forward))
    floor = forward.get(FLOOR)
    if floor is not None:
        ours = forward["forward plan"][0] - floor[0]
        print(f"  {'our Python in a plan forward':<34} {ours:10.1f} us  (forward plan less "
              f"the floor, medians)")
    print(format_rows("same, forward + backprop", step))
    if args.full:
        print("(the PyTorch op is timed on the light stand-in only)")
    elif torch_calls is None:
        print("(the PyTorch op is not timed: torch cannot be imported)")
    else:
        print("(PyTorch op: CPU tensors posed as CUDA ones; torch.cuda's stream and "
              "allocator lookup, which need a CUDA build, are not timed)")
    print(format_host_work(host_work()))


if __name__ == "__main__":
    main()
