"""Importing an adapter imports its framework and this package, nothing more; what
compiling, exporting and the ops' first call need is imported when they are first used.

Each check runs in a fresh process (what a process has imported is the point). Nothing
here is timed: ``benchmarks/import_cost.py`` measures the cost these imports would add.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: adapter: (the framework's modules, environment, what it must not import: the heavy
#: modules compiling or exporting needs, and the adapters Keras calls into at a call)
ADAPTERS = {
    "torch": (("torch",), {}, ("torch._dynamo", "torch._inductor", "torch.onnx", "sympy")),
    "jax": (("jax",), {}, ("jax.experimental.jax2tf", "orbax", "tensorflow")),
    "flax": (("jax", "flax.nnx"), {}, ("orbax", "tensorflow")),
    "keras-jax": (("keras",), {"KERAS_BACKEND": "jax"}, ("pycudnnrnn.torch",)),
    "keras-torch": (("keras",), {"KERAS_BACKEND": "torch"}, ("pycudnnrnn.torch",)),
}
_NEEDS = {"keras-jax": ("keras", "jax"), "keras-torch": ("keras", "torch"),
          "flax": ("jax", "flax")}


def _run(script, env=None, timeout=600):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return proc.stdout


def _skip_without(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_an_adapter_imports_nothing_its_framework_did_not_but_this_package(adapter):
    framework, env, absent = ADAPTERS[adapter]
    _skip_without(*_NEEDS.get(adapter, (adapter,)))
    module = "pycudnnrnn." + adapter.split("-")[0]
    out = _run(f"""
        import importlib, sys
        for m in {framework!r}:
            importlib.import_module(m)
        before = set(sys.modules)
        importlib.import_module({module!r})
        new = set(sys.modules) - before
        # this package's modules, and the standard library's (cheap), may come
        extra = sorted(m for m in new if m.split(".")[0] != "pycudnnrnn"
                       and m.split(".")[0] not in sys.stdlib_module_names)
        assert not extra, f"{module} imported what {framework} had not: {{extra[:20]}}"
        there = [m for m in {absent!r} if m in new]
        assert not there, f"{module} imported {{there}}"
        print("ok")
    """, env)
    assert out.strip() == "ok"


def test_the_first_op_call_imports_dynamo_and_the_callers_module_is_still_freed():
    # PyTorch imports torch._dynamo on a custom op's first call; that import leaves its
    # callers' frames (the module among them) in a reference cycle: under DDP that kept
    # the process group alive into interpreter exit, where gloo aborted. The ops import
    # it first on a thread of their own. Both doors: a module, and a direct op call.
    _skip_without("torch")
    for door in ("module", "op"):
        out = _run(f"""
            import gc, sys, weakref
            import torch, pycudnnrnn, pycudnnrnn.torch as prt
            assert "torch._dynamo" not in sys.modules
            gc.disable()
            prt.set_cpu_kernels("numpy")  # the op's kernels: the op runs eagerly on the CPU
            x = torch.randn(5, 2, 3, dtype=torch.float64)

            class Holder:
                pass

            def run(holder):
                if {door!r} == "module":
                    holder.m = m = prt.LSTM(3, 4, dtype=torch.float64)
                    m(x)[0].sum().backward()
                else:
                    n = pycudnnrnn.params_size(
                        rnn_mode="lstm", num_layers=1, num_units=4, input_size=3,
                        input_mode="linear_input", direction="unidirectional", num_proj=0)
                    holder.p = p = torch.randn(n, dtype=torch.float64)
                    h = torch.zeros(1, 2, 4, dtype=torch.float64)
                    torch.ops.pycudnnrnn.forward(x, h, h, p, None, None, "lstm",
                                                 "linear_input", "unidirectional", 0.0, 0,
                                                 True, True)

            holder = Holder()
            run(holder)
            assert "torch._dynamo" in sys.modules  # the op's first call imported it
            ref = weakref.ref(holder)
            del holder
            assert ref() is None, "what the caller held outlived its last reference"
            print("ok")
        """)
        assert out.strip() == "ok", door


def test_a_first_op_call_while_a_module_is_imported_does_not_wait_on_itself(tmp_path):
    # Inside an import the ops import torch._dynamo on the calling thread: a thread of
    # their own could wait on an import lock this one holds.
    _skip_without("torch")
    (tmp_path / "runs_at_import.py").write_text(textwrap.dedent("""
        import torch, pycudnnrnn.torch as prt
        prt.set_cpu_kernels("numpy")
        output = prt.GRU(3, 4, dtype=torch.float64)(torch.randn(5, 2, 3, dtype=torch.float64))[0]
    """))
    out = _run(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import runs_at_import
        assert "torch._dynamo" in sys.modules
        print(tuple(runs_at_import.output.shape))
    """, timeout=300)
    assert out.strip() == "(5, 2, 4)"


def test_a_first_op_call_while_the_interpreter_finalizes_starts_no_thread():
    # Python 3.11 never starts a thread then: the caller would wait for it forever (a
    # __del__ of a cycle's object, run by the last collection at exit, calls the op).
    _skip_without("torch")
    out = _run("""
        import sys, threading
        import torch, pycudnnrnn.torch as prt
        assert "torch._dynamo" not in sys.modules
        def refuse(self):
            raise AssertionError("a thread started while the interpreter finalizes")
        threading.Thread.start = refuse
        sys.is_finalizing = lambda: True
        prt.set_cpu_kernels("numpy")
        output = prt.GRU(3, 4, dtype=torch.float64)(torch.randn(5, 2, 3, dtype=torch.float64))[0]
        assert "torch._dynamo" in sys.modules
        print(tuple(output.shape))
    """, timeout=300)
    assert out.strip() == "(5, 2, 4)"


def test_compile_export_and_onnx_work_when_they_import_what_they_need_first():
    _skip_without("torch")
    onnx = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))
    out = _run(f"""
        import sys, io
        import torch, pycudnnrnn.torch as prt
        assert "torch._dynamo" not in sys.modules and "torch.onnx" not in sys.modules
        torch.manual_seed(0)
        m = prt.LSTM(3, 4, batch_first=True)
        x = torch.randn(2, 5, 3)
        eager = m(x)[0]

        compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
        y = compiled(x)[0]
        y.sum().backward()
        torch.testing.assert_close(y, eager)

        exported = torch.export.export(m, (x,))
        torch.testing.assert_close(exported.module()(x)[0], eager)

        m.eval()
        for dynamo in (False, True) if {onnx} else ():  # both exporters, if installed
            buffer = io.BytesIO()
            program = torch.onnx.export(m, (x,), None if dynamo else buffer, dynamo=dynamo)
            model = program.model_proto.SerializeToString() if dynamo else buffer.getvalue()
            import onnxruntime
            session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
            (name,) = [i.name for i in session.get_inputs()]
            got = torch.from_numpy(session.run(None, {{name: x.numpy()}})[0])
            torch.testing.assert_close(got, eager.detach(), rtol=1e-4, atol=1e-5)
        print("ok")
    """)
    assert out.strip().splitlines()[-1] == "ok"


#: What ``import pycudnnrnn`` must leave out: the frameworks, CuPy, and the submodules read
#: lazily as attributes.
_NOT_ON_IMPORT = ("torch", "jax", "keras", "tensorflow", "flax", "cupy", "pycudnnrnn.convert",
                  "pycudnnrnn.graphs")


@pytest.mark.parametrize("spelling", ["pycudnnrnn.convert.from_torch",
                                      "pycudnnrnn.convert.to_keras",
                                      "pycudnnrnn.graphs.capture"])
def test_a_submodule_reads_as_an_attribute_after_import_pycudnnrnn(spelling):
    # The docs write pycudnnrnn.convert.from_keras after `import pycudnnrnn`: it must not
    # raise AttributeError, and the import alone must stay as light as before.
    out = _run(f"""
        import sys
        import pycudnnrnn
        there = [m for m in {_NOT_ON_IMPORT!r} if m in sys.modules]
        assert not there, f"import pycudnnrnn imported {{there}}"
        assert callable({spelling}), {spelling!r}
        print("ok")
    """)
    assert out.strip() == "ok"


def test_an_unknown_attribute_still_raises_attribute_error_naming_it():
    import pycudnnrnn
    with pytest.raises(AttributeError, match="'pycudnnrnn' has no attribute 'nonesuch'"):
        pycudnnrnn.nonesuch  # noqa: B018
    assert "convert" in dir(pycudnnrnn)
