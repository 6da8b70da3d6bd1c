"""The documentation builds in strict mode, running the notebooks it shows with their
outputs; the notebooks are stored run, so GitHub shows those outputs too."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT_PATH = pathlib.Path(ROOT)


def test_docs_build_strict(tmp_path):
    """Strict build; the notebooks are run by it and shown with their outputs."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    api_page = (site / "api" / "index.html").read_text()
    assert "params_to_canonical" in api_page and "CudnnNotSupportedError" in api_page
    notebook = (site / "examples" / "quickstart" / "index.html").read_text()
    # Outputs only a run can make (the build runs the notebook again): the printed
    # gradient check and the plot.
    assert re.search(r"backprop -?\d+\.\d{10}, finite difference -?\d+\.\d{10}", notebook)
    assert "data:image/png;base64," in notebook, "the gradient plot"
    assert 'href="examples/quickstart/"' in (site / "index.html").read_text()
    # The Flax and Keras notebook: trained, its curves compared and plotted, kept unrun.
    trained = (site / "examples" / "flax_keras" / "index.html").read_text()
    rounding = r"(\d\.\de-0[5-9]|0\.0e\+00)"      # float32 rounding, grown over 60 steps
    assert re.search(r"one bias trained +largest distance from Flax.s curve: " + rounding,
                     trained), "ours, with Flax's one bias, on Flax's curve"
    assert re.search(r"largest distance between the curves: " + rounding, trained), "Keras's"
    assert trained.count("data:image/png;base64,") >= 2, "the two loss plots"
    for page in ("flax", "keras"):
        assert 'href="../examples/flax_keras/"' in (site / page / "index.html").read_text()
    assert not list(ROOT_PATH.glob(".cache/mkdocs-jupyter/*")), "the build wrote a cache"
    # The nav keeps its own title (the notebook's heading replaced it: "Quick start" then
    # "pycudnnrnn quick start"); the page offers the notebook for download; long code and
    # output lines scroll instead of being clipped or wrapped mid-number.
    nav = re.findall(r'class="md-ellipsis">\s*([^<]+?)\s*<', (site / "index.html").read_text())
    assert "Quick-start notebook" in nav and "pycudnnrnn quick start" not in nav, nav
    assert re.search(r'href="[^"]*quickstart\.ipynb"[^>]*download', notebook)
    assert (site / "examples" / "quickstart" / "quickstart.ipynb").exists()
    css = (site / "stylesheets" / "extra.css").read_text()
    assert "white-space: pre" in css and "stylesheets/extra.css" in notebook


def test_pages_say_the_layout_was_checked_on_a_gpu():
    """The H200 run (cuDNN 9.19.0, 20 of 20 layouts) is recorded, and no page still calls
    the projection and skip_input placements unverified."""
    from pycudnnrnn.core import layout
    read = lambda page: (ROOT_PATH / "docs" / page).read_text(encoding="utf-8")
    record = read("gpu-validation.md")
    assert "| 2026-11-30 16:23 UTC | 1 × NVIDIA H200 | 9.19.0 |" in record
    assert "275 passed, 0 failed" in record and "20 of 20" in record
    for name, text in (("params-layout.md", read("params-layout.md")),
                       ("layout.py", " ".join(layout.__doc__.split()))):
        assert "cuDNN 9.19" in text, name
        assert "to be checked" not in text and "this project's choice" not in text, name


NOTEBOOKS = sorted((ROOT_PATH / "docs" / "examples").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_notebook_is_stored_run_once_in_order_with_small_clean_outputs(path):
    """The README links to the notebooks "shown with their outputs": on GitHub that is what
    is stored. One run, top to bottom (`make notebooks`): counts 1, 2, 3...; no error, no
    stderr (a warning of the machine that ran it), no timings; a few hundred kB at most."""
    cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
             if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in cells] == list(range(1, len(cells) + 1)), \
        f"{path.name}: store it run once, in order: make notebooks"
    outputs = [o for c in cells for o in c["outputs"]]
    assert outputs, f"{path.name}: stored without its outputs"
    assert not [o for o in outputs if o["output_type"] == "error"], path.name
    assert not [o for o in outputs if o.get("name") == "stderr"], f"{path.name}: stderr kept"
    assert not [c for c in cells if "execution" in c["metadata"]], f"{path.name}: timings kept"
    assert len(json.dumps(outputs)) < 300_000, f"{path.name}: outputs too large to store"
