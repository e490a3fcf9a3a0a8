"""One chat route: ``batch_chat_completion`` is the only method the tool loop and the evals generate through, a
call's tools are checked once (not once per dialog), and dialogs that offer different tools share one call."""

from __future__ import annotations

from typing import Any

import pytest
from _chat_helpers import add, our_tokenizer

import workbench as wb
from workbench import chat, evals, tools
from workbench.demo.tools import get_weather
from workbench.errors import InputError, PromptTooLongError
from workbench.formats import ToolDefinition, ToolSet, make_formatter, tool_specs
from workbench.types import ChatCompletion, Message, ToolCall

PARIS = [{"role": "user", "content": "Weather in Paris?"}]
OSLO = [{"role": "user", "content": "Weather in Oslo?"}]


class OnlyChat:
    """A stand-in with nothing but ``batch_chat_completion`` (no formatter, no max_seq_len, no other attribute),
    as an adapter over a remote endpoint would be: it calls get_weather once, then answers."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def batch_chat_completion(self, dialogs: list[Any], tools: Any = None, **kwargs: Any) -> list[ChatCompletion]:
        self.calls.append({"dialogs": dialogs, "tools": tools, **kwargs})
        out = []
        for dialog in dialogs:
            if dialog[-1].role == "tool":
                message = Message(role="assistant", content=f"It is {dialog[-1].content}.")
            else:
                city = str(dialog[-1].content).split()[-1].rstrip("?")
                message = Message(role="assistant", content="", tool_calls=[ToolCall("get_weather", {"city": city})])
            out.append(ChatCompletion(message=message, tokens=[1, 2], stop_reason="end_of_turn"))
        return out


def test_a_stand_in_with_only_batch_chat_completion_drives_run_and_run_batch() -> None:
    engine = OnlyChat()
    assert [n for n in dir(engine) if not n.startswith("_")] == ["batch_chat_completion", "calls"]
    transcript = tools.run(engine, PARIS, [get_weather], max_tokens=8)
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]
    assert transcript.stop_reason == "answered" and transcript[-1].content == f"It is {get_weather('Paris')}."
    first = engine.calls[0]
    # one tool set for the call (the dialogs share it): the form a stand-in written for one set expects
    assert [t.tool_name for t in first["tools"]] == ["get_weather"] and first["tool_choice"] == "auto"
    assert first["max_tokens"] == 8

    engine = OnlyChat()
    paris, oslo = tools.run_turns(engine, [PARIS, OSLO], [get_weather], tool_choice="required")
    assert paris[-1].content == f"It is {get_weather('Paris')}." and oslo[-1].content == f"It is {get_weather('Oslo')}."
    assert [len(c["dialogs"]) for c in engine.calls] == [2, 2]  # one call per turn, both dialogs in it
    assert [c["tool_choice"] for c in engine.calls] == ["required", "auto"]  # a forced choice: first reply only

    engine = OnlyChat()  # the per-dialog loop: each dialog's turns are calls of their own, same transcripts
    assert tools.run_batch(engine, [PARIS, OSLO], [get_weather], tool_choice="required") == [paris, oslo]
    assert [len(c["dialogs"]) for c in engine.calls] == [1] * 4
    assert sorted(c["tool_choice"] for c in engine.calls) == ["auto", "auto", "required", "required"]


def test_a_stand_in_with_only_batch_chat_completion_drives_the_evals() -> None:
    engine = OnlyChat()
    cases = [
        evals.EvalCase(
            "w",
            ["get_weather"],
            [evals.Turn("Weather in Oslo?", [{"tool_name": "get_weather", "arguments": {"city": "Oslo"}}])],
            kind="single",
        ),
        evals.EvalCase(
            "j",
            ["get_weather", "get_capital"],
            [evals.Turn("Weather in Rome?", [{"tool_name": "get_weather", "arguments": {"city": "Rome"}}])],
            kind="single",
        ),
    ]
    frame = evals.run_cases(engine, cases).set_index("id")
    assert frame["exact_match"].all() and frame["answer_has_result"].all()
    # the cases offer different tools and still share each turn's one call: one tool set per dialog
    first = engine.calls[0]
    assert len(first["dialogs"]) == 2 and len(engine.calls) == 2
    assert [[t.tool_name for t in ts] for ts in first["tools"]] == [["get_weather"], ["get_weather", "get_capital"]]


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every tool check (``check_definition``, which ``coerce_tools`` runs per tool) from now on, by name."""
    seen: list[str] = []
    original = tool_specs.check_definition

    def counted(tool: ToolDefinition) -> ToolDefinition:
        seen.append(tool.tool_name)
        return original(tool)

    monkeypatch.setattr(tool_specs, "check_definition", counted)
    return seen


def _sub(a: int, b: int) -> int:
    """Subtract b from a.

    Args:
        a: The first number.
        b: The second number.
    """
    return a - b


def test_tools_are_checked_once_per_call_not_once_per_dialog(monkeypatch: pytest.MonkeyPatch) -> None:
    formatter = make_formatter(our_tokenizer("llama4"), None)
    seen = _counting(monkeypatch)
    prompts, _ = chat.prepare(formatter, [PARIS, OSLO, PARIS], [add, _sub], "required")
    assert len(prompts) == 3 and sorted(seen) == ["_sub", "add"]  # 2 tools, 3 dialogs: 2 checks, not 8
    seen.clear()
    shared, other = [add], [add, _sub]  # one tool set per dialog: each distinct set checked once
    per_dialog, _ = chat.prepare(formatter, [PARIS, OSLO, PARIS], [shared, other, shared], ["add", "auto", "auto"])
    assert sorted(seen) == ["_sub", "add", "add"]
    assert per_dialog[0] == formatter.encode_dialog(PARIS, tools=[add], tool_choice="add")
    assert per_dialog[1] == formatter.encode_dialog(OSLO, tools=[add, _sub])
    seen.clear()
    checked = tool_specs.coerce_tools([add])
    assert isinstance(checked, ToolSet) and seen == ["add"]
    assert tool_specs.coerce_tools(checked) is checked and seen == ["add"]  # a ToolSet is not checked again


def test_the_engine_checks_a_calls_tools_once_and_takes_them_per_dialog(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = wb.load()
    sampling = {"max_tokens": 3, "temperature": 0.0}
    alone = [
        engine.batch_chat_completion([PARIS], [get_weather], **sampling)[0],
        engine.batch_chat_completion([OSLO], [add], tool_choice="add", **sampling)[0],
    ]
    seen = _counting(monkeypatch)
    together = engine.batch_chat_completion(
        [PARIS, OSLO], [[get_weather], [add]], tool_choice=["auto", "add"], **sampling
    )
    assert sorted(seen) == ["add", "get_weather"]
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    seen.clear()
    engine.batch_chat_completion([PARIS, OSLO, PARIS, OSLO], [get_weather], **sampling)
    assert seen == ["get_weather"]
    with pytest.raises(InputError, match="one per dialog"):
        engine.batch_chat_completion([PARIS, OSLO], [[get_weather]], **sampling)


def test_batch_and_streamed_chat_store_each_dialogs_own_tools(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    engine = wb.load()
    store = wb.runs.store()
    offered = {"tools": [[get_weather], [add]], "tool_choice": ["auto", "add"], "max_tokens": 3}
    engine.batch_chat_completion([PARIS, OSLO], run="batch", **offered)
    list(engine.stream_batch_chat_completion([PARIS, OSLO], run="stream", **offered))
    for name in ("batch", "stream"):
        requests = sorted((r.request for r in store.rows(name)), key=lambda r: r["messages"][0]["content"])
        oslo, paris = (str(r["tools"]) for r in requests)  # each row holds its own dialog's tools, not the call's
        assert "add" in oslo and "get_weather" not in oslo and "get_weather" in paris and "add" not in paris, name
        assert [r.get("tool_choice", "auto") for r in requests] == ["add", "auto"], name


def test_a_too_long_prompt_error_names_every_row_that_does_not_fit() -> None:
    engine = wb.load()
    long = [{"role": "user", "content": "snow " * engine.max_seq_len}]
    with pytest.raises(PromptTooLongError) as refused:
        engine.batch_chat_completion([PARIS, long, OSLO, long], max_tokens=2)
    assert refused.value.rows == [1, 3] and "prompt row 1" in str(refused.value)
