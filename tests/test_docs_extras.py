"""Each page's and notebook's code imports only what the extras it names install.

A reader installs the extras a page names (``pip install '.[flax]'`` from a checkout, or
"the `cuda12` extra") and pastes its code. So every
module a page's python blocks (or a notebook's code cells) import must come from the
base dependencies, from one of those extras, or from what they bring with them. The
extras are read from pyproject.toml; an import guarded by ``except ImportError`` is
optional and not counted.
"""

import ast
import json
import re
import sys
import tomllib
from importlib import metadata

import pytest

from test_docs_blocks import PAGES, ROOT, python_blocks

#: import name -> the distributions that provide it (any one of them will do)
DISTRIBUTIONS = {
    "numpy": ("numpy",), "ml_dtypes": ("ml_dtypes",), "threadpoolctl": ("threadpoolctl",),
    "torch": ("torch",), "jax": ("jax",), "jaxlib": ("jaxlib",), "optax": ("optax",),
    "flax": ("flax",), "orbax": ("orbax-checkpoint",), "keras": ("keras",), "tensorflow": ("tensorflow", "tensorflow-cpu"),
    "matplotlib": ("matplotlib",), "cupy": ("cupy-cuda12x", "cupy-cuda13x"),
    "IPython": ("ipython",), "ipywidgets": ("ipywidgets",),
}

#: distribution -> what installing it brings (its requirements that pages import);
#: checked against the installed packages' metadata below
BRINGS = {
    "flax": ("jax", "optax", "orbax-checkpoint", "numpy"),
    "optax": ("jax", "numpy"),
    "jax": ("jaxlib", "numpy", "ml_dtypes"),
    "matplotlib": ("numpy",),
    "jupyter": ("ipython",),
    "keras": ("numpy",),
    "tensorflow": ("keras", "numpy"),
    "tensorflow-cpu": ("keras", "numpy"),
    "torch": (),
}

#: pages that do not yet name the extra their code needs (each one is a failure until
#: its page names it: strict, so a fixed page must leave this list)
NOT_YET: dict = {}


def _project():
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised: "orbax_checkpoint>=1" -> "orbax-checkpoint"."""
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _with_what_they_bring(names) -> set:
    brings = {_name(k): [_name(n) for n in v] for k, v in BRINGS.items()}
    found, todo = set(), [_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += brings.get(name, [])
    return found


def named_extras(text: str, extras) -> set:
    """The extras of `extras` that a page's text names."""
    named = set()
    for group in re.findall(r"(?:pycudnnrnn|\.)\[([\w,\- ]+)\]", text):  # pip install '.[a,b]'
        named |= {e.strip() for e in group.split(",")}
    named |= set(re.findall(r"`\[?([\w-]+)\]?` extras?\b", text))            # the `cuda12` extra
    return named & set(extras)


def _optional(tree) -> set:
    """Import nodes inside ``try:`` blocks whose handlers catch ImportError."""
    nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                handler.type is None or any(name in ast.unparse(handler.type) for name in
                                            ("ImportError", "ModuleNotFoundError", "Exception"))
                for handler in node.handlers):
            for statement in node.body:
                nodes |= {id(n) for n in ast.walk(statement)
                          if isinstance(n, (ast.Import, ast.ImportFrom))}
    return nodes


def imported(code: str) -> set:
    """The top-level modules `code` imports, the standard library's and optional ones aside."""
    tree = ast.parse(code)
    optional, found = _optional(tree), set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "pycudnnrnn"}


def _sources():
    """(name, code, text) of every page with python blocks and of every notebook."""
    for path in PAGES:
        blocks = python_blocks(path)
        if blocks:
            yield (path.relative_to(ROOT).as_posix(), "\n".join(b.code for b in blocks),
                   path.read_text(encoding="utf-8"))
    for path in sorted((ROOT / "docs" / "examples").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = [("".join(c["source"])) for c in cells if c["cell_type"] == "code"]
        # IPython's magics and shell lines (%pip, !pip) are not Python
        code = "\n".join(line for cell in code for line in cell.splitlines()
                         if not line.lstrip().startswith(("%", "!")))
        yield (path.relative_to(ROOT).as_posix(), code,
               "\n".join("".join(c["source"]) for c in cells))


SOURCES = list(_sources())


@pytest.mark.parametrize("name, code, text", [
    pytest.param(*source, id=source[0], marks=[pytest.mark.xfail(
        strict=True, reason=NOT_YET[source[0]])] if source[0] in NOT_YET else [])
    for source in SOURCES])
def test_a_pages_imports_come_with_the_extras_it_names(name, code, text):
    project = _project()
    extras = project["optional-dependencies"]
    named = named_extras(text, extras)
    installed = _with_what_they_bring(
        [_name(r) for r in project["dependencies"]] +
        [_name(r) for extra in named for r in extras[extra]])
    unknown = sorted(m for m in imported(code) if m not in DISTRIBUTIONS)
    assert not unknown, f"{name} imports {unknown}: add them to DISTRIBUTIONS in this test"
    missing = {m: DISTRIBUTIONS[m] for m in imported(code)
               if not {_name(d) for d in DISTRIBUTIONS[m]} & installed}
    assert not missing, (f"{name} imports {sorted(missing)}, which the extras it names "
                         f"({sorted(named) or 'none'}) do not install: name the extra that does")


def test_what_this_test_says_each_package_brings_is_true():
    """BRINGS, against the installed packages' own requirements (unconditional ones)."""
    checked = 0
    for distribution, brought in BRINGS.items():
        try:
            requires = metadata.requires(distribution) or []
        except metadata.PackageNotFoundError:
            continue
        unconditional = {_name(r) for r in requires if ";" not in r or "extra ==" not in r}
        brought = {_name(n) for n in brought}
        assert brought <= unconditional, (distribution, brought - unconditional)
        checked += 1
    assert checked, "none of BRINGS is installed here"


@pytest.mark.parametrize("text, expected", [
    ("pip install 'pycudnnrnn[keras,jax]'", {"keras", "jax"}),
    ("pip install '.[flax]'     # JAX and Flax", {"flax"}),
    ("it also installs the `cuda12` extra", {"cuda12"}),
    ("The `[jax]` extra brings optax.", {"jax"}),
    ("`pycudnnrnn.torch` wraps torch; a list[int] and the `test` suite", set()),
])
def test_the_extras_a_text_names(text, expected):
    extras = {"torch": [], "jax": [], "flax": [], "keras": [], "cuda12": [], "notebooks": []}
    assert named_extras(text, extras) == expected


def test_optional_imports_do_not_count():
    code = ("import numpy as np\nfrom flax import nnx\nimport os.path\n"
            "try:\n    import torch\nexcept ImportError:\n    torch = None\n")
    assert imported(code) == {"numpy", "flax"}
