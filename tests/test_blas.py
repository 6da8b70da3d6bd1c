"""pycudnnrnn.core.blas: one BLAS thread where the NumPy backend runs inside XLA's thread pool."""

import threading

import numpy as np
import pytest

from pycudnnrnn.core import blas

process_wide = [c for c in blas._controls() if isinstance(c, blas._ProcessWide)]
needs_openblas = pytest.mark.skipif(not process_wide, reason="NumPy's BLAS is not OpenBLAS")


class _Every:
    """Every process-wide OpenBLAS that blas controls, as one: NumPy's, and SciPy's too
    where something imported scipy.linalg first (torch.testing._internal does, so
    tests/test_torch_module_db.py collected before this file loads a second OpenBLAS)."""

    def __init__(self, controls):
        self.controls = controls

    def get(self):
        """The libraries' thread count where they agree, else each one's."""
        counts = [c.get() for c in self.controls]
        return counts[0] if len(set(counts)) == 1 else tuple(counts)

    def set(self, n):
        for c in self.controls:
            c.set(n)


@pytest.fixture
def two_threads():
    """OpenBLAS at two threads (whatever the machine's core count), restored after."""
    before = [c.get() for c in process_wide]
    every = _Every(process_wide)
    every.set(2)
    yield every
    for c, n in zip(process_wide, before):
        c.set(n)


@needs_openblas
def test_single_threaded_lowers_and_restores(two_threads):
    with blas.single_threaded():
        assert two_threads.get() == 1
        with blas.single_threaded():  # reentrant
            assert two_threads.get() == 1
        assert two_threads.get() == 1
    assert two_threads.get() == 2


@needs_openblas
def test_overlapping_calls_from_threads_leave_the_count_as_found(two_threads):
    """The count is process-wide: the last caller out restores it, whatever the order."""
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def first():
        with blas.single_threaded():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with blas.single_threaded():
            second_in.set()
            first_out.wait(5)
            seen.append(two_threads.get())  # the first caller has left: still one thread

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [1] and two_threads.get() == 2


@needs_openblas
def test_the_xla_cpu_handler_runs_on_one_blas_thread(two_threads, monkeypatch):
    """Inside jax.jit, on XLA's own threads (which threadpoolctl's setter ignores), forward
    and backprop run with one BLAS thread; the count is back to two after. (Dropout
    between layers: the CPU route that runs the NumPy backend's custom calls.)"""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import pycudnnrnn
    from pycudnnrnn.cpu import rnn as cpu_rnn
    from pycudnnrnn import jax as rnn_jax
    seen = {}
    for name in ("forward", "backprop"):
        def record(*args, _name=name, _f=getattr(cpu_rnn, name), **kwargs):
            seen[_name] = two_threads.get()
            return _f(*args, **kwargs)
        monkeypatch.setattr(cpu_rnn, name, record)
    n = pycudnnrnn.params_size(num_layers=2, num_units=4, input_size=3)
    params = jnp.asarray(np.linspace(-0.5, 0.5, n, dtype=np.float32))
    x, h = jnp.ones((5, 2, 3)), jnp.zeros((2, 2, 4))
    loss = jax.jit(jax.grad(lambda p: jnp.sum(rnn_jax.rnn(x, h, h, p, None,
                                                          dropout=0.5)[0] ** 2)))
    jax.block_until_ready(loss(params))
    assert seen == {"forward": 1, "backprop": 1}
    assert two_threads.get() == 2


def test_thread_counts_name_numpys_blas():
    counts = blas.thread_counts()
    assert counts and all(c["threads"] >= 1 and c["library"] for c in counts)


def test_these_tests_pass_where_a_second_openblas_was_loaded_first(tmp_path):
    """SciPy's OpenBLAS loaded before this file is collected (as tests/test_torch_module_db.py
    does, through torch.testing) makes two process-wide libraries; the tests above hold both."""
    pytest.importorskip("scipy")
    import subprocess
    import sys
    script = ("import sys, pytest, scipy.linalg\n"
              "from pycudnnrnn.core import blas\n"
              "print('process-wide OpenBLAS:', sum(isinstance(c, blas._ProcessWide) "
              "for c in blas._controls()))\n"
              f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {__file__!r}, "
              "'-k', 'not second_openblas']))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "process-wide OpenBLAS: 2" in proc.stdout, proc.stdout[-4000:]
