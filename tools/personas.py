"""Each page as a new reader meets it: a fresh environment, the page's install line, its blocks.

For every page of README.md and docs/ that names an install line (``pip install .`` or
``pip install '.[torch]'``, run from the checkout's root), this builds a new virtual
environment, runs exactly that line in it, then runs the page's python blocks in order, in
a fresh folder, with that environment's python. A block runs in the environment of the
install line above it (see tools/docs_blocks.py), so a page whose sections name different
lines (the README's) gets one environment per line. Blocks marked ``<!-- gpu-only -->``
are left out unless ``--gpu`` is given. KERAS_BACKEND is unset: a page that needs it
sets it.

This is slow: each environment installs its framework from the package index (PyTorch,
JAX, Keras: minutes each). It is not part of the test suite; ``make personas`` runs it for
every page, and ``--page`` for one:

    python tools/personas.py --page docs/jax.md

It prints one line per page and install line, then the failures in full. Exit status 1
if a page failed.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from tools.docs_blocks import (PAGES, ROOT, describe_failure, page_name,  # noqa: E402
                               python_blocks, run_script, script_of)


def groups(path, gpu=False):
    """The page's python blocks by install line, in order: [(line, [(number, Block)])]."""
    found = {}
    for number, block in enumerate(python_blocks(path), 1):
        if block.install is None or (block.gpu_only and not gpu):
            continue
        found.setdefault(block.install, []).append((number, block))
    return list(found.items())


def pip_arguments(line):
    """`pip install '.[jax]'` -> the arguments after ``pip``: install .[jax]."""
    words = shlex.split(line)
    if words[:3] in (["python", "-m", "pip"], ["python3", "-m", "pip"]):
        words = words[2:]
    if words[:2] != ["pip", "install"]:
        raise ValueError(f"line: not a pip install line: {line!r}")
    return words[1:]


def build(line, folder, python, timeout):
    """A new environment in `folder` with `line` run in it, from the checkout's root.
    Returns its python, or raises RuntimeError with pip's output."""
    subprocess.run([python, "-m", "venv", str(folder)], check=True, timeout=300)
    env_python = folder / "bin" / "python"
    proc = subprocess.run([str(env_python), "-m", "pip", *pip_arguments(line), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"`{line}` failed (exit status {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}{proc.stderr[-6000:]}")
    return env_python


def check_page(path, *, python, timeout, gpu, keep):
    """Build and run each of the page's install lines. Returns [(line, ok, seconds, text)]."""
    name, results = page_name(path), []
    for line, blocks in groups(path, gpu):
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="persona-") as tmp:
            tmp = pathlib.Path(tmp)
            try:
                env_python = build(line, tmp / "venv", python, timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                results.append((line, False, time.monotonic() - started, f"{name}: {exc}"))
                continue
            built = time.monotonic() - started
            text, spans = script_of(name, blocks)
            script = tmp / "paste.py"
            script.write_text(text, encoding="utf-8")
            code, out, err, timed_out = run_script(env_python, script, tmp, timeout)
            ok = code == 0 and not timed_out
            report = "" if ok else (
                (f"{name}: did not finish in {timeout} s.\n" if timed_out else "")
                + describe_failure(name, err, script.name, spans, code)
                + f"\n--- stderr\n{err[-6000:]}\n--- stdout\n{out[-2000:]}")
            if keep and not ok:
                kept = pathlib.Path(tempfile.mkdtemp(prefix="persona-script-"))
                (kept / "paste.py").write_text(text, encoding="utf-8")
                report += f"\n(the script is kept in {kept})"
            results.append((line, ok, time.monotonic() - started,
                            f"{len(blocks)} blocks; install {built:.0f} s" + (
                                "" if ok else "\n" + report)))
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", action="append", type=pathlib.Path,
                        help="a page to check (repeatable); default: every page with an "
                             "install line")
    parser.add_argument("--python", default=sys.executable,
                        help="the Python that builds the environments (default: this one)")
    parser.add_argument("--timeout", type=int, default=1800,
                        help="seconds for each install, and for each run of blocks")
    parser.add_argument("--gpu", action="store_true", help="run gpu-only blocks too")
    parser.add_argument("--keep", action="store_true", help="keep a failing page's script")
    args = parser.parse_args(argv)
    pages = [p.resolve() for p in args.page] if args.page else PAGES
    for page in pages:
        if not page.is_file() or ROOT not in page.parents:
            parser.error(f"--page: {page} is not a page of this checkout")
    checked = [(p, groups(p, args.gpu)) for p in pages]
    if args.page and not any(g for _, g in checked):
        parser.error(f"--page: {', '.join(page_name(p) for p in pages)} names no install "
                     "line above a python block")
    failures = []
    for page, page_groups in checked:
        if not page_groups:
            continue
        for line, ok, seconds, text in check_page(page, python=args.python,
                                                  timeout=args.timeout, gpu=args.gpu,
                                                  keep=args.keep):
            first, _, rest = text.partition("\n")
            print(f"{'ok  ' if ok else 'FAIL'} {page_name(page):24s} {line:36s} "
                  f"{seconds:5.0f} s  {first}", flush=True)
            if not ok:
                failures.append(rest or first)
    for text in failures:
        print("\n" + text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
