"""The rules the package's imports keep (docs/architecture.md), read from the source.

Each module belongs to one part; a part may import only the parts below it that the
table allows. Imports inside functions count as much as those at the top: a lazy import
is still a dependency. Read with ``ast`` alone, nothing is imported.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "pycudnnrnn"

#: The public surface: what users import, and what the adapters build on.
PUBLIC = {"pycudnnrnn", "pycudnnrnn.api", "pycudnnrnn.convert", "pycudnnrnn.graphs"}
LEAVES = {"pycudnnrnn.errors", "pycudnnrnn.results"}
ADAPTERS = ("torch", "jax", "flax", "keras", "tensorflow")

#: part -> the parts it may import (besides its own modules).
ALLOWED = {
    "leaf": set(),
    "core": {"leaf"},
    "cudnn": {"core", "leaf"},
    "cpu": {"core", "leaf"},
    "cuda": {"cudnn", "core", "leaf"},
    "plan": {"cpu", "cuda", "core", "leaf"},
    "public": {"plan", "cpu", "cuda", "cudnn", "core", "leaf"},
    "adapter": {"public", "plan", "core", "leaf"},
    "tools": {"adapter", "public", "plan", "cpu", "cuda", "cudnn", "core", "leaf"},
    "main": {"tools"},
}

#: How many top-level modules the package may have (its public surface stays small).
MAX_TOP_LEVEL = 7


def part(module: str) -> str:
    """The part of the architecture that `module` (a dotted name) belongs to."""
    if module in LEAVES:
        return "leaf"
    if module in PUBLIC:
        return "public"
    if module == "pycudnnrnn.__main__":
        return "main"
    folder = module.split(".")[1]
    if folder in ADAPTERS:
        return "adapter"
    if folder in ("core", "cudnn", "cpu", "cuda", "plan", "tools"):
        return folder
    raise AssertionError(f"{module}: in no part of the architecture (docs/architecture.md)")


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: pathlib.Path) -> dict:
    """``{module: {imported module, ...}}`` for every module of the package at `root`,
    counting only the package's own modules."""
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    found = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:  # `from pkg import module` imports the module
                    sub = f"{source}.{alias.name}"
                    targets.add(sub if sub in modules else source)
        found[name] = {t for t in targets if t in modules and t != name}
    return found


def violations(imports: dict) -> list:
    """Every import that crosses the rules: ``"a -> b (part a -> part b)"``."""
    bad = []
    for module, targets in sorted(imports.items()):
        mine = part(module)
        for target in sorted(targets):
            theirs = part(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                bad.append(f"{module} -> {target} ({mine} -> {theirs})")
    return bad


def cycles(imports: dict) -> list:
    """Every circle of imports, as the list of its modules (Tarjan's strongly connected
    components of more than one module)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in imports.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(imports):
        if node not in index:
            visit(node)
    return found


def test_every_import_keeps_the_rules():
    assert violations(imports_of(PACKAGE)) == []


def test_no_circle_of_imports():
    assert cycles(imports_of(PACKAGE)) == []


def test_nothing_but_main_imports_the_tools():
    importers = {m for m, targets in imports_of(PACKAGE).items()
                 if any(part(t) == "tools" for t in targets) and part(m) != "tools"}
    assert importers == {"pycudnnrnn.__main__"}


def test_the_plan_picks_a_backend_in_one_place():
    """Only ``plan.backend`` names the backends' executors: ``RNNPlan`` and the caches ask
    an executor (its contract, ``plan.backend.Executor``), so that a new backend needs no
    edit of them."""
    imports = imports_of(PACKAGE)
    naming = {m for m, targets in imports.items() if part(m) == "plan"
              and any(part(t) in ("cpu", "cuda") for t in targets)}
    assert naming == {"pycudnnrnn.plan.backend"}


def test_the_top_level_stays_small():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top
    assert all(part(module_name(PACKAGE / name, PACKAGE)) in ("public", "leaf", "main")
               for name in top), top


def _package(tmp_path, files: dict) -> pathlib.Path:
    root = tmp_path / "pycudnnrnn"
    for name, text in {"__init__.py": "", "errors.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize("files, expected", [
    # core recognising a CuPy array by importing the CUDA backend: upward
    ({"core/__init__.py": "", "core/arrays.py": "from ..cuda import executor\n",
      "cuda/__init__.py": "", "cuda/executor.py": "from ..core import arrays\n"},
     ["pycudnnrnn.core.arrays -> pycudnnrnn.cuda.executor (core -> cuda)"]),
    # the backends importing each other, inside a function
    ({"cpu/__init__.py": "", "cpu/rnn.py": "def f():\n    from ..cuda import resources\n",
      "cuda/__init__.py": "", "cuda/resources.py": ""},
     ["pycudnnrnn.cpu.rnn -> pycudnnrnn.cuda.resources (cpu -> cuda)"]),
    # an adapter reaching into a backend, by absolute name
    ({"torch/__init__.py": "", "torch/kernels.py": "import pycudnnrnn.cpu.rnn\n",
      "cpu/__init__.py": "", "cpu/rnn.py": ""},
     ["pycudnnrnn.torch.kernels -> pycudnnrnn.cpu.rnn (adapter -> cpu)"]),
    # the binding knowing CuPy's backend
    ({"cudnn/__init__.py": "", "cudnn/capi.py": "from ..cuda import graphs\n",
      "cuda/__init__.py": "", "cuda/graphs.py": ""},
     ["pycudnnrnn.cudnn.capi -> pycudnnrnn.cuda.graphs (cudnn -> cuda)"]),
    # the public API importing the command line
    ({"api.py": "from .tools import cli\n", "tools/__init__.py": "", "tools/cli.py": ""},
     ["pycudnnrnn.api -> pycudnnrnn.tools.cli (public -> tools)"]),
])
def test_a_broken_rule_is_found(tmp_path, files, expected):
    assert violations(imports_of(_package(tmp_path, files))) == expected


def test_a_circle_is_found(tmp_path):
    root = _package(tmp_path, {"cuda/__init__.py": "",
                               "cuda/foreign.py": "from . import graphs\n",
                               "cuda/graphs.py": "def f():\n    from .foreign import x\n"})
    assert cycles(imports_of(root)) == [["pycudnnrnn.cuda.foreign", "pycudnnrnn.cuda.graphs"]]


def test_the_reader_sees_the_real_imports():
    """Guards the rules above against a reader that finds nothing: known edges, lazy and
    relative ones among them."""
    imports = imports_of(PACKAGE)
    assert {"pycudnnrnn.plan.rnn_plan", "pycudnnrnn.plan.cache"} <= imports["pycudnnrnn.plan"]
    assert "pycudnnrnn.core.checks" in imports["pycudnnrnn.plan.rnn_plan"]
    assert "pycudnnrnn.cpu.executor" in imports["pycudnnrnn.plan.backend"]
    assert "pycudnnrnn.cuda.executor" in imports["pycudnnrnn.plan.backend"]  # in a function
    assert "pycudnnrnn.plan" in imports["pycudnnrnn.torch.op_backends"]
    assert "pycudnnrnn.jax" in imports["pycudnnrnn.flax.modules"]  # `from .. import jax`
    assert imports["pycudnnrnn.__main__"] == {"pycudnnrnn.tools.cli"}
