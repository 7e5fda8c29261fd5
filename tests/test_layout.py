"""The package's shape: no import cycles (imports inside functions included) and no private name
imported from another subpackage. The layer order itself is declared in ``pyproject.toml``
(``[tool.importlinter]``) and checked by ``lint-imports``."""

import ast
from pathlib import Path

import pytest

import vbsvm

PACKAGE = Path(vbsvm.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """(imported module, names) of every ``from vbsvm... import`` in a file, at any depth."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "vbsvm" or target.startswith("vbsvm."):
                yield target, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("vbsvm"):
                    yield alias.name, []


def _graph():
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target, names in _imports(path):
            for imported in names or [None]:
                sub = f"{target}.{imported}" if imported else target
                edges.add(sub if sub in modules else target)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def _cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_including_imports_inside_functions():
    # the package root imports its public names from every layer, so an import of the root from
    # inside the package would close a cycle through it
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def _subpackage(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_private_name_is_imported_from_another_subpackage():
    crossing = []
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        for target, names in _imports(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and _subpackage(target) != _subpackage(module):
                crossing.append((module, target, private))
    assert crossing == []


@pytest.mark.parametrize("layer", ["formula", "io", "mcmc", "models", "inference", "posterior", "results",
                                   "sources", "fitting"])
def test_no_layer_imports_the_package_root(layer):
    for path in (PACKAGE / layer).rglob("*.py"):
        assert all(target != "vbsvm" or names == [] or set(names) <= {"validation", "datasets", "exceptions"}
                   for target, names in _imports(path)), path


def test_layer_contracts_hold():
    """``lint-imports`` with the contracts of ``pyproject.toml`` (the layers of the pipeline)."""
    import subprocess
    import sys

    config = Path(__file__).resolve().parents[1] / "pyproject.toml"
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True,
                         cwd=config.parent)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_the_wheel_lists_every_subpackage_and_data_folder():
    """pyproject.toml lists the packages by hand (the top-level data/ is mapped into the wheel):
    every folder of vbsvm/ with an __init__.py and every data set folder must be in the list."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    code = {".".join(p.parent.relative_to(root).parts) for p in (root / "vbsvm").rglob("__init__.py")}
    data = {"vbsvm.datasets.data"} | {f"vbsvm.datasets.data.{d.name}" for d in (root / "data").iterdir() if d.is_dir()}
    assert listed == code | data
