"""Tool definitions: one internal shape for every way a notebook can describe a tool.

Accepted: Python callables (schema from signature, type hints and docstring; see :mod:`.callables`), OpenAI-style
``{"type": "function", "function": {name, description, parameters: <JSON schema>}}``, Llama-Stack-style
``{"tool_name", "description", "parameters": {name: {"param_type", "description", "required", "default"}}}``,
built-in names (``"brave_search"``, ``"wolfram_alpha"``, ``"code_interpreter"``, ``"photogen"``) and
:class:`ToolDefinition` itself.  The prompt renderers need Llama-Stack's view (``param_type`` strings);
valid JSON Schema is kept per parameter for the renderers that need real schemas.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import InputError, ToolError
from workbench.types import check_json_value, check_tool_name

BUILTIN_TOOLS = ("brave_search", "wolfram_alpha", "photogen", "code_interpreter")

_JSON_TYPES = {
    "str": "string",
    "string": "string",
    "text": "string",
    "int": "integer",
    "integer": "integer",
    "float": "number",
    "number": "number",
    "double": "number",
    "bool": "boolean",
    "boolean": "boolean",
    "list": "array",
    "array": "array",
    "tuple": "array",
    "dict": "object",
    "object": "object",
    "map": "object",
    "null": "null",
    "none": "null",
}


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
                name: {
                    "param_type": p.param_type,
                    "description": p.description,
                    "required": p.required,
                    "default": p.default,
                }
                for name, p in self.parameters.items()
            }
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
