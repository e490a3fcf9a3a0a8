"""BFCL on workbench: BFCL's own data, prompt and checker (oracles: bfcl-eval's handler code, imported here only)."""

from __future__ import annotations

import re
import sys
from typing import Any
from unittest import mock

import pandas as pd
import pytest

import workbench as wb
from workbench.errors import ConfigError, InputError
from workbench.evals import bfcl
from workbench.evals.bfcl import package
from workbench.evals.bfcl.__main__ import main as bfcl_main
from workbench.evals.bfcl.runner import encode_bfcl_prompt
from workbench.formats import render_tool_call
from workbench.formats.tokenizer import Tokenizer

NAMED = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
LIMIT = 4


@pytest.fixture(scope="module")
def engine():
    return wb.load()


@pytest.fixture(scope="module")
def bfcl_handlers():
    """BFCL's own prompt code, as an oracle: its parsers need tree-sitter, which the checker does not (stubbed)."""
    package.bfcl()
    stubbed = [n for n in ("tree_sitter", "tree_sitter_java", "tree_sitter_javascript") if n not in sys.modules]
    sys.modules.update({name: mock.MagicMock() for name in stubbed})
    try:
        from bfcl_eval.constants.enums import ModelStyle
        from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
        from bfcl_eval.model_handler.local_inference.llama import LlamaHandler
        from bfcl_eval.model_handler.utils import convert_to_tool, system_prompt_pre_processing_chat_model

        yield {
            "LlamaHandler": LlamaHandler,
            "system": system_prompt_pre_processing_chat_model,
            "convert_to_tool": convert_to_tool,
            "mapping": GORILLA_TO_OPENAPI,
            "style": ModelStyle,
        }
    finally:
        for name in stubbed:
            sys.modules.pop(name, None)


# ------------------------------------------------------------------------------------------- a scripted model
def _pick(options: list[Any], required: bool) -> Any:
    """One of BFCL's possible answers: left out when "" (optional) is allowed and the parameter is not required."""
    if "" in options and not required:
        return None
    rest = [o for o in options if o != ""]
    return _value(rest[0]) if rest else None


def _value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v for k, o in value.items() if (v := _pick(o, False) if isinstance(o, list) else o) is not None}
    if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        return [_value(x) for x in value]
    return value


def truth_reply(entry: dict[str, Any]) -> str:
    """The ground truth as the model would write it (python-list syntax, what both prompts ask for)."""
    if entry["ground_truth"] is None:
        return "None of the given functions can answer this question."
    docs = {f["name"]: f for f in entry["checker_function"]}
    calls = []
    for answer in entry["ground_truth"]:
        for name, args in answer.items():
            required = set(docs[name]["parameters"].get("required", []))
            picked = {a: v for a, o in args.items() if (v := _pick(o, a in required)) is not None}
            calls.append({"tool_name": name, "arguments": picked})
    return "[" + ", ".join(render_tool_call(c, "python_list")[1:-1] for c in calls) + "]"  # one list, as BFCL asks


class ScriptedEngine:
    """The demo engine's formatter and tokenizer, with replies looked up by the entry's question in the prompt."""

    def __init__(self, real: Any, replies: dict[str, str]) -> None:
        self.formatter, self.tokenizer, self.max_seq_len = real.formatter, real.tokenizer, real.max_seq_len
        self.replies = replies
        self.batches: list[int] = []

    def batch_completion(self, prompts: list[list[int]], **sampling: Any) -> list[wb.Completion]:
        self.batches.append(len(prompts))
        out = []
        for ids in prompts:
            text = self.tokenizer.decode(ids)
            hits = [reply for question, reply in self.replies.items() if question in text]
            assert len(hits) == 1, "each prompt holds exactly one scripted question"
            out.append(wb.Completion(text=hits[0], tokens=[1, 2, 3], stop_reason="end_of_turn"))
        return out


def _question(entry: dict[str, Any]) -> str:
    return entry["question"][0][-1]["content"]


@pytest.mark.parametrize("prompt", ["official", "bfcl"])
def test_ground_truth_replies_score_100_percent_in_one_batch(engine, prompt):
    entries = [e for c in NAMED for e in package.load_entries(c, LIMIT)]
    fake = ScriptedEngine(engine, {_question(e): truth_reply(e) for e in entries})
    results = bfcl.run(fake, NAMED, limit=LIMIT, prompt=prompt)
    assert fake.batches == [len(NAMED) * LIMIT]  # every entry of every category in one engine call
    assert list(results["id"]) == [e["id"] for e in entries]  # BFCL's order, first LIMIT of each category
    assert results["valid"].all(), results.loc[~results["valid"], ["id", "error"]].to_string()
    assert results["error"].isna().all()
    summary = bfcl.summarize(results)
    assert list(summary["category"]) == list(NAMED)
    assert (summary["accuracy"] == 1.0).all() and (summary["entries"] == LIMIT).all()
    first = results.iloc[0]
    assert first["calls"] == [{"calculate_triangle_area": {"base": 10, "height": 5}}]


def test_wrong_replies_are_marked_wrong_by_bfcls_checker(engine):
    entries = {c: package.load_entries(c, 1)[0] for c in ("simple_python", "parallel", "irrelevance")}
    replies = {
        _question(entries["simple_python"]): "[calculate_triangle_area(base=10, height=6)]",  # wrong value
        _question(entries["parallel"]): truth_reply(entries["parallel"]).split("), ")[0] + ")]",  # one call short
        _question(entries["irrelevance"]): "[calculate_triangle_area(base=1, height=2)]",  # a call where none fits
    }
    results = bfcl.run(ScriptedEngine(engine, replies), list(entries), limit=1).set_index("category")
    assert not results["valid"].any()
    assert "height" in results.loc["simple_python", "error"]
    assert "Wrong number of functions" in results.loc["parallel", "error"]
    assert "function call" in results.loc["irrelevance", "error"]
    assert results.loc["irrelevance", "calls"] == [{"calculate_triangle_area": {"base": 1, "height": 2}}]


# ------------------------------------------------------------------------------------------- prompts against BFCL's
def test_bfcl_prompt_is_bfcls_llama_handler_prompt(engine, bfcl_handlers):
    for category in NAMED:
        for entry in package.load_entries(category, 2):
            ours = bfcl.encode_entry(engine, entry, "bfcl")
            messages = bfcl_handlers["system"]([dict(m) for m in entry["question"][0]], entry["function"], entry["id"])
            handler = type("H", (), {"model_name": "meta-llama/Llama-4-Scout-17B-16E-Instruct"})()
            text = bfcl_handlers["LlamaHandler"]._format_prompt(handler, messages, entry["function"])
            assert ours == _encode_with_specials(engine.tokenizer, text), entry["id"]
            assert engine.tokenizer.decode(ours) == text


def test_bfcl_prompt_on_a_llama3_tokenizer_is_bfcls_llama3_rendering(bfcl_handlers):
    tokenizer = Tokenizer.for_checkpoint(None, "llama3")
    entry = package.load_entries("parallel_multiple", 1)[0]
    ours = encode_bfcl_prompt(tokenizer, bfcl.package.bfcl_messages(entry["question"][0], entry["function"]))
    messages = bfcl_handlers["system"]([dict(m) for m in entry["question"][0]], entry["function"], entry["id"])
    handler = type("H", (), {"model_name": "meta-llama/Llama-3.2-3B-Instruct"})()
    text = bfcl_handlers["LlamaHandler"]._format_prompt(handler, messages, entry["function"])
    assert "<|eot_id|>" in text and ours == _encode_with_specials(tokenizer, text)


def _encode_with_specials(tokenizer: Any, text: str) -> list[int]:
    """How a tokenizer reading BFCL's prompt string with special tokens enabled encodes it."""
    specials = tokenizer.special_tokens
    pattern = "(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")"
    ids: list[int] = []
    for piece in re.split(pattern, text):
        if piece in specials:
            ids.append(specials[piece])
        elif piece:
            ids += tokenizer.encode(piece)
    return ids


def test_function_docs_map_to_json_schema_as_bfcls_gorilla_to_openapi(bfcl_handlers):
    style = bfcl_handlers["style"].OPENAI_COMPLETIONS
    seen: set[str] = set()
    for category in NAMED:
        for entry in package.load_entries(category, None):
            for function in entry["function"]:
                ours = bfcl.to_openai_tool(function)["function"]
                theirs = bfcl_handlers["convert_to_tool"]([function], bfcl_handlers["mapping"], style)[0]
                theirs = theirs.get("function", theirs)
                assert {**ours, "name": theirs["name"]} == theirs, function["name"]
                seen |= {p.get("type") for p in function["parameters"]["properties"].values()}
    assert {"dict", "float", "tuple", "any", "array"} <= seen  # BFCL's dialect was exercised


def test_official_prompt_is_the_models_own_tool_format(engine):
    entry = package.load_entries("multiple", 1)[0]
    tools = [bfcl.to_openai_tool(f) for f in entry["function"]]
    assert bfcl.encode_entry(engine, entry, "official") == engine.formatter.encode_dialog(
        entry["question"][0], tools=tools
    )
    text = engine.tokenizer.decode(bfcl.encode_entry(engine, entry, "official"))
    assert all(f["name"] in text for f in entry["function"])
    assert "You are an expert in composing functions." in text  # the official Llama 4 / 3.2 tool prompt


# ------------------------------------------------------------------------------------------- the demo model
@pytest.mark.slow
def test_demo_model_end_to_end_both_prompts_summary_plot_and_cli(engine, tmp_path, capsys):
    frames = [bfcl.run(engine, NAMED, limit=2, prompt=p, max_tokens=40, progress=False) for p in ("official", "bfcl")]
    results = pd.concat(frames, ignore_index=True)
    assert list(results.columns[:5]) == ["id", "category", "calls", "valid", "error"]
    assert len(results) == 2 * len(NAMED) * 2
    for _, row in results.iterrows():
        assert isinstance(row["calls"], list) and all(isinstance(c, dict) and len(c) == 1 for c in row["calls"])
        assert isinstance(row["valid"], bool) and row["tokens"] > 0 and row["prompt_tokens"] > 0
        assert row["valid"] == pd.isna(row["error"])  # error text exactly when BFCL says wrong
    summary = bfcl.summarize(results)
    assert list(summary.columns) == ["prompt", "category", "accuracy", "low", "high", "correct", "entries"]
    assert (summary["low"] <= summary["accuracy"]).all() and (summary["accuracy"] <= summary["high"]).all()
    assert len(summary) == 2 * len(NAMED) and summary["accuracy"].between(0, 1).all()
    fig = bfcl.plot(summary, path=str(tmp_path / "bfcl.png"))
    assert (tmp_path / "bfcl.png").stat().st_size > 0 and fig.axes
    assert (
        bfcl_main(
            [
                "--categories",
                "simple_python",
                "irrelevance",
                "--limit",
                "1",
                "--max-tokens",
                "16",
                "--results",
                str(tmp_path / "rows.jsonl"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert '"entries": 4' in out and "irrelevance" in out
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 4


def test_a_run_resumed_with_more_entries_computes_only_the_new_ones(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    cats = ("simple_python", "irrelevance")
    first = bfcl.run(engine, cats, limit=1, max_tokens=32, progress=False, run="bfcl")
    assert not first["cached"].any()
    more = bfcl.run(engine, cats, limit=3, max_tokens=32, progress=False, run="bfcl")
    assert more.groupby("category", sort=False)["cached"].apply(list).to_dict() == {
        c: [True, False, False] for c in cats
    }  # the first entry of each category came from the store
    plain = bfcl.run(engine, cats, limit=3, max_tokens=32, progress=False)
    pd.testing.assert_frame_equal(more.drop(columns="cached"), plain.drop(columns="cached"))
    stored = wb.runs.rows("bfcl")
    assert len(stored) == 6 and sorted(stored["item"]) == sorted(more["id"])  # each entry's id is its item
    assert stored.set_index("item")["valid"].to_dict() == more.set_index("id")["valid"].to_dict()  # its score


def test_a_prompt_longer_than_max_seq_len_is_scored_wrong_not_generated(engine):
    entry = package.load_entries("simple_python", 1)[0]
    fake = ScriptedEngine(engine, {_question(entry): truth_reply(entry)})
    fake.max_seq_len = 64
    results = bfcl.run(fake, ["simple_python"], limit=1)
    assert fake.batches == [] and not results["valid"][0]
    assert "max_seq_len is 64" in results["error"][0]


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"categories": ["simple_pyhton"]}, "unknown BFCL category 'simple_pyhton'"),
        ({"categories": ["memory_kv"]}, "agentic or a composite"),
        ({"categories": ["simple_java"]}, "Java/JavaScript source text"),
        ({"categories": []}, "categories is empty"),
        ({"categories": ["irrelevance", "irrelevance"]}, "name a category twice"),
        ({"limit": 0}, "limit must be a positive number"),
        ({"prompt": "chatml"}, "prompt must be 'official'"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ],
)
def test_bad_input_is_a_clear_input_error(engine, kwargs, message):
    with pytest.raises(InputError, match=re.escape(message)):
        bfcl.run(engine, **{"categories": ["simple_python"], **kwargs})


def test_summarize_and_cli_reject_what_they_cannot_use(capsys):
    with pytest.raises(bfcl.BFCLError, match="DataFrame returned by bfcl.run"):
        bfcl.summarize(pd.DataFrame({"x": [1]}))
    assert bfcl_main(["--categories", "memory_kv", "--limit", "1"]) == 2
    assert "agentic or a composite" in capsys.readouterr().err


def test_missing_bfcl_eval_names_the_install_command(monkeypatch):
    package.bfcl.cache_clear()
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # import fails as if not installed
    try:
        with pytest.raises(ConfigError, match=re.escape("pip install --no-deps bfcl-eval==2026.3.23")):
            package.bfcl()
    finally:
        package.bfcl.cache_clear()
