"""Run the example notebooks and store them with their outputs (``make notebooks``).

GitHub shows a notebook as stored, so the README's links lead to run notebooks. Each runs
top to bottom in a fresh kernel, in docs/examples/, on the CPU. What the machine that ran
it adds is dropped: stderr (library warnings and logs) and the cells' timings. The site's
build (``make docs``) runs them again, so the site always shows this checkout's outputs.

Usage: python tools/run_notebooks.py [NOTEBOOK ...]   (default: docs/examples/*.ipynb)
"""

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(path, timeout=1800):
    import nbformat
    from nbclient import NotebookClient
    notebook = nbformat.read(path, as_version=4)
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}  # each sets its own
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    started = time.monotonic()
    client.execute(env=env)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs
                            if not (o.output_type == "stream" and o.name == "stderr")]
            cell.metadata.pop("execution", None)
    nbformat.write(notebook, path)
    return time.monotonic() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path,
                        default=sorted((ROOT / "docs" / "examples").glob("*.ipynb")))
    args = parser.parse_args(argv)
    for path in args.notebooks:
        print(f"{path}: {run(path.resolve()):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
