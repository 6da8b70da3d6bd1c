"""How a call's arrays become cuDNN's and cuDNN's results become the call's.

cuDNN runs on the rows whose sequences are not empty, with contiguous ``[L·D, B, ·]``
states; the caller's arrays may be batch-major, hold empty rows and be ragged. A
``Staging`` knows which of these a problem has and moves arrays across: into cuDNN's
layout before a pass, back into the caller's after.
"""

from __future__ import annotations

import numpy as np

from ..core.config import Problem


class Staging:
    """The layout facts of one problem on one device, and the moves they call for.

    Parameters
    ----------
    cupy : module
    problem : Problem
    storage : dtype
        What the data's buffers are made of (see ``Executor``).

    Notes
    -----
    Build it inside the plan's device and allocator: it uploads the running rows' index
    and, when ragged, the padding masks.
    """

    def __init__(self, cupy, problem: Problem, storage):
        self.cupy, self.problem, self.storage = cupy, problem, storage
        T, lengths = problem.max_time, problem.full_lengths
        rows = np.flatnonzero(lengths > 0)  # zero-length rows stay out of cuDNN
        self.batch = B = int(rows.size)
        self.all_rows = B == problem.batch_size
        self.run_lengths = lengths[rows].astype(np.int32)
        self.ragged = bool((self.run_lengths < T).any())
        self.time_major = problem.time_major
        # States go to cuDNN as the caller gave them, and come back as cuDNN made them
        # (contiguous, [L·D, B, ·]), when every row runs and they are time-major.
        self.direct_states = self.all_rows and self.time_major
        self.rows = None if self.all_rows else cupy.asarray(rows)
        # Padding's zero: a device array of the data's dtype, not a host scalar (CuPy's
        # bfloat16 support is minimal: its kernels need not take an ml_dtypes scalar).
        self.zero = cupy.zeros((), storage)
        if B and self.ragged:
            steps = np.arange(T)[:, None] < self.run_lengths[None, :]
            steps = (steps if self.time_major else steps.T)[..., None]
            self.valid, self.padding = cupy.asarray(steps), cupy.asarray(~steps)

    def run_shape(self, width):
        """The shape of data cuDNN runs on: the running rows only."""
        T, B = self.problem.max_time, self.batch
        return (T, B, width) if self.time_major else (B, T, width)

    def data_in(self, x, zero_padding):
        """Caller's data → the running rows, contiguous, padding zeroed when ragged."""
        if not self.all_rows:
            x = x[:, self.rows] if self.time_major else x[self.rows]
        if zero_padding and self.ragged:
            return self.cupy.where(self.valid, x, self.zero)
        return self.cupy.ascontiguousarray(x)

    def state_in(self, s):
        """Caller's state → cuDNN's: contiguous ``[L·D, B, ·]`` of the running rows."""
        if self.direct_states:
            return self.cupy.ascontiguousarray(s)
        s = s if self.time_major else s.swapaxes(0, 1)
        return self.cupy.ascontiguousarray(s if self.all_rows else s[:, self.rows])

    def data_target(self, out, width):
        """Where cuDNN writes data results: the caller's buffer when all rows run."""
        if out is not None and self.all_rows:
            return out
        return self.cupy.empty(self.run_shape(width), dtype=self.storage)

    def data_out(self, run, out, width):
        """cuDNN's data result `run` in the caller's layout (into `out` when given);
        rows that did not run are zero."""
        if run is out:
            return out
        if self.all_rows:
            full = run
        else:
            full = out if out is not None else self.cupy.empty(
                self.problem.data_shape(width), dtype=self.storage)
            full[...] = 0
            if self.time_major:
                full[:, self.rows] = run
            else:
                full[self.rows] = run
            return full
        return into(out, full)

    def state_target(self, out, like):
        """Where cuDNN writes a state result: the caller's buffer when states go direct."""
        if out is not None and self.direct_states:
            return out
        return self.cupy.empty_like(like)

    def state_out(self, run, out, passthrough):
        """Rows that ran take cuDNN's result; the others keep `passthrough` (caller's layout)."""
        if run is out or self.direct_states:  # cuDNN wrote into `out`, or a fresh array
            return run
        tm = self.time_major
        if self.all_rows:
            full = run if tm else run.swapaxes(0, 1)
        else:  # never into the caller's passthrough array
            full = (passthrough if tm else passthrough.swapaxes(0, 1)).copy()
            full[:, self.rows] = run
            full = full if tm else full.swapaxes(0, 1)
        return into(out, full) if out is not None else self.cupy.ascontiguousarray(full)


def into(out, value, copy=False):
    """`value` written into `out` when given (else `value`, copied if asked)."""
    if out is None:
        return value.copy() if copy else value
    out[...] = value
    return out
