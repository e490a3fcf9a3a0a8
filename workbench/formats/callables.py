"""Tool definitions from Python functions: the schema comes from the signature, type hints and docstring.

Why a schema and not just names: the prompts show each parameter's type, description, whether it is
required and its default, and the model writes better calls with them.  Types map to JSON Schema
(``int`` -> integer, ``list[str]`` -> array of strings, ``Literal``/``Enum`` -> enum, ``X | None`` -> X);
descriptions come from Google (``Args:``), Sphinx (``:param x:``) or NumPy (``Parameters`` / ``----``) docstrings.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from workbench.errors import ToolError
from workbench.formats.tooldefs import ToolDefinition, ToolParam

_SECTION_RE = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns?|Yields?|Raises|Examples?|Notes?)"
    r"\s*:?\s*$"
)


def from_callable(fn: Callable[..., Any], name: str | None = None) -> ToolDefinition:
    """Build a definition from a function: names and defaults from the signature, JSON Schema types from
    the type hints, the tool description and per-parameter descriptions from the docstring (Google,
    Sphinx ``:param x:`` or NumPy style)."""
    tool_name = name or getattr(fn, "__name__", None)
    if not tool_name or tool_name == "<lambda>" or not re.fullmatch(r"[A-Za-z_]\w*", tool_name):
        raise ToolError(f"tool {fn!r} needs a plain identifier as its name; define it with `def` (lambdas have none)")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolError(f"cannot read the signature of tool {tool_name!r}: {exc}") from exc
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to raw annotations
        hints = {k: v.annotation for k, v in sig.parameters.items() if v.annotation is not inspect.Parameter.empty}
    description, param_docs = parse_docstring(inspect.getdoc(fn) or "")
    params: dict[str, ToolParam] = {}
    for pname, p in sig.parameters.items():
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ToolError(
                f"parameter {pname!r} of tool {tool_name!r} is positional-only; tools are called with keyword "
                "arguments, so remove the '/' from the signature"
            )
        schema = schema_of_type(hints.get(pname, inspect.Parameter.empty))
        has_default = p.default is not inspect.Parameter.empty
        default = p.default if has_default and _is_json_like(p.default) else None
        params[pname] = ToolParam(
            param_type=_param_type_of(schema),
            description=param_docs.get(pname),
            required=not has_default,
            default=default,
            schema=schema,
        )
    return ToolDefinition(tool_name=tool_name, description=description or None, parameters=params, function=fn)


def _param_type_of(schema: dict[str, Any]) -> str:
    t = schema.get("type")
    if isinstance(t, str):
        return t
    if "enum" in schema:
        return "string"
    return "any"


def _is_json_like(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_json_like(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_like(v) for k, v in value.items())
    return False


def schema_of_type(tp: Any) -> dict[str, Any]:
    """JSON Schema of a Python type hint (``{}`` — any value — when there is no usable hint)."""
    if tp is inspect.Parameter.empty or tp is Any or tp is None:
        return {}
    if tp is type(None):
        return {"type": "null"}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return schema_of_type(args[0])
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:
            return schema_of_type(non_null[0])
        return {"anyOf": [schema_of_type(a) for a in non_null]}
    if origin is typing.Literal:
        values = list(args)
        out: dict[str, Any] = {"enum": values}
        kinds = {type(v) for v in values}
        if len(kinds) == 1:
            inner = schema_of_type(kinds.pop())
            if "type" in inner:
                out = {"type": inner["type"], "enum": values}
        return out
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return (
            {"type": "string", "enum": [m.value for m in tp]}
            if all(isinstance(m.value, str) for m in tp)
            else {"enum": [m.value for m in tp]}
        )
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    base = origin or tp
    if base in (list, tuple, set, frozenset) or (isinstance(base, type) and _is_sequence_abc(base)):
        out = {"type": "array"}
        item_args = [a for a in args if a is not Ellipsis]
        if len(item_args) == 1:
            items = schema_of_type(item_args[0])
            if items:
                out["items"] = items
        return out
    if base is dict or (isinstance(base, type) and _is_mapping_abc(base)):
        out = {"type": "object"}
        if len(args) == 2:
            values_schema = schema_of_type(args[1])
            if values_schema:
                out["additionalProperties"] = values_schema
        return out
    return {}


def _is_sequence_abc(tp: type) -> bool:
    import collections.abc as cabc

    return tp in (cabc.Sequence, cabc.MutableSequence, cabc.Iterable, cabc.Collection, cabc.Set)


def _is_mapping_abc(tp: type) -> bool:
    import collections.abc as cabc

    return tp in (cabc.Mapping, cabc.MutableMapping)


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into (description, {param: description}); whitespace is collapsed to one line
    each because descriptions are pasted into JSON-looking prompts."""
    lines = doc.splitlines()
    desc_lines: list[str] = []
    params: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        sphinx = re.match(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$", line)
        if sphinx:
            text = [sphinx.group(2)]
            i += 1
            while i < len(lines) and lines[i].strip() and not lines[i].lstrip().startswith(":"):
                text.append(lines[i].strip())
                i += 1
            params[sphinx.group(1)] = _squash(" ".join(text))
            continue
        if line.lstrip().startswith(":"):  # :returns:, :raises: ...
            i += 1
            continue
        header = _SECTION_RE.match(line)
        numpy_header = i + 1 < len(lines) and re.fullmatch(r"\s*-{3,}\s*", lines[i + 1]) is not None
        if header or numpy_header:
            name = (header.group(1) if header else line.strip()).lower()
            i += 2 if numpy_header else 1
            body: list[str] = []
            while i < len(lines):
                nxt = lines[i]
                is_next_header = _SECTION_RE.match(nxt) and not nxt.startswith((" ", "\t"))
                is_next_numpy = i + 1 < len(lines) and re.fullmatch(r"\s*-{3,}\s*", lines[i + 1]) is not None
                if is_next_header or is_next_numpy:
                    break
                body.append(nxt)
                i += 1
            if name in ("args", "arguments", "parameters", "params", "keyword args", "keyword arguments"):
                params.update(_parse_param_block(body, numpy=numpy_header))
            continue
        if not params:
            desc_lines.append(line)
        i += 1
    return _squash(" ".join(desc_lines)), params


def _parse_param_block(body: list[str], numpy: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    current: str | None = None
    base_indent: int | None = None
    for line in body:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if base_indent is None:
            base_indent = indent
        if indent <= base_indent:
            if numpy:
                m = re.match(r"^\s*\*{0,2}(\w+)\s*(?::.*)?$", line)
                if m:
                    current = m.group(1)
                    out[current] = ""
                    continue
            else:
                m = re.match(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
                if m:
                    current = m.group(1)
                    out[current] = m.group(2).strip()
                    continue
        if current is not None:
            out[current] = (out[current] + " " + line.strip()).strip()
    return {k: _squash(v) for k, v in out.items()}


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()
