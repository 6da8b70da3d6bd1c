"""The code blocks of the Markdown pages, as a reader pastes them, and their install lines.

Shared by ``tests/test_docs_blocks.py`` (every page's python blocks run, in this Python)
and ``tools/personas.py`` (each page's blocks run in a fresh environment built by the
page's own install line). ``run_script`` runs a pasted script.

- A fenced block tagged ``python`` (or ``py``) runs. Other tags (``text``, ``console``,
  ``bash``) do not.
- The line ``<!-- gpu-only -->`` just before a fence marks a block that needs an NVIDIA GPU
  with cuDNN.
- An install line is a shell line that installs the checkout, ``pip install .`` or
  ``pip install '.[torch]'``. A python block's install line is the first such line of the
  last shell block above it that has one: the environment a reader who followed the page
  has.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import signal
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNS = {"python", "py"}                 # fence languages that run
SHELLS = {"bash", "sh", "shell", "console"}
GPU_ONLY = "<!-- gpu-only -->"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
#: pymdownx.snippets' include line: the site shows the file, GitHub shows this line raw
SNIPPET = re.compile(r'^[ \t]*-+8<-+[ \t]')
#: an install of this checkout, with its extras, anywhere in a line (a comment too)
OFFERED = re.compile(r"(?:pip install \.(?=\s|$)|'\.\[[\w,\-]+\]'|\"\.\[[\w,\-]+\]\")")
#: a shell line that installs this checkout: `pip install .` or `pip install '.[a,b]'`
INSTALL = re.compile(r"""^(?:python3? -m )?pip install (?:\.|'\.\[[\w,\-]+\]'|"\.\[[\w,\-]+\]")"""
                     r"""(?=\s|$)""")


@dataclasses.dataclass
class Block:
    line: int           # line of the page where the code starts (after the fence)
    code: str
    gpu_only: bool
    origins: list       # for each line of code, where it comes from: "page:line"
    install: str | None = None  # the install line above it (see the module docstring)
    offered: tuple = ()  # every '.[extras]' that line's shell block offers, comments too


def page_name(path) -> str:
    return pathlib.Path(path).resolve().relative_to(ROOT).as_posix()


def _fenced(path):
    """(language, first line of code, lines of code, gpu-only) of each fenced block."""
    lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
    i = 0
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
        code = [s[min(indent, len(s) - len(s.lstrip())):] for s in lines[start:i]]
        yield language, start + 1, code, previous == GPU_ONLY
        i += 1


def install_lines(code_lines) -> list[str]:
    """The lines of a shell block that install this checkout, comments dropped."""
    found = []
    for s in code_lines:
        s = s.strip().removeprefix("$ ").split(" #", 1)[0].strip()
        if INSTALL.match(s):
            found.append(s)
    return found


def python_blocks(path) -> list[Block]:
    """The ```python blocks of a Markdown page, in order, dedented to their fence, each
    with the install line above it."""
    name, blocks, install, offered = page_name(path), [], None, ()
    for language, line, code, gpu_only in _fenced(path):
        if language in SHELLS and install_lines(code):
            install = install_lines(code)[0]
            offered = tuple(m.strip("'\"") for s in code for m in OFFERED.findall(s))
        elif language in RUNS:
            origins = [f"{name}:{n}" for n in range(line, line + len(code))]
            blocks.append(Block(line, "\n".join(code) + "\n", gpu_only, origins, install,
                                offered))
    return blocks


def snippet_lines(path) -> list[int]:
    """Lines of a page that include a file (``--8<--``): GitHub shows them raw."""
    return [n for language, line, code, _ in _fenced(path)
            for n, s in enumerate(code, line) if SNIPPET.match(s)]


def script_of(name, blocks, checks=None):
    """The script a reader would paste together, and where each block starts in it.

    `blocks` is a list of (number, Block); `checks`, code to run after them. Returns the
    script's text and, per block, (its first line in the script, its number, the block).
    """
    lines = [f"# The python blocks of {name}, in order."]
    spans = []
    for number, block in blocks:
        lines.append(f"# ---- block {number}, {name} line {block.line}")
        spans.append((len(lines) + 1, number, block))
        lines.extend(block.code.splitlines())
    if checks:
        lines.append("# ---- after the blocks")
        spans.append((len(lines) + 1, "check", Block(0, checks + "\n", False, ["checks"])))
        lines.append(checks)
    return "\n".join(lines) + "\n", spans


def failing_block(err, script_name, spans):
    """The block that was running: the outermost line of the script in the last traceback.

    Returns (block number, block, where the failing line comes from) or None.
    """
    last = err.rsplit("Traceback (most recent call last):", 1)[-1]
    lines = re.findall(rf'File "[^"]*{re.escape(script_name)}", line (\d+)', last)
    if not lines:
        return None
    line, found = int(lines[0]), None
    for start, number, block in spans:
        if start <= line:
            found = (number, block, block.origins[min(line - start, len(block.origins) - 1)])
    return found


def describe_failure(name, err, script_name, spans, code):
    """One paragraph: which block failed, at which line of the page, and how it begins."""
    where = failing_block(err, script_name, spans)
    if where is None:
        return f"{name}: the script failed (exit status {code}) outside any block's lines"
    number, block, line = where
    first = "\n".join("    " + s for s in block.code.splitlines()[:6])
    label = ("the check after the blocks failed" if number == "check"
             else f"block {number} (line {block.line}) failed at {line}")
    return f"{name}: {label}; it begins:\n{first}"


def run_script(python, script, cwd, timeout):
    """Run `script` with `python` in `cwd`, as a reader would: without KERAS_BACKEND (a page
    that needs it sets it). On time-out interrupt it (a traceback says where it was), then
    kill. Returns (exit status, stdout, stderr, whether it timed out)."""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    proc = subprocess.Popen([str(python), pathlib.Path(script).name], cwd=cwd, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return proc.returncode, out, err, True
