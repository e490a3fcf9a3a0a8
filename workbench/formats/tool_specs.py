"""Turning every way a notebook can describe a tool into a :class:`~.tooldefs.ToolDefinition`.

Accepted: Python callables (schema from signature, type hints and docstring; see :mod:`.callables`), OpenAI-style
``{"type": "function", "function": {name, description, parameters: <JSON schema>}}``, Llama-Stack-style
``{"tool_name", "description", "parameters": {name: {"param_type", "description", "required", "default"}}}``
(or llama-stack's own ``ToolDefinition`` objects), built-in names and :class:`ToolDefinition` itself.
Kept apart from :mod:`.tooldefs` so that the shapes (tooldefs) sit below their builders (callables, this module).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

from workbench.errors import ToolError
from workbench.formats.callables import from_callable
from workbench.formats.tooldefs import (
    BUILTIN_TOOLS,
    ToolDefinition,
    ToolParam,
    check_definition,
)


class ToolSet(tuple):
    """Tool definitions :func:`coerce_tools` has checked (each renderable and callable, names unique).

    Why a type: the chat layer checks a call's tools once and renders every dialog of the call with them; the
    formatter (``coerce_tools`` again) takes a ToolSet as it is instead of checking the same tools per dialog.
    A tuple, so nothing unchecked can be added to it afterwards."""


def coerce_tools(tools: Iterable[Any] | None) -> ToolSet:
    """Normalise a list of tool specs (any accepted form) into checked :class:`ToolDefinition` objects (a
    :class:`ToolSet`, which is returned as it is when given: its tools were checked when it was made)."""
    if isinstance(tools, ToolSet):
        return tools
    if tools is None:
        return ToolSet()
    if isinstance(tools, (str, dict)) or callable(tools):
        tools = [tools]
    out = ToolSet(coerce_tool(t) for t in tools)
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
        raise ToolError(
            f"'parameters' of tool {name!r} has type {schema.get('type')!r}; tool parameters are a JSON "
            "Schema of type 'object' with 'properties'"
        )
    props = schema.get("properties")
    if props is None:
        props = {}
    if not isinstance(props, dict):
        raise ToolError(
            f"'parameters.properties' of tool {name!r} must be an object mapping each parameter name to "
            f"its JSON Schema, got {type(props).__name__} {props!r:.80}"
        )
    required_list = schema.get("required")
    if required_list is None:
        required_list = []
    if not isinstance(required_list, (list, tuple)) or not all(isinstance(r, str) for r in required_list):
        raise ToolError(
            f"'parameters.required' of tool {name!r} must be a list of parameter names, got {required_list!r:.80}"
        )
    required = set(required_list)
    params: dict[str, ToolParam] = {}
    for pname, pschema in props.items():
        if pschema is None or pschema is True:  # JSON Schema's "anything"
            pschema = {}
        if not isinstance(pschema, dict):
            raise ToolError(
                f"'parameters.properties.{pname}' of tool {name!r} must be a JSON Schema object, got "
                f"{type(pschema).__name__} {pschema!r:.80}"
            )
        pschema = dict(pschema)
        json_type = pschema.get("type")
        if isinstance(json_type, list):  # e.g. ["string", "null"]
            if not all(isinstance(t, str) for t in json_type):
                raise ToolError(f"'type' of parameter {pname!r} of tool {name!r} must be a string or list of strings")
            non_null = [t for t in json_type if t != "null"]
            json_type = non_null[0] if len(non_null) == 1 else json_type
        elif json_type is not None and not isinstance(json_type, str):
            raise ToolError(
                f"'type' of parameter {pname!r} of tool {name!r} must be a string or list of strings, got "
                f"{json_type!r:.80}"
            )
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
