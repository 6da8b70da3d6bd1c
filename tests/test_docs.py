"""The documentation builds in strict mode, and the notebook runs top to bottom."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_docs_build_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api_page = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "params_to_canonical" in api_page and "CudnnNotSupportedError" in api_page
    assert (tmp_path / "site" / "examples" / "quickstart.ipynb").exists()


def test_quickstart_notebook_runs():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    path = os.path.join(ROOT, "docs", "examples", "quickstart.ipynb")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": ROOT}})
    client.execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "finite difference" in text
    assert any("image/png" in o.get("data", {}) for o in outputs), "the gradient plot"


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_quick_start_code_runs(page):
    """The Python example on the page runs as shown."""
    import re
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, f"no python example in {page}"
    namespace = {}
    exec(compile(blocks[0], page, "exec"), namespace)
    assert namespace["dparams"].shape == namespace["params"].shape
