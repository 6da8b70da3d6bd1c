"""The GPU hazards of issue 17, each pinned by a test that failed before its fix.

Each runs on the stand-in GPU of ``fake_cuda.py``, which lives in time (queued work,
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
