"""A framework that is missing: importing its adapter raises an ImportError naming the
extra to install (and, for Keras without a usable backend, saying to set KERAS_BACKEND).

Each case runs in a fresh process whose import system refuses the frameworks named, as
if they were not installed.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = """
import importlib, sys

class Refuse:
    '''Refuses {refused!r} as a missing module, or as a broken one ({broken}).'''
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {refused!r}:
            if {broken}:
                raise ImportError(f"{{name}}: libfake.so: cannot open shared object file")
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Refuse())
try:
    importlib.import_module({adapter!r})
except ImportError as exc:
    print(type(exc).__name__ + ": " + str(exc))
else:
    print("imported")
"""


def _import_without(adapter, refused, env=None, broken=False, tmp_path=None):
    """The last line of importing `adapter` while `refused` modules are missing."""
    environ = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    if tmp_path is not None:
        environ["KERAS_HOME"] = str(tmp_path)  # no keras.json that names a backend
    environ.update(env or {})
    script = _SCRIPT.format(refused=tuple(refused), adapter=adapter, broken=broken)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=300, env=environ)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1]


def _needs(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


@pytest.mark.parametrize("adapter, refused, extra, named", [
    ("pycudnnrnn.torch", ["torch"], "torch", "PyTorch is not installed"),
    ("pycudnnrnn.jax", ["jax"], "jax", "JAX is not installed"),
    ("pycudnnrnn.jax", ["jax", "jaxlib"], "jax", "JAX is not installed"),
    ("pycudnnrnn.flax", ["jax"], "flax", "JAX is not installed"),
    ("pycudnnrnn.flax", ["flax"], "flax", "Flax is not installed"),
    ("pycudnnrnn.tensorflow", ["tensorflow"], "tensorflow", "TensorFlow is not installed"),
])
def test_a_missing_framework_names_its_extra(adapter, refused, extra, named):
    if refused == ["flax"]:
        _needs("jax")
    line = _import_without(adapter, refused)
    assert line.startswith("ModuleNotFoundError: " + adapter + " needs"), line
    assert named in line and f"pip install '.[{extra}]'" in line, line


def test_a_framework_that_fails_to_import_names_its_extra_too():
    line = _import_without("pycudnnrnn.torch", ["torch"], broken=True)
    assert line.startswith("ImportError: pycudnnrnn.torch needs PyTorch, but importing "
                           "PyTorch failed"), line
    assert "pip install '.[torch]'" in line and "libfake.so" in line, line


def test_keras_missing_names_the_keras_extra():
    line = _import_without("pycudnnrnn.keras", ["keras"])
    assert "Keras is not installed" in line and "pip install '.[keras,jax]'" in line
    assert "KERAS_BACKEND=jax or torch" in line, line


@pytest.mark.parametrize("env, refused", [
    ({}, ["tensorflow"]),                                   # jax installed, no KERAS_BACKEND
    ({}, ["tensorflow", "jax", "torch"]),                   # the [keras] extra alone
    ({"KERAS_BACKEND": "tensorflow"}, ["tensorflow"]),
    ({"KERAS_BACKEND": "jax"}, ["jax"]),
    ({"KERAS_BACKEND": "torch"}, ["torch"]),
])
def test_keras_without_a_usable_backend_says_to_set_keras_backend(env, refused, tmp_path):
    _needs("keras")
    line = _import_without("pycudnnrnn.keras", refused, env, tmp_path=tmp_path)
    assert "set KERAS_BACKEND=jax or torch and install that extra" in line, line
    assert "pip install '.[keras,jax]'" in line, line
    backend = env.get("KERAS_BACKEND", "tensorflow")
    name = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}[backend]
    assert f"Keras's backend is {name}" in line and f"{name} is not installed" in line, line
    assert (f"KERAS_BACKEND={backend}" in line) == ("KERAS_BACKEND" in env), line
