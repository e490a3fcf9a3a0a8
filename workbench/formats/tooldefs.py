"""Tool definitions: one internal shape for every way a notebook can describe a tool.

Accepted: Python callables (schema from signature, type hints and docstring; see :mod:`.callables`), OpenAI-style
``{"type": "function", "function": {name, description, parameters: <JSON schema>}}``, Llama-Stack-style
``{"tool_name", "description", "parameters": {name: {"param_type", "description", "required", "default"}}}``,
built-in names (``"brave_search"``, ``"wolfram_alpha"``, ``"code_interpreter"``, ``"photogen"``) and
:class:`ToolDefinition` itself.  The prompt renderers need Llama-Stack's view (``param_type`` strings);
valid JSON Schema is kept per parameter for the renderers that need real schemas.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, ToolError
from ..types import check_json_value, check_tool_name

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
    """One tool spec -> :class:`ToolDefinition` (see the module docstring for the accepted forms), checked
    once here so that every prompt format can render it and the model can call it."""
    return check_definition(_coerce_tool(spec))


def check_definition(tool: ToolDefinition) -> ToolDefinition:
    """Names the model can write as calls, string descriptions, JSON-able defaults; errors name the field."""
    try:
        name = check_tool_name(tool.tool_name, "tool name")
    except InputError as exc:
        raise ToolError(str(exc)) from None
    if tool.description is not None and not isinstance(tool.description, str):
        raise ToolError(f"description of tool {name!r} must be a string, got {type(tool.description).__name__}")
    if tool.parameters is not None and not isinstance(tool.parameters, dict):
        raise ToolError(f"parameters of tool {name!r} must be a dict of name -> ToolParam")
    for pname, param in tool.params.items():
        where = f"parameter {pname!r} of tool {name!r}"
        try:
            check_tool_name(pname, f"{where}: the name")
        except InputError as exc:
            raise ToolError(str(exc).replace("tool call", "keyword argument")) from None
        if not isinstance(param, ToolParam):
            raise ToolError(f"{where} must be a ToolParam, got {type(param).__name__}")
        if not isinstance(param.param_type, str):
            raise ToolError(f"{where}: param_type must be a string like 'str' or 'list[int]', got {param.param_type!r}")
        if param.description is not None and not isinstance(param.description, str):
            raise ToolError(f"{where}: description must be a string, got {type(param.description).__name__}")
        if param.required is not None and not isinstance(param.required, bool):
            raise ToolError(f"{where}: required must be true/false, got {param.required!r}")
        try:
            check_json_value(param.default, f"{where}: default")
            check_json_value(param.schema, f"{where}: schema")
        except InputError as exc:
            raise ToolError(str(exc)) from None
    if name != tool.tool_name:
        tool = ToolDefinition(name, tool.description, tool.parameters, tool.function)
    return tool


def _coerce_tool(spec: Any) -> ToolDefinition:
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
        from .callables import from_callable  # (callables builds on the types defined here)

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
    return params.get("type") == "object" and ("properties" in params or "required" in params or len(params) == 1)


def _llama_stack_params(tool: str, params: Any) -> dict[str, ToolParam] | None:
    if params is None:
        return None
    if not isinstance(params, dict):
        raise ToolError(f"parameters of tool {tool!r} must be a dict of name -> {{'param_type', ...}}")
    out: dict[str, ToolParam] = {}
    for pname, p in params.items():
        if hasattr(p, "model_dump"):
            p = p.model_dump()
        if not isinstance(p, dict) or not isinstance(p.get("param_type"), str):
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
        raise ToolError(f"OpenAI-style function {fn!r:.120} has no 'name'")
    schema = fn.get("parameters")
    if schema is None:
        schema = {}
    if not isinstance(schema, dict):
        raise ToolError(f"'parameters' of tool {name!r} must be a JSON Schema object, got {type(schema).__name__}")
    if schema.get("type", "object") != "object":
        raise ToolError(f"'parameters' of tool {name!r} has type {schema.get('type')!r}; tool parameters are a JSON "
                        "Schema of type 'object' with 'properties'")  # fmt: skip
    props = schema.get("properties")
    if props is None:
        props = {}
    if not isinstance(props, dict):
        raise ToolError(f"'parameters.properties' of tool {name!r} must be an object mapping each parameter name to "
                        f"its JSON Schema, got {type(props).__name__} {props!r:.80}")  # fmt: skip
    required_list = schema.get("required")
    if required_list is None:
        required_list = []
    if not isinstance(required_list, (list, tuple)) or not all(isinstance(r, str) for r in required_list):
        raise ToolError(f"'parameters.required' of tool {name!r} must be a list of parameter names, got "
                        f"{required_list!r:.80}")  # fmt: skip
    required = set(required_list)
    params: dict[str, ToolParam] = {}
    for pname, pschema in props.items():
        if pschema is None or pschema is True:  # JSON Schema's "anything"
            pschema = {}
        if not isinstance(pschema, dict):
            raise ToolError(f"'parameters.properties.{pname}' of tool {name!r} must be a JSON Schema object, got "
                            f"{type(pschema).__name__} {pschema!r:.80}")  # fmt: skip
        pschema = dict(pschema)
        json_type = pschema.get("type")
        if isinstance(json_type, list):  # e.g. ["string", "null"]
            if not all(isinstance(t, str) for t in json_type):
                raise ToolError(f"'type' of parameter {pname!r} of tool {name!r} must be a string or list of strings")
            non_null = [t for t in json_type if t != "null"]
            json_type = non_null[0] if len(non_null) == 1 else json_type
        elif json_type is not None and not isinstance(json_type, str):
            raise ToolError(f"'type' of parameter {pname!r} of tool {name!r} must be a string or list of strings, got "
                            f"{json_type!r:.80}")  # fmt: skip
        param_type = json_type if isinstance(json_type, str) else ("any" if json_type is None else "|".join(json_type))
        description = pschema.get("description")
        if description is not None and not isinstance(description, str):
            raise ToolError(f"'description' of parameter {pname!r} of tool {name!r} must be a string")
        params[pname] = ToolParam(
            param_type=param_type,
            description=description,
            required=pname in required,
            default=pschema.get("default"),
            schema={k: v for k, v in pschema.items() if k not in ("description", "default")},
        )
    return ToolDefinition(tool_name=name, description=fn.get("description"), parameters=params if props else {})
