"""No module reaches into another module's or another object's underscored names.

A static check over the package's source (AST): ``from m import _name``, ``import m._private``, and an attribute
``x._name`` where ``x`` is not ``self``, ``cls`` or ``super()`` are refused, wherever they appear.  Dunder names
(``__doc__``, ``__signature__``) are Python's own and always allowed.  The allow-list below holds the few
private names of Python and third-party packages that workbench cannot do without, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import workbench

ROOT = Path(workbench.__file__).parent

# expression (as ast.unparse writes it) -> why it is allowed
ALLOWED = {
    "torch._grouped_mm": "PyTorch's grouped GEMM (MoE experts in three calls); it has no public name yet",
    "torch._scaled_mm": "PyTorch's fp8 matmul with scales; it has no public name",
    "torch._convert_weight_to_int4pack": "PyTorch's int4 weight packing (CUDA); no public name",
    "torch._convert_weight_to_int4pack_for_cpu": "PyTorch's int4 weight packing (CPU); no public name",
    "torch._weight_int4pack_mm": "PyTorch's int4 matmul kernel (CUDA); no public name",
    "torch._weight_int4pack_mm_for_cpu": "PyTorch's int4 matmul kernel (CPU); no public name",
    "torch.ops.mkldnn._reorder_linear_weight": "oneDNN's weight prepacking for the CPU output projection",
    "torch.ops.mkldnn._linear_pointwise": "oneDNN's prepacked linear for the CPU output projection",
    "tensor._version": "PyTorch's in-place version counter: a packed copy is rebuilt when its weight is edited",
    "torch.cpu._is_avx512_bf16_supported": "PyTorch's probe for native bf16 arithmetic on this CPU; no public name",
    "torch.cpu._is_amx_tile_supported": "PyTorch's probe for AMX tiles on this CPU; no public name",
    "instance._load_scenario": "BFCL's backends load an entry's initial_config only through this (BFCL's runner too)",
    "os._exit": "the standard library's documented exit without cleanup (a worker process after its rank fails)",
    "from ray._private import ray_constants": "Ray reads its loopback switch from this constant at import time",
    "from . import _registry": "the Inspect entry point (pyproject) names this module; importing it registers",
}
# IPython's display protocol: methods named _repr_*_ are called on other objects by design
DISPLAY_PROTOCOL = ("_repr_html_", "_repr_mimebundle_", "_repr_pretty_", "_repr_markdown_")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: an object reaching into its own names."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def violations(source: str, where: str = "<source>") -> list[str]:
    """Every reach into another module's or object's underscored names in ``source``, as ``where:line: text``."""
    return sorted({f"{where}:{line}: {text}" for line, text in reaches(source) if text not in ALLOWED})


def reaches(source: str) -> list[tuple[int, str]]:
    """Every reach into underscored names in ``source``, allowed or not: ``(line, text)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        text = None
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            private = [a.name for a in node.names if _private(a.name)]
            if any(_private(part) for part in (node.module or "").split(".")) or private:
                text = f"from {module} import {', '.join(private or [a.name for a in node.names])}"
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if any(_private(p) for p in a.name.split("."))]
            if names:
                text = f"import {', '.join(names)}"
        elif isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            if node.attr not in DISPLAY_PROTOCOL:
                text = ast.unparse(node)
        if text is not None:
            found.append((node.lineno, text))
    return found


def _package_violations(inside: str | None = None, outside: str | None = None) -> list[str]:
    """Violations in the package's modules under ``inside`` (a folder of it), or not under ``outside``."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if (inside is None or rel.startswith(inside)) and (outside is None or not rel.startswith(outside)):
            out += violations(path.read_text(encoding="utf-8"), f"workbench/{rel}")
    return out


def test_no_module_reaches_into_private_names() -> None:
    found = _package_violations(outside="generation/")
    assert found == [], "reaches into underscored names of other modules or objects:\n" + "\n".join(found)


def test_the_generation_layer_reaches_into_no_private_names() -> None:
    """The generation layer on its own: its scheduler, prefix cache and scoring share the cache's slot records
    only through the prefix cache's public methods."""
    found = _package_violations(inside="generation/")
    assert found == [], "reaches into underscored names of other modules or objects:\n" + "\n".join(found)


def test_the_checker_finds_every_kind_of_reach() -> None:
    source = (
        "from pkg.mod import _hidden, shown\n"
        "from pkg._impl import thing\n"
        "import pkg._impl\n"
        "class A:\n"
        "    def f(self, other):\n"
        "        self._mine, cls_ = other._theirs, super()._apply(1)\n"
        "        return self._x._y, other.__doc__, torch._grouped_mm, other._repr_html_()\n"
    )
    assert [v.split(": ", 1)[1] for v in violations(source)] == [
        "from pkg.mod import _hidden",
        "from pkg._impl import thing",
        "import pkg._impl",
        "other._theirs",
        "self._x._y",
    ]


def test_every_allowed_reach_is_still_made() -> None:
    """A stale allow-list entry would let that reach come back unseen: each one must still be in the package."""
    made = {text for path in ROOT.rglob("*.py") for _, text in reaches(path.read_text(encoding="utf-8"))}
    stale = sorted(set(ALLOWED) - made)
    assert stale == [], f"allow-list entries no module needs any more (delete them): {stale}"
