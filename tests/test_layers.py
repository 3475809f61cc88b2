"""The floors of the package (pyproject's [tool.importlinter]): nothing imports up a floor, at
module level or inside a function, and no two modules import each other, directly or round a loop.
import-linter and grimp read the source (every import statement, in functions too); nothing here
imports moebench's kernels."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")
pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]


def _lint(root: Path) -> subprocess.CompletedProcess:
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_floors_and_sibling_cycles_kept():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout


def test_a_back_edge_inside_a_function_breaks_the_floors(tmp_path):
    """The contract is not vacuous: one import of the report layer inside a core function fails it."""
    shutil.copytree(ROOT / "moebench", tmp_path / "moebench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    spec = tmp_path / "moebench" / "core" / "spec.py"
    spec.write_text(spec.read_text() + "\n\ndef _up():\n    from moebench.report.sweep import pivots\n\n"
                    "    return pivots\n")
    r = _lint(tmp_path)
    assert r.returncode != 0
    assert "moebench.core is not allowed to import moebench.report" in r.stdout
    assert "moebench.core.spec -> moebench.report.sweep" in r.stdout


def module_cycles(graph) -> list[list[str]]:
    """Every set of modules that import each other round a loop (strongly connected components of
    more than one module), a package and its own modules included."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's algorithm; the graph is small, recursion is fine
        index[m] = low[m] = len(index)
        stack.append(m)
        on.add(m)
        for n in sorted(graph.find_modules_directly_imported_by(m)):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            comp = []
            while True:
                n = stack.pop()
                on.discard(n)
                comp.append(n)
                if n == m:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return out


def test_module_cycles_finds_a_loop():
    g = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p", "p.a"), ("p.d", "p.a")):
        g.add_import(importer=a, imported=b)
    assert module_cycles(g) == [["p.a", "p.b", "p.c"]]


def test_no_import_cycles_between_modules():
    """No module imports another that (through any chain, function-level imports included) imports
    it back: the sibling contract does not see a package and its own modules, this does."""
    code = ("import grimp, json; g = grimp.build_graph('moebench', cache_dir=None); "
            "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import json

    g = grimp.ImportGraph()
    edges = json.loads(r.stdout)
    assert "moebench.core.spec" in edges and "moebench.report.sweep" in edges  # core and report are seen
    for m, imported in edges.items():
        g.add_module(m)
        for n in imported:
            g.add_import(importer=m, imported=n)
    assert module_cycles(g) == []


# Imports inside functions: only where the torch-free rule needs them (a reader must not import torch,
# triton, pandas or matplotlib at module level) or for an optional heavy package (megatron, cuda.bench,
# pynvml). Issue 31 set the ceiling; a new one needs a reason the rule gives.
FUNCTION_IMPORTS_MAX = 60


def function_level_imports(root: Path) -> list[str]:
    """`file:line` of every import statement inside a function or method of the package."""
    import ast

    found = []
    for path in sorted((root / "moebench").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        found.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(set(found))


def test_function_level_imports_stay_few():
    found = function_level_imports(ROOT)
    assert len(found) <= FUNCTION_IMPORTS_MAX, f"{len(found)} imports inside functions:\n" + "\n".join(found)


def test_the_count_sees_an_import_inside_a_method(tmp_path):
    pkg = tmp_path / "moebench"
    pkg.mkdir()
    (pkg / "m.py").write_text("import os\n\nclass A:\n    def f(self):\n        import json\n        return json\n")
    assert function_level_imports(tmp_path) == ["moebench/m.py:5"]
