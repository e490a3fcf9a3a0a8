"""Tool definitions: one internal shape for every way a notebook can describe a tool.

Accepted: Python callables (schema from signature, type hints and docstring), OpenAI-style
``{"type": "function", "function": {name, description, parameters: <JSON schema>}}``, Llama-Stack-style
``{"tool_name", "description", "parameters": {name: {"param_type", "description", "required", "default"}}}``,
built-in names (``"brave_search"``, ``"wolfram_alpha"``, ``"code_interpreter"``, ``"photogen"``) and
:class:`ToolDefinition` itself.  The prompt renderers need Llama-Stack's view (``param_type`` strings);
valid JSON Schema is kept per parameter for the renderers that need real schemas.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ToolError

BUILTIN_TOOLS = ("brave_search", "wolfram_alpha", "photogen", "code_interpreter")

_JSON_TYPES = {
    "str": "string", "string": "string", "text": "string",
    "int": "integer", "integer": "integer",
    "float": "number", "number": "number", "double": "number",
    "bool": "boolean", "boolean": "boolean",
    "list": "array", "array": "array", "tuple": "array",
    "dict": "object", "object": "object", "map": "object",
    "null": "null", "none": "null",
}  # fmt: skip


@dataclass
class ToolParam:
    """One parameter: Llama-Stack's fields plus the parameter's JSON Schema (``schema``)."""

    param_type: str
    description: str | None = None
    required: bool | None = True  # None (allowed by llama-stack) means not required, and is printed as null
    default: Any = None
    schema: dict[str, Any] = field(default_factory=dict)

    def json_schema(self) -> dict[str, Any]:
        """Valid JSON Schema for this parameter (type, description, default, plus enum/items when known)."""
        out: dict[str, Any] = {}
        schema = dict(self.schema)
        json_type = schema.pop("type", None) or json_type_of(self.param_type)
        if json_type:
            out["type"] = json_type
        if self.description is not None:
            out["description"] = self.description
        schema.pop("description", None)
        out.update(schema)
        if self.default is not None:
            out["default"] = self.default
        return out


@dataclass
class ToolDefinition:
    """A tool the model may call; ``function`` is the Python implementation when one was given."""

    tool_name: str
    description: str | None = None
    parameters: dict[str, ToolParam] | None = None
    function: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    @property
    def is_builtin(self) -> bool:
        return self.tool_name in BUILTIN_TOOLS

    @property
    def params(self) -> dict[str, ToolParam]:
        """Parameters, ``{}`` for a tool without any (``parameters`` may be None)."""
        return self.parameters or {}

    def json_schema(self) -> dict[str, Any]:
        """The parameters as one JSON Schema object."""
        return {
            "type": "object",
            "properties": {name: p.json_schema() for name, p in self.params.items()},
            "required": [name for name, p in self.params.items() if p.required],
        }

    def to_openai(self) -> dict[str, Any]:
        """OpenAI-style definition (useful for comparing with other stacks)."""
        fn: dict[str, Any] = {"name": self.tool_name, "parameters": self.json_schema()}
        if self.description is not None:
            fn["description"] = self.description
        return {"type": "function", "function": fn}

    def to_llama_stack(self) -> dict[str, Any]:
        """Llama-Stack-style dict: ``ToolDefinition(**d)`` of llama-stack accepts it."""
        out: dict[str, Any] = {"tool_name": self.tool_name, "description": self.description}
        if self.parameters is not None:
            out["parameters"] = {
                name: {"param_type": p.param_type, "description": p.description, "required": p.required,
                       "default": p.default}
                for name, p in self.parameters.items()
            }  # fmt: skip
        return out


def json_type_of(param_type: str | None) -> str | None:
    """Map a Llama-Stack ``param_type`` (``int``, ``str``, ``list[str]``...) to a JSON Schema type."""
    if not param_type:
        return None
    key = str(param_type).strip().lower()
    if key in _JSON_TYPES:
        return _JSON_TYPES[key]
    head = re.split(r"[\[\(<]", key, maxsplit=1)[0].strip()
    if head in ("list", "array", "tuple", "sequence", "set"):
        return "array"
    if head in ("dict", "mapping", "object"):
        return "object"
    return None


def coerce_tools(tools: Iterable[Any] | None) -> list[ToolDefinition]:
    """Normalise a list of tool specs (any accepted form) into :class:`ToolDefinition` objects."""
    if tools is None:
        return []
    if isinstance(tools, (str, dict)) or callable(tools):
        tools = [tools]
    out = [coerce_tool(t) for t in tools]
    seen: set[str] = set()
    for t in out:
        if t.tool_name in seen:
            raise ToolError(f"two tools are named {t.tool_name!r}; tool names must be unique")
        seen.add(t.tool_name)
    return out


def coerce_tool(spec: Any) -> ToolDefinition:
    """One tool spec -> :class:`ToolDefinition` (see the module docstring for the accepted forms)."""
    if isinstance(spec, ToolDefinition):
        return spec
    if isinstance(spec, enum.Enum):
        spec = spec.value
    if isinstance(spec, str):
        if spec in BUILTIN_TOOLS:
            return ToolDefinition(tool_name=spec)
        raise ToolError(
            f"unknown built-in tool {spec!r}; built-ins are {', '.join(BUILTIN_TOOLS)}. "
            "Give custom tools as a Python function or a dict with a name and parameters"
        )
    if isinstance(spec, dict):
        return _from_dict(spec)
    if hasattr(spec, "model_dump") and hasattr(spec, "tool_name"):  # a llama-stack ToolDefinition
        return _from_dict(spec.model_dump())
    if callable(spec):
        return from_callable(spec)
    raise ToolError(
        f"cannot use {type(spec).__name__} as a tool; give a Python function, an OpenAI-style "
        "{'type': 'function', 'function': {...}} dict, a Llama-Stack {'tool_name', 'parameters'} dict "
        f"or a built-in name ({', '.join(BUILTIN_TOOLS)})"
    )


def _name_of(value: Any) -> str:
    return str(value.value if isinstance(value, enum.Enum) else value)


def _from_dict(spec: dict[str, Any]) -> ToolDefinition:
    if "function" in spec and isinstance(spec["function"], dict):  # OpenAI style
        if spec.get("type", "function") != "function":
            raise ToolError(f"OpenAI-style tool has type {spec.get('type')!r}; only 'function' is supported")
        return _from_openai_function(spec["function"])
    if "tool_name" in spec:
        name = _name_of(spec["tool_name"])
        params = spec.get("parameters")
        if isinstance(params, dict) and _looks_like_json_schema(params):
            return _from_openai_function({"name": name, "description": spec.get("description"), "parameters": params})
        return ToolDefinition(
            tool_name=name, description=spec.get("description"), parameters=_llama_stack_params(name, params)
        )
    if "name" in spec:  # bare OpenAI function object
        return _from_openai_function(spec)
    raise ToolError(
        f"tool dict {spec!r} has neither 'tool_name' (Llama-Stack style) nor 'function'/'name' (OpenAI style)"
    )


def _looks_like_json_schema(params: dict[str, Any]) -> bool:
    return params.get("type") == "object" and isinstance(params.get("properties", {}), dict)


def _llama_stack_params(tool: str, params: Any) -> dict[str, ToolParam] | None:
    if params is None:
        return None
    if not isinstance(params, dict):
        raise ToolError(f"parameters of tool {tool!r} must be a dict of name -> {{'param_type', ...}}")
    out: dict[str, ToolParam] = {}
    for pname, p in params.items():
        if hasattr(p, "model_dump"):
            p = p.model_dump()
        if not isinstance(p, dict) or "param_type" not in p:
            raise ToolError(
                f"parameter {pname!r} of tool {tool!r} must be a dict with 'param_type' (and optionally "
                f"'description', 'required', 'default'), got {p!r}"
            )
        out[str(pname)] = ToolParam(
            param_type=str(p["param_type"]),
            description=p.get("description"),
            required=None if p.get("required", True) is None else bool(p.get("required", True)),
            default=p.get("default"),
        )
    return out


def _from_openai_function(fn: dict[str, Any]) -> ToolDefinition:
    name = fn.get("name")
    if not name or not isinstance(name, str):
        raise ToolError(f"OpenAI-style function {fn!r} has no 'name'")
    schema = fn.get("parameters") or {}
    if not isinstance(schema, dict):
        raise ToolError(f"'parameters' of tool {name!r} must be a JSON Schema object")
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    params: dict[str, ToolParam] = {}
    for pname, pschema in props.items():
        pschema = dict(pschema or {})
        json_type = pschema.get("type")
        if isinstance(json_type, list):  # e.g. ["string", "null"]
            non_null = [t for t in json_type if t != "null"]
            json_type = non_null[0] if len(non_null) == 1 else json_type
        param_type = json_type if isinstance(json_type, str) else ("any" if json_type is None else "|".join(json_type))
        params[pname] = ToolParam(
            param_type=param_type,
            description=pschema.get("description"),
            required=pname in required,
            default=pschema.get("default"),
            schema={k: v for k, v in pschema.items() if k not in ("description", "default")},
        )
    return ToolDefinition(tool_name=name, description=fn.get("description"), parameters=params if props else {})


# --- callables ---------------------------------------------------------------------------------------------

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
        raise ToolError(
            f"tool {fn!r} needs a plain identifier as its name; define it with `def` (lambdas have none)"
        )
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
        return {"type": "string", "enum": [m.value for m in tp]} if all(
            isinstance(m.value, str) for m in tp
        ) else {"enum": [m.value for m in tp]}
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
