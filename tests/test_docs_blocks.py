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

import dataclasses
import functools
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNS = {"python", "py"}                 # fence languages that run
GPU_ONLY = "<!-- gpu-only -->"
TIMEOUT = 600                           # seconds per page
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")

# Pages that must show runnable code, and what must hold after their blocks ran (kept from
# test_quick_start_code_runs in test_docs.py, which this test replaces).
REQUIRED = ("README.md", "docs/index.md")
CHECKS = {
    "README.md": "assert dparams.shape == params.shape, 'the gradient has the shape of params'",
    "docs/index.md": "assert dparams.shape == params.shape, 'the gradient has the shape of params'",
}


def page_name(path):
    return path.relative_to(ROOT).as_posix()


SNIPPET = re.compile(r'^[ \t]*-+8<-+[ \t]+"(?P<path>[^"]+)"[ \t]*$')


@dataclasses.dataclass
class Block:
    line: int           # line of the page where the code starts (after the fence)
    code: str
    gpu_only: bool
    origins: list       # for each line of code, where it comes from: "page:line"


def python_blocks(path):
    """The ```python blocks of a Markdown page, in order, dedented to their fence.

    A snippet line (``--8<-- "docs/examples/x.py"``, pymdownx.snippets with the repository
    root as base path, as in mkdocs.yml) is replaced by that file, as the site shows it.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    name = page_name(path)
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match or (match["fence"][0] == "`" and "`" in match["info"]):
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        words = match["info"].strip().lstrip("{").split()
        language = words[0].lstrip(".").lower() if words else ""
        previous = next((s.strip() for s in reversed(lines[:i]) if s.strip()), "")
        start, i = i + 1, i + 1
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        while i < len(lines) and not closing.match(lines[i]):
            i += 1
        if language in RUNS:
            code, origins = [], []
            for number, s in enumerate(lines[start:i], start + 1):
                s = s[min(indent, len(s) - len(s.lstrip())):]
                snippet = SNIPPET.match(s)
                if snippet:
                    included = (ROOT / snippet["path"]).read_text(encoding="utf-8")
                    code += included.splitlines()
                    origins += [f"{snippet['path']}:{n}"
                                for n in range(1, len(included.splitlines()) + 1)]
                else:
                    code.append(s)
                    origins.append(f"{name}:{number}")
            blocks.append(Block(start + 1, "\n".join(code) + "\n", previous == GPU_ONLY,
                                origins))
        i += 1
    return blocks


RUN_PAGES = [p for p in PAGES if python_blocks(p)]


@functools.cache
def gpu_reason():
    """Why the gpu-only blocks cannot run here, or None: the check of the ``gpu`` tests."""
    from conftest import _gpu_reason
    return _gpu_reason()


def script_of(name, blocks):
    """The script a reader would paste together, and where each block starts in it."""
    lines = [f"# The python blocks of {name}, in order."]
    spans = []
    for number, block in blocks:
        lines.append(f"# ---- block {number}, {name} line {block.line}")
        spans.append((len(lines) + 1, number, block))
        lines.extend(block.code.splitlines())
    if name in CHECKS:
        lines.append("# ---- after the blocks (tests/test_docs_blocks.py CHECKS)")
        spans.append((len(lines) + 1, "check",
                      Block(0, CHECKS[name] + "\n", False, ["tests/test_docs_blocks.py"])))
        lines.append(CHECKS[name])
    return "\n".join(lines) + "\n", spans


def run(script, cwd):
    """Run the script; on time-out interrupt it (a traceback says where it was), then kill."""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    proc = subprocess.Popen([sys.executable, script.name], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return proc.returncode, out, err, True


def failing_block(err, script, spans):
    """The block that was running: the outermost line of the script in the last traceback.

    Returns (block number, block, where the failing line comes from) or None.
    """
    last = err.rsplit("Traceback (most recent call last):", 1)[-1]
    lines = re.findall(rf'File "[^"]*{re.escape(script.name)}", line (\d+)', last)
    if not lines:
        return None
    line, found = int(lines[0]), None
    for start, number, block in spans:
        if start <= line:
            found = (number, block, block.origins[min(line - start, len(block.origins) - 1)])
    return found


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
    text, spans = script_of(name, blocks)
    script = tmp_path / ("paste_" + re.sub(r"\W", "_", page.stem) + ".py")
    script.write_text(text, encoding="utf-8")
    started = time.monotonic()
    code, out, err, timed_out = run(script, tmp_path)
    print(f"{name}: {len(blocks)} blocks, {time.monotonic() - started:.1f} s")
    if code == 0 and not timed_out:
        return
    where = failing_block(err, script, spans)
    if where is None:
        head = f"{name}: the script failed (exit status {code}) outside any block's lines"
    else:
        number, block, line = where
        first = "\n".join("    " + s for s in block.code.splitlines()[:6])
        label = ("the check after the blocks failed" if number == "check"
                 else f"block {number} (line {block.line}) failed at {line}")
        head = f"{name}: {label}; it begins:\n{first}"
    if timed_out:
        head = f"{name}: did not finish in {TIMEOUT} s, interrupted.\n{head}"
    pytest.fail(f"{head}\n\n--- stderr (the script is {script.name}; its lines are the "
                f"page's blocks in order)\n{tail(err)}\n--- stdout\n{tail(out, 3000)}",
                pytrace=False)
