"""The tool-call evaluation harness: case files, the batched loop and its scoring.

The engine here is scripted (it replies with fixed texts through the real formatter and parser), so
each scoring rule is checked against replies whose right or wrong answer is known by construction.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from workbench import chat, evals
from workbench.errors import InputError
from workbench.formats import make_formatter
from workbench.formats.tokenizer import Tokenizer, bundled_tokenizer_path
from workbench.types import Completion


class ScriptedEngine:
    """Replies with scripted texts, keyed by the last user message of each dialog; records prompts."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        self.formatter = make_formatter(Tokenizer(bundled_tokenizer_path("llama4")), None)
        self.script = {k: list(v) for k, v in script.items()}
        self.batches: list[int] = []

    def batch_completion(self, prompts, **sampling):
        self.batches.append(len(prompts))
        out = []
        for prompt in prompts:
            text = self.formatter.tokenizer.decode(prompt)
            last_user = text.rsplit("<|header_start|>user<|header_end|>\n\n", 1)[1].split("<|eot|>")[0]
            reply = self.script[last_user].pop(0)
            stop = "end_of_message" if reply.startswith("[") else "end_of_turn"
            out.append(Completion(text=reply, tokens=self.formatter.tokenizer.encode(reply), stop_reason=stop))
        return out

    def batch_chat_completion(self, dialogs, tools=None, **kwargs):
        return chat.batch_chat_completion(self, dialogs, tools, **kwargs)


def case(id_, question, calls, tools=("get_weather", "get_capital", "convert_currency"), **turn):
    turns = [evals.Turn(question, calls, **turn)]
    return evals.EvalCase(id_, list(tools), turns, kind="single" if calls else "no_tool")


WEATHER = {"tool_name": "get_weather", "arguments": {"city": "Oslo"}}


def test_scoring_of_right_and_wrong_calls_and_answers():
    from workbench.demo.tools import get_weather

    oslo = get_weather("Oslo")
    engine = ScriptedEngine(
        {
            "right": ['[get_weather(city="Oslo")]', f"The weather in Oslo is {oslo}."],
            "wrong-arg": ['[get_weather(city="Bergen")]', "The weather in Bergen is fine."],
            "wrong-name": ['[get_capital(country="Oslo")]', "It is Oslo."],
            "no-call": ["It is sunny."],
            "answer-misses": ['[get_weather(city="Oslo")]', "The weather is nice."],
            "direct-ok": ["Sorry, I can't help with that."],
            "direct-bad": ['[get_weather(city="Oslo")]', "Done."],
            "broken": ["[get_weather(city=Oslo)]", "Sorry."],
            "numbers": ["[convert_currency(to_currency='EUR', amount=5, from_currency='USD')]", "ok"],
        }
    )
    cases = [
        case("right", "right", [WEATHER]),
        case("wrong-arg", "wrong-arg", [WEATHER]),
        case("wrong-name", "wrong-name", [WEATHER]),
        case("no-call", "no-call", [WEATHER]),
        case("answer-misses", "answer-misses", [WEATHER]),
        case("direct-ok", "direct-ok", []),
        case("direct-bad", "direct-bad", []),
        case("broken", "broken", [WEATHER]),
        case(
            "numbers",
            "numbers",
            [
                {
                    "tool_name": "convert_currency",
                    "arguments": {"amount": 5.0, "from_currency": "USD", "to_currency": "EUR"},
                }
            ],
        ),
    ]
    df = evals.run_cases(engine, cases).set_index("id")
    assert df.loc["right", "exact_match"] and df.loc["right", "answer_has_result"]
    assert df.loc["wrong-arg", "name_match"] and not df.loc["wrong-arg", "exact_match"]
    assert not df.loc["wrong-name", "name_match"] and not df.loc["wrong-name", "exact_match"]
    assert not df.loc["no-call", "exact_match"] and not df.loc["no-call", "answer_has_result"]
    assert df.loc["answer-misses", "exact_match"] and not df.loc["answer-misses", "answer_has_result"]
    assert df.loc["direct-ok", "direct_answer"] and pd.isna(df.loc["direct-ok", "exact_match"])
    assert not df.loc["direct-bad", "direct_answer"]
    assert df.loc["broken", "parse_failures"] == 1 and not df.loc["broken", "exact_match"]
    assert df.loc["numbers", "exact_match"]  # 5 == 5.0, keyword order irrelevant
    assert df.loc["right", "replies"] == 2 and df.loc["right", "tokens"] > 0
    # every case of a step went in one batch, whatever tools each case offers
    assert engine.batches[0] == len(cases)
    summary = evals.summarize(df.reset_index())
    tool_cases = 7
    assert summary.loc[0, "exact_match"] == pytest.approx(3 / tool_cases)  # right, answer-misses, numbers
    assert summary.loc[0, "direct_answer"] == pytest.approx(0.5)


def test_two_calls_are_order_insensitive_and_fixed_results_are_fed_back():
    rome = {"tool_name": "get_weather", "arguments": {"city": "Rome"}}
    engine = ScriptedEngine({"q": ['[get_weather(city="Rome"), get_weather(city="Oslo")]', "Oslo: A. Rome: B."]})
    cases = [evals.EvalCase("two", ["get_weather"], [evals.Turn("q", [WEATHER, rome], tool_results=["A", "B"])])]
    row = evals.run_cases(engine, cases).iloc[0]
    assert row["exact_match"] and row["answer_has_result"]
    assert evals.calls_match([WEATHER, rome], [rome, WEATHER])
    assert not evals.calls_match([WEATHER, WEATHER], [WEATHER, rome])


def test_multi_turn_cases_ask_the_next_question_after_the_answer():
    engine = ScriptedEngine(
        {
            "first": ['[get_weather(city="Oslo")]', "Oslo is X."],
            "second": ['[get_capital(country="Peru")]', "The capital of Peru is Lima."],
        }
    )
    turns = [
        evals.Turn("first", [WEATHER], tool_results=["X"]),
        evals.Turn("second", [{"tool_name": "get_capital", "arguments": {"country": "Peru"}}]),
    ]
    row = evals.run_cases(engine, [evals.EvalCase("mt", ["get_weather", "get_capital"], turns)]).iloc[0]
    assert row["turns"] == 2 and row["replies"] == 4 and row["exact_match"] and row["answer_has_result"]


def test_cases_round_trip_through_jsonl_and_bad_files_say_what_is_wrong(tmp_path):
    cases = evals.synthetic_cases(10, seed=1)
    assert {c.kind for c in cases} == {"single", "double", "two_round", "no_tool", "small_talk"}
    path = evals.save_cases(cases, tmp_path / "cases.jsonl")
    assert evals.load_cases(path) == cases
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "tools": [], "turns": []}\n')
    with pytest.raises(InputError, match="turns"):
        evals.load_cases(bad)
    bad.write_text("not json\n")
    with pytest.raises(InputError, match=r"bad.jsonl:1"):
        evals.load_cases(bad)
    bad.write_text(json.dumps({"id": "x", "tools": ["t"], "turns": [{"user": "q", "expected_calls": [{}]}]}) + "\n")
    with pytest.raises(InputError, match="tool_name"):
        evals.load_cases(bad)


def test_unknown_tool_names_are_refused_before_running():
    engine = ScriptedEngine({})
    with pytest.raises(InputError, match="unknown tool"):
        evals.run_cases(engine, [evals.EvalCase("x", ["nope"], [evals.Turn("q", [])])])
    assert engine.batches == []


def test_summaries_group_by_setting_and_plot(tmp_path):
    rows = pd.DataFrame(
        {
            "quantization": ["none", "none", "int4_mixed", "int4_mixed"],
            "exact_match": [True, False, False, None],
            "name_match": [True, True, False, None],
            "answer_has_result": [True, False, False, None],
            "direct_answer": [None, None, None, True],
            "parse_failures": [0, 0, 1, 0],
            "tokens": [10, 20, 30, 40],
        }
    )
    summary = evals.summarize(rows, by=["quantization"]).set_index("quantization")
    assert summary.loc["none", "exact_match"] == 0.5 and summary.loc["int4_mixed", "exact_match"] == 0.0
    assert summary.loc["int4_mixed", "direct_answer"] == 1.0 and summary.loc["int4_mixed", "parse_failure_rate"] == 0.5
    fig = evals.plot_summary(summary.reset_index(), by="quantization", path=str(tmp_path / "acc.png"))
    # every rate carries its number of cases and a Wilson interval, and the settings keep their order
    assert list(evals.summarize(rows, by=["quantization"])["quantization"]) == ["none", "int4_mixed"]
    none = summary.loc["none"]
    assert (none.tool_cases, none.direct_cases, none.cases) == (2, 0, 2)
    assert none.exact_match_low < 0.5 < none.exact_match_high and pd.isna(none.direct_answer_low)
    assert (
        evals.rate_table(summary.reset_index(), by="quantization").loc["none", "exact_match"] == "0.50 [0.09, 0.91] n=2"
    )
    assert evals.setting_labels(pd.DataFrame({"quantization": ["int4_mixed", float("nan")]})) == [
        "quantization=int4_mixed",
        "baseline",
    ]
    assert (tmp_path / "acc.png").stat().st_size > 1000 and len(fig.axes[0].patches) == 6
