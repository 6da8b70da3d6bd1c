"""Another library's CUDA arrays: the stream to run on, and keeping them alive.

A PyTorch tensor's work runs on PyTorch's current stream (its allocator reuses freed
memory in that stream's order). Arrays of any other library than CuPy (JAX's, or any
DLPack array) are kept until the work that reads them is done, and no longer: their
library may reuse their memory at once on its own stream, unordered with ours.

The rule (``keep_until_done``):

* after a call's work is queued, an event is recorded on the call's stream, and the
  call's arrays go with it to the background thread of ``cuda.waiter``, which waits
  for the event (a blocking sync of a blocking-sync event: no spinning) and then lets
  go of them. So they are released once the GPU is past the work that reads them,
  whether or not another call follows: a process that makes one call and then waits
  holds nothing. Calls are released in the order they were made (a call whose work
  ends early on one stream waits for an earlier call's on another);
* its syncs are legal while another thread captures a graph, in any mode (see
  there). No event of ours is ever queried, on any thread;
* under a capture (``pycudnnrnn.graphs.capture``, or a stream capturing for anyone
  else) nothing is recorded or kept: an event recorded in a capture cannot be waited
  on outside it, and every replay reads the arrays again, long after: whoever keeps
  the graph keeps the arrays it reads (``docs/gpu.md``);
* the arrays are released on the waiter, never in a CUDA host callback (which may call
  no CUDA function: their library's free may; and a Python callback would hold the
  stream until it got the GIL).
"""

from __future__ import annotations

from ..core import gpu
from . import graphs, waiter


def caller_stream(cupy, array, device: int):
    """CuPy's view of the stream `array`'s library works on, to run the call there: a
    PyTorch CUDA tensor's current stream; None for other arrays (CuPy's current stream
    then, and ``keep_until_done`` for those from another library), and inside
    ``pycudnnrnn.graphs.capture``, whose stream is the one to capture on."""
    if type(array).__module__.split(".")[0] != "torch" or graphs.holding() is not None:
        return None
    import torch
    return gpu.external_stream(cupy, torch.cuda.current_stream(device).cuda_stream, device)


def keep_until_done(cupy, arrays) -> None:
    """Keep another library's `arrays` alive until the work just queued on CuPy's
    current stream (which reads them) is done, then release them (see the module's
    rule). Not while that stream captures a graph: the caller keeps what a graph reads.
    """
    stream = cupy.cuda.get_current_stream()
    if graphs.holding() is not None or stream.is_capturing():
        return
    event = cupy.cuda.Event(block=True, disable_timing=True)  # its sync sleeps, not spins
    event.record(stream)
    waiter.release_after(cupy, (event,), tuple(arrays))
