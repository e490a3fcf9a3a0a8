"""The ``--tools unseen`` split: cases over held-out generated tools, and its scoring (argument names from the
offered schema, answers that restate every field of a JSON result) against scripted replies."""

from __future__ import annotations

import json

import jsonschema
import pytest

from workbench import chat, evals
from workbench.demo.toolgen import tool_bank
from workbench.demo.tools import DEMO_TOOLS
from workbench.evals.__main__ import main
from workbench.formats import make_formatter, render_tool_calls
from workbench.formats.tokenizer import Tokenizer, bundled_tokenizer_path
from workbench.types import Completion


def test_unseen_cases_offer_only_heldout_generated_tools():
    cases, tools = evals.unseen_cases(40, seed=3)
    again, _ = evals.unseen_cases(40, seed=3)
    assert [c.to_dict() for c in cases] == [c.to_dict() for c in again]  # deterministic
    heldout = {t.name: t for t in tool_bank("heldout")}
    training = {t.name for t in tool_bank("train")}
    assert {c.kind for c in cases} == set(evals.unseen.UNSEEN_KINDS)
    for case in cases:
        assert case.tools and set(case.tools) <= set(heldout) and not set(case.tools) & (training | set(DEMO_TOOLS))
        assert all(name in tools for name in case.tools)
        for turn in case.turns:
            for call in turn.expected_calls:
                assert call["tool_name"] in case.tools
                jsonschema.validate(call["arguments"], heldout[call["tool_name"]].schema()["function"]["parameters"])
        if case.kind in ("no_tool", "small_talk"):
            assert all(not t.expected_calls for t in case.turns)
    # the training split exists for comparison and uses training tools
    train_cases, _ = evals.unseen_cases(10, split="train")
    assert all(set(c.tools) <= training for c in train_cases)


class OracleEngine:
    """Answers each case's question with its expected calls (or with renamed argument names), then restates
    the tool result it was given; keyed by the last user message."""

    def __init__(self, cases, rename: bool = False) -> None:
        self.formatter = make_formatter(Tokenizer(bundled_tokenizer_path("llama4")), None)
        self.expected = {t.user: t.expected_calls for c in cases for t in c.turns}
        self.rename = rename
        self.max_seq_len = 8192

    def batch_completion(self, prompts, **sampling):
        out = []
        for prompt in prompts:
            text = self.formatter.tokenizer.decode(prompt)
            last_user = text.rsplit("<|header_start|>user<|header_end|>\n\n", 1)[1].split("<|eot|>")[0]
            after = text.rsplit("<|header_start|>user<|header_end|>", 1)[1]
            calls = self.expected[last_user]
            if calls and "<|header_start|>ipython" not in after:
                if self.rename:
                    calls = [{**c, "arguments": {f"the_{k}": v for k, v in c["arguments"].items()}} for c in calls]
                reply, stop = render_tool_calls(calls, "python_list"), "end_of_message"
            elif calls:  # restate what the tools returned: every field of a JSON object
                results = [r.split("<|eom|>")[0].strip() for r in after.split("ipython<|header_end|>")[1:]]
                values = []
                for r in results:
                    value = json.loads(r) if r[:1] == "{" else r
                    values += [str(v) for v in value.values()] if isinstance(value, dict) else [r]
                reply, stop = "Here it is: " + ", ".join(values) + ".", "end_of_turn"
            else:
                reply, stop = "Sorry, I can't help with that.", "end_of_turn"
            out.append(Completion(text=reply, tokens=self.formatter.tokenizer.encode(reply), stop_reason=stop))
        return out

    def batch_chat_completion(self, dialogs, tools=None, **kwargs):
        return chat.batch_chat_completion(self, dialogs, tools, **kwargs)


@pytest.mark.parametrize("rename", [False, True], ids=["schema-names", "renamed"])
def test_scoring_on_unseen_tools(rename):
    cases, tools = evals.unseen_cases(25, seed=5)
    results = evals.run_cases(OracleEngine(cases, rename=rename), cases, tools=tools)
    summary = evals.summarize(results).iloc[0]
    assert summary["name_match"] == 1.0 and summary["direct_answer"] == 1.0
    if rename:  # the right tools with argument names the schema does not have
        assert summary["arg_names_from_schema"] == 0.0 and summary["exact_match"] == 0.0
    else:
        assert summary["arg_names_from_schema"] == 1.0 and summary["exact_match"] == 1.0
        assert summary["answer_has_result"] == 1.0
    assert summary["parse_failure_rate"] == 0.0


def test_an_answer_missing_a_field_of_an_object_result_does_not_restate_it():
    from workbench.evals.harness import _needles

    assert _needles('{"level": 3, "status": "green"}') == ["3", "green"]
    assert _needles("12 C and sunny") == ["12 C and sunny"] and _needles("1077") == ["1077"]


@pytest.mark.slow
def test_the_command_runs_the_unseen_split_on_the_demo_model(capsys):
    assert main(["--tools", "unseen", "--cases", "5", "--seed", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["cases"] == 5
    row = summary["summary"][0]
    assert {
        "exact_match",
        "name_match",
        "arg_names_from_schema",
        "answer_has_result",
        "direct_answer",
    } <= set(row)
