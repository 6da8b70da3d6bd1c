"""The buffers a caller hands a plan's run: results (``out=``) and workspace, checked.

A result's buffer must be of the result's shape and dtype, C-contiguous and writable; the
workspace a writable 1-D uint8 buffer of the size asked. ``refuse_overlaps`` refuses
buffers that share memory with each other or an input, for the callers' entry points.
"""

from __future__ import annotations

import numpy as np

from ..core import checks, dtypes

NO_OUT = (None,) * 4  # every run has four results


def checked_outputs(out, results, adopt, bits):
    """Caller buffers for the `results` (name, shape, dtype), checked; None where not
    given or where there is no such result (output_c of other cells, an inference
    reserve_space).

    Parameters
    ----------
    out : tuple or list, or None
    results : list of (str, tuple or None, dtype)
    adopt : callable
        The plan's ``_adopt``: a dict of the caller's arrays as backend arrays.
    bits : bool
        Whether the plan computes on bfloat16's bits (``dtypes.storage``).
    """
    if out is None:  # (run_forward and run_backprop do not ask)
        return NO_OUT
    if not isinstance(out, (tuple, list)) or len(out) != len(results):
        names = ", ".join(name for name, _, _ in results)
        if not isinstance(out, (tuple, list)):
            raise TypeError(f"out: expected a tuple of {len(results)} buffers ({names}) "
                            f"or None, got {type(out).__module__}."
                            f"{type(out).__qualname__}")
        raise ValueError(f"out: expected {len(results)} buffers ({names}) or None, got "
                         f"{len(out)}")
    checked = []
    for (name, shape, dtype), buffer in zip(results, out):
        if buffer is None or shape is None:
            checked.append(None)
            continue
        label = "out " + name
        buffer = adopt({label: buffer})[label]
        if buffer.shape != shape or buffer.dtype != dtype:
            checks.check_arrays({label: buffer}, [(label, shape, "(the result's)")],
                                dtype, "the result")
        if not buffer.flags.c_contiguous:
            raise ValueError(f"{label}: expected a C-contiguous buffer")
        if not getattr(buffer.flags, "writeable", True):  # a read-only NumPy view, a
            # JAX CPU array (CuPy's flags have no such field: its arrays are writable)
            raise ValueError(f"{label}: expected a writable buffer, got a read-only one")
        checked.append(dtypes.storage(buffer) if bits else buffer)
    return tuple(checked)


def checked_workspace(workspace, nbytes, adopt):
    """The caller's workspace, checked: at least `nbytes`; `adopt` as for
    ``checked_outputs``."""
    if workspace is None:
        return None
    workspace = adopt({"workspace": workspace})["workspace"]
    if workspace.dtype != np.uint8:
        raise TypeError(f"workspace: expected dtype uint8, got {workspace.dtype}")
    if workspace.ndim != 1 or workspace.shape[0] < nbytes or \
            not workspace.flags.c_contiguous or \
            not getattr(workspace.flags, "writeable", True):
        raise ValueError(f"workspace: expected a writable, contiguous 1-D uint8 buffer of "
                         f"at least {nbytes} bytes, got shape {tuple(workspace.shape)}")
    return workspace


def byte_range(array) -> tuple[int, int]:
    """The bytes an array may touch, ``[low, high)`` (its strides' extent)."""
    start = array.data.ptr if hasattr(array.data, "ptr") else array.ctypes.data
    low = high = start
    for n, stride in zip(array.shape, array.strides):
        if n == 0:
            return start, start
        (low, high) = (low + stride * (n - 1), high) if stride < 0 else \
            (low, high + stride * (n - 1))
    return low, high + array.itemsize


def refuse_overlaps(results, out, workspace, inputs):
    """A caller buffer that shares bytes with another, or with an input, would have one
    result written over another (or over what is still being read): a ValueError naming
    both. Checked by address range, which is exact for the contiguous buffers.

    Run for ``forward``/``backprop``, the callers' entry points; the framework adapters
    call ``run_forward``/``run_backprop`` with buffers their allocator just made.
    """
    if workspace is None and all(b is None for b in out):
        return
    buffers = [(f"out {name}", b) for (name, _, _), b in zip(results, out) if b is not None]
    buffers += [("workspace", workspace)] if workspace is not None else []
    given = buffers + [(name, a) for name, a in inputs.items() if a is not None]
    ranges = [(name, byte_range(dtypes.storage(a))) for name, a in given]
    for i, (name, (low, high)) in enumerate(ranges[:len(buffers)]):
        for other, (other_low, other_high) in ranges[i + 1:]:
            if low < other_high and other_low < high:
                raise ValueError(f"{name}: shares memory with {other}; each result needs a "
                                 f"buffer of its own")
