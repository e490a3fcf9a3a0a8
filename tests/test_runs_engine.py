"""``run="name"`` through the engine: re-runs answered from the run store in order and equal to a fresh run, a
process killed mid-batch losing only its running rows, exact keys (what must miss, what must hit across
processes), drawn seeds, streams replayed, the tool loop resumed at the turn it died in, browsing after real
runs, and a store that cannot be written costing no result.  (The store on its own: test_runs_store.py.)"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from _runs_engine_child import SLOW_ROWS, SLOW_TOKENS, cases, shared_prompts, slow_prompts, tools

import workbench as wb
from workbench import evals, runs
from workbench.engine import chat as chat_layer
from workbench.errors import InputError, StoreError, StoreWarning
from workbench.session import build_engine, resolve_settings
from workbench.types import ChatCompletion, ScoredRow

CHILD = Path(__file__).with_name("_runs_engine_child.py")
MODEL = "Llama3.2-3B-Instruct"
PROMPTS = [f"Prompt number {i} about llamas" for i in range(6)]
DIALOGS = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(3)]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@pytest.fixture(scope="module")
def engine(llama3_dir):
    e = build_engine(resolve_settings(llama3_dir, model=MODEL, max_batch_size=4, max_seq_len=512))
    yield e
    e.close()


@pytest.fixture
def store(tmp_path, monkeypatch) -> runs.Store:
    """This test's own run store (``$WORKBENCH_STORE``), so its counts see only its rows."""
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    return runs.store()


def child(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def stored_count(path: Path, run: str) -> int:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute(
                "SELECT count(*) FROM rows r JOIN runs ON runs.id = r.run_id WHERE runs.name = ?", (run,)
            ).fetchone()[0]
    except sqlite3.Error:  # not created yet
        return 0


def sessions_of(store: runs.Store, run: str) -> dict[int, int]:
    """Rows per session (ascending session ids: the processes that wrote the run, in order)."""
    counts: dict[int, int] = {}
    for row in store.rows(run):
        counts[row.session] = counts.get(row.session, 0) + 1
    return dict(sorted(counts.items()))


# ------------------------------------------------------------------------------------------- re-runs
def test_a_rerun_answers_stored_rows_in_order_and_computes_only_the_rest(engine, store):
    fresh = engine.batch_completion(PROMPTS, max_tokens=8)
    first = engine.batch_completion(PROMPTS[:4], max_tokens=8, run="sweep")
    assert first == fresh[:4] and not any(r.cached for r in first)
    again = engine.batch_completion(PROMPTS, max_tokens=8, run="sweep")
    assert again == fresh and [r.cached for r in again] == [True] * 4 + [False] * 2
    assert engine.completion(PROMPTS[5], max_tokens=8, run="sweep").cached
    spelled = engine.batch_completion(
        content_batch=PROMPTS[:2],
        run="sweep",  # Llama Stack's spellings with run=
        sampling_params={"strategy": {"type": "greedy"}, "max_tokens": 8},
    )
    assert spelled == fresh[:2] and all(r.cached for r in spelled)
    assert len(list(store.rows("sweep"))) == 6

    renewed = engine.batch_completion(PROMPTS[:2], max_tokens=8, run="sweep", refresh=True)
    assert renewed == fresh[:2] and not any(r.cached for r in renewed)
    assert len(list(store.rows("sweep"))) == 6  # replaced, not added

    chats = engine.batch_chat_completion(DIALOGS, tools=[add], max_tokens=8, run="chat")
    assert chats == engine.batch_chat_completion(DIALOGS, tools=[add], max_tokens=8)
    replies = engine.batch_chat_completion(DIALOGS, tools=[add], max_tokens=8, run="chat")
    assert replies == chats and all(isinstance(r, ChatCompletion) and r.cached for r in replies)
    assert engine.chat_completion(DIALOGS[1], tools=[add], max_tokens=8, run="chat") == chats[1]
    kinds = {r.kind for r in store.rows("chat")}
    assert kinds == {"chat"}

    sequences = [engine.tokenizer.encode(p, bos=True) for p in PROMPTS[:3]]
    scores = engine.score(sequences, 2, run="scores")
    assert scores == engine.score(sequences, 2) and not any(s.cached for s in scores)
    again_scores = engine.score(sequences, 2, run="scores")
    assert again_scores == scores and all(isinstance(s, ScoredRow) and s.cached for s in again_scores)

    with pytest.raises(InputError, match="run='name', refresh=True"):
        engine.batch_completion(PROMPTS[:1], max_tokens=2, refresh=True)
    with pytest.raises(InputError, match="run name"):
        engine.completion(PROMPTS[0], max_tokens=2, run="")


def test_unseeded_sampled_rows_run_with_a_drawn_seed_and_come_back_the_same(engine, store):
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1]]  # a repeated unseeded prompt: two samples
    first = engine.batch_completion(prompts, max_tokens=8, temperature=1.0, run="samples")
    again = engine.batch_completion(prompts, max_tokens=8, temperature=1.0, run="samples")
    assert again == first and all(r.cached for r in again)
    stored = list(store.rows("samples"))
    assert len(stored) == 3 and all(r.seed_drawn and isinstance(r.seed, int) for r in stored)
    # Every sample can be replayed from its recorded seed: the same batch again, each row given its stored seed
    # (a row replayed alone would also need batch-invariant numerics, which the default kernels do not promise).
    replay = engine.batch_completion(
        [row.request["prompt"] for row in stored], max_tokens=8, temperature=1.0, seed=[row.seed for row in stored]
    )
    assert replay == [row.output for row in stored]
    renewed = engine.batch_completion(prompts, max_tokens=8, temperature=1.0, run="samples", refresh=True)
    assert not any(r.cached for r in renewed)
    assert {r.seed for r in store.rows("samples")}.isdisjoint({r.seed for r in stored})  # new draws

    seeded = engine.batch_completion(PROMPTS[:2], max_tokens=8, temperature=1.0, seed=[11, 12], run="seeded")
    assert [(r.seed, r.seed_drawn) for r in store.rows("seeded")] == [(11, False), (12, False)]  # one seed per row
    assert engine.batch_completion(PROMPTS[:2], max_tokens=8, temperature=1.0, seed=[11, 12]) == seeded
    with pytest.raises(wb.errors.SamplingError, match="seed has 1 entries for 2 prompts"):
        engine.batch_completion(PROMPTS[:2], max_tokens=2, seed=[1])


def test_streams_answered_from_the_store_send_the_stored_result_as_chunks(engine, store):
    reference = engine.batch_completion(PROMPTS[:3], max_tokens=10, run="streams")
    chunks = list(engine.stream_completion(PROMPTS[0], max_tokens=10, run="streams"))
    assert len(chunks) > 1 and chunks[-1].final == reference[0] and chunks[-1].final.cached
    assert "".join(c.text for c in chunks) == reference[0].text

    live = {}
    stream = engine.stream_batch_completion(PROMPTS[:4], max_tokens=10, run="streams")
    texts = ["", "", "", ""]
    for row, chunk in stream:
        texts[row] += chunk.text
        if chunk.final is not None:
            live[row] = chunk.final
    assert [live[i] for i in range(3)] == reference and [live[i].cached for i in range(4)] == [True] * 3 + [False]
    assert texts == [live[i].text for i in range(4)]

    chat = engine.chat_completion(DIALOGS[0], max_tokens=10, run="streams")
    items = list(engine.chat_completion(DIALOGS[0], max_tokens=10, stream=True, run="streams"))
    assert items[-1] == chat and items[-1].cached
    assert list(engine.stream_chat_completion(DIALOGS[0], max_tokens=10)) == items  # the live stream's items
    finals = {
        row: c.final
        for row, c in engine.stream_batch_chat_completion(DIALOGS[:2], max_tokens=10, run="streams")
        if c.final is not None
    }
    assert finals[0] == chat and finals[0].cached and not finals[1].cached


def test_a_streamed_chat_row_with_a_run_is_parsed_once_and_returned_as_stored(engine, store, monkeypatch):
    """A chat row computed in a stream is parsed when it ends; the stream's final is that same reply, and the
    store answers the next call with an equal one (tool calls and their ids included)."""
    parsed = []
    original = chat_layer.finish_row
    monkeypatch.setattr(chat_layer, "finish_row", lambda *a, **k: parsed.append(1) or original(*a, **k))
    dialogs = [[{"role": "user", "content": "What is 3 + 4? Use the add tool."}], DIALOGS[1]]
    finals = {
        row: c.final
        for row, c in engine.stream_batch_chat_completion(dialogs, [add], max_tokens=24, run="stream-once")
        if c.final
    }
    assert len(parsed) == len(dialogs)  # once per row: not again for the stream's final
    again = engine.batch_chat_completion(dialogs, [add], max_tokens=24, run="stream-once")
    assert all(r.cached for r in again) and again == [finals[0], finals[1]]
    single = list(engine.chat_completion(DIALOGS[2], [add], max_tokens=24, stream=True, run="stream-once"))
    assert len(parsed) == len(dialogs) + 1 and not single[-1].cached
    assert engine.chat_completion(DIALOGS[2], [add], max_tokens=24, run="stream-once") == single[-1]


# ------------------------------------------------------------------------------------------- keys
def test_keys_miss_on_everything_that_changes_the_output_and_hit_on_the_same_request(engine, store):
    engine.batch_completion(PROMPTS[:2], max_tokens=8, run="keys")

    def misses_then_hits(**changes):
        first = engine.batch_completion(PROMPTS[:2], run="keys", **{"max_tokens": 8, **changes})
        again = engine.batch_completion(PROMPTS[:2], run="keys", **{"max_tokens": 8, **changes})
        return [r.cached for r in first], [r.cached for r in again]

    for changes in (
        {"max_tokens": 9},
        {"temperature": 0.7, "seed": 1},
        {"temperature": 0.7, "seed": 2},
        {"temperature": 0.9, "seed": 1},
        {"top_p": 0.5},
        {"top_k": 3},
        {"stop": ["\n"]},
        {"logprobs": 2},
        {"response_format": {"type": "regex", "regex": "[a-z ]+"}},
        {"response_format": {"type": "regex", "regex": "[a-z]+"}},
    ):
        assert misses_then_hits(**changes) == ([False, False], [True, True]), changes

    def chat(**options):
        return [r.cached for r in engine.batch_chat_completion(DIALOGS[:2], max_tokens=8, run="keys", **options)]

    assert chat(tools=[add]) == [False, False] and chat(tools=[add]) == [True, True]
    assert chat(tools=[multiply]) == [False, False]  # other tools: another prompt
    assert chat(tools=[add], tool_choice="required", constrain_tools=True) == [False, False]

    engine.set_quantization("bf16")
    try:
        assert not any(r.cached for r in engine.batch_completion(PROMPTS[:2], max_tokens=8, run="keys"))
    finally:
        engine.set_quantization(None)
    assert all(r.cached for r in engine.batch_completion(PROMPTS[:2], max_tokens=8, run="keys"))


def test_a_checkpoint_weight_edited_in_place_misses(llama3_dir, store, tmp_path):
    folder = Path(shutil.copytree(llama3_dir, tmp_path / "ckpt"))
    before = build_engine(resolve_settings(folder, model=MODEL, max_batch_size=2, max_seq_len=128))
    try:
        first = before.batch_completion(PROMPTS[:2], max_tokens=6, run="edited")
        assert all(r.cached for r in before.batch_completion(PROMPTS[:2], max_tokens=6, run="edited"))
    finally:
        before.close()
    shard = folder / "consolidated.00.pth"
    weights = torch.load(shard, weights_only=True)
    name = next(k for k in weights if k.endswith("attention.wq.weight"))
    weights[name][0, 0] += 1.0  # one weight, in place: same path, same size
    torch.save(weights, shard)
    after = build_engine(resolve_settings(folder, model=MODEL, max_batch_size=2, max_seq_len=128))
    try:
        edited = after.batch_completion(PROMPTS[:2], max_tokens=6, run="edited")
        assert not any(r.cached for r in edited)
        assert after.open_run("edited").provenance.identity != before.open_run("edited").provenance.identity
    finally:
        after.close()
    assert len(first) == 2


@pytest.mark.slow
def test_identical_requests_from_another_process_hit(engine, store, llama3_dir):
    proc = child("batch", str(llama3_dir), "theirs")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and out.strip() == "done", err[-2000:]
    mine = engine.batch_completion(shared_prompts(), max_tokens=8, run="mine")
    assert all(r.cached for r in mine)
    assert mine == engine.batch_completion(shared_prompts(), max_tokens=8)
    rows = wb.runs.rows("mine")
    assert len(rows) == len(mine) and not rows["computed"].any()  # taken from the other process's run


# ------------------------------------------------------------------------------------------- kills
@pytest.mark.slow
def test_a_batch_killed_by_sigkill_loses_only_its_running_rows(engine, store, llama3_dir):
    proc = child("slow-batch", str(llama3_dir), "killed")
    try:
        assert proc.stdout.readline().strip() == "started", proc.stderr.read()[-2000:]
        deadline = time.monotonic() + 120
        while stored_count(store.path, "killed") < 3:
            assert time.monotonic() < deadline and proc.poll() is None, "no row reached the store"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
        proc.wait(30)
    assert store.integrity_check() == "ok"
    kept = stored_count(store.path, "killed")
    assert 3 <= kept < SLOW_ROWS, "the batch finished before the kill: nothing to resume"

    results = engine.batch_completion(slow_prompts(), max_tokens=SLOW_TOKENS, run="killed")
    assert sum(r.cached for r in results) == kept  # every row finished before the kill, none of the others
    assert results == engine.batch_completion(slow_prompts(), max_tokens=SLOW_TOKENS)  # an uninterrupted run
    assert stored_count(store.path, "killed") == SLOW_ROWS and store.integrity_check() == "ok"


@pytest.mark.slow
def test_the_tool_loop_resumes_at_the_turn_it_died_in(store):
    demo = wb.load()
    proc = child("cases", "loop", "2")  # the second tool call (after the third model step) kills the process
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, f"the loop was not killed at its second tool call: {out} {err[-2000:]}"
    assert sessions_of(store, "loop") and sum(sessions_of(store, "loop").values()) == 3  # steps 1-3 stored

    resumed = evals.run_cases(demo, cases(), tools=tools(), max_tokens=48, run="loop")
    per_session = sessions_of(store, "loop")
    assert list(per_session.values()) == [3, 1]  # this process computed only the step after the crash
    uninterrupted = evals.run_cases(demo, cases(), tools=tools(), max_tokens=48)
    pd.testing.assert_frame_equal(resumed, uninterrupted)

    dialog = [{"role": "user", "content": "What's the weather in Paris?"}]
    loop_tools = [tools()["get_weather"]]
    transcript = wb.tools.run(demo, dialog, tools=loop_tools, max_tokens=48, run="loop-direct")
    again = wb.tools.run(demo, dialog, tools=loop_tools, max_tokens=48, run="loop-direct")
    assert again == transcript and again.cached and not transcript.cached
    assert sum(1 for m in transcript if m.role == "assistant") == len(list(store.rows("loop-direct")))


# ------------------------------------------------------------------------------------------- browsing
def test_browse_compare_and_export_after_real_runs(engine, store, tmp_path):
    engine.batch_chat_completion(DIALOGS, tools=[add], max_tokens=8, run="fp32")
    engine.set_quantization("bf16")
    try:
        engine.batch_chat_completion(DIALOGS, tools=[add], max_tokens=8, run="bf16")
    finally:
        engine.set_quantization(None)
    table = wb.runs.table()
    assert table.columns[0] == "run" and set(table["run"]) == {"fp32", "bf16"}
    assert set(table.loc[table["run"] == "bf16", "quantization"]) == {"bf16"}
    rows = wb.runs.rows("fp32")
    assert (
        len(rows) == 3
        and set(rows["kind"]) == {"chat"}
        and rows["prompt"].tolist() == [d[0]["content"] for d in DIALOGS]
    )
    assert rows["checkpoint_identity"].str.startswith("sha256:").all() and rows["model"].eq(MODEL).all()
    both = wb.runs.compare("fp32", "bf16", by="request", differing_only=False)
    assert both.attrs["both"] == 3 and len(both) == 3 and set(both["b_quantization"]) == {"bf16"}
    for suffix in (".jsonl", ".parquet"):
        path = wb.runs.export("fp32", tmp_path / f"fp32{suffix}")
        back = pd.read_json(path, lines=True) if suffix == ".jsonl" else pd.read_parquet(path)
        assert len(back) == 3 and back["output"].tolist() == rows["output"].tolist()
    run = engine.open_run("fp32")
    assert run.provenance.load["dtype"] == "float32" and run.provenance.extra["load_settings"]["max_seq_len"] == 512
    session = next(iter(store.sessions("fp32").values()))
    assert session["model"] == MODEL and session["torch_version"] and session["host"] and session["started_at"]
    assert engine.info()["run_store"] == str(store.path) and "run store" in engine._repr_html_()


def test_a_store_that_cannot_be_written_costs_no_result(engine, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("WORKBENCH_STORE", str(blocker / "runs.sqlite"))  # its folder cannot be made
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = engine.batch_completion(PROMPTS[:2], max_tokens=6, run="nowhere")
    assert results == engine.batch_completion(PROMPTS[:2], max_tokens=6) and not any(r.cached for r in results)
    assert any(issubclass(w.category, StoreWarning) for w in caught)

    not_a_store = tmp_path / "notes.txt"
    not_a_store.write_text("hello")
    monkeypatch.setenv("WORKBENCH_STORE", str(not_a_store))
    with pytest.raises(StoreError, match="notes.txt"):
        engine.batch_completion(PROMPTS[:1], max_tokens=2, run="x")
    assert engine.completion(PROMPTS[0], max_tokens=6) == results[0]  # refused before any work: still usable
