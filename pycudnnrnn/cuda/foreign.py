"""Another library's CUDA arrays: the stream to run on, and keeping them alive.

A PyTorch tensor's work runs on PyTorch's current stream; arrays of any other library
than CuPy are kept until the work that reads them is done (their library may reuse
their memory at once on its own stream, unordered with ours).
"""

from __future__ import annotations

import collections
import threading

from . import graphs

_in_flight: collections.deque = collections.deque()  # (event, arrays), oldest first
_in_flight_lock = threading.Lock()


def caller_stream(cupy, array, device: int):
    """CuPy's view of the stream `array`'s library works on, to run the call there: a
    PyTorch CUDA tensor's current stream; None for other arrays (CuPy's current stream
    then, and ``keep_until_done`` for those from another library), and inside
    ``pycudnnrnn.graphs.capture``, whose stream is the one to capture on."""
    if type(array).__module__.split(".")[0] != "torch" or graphs.holding() is not None:
        return None
    import torch
    return cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream, device)


def keep_until_done(cupy, arrays) -> None:
    """Keep another library's `arrays` alive until the work just queued on CuPy's
    current stream (which reads them) is done.

    That library frees their memory when the caller drops them and may hand it out
    again on its own stream at once, unordered with CuPy's: an event recorded now
    marks the work, and the arrays are released by a later call once it has
    completed (a query, never a sync). Not while a graph is captured: the caller keeps
    what a graph reads.
    """
    if graphs.holding() is not None:
        return
    event = cupy.cuda.get_current_stream().record()
    with _in_flight_lock:
        while _in_flight and _in_flight[0][0].done:
            _in_flight.popleft()
        _in_flight.append((event, tuple(arrays)))
