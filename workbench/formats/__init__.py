"""Chat formats and tool calling for Llama 3.x and Llama 4 (no torch here: pure text and token ids).

``make_formatter(tokenizer, model_id)`` builds the engine's ``formatter``; the rest is exported for
notebooks that want to inspect or build prompts by hand.
"""

from __future__ import annotations

from workbench.formats.callables import from_callable, parse_docstring, schema_of_type
from workbench.formats.calls import TOOL_PROMPT_FORMATS, python_literal, render_tool_call, render_tool_calls
from workbench.formats.chat_format import ChatFormat, ImageTokens, Prompt, PromptImage
from workbench.formats.formatter import Formatter, coerce_messages, make_formatter, normalize_tool_choice
from workbench.formats.models import ModelInfo, resolve_model
from workbench.formats.parser import ParseResult, parse_assistant, parse_tool_calls
from workbench.formats.tool_prompts import format_date
from workbench.formats.tool_specs import ToolSet, coerce_tool, coerce_tools
from workbench.formats.tooldefs import BUILTIN_TOOLS, ToolDefinition, ToolParam

__all__ = [
    "BUILTIN_TOOLS",
    "TOOL_PROMPT_FORMATS",
    "ChatFormat",
    "ImageTokens",
    "Formatter",
    "ModelInfo",
    "ParseResult",
    "Prompt",
    "PromptImage",
    "ToolDefinition",
    "ToolParam",
    "ToolSet",
    "coerce_messages",
    "coerce_tool",
    "coerce_tools",
    "format_date",
    "from_callable",
    "make_formatter",
    "normalize_tool_choice",
    "parse_docstring",
    "parse_assistant",
    "parse_tool_calls",
    "python_literal",
    "render_tool_call",
    "render_tool_calls",
    "resolve_model",
    "schema_of_type",
]
