"""Every ```python block of README.md and docs/*.md runs as a reader pastes it.

One test per page (its id is the file name: ``-k pytorch`` runs docs/pytorch.md). The page's
python blocks are joined in order into one script, which runs in a fresh empty folder in one
``python`` process, with the package imported as installed. So a later block may use what an
earlier block on the same page defined, and each page defines what it uses. A page with no
python block is not a test. A block fails the page: the message names the page, the block's
line and first lines, and gives the traceback.

Writing code blocks:

- ```python (or ```py) runs. What is not meant to run (signatures, program output, shell
  commands, fragments) takes another tag: ```text, ```console, ```bash.
- The line ``<!-- gpu-only -->`` just before a fence marks a block that needs an NVIDIA GPU
  with cuDNN. Such blocks run only where the ``gpu`` tests run (conftest's check); without a
  GPU they are left out of the script, so no later block may need their names.
- ``KERAS_BACKEND`` is removed from the environment: a page that needs it sets it, as a
  fresh reader must.

The notebooks (docs/examples/*.ipynb) are not run here: tests/test_docs.py's strict mkdocs
build runs them. mkdocs.yml runs them through mkdocs-jupyter with ``execute: true``,
``allow_errors: false``, no ``execute_ignore`` and no cache. That is nbconvert's
ExecutePreprocessor, which runs every code cell in order; the notebooks tag no cell to skip
or to allow errors. The first error raises CellExecutionError, which mkdocs re-raises, so
the build and its test fail. They run in docs/examples/ rather than a fresh folder, and
they read and write no file.
"""

import functools
import ast
import builtins
import os
import pathlib
import re
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.docs_blocks import (PAGES, describe_failure, page_name,  # noqa: E402
                               python_blocks, run_script, script_of, snippet_lines)

TIMEOUT = 600                           # seconds per page

# Pages that must show runnable code, and what must hold after their blocks ran (kept from
# test_quick_start_code_runs in test_docs.py, which this test replaces).
REQUIRED = ("README.md", "docs/index.md")
CHECKS = {
    "README.md": "assert dparams.shape == params.shape, 'the gradient has the shape of params'",
    "docs/index.md": "assert dparams.shape == params.shape, 'the gradient has the shape of params'",
    # the worked example's PyTorch and pycudnnrnn outputs agree (it was a test of its own)
    "docs/interop.md": "assert float(np.abs(y[:, full] - reference.numpy()[:, full]).max()) < 1e-5",
}

RUN_PAGES = [p for p in PAGES if python_blocks(p)]


@functools.cache
def gpu_reason():
    """Why the gpu-only blocks cannot run here, or None: the check of the ``gpu`` tests."""
    from conftest import _gpu_reason
    return _gpu_reason()


def tail(text, chars=12000):
    return text if len(text) <= chars else "...\n" + text[-chars:]


def test_front_pages_show_code():
    """README.md and docs/index.md each show Python that runs on a CPU."""
    for name in REQUIRED:
        blocks = python_blocks(ROOT / name)
        assert [b for b in blocks if not b.gpu_only], f"no CPU python example in {name}"


@pytest.mark.parametrize("page", RUN_PAGES, ids=[p.name for p in RUN_PAGES])
def test_page_blocks_run(page, tmp_path):
    """The page's python blocks, joined in order, run as one script in a fresh folder."""
    name = page_name(page)
    blocks = list(enumerate(python_blocks(page), 1))
    if any(b.gpu_only for _, b in blocks) and gpu_reason():
        left_out = [f"line {b.line}" for _, b in blocks if b.gpu_only]
        blocks = [(n, b) for n, b in blocks if not b.gpu_only]
        print(f"{name}: gpu-only blocks left out ({', '.join(left_out)}): {gpu_reason()}")
        if not blocks:
            pytest.skip(f"{name}: every python block is gpu-only; {gpu_reason()}")
    text, spans = script_of(name, blocks, CHECKS.get(name))
    script = tmp_path / ("paste_" + re.sub(r"\W", "_", page.stem) + ".py")
    script.write_text(text, encoding="utf-8")
    started = time.monotonic()
    code, out, err, timed_out = run_script(sys.executable, script, tmp_path, TIMEOUT)
    print(f"{name}: {len(blocks)} blocks, {time.monotonic() - started:.1f} s")
    if code == 0 and not timed_out:
        return
    head = describe_failure(name, err, script.name, spans, code)
    if timed_out:
        head = f"{name}: did not finish in {TIMEOUT} s, interrupted.\n{head}"
    pytest.fail(f"{head}\n\n--- stderr (the script is {script.name}; its lines are the "
                f"page's blocks in order)\n{tail(err)}\n--- stdout\n{tail(out, 3000)}",
                pytrace=False)


def test_no_page_includes_a_file_that_github_shows_raw():
    """A ``--8<--`` include is filled in by the site but shown as that line on GitHub,
    where the README's links lead: write the code on the page."""
    found = {page_name(p): snippet_lines(p) for p in PAGES if snippet_lines(p)}
    assert not found, f"pages that include a file (line numbers): {found}"


def _backend_set(code):
    """The KERAS_BACKEND a block sets with ``os.environ[...] = "x"``, or None."""
    for node in ast.walk(ast.parse(code)):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and any(isinstance(t, ast.Subscript) and "KERAS_BACKEND" in ast.unparse(t)
                        for t in node.targets)):
            return node.value.value
    return None


@pytest.mark.parametrize("page", RUN_PAGES, ids=[p.name for p in RUN_PAGES])
def test_a_block_that_names_a_keras_backend_has_it_from_its_install_line(page):
    """A block that pins KERAS_BACKEND runs only where that framework is installed: every
    install its page offers above it must bring it (a Keras and TensorFlow user has
    neither)."""
    for block in python_blocks(page):
        backend = _backend_set(block.code)
        if backend is None:
            continue
        assert block.offered, f"{page_name(page)} line {block.line}: no install line above"
        for offer in block.offered:
            extras = set(re.findall(r"[\w-]+", offer.partition("[")[2]))
            assert backend in extras, (f"{page_name(page)} line {block.line} sets "
                                       f"KERAS_BACKEND={backend!r}, but the install above it "
                                       f"offers {offer}, which does not install it")


def _unbound(code):
    """Names a block reads that nothing in it binds (builtins aside)."""
    tree = ast.parse(code)
    bound, read = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return sorted(read - bound)


#: pages whose sections are read one at a time: the first CPU block of each section
#: imports and defines all it uses, so it runs pasted alone
SELF_CONTAINED_SECTIONS = ("docs/distributed.md",)


@pytest.mark.parametrize("name", SELF_CONTAINED_SECTIONS)
def test_each_section_opens_with_a_block_that_runs_pasted_alone(name):
    text = (ROOT / name).read_text(encoding="utf-8").splitlines()
    sections = [n for n, s in enumerate(text, 1) if s.startswith("## ")]
    opening = {}
    for block in python_blocks(ROOT / name):
        section = max((n for n in sections if n < block.line), default=0)
        if not block.gpu_only and section not in opening:
            opening[section] = block
    assert opening, f"{name}: no CPU python block"
    for block in opening.values():
        assert not _unbound(block.code), (f"{name} line {block.line} uses "
                                          f"{_unbound(block.code)}, which it does not define")
