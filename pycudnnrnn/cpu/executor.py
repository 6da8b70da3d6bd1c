"""The CPU backend's executor: what an ``RNNPlan`` on the CPU runs.

The same surface as the CUDA backend's ``Executor`` (sizes; ``forward`` and ``backprop``
writing into the caller's buffers where given), over ``pycudnnrnn.cpu.rnn``.
"""

from __future__ import annotations

from ..core import memory
from ..core.config import Problem
from . import rnn


class Executor:
    """The CPU half of a plan: the NumPy backend with the batch's sorted order kept."""

    def __init__(self, problem: Problem):
        self.problem = problem
        memory.ensure_available(rnn.plan_nbytes(problem), "a plan")
        self.batch = rnn._Batch(problem)
        self.reserve_nbytes = rnn.reserve_nbytes(problem) if problem.is_training else 0
        self.workspace_nbytes = self.forward_workspace_nbytes = 0
        # Estimated once; each run compares them with the memory available then.
        self.forward_nbytes = rnn.forward_nbytes(problem)
        self.backprop_nbytes = rnn.backprop_nbytes(problem) \
            if problem.is_training else 0

    def forward(self, input, input_h, input_c, params, out, workspace=None,
                restart_dropout=False, dropout_key=None):
        memory.ensure_available(self.forward_nbytes, "forward")
        results = rnn.forward(self.problem, input=input, input_h=input_h,
                                        input_c=input_c, params=params, batch=self.batch)
        return _copy_into(results, out)

    def backprop(self, out, workspace=None, gradients="all", **arrays):
        memory.ensure_available(self.backprop_nbytes, "backprop")
        results = rnn.backprop(self.problem, **arrays, gradients=gradients,
                                         batch=self.batch)
        return _copy_into(results, out)


def _copy_into(results, out):
    """Results written into the caller's buffers where given."""
    merged = []
    for result, buffer in zip(results, out):
        if buffer is None or result is None:
            merged.append(result)
        else:
            buffer[...] = result
            merged.append(buffer)
    return tuple(merged)
