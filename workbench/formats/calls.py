"""Rendering tool calls as the text an assistant turn contains.

Three syntaxes for custom tools (``tool_prompt_format``): ``json`` —
``{"type": "function", "name": ..., "parameters": {...}}``; ``function_tag`` —
``<function=NAME>{...}</function>``; ``python_list`` — ``[NAME(a=1, b="x")]``.  Built-in tools are
written ``brave_search.call(query="...")`` and code-interpreter calls as the raw code, whatever the format.

These strings are what the models were trained on, so they match Meta's reference byte for byte
wherever the reference produces valid syntax.  Where it does not (a string with a quote, backslash or
newline in a python-list or built-in call; a dict argument rendered ``{k=v}``), we write valid Python
instead (see docs/prompt-formats.md).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable
from typing import Any

from workbench.errors import InputError
from workbench.formats.tooldefs import BUILTIN_TOOLS
from workbench.types import ToolCall

TOOL_PROMPT_FORMATS = ("json", "function_tag", "python_list")

_PY_STRING_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\x00": "\\x00"}


def normalize_tool_prompt_format(fmt: Any) -> str | None:
    """``None`` or one of json|function_tag|python_list (enum members of other packages accepted)."""
    if fmt is None:
        return None
    if isinstance(fmt, enum.Enum):
        fmt = fmt.value
    if fmt not in TOOL_PROMPT_FORMATS:
        raise InputError(f"tool_prompt_format {fmt!r} is not one of {', '.join(TOOL_PROMPT_FORMATS)} (or None)")
    return str(fmt)


def python_string(value: str) -> str:
    """A double-quoted Python string literal; identical to ``f'"{value}"'`` whenever that is valid Python."""
    return '"' + "".join(_PY_STRING_ESCAPES.get(ch, ch) for ch in value) + '"'


def python_literal(value: Any) -> str:
    """Python source for a JSON-like value (what the python-list syntax puts after ``name=``)."""
    if isinstance(value, str):
        return python_string(value)
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            raise InputError("a NaN argument cannot be written as a Python literal in a tool call")
        if math.isinf(value):
            return "1e999" if value > 0 else "-1e999"
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(str(k))}: {python_literal(v)}" for k, v in value.items()) + "}"
    raise InputError(f"tool-call argument {value!r} ({type(value).__name__}) is not a JSON-like value")


def _tool_name(call: ToolCall) -> str:
    name = call.tool_name
    return str(name.value if isinstance(name, enum.Enum) else name)


def render_tool_call(call: ToolCall | dict[str, Any], tool_prompt_format: str = "json") -> str:
    """The text of one call as it appears in an assistant turn."""
    call = ToolCall.coerce(call)
    name = _tool_name(call)
    args = call.arguments
    if not isinstance(args, dict):
        raise InputError(f"arguments of tool call {name!r} must be a dict, got {type(args).__name__}")
    if name == "code_interpreter":
        code = args.get("code")
        if not isinstance(code, str):
            raise InputError("a code_interpreter call needs a string 'code' argument")
        return code
    if name in BUILTIN_TOOLS:
        return f"{name}.call(" + ", ".join(f"{k}={python_literal(v)}" for k, v in args.items()) + ")"
    fmt = normalize_tool_prompt_format(tool_prompt_format) or "json"
    if fmt == "json":
        return json.dumps({"type": "function", "name": name, "parameters": args})
    if fmt == "function_tag":
        return f"<function={name}>{json.dumps(args)}</function>"
    return f"[{name}(" + ", ".join(f"{k}={python_literal(v)}" for k, v in args.items()) + ")]"


def render_tool_calls(calls: Iterable[ToolCall | dict[str, Any]], tool_prompt_format: str = "json") -> str:
    """All calls of a turn, concatenated as Meta's chat format writes them (one rendering per call)."""
    return "".join(render_tool_call(c, tool_prompt_format) for c in calls)
