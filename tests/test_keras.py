"""pycudnnrnn.keras on Keras's JAX, PyTorch and TensorFlow backends: tests/keras_cases.py,
once each.

Keras picks its backend at import, once per process, so each backend's run is a
subprocess (``KERAS_BACKEND=jax`` / ``torch`` / ``tensorflow``) running ``keras_cases.py``
under pytest. All start together (they are independent) and each test waits for its own.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

if importlib.util.find_spec("keras") is None:  # not imported here: that would fix its backend
    pytest.skip("keras is not installed", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BACKENDS = [b for b in ("jax", "torch", "tensorflow") if importlib.util.find_spec(b) is not None]
#: What each backend's run may skip: the other backends' own tests.
OTHERS = {"jax": ("docs page", "TensorFlow only"),
          "torch": ("lowered program", "TensorFlow only"),
          "tensorflow": ("docs page", "lowered program", "one route on TensorFlow")}


@pytest.fixture(scope="module")
def runs():
    """One pytest process per backend, started at once."""
    procs = {}
    for backend in BACKENDS:
        env = {**os.environ, "KERAS_BACKEND": backend,
               "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
        procs[backend] = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             os.path.join(HERE, "keras_cases.py")],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("backend", ["jax", "torch", "tensorflow"])
def test_keras_backend(backend, runs):
    if backend not in runs:
        pytest.skip(f"{backend} is not installed")
    proc = runs[backend]
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"KERAS_BACKEND={backend}:\n{output[-12000:]}"
    # nothing skipped but the other backends' own tests: the docs page (on PyTorch only),
    # the lowered programs (on JAX only), Keras's weights fed as they are (on TensorFlow
    # only), the op's second route (not on TensorFlow)
    skipped = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    assert " passed" in output and skipped, output[-2000:]
    assert all(any(o in line for o in OTHERS[backend]) for line in skipped), skipped
