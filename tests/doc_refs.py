"""Which code names a document mentions that the code does not have (tests/test_architecture_map.py).

A document names code in backticks: a path (``engine/engine.py``, ``workbench/tools/loop.py:42``), a class
(``PrefixCache``), a dotted name (``Engine.generate_tokens``, ``chat.prepare``, ``wb.runs.table``) or a call
(``prepare()``).  The names are looked up in an index built from the package's source (AST, nothing imported):
modules, top-level classes and functions, class members (methods, class attributes, ``self.x`` attributes).
A ``file:line`` reference must point inside the file, and at the definition of the name that follows it in
backticks when there is one (``engine/engine.py:151 `Engine.generate_tokens` ``).
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "workbench"

_PATH = re.compile(
    r"^(?P<path>[\w./-]+\.(?:py|md|toml|sh|ipynb|pt)|[\w./-]+/)"
    r"(?::(?P<line>\d+)(?:[-–](?P<end>\d+))?)?$"
)
_DOTTED = re.compile(r"^(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?$")
_CALL = re.compile(r"^(?P<name>[A-Za-z_]\w*)\(\)$")
_CLASS = re.compile(r"^(?P<name>_?[A-Z][a-z]+[A-Z]?\w*)$")  # CamelCase: PrefixCache, RowAccumulator, Engine
_LINE_REF = re.compile(r"`(?P<ref>[\w./-]+\.py:\d+(?:[-–]\d+)?)`\s*`(?P<name>[\w.]+)(?:\(\))?`")


@dataclass
class Index:
    modules: dict[str, Path] = field(default_factory=dict)  # "engine.engine" -> file (relative to workbench)
    members: dict[str, set[str]] = field(default_factory=dict)  # module or class name -> its members
    classes: dict[str, list[str]] = field(default_factory=dict)  # class name -> qualified "module.Class"
    functions: set[str] = field(default_factory=set)  # bare names of top-level functions
    definitions: dict[str, list[tuple[Path, int]]] = field(default_factory=dict)  # name -> where defined


def build_index() -> Index:
    index = Index()
    stars: list[tuple[str, str]] = []  # (module, the module it star-imports)
    for file in sorted(PACKAGE.rglob("*.py")):
        rel = file.relative_to(PACKAGE).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        module = ".".join(parts)
        if module:
            index.modules[module] = file
        tree = ast.parse(file.read_text(encoding="utf-8"))
        names = index.members.setdefault(module, set())
        for node in tree.body:
            _top_level(index, module, file, node, names)
        if parts:  # a package's parent has the submodule as a member
            index.members.setdefault(".".join(parts[:-1]), set()).add(parts[-1])
        stars += [
            (module, node.module)
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("workbench.")
            and node.names[0].name == "*"
        ]
    for module, source in stars:  # `from workbench.face import *`: the package root has the face's names
        public = {n for n in index.members.get(source.removeprefix("workbench."), set()) if not n.startswith("_")}
        index.members[module] |= public
    return index


def _top_level(index: Index, module: str, file: Path, node: ast.stmt, names: set[str]) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names.add(node.name)
        index.functions.add(node.name)
        index.definitions.setdefault(node.name, []).append((file, node.lineno))
    elif isinstance(node, ast.ClassDef):
        names.add(node.name)
        index.classes.setdefault(node.name, []).append(f"{module}.{node.name}")
        index.definitions.setdefault(node.name, []).append((file, node.lineno))
        members = index.members.setdefault(f"{module}.{node.name}", set())
        for item in ast.walk(node):
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                members.add(item.name)
                index.definitions.setdefault(f"{node.name}.{item.name}", []).append((file, item.lineno))
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                members.add(item.target.id)
            elif isinstance(item, ast.Assign):
                for target in item.targets:
                    if isinstance(target, ast.Name):
                        members.add(target.id)
            if isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        members.add(target.attr)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Name):
                names.add(target.id)
                if target.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):  # lazy exports too
                    names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            names.add((alias.asname or alias.name).split(".")[0])
    elif isinstance(node, (ast.If, ast.Try)):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                _top_level(index, module, file, child, names)


# What the usual variable names of the docs stand for (``engine.cancel()`` is a method of an Engine, or of a part
# it is built from).
INSTANCES = {
    "engine": ("Engine", "StreamingMixin", "ModelManagement", "IntrospectionMixin"),
    "formatter": ("Formatter",),
    "tokenizer": ("Tokenizer",),
    "runner": ("LocalRunner", "ParallelRunner", "Runner"),
    "scheduler": ("Scheduler",),
    "store": ("Store",),
    "run": ("Run",),
    "pool": ("ReplicaPool",),
    "job": ("Job",),
}
# Spans that look dotted but name files or data: ``runs.sqlite``, ``requests.jsonl``.
DATA_SUFFIXES = {"sqlite", "json", "jsonl", "parquet", "eval", "txt", "model", "pth", "yml", "yaml", "csv", "png"}


def _owners(index: Index, head: str) -> list[str]:
    """Qualified names (modules or classes) a dotted name's first part may stand for."""
    head = {"wb": "", "workbench": ""}.get(head, head)
    found = []
    if head == "":
        found.append("")
    for cls in INSTANCES.get(head, ()):
        found += index.classes.get(cls, [])
    found += [m for m in index.modules if m == head or m.endswith("." + head)]
    found += index.classes.get(head, [])
    return found


def resolves(index: Index, dotted: str) -> bool:
    head, *rest = dotted.split(".")
    for owner in _owners(index, head):
        if _walk(index, owner, rest):
            return True
    return False


def _walk(index: Index, owner: str, rest: list[str]) -> bool:
    if not rest:
        return True
    name, *more = rest
    if name not in index.members.get(owner, set()):
        return False
    if not more:
        return True
    nxt = f"{owner}.{name}" if owner else name
    if nxt in index.members:
        return _walk(index, nxt, more)
    for qualified in index.classes.get(name, []):  # a re-exported class: wb.Engine.generate_tokens
        if _walk(index, qualified, more):
            return True
    return False


def _file(path: str) -> Path | None:
    for base in (ROOT, PACKAGE):
        candidate = base / path
        if candidate.exists():
            return candidate
    return None


def problems(doc: Path, index: Index | None = None) -> list[str]:
    """Every backticked code name in ``doc`` that the code does not have, as ``"doc:line: name (why)"``."""
    index = index or build_index()
    out = []
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        for span in re.findall(r"`([^`\n]+)`", line):
            why = _check(index, span.strip())
            if why:
                out.append(f"{doc.name}:{number}: `{span}` ({why})")
        for match in _LINE_REF.finditer(line):
            why = _check_definition(index, match["ref"], match["name"])
            if why:
                out.append(f"{doc.name}:{number}: `{match['ref']}` `{match['name']}` ({why})")
    return out


def _check(index: Index, span: str) -> str | None:
    if m := _PATH.match(span):
        if "/" not in m["path"]:
            return None  # a bare file name: prose, not a reference
        file = _file(m["path"])
        if file is None:
            return "no such file"
        if m["line"]:
            lines = len(file.read_text(encoding="utf-8").splitlines())
            last = int(m["end"] or m["line"])
            if last > lines:
                return f"the file has {lines} lines"
        return None
    if m := _DOTTED.match(span):
        if m["name"].rsplit(".", 1)[1] in DATA_SUFFIXES:
            return None
        head = m["name"].split(".")[0]
        if not _owners(index, head):
            return None  # not ours (torch.compile, os.getpid, pd.DataFrame)
        return None if resolves(index, m["name"]) else "not in the code"
    if m := _CALL.match(span):
        name = m["name"]
        known = name in index.functions or any(name in members for members in index.members.values())
        return None if known else "no such function"
    if m := _CLASS.match(span):
        name = m["name"]
        if name in dir(builtins):
            return None
        if name in index.classes or any(name in members for members in index.members.values()):
            return None
        return "no such class"
    return None


def _check_definition(index: Index, ref: str, name: str) -> str | None:
    path, _, lines = ref.partition(":")
    file = _file(path)
    if file is None:
        return None  # reported by _check
    first, _, last = lines.replace("–", "-").partition("-")
    first_line, last_line = int(first), int(last or first)
    key = name.split(".")[-2:] if "." in name else [name]
    for qualified in (".".join(key), key[-1]):
        for where, at in index.definitions.get(qualified, []):
            if where == file and first_line <= at <= last_line:
                return None
    found = [
        f"{w.relative_to(PACKAGE).as_posix()}:{at}"
        for q in (".".join(key), key[-1])
        for w, at in index.definitions.get(q, [])
        if w == file
    ]
    return f"{name} is not defined at {path}:{lines}" + (f"; it is at {found[0]}" if found else "")
