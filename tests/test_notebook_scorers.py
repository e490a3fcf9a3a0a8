"""The scorers the experiment notebooks show, run on hand-made rows: a call with the wrong argument and an answer
that names the wrong place fail; an item that never answers fails rather than dropping out.  The code run is the
cells' own (``notebooks/cells``), not a copy."""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from workbench.demo.tools import (
    convert_currency,
    get_capital,
    get_local_time,
    get_population,
    get_random_joke,
    get_weather,
)
from workbench.types import Message, ToolCall

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _cells(module: str) -> Any:
    if str(NOTEBOOKS) not in sys.path:
        sys.path.insert(0, str(NOTEBOOKS))  # the cell lists import their shared parts as cells.common
    spec = importlib.util.spec_from_file_location(f"cells.{module}", NOTEBOOKS / "cells" / f"{module}.py")
    found = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(found)
    return found


@pytest.fixture(scope="module")
def nb08() -> dict[str, Any]:
    cells = _cells("nb08_experiments")
    namespace: dict[str, Any] = {"json": json, "inspect": inspect}
    namespace.update(
        {
            f.__name__: f
            for f in (get_weather, get_local_time, get_population, get_capital, convert_currency, get_random_joke)
        }
    )
    exec(cells.CASES_CELL, namespace)  # noqa: S102  (the notebook's own cell, as the notebook runs it)
    exec(cells.SCORER_CELL, namespace)  # noqa: S102
    return namespace


def _row(item: str, turn: int, calls: list, output: str = "", earlier: list | None = None) -> dict[str, Any]:
    """A stored row as wb.runs.score hands it over: this turn's calls and text, the earlier turns in the request."""
    messages = [{"role": "user", "content": "question", "tool_calls": []}]
    for made, result in earlier or []:
        messages.append(
            {"role": "assistant", "content": "", "tool_calls": [{"tool_name": n, "arguments": a} for n, a in made]}
        )
        messages.append({"role": "tool", "content": result, "tool_calls": []})
    return {"item": item, "turn": turn, "calls": calls, "output": output, "request": {"messages": messages}}


def test_08_items_are_the_templates_by_place_and_population_asks_about_countries(nb08):
    cases = nb08["CASES"]
    assert len(cases) == 32 and nb08["ITEMS"] == list(cases)
    question, tool, place = cases["population/Peru"]
    assert tool is get_population and place == "Peru" and "Peru" in question
    assert all(tool is not get_population or place in nb08["COUNTRIES"] for _, tool, place in cases.values())


def test_08_right_call_wants_the_right_tool_with_the_right_argument(nb08):
    score = nb08["score"]
    right = _row("population/Peru", 0, [("get_population", {"country": "Peru"})])
    assert score(right)["right_call"] is True
    wrong_place = _row("population/Peru", 0, [("get_population", {"country": "Paris"})])
    assert score(wrong_place)["right_call"] is False
    wrong_name = _row("weather/Paris", 0, [("get_weather", {"town": "Paris"})])
    assert score(wrong_name)["right_call"] is False
    wrong_tool = _row("raining/Tokyo", 0, [("get_local_time", {"city": "Tokyo"})])
    assert score(wrong_tool)["right_call"] is False
    # the final row judges the dialog's *first* call, read from the request
    later = _row(
        "weather/Oslo", 1, [], "The weather in Oslo is x.", earlier=[([("get_weather", {"city": "Lima"})], "x")]
    )
    assert score(later)["right_call"] is False


def test_08_restates_wants_the_value_for_that_place_and_the_place(nb08):
    score = nb08["score"]
    value = get_population("Peru")
    call = [([("get_population", {"country": "Peru"})], value)]
    good = _row("population/Peru", 1, [], f"The population of Peru is {value}.", earlier=call)
    assert score(good)["restates"] is True and score(good)["answer_words"] == 7
    wrong_city = _row("population/Peru", 1, [], f"The population of MH is {value}.", earlier=call)
    assert score(wrong_city)["restates"] is False
    other_value = _row("population/Peru", 1, [], f"The population of Peru is {get_population('Norway')}.", earlier=call)
    assert get_population("Norway") != value and score(other_value)["restates"] is False


def test_08_an_item_that_never_answers_fails_instead_of_leaving_n(nb08):
    score = nb08["score"]
    calling = [("get_weather", {"city": "Lima"})]
    last = _row("weather/Lima", 2, calling, earlier=[(calling, "0 C and windy"), (calling, "0 C and windy")])
    scores = score(last)
    assert scores == {"right_call": True, "restates": False, "repeats_call": True, "answer_words": 0}
    direct = _row("time/Oslo", 0, [], "It is late.")  # answered without calling: scored, not dropped
    assert score(direct) == {"right_call": False, "restates": False, "repeats_call": False, "answer_words": 3}


def test_08_repeats_call_counts_the_same_call_twice_in_one_reply_or_across_turns(nb08):
    score = nb08["score"]
    twice = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]
    assert score(_row("weather/Paris", 0, twice))["repeats_call"] is True
    two_places = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert score(_row("weather/Paris", 0, two_places))["repeats_call"] is False


@pytest.fixture(scope="module")
def nb02_check() -> Any:
    namespace: dict[str, Any] = {}
    exec(_cells("nb02_tool_experiments").CHECK_CELL, namespace)  # noqa: S102  (the notebook's own cell)
    return namespace["check"]


def _transcript(question: str, calls: list[tuple[str, dict]], results: list[str], answer: str) -> list[Message]:
    made = [ToolCall(name, arguments, f"call-{i}") for i, (name, arguments) in enumerate(calls)]
    tool_messages = [Message("tool", result, call_id=call.call_id) for call, result in zip(made, results)]
    return [Message("user", question), Message("assistant", "", made), *tool_messages, Message("assistant", answer)]


def test_02_check_passes_a_right_dialog(nb02_check):
    right = _transcript(
        "What's the weather in Lima?",
        [("get_weather", {"city": "Lima"})],
        ["0 C and windy"],
        "The weather in Lima is 0 C and windy.",
    )
    assert nb02_check("What's the weather in Lima?", "get_weather", right) == ""


def test_02_check_fails_a_wrong_argument_and_a_wrong_city_answer(nb02_check):
    question = "What's the weather in Lima?"
    wrong_argument = _transcript(
        question,
        [("get_weather", {"city": "Lisbon"})],
        [get_weather("Lisbon")],
        f"The weather in Lisbon is {get_weather('Lisbon')}.",
    )
    assert nb02_check(question, "get_weather", wrong_argument) == "wrote ['Lisbon'] into the call: not in the question"
    wrong_city = _transcript(
        question, [("get_weather", {"city": "Lima"})], ["0 C and windy"], "The weather in tiger is 0 C and windy."
    )
    assert nb02_check(question, "get_weather", wrong_city) == "the answer leaves out ['Lima']"
    wrong_tool = _transcript(question, [("get_local_time", {"city": "Lima"})], ["22:34"], "It is 22:34 in Lima.")
    assert nb02_check(question, "get_weather", wrong_tool) == "called get_local_time, not get_weather"
    called_anyway = _transcript("Tell me a story.", [("get_capital", {"country": "Peru"})], ["Lima"], "Lima.")
    assert nb02_check("Tell me a story.", None, called_anyway) == "called get_capital though no offered tool fits"
