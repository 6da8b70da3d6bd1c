"""conftest's guard, ``process_state_unchanged``: a test that leaves a process-wide setting
changed fails, by name, with the setting named; the tests after it find it as it was."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import process_state, state_changes

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_test_that_leaves_a_setting_changed_fails_by_name_and_the_next_finds_it_undone(
        tmp_path):
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent("""
        import os
        import numpy as np

        def test_leaks():
            os.environ["PYCUDNNRNN_LEAKED"] = "1"
            np.seterr(over="raise")
            os.chdir(os.path.dirname(os.path.dirname(__file__)))

        def test_tidy(monkeypatch):
            monkeypatch.setenv("PYCUDNNRNN_TIDY", "1")
            with np.errstate(over="raise"):
                pass

        def test_after():
            assert "PYCUDNNRNN_LEAKED" not in os.environ
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
         str(tmp_path / "test_leaky.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert "3 passed, 1 error" in out, out[-4000:]  # test_leaks passes, then errs at teardown
    line = next(line for line in out.splitlines() if "left process-wide state changed" in line)
    assert line.startswith("test_leaky.py::test_leaks "), line
    assert "os.environ['PYCUDNNRNN_LEAKED']: '<unset>' -> '1'" in line, line
    assert "numpy.geterr()" in line and "os.getcwd()" in line, line
    assert "ERROR at teardown of test_leaks" in out and "test_tidy" not in out, out[-4000:]


def _changes(change, undo):
    before = process_state()
    change()
    try:
        return state_changes(before, process_state())
    finally:
        undo()


def test_numpy_and_environment_changes_are_named():
    old = np.geterr()
    assert _changes(lambda: np.seterr(divide="raise"), lambda: np.seterr(**old)) == [
        f"numpy.geterr(): {old!r} -> {dict(old, divide='raise')!r}"]
    assert _changes(lambda: os.environ.__setitem__("PYCUDNNRNN_LEAKED", "--x"),
                    lambda: os.environ.pop("PYCUDNNRNN_LEAKED")) == \
        ["os.environ['PYCUDNNRNN_LEAKED']: '<unset>' -> '--x'"]


def test_what_a_first_import_sets_is_not_a_change():
    before = process_state()
    after = dict(before)
    after[("os.environ", "TF2_BEHAVIOR")] = "1"           # set by import tensorflow
    after["jax.config.jax_enable_x64"] = True              # jax was not imported before
    before.pop(("os.environ", "TF2_BEHAVIOR"), None)
    before.pop("jax.config.jax_enable_x64", None)
    assert state_changes(before, after) == []
    after[("os.environ", "KERAS_BACKEND")] = "torch"
    assert state_changes(before, after) == [
        "os.environ['KERAS_BACKEND']: '<unset>' -> 'torch'"]


def _framework(name):
    module = sys.modules.get(name)
    if module is None:  # importing it here would be a process-wide change of its own
        pytest.skip(f"{name} is not imported in this process")
    return module


def test_torch_settings_are_read():
    torch = _framework("torch")
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    assert _changes(lambda: torch.set_num_threads(threads + 1),
                    lambda: torch.set_num_threads(threads)) == \
        [f"torch.get_num_threads(): {threads} -> {threads + 1}"]
    assert _changes(lambda: torch.set_default_dtype(torch.float64),
                    lambda: torch.set_default_dtype(dtype)) == \
        [f"torch.get_default_dtype(): {dtype} -> torch.float64"]


def test_jax_settings_are_read():
    jax = _framework("jax")
    was = jax.config.jax_enable_x64
    assert _changes(lambda: jax.config.update("jax_enable_x64", not was),
                    lambda: jax.config.update("jax_enable_x64", was)) == \
        [f"jax.config.jax_enable_x64: {was} -> {not was}"]


def test_tensorflow_settings_are_read():
    tf = _framework("tensorflow")
    was = tf.config.functions_run_eagerly()
    assert _changes(lambda: tf.config.run_functions_eagerly(not was),
                    lambda: tf.config.run_functions_eagerly(was)) == \
        [f"tf.config.functions_run_eagerly(): {was} -> {not was}"]


def test_keras_settings_are_read():
    keras = _framework("keras")
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy().name
    assert _changes(lambda: keras.config.set_floatx("float16"),
                    lambda: keras.config.set_floatx(floatx)) == \
        [f"keras.config.floatx(): {floatx!r} -> 'float16'"]
    assert _changes(lambda: keras.config.set_dtype_policy("mixed_float16"),
                    lambda: keras.config.set_dtype_policy(policy)) == \
        [f"keras.config.dtype_policy(): {policy!r} -> 'mixed_float16'"]


def test_pycudnnrnns_own_settings_are_read():
    import pycudnnrnn
    from pycudnnrnn.core import gpu
    assert _changes(lambda: pycudnnrnn.set_allow_tf32(True),
                    lambda: pycudnnrnn.set_allow_tf32(False)) == \
        ["pycudnnrnn.core.gpu.get_allow_tf32(): False -> True"]
    assert not gpu.get_allow_tf32()
    if "torch" in sys.modules:
        import pycudnnrnn.torch as prt
        assert _changes(lambda: prt.set_cpu_kernels("numpy"),
                        lambda: prt.set_cpu_kernels("torch")) == \
            ["pycudnnrnn.torch: CPU kernels: 'torch' -> 'numpy'"]
