"""Installing the checkout is quiet: `make demo` opens with our output, not a warning box."""

import shutil
import subprocess
import sys

import pytest

from test_docs_blocks import ROOT


def test_an_editable_install_prints_no_warning_box(tmp_path):
    """setuptools' "!!" box ("Editable installation ... folders in your working directory
    with the same name as your package") came with every `pip install -e .`: a flat layout
    that pyproject.toml did not name made setuptools install an import hook."""
    pytest.importorskip("setuptools")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "pycudnnrnn", tmp_path / "pycudnnrnn",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "wheel").mkdir()
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from setuptools import build_meta\n"
            "print(build_meta.build_editable('wheel'))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1].endswith(".whl"), proc.stdout[-2000:]
    assert "!!" not in proc.stderr and "Editable installation" not in proc.stderr, \
        proc.stderr[-4000:]
