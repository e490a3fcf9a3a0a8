"""BFCL multi-turn on workbench: BFCL's own backends, checker and Llama handlers are the oracles (imported here)."""

from __future__ import annotations

import ast
import copy
import html
import importlib
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import workbench as wb
from workbench.evals import bfcl
from workbench.evals.bfcl import multi_turn, package
from workbench.evals.bfcl.__main__ import main as bfcl_main
from workbench.evals.bfcl.backends import Backends, call_string
from workbench.evals.bfcl.multi_turn import encode_handler_prompt
from workbench.evals.bfcl.replay import GroundTruthEngine, parse_ground_truth
from workbench.formats import render_tool_call
from workbench.formats.formatter import Formatter
from workbench.formats.tokenizer import Tokenizer
from workbench.types import ToolCall

CATEGORIES = bfcl.MULTI_TURN_CATEGORIES
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def oracle() -> Any:
    """BFCL's checker and its call executor, imported as BFCL's eval runner uses them."""
    package.bfcl()
    return (
        importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"),
        importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"),
    )


@pytest.fixture(scope="module")
def truth() -> dict[str, Any]:
    """The 800 entries and their ground truth parsed into calls (once for the module)."""
    entries = {e["id"]: e for c in CATEGORIES for e in package.load_multi_turn_entries(c, None)}
    return {"entries": entries, "parsed": {i: parse_ground_truth(e) for i, e in entries.items()}}


def bfcl_verdict(oracle: Any, entry: dict[str, Any], calls: list[list[list[str]]]) -> dict[str, Any]:
    """BFCL's checker on call strings, directly (a model name of its own, so no state is shared)."""
    checker, utils = oracle
    name = f"oracle_{uuid.uuid4().hex}"
    try:
        return checker.multi_turn_checker(calls, entry["ground_truth"], copy.deepcopy(entry), entry["id"][:-2], name)
    finally:
        for key in [k for k in vars(utils) if k.startswith(name)]:
            del vars(utils)[key]


def as_steps(turns: list[list[str]]) -> list[list[list[str]]]:
    """Ground-truth strings per turn as the checker takes a model's: one step per turn (none for an empty turn)."""
    return [[turn] if turn else [] for turn in turns]


# ------------------------------------------------------------------------------------------- scoring
def test_ground_truth_replay_scores_all_800_entries_as_bfcls_checker_does(oracle, truth):
    engine = GroundTruthEngine(CATEGORIES, parsed=truth["parsed"])
    results = bfcl.run(engine, CATEGORIES, progress=False)
    assert len(results) == 800 and list(results.groupby("category", sort=False).size()) == [200] * 4
    # every entry in flight at once: each engine call is one step of every entry still running
    assert engine.rows[0] == 800 and engine.calls == max(results["steps"])
    entries = truth["entries"]
    expected = {i: bfcl_verdict(oracle, e, as_steps(e["ground_truth"]))["valid"] for i, e in entries.items()}
    assert results.set_index("id")["valid"].to_dict() == expected  # the ground truth's own verdicts
    assert results["valid"].all() and results["error"].isna().all() and not results["force_terminated"].any()
    summary = bfcl.summarize(results)
    assert list(summary["category"]) == [*CATEGORIES, "multi_turn_overall"]
    assert summary["accuracy"].tolist() == [1.0] * 5 and (summary["low"] > 0.97).all()
    first = results.iloc[0]
    assert first["turns"] == len(entries[first["id"]]["question"])
    assert first["calls"][0] == [
        ["cd(folder='document')", "mkdir(dir_name='temp')", "mv(source='final_report.pdf', destination='temp')"]
    ]


@pytest.mark.parametrize(("model", "fmt"), [("Llama3.2-3B-Instruct", "python_list"), ("Llama3.1-8B-Instruct", "json")])
def test_every_ground_truth_call_survives_the_models_syntax_and_our_parser(truth, model, fmt):
    """prompt="bfcl" decodes replies with the model's own parser: every call of the 800 entries' ground truth,
    written in the handler's syntax, comes back as the same name and arguments."""
    formatter = Formatter(Tokenizer.for_checkpoint(None, "llama3"), model)
    calls = [c for turns in truth["parsed"].values() for turn in turns for c in turn]
    assert len(calls) > 2000
    for call in calls:
        text = render_tool_call(call, fmt)
        parsed = formatter.decode_assistant(text, "end_of_turn").tool_calls
        assert [(p.tool_name, p.arguments) for p in parsed] == [(call.tool_name, call.arguments)], text


def _perturb(entry_id: str, kind: str) -> tuple[GroundTruthEngine, dict[str, Any], list[list[list[str]]]]:
    category = entry_id.rsplit("_", 1)[0]
    engine = GroundTruthEngine([category], limit=int(entry_id.rsplit("_", 1)[1]) + 1)
    engine.script = {k: v if k == entry_id else [[]] * 30 for k, v in engine.script.items()}
    steps = engine.script[entry_id]
    first = steps[0]
    if kind == "dropped":
        steps[0] = first[:-1]
    elif kind == "wrong_argument":
        call = first[-1]
        key = next(iter(call.arguments))
        steps[0] = [*first[:-1], ToolCall(call.tool_name, {**call.arguments, key: "wrong_value.txt"})]
    else:  # an extra state-changing call
        steps[0] = [*first, ToolCall("touch", {"file_name": "extra.txt"})]
    entry = package.load_multi_turn_entries(category, None)[int(entry_id.rsplit("_", 1)[1])]
    calls = [[call_string(c.tool_name, c.arguments) for c in step] for step in steps if step]
    return engine, entry, calls


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("dropped", "multi_turn:instance_state_mismatch"),
        ("wrong_argument", "multi_turn:instance_state_mismatch"),
        ("extra", "multi_turn:instance_state_mismatch"),
    ],
)
def test_perturbed_replays_fail_with_bfcls_error_type(oracle, kind, error):
    engine, entry, calls = _perturb("multi_turn_base_0", kind)
    results = bfcl.run(engine, ["multi_turn_base"], limit=1, progress=False)
    row = results.iloc[0]
    assert not row["valid"] and row["error"] == error
    per_turn = [[s] for s in calls[:1]] + [[s] for s in calls[1:]]
    assert bfcl_verdict(oracle, entry, per_turn)["error_type"] == row["error"]  # what BFCL says of these calls
    assert row["failed_turn"] == 0 and row["explanation"].startswith("turn 0: GorillaFileSystem's state differs")
    assert "  root: model " in row["explanation"]  # the attribute that differs, both values
    states = bfcl.turn_states(row)
    assert states[0]["differs"] == ["GorillaFileSystem.root"] and states[0]["calls"] == calls[0]


def test_a_missing_result_is_explained_and_a_silent_turn_is_empty(oracle):
    engine = GroundTruthEngine(["multi_turn_base"], limit=2)
    engine.script["multi_turn_base_1"][0] = []  # turn 0 answered without a call
    steps = engine.script["multi_turn_base_0"]
    reads = [k for k, step in enumerate(steps) if any(c.tool_name == "grep" for c in step)]
    steps[reads[0]] = [c for c in steps[reads[0]] if c.tool_name != "grep"]  # a read-only call left out
    results = bfcl.run(engine, ["multi_turn_base"], limit=2, progress=False).set_index("id")
    assert results.loc["multi_turn_base_0", "error"] == "multi_turn:execution_response_mismatch"
    assert "expected result(s) missing" in results.loc["multi_turn_base_0", "explanation"]
    assert results.loc["multi_turn_base_1", "error"] == "multi_turn:empty_turn_model_response"


def test_a_turn_past_bfcls_step_limit_force_terminates_the_entry(oracle):
    engine = GroundTruthEngine(["multi_turn_base"], limit=1)
    engine.script["multi_turn_base_0"] = [[ToolCall("pwd", {})]] * 40
    row = bfcl.run(engine, ["multi_turn_base"], limit=1, progress=False).iloc[0]
    limit = multi_turn.step_limit()
    assert row["force_terminated"] and row["steps"] == limit + 1 and row["turns"] == 1
    assert row["error"] == "multi_turn:force_terminated" and "force-terminated" in row["explanation"]


# ------------------------------------------------------------------------------------------- executing calls
BAD_CALLS = [
    ("no_such_method", {}),  # a missing method
    ("cd", {"folder": "document", "extra": 1}),  # an extra argument
    ("mkdir", {}),  # a missing argument
    ("cd", {"folder": "nowhere"}),  # a failing call: BFCL's own error text
    ("_load_scenario", {"scenario": {}}),  # a private method
    ("send_message", {"receiver_id": "x", "message": "m"}),  # another class's method (not involved)
    ("exit", {}),  # a name BFCL refuses
]


@pytest.mark.parametrize(("name", "arguments"), BAD_CALLS)
def test_bad_calls_answer_what_bfcls_executor_answers(oracle, name, arguments):
    entry = package.load_multi_turn_entries("multi_turn_base", 1)[0]
    ours = Backends.for_entry(entry).execute(name, arguments)
    label = f"oracle_{uuid.uuid4().hex}"
    try:
        theirs, _ = oracle[1].execute_multi_turn_func_call(
            [call_string(name, arguments)], entry["initial_config"], entry["involved_classes"], label, entry["id"]
        )
    finally:
        for key in [k for k in vars(oracle[1]) if k.startswith(label)]:
            del vars(oracle[1])[key]
    assert ours == theirs[0]
    assert ours.startswith("Error during execution: ") or name == "cd"


def test_no_code_path_evaluates_model_text():
    folder = ROOT / "workbench" / "evals" / "bfcl"
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec", "compile"), f"{path.name}:{node.lineno}"
        assert "decode_execute" not in path.read_text()  # BFCL's decoders eval model text
    # a reply whose text is code is only text: the turn ends, nothing runs
    engine = GroundTruthEngine(["multi_turn_base"], limit=1)
    engine.script["multi_turn_base_0"] = [[ToolCall("__import__", {"name": "os"})], []]
    with mock.patch("builtins.__import__", wraps=__import__) as spy:
        row = bfcl.run(engine, ["multi_turn_base"], limit=1, progress=False).iloc[0]
    assert all(call.args[:1] != ("os",) or call.args[1:2] != (None,) for call in spy.call_args_list)
    assert row["log"][0][0]["results"] == ["Error during execution: name '__import__' is not defined"]


# ------------------------------------------------------------------------------------------- prompts against BFCL's
@pytest.fixture(scope="module")
def handlers() -> Any:
    package.bfcl()
    stubbed = [n for n in ("tree_sitter", "tree_sitter_java", "tree_sitter_javascript") if n not in sys.modules]
    sys.modules.update({name: mock.MagicMock() for name in stubbed})
    try:
        from bfcl_eval.model_handler.local_inference.llama import LlamaHandler
        from bfcl_eval.model_handler.local_inference.llama_3_1 import LlamaHandler_3_1

        yield {"python_list": LlamaHandler, "json": LlamaHandler_3_1}
    finally:
        for name in stubbed:
            sys.modules.pop(name, None)


def _encode_with_specials(tokenizer: Any, text: str) -> list[int]:
    specials = tokenizer.special_tokens
    ids: list[int] = []
    rest = text
    while rest:
        hits = [(rest.find(s), s) for s in specials if rest.find(s) >= 0]
        if not hits:
            return ids + tokenizer.encode(rest)
        at, token = min(hits, key=lambda h: (h[0], -len(h[1])))
        ids += (tokenizer.encode(rest[:at]) if at else []) + [specials[token]]
        rest = rest[at + len(token) :]
    return ids


class _Recorder:
    """Our side: BFCL prompts as ids (captured), replies from the ground truth (recorded as text)."""

    def __init__(self, replay: GroundTruthEngine) -> None:
        self.replay, self.prompts, self.texts = replay, [], []
        self.formatter, self.tokenizer, self.max_seq_len = replay.formatter, replay.tokenizer, 10**6

    def batch_completion(self, prompts: list[list[int]], **kw: Any) -> list[Any]:
        out = self.replay.batch_completion(prompts, **kw)
        self.prompts += prompts
        self.texts += [c.text for c in out]
        return out


@pytest.mark.parametrize(
    ("model", "family", "hf_name"),
    [
        ("Llama3.1-8B-Instruct", "llama3", "meta-llama/Llama-3.1-8B-Instruct-FC"),
        ("Llama3.2-3B-Instruct", "llama3", "meta-llama/Llama-3.2-3B-Instruct-FC"),
        ("Llama-4-Scout-17B-16E-Instruct", "llama4", "meta-llama/Llama-4-Scout-17B-16E-Instruct-FC"),
    ],
)
def test_bfcl_prompts_equal_bfcls_llama_handlers_at_every_step(handlers, model, family, hf_name):
    tokenizer = Tokenizer.for_checkpoint(None, family)
    stand_in = type("E", (), {"formatter": Formatter(tokenizer, model), "tokenizer": tokenizer, "max_seq_len": 1})
    style = multi_turn.handler_style(stand_in)
    assert style == ("json" if "3.1" in model else "python_list")
    ours = _Recorder(
        GroundTruthEngine(["multi_turn_miss_func"], limit=1, engine=stand_in, one_call_per_reply=style == "json")
    )
    row = bfcl.run(ours, ["multi_turn_miss_func"], limit=1, prompt="bfcl", progress=False).iloc[0]
    assert row["valid"], row["explanation"]

    theirs: list[str] = []
    replies = iter(ours.texts)

    def query(inference_data: dict[str, Any]) -> Any:  # BFCL's prompt, and our model's reply to it
        theirs.append(handler._format_prompt(inference_data["message"], inference_data["function"]))
        usage = mock.Mock(prompt_tokens=0, completion_tokens=0)
        return mock.Mock(choices=[mock.Mock(text=next(replies))], usage=usage), 0.0

    handler = handlers[style](f"{hf_name[:-3]}_{uuid.uuid4().hex[:8]}", 0.001, hf_name, True)
    handler._query_prompting = query  # the one method that would reach a server
    entry = package.load_multi_turn_entries("multi_turn_miss_func", 1)[0]
    handler.inference_multi_turn_prompting(copy.deepcopy(entry), False, True)
    assert len(theirs) == len(ours.prompts) == row["steps"]
    holdout = int(next(iter(entry["missed_function"])))
    assert any("I have updated some more functions" in t for t in theirs)  # the holdout turn is among them
    assert sum(len(t) for t in row["log"][:holdout]) < len(theirs)
    for k, (text, ids) in enumerate(zip(theirs, ours.prompts)):
        assert ids == _encode_with_specials(tokenizer, text), f"step {k}"
    assert ("<|start_header_id|>ipython" in theirs[-1]) or ("<|header_start|>ipython" in theirs[-1])


def _stand_in(max_seq_len: int) -> Any:
    tokenizer = Tokenizer.for_checkpoint(None, "llama3")
    return type(
        "E",
        (),
        {"formatter": Formatter(tokenizer, "Llama3.2-3B-Instruct"), "tokenizer": tokenizer, "max_seq_len": max_seq_len},
    )


def test_a_prompt_outgrowing_the_context_ends_the_entry_with_the_reason():
    probe = _Recorder(GroundTruthEngine(["multi_turn_base"], limit=1, engine=_stand_in(10**6)))
    bfcl.run(probe, ["multi_turn_base"], limit=1, prompt="bfcl", progress=False)
    fits = len(probe.prompts[0]) + 1  # the first step fits, the prompt after its tool results does not
    replay = GroundTruthEngine(["multi_turn_base"], limit=1, engine=_stand_in(fits))
    row = bfcl.run(replay, ["multi_turn_base"], limit=1, prompt="bfcl", progress=False).iloc[0]
    assert not row["valid"] and row["error"] == "multi_turn:inference_error" and row["steps"] == 1
    assert f"max_seq_len is {fits}" in row["explanation"]


def test_an_unparsable_reply_ends_the_turn_and_nothing_raises():
    class Broken(GroundTruthEngine):
        def batch_completion(self, prompts: Any, *, item: Any, **kw: Any) -> list[Any]:
            self.rows.append(len(prompts))
            return [
                wb.Completion(text="[cd(folder=__import__('os'))]", tokens=[1], stop_reason="end_of_turn") for _ in item
            ]

    engine = Broken(["multi_turn_base"], limit=1, engine=_stand_in(10**6))
    row = bfcl.run(engine, ["multi_turn_base"], limit=1, prompt="bfcl", progress=False).iloc[0]
    assert row["steps"] == row["turns"] == 4 and row["calls"] == [[], [], [], []]  # each turn ended at once
    assert row["error"] == "multi_turn:empty_turn_model_response" and row["log"][0][0]["reply"].startswith(
        "[cd(folder=__import__"
    )


def test_official_holdout_turn_adds_the_functions_and_bfcls_fc_message():
    seen: list[tuple[set[str], str]] = []

    class Watched(GroundTruthEngine):
        def batch_chat_completion(self, dialogs: Any, tools: Any = None, **kw: Any) -> list[Any]:
            tool_set = tools[0] if tools and isinstance(tools[0], list) else tools
            users = [m for m in dialogs[0] if m.role == "user"]
            seen.append(({t.tool_name for t in tool_set}, users[-1].content))
            return super().batch_chat_completion(dialogs, tools, **kw)

    entry = package.load_multi_turn_entries("multi_turn_miss_func", 1)[0]
    ((turn, held_out),) = entry["missed_function"].items()
    names = {f["name"] for f in held_out}
    row = bfcl.run(Watched(["multi_turn_miss_func"], limit=1), ["multi_turn_miss_func"], limit=1).iloc[0]
    assert row["valid"]
    prompts = importlib.import_module("bfcl_eval.constants.default_prompts")
    holdout = [k for k, (_, user) in enumerate(seen) if user == prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC]
    assert holdout and holdout[0] == sum(len(t) for t in row["log"][: int(turn)])  # the first step of that turn
    assert all(not names & tools for tools, _ in seen[: holdout[0]]) and all(names <= t for t, _ in seen[holdout[0] :])


def test_encode_handler_prompt_puts_special_tokens_by_id_only():
    tokenizer = Tokenizer.for_checkpoint(None, "llama3")
    ids = encode_handler_prompt(tokenizer, [{"role": "user", "content": "say <|eot_id|>"}], [], "python_list")
    assert ids.count(tokenizer.special_tokens["<|eot_id|>"]) == 1  # typed text stays text


# ------------------------------------------------------------------------------------------- CLI, bad input, store
def test_cli_runs_multi_turn_categories(capsys, monkeypatch):
    monkeypatch.setattr("workbench.evals.bfcl.__main__.load", lambda *a, **k: GroundTruthEngine(CATEGORIES, limit=1))
    assert bfcl_main(["--categories", *CATEGORIES, "--limit", "1", "--prompt", "official"]) == 0
    out = capsys.readouterr().out
    assert "multi_turn_overall" in out and '"entries": 4' in out


def test_agentic_categories_are_refused_with_the_supported_list():
    with pytest.raises(bfcl.BFCLError, match="multi_turn_base"):
        bfcl.run(None, ["memory_kv"])


def test_explanations_and_turns_of_a_run_the_store_lacks_warn_or_name_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    with pytest.warns(wb.errors.StoreWarning, match="could not be stored"):
        assert wb.runs.put_explanations("nothing-here", {"a": "why"}) is False
    with pytest.raises(wb.errors.InputError, match="no run named 'nothing-here'"):
        wb.runs.set_turns("nothing-here", [([1, 2], "a", 0)])


KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import workbench as wb
    from workbench.evals import bfcl
    engine = wb.load(max_seq_len=8192)
    real, calls = engine.batch_chat_completion, []
    def counted(*a, **k):
        out = real(*a, **k)
        calls.append(1)
        if len(calls) == int(sys.argv[1]):
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    engine.batch_chat_completion = counted
    bfcl.run(engine, ["multi_turn_base"], limit=1, max_tokens=4, progress=False, run="mt")
    """
)


@pytest.mark.slow
def test_a_killed_run_resumes_from_the_store(tmp_path, monkeypatch):
    store = tmp_path / "runs.sqlite"
    env = {**os.environ, "WORKBENCH_STORE": str(store), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", KILL_SCRIPT, "2"], env=env, cwd=tmp_path, capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    monkeypatch.setenv("WORKBENCH_STORE", str(store))
    assert len(wb.runs.rows("mt")) == 2  # the two steps answered before the kill
    engine = wb.load(max_seq_len=8192)
    fresh = []
    real = engine.batch_chat_completion

    def counted(*a: Any, **k: Any) -> Any:
        out = real(*a, **k)
        fresh.extend(not r.cached for r in out)
        return out

    monkeypatch.setattr(engine, "batch_chat_completion", counted)
    row = bfcl.run(engine, ["multi_turn_base"], limit=1, max_tokens=4, progress=False, run="mt").iloc[0]
    assert fresh[:2] == [False, False] and all(fresh[2:])  # resumed: the first two from the store
    stored = wb.runs.rows("mt")
    assert len(stored) == row["steps"] and set(stored["item"]) == {"multi_turn_base_0"}
    assert stored["turn"].tolist() == list(range(row["steps"]))
    assert stored["valid"].dropna().tolist() == [row["valid"]]
    assert wb.runs.explanation("mt", "multi_turn_base_0") == row["explanation"]
    shown = wb.runs.view("mt").open_item("multi_turn_base_0")  # the viewer shows why the entry failed
    assert html.escape(row["explanation"]) in shown
    # another setting (BFCL's own prompt) on the same entries, compared item by item
    other = bfcl.run(engine, ["multi_turn_base"], limit=1, max_tokens=4, progress=False, prompt="bfcl", run="mt-b")
    numbered = wb.runs.rows("mt-b")
    assert numbered["turn"].tolist() == list(range(other.iloc[0]["steps"]))  # completion rows numbered too
    summary = wb.runs.summary(["mt", "mt-b"])
    assert set(summary["run"]) == {"mt", "mt-b"} and set(summary["score"]) == {"valid"}
