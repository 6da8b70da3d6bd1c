"""The CPU backend's executor: what an ``RNNPlan`` on the CPU runs.

It keeps the contract every backend's executor keeps (``pycudnnrnn.plan.backend``):
sizes; ``forward`` and ``backprop`` writing into the caller's buffers where given; the
device and reserve-space notes, which the CPU has no use for. It runs
``pycudnnrnn.cpu.rnn``.
"""

from __future__ import annotations

import contextlib
import copy

import numpy as np

from ..core import memory
from ..core.config import Problem
from . import rnn

_NO_OUT = (None,) * 4


class Executor:
    """The CPU half of a plan: the NumPy backend with the batch's sorted order kept."""

    kind = device_name = "cpu"
    xp = np
    #: NumPy draws its masks from the seed at run time: a new seed needs no new executor.
    reseeds = True
    #: No caller's buffer is cuDNN's: ``forward_at`` and ``backprop_at`` are the GPU's.
    in_place = False

    def __init__(self, problem: Problem, device: None = None):
        self.problem = problem
        memory.ensure_available(rnn.plan_nbytes(problem), "a plan")
        self.batch = rnn._Batch(problem)
        self.reserve_nbytes = rnn.reserve_nbytes(problem) if problem.is_training else 0
        self.workspace_nbytes = self.forward_workspace_nbytes = 0
        # Estimated once; each run compares them with the memory available then.
        self.forward_nbytes = rnn.forward_nbytes(problem)
        self.backprop_nbytes = rnn.backprop_nbytes(problem) \
            if problem.is_training else 0

    @staticmethod
    def traced_reserve_nbytes(problem: Problem) -> int:
        """The reserve space's bytes, from the shapes alone: symbolic sizes (a trace's)
        give a symbolic answer."""
        return rnn.reserve_nbytes(problem)

    def reseeded(self, problem: Problem) -> "Executor":
        """This executor for `problem`, the same but for its dropout seed."""
        seeded = copy.copy(self)
        seeded.problem = problem
        return seeded

    def on_device(self):
        return contextlib.nullcontext()

    def remember_reserve(self, buffer, reserve=None, address=None):
        """Nothing: the CPU's reserve space is read whole at each backprop."""

    def forward(self, input, input_h, input_c, params, out=_NO_OUT, workspace=None,
                restart_dropout=False, dropout_key=None):
        memory.ensure_available(self.forward_nbytes, "forward")
        results = rnn.forward(self.problem, input=input, input_h=input_h,
                              input_c=input_c, params=params, batch=self.batch)
        return _copy_into(results, out)

    def backprop(self, input, input_h, input_c, params, output, output_h, output_c,
                 output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                 out=_NO_OUT, workspace=None, gradients="all"):
        memory.ensure_available(self.backprop_nbytes, "backprop")
        results = rnn.backprop(self.problem, input, input_h, input_c, params, output,
                               output_h, output_c, output_backprop, output_h_backprop,
                               output_c_backprop, reserve_space, gradients=gradients,
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
