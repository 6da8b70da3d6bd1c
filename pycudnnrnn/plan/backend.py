"""What the plan asks of a backend: the executor contract, and which backend runs a device.

An executor is one validated problem on one device, built once, with everything a run
needs that the data does not. ``RNNPlan`` checks the caller's arrays and hands the
executor backend arrays (NumPy or CuPy); it never asks which backend it holds. A new
backend writes an executor that keeps ``Executor``, names it in ``executor_type`` and
its caches, if any, in ``clear_backend_caches``.
"""

from __future__ import annotations

from typing import ContextManager, Protocol

from ..core.config import Problem
from ..cpu import executor as cpu_executor


class Executor(Protocol):
    """The contract of ``pycudnnrnn.cpu.executor.Executor`` and
    ``pycudnnrnn.cuda.executor.Executor``.

    Attributes
    ----------
    problem : Problem
    kind : {"cpu", "cuda"}
        Where its arrays live, as ``pycudnnrnn.core.arrays.device_kind`` says.
    device_name : str
        "cpu", "cuda:N": how a plan names its device.
    xp : module
        The array library of its arrays: NumPy or CuPy.
    reseeds : bool
        Whether ``reseeded`` can give it another dropout seed (a class attribute: the
        plan cache asks before any executor exists).
    in_place : bool
        Whether it runs on the caller's buffers as they are, by address (``forward_at``
        and ``backprop_at``, which only such an executor has).
    reserve_nbytes, workspace_nbytes, forward_workspace_nbytes : int
        The sizes ``RNNPlan`` documents.
    """

    problem: Problem
    kind: str
    device_name: str
    reseeds: bool
    in_place: bool
    reserve_nbytes: int
    workspace_nbytes: int
    forward_workspace_nbytes: int

    def __init__(self, problem: Problem, device: int | None): ...

    @staticmethod
    def traced_reserve_nbytes(problem: Problem) -> int | None:
        """The reserve space's bytes from the shapes alone (symbolic ones too), or None
        where only a built executor knows."""

    def reseeded(self, problem: Problem) -> "Executor":
        """This executor for `problem`, which differs in its dropout seed alone; a
        ValueError where the seed is fixed (``reseeds`` False)."""

    def on_device(self) -> ContextManager:
        """Its device, made current for a run (a null context on the CPU)."""

    def remember_reserve(self, buffer, reserve=None, address=None) -> None:
        """Note `buffer` as holding its forward's reserve space (at `address`, else that
        of `reserve` or `buffer`), so that backprop need not read its header back."""

    def forward(self, input, input_h, input_c, params, out=(None,) * 4, workspace=None,
                restart_dropout=False, dropout_key=None) -> tuple:
        """``(output, output_h, output_c, reserve_space)`` from backend arrays; `out`:
        four buffers or None; `input_c` None unless LSTM."""

    def backprop(self, input, input_h, input_c, params, output, output_h, output_c,
                 output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                 out=(None,) * 4, workspace=None, gradients="all") -> tuple:
        """``(input_backprop, input_h_backprop, input_c_backprop, params_backprop)``,
        None for those `gradients` leaves out; the ``_c`` arrays None unless LSTM."""


def executor_type(device: int | None) -> type:
    """The executor of the backend that runs `device` (a CUDA device number; None: the
    CPU). The CUDA backend is imported when first asked for: CuPy loads with it."""
    if device is None:
        return cpu_executor.Executor
    from ..cuda import executor as cuda_executor
    return cuda_executor.Executor


def clear_backend_caches():
    """Drop what the backends cache across plans: the cuDNN backend's descriptors and
    dropout states (freed once no plan holds them)."""
    from ..cuda import resources
    resources.clear_caches()
