"""The tool-calling prompts: how tools, tool choice and the user's system prompt become messages.

Two styles, chosen by the model generation (see :mod:`workbench.formats.models`):

* ``llama3_1`` (Llama 3.1, 3.2 vision): a system message ``Environment: ipython`` / ``Tools: ...`` (built-ins),
  ``Cutting Knowledge Date`` and ``Today Date``, the user's system prompt and the tool-choice line; custom
  tools go in an extra user message before the dialog, as JSON definitions or function-tag definitions.
* ``llama3_2`` (Llama 3.2 text, 3.3, 4): one system message with the built-ins line, the python-list
  instructions and JSON-looking function list, the user's system prompt and the tool-choice line.

The wording is an interface fact (the models were trained on it) and matches llama-stack 0.2.2's
meta-reference prompts; the code is ours.  Deviations where the reference is broken are listed in
docs/prompt-formats.md.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from workbench.errors import InputError
from workbench.formats.chat_format import content_text
from workbench.formats.tooldefs import ToolDefinition, ToolParam
from workbench.types import Message

_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)

TOOL_CHOICE_REQUIRED = "You MUST use one of the provided functions/tools to answer the user query."

PYTHON_LIST_INSTRUCTIONS = """\
You are a helpful assistant. You have access to functions, but you should only use them if they are required.
You are an expert in composing functions. You are given a question and a set of possible functions.
Based on the question, you may or may not need to make one function/tool call to achieve the purpose.

If you decide to invoke any of the function(s), you MUST put it in the format of \
[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]
If you decide to invoke a function, you SHOULD NOT include any other text in the response. \
besides the function call in the above format.
For a boolean parameter, be sure to use `True` or `False` (capitalized) for the value.


{{ function_description }}"""

PYTHON_LIST_HEADER = "Here is a list of functions in JSON format that you can invoke.\n\n"
PYTHON_LIST_FOOTER = (
    "\n\nYou can answer general questions or invoke tools when necessary.\n"
    "In addition to tool calls, you should also augment your responses by using the tool outputs."
)

JSON_TOOLS_HEADER = (
    "Answer the user's question by making use of the following functions if needed.\n"
    "If none of the function can be used, please say so.\n"
    "Here is a list of functions in JSON format:\n"
)
JSON_TOOLS_FOOTER = "\nReturn function calls in JSON format."

FUNCTION_TAG_HEADER = "You have access to the following functions:\n\n"
FUNCTION_TAG_FOOTER = """\
Think very carefully before calling functions.
If you choose to call a function ONLY reply in the following format with no prefix or suffix:

<function=example_function_name>{"example_name": "example_value"}</function>

Reminder:
- If looking for real time information use relevant functions before falling back to brave_search
- Function calls MUST follow the specified format, start with <function= and end with </function>
- Required parameters MUST be specified
- Only call one function at a time
- Put the entire function call reply on one line"""

_FUNCTION_DESCRIPTION_RE = re.compile(r"\{\{\s*function_description\s*\}\}")

TodayLike = _dt.date | str | Callable[[], Any] | None


def today() -> _dt.date:
    """Today's date (module-level so tests can monkeypatch it)."""
    return _dt.date.today()


def format_date(value: TodayLike = None) -> str:
    """``"21 September 2024"``: day with two digits, English month name, year (what ``%d %B %Y`` gives)."""
    if callable(value):
        value = value()
    if value is None:
        value = today()
    if isinstance(value, str):
        return value
    if isinstance(value, _dt.date):
        return f"{value.day:02d} {_MONTHS[value.month - 1]} {value.year}"
    raise InputError(f"today must be a datetime.date, a string or a callable returning one, got {value!r}")


def tool_choice_prompt(tool_choice: str) -> str:
    """The line appended to the system prompt for a tool choice (empty for auto and none)."""
    if tool_choice in ("auto", "none"):
        return ""
    if tool_choice == "required":
        return TOOL_CHOICE_REQUIRED
    return f"You MUST use the tool `{tool_choice}` to answer the user query."


def builtin_tools_block(tools: Sequence[ToolDefinition]) -> str:
    """``Environment: ipython`` plus the ``Tools:`` line of the built-ins other than code_interpreter."""
    if not tools:
        return ""
    listed = [t.tool_name for t in tools if t.is_builtin and t.tool_name != "code_interpreter"]
    if listed:
        return "Environment: ipython\nTools: " + ", ".join(listed).strip()
    return "Environment: ipython\n"


def _s(value: Any) -> str:
    """How the reference's templates print a value (``None`` prints as ``None``)."""
    return str(value)


def tojson(value: Any) -> str:
    """JSON as Jinja's ``tojson`` filter writes it: sorted keys, HTML-sensitive characters escaped."""
    text = json.dumps(value, sort_keys=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")


def python_list_function_description(tools: Sequence[ToolDefinition]) -> str:
    """The JSON-looking function list of the python-list prompt (reference layout, including its quirks:
    values are pasted without escaping and a falsy default is not shown)."""
    blocks = []
    for t in tools:
        params = t.params
        required = [name for name, p in params.items() if p.required is True]
        props = []
        for name, p in params.items():
            prop = (
                f'\n                "{name}": {{\n'
                f'                    "type": "{_s(p.param_type)}",\n'
                f'                    "description": "{_s(p.description)}"'
            )
            if p.default:
                prop += f',\n                    "default": "{_s(p.default)}"'
            prop += "\n                }"
            props.append(prop)
        blocks.append(
            "{\n"
            f'        "name": "{t.tool_name}",\n'
            f'        "description": "{_s(t.description)}",\n'
            '        "parameters": {\n'
            '            "type": "dict",\n'
            f'            "required": {tojson(required)},\n'
            '            "properties": {' + ",".join(props) + "\n"
            "            }\n"
            "        }\n"
            "    }"
        )
    return PYTHON_LIST_HEADER + "[\n    " + ",\n    ".join(blocks) + "\n]" + PYTHON_LIST_FOOTER


def _jinja_source(text: str) -> str:
    """A user system prompt used as a template: newlines normalised and one trailing newline dropped,
    as Jinja does to template source."""
    text = re.sub(r"\r\n|\r", "\n", text)
    return text[:-1] if text.endswith("\n") else text


def python_list_prompt(tools: Sequence[ToolDefinition], system_prompt: str | None = None) -> str:
    """The python-list tool prompt; ``system_prompt`` (replace behaviour) may place the function list with
    ``{{ function_description }}``."""
    template = PYTHON_LIST_INSTRUCTIONS if system_prompt is None else _jinja_source(system_prompt)
    description = python_list_function_description(tools)
    return _FUNCTION_DESCRIPTION_RE.sub(lambda _m: description, template)


def _json_value(value: Any, indent: int) -> str:
    """Pretty JSON in the reference's layout: objects one key per line, lists of scalars inline."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        inner = ",\n".join(
            f"{pad}    {json.dumps(str(k), ensure_ascii=False)}: {_json_value(v, indent + 4)}" for k, v in value.items()
        )
        return "{\n" + inner + "\n" + pad + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        inner = ",\n".join(f"{pad}    {_json_value(v, indent + 4)}" for v in value)
        return "[\n" + inner + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False)


def json_tool_definition(tool: ToolDefinition) -> str:
    """One Llama 3.1 JSON tool definition — valid JSON Schema (the reference writes ``properties`` as a list
    and every type as ``object``; see docs/prompt-formats.md)."""
    fn: dict[str, Any] = {"name": tool.tool_name}
    if tool.description is not None:
        fn["description"] = tool.description
    fn["parameters"] = tool.json_schema()
    return _json_value({"type": "function", "function": fn}, 0)


def json_tools_prompt(tools: Sequence[ToolDefinition]) -> str:
    return JSON_TOOLS_HEADER + "".join(json_tool_definition(t) + "\n" for t in tools) + JSON_TOOLS_FOOTER


def _function_tag_params(params: dict[str, ToolParam]) -> dict[str, Any]:
    return {
        name: {"param_type": p.param_type, "description": p.description, "required": p.required}
        for name, p in params.items()
    }


def function_tag_prompt(tools: Sequence[ToolDefinition]) -> str:
    parts = [FUNCTION_TAG_HEADER]
    for t in tools:
        parts.append(
            f"Use the function '{t.tool_name}' to '{_s(t.description)}':\n"
            f'{{"name": "{t.tool_name}", "description": "{_s(t.description)}", '
            f'"parameters": {tojson(_function_tag_params(t.params))}}}\n\n'
        )
    parts.append(FUNCTION_TAG_FOOTER)
    return "".join(parts)


def _split_system(messages: list[Message]) -> tuple[Message | None, list[Message]]:
    if messages and messages[0].role == "system":
        system, rest = messages[0], messages[1:]
        if rest and rest[0].role == "system":
            raise InputError(
                "with tools, a dialog may start with at most one system message; merge the system messages into one"
            )
        return system, rest
    return None, messages


def augment_llama3_1(
    messages: list[Message],
    tools: Sequence[ToolDefinition],
    tool_choice: str,
    tool_prompt_format: str,
    today: TodayLike = None,
) -> list[Message]:
    """Messages with the Llama 3.1 tool prompt added (system message, then custom tools as a user turn)."""
    system, rest = _split_system(messages)
    sys_content = ""
    if tools:
        sys_content += builtin_tools_block(tools) + "\n"
    sys_content += f"Cutting Knowledge Date: December 2023\nToday Date: {format_date(today)}"
    if system is not None:
        sys_content += "\n" + content_text(system.content, "\n")
    choice = tool_choice_prompt(tool_choice)
    if choice:
        sys_content += "\n" + choice
    out = [Message(role="system", content=sys_content)]
    custom = [t for t in tools if not t.is_builtin]
    if custom:
        if tool_prompt_format == "json":
            out.append(Message(role="user", content=json_tools_prompt(custom)))
        elif tool_prompt_format == "function_tag":
            out.append(Message(role="user", content=function_tag_prompt(custom)))
        else:
            raise InputError(
                f"Llama 3.1-style models take custom tools in 'json' or 'function_tag' format, not "
                f"{tool_prompt_format!r}; pass tool_prompt_format='json' (or None)"
            )
    return out + rest


def augment_llama3_2(
    messages: list[Message],
    tools: Sequence[ToolDefinition],
    tool_choice: str,
    tool_prompt_format: str,
    system_message_behavior: str = "append",
) -> list[Message]:
    """Messages with the Llama 3.2/3.3/4 tool prompt merged into one leading system message."""
    if system_message_behavior not in ("append", "replace"):
        raise InputError(f"system_message_behavior must be 'append' or 'replace', got {system_message_behavior!r}")
    system, rest = _split_system(messages)
    builtins = [t for t in tools if t.is_builtin]
    custom = [t for t in tools if not t.is_builtin]
    sys_content = ""
    if builtins:
        sys_content += builtin_tools_block(builtins) + "\n"
    if custom:
        if tool_prompt_format != "python_list":
            raise InputError(
                f"Llama 3.2/3.3/4 models take custom tools in 'python_list' format, not {tool_prompt_format!r}; "
                "pass tool_prompt_format='python_list' (or None)"
            )
        replacement = None
        if system is not None and system_message_behavior == "replace":
            replacement = content_text(system.content, "\n")
        sys_content += python_list_prompt(custom, replacement) + "\n"
    if system is not None and (system_message_behavior == "append" or not custom):
        sys_content += content_text(system.content, "\n")
    choice = tool_choice_prompt(tool_choice)
    if choice:
        sys_content += "\n" + choice
    return [Message(role="system", content=sys_content.strip("\n")), *rest]
