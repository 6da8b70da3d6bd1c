"""The GPU's reserve space: the header forward writes, the check backprop makes, and
the copy cuDNN's backward calls are handed.

A reserve space is ``HEADER`` bytes of ``pycudnnrnn.core.reserve_header`` (which says
whose it is), then cuDNN's part. The header is remembered on the host by buffer, so
backprop reads it back only for a buffer this process did not make.
"""

from __future__ import annotations

import numpy as np

from ..core import reserve_header
from ..core.config import Problem

MAGIC = b"pycudnnrnn-gpu\x00\x01"
HEADER = reserve_header.HEADER_BYTES


def copy_offset(work_bytes: int) -> int:
    """Where backprop's copy of cuDNN's part starts in the workspace: after cuDNN's
    `work_bytes`, 256-byte aligned, as cuDNN wants."""
    return -(-work_bytes // HEADER) * HEADER


class ReserveSpace:
    """The reserve spaces of one plan: made, opened and copied for cuDNN.

    Parameters
    ----------
    cupy : module
    problem : Problem
    tf32 : bool
        Whether the plan allows TF32 (its header says so).
    reserve_bytes, work_bytes : int
        cuDNN's reserve space and workspace sizes.

    Notes
    -----
    Build it inside the plan's device and allocator: it uploads the header.
    """

    def __init__(self, cupy, problem: Problem, tf32: bool, reserve_bytes: int,
                 work_bytes: int):
        self.cupy, self.problem, self.tf32 = cupy, problem, tf32
        self.reserve_bytes, self.copy_offset = reserve_bytes, copy_offset(work_bytes)
        self.head = reserve_header.header(problem, MAGIC, tf32)
        self.head_device = cupy.asarray(np.frombuffer(self.head, dtype=np.uint8))
        self.head_ptr = self.head_device.data.ptr

    @property
    def nbytes(self) -> int:
        """Bytes of a reserve space: the header, then cuDNN's part."""
        return HEADER + self.reserve_bytes

    def new(self, given):
        """A reserve space with its header written: `given` (a caller's buffer), or a
        new one."""
        reserve = given if given is not None else self.cupy.empty(max(self.nbytes, 1),
                                                                   self.cupy.uint8)
        reserve[:reserve_header.IDENTITY_BYTES] = self.head_device  # device to device
        reserve_header.remember(reserve, reserve.data.ptr, self.head)
        return reserve

    def open(self, reserve_space):
        """`reserve_space`, contiguous, once its header says it is this plan's forward's
        (else ``reserve_header.check``'s error)."""
        cp, n = self.cupy, reserve_header.IDENTITY_BYTES
        reserve_space = cp.ascontiguousarray(reserve_space)
        readable = reserve_space.dtype == cp.uint8 and reserve_space.size >= n
        head = reserve_header.identity(
            reserve_space, reserve_space.data.ptr,
            lambda: self.read_header(reserve_space) if readable else None)
        if not (head == self.head and readable and reserve_space.size == self.nbytes):
            reserve_header.check(head, reserve_space.dtype, reserve_space.size, self.nbytes,
                                 self.problem, MAGIC, "cuDNN", self.tf32)
        return reserve_space

    def read_header(self, reserve_space) -> bytes:
        """The identity of a reserve space this process did not note: a device→host
        copy and a sync, which a capturing stream refuses (so a clear error then)."""
        stream = self.cupy.cuda.get_current_stream()
        if stream.is_capturing():
            raise ValueError(
                "reserve_space: this backprop runs under CUDA-graph capture and the "
                "reserve space is not the array its forward returned here (a copy, or a "
                "framework's tensor object rebuilt at each replay), so its header would "
                "have to be read back, a sync capture refuses: pass the array forward "
                "returned, or note it with RNNPlan.trust_reserve(reserve_space)")
        return bytes(self.cupy.asnumpy(reserve_space[:reserve_header.IDENTITY_BYTES]))

    def copy(self, reserve, workspace):
        """A copy of the cuDNN part of `reserve`, for cuDNN's backward calls.

        ``cudnnRNNBackwardData_v8`` and ``cudnnRNNBackwardWeights_v8`` take reserveSpace
        ``[in,out]``: cuDNN may write into it. Handing them a copy keeps the caller's
        reserve space as forward left it, so any number of backprops may use it (a
        second ``backward(retain_graph=True)``, a JAX vjp called twice, ``jacrev``), and
        XLA's operands stay unwritten. The copy lives after cuDNN's workspace in
        `workspace` when that is large enough (``workspace_nbytes``), else in the pool.
        """
        n, start = self.reserve_bytes, self.copy_offset
        if workspace is not None and workspace.size >= start + n:
            copy = workspace[start:start + n]
        else:
            copy = self.cupy.empty(max(n, 1), self.cupy.uint8)[:n]
        copy[...] = reserve[HEADER:HEADER + n]  # device to device, on the current stream
        return copy
