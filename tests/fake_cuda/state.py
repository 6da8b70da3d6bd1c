"""The stand-in's shared state: counters, the capture list, the lock its time runs under.

Every other module of the stand-in reads these; none of them imports another module of it.
"""

import collections
import threading

#: Host↔device traffic of the stand-in GPU since the last ``reset_counts()``.
COUNTS: collections.Counter = collections.Counter()

#: The streams capturing a graph now: transfers and syncs then fail, as in CUDA.
CAPTURING = []

#: Set STRICT[0] to run streams out of submission order at device syncs.
STRICT = [False]

#: Set PER_THREAD_DEFAULT_STREAM[0] to make every thread's default stream its own
#: per-thread stream (pointer 2), as ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` does.
PER_THREAD_DEFAULT_STREAM = [False]

#: cudaStreamCaptureMode (CuPy's ``runtime.streamCaptureMode*``), and cudaEventWaitExternal.
CAPTURE_GLOBAL, CAPTURE_THREAD_LOCAL, CAPTURE_RELAXED = 0, 1, 2
EVENT_WAIT_EXTERNAL = 1

POISON = 0xFF  # every byte of freed or fresh memory: NaN in float16/32/64 and bfloat16


def reset_counts():
    COUNTS.clear()


def _count(kind):
    if CAPTURING:
        raise RuntimeError(f"the current stream is capturing, so {kind} is disallowed")
    COUNTS[kind] += 1


_lock = threading.RLock()
_local = threading.local()
_progress = threading.Condition(_lock)  # notified when a stream's queued work has run

#: Every stand-in cuDNN GPU call, in order (FakeCudnn.calls is per instance).
CALLS = []
