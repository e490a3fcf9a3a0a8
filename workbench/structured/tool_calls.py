"""Grammars that force an assistant reply to be a well-formed call of one of the offered tools.

The call is written in the model's own syntax (the ``tool_prompt_format`` of the prompt), exactly as
:func:`workbench.formats.render_tool_call` renders calls in prompts, and its arguments follow the tool's
parameter schema (llguidance's JSON-schema grammar embedded as ``%json`` in a Lark grammar):

* ``python_list`` (Llama 3.2/3.3/4): ``[name(a=1, b="x"), other(c=[1, 2])]`` — keyword arguments in declared
  order, required ones always present, optional ones optional; one or more calls;
* ``json`` (Llama 3.1): ``{"type": "function", "name": "name", "parameters": {...}}``;
* ``function_tag``: ``<function=name>{...}</function>``;
* built-in search tools, whatever the format: ``brave_search.call(query="...")``.

Values are JSON, which the project's parser reads in python lists too (``true``/``false``/``null``); string
escapes are limited to those that mean the same in Python and JSON.  ``code_interpreter`` (free-form code)
cannot be constrained and is left out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from workbench.errors import FormatError
from workbench.structured.spec import JSON_OPTIONS, OutputFormat

# Escapes that decode to the same character in a JSON string and a Python string literal.
_ARGUMENT_OPTIONS = {**JSON_OPTIONS, "json_allowed_escapes": '"\\bfnrt'}
_UNCONSTRAINABLE = ("code_interpreter",)


def tool_call_format(tools: Sequence[Any], tool_choice: str, tool_prompt_format: str) -> OutputFormat:
    """The grammar of a reply that calls ``tool_choice`` (a tool name) or, for ``"required"``, any offered tool."""
    if tool_choice in ("auto", "none"):
        raise FormatError(
            f"constrain_tools=True forces a tool call, which contradicts tool_choice={tool_choice!r}; use "
            "tool_choice='required' (any offered tool) or the name of one tool"
        )
    offered = [t for t in tools if t.tool_name not in _UNCONSTRAINABLE]
    if tool_choice != "required":
        offered = [t for t in offered if t.tool_name == tool_choice]
    if not offered:
        raise FormatError(
            "constrain_tools=True needs at least one tool other than code_interpreter (free-form code cannot be "
            f"constrained); tool_choice={tool_choice!r} leaves none"
        )
    rules: list[str] = []
    calls = [_call_rule(t, i, tool_prompt_format, rules) for i, t in enumerate(offered)]
    rules.append("call: " + " | ".join(calls))
    if tool_prompt_format == "python_list":
        start = 'start: "[" call (", " call)* "]"'
    else:
        start = "start: call"
    lark = "\n".join([start, *rules]) + "\n"
    import llguidance

    return OutputFormat("tool_call", llguidance.LLMatcher.grammar_from_lark(lark))


def _call_rule(tool: Any, i: int, fmt: str, rules: list[str]) -> str:
    """Append the rules of one tool's call and return the rule name."""
    name = tool.tool_name
    rule = f"call_{i}"
    if tool.is_builtin:  # brave_search.call(query="...") in every format
        rules.append(f'{rule}: {_lit(name + ".call(query=")} %json {_schema({"type": "string"})} ")"')
        return rule
    schema = tool.json_schema()
    if fmt == "json":
        prefix = json.dumps({"type": "function", "name": name, "parameters": 0})[:-2]  # up to '"parameters": '
        rules.append(f'{rule}: {_lit(prefix)} %json {_schema(_closed(schema))} "}}"')
    elif fmt == "function_tag":
        rules.append(f'{rule}: {_lit(f"<function={name}>")} %json {_schema(_closed(schema))} "</function>"')
    else:
        rules.append(f'{rule}: {_lit(name + "(")} {_keyword_args(tool, i, rules)} ")"')
    return rule


def _keyword_args(tool: Any, i: int, rules: list[str]) -> str:
    """Rules for ``a=1, b="x"``: declared order, required parameters present, optional ones optional."""
    params = list(tool.params.items())
    if not params:
        return '""'
    for j, (pname, param) in enumerate(params):
        rules.append(f"arg_{i}_{j}: {_lit(pname + '=')} %json {_schema(param.json_schema())}")

    made: set[str] = set()

    def tail(j: int, started: bool) -> str:  # the arguments from j on; `started`: one was already written
        rule = f"args_{i}_{j}_{int(started)}"
        if rule in made:
            return rule
        made.add(rule)
        if j == len(params):
            rules.append(f'{rule}: ""')
            return rule
        item = ('", " ' if started else "") + f"arg_{i}_{j} {tail(j + 1, True)}"
        skip = "" if params[j][1].required else f" | {tail(j + 1, started)}"
        rules.append(f"{rule}: {item}{skip}")
        return rule

    return tail(0, False)


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameter object with no keys beyond the declared ones."""
    return {**schema, "additionalProperties": False}


def _schema(schema: dict[str, Any]) -> str:
    return json.dumps({**schema, "x-guidance": _ARGUMENT_OPTIONS})


def _lit(text: str) -> str:
    return json.dumps(text)
