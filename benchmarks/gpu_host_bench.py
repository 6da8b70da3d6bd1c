"""Host-side cost of a GPU call, measured on the CPU with the stand-in GPU.

    PYTHONPATH=. python3 benchmarks/gpu_host_bench.py [--rounds N]

Runs the cuDNN backend's own Python code on tests/fake_cuda.py with cuDNN's compute
calls made no-ops (still marshalled through ctypes), so what is timed is the host
budget a GPU call pays on top of cuDNN's own: a plan's run against the functional API,
on a tiny LSTM (T=1, B=1, H=8), and the XLA CUDA handler on a call frame built in
Python (tests/fake_xla.py). The stand-in's own emulation (queues, pool, copies) is
included, so the figures are an upper bound. (The PyTorch op is not timed here: it needs
torch.cuda.) Interleaved rounds; median and quartiles. Asserts nothing.
"""

import argparse
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "benchmarks")]

import fake_cuda  # noqa: E402
import pycudnnrnn  # noqa: E402
import pycudnnrnn.plan  # noqa: E402
from gpu_bench import format_rows, interleaved  # noqa: E402

COMPUTE = ("_cudnnRNNForward", "_cudnnRNNBackwardData_v8", "_cudnnRNNBackwardWeights_v8")


def _xla_forward_frame(x, h, c, w):
    """An inference forward call frame over host copies of the arrays, and the handler."""
    from fake_xla import FakeCallFrame
    from pycudnnrnn import jax as rnn_jax
    from pycudnnrnn.jax import targets, xla_ffi
    host = [np.asarray(a).view(np.ndarray).copy() for a in (x, h, c, w)]
    op = rnn_jax._Op(rnn_mode="lstm", input_mode="linear_input", direction="unidirectional",
                     dropout=0.0, seed=0, seed2=0, num_proj=0, time_major=True,
                     is_training=False)
    problem = op.problem(*host)
    reserve, workspace = targets.buffer_sizes(problem, cuda=True)
    results = [np.empty_like(host[0]), np.empty_like(host[1]), np.empty_like(host[2]),
               np.zeros(max(reserve, 1), np.uint8), np.zeros(max(workspace, 1), np.uint8)]
    frame = FakeCallFrame(host, results, op.attributes(False))
    return frame, xla_ffi.make_handler(targets.cuda_forward)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with pytest.MonkeyPatch.context() as monkeypatch:
        fake = fake_cuda.install(monkeypatch)
        for name in COMPUTE:
            monkeypatch.setattr(fake, name, lambda *a: None)
        rng = np.random.default_rng(0)
        attrs = dict(rnn_mode="lstm")
        n = pycudnnrnn.params_size(num_layers=1, num_units=8, input_size=8, **attrs)
        x, h, c = (fake_cuda._device(rng.standard_normal(s).astype(np.float32))
                   for s in ((1, 1, 8), (1, 1, 8), (1, 1, 8)))
        w = fake_cuda._device(rng.standard_normal(n).astype(np.float32))
        inference = pycudnnrnn.RNNPlan(num_layers=1, num_units=8, input_size=8, max_time=1,
                                       batch_size=1, device="cuda", is_training=False)
        training = pycudnnrnn.RNNPlan(num_layers=1, num_units=8, input_size=8, max_time=1,
                                      batch_size=1, device="cuda")
        out = training.forward(x, h, c, w)
        grads = [fake_cuda._device(np.ones_like(a)) for a in out[:3]]

        def plan_step():
            y, hy, cy, reserve = training.forward(x, h, c, w)
            training.backprop(x, h, c, w, y, hy, cy, *grads, reserve)

        def functional_step():
            y, hy, cy, reserve = pycudnnrnn.forward(x, h, c, w)
            pycudnnrnn.backprop(x, h, c, w, None, y, hy, cy, *grads, reserve)

        frame, handler = _xla_forward_frame(x, h, c, w)
        forward = interleaved({
            "forward plan": lambda: inference.forward(x, h, c, w),
            "forward functional": lambda: pycudnnrnn.forward(x, h, c, w, is_training=False),
            "forward XLA handler": lambda: frame.call(handler),
        }, args.rounds, 500)
        step = interleaved({"fwd+bwd plan": plan_step, "fwd+bwd functional": functional_step},
                           args.rounds, 200)
        pycudnnrnn.plan.clear_caches()  # no stand-in plan outlives the stand-in
    print(format_rows("host us per call on the stand-in GPU, LSTM T1 B1 H8 f32, forward "
                      "(inference)", forward))
    print(format_rows("same, forward + backprop", step))


if __name__ == "__main__":
    main()
