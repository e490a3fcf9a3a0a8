"""Tool prompts: token parity with llama-stack 0.2.2's meta-reference path (``chat_completion_request_to_messages``
then the model family's chat format), plus the documented fixes where the reference is broken."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any, Literal

import pytest
from _chat_helpers import PINNED_DATE, our_formatter, pin_reference_date, ref_stack_messages, ref_stack_tokens

from workbench.errors import InputError, ToolError
from workbench.formats import coerce_tool, coerce_tools, format_date, from_callable
from workbench.formats import tool_prompts as tp

WEATHER = {
    "tool_name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {
        "city": {"param_type": "string", "description": "City name, e.g. Paris", "required": True},
        "unit": {
            "param_type": "string",
            "description": "celsius or fahrenheit",
            "required": False,
            "default": "celsius",
        },
    },
}
SEARCH_DB = {
    "tool_name": "search_db",
    "description": "Søk i databasen — ünïcode “quotes”",
    "parameters": {
        "query": {"param_type": "str", "description": "free text"},
        "limit": {"param_type": "int", "description": "max rows", "required": False, "default": 0},
        "tags": {"param_type": "list[str]", "required": False, "default": ["a", "b"]},
        "exact": {"param_type": "bool", "description": "exact match", "required": False, "default": True},
        "filters": {"param_type": "dict", "description": "field -> value", "required": None},
    },
}
UNDESCRIBED = {"tool_name": "ping", "parameters": {"host": {"param_type": "string"}}}
NO_PARAMS_EMPTY = {"tool_name": "get_time", "description": "Current time", "parameters": {}}

TOOLSETS: dict[str, list[Any]] = {
    "builtins": ["brave_search", "wolfram_alpha", "code_interpreter"],
    "code_only": ["code_interpreter"],
    "custom": [WEATHER, SEARCH_DB, UNDESCRIBED],
    "mixed": ["brave_search", WEATHER, "code_interpreter", NO_PARAMS_EMPTY],
}

SYSTEMS: dict[str, Any] = {
    "no_system": None,
    "system": "You are a helpful travel agent.\nAnswer briefly.",
    "system_items": [{"type": "text", "text": "Line one."}, {"type": "text", "text": "Line two."}],
}

DIALOGS: dict[str, list[dict[str, Any]]] = {
    "single": [{"role": "user", "content": "What's the weather in Paris? <|eot_id|><|eom|> typed by the user"}],
    "multi_turn": [
        {"role": "user", "content": "Weather in 東京 and search the news 📰"},
        {
            "role": "assistant",
            "content": "",
            "stop_reason": "end_of_message",
            "tool_calls": [
                {"tool_name": "brave_search", "arguments": {"query": "news Tokyo"}, "call_id": "a"},
            ],
        },
        {"role": "tool", "call_id": "a", "content": "Tokyo news: sunny"},
        {
            "role": "assistant",
            "content": "",
            "stop_reason": "end_of_message",
            "tool_calls": [
                {"tool_name": "get_weather", "arguments": {"city": "Tokyo", "n": 2, "ok": True}, "call_id": "b"}
            ],
        },
        {"role": "ipython", "call_id": "b", "content": '{"temp": 18}'},
        {"role": "assistant", "content": "18 degrees and sunny.", "stop_reason": "end_of_turn"},
        {"role": "user", "content": "Thanks!"},
    ],
}

MODELS_31 = ["Llama3.1-8B-Instruct", "meta-llama/Llama-3.1-405B-Instruct-FP8", "Llama3.2-11B-Vision-Instruct"]
MODELS_32 = [
    "Llama3.2-3B-Instruct",
    "meta-llama/Llama-3.2-1B-Instruct",
    "Llama3.3-70B-Instruct",
    "Llama-4-Scout-17B-16E-Instruct",
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
]


@pytest.fixture(autouse=True)
def _pin_dates(monkeypatch: pytest.MonkeyPatch) -> None:
    pin_reference_date(monkeypatch)


def _dialog(system: Any, dialog: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return ([{"role": "system", "content": system}] if system is not None else []) + dialog


def _choices(tools: list[Any]) -> list[str]:
    first = tools[0] if isinstance(tools[0], str) else tools[0]["tool_name"]
    return ["auto", "required", "none", first]


def _ours(model: str, dialog, tools, choice, fmt, **kw) -> list[int]:
    return our_formatter(model).encode_dialog(dialog, tools=tools, tool_choice=choice, tool_prompt_format=fmt, **kw)


def _json_fix(ours_messages):
    """Swap the reference's (invalid) Llama 3.1 JSON tool list for ours, keeping everything else reference."""

    def replace(raw_messages: list) -> list:
        assert raw_messages[1].role == "user" and raw_messages[1].content.text.startswith("Answer the user's question")
        raw_messages[1].content.text = ours_messages[1].content
        return raw_messages

    return replace


@pytest.mark.parametrize("toolset", sorted(TOOLSETS))
@pytest.mark.parametrize("model", MODELS_32)
def test_python_list_style_parity(model: str, toolset: str) -> None:
    tools = TOOLSETS[toolset]
    for choice in _choices(tools):
        for system in SYSTEMS.values():
            for name, dialog in DIALOGS.items():
                d = _dialog(system, dialog)
                ref = ref_stack_tokens(d, tools, choice, None, model)
                assert _ours(model, d, tools, choice, None) == ref, (choice, system, name)
                assert _ours(model, d, tools, choice, "python_list") == ref


@pytest.mark.parametrize("fmt", [None, "json", "function_tag"])
@pytest.mark.parametrize("toolset", sorted(TOOLSETS))
@pytest.mark.parametrize("model", MODELS_31)
def test_llama31_style_parity(model: str, toolset: str, fmt: str | None) -> None:
    tools = TOOLSETS[toolset]
    has_custom = any(not isinstance(t, str) for t in tools)
    for choice in _choices(tools):
        for system in ("no_system", "system"):
            for name, dialog in DIALOGS.items():
                d = _dialog(SYSTEMS[system], dialog)
                ours = _ours(model, d, tools, choice, fmt)
                fix = None
                if has_custom and fmt in (None, "json"):  # documented deviation: valid JSON Schema tool list
                    ours_messages, _ = our_formatter(model).prepare_dialog(d, tools, choice, fmt)
                    fix = _json_fix(ours_messages)
                assert ours == ref_stack_tokens(d, tools, choice, fmt, model, replace=fix), (choice, system, name)


@pytest.mark.parametrize("model", ["Llama3.2-3B-Instruct", "Llama-4-Scout-17B-16E-Instruct"])
def test_system_message_replace_behavior(model: str) -> None:
    system = "Custom preamble.\n{{ function_description }}\nAlways cite tools.\n"
    d = _dialog(system, DIALOGS["single"])
    for tools in (TOOLSETS["custom"], TOOLSETS["builtins"], TOOLSETS["mixed"]):
        ref = ref_stack_tokens(d, tools, "required", None, model, system_message_behavior="replace")
        assert _ours(model, d, tools, "required", None, system_message_behavior="replace") == ref


def test_llama31_system_content_and_date() -> None:
    msgs, fmt = our_formatter("Llama3.1-8B-Instruct").prepare_dialog(
        _dialog("Be nice.", DIALOGS["single"]), ["brave_search", "code_interpreter", WEATHER], "get_weather"
    )
    assert fmt == "json"
    assert msgs[0].content == (
        "Environment: ipython\nTools: brave_search\nCutting Knowledge Date: December 2023\n"
        "Today Date: 21 September 2024\nBe nice.\nYou MUST use the tool `get_weather` to answer the user query."
    )
    assert msgs[1].role == "user" and msgs[1].content.startswith("Answer the user's question")
    assert msgs[2].content.startswith("What's the weather")


def test_llama31_json_tool_definitions_are_valid_json_schema() -> None:
    msgs, _ = our_formatter("Llama3.1-8B-Instruct").prepare_dialog(
        DIALOGS["single"], [WEATHER, SEARCH_DB, UNDESCRIBED, NO_PARAMS_EMPTY, {"tool_name": "nothing"}]
    )
    text = msgs[1].content
    assert text.startswith(tp.JSON_TOOLS_HEADER) and text.endswith("\n\nReturn function calls in JSON format.")
    body = text[len(tp.JSON_TOOLS_HEADER) : -len(tp.JSON_TOOLS_FOOTER)]
    decoder = json.JSONDecoder()
    defs, pos = [], 0
    while pos < len(body):
        obj, pos = decoder.raw_decode(body, pos)
        defs.append(obj)
        assert body[pos] == "\n"
        pos += 1
    assert [d["function"]["name"] for d in defs] == ["get_weather", "search_db", "ping", "get_time", "nothing"]
    weather = defs[0]["function"]["parameters"]
    assert weather == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "description": "celsius or fahrenheit", "default": "celsius"},
        },
        "required": ["city"],
    }
    search = defs[1]["function"]["parameters"]["properties"]
    assert search["limit"]["type"] == "integer" and search["tags"]["type"] == "array"
    assert search["exact"] == {"type": "boolean", "description": "exact match", "default": True}
    assert search["filters"]["type"] == "object"
    assert defs[1]["function"]["parameters"]["required"] == ["query", "limit", "tags", "exact"][:1]
    assert defs[4]["function"]["parameters"] == {"type": "object", "properties": {}, "required": []}
    for d in defs:  # every parameters block is a valid JSON Schema object
        params = d["function"]["parameters"]
        assert params["type"] == "object" and isinstance(params["properties"], dict)
        for prop in params["properties"].values():
            assert prop.get("type") in ("string", "integer", "number", "boolean", "array", "object", "null")


@pytest.mark.parametrize("model", ["Llama3.2-3B-Instruct", "Llama-4-Scout-17B-16E-Instruct", "Llama3.1-8B-Instruct"])
def test_tools_without_parameters(model: str) -> None:
    """The reference crashes on ``parameters=None``; we render it like an empty parameter dict."""
    fmt = "function_tag" if "3.1" in model else None
    none_params = [{"tool_name": "get_time", "description": "Current time"}]
    expected = ref_stack_tokens(DIALOGS["single"], [NO_PARAMS_EMPTY], "auto", fmt, model)
    assert _ours(model, DIALOGS["single"], none_params, "auto", fmt) == expected

    def get_time() -> str:
        """Current time"""
        return "noon"

    assert _ours(model, DIALOGS["single"], [get_time], "auto", fmt) == expected


def test_python_list_prompt_text() -> None:
    msgs, fmt = our_formatter("Llama3.2-3B-Instruct").prepare_dialog(
        _dialog("Be brief.", DIALOGS["single"]), [WEATHER], "required"
    )
    assert fmt == "python_list"
    text = msgs[0].content
    assert text.startswith("You are a helpful assistant. You have access to functions")
    assert '"default": "celsius"' in text and '"required": ["city"]' in text
    assert text.endswith("augment your responses by using the tool outputs.\nBe brief.\n" + tp.TOOL_CHOICE_REQUIRED)


def test_equivalent_tool_specs_render_identically() -> None:
    def get_weather(city: str, unit: str = "celsius") -> dict:
        """Get the current weather for a city

        Args:
            city: City name, e.g. Paris
            unit: celsius or fahrenheit
        """
        return {}

    openai = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "description": "celsius or fahrenheit", "default": "celsius"},
                },
                "required": ["city"],
            },
        },
    }
    for model in ("Llama3.2-3B-Instruct", "Llama3.1-8B-Instruct"):
        f = our_formatter(model)
        expected = f.encode_dialog(DIALOGS["single"], tools=[WEATHER])
        assert f.encode_dialog(DIALOGS["single"], tools=[get_weather]) == expected
        assert f.encode_dialog(DIALOGS["single"], tools=[openai]) == expected
        assert f.encode_dialog(DIALOGS["single"], tools=[coerce_tool(WEATHER).to_llama_stack()]) == expected


def test_tool_choice_none_keeps_definitions_without_instruction() -> None:
    f = our_formatter("Llama3.2-3B-Instruct")
    none = f.render(DIALOGS["single"], tools=[WEATHER], tool_choice="none")
    auto = f.render(DIALOGS["single"], tools=[WEATHER], tool_choice="auto")
    assert none == auto and "You MUST" not in none
    assert "You MUST use the tool `get_weather`" in f.render(
        DIALOGS["single"], tools=[WEATHER], tool_choice="get_weather"
    )


def test_model_inferred_from_tokenizer_family() -> None:
    d = DIALOGS["single"]
    assert our_formatter(None, "llama4").encode_dialog(d, tools=[WEATHER]) == ref_stack_tokens(
        d, [WEATHER], model="Llama-4-Scout-17B-16E-Instruct"
    )
    assert our_formatter(None, "llama3").encode_dialog(d, tools=[WEATHER]) == ref_stack_tokens(
        d, [WEATHER], model="Llama3.2-3B-Instruct"
    )


def test_today_is_injectable(monkeypatch: pytest.MonkeyPatch) -> None:
    f = our_formatter("Llama3.1-8B-Instruct", today=None)
    monkeypatch.setattr(tp, "today", lambda: dt.date(2025, 1, 2))
    assert "Today Date: 02 January 2025" in f.render(DIALOGS["single"], tools=["brave_search"])
    assert "Today Date: 03 March 2023" in f.render(DIALOGS["single"], tools=["brave_search"], today=dt.date(2023, 3, 3))
    assert format_date(PINNED_DATE) == "21 September 2024" and format_date("1 May") == "1 May"


def test_reference_messages_match_prepare_dialog_roles() -> None:
    d = _dialog("sys", DIALOGS["multi_turn"])
    ours, _ = our_formatter("Llama3.1-8B-Instruct").prepare_dialog(d, TOOLSETS["mixed"], "auto", "function_tag")
    ref = ref_stack_messages(d, TOOLSETS["mixed"], "auto", "function_tag", "Llama3.1-8B-Instruct").messages
    assert [m.role for m in ours] == [m.role for m in ref]
    assert [m.content for m in ours[:2]] == [m.content.text for m in ref[:2]]


def test_tool_prompt_errors() -> None:
    f31, f32 = our_formatter("Llama3.1-8B-Instruct"), our_formatter("Llama3.2-3B-Instruct")
    with pytest.raises(InputError, match="python_list"):
        f32.encode_dialog(DIALOGS["single"], tools=[WEATHER], tool_prompt_format="json")
    with pytest.raises(InputError, match="json"):
        f31.encode_dialog(DIALOGS["single"], tools=[WEATHER], tool_prompt_format="python_list")
    with pytest.raises(InputError, match="not one of the tools"):
        f32.encode_dialog(DIALOGS["single"], tools=[WEATHER], tool_choice="get_time")
    with pytest.raises(InputError, match="one system message"):
        f32.encode_dialog([{"role": "system", "content": "a"}, {"role": "system", "content": "b"}], tools=[WEATHER])
    with pytest.raises(InputError, match="not trained for tool calling"):
        our_formatter("Llama-3-8B-Instruct").encode_dialog(DIALOGS["single"], tools=[WEATHER])
    with pytest.raises(ToolError, match="built-in"):
        coerce_tools(["google_search"])
    with pytest.raises(ToolError, match="unique"):
        coerce_tools([WEATHER, WEATHER])
    with pytest.raises(ToolError, match="param_type"):
        coerce_tools([{"tool_name": "x", "parameters": {"a": {"description": "no type"}}}])
    with pytest.raises(ToolError, match="lambda"):
        coerce_tools([lambda x: x])
    with pytest.raises(ToolError, match="cannot use"):
        coerce_tools([3])


# --- schema from callables ---------------------------------------------------------------------------------


def test_schema_from_google_docstring_and_hints() -> None:
    def book_flight(
        origin: str,
        dest: str,
        passengers: int = 1,
        cabin: Literal["economy", "business"] = "economy",
        budget: float | None = None,
        stops: list[str] | None = None,
        extras: dict[str, int] | None = None,
        flexible: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> str:
        """Book a flight between two airports.

        More detail that is also part of the description.

        Args:
            origin: IATA code of the departure
                airport.
            dest (str): IATA code of the arrival airport.
            passengers: How many people.
            cabin: Cabin class.

        Returns:
            A confirmation code.
        """
        return "OK"

    t = from_callable(book_flight)
    assert t.tool_name == "book_flight" and t.function is book_flight
    assert t.description == "Book a flight between two airports. More detail that is also part of the description."
    p = t.parameters
    assert list(p) == ["origin", "dest", "passengers", "cabin", "budget", "stops", "extras", "flexible"]
    assert p["origin"].description == "IATA code of the departure airport." and p["origin"].required
    assert p["dest"].description == "IATA code of the arrival airport."
    assert (p["passengers"].param_type, p["passengers"].required, p["passengers"].default) == ("integer", False, 1)
    cabin = {"type": "string", "description": "Cabin class.", "enum": ["economy", "business"], "default": "economy"}
    assert p["cabin"].json_schema() == cabin
    assert p["budget"].param_type == "number" and p["budget"].default is None
    assert p["stops"].json_schema() == {"type": "array", "items": {"type": "string"}}
    assert p["extras"].json_schema() == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert p["flexible"].param_type == "boolean" and p["flexible"].default is False
    schema = t.json_schema()
    assert schema["required"] == ["origin", "dest"]


def test_schema_from_sphinx_and_numpy_docstrings() -> None:
    def sphinx(a: int, b: str = "x") -> None:
        """Sphinx style.

        :param a: the first
            value
        :param str b: the second
        :returns: nothing
        """

    def numpy(a: int, b) -> None:  # noqa: ANN001
        """Numpy style.

        Parameters
        ----------
        a : int
            The first.
        b
            Anything at all.

        Returns
        -------
        None
        """

    s = from_callable(sphinx)
    assert s.description == "Sphinx style."
    assert s.parameters["a"].description == "the first value" and s.parameters["b"].description == "the second"
    n = from_callable(numpy)
    assert n.description == "Numpy style."
    assert n.parameters["a"].description == "The first." and n.parameters["b"].description == "Anything at all."
    assert n.parameters["b"].param_type == "any" and n.parameters["b"].json_schema() == {
        "description": "Anything at all."
    }


def test_openai_and_llama_stack_round_trip() -> None:
    t = coerce_tool(WEATHER)
    assert coerce_tool(t.to_openai()).to_llama_stack() == coerce_tool(WEATHER).to_llama_stack()
    assert coerce_tool({"tool_name": "brave_search"}).is_builtin
    assert re.fullmatch(r"\{.*\}", json.dumps(t.to_openai()))


def test_llama31_list_system_content_is_joined_not_media() -> None:
    """The reference's Llama 3.1 path prints text items of a list system message as ``<media>``; we join the text."""
    model = "Llama3.1-8B-Instruct"
    d = _dialog(SYSTEMS["system_items"], DIALOGS["single"])
    ours_messages, _ = our_formatter(model).prepare_dialog(d, ["brave_search"])
    assert ours_messages[0].content.endswith("Today Date: 21 September 2024\nLine one.\nLine two.")

    def replace(raw_messages: list) -> list:
        assert raw_messages[0].content.text.endswith("<media>\n<media>")
        raw_messages[0].content.text = ours_messages[0].content
        return raw_messages

    assert _ours(model, d, ["brave_search"], "auto", None) == ref_stack_tokens(
        d, ["brave_search"], model=model, replace=replace
    )
