"""Fuzzing the boundary where dialogs, tools and model replies enter workbench.

The properties: whatever a notebook passes as messages, tools, tool calls in history or tool_choice, the
result is a rendered prompt or a ``workbench.errors`` error naming the field (never an AttributeError from the
formatter); and whatever the model writes, ``parse_assistant`` returns a message that the next turn can render
in every prompt format — the tool loop's promise rests on that.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from _chat_helpers import our_formatter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.errors import ImageError, InputError, ToolError
from workbench.formats import coerce_messages, coerce_tools, parse_assistant
from workbench.types import Message, ToolCall

FORMATS = ("json", "function_tag", "python_list")
MODELS = ("Llama3.1-8B-Instruct", "Llama3.2-3B-Instruct", "Llama-4-Scout-17B-16E-Instruct")
FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_leaf = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=True) | st.text(max_size=8)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
junk = st.one_of(json_value, st.just(object()), st.binary(max_size=4), st.tuples(st.integers()), st.just(math.nan))
names = st.sampled_from(["get_weather", "f", "a.b", "get weather", "", "1x", "def", "x-y", "ok_2"]) | st.text(
    max_size=6
)


def _render_everywhere(messages: Any, tools: Any = None, tool_choice: Any = "auto") -> None:
    for model in MODELS:
        for fmt in (None,) if tools else FORMATS:  # with tools: the syntax the model was trained on
            our_formatter(model).encode_dialog(messages, tools=tools, tool_choice=tool_choice, tool_prompt_format=fmt)


# --- messages and history ---------------------------------------------------------------------------------------
tool_call_like = st.one_of(
    st.fixed_dictionaries({"tool_name": names | junk, "arguments": json_value | junk | st.text(max_size=10)}),
    st.fixed_dictionaries(
        {"id": st.text(max_size=4) | junk, "function": st.fixed_dictionaries({"name": names | junk}) | junk}
    ),
    st.fixed_dictionaries(
        {
            "function": st.fixed_dictionaries(
                {"name": names, "arguments": st.text(max_size=12) | json_value.map(json.dumps)}
            )
        }
    ),
    st.builds(ToolCall, tool_name=names, arguments=json_value | junk),
    junk,
)
message_like = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "ipython", "robot", ""]) | junk},
        optional={
            "content": st.text(max_size=10) | junk | st.lists(st.text(max_size=4) | junk, max_size=2),
            "tool_calls": st.lists(tool_call_like, max_size=2) | junk,
            "stop_reason": st.sampled_from(["end_of_turn", "end_of_message", "bogus"]) | junk,
            "call_id": st.text(max_size=4) | junk,
        },
    ),
    st.builds(
        Message,
        role=st.sampled_from(["user", "assistant", "tool", "robot"]) | junk,
        content=st.text(max_size=10) | junk,
        tool_calls=st.lists(tool_call_like, max_size=2) | junk,
    ),
    junk,
)


@FUZZ
@given(st.lists(message_like, min_size=1, max_size=4))
def test_any_dialog_renders_or_fails_with_a_named_input_error(dialog: list[Any]) -> None:
    try:
        checked = coerce_messages(dialog)
    except InputError as exc:
        assert str(exc).startswith("message "), exc  # the error names the message index
        return
    try:
        _render_everywhere(checked)  # accepted means every model and format can render it...
    except ImageError as exc:  # ...or, for an image item (bytes are one), refuses it by name
        assert "image" in str(exc).lower(), exc


@pytest.mark.parametrize(
    "message,needle",
    [
        (Message(role="robot", content="hi"), "message 0: field 'role' is 'robot'"),
        ({"role": "assistant", "tool_calls": "f(x=1)"}, "message 0: field 'tool_calls' must be a list"),
        ({"role": "assistant", "tool_calls": [{"arguments": {}}]}, "message 0: field 'tool_calls'[0]: tool call"),
        ({"role": "assistant", "tool_calls": [{"tool_name": "f", "arguments": "{not json"}]}, "not valid JSON"),
        ({"role": "assistant", "tool_calls": [{"tool_name": "f", "arguments": "[1, 2]"}]}, "must be a dict"),
        ({"role": "assistant", "tool_calls": [{"tool_name": "f", "arguments": {"x": math.nan}}]}, "not a JSON number"),
        ({"role": "assistant", "tool_calls": [{"tool_name": "get weather"}]}, "cannot be written as a tool call"),
        ({"role": "assistant", "tool_calls": [{"function": "f"}]}, "'function' of an OpenAI-style tool call"),
        ({"role": "user", "content": 3}, "field 'content' is a int"),
        ({"role": "user", "stop_reason": "later"}, "field 'stop_reason' is 'later'"),
    ],
)
def test_history_errors_name_the_message_and_field(message: Any, needle: str) -> None:
    with pytest.raises(InputError) as info:
        coerce_messages([message])
    assert needle in str(info.value)


def test_history_error_names_the_right_index() -> None:
    dialog = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"tool_name": "f"}]},
        {"role": "tool", "content": "ok"},
        Message(role="boss", content="x"),
    ]
    with pytest.raises(InputError, match=r"^message 3: field 'role' is 'boss'"):
        coerce_messages(dialog)


def test_deeply_nested_history_arguments_are_refused_not_crashing() -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(InputError, match="nests deeper"):
        coerce_messages([{"role": "assistant", "tool_calls": [{"tool_name": "f", "arguments": {"x": deep}}]}])


# --- tools and tool_choice ----------------------------------------------------------------------------------------
schema_like = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("object") | junk},
        optional={
            "properties": st.dictionaries(
                names,
                st.fixed_dictionaries(
                    {},
                    optional={
                        "type": st.sampled_from(["string", "integer", "array", "object"])
                        | st.lists(st.text(max_size=3))
                        | junk,
                        "description": st.text(max_size=6) | junk,
                        "default": json_value | junk,
                    },
                )
                | junk,
                max_size=3,
            )
            | junk,
            "required": st.lists(names, max_size=2) | junk,
        },
    ),
    junk,
)
tool_like = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": names | junk}, optional={"description": st.text(max_size=6) | junk, "parameters": schema_like}
            ),
        }
    ),
    st.fixed_dictionaries(
        {"tool_name": names | junk},
        optional={
            "description": st.text(max_size=6) | junk,
            "parameters": st.dictionaries(
                names,
                st.fixed_dictionaries(
                    {"param_type": st.sampled_from(["str", "int"]) | junk},
                    optional={"required": st.booleans() | junk, "default": json_value | junk},
                )
                | junk,
                max_size=2,
            )
            | junk,
        },
    ),
    st.sampled_from(["brave_search", "code_interpreter", "nope"]),
    junk,
)


@FUZZ
@given(
    st.lists(tool_like, min_size=1, max_size=3),
    st.sampled_from(["auto", "required", "none"])
    | junk
    | st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["function", "auto", "x"]) | junk,
            "function": st.fixed_dictionaries({}, optional={"name": names | junk}) | junk,
            "name": names | junk,
        },
    ),
)
def test_any_tools_render_or_fail_with_a_tool_error(tool_specs: list[Any], tool_choice: Any) -> None:
    try:
        tools = coerce_tools(tool_specs)
    except ToolError:
        return
    dialog = [{"role": "user", "content": "hi"}]
    try:
        _render_everywhere(dialog, tools, tool_choice)
    except InputError as exc:  # only the tool_choice may still be wrong
        assert "tool_choice" in str(exc), exc


@pytest.mark.parametrize(
    "spec,needle",
    [
        ({"type": "function", "function": {"name": "get weather"}}, "cannot be written as a tool call"),
        (
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": [1]}}},
            "'parameters.properties' of tool 'f' must be an object",
        ),
        (
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": "string"}}},
            },
            "'parameters.properties.x' of tool 'f' must be a JSON Schema object",
        ),
        (
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "x"}}},
            "'parameters.required' of tool 'f' must be a list",
        ),
        ({"tool_name": "f", "parameters": {"my arg": {"param_type": "str"}}}, "parameter 'my arg' of tool 'f'"),
    ],
)
def test_tool_schema_errors_name_the_field(spec: dict, needle: str) -> None:
    with pytest.raises(ToolError) as info:
        coerce_tools([spec])
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "choice,needle",
    [
        ({"type": "function"}, "tool_choice['name'] must be a tool name"),
        ({"type": "function", "function": "f"}, "tool_choice['function'] must be a dict"),
        ({"type": "function", "function": {"name": 3}}, "tool_choice['function']['name'] must be a tool name"),
        ({"type": "tool"}, "tool_choice['type'] is 'tool'"),
    ],
)
def test_malformed_tool_choice_dicts(choice: dict, needle: str) -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    with pytest.raises(InputError) as info:
        our_formatter("Llama3.2-3B-Instruct").encode_dialog([{"role": "user", "content": "x"}], tools, choice)
    assert needle in str(info.value)
    ok = our_formatter("Llama3.2-3B-Instruct").encode_dialog(
        [{"role": "user", "content": "x"}], tools, {"type": "function", "function": {"name": "f"}}
    )
    assert ok


# --- model replies --------------------------------------------------------------------------------------------------
fragment = st.sampled_from(
    [
        "[f(a=1)]",
        '[get_weather(city="Paris',
        '{"name": "f", "parameters": {"x": ',
        '{"name": "g", "parameters": {}}',
        '<function=h>{"k": 1}</function>',
        "<function=bad name>{}",
        "[f(x=NaN)]",
        '{"name": "f", "parameters": {"x": NaN}}',
        '{"name": "f", "arguments": "{\\"a\\": 1}"}',
        'brave_search.call(query="x")',
        "<|python_start|>",
        "<|python_end|>",
        "<|python_tag|>",
        "print('hi')",
        "[[[[[[",
        "]]]",
        '"',
        "'",
        "(",
        ")",
        "{",
        "}",
        " ",
        "\n",
        "text",
        "1e999",
        '{"type": "function", "function": {"name": "z", "arguments": {}}}',
        "[a.b(c=2)]",
        "\x00",
        "<|eot|>",
        "<|eom|>",
    ]
)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(fragment | st.text(max_size=6), max_size=12).map("".join))
def test_any_reply_parses_and_renders_on_the_next_turn(reply: str) -> None:
    message = parse_assistant(reply)
    assert message.role == "assistant" and isinstance(message.content, str)
    assert message.tool_calls == [] or message.parse_error is None
    dialog = [{"role": "user", "content": "q"}, message]
    if message.tool_calls:
        dialog += [{"role": "tool", "call_id": c.call_id, "content": "ok"} for c in message.tool_calls]
    _render_everywhere(coerce_messages(dialog))


@pytest.mark.parametrize(
    "reply",
    [
        '[f(city="Paris)]',
        '{"name": "f", "parameters": {"x": NaN}}',
        '<function=get weather>{"a": 1}</function>',
        '{"name": "f", "parameters": {"city": "Par',
    ],
)
def test_unusable_calls_are_content_with_a_parse_error(reply: str) -> None:
    message = parse_assistant(reply)
    assert message.tool_calls == [] and message.content == reply and message.parse_error


def test_deeply_nested_call_is_a_parse_error_not_a_crash() -> None:
    reply = '{"name": "f", "parameters": {"x": ' + "[" * 200 + "]" * 200 + "}}"
    message = parse_assistant(reply)
    assert message.tool_calls == [] and "nests deeper" in message.parse_error


@pytest.mark.timeout(60)  # hang guard: the old parser was quadratic on such replies (seconds to minutes)
@pytest.mark.parametrize(
    "piece",
    ['{"name": "f", "parameters": {"a": ', "{\"name\": 'x', ", '[{"name": "g", ', '{"type": "function", "x": [1, 2'],
)
def test_parsing_a_512kb_reply_of_json_like_fragments_terminates(piece: str) -> None:
    reply = piece * (512 * 1024 // len(piece)) + " then [f(a=1)]"
    message = parse_assistant(reply)
    assert message.content.startswith(piece.strip()) and len(message.content) > 500_000


def test_calls_after_json_like_data_are_still_found() -> None:
    reply = 'data: {"name": x} and {"type": "function", oops} ' * 2000 + '{"name": "f", "parameters": {"a": 1}}'
    message = parse_assistant(reply)
    assert [(c.tool_name, c.arguments) for c in message.tool_calls] == [("f", {"a": 1})]
