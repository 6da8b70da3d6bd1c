"""How many threads NumPy's BLAS may use while the NumPy backend runs inside another
library's thread pool.

Inside ``jax.jit`` the CPU handler runs on a thread of XLA's own pool, whose other threads
spin while they wait for work. A multithreaded BLAS splits each product over threads of
its own and waits for the slowest; with XLA's spinning threads on the same cores, one of
them has lost its core at every product. Measured on a 2-core machine: a jitted training
step 12-19 times slower than with one BLAS thread, with a spread of 10x between runs.
XLA's own ops run on its pool alone, and so does the handler: ``single_threaded``.

threadpoolctl finds the BLAS libraries loaded; their counts are set through their own C
API. OpenBLAS (NumPy's and SciPy's wheels) has one process-wide count: it is lowered when
the first caller enters and restored when the last one leaves, so calls from several
threads at once leave it as they found it, unless another count was set meanwhile, which
is kept. Being process-wide, the count also holds for the caller's other threads while a
handler runs (JAX dispatches asynchronously: NumPy work on the main thread during a
jitted step runs on one BLAS thread). (threadpoolctl's own setter is not used: it
lets only one Python thread change OpenBLAS's count and silently ignores the others,
XLA's threads among them.) MKL's count is per thread (``MKL_Set_Num_Threads_Local``).
Other libraries (BLIS, an OpenMP build of OpenBLAS, Accelerate) are left as they are.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading

_lock = threading.Lock()
_depth = 0
_restore: list = []


class _ProcessWide:
    """A library with one thread count for the process (OpenBLAS on pthreads)."""

    def __init__(self, get, set_):
        self.get, self.set = get, set_


class _PerThread:
    """A library whose setter changes the calling thread's count and returns the old one."""

    def __init__(self, set_local):
        self.set_local = set_local


def _control(lib):
    """How to set one library's thread count, or None to leave it alone."""
    try:
        dll = ctypes.CDLL(lib.filepath)
    except OSError:  # moved or unloadable since threadpoolctl saw it: leave it alone
        return None
    if lib.internal_api == "openblas" and lib.threading_layer == "pthreads":
        for prefix in ("", "scipy_"):  # SciPy's and NumPy's wheels rename their symbols
            for suffix in ("", "64_", "_64"):
                get = getattr(dll, f"{prefix}openblas_get_num_threads{suffix}", None)
                set_ = getattr(dll, f"{prefix}openblas_set_num_threads{suffix}", None)
                if get and set_:
                    get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
                    return _ProcessWide(get, set_)
    if lib.internal_api == "mkl":
        set_local = getattr(dll, "MKL_Set_Num_Threads_Local", None)
        if set_local:
            set_local.restype, set_local.argtypes = ctypes.c_int, [ctypes.c_int]
            return _PerThread(set_local)
    return None


@functools.lru_cache(maxsize=None)
def libraries() -> tuple:
    """threadpoolctl's records of the BLAS libraries loaded in this process (NumPy's
    among them: it is imported before the scan)."""
    import numpy  # noqa: F401  (its BLAS must be loaded before the scan)
    from threadpoolctl import ThreadpoolController
    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


@functools.lru_cache(maxsize=None)
def _controls() -> tuple:
    return tuple(c for c in map(_control, libraries()) if c is not None)


@contextlib.contextmanager
def single_threaded():
    """Run the enclosed BLAS calls on one thread (reentrant, and safe across threads)."""
    global _depth, _restore
    controls = _controls()
    local = [(c, c.set_local(1)) for c in controls if isinstance(c, _PerThread)]
    with _lock:
        if _depth == 0:
            _restore = [(c, n) for c in controls
                        if isinstance(c, _ProcessWide) and (n := c.get()) != 1]
            for c, _ in _restore:
                c.set(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for c, n in _restore:
                    if c.get() == 1:  # unless somebody set another count meanwhile
                        c.set(n)
                _restore = []
        for c, n in local:
            c.set_local(n)


def thread_counts() -> list[dict]:
    """``[{"library", "version", "threading", "threads", "path"}]`` for each BLAS library
    loaded: what ``pycudnnrnn info`` reports."""
    return [{"library": lib.internal_api, "version": lib.version,
             "threading": lib.threading_layer, "threads": lib.get_num_threads(),
             "path": lib.filepath} for lib in libraries()]
