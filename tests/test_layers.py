"""The package's architecture, checked: every import goes down (import-linter's contracts in
pyproject.toml), and no module imports itself back through any chain of imports, function-level ones
included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import workbench

ROOT = Path(workbench.__file__).parent


def test_import_linter_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=ROOT.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout and "KEPT" in done.stdout


def _lint_a_copy(tmp_path: Path, extra: dict[str, str]) -> subprocess.CompletedProcess:
    """lint-imports with the project's contracts over a copy of the package's sources plus ``extra`` modules
    (path inside the package -> source), so a test can add an arrow without touching the real tree."""
    copy = tmp_path / "workbench"
    shutil.copytree(
        ROOT,
        copy,
        ignore=lambda folder, names: [
            n for n in names if n == "__pycache__" or (not n.endswith(".py") and not (Path(folder) / n).is_dir())
        ],
    )
    for relative, source in extra.items():
        (copy / relative).write_text(source)
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(lint), "--config", str(ROOT.parent / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layer_check_lints_the_copy_it_is_given(tmp_path: Path) -> None:
    clean = _lint_a_copy(tmp_path / "clean", {})
    assert clean.returncode == 0, clean.stdout[-4000:] + clean.stderr[-2000:]
    # a module that only exists in the copy, importing one layer up: found, so the copy is what was linted
    up = _lint_a_copy(tmp_path / "up", {"generation/upward.py": "from workbench.engine import Engine\n"})
    assert up.returncode != 0 and "workbench.generation.upward -> workbench.engine" in up.stdout, up.stdout[-4000:]


@pytest.mark.parametrize(
    "module, source",
    [
        ("notebook/upward.py", "from workbench import display\n"),  # the arrow widgets.py had: a name of the face
        ("engine/upward.py", "import workbench\n"),  # the bare package root
    ],
)
def test_an_import_of_the_package_root_from_below_the_face_breaks_the_layers(
    tmp_path: Path, module: str, source: str
) -> None:
    """The package root is in no layer (import-linter cannot make a package a layer among its own children),
    but its names come from workbench.face, which is: importing the root from below reaches the face, a chain
    up that the layers contract reports."""
    done = _lint_a_copy(tmp_path, {module: source})
    importer = "workbench." + module.removesuffix(".py").replace("/", ".")
    assert done.returncode != 0, done.stdout[-4000:]
    assert f"{importer} -> workbench (l.1)" in done.stdout and "workbench -> workbench.face" in done.stdout, (
        done.stdout[-4000:]
    )


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), over every import grimp sees."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.find_modules_directly_imported_by(node):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles_anywhere_in_the_package() -> None:
    graph = grimp.build_graph("workbench", include_external_packages=False)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc import b\n")
    (pkg / "b.py").write_text("def f():\n    from cyc import a  # a function-level import still closes a cycle\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(grimp.build_graph("cyc")) == [["cyc.a", "cyc.b"]]
