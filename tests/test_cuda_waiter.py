"""``pycudnnrnn.cuda.waiter``: the background thread that lets go of device memory once
the GPU is past its work. Its events here are host stand-ins: a gate the test opens."""

import os
import subprocess
import sys
import textwrap
import threading
import types
import weakref

from pycudnnrnn.cuda import waiter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: A CuPy whose runtime can relax the waiter's capture mode (the waiter asks it).
_CUPY = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
    threadExchangeStreamCaptureMode=lambda mode: 0)))


class _Gate:
    """An event whose work is done when the test opens the gate."""

    def __init__(self):
        self.open = threading.Event()

    def synchronize(self):
        self.open.wait()


class _Owner:
    pass


def test_wait_released_waits_for_what_a_release_hands_on():
    """Letting go of an owner may hand the waiter more: a plan's dropout states, whose own
    blocks wait for a forward on another stream. ``wait_released`` waits for those too
    (it returned once the waiter had passed what was queued when it was called)."""
    busy, later = _Gate(), _Gate()
    inner = _Owner()
    weakref.finalize(inner, waiter.release_after, _CUPY, (later,), ("inner's blocks",))
    waiter.release_after(_CUPY, (busy,), ())  # the waiter waits here meanwhile
    waiter.release_after(_CUPY, (), (inner,))  # its release drops `inner`, which hands on
    del inner
    done = threading.Event()
    thread = threading.Thread(target=lambda: (waiter.wait_released(), done.set()))
    thread.start()
    try:
        assert not done.wait(0.3)  # the wait has begun, behind both releases
        busy.open.set()
        assert not done.wait(0.3), "wait_released returned before the handed-on release"
    finally:
        busy.open.set()
        later.open.set()
    assert done.wait(30)
    thread.join()


def test_a_release_from_a_collection_while_the_waiter_starts_does_not_deadlock():
    """The first release of a process starts the waiter under a lock. A garbage collection
    inside that start (making a thread allocates) may run a finaliser that releases too,
    on the same thread: it must not wait for the lock its own thread holds."""
    script = textwrap.dedent("""
        import faulthandler, gc, threading, weakref
        from pycudnnrnn.cuda import waiter
        faulthandler.dump_traceback_later(30, exit=True)

        class Owner:
            pass

        owner = Owner()
        owner.me = owner  # a cycle: only a collection frees it
        weakref.finalize(owner, waiter.release_after, None, (), ("kept",)).atexit = False
        del owner
        init = threading.Thread.__init__

        def collecting_init(self, *args, **kwargs):
            gc.collect()  # what a collection started by the thread's allocations does
            init(self, *args, **kwargs)

        threading.Thread.__init__ = collecting_init
        waiter.release_after(None, (), ())
        threading.Thread.__init__ = init
        waiter.wait_released()
        print("released")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "released" in done.stdout, done.stderr[-2000:]
