"""Experiments over stored runs (issue 41): items, settings, scores, item-by-item comparison and the paired
statistics of ``wb.runs.summary``; managing runs; the v1 -> v2 store migration.  The statistics are checked
against hand-computed cases (and scipy where it is installed); items against the real engine, the tool loop
and the evals harness."""

from __future__ import annotations

import json
import math
import sqlite3
import warnings
from pathlib import Path

import pytest
from _runs_engine_child import cases, tools

import workbench as wb
from workbench import evals, runs
from workbench.errors import InputError, ScoreWarning, StoreError, StoreWarning
from workbench.runs import stats
from workbench.runs.scores import RESERVED_NAMES
from workbench.session import build_engine, resolve_settings
from workbench.types import ChatCompletion, Completion, Message, ToolCall

LOAD = runs.load_fields({"dtype": "bfloat16", "quantization": None, "model_parallel_size": 1, "device": "cpu"})
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 16, "stop": [], "logprobs": 0, "seed": None}
MODEL = "Llama3.2-3B-Instruct"


# ---------------------------------------------------------------------------------------------- statistics
def test_mcnemar_exact_p_values_against_hand_computed_cases():
    assert stats.mcnemar_exact(0, 6) == 0.03125  # 6 regressions, no improvement: 2 * (1/2)**6
    assert stats.mcnemar_exact(6, 0) == 0.03125
    assert stats.mcnemar_exact(1, 6) == pytest.approx(2 * (1 + 7) / 128)  # 2 * P(X <= 1), X ~ Bin(7, 1/2)
    assert stats.mcnemar_exact(3, 3) == 1.0 and stats.mcnemar_exact(0, 0) == 1.0
    scipy_stats = pytest.importorskip("scipy.stats")
    for improved, regressed in ((2, 9), (10, 4), (0, 1), (13, 30)):
        oracle = scipy_stats.binomtest(improved, improved + regressed, 0.5).pvalue
        assert stats.mcnemar_exact(improved, regressed) == pytest.approx(oracle, rel=1e-12)


def test_intervals_against_hand_computed_cases():
    low, high = stats.wilson(8, 10)  # the textbook Wilson interval of 8/10: 0.4902 to 0.9433
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert stats.wilson(10, 10) == (pytest.approx(0.72246, abs=1e-5), 1.0)
    mean, low, high = stats.mean_interval([1, 2, 3, 4, 5])  # 3 +- t(0.975, 4) * sd / sqrt(5) = 3 +- 2.7764 * 0.7071
    assert mean == 3 and low == pytest.approx(3 - 2.776445 * math.sqrt(2.5 / 5), abs=1e-5)
    assert high == pytest.approx(3 + 2.776445 * math.sqrt(2.5 / 5), abs=1e-5)
    # a paired pass/fail difference: 4 items passed in both runs, 6 only in b, none only in a or in neither.
    # Newcombe's hybrid interval; phi = 0 here (a margin is empty), so by hand from the Wilson intervals
    # of 4/10 (0.16818, 0.68732) and 10/10 (0.72246, 1): 0.6 - sqrt(0.27754**2 + 0.28732**2),
    # 0.6 + sqrt(0 + 0.23182**2)
    diff, low, high = stats.paired_rate_difference(4, 0, 6, 0)
    assert diff == pytest.approx(0.6)
    assert low == pytest.approx(0.6 - math.hypot(1 - 0.72246, 0.68732 - 0.4), abs=1e-4)
    assert high == pytest.approx(0.6 + (0.4 - 0.16818), abs=1e-4)
    # correlated pairs make the interval narrower than treating the runs as independent samples
    diff, low, high = stats.paired_rate_difference(40, 2, 8, 50)
    unpaired = math.hypot(0.48 - stats.wilson(48, 100)[0], stats.wilson(42, 100)[1] - 0.42)
    assert diff == pytest.approx(0.06) and low < diff < high and diff - low < unpaired
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 3, 9, 30, 500):
        assert stats.t_quantile(0.975, df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=1e-9)


def test_sign_flip_test_is_exact_for_few_items_and_deterministic_for_many():
    assert stats.sign_flip_p([1, 2, 3]) == 0.25  # of 8 sign patterns, +++ and --- reach |6|
    assert stats.sign_flip_p([1.0] * 6) == 0.03125  # 2 of 64 patterns
    assert stats.sign_flip_p([0, 0]) == 1.0
    many = [0.1 * ((i * 7) % 5 - 1.5) for i in range(200)]
    assert stats.sign_flip_p(many) == stats.sign_flip_p(many)  # seeded
    assert 0 < stats.sign_flip_p([1.0] * 40) <= 1 / 2001 + 1e-12  # every pattern but the observed one is smaller


# ---------------------------------------------------------------------------------------------- synthetic runs
def provenance(quantization: str | None = None) -> runs.Provenance:
    return runs.Provenance(identity="sha256:test", load={**LOAD, "quantization": quantization}, model="tiny")


def reply(text: str, tokens: list[int], calls: list[ToolCall] | None = None) -> ChatCompletion:
    return ChatCompletion(Message("assistant", text, calls or []), tokens, "end_of_turn")


def put_chat_run(
    st: runs.Store,
    name: str,
    system: str,
    answers: list[str],
    *,
    quantization: str | None = None,
    temperature: float = 0.0,
    items: list[str] | None = None,
) -> None:
    """A run of chat rows: one question per answer, under ``system``."""
    run = st.open_run(name, provenance(quantization))
    rows = []
    for i, answer in enumerate(answers):
        sampling = {**GREEDY, "temperature": temperature}
        key = run.key([1, len(system), i], sampling, kind="chat")
        request = {
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"question {i}"}],
            "tools": [{"tool_name": "add", "description": "Add.", "parameters": {}}],
        }
        rows.append(
            {
                "key": key,
                "request": request,
                "prompt_ids": [1, len(system), i],
                "sampling": sampling,
                "output": reply(answer, [100 + ord(c) for c in answer]),
                **({"item": items[i]} if items is not None else {}),
            }
        )
    assert run.put_many(rows)


@pytest.fixture
def st(tmp_path) -> runs.Store:
    return runs.store(tmp_path / "runs.sqlite")


def passed(row: dict) -> dict:
    return {"passed": row["output"].startswith("right")}


def test_two_system_prompts_line_up_by_item_and_summary_shows_six_regressions(st):
    put_chat_run(st, "terse", "Be terse.", ["right"] * 10)
    put_chat_run(st, "chatty", "Be chatty and helpful.", ["wrong"] * 6 + ["right"] * 4)
    items = runs.rows("terse", store=st)["item"].tolist()
    assert items == runs.rows("chatty", store=st)["item"].tolist() and len(set(items)) == 10
    assert items[3] == runs.input_item([{"role": "user", "content": "question 3"}])  # the system prompt is no part
    assert items[3].startswith("question 3 #")
    assert runs.score("terse", passed, store=st) == {
        "scored": 10,
        "failed": 0,
        "first_error": None,
        "names": ["passed"],
    }
    runs.score("chatty", passed, store=st)
    diff = runs.compare("terse", "chatty", store=st)
    assert diff.attrs["counts"] == {"both": 10, "only_a": 0, "only_b": 0, "differ": 6, "improved": 0, "regressed": 6}
    assert diff.attrs["settings"] == {"system_prompt": ("Be terse.", "Be chatty and helpful.")}
    assert list(diff["change"][:6]) == ["regressed"] * 6 and list(diff["change"][6:]) == ["same"] * 4
    first = diff.iloc[0]
    assert first["passed_a"] is True and first["passed_b"] is False and first["output_b"] == "wrong"
    assert first["first_diff"] == 0 and (first["token_a"], first["token_b"]) == (100 + ord("r"), 100 + ord("w"))
    assert first["diff_a"] == "right" and first["diff_b"] == "wrong"
    assert diff.iloc[9]["same"] and diff.iloc[9]["first_diff"] is None and diff.iloc[9]["diff_a"] == ""
    table = runs.summary(["terse", "chatty"], store=st)
    base, other = table.iloc[0], table.iloc[1]
    assert (base["run"], base["n"], base["mean"]) == ("terse", 10, 1.0) and math.isnan(base["diff"])
    assert (other["regressed"], other["improved"], other["paired"]) == (6, 0, 10)
    assert other["p_value"] == 0.03125 and other["test"] == "mcnemar-exact"
    assert other["diff"] == pytest.approx(-0.6) and other["diff_high"] < 0 and other["shown"]
    assert (other["low"], other["high"]) == pytest.approx(stats.wilson(4, 10))


def test_a_difference_whose_interval_covers_zero_is_not_shown(st):
    put_chat_run(st, "a", "A.", ["right", "wrong", "right", "right"])
    put_chat_run(st, "b", "B.", ["wrong", "right", "right", "right"])
    for name in ("a", "b"):
        runs.score(name, lambda row: {"passed": row["output"] == "right", "length": len(row["output"])}, store=st)
    table = runs.summary(["a", "b"], store=st).set_index(["run", "score"])
    assert table.loc[("b", "passed"), "p_value"] == 1.0 and not table.loc[("b", "passed"), "shown"]
    assert table.loc[("b", "length"), "test"] == "sign-flip" and table.loc[("b", "length"), "kind"] == "number"
    assert runs.summary(["a", "b"], scores=["length"], store=st)["score"].unique().tolist() == ["length"]
    with pytest.raises(InputError, match="no score named 'nope'"):
        runs.summary(["a", "b"], scores=["nope"], store=st)


def test_explicit_items_and_runs_with_no_item_in_common(st):
    put_chat_run(st, "x", "S.", ["r1", "r2", "r3"], items=["case-1", "case-2", "case-3"])
    put_chat_run(st, "y", "S.", ["r1", "r2", "r9"], items=["case-1", "case-2", "case-3"])
    put_chat_run(st, "z", "S.", ["r1"], items=["other-1"])
    assert runs.rows("x", store=st)["item"].tolist() == ["case-1", "case-2", "case-3"]
    diff = runs.compare("x", "y", store=st)
    assert diff.attrs["differ"] == 1 and diff.iloc[0]["item"] == "case-3" and diff["change"].isna().all()
    with pytest.raises(InputError, match="no item in common.*by='request'"):
        runs.compare("x", "z", store=st)
    assert len(runs.compare("x", "y", by="request", store=st, differing_only=False)) == 3  # same prompt ids
    with pytest.raises(InputError, match="one of 'item', 'request'"):
        runs.compare("x", "y", by="prompt", store=st)
    run = st.open_run("x", provenance())
    with pytest.warns(StoreWarning, match="item id must be a string"):  # put never raises: it warns, stores nothing
        assert not run.put(
            run.key([5], GREEDY),
            request={"prompt": "p"},
            prompt_ids=[5],
            output=Completion("t", [1], "end_of_turn"),
            item=["not", "a", "string"],
        )
    with pytest.raises(InputError, match="item id"):  # what a caller checks up front
        runs.check_item(["not", "a", "string"])
    assert run.put(
        run.key([6], GREEDY),
        request={"prompt": "Tell me a joke"},
        prompt_ids=[6],
        output=Completion("no", [1], "end_of_turn"),
    )
    assert runs.rows("x", store=st)["item"].iloc[-1] == runs.derive_item({"prompt": "Tell me a joke"})[0]
    copier = st.open_run("copy", provenance())  # identical keys answered from run x: the copies take our items
    keys = [copier.key([1, 2, i], GREEDY, kind="chat") for i in range(3)]
    assert len(copier.lookup(keys, items=["mine-0", None, "mine-2"], requests=[{"prompt": "p"}] * 3)) == 3
    copied = runs.rows("copy", store=st).set_index("key")["item"]
    assert [copied[k.key] for k in keys] == ["mine-0", runs.derive_item({"prompt": "p"})[0], "mine-2"]


def test_score_bad_inputs_keep_the_store_whole(st):
    put_chat_run(st, "s", "S.", ["right", "wrong", "right", "boom", "boom"])

    def flaky(row: dict) -> dict:
        if row["output"] == "boom":
            raise ValueError("cannot judge")
        return {"passed": row["output"] == "right"}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = runs.score("s", flaky, store=st)
    assert counts["scored"] == 3 and counts["failed"] == 2 and "ValueError: cannot judge" in counts["first_error"]
    shown = [w for w in caught if issubclass(w.category, ScoreWarning)]
    assert len(shown) == 1 and "raised on 2 of 5 rows" in str(shown[0].message)  # shown once, with the count
    frame = runs.rows("s", store=st)
    assert frame.attrs["scores"] == ["passed"] and frame["passed"].tolist() == [True, False, True, None, None]
    with pytest.raises(InputError, match="one type.*float\\(passed\\)"):
        runs.put_scores("s", {frame["item"][0]: {"passed": 0.5}}, store=st)  # numbers beside pass/fail
    with pytest.raises(InputError, match="one type"):
        runs.score("s", lambda row: {"mixed": True if row["output"] == "right" else 2.0}, store=st)
    assert runs.rows("s", store=st)["passed"].tolist() == [True, False, True, None, None]  # nothing lost
    with pytest.raises(InputError, match="no run named 'missing'.*'s'"):
        runs.score("missing", passed, store=st)
    with pytest.raises(InputError, match="column of wb.runs.rows"):
        runs.score("s", lambda row: {"output": 1}, store=st)
    with pytest.raises(InputError, match="number or a bool"):
        runs.score("s", lambda row: {"label": "good"}, store=st)
    assert set(RESERVED_NAMES) >= set(wb.runs.browse.FRAME_COLUMNS)


def test_a_harness_whose_store_cannot_take_scores_warns_and_goes_on(st, tmp_path):
    put_chat_run(st, "h", "S.", ["right"], items=["case-1"])
    readonly = runs.Store(st.path, readonly=True)
    with pytest.warns(StoreWarning, match="scores of run 'h' could not be stored"):
        assert runs.keep_scores("h", {"case-1": {"passed": True}}, store=readonly) is False
    assert runs.keep_scores("h", {"case-1": {"passed": True}, "case-9": {"passed": False}}, store=st)
    assert runs.rows("h", store=st)["passed"].tolist() == [True]  # the missing case is skipped


def test_a_tool_loop_item_is_its_transcript_and_transcript_reads_it_turn_by_turn(st):
    dialog = [{"role": "user", "content": "Weather in Paris?"}]
    call = ToolCall("get_weather", {"city": "Paris"}, "c1")
    for name, final in (("loop-a", "It is sunny."), ("loop-b", "It is raining.")):
        run = st.open_run(name, provenance())
        item = runs.input_item(dialog)
        turns = [
            (dialog, reply("", [7, 8], [call])),
            (
                [
                    *dialog,
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": "sunny", "call_id": "c1"},
                ],
                reply(final, [9, ord(final[6])]),
            ),
        ]
        for turn, (messages, out) in enumerate(turns):
            run.put(
                run.key([turn, 1], GREEDY, kind="chat"),
                request={"messages": messages, "item": item, "turn": turn},
                prompt_ids=[turn, 1],
                output=out,
            )
        runs.put_scores(name, {item: {"answered": final == "It is sunny."}}, store=st)
    frame = runs.rows("loop-a", store=st)
    assert frame["turn"].tolist() == [0, 1] and frame["item"].nunique() == 1
    assert frame["answered"].tolist() == [None, True]  # an item's score sits on its last row
    diff = runs.compare("loop-a", "loop-b", store=st)
    row = diff.iloc[0]
    assert len(diff) == 1 and row["turns_a"] == 2 and row["change"] == "regressed"
    assert row["output_a"] == '→ get_weather({"city": "Paris"})\nIt is sunny.' and row["first_diff"] == 3
    turns = runs.transcript("loop-a", row["item"], store=st)
    assert [t["turn"] for t in turns] == [0, 1]
    assert turns[0]["tool_calls"] == [{"tool_name": "get_weather", "arguments": {"city": "Paris"}}]
    assert turns[0]["tool_results"][0]["content"] == "sunny" and turns[1]["output"] == "It is sunny."
    with pytest.raises(InputError, match="has no item 'nope'"):
        runs.transcript("loop-a", "nope", store=st)


def test_settings_mark_what_varies_and_diff_settings_shows_only_differences(st):
    put_chat_run(st, "cold", "S.", ["a", "b"], quantization="int4_mixed")
    put_chat_run(st, "warm", "S.", ["a", "b"], temperature=0.7)
    run = st.open_run("warm", provenance())
    run.put(
        run.key([9], {**GREEDY, "temperature": 0.2, "seed": 5}, kind="chat"),
        request={"messages": [{"role": "user", "content": "q"}]},
        prompt_ids=[9],
        output=reply("x", [1]),
        sampling={**GREEDY, "temperature": 0.2, "seed": 5},
    )
    cold, warm = runs.settings("cold", store=st), runs.settings("warm", store=st)
    assert cold["quantization"] == "int4_mixed" and cold["temperature"] == 0.0 and cold["system_prompt"] == "S."
    assert list(cold["tools"]) == ["add"] and len(cold["tools"]["add"]) == 10 and cold["checkpoint"] == "sha256:test"
    assert warm["temperature"] == runs.Varies((0.2, 0.7), 2) and isinstance(warm["system_prompt"], runs.Varies)
    assert warm["seed"] == runs.Varies((5,), 1) or warm["seed"] == 5
    diff = runs.diff_settings("cold", "warm", store=st)
    assert set(diff) == {"quantization", "temperature", "system_prompt", "tools", "seed"}
    assert diff["quantization"] == ("int4_mixed", None)
    with pytest.raises(InputError, match="no run named"):
        runs.settings("nope", store=st)


def test_tag_note_rename_delete_vacuum_and_the_table(st):
    put_chat_run(st, "first", "S.", ["a"] * 50)
    put_chat_run(st, "second", "S.", ["b"] * 2)
    runs.score("second", lambda row: {"ok": True}, store=st)
    assert runs.tag("first", "baseline", "paper", store=st) == ["baseline", "paper"]
    assert runs.tag("first", "paper", "v2", store=st) == ["baseline", "paper", "v2"]
    assert runs.untag("first", "paper", store=st) == ["baseline", "v2"]
    runs.note("first", "the unquantized baseline", store=st)
    table = runs.table(store=st).set_index("run")
    assert table.loc["first", "tags"] == ["baseline", "v2"] and table.loc["first", "note"] == "the unquantized baseline"
    assert table.loc["first", "items"] == 50 and table.loc["second", "scores"] == ["ok"]
    assert (
        table.loc["first", "bytes"] > table.loc["second", "bytes"] > 0
        and table.loc["first", "updated_at"] >= table.loc["first", "created_at"]
    )
    with pytest.raises(InputError, match="exists already"):
        runs.rename("first", "second", store=st)
    runs.rename("first", "baseline", store=st)
    assert runs.table(store=st)["run"].tolist() == ["baseline", "second"]
    assert runs.settings("baseline", store=st)["model"] == "tiny"
    assert runs.delete("baseline", store=st) == 50
    sizes = runs.vacuum(store=st)
    assert sizes["after"] < sizes["before"] and st.integrity_check() == "ok"
    with pytest.raises(InputError, match="tags are printable"):
        runs.tag("second", store=st)


# ---------------------------------------------------------------------------------------------- migration
V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, created_at REAL NOT NULL);
CREATE TABLE sessions (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    started_at REAL NOT NULL, ended_at REAL, identity TEXT NOT NULL, load TEXT NOT NULL, provenance TEXT NOT NULL);
CREATE TABLE rows (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    session_id INTEGER REFERENCES sessions(id) ON DELETE SET NULL, key TEXT NOT NULL, match TEXT NOT NULL,
    kind TEXT NOT NULL, request TEXT NOT NULL, prompt_ids BLOB NOT NULL, sampling TEXT NOT NULL,
    seed_drawn INTEGER NOT NULL DEFAULT 0, output TEXT NOT NULL, timings TEXT NOT NULL,
    computed INTEGER NOT NULL DEFAULT 1, created_at REAL NOT NULL, UNIQUE (run_id, key));
CREATE INDEX rows_by_key ON rows(key);
CREATE INDEX rows_by_match ON rows(run_id, match);
CREATE INDEX sessions_by_run ON sessions(run_id);
CREATE TABLE file_hashes (path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL, inode INTEGER NOT NULL, sha256 TEXT NOT NULL, hashed_at REAL NOT NULL);
"""


def write_v1_store(path: Path) -> None:
    """A store file as schema 1 (workbench before items and scores) wrote it: two runs, three rows."""
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", "1"), ("created_at", "2026-01-01")])
    conn.execute("PRAGMA application_id = 1463972435")  # 0x57427253
    conn.executemany("INSERT INTO runs VALUES (?, ?, ?)", [(1, "old-a", 1.0), (2, "old-b", 2.0)])
    conn.execute(
        "INSERT INTO sessions VALUES (1, 1, 1.0, 2.0, 'sha256:old', '{}', ?)",
        (json.dumps({"model": "tiny", "load": {"quantization": None}}),),
    )
    for row_id, run_id, system in ((1, 1, "Old system."), (2, 1, None), (3, 2, "Another system.")):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": "Is it old?" if row_id != 2 else "Second question"}
        ]
        conn.execute(
            "INSERT INTO rows VALUES (?, ?, 1, ?, ?, 'chat', ?, ?, '{}', 0, ?, '{}', 1, ?)",
            (
                row_id,
                run_id,
                f"k{row_id}",
                f"m{row_id}",
                json.dumps({"messages": messages}),
                b"\x01\x00\x00\x00",
                runs.dumps(reply("yes", [5])),
                10.0 + row_id,
            ),
        )
    conn.commit()
    conn.close()


def test_a_v1_store_is_migrated_in_place_and_keeps_its_rows(tmp_path):
    path = tmp_path / "v1.sqlite"
    write_v1_store(path)
    with pytest.raises(StoreError, match="open it once for writing"):
        runs.Store(path, readonly=True).connection()
    st = runs.store(path)
    assert st.query("SELECT value FROM meta WHERE key = 'schema_version'") == [("2",)]
    old_a, old_b = runs.rows("old-a", store=st), runs.rows("old-b", store=st)
    assert len(old_a) == 2 and len(old_b) == 1 and old_a["output"].tolist() == ["yes", "yes"]
    same = runs.input_item([{"role": "user", "content": "Is it old?"}])
    assert old_a["item"][0] == same == old_b["item"][0]  # derived without the system prompt
    assert runs.compare("old-a", "old-b", store=st).attrs["both"] == 1
    assert runs.table(store=st).set_index("run").loc["old-a", "updated_at"].timestamp() == 12.0
    runs.score("old-a", passed, store=st)  # the new tables work
    assert st.integrity_check() == "ok"


# ---------------------------------------------------------------------------------------------- Inspect
def test_to_inspect_writes_items_as_sample_ids_and_scores_as_inspect_scores(st, tmp_path):
    log_api = pytest.importorskip("inspect_ai.log")
    put_chat_run(st, "graded", "S.", ["right", "wrong"], items=["case-1", "case-2"])
    runs.score("graded", lambda row: {"passed": row["output"] == "right", "length": len(row["output"])}, store=st)
    log = log_api.read_eval_log(str(runs.to_inspect("graded", tmp_path / "graded.eval", store=st)))
    assert [s.id for s in log.samples] == ["case-1", "case-2"]
    assert log.samples[0].scores["passed"].value is True and log.samples[1].scores["length"].value == 5.0
    assert {s.name for s in log.results.scores} == {"passed", "length"}


# ---------------------------------------------------------------------------------------------- real engine
@pytest.fixture(scope="module")
def engine(llama3_dir):
    e = build_engine(resolve_settings(llama3_dir, model=MODEL, max_batch_size=4, max_seq_len=512))
    yield e
    e.close()


@pytest.fixture
def store(tmp_path, monkeypatch) -> runs.Store:
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    return runs.store()


DIALOGS = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(4)]


def test_engine_rows_under_two_system_prompts_line_up_and_scoring_never_generates(engine, store, monkeypatch):
    for name, system in (("sys-a", "You are a calculator."), ("sys-b", "You answer in French.")):
        engine.batch_chat_completion(
            [[{"role": "system", "content": system}, *d] for d in DIALOGS], max_tokens=6, run=name
        )
    engine.batch_completion(["The capital of France is"], max_tokens=4, run="sys-a")
    diff = runs.compare("sys-a", "sys-b")
    assert diff.attrs["both"] == 4 and diff.attrs["only_a"] == 1 and diff.attrs["only_b"] == 0
    assert set(diff["item"]) == {runs.input_item(d) for d in DIALOGS}
    assert diff.attrs["settings"]["system_prompt"][1] == "You answer in French."
    assert runs.rows("sys-a")["item"].iloc[-1] == runs.derive_item({"prompt": "The capital of France is"})[0]

    def no_generation(*args, **kwargs):
        raise AssertionError("wb.runs.score generated")

    monkeypatch.setattr(engine, "generate_tokens", no_generation)
    for name in ("sys-a", "sys-b"):
        assert runs.score(name, lambda row: {"long": len(row["output"]) > 10})["failed"] == 0
    assert runs.summary(["sys-a", "sys-b"])["paired"].tolist() == [5, 4]


@pytest.fixture(scope="module")
def demo():
    return wb.load()


def test_the_tool_loop_names_each_dialog_an_item_and_numbers_its_turns(demo, store):
    dialogs = [
        [{"role": "user", "content": "What's the weather in Paris?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What's the weather in Rome?"}],
    ]
    loop_tools = [tools()["get_weather"]]
    transcripts = wb.tools.run_batch(demo, dialogs, tools=loop_tools, max_tokens=48, run="loop")
    frame = runs.rows("loop")
    for dialog, transcript in zip(dialogs, transcripts):
        mine = frame[frame["item"] == runs.input_item(dialog)]
        assert mine["turn"].tolist() == list(range(sum(m.role == "assistant" for m in transcript)))
    rome = runs.input_item(dialogs[1])
    assert rome == runs.input_item(dialogs[1][1:]) and rome in set(frame["item"])  # the system prompt is no part of it
    assert rome.startswith("What's the weather in Rome? #")
    assert frame["n_tool_calls"].sum() >= 1
    named = wb.tools.run(demo, dialogs[0], tools=loop_tools, max_tokens=48, run="loop-named", item="paris")
    assert named.cached and set(runs.rows("loop-named")["item"]) == {"paris"}  # rows copied from "loop", renamed
    with pytest.raises(InputError, match="one id per dialog"):
        wb.tools.run_batch(demo, dialogs, tools=loop_tools, run="loop", item="one")
    settings = runs.settings("loop")
    assert list(settings["tools"]) == ["get_weather"] and len(settings["tools"]["get_weather"]) == 10


def test_the_evals_harness_stores_case_ids_as_items_with_their_scores(demo, store):
    results = evals.run_cases(demo, cases(), tools=tools(), max_tokens=48, run="ev")
    frame = runs.rows("ev")
    assert set(frame["item"]) == {"two-questions"} and frame["turn"].tolist() == list(range(len(frame)))
    assert frame["exact_match"].iloc[-1] == bool(results.loc[0, "exact_match"])
    assert frame["exact_match"].iloc[:-1].isna().all()
    table = runs.summary("ev")
    assert set(table["score"]) >= {"exact_match", "name_match"} and (table["n"] == 1).all()
