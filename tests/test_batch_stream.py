"""Engine.stream_batch_completion / stream_batch_chat_completion: several streams in one engine batch.

Held to the batch calls they stream (same tokens, text and parsed replies), to per-row cancellation (one row
stops, the others are unchanged, the engine stays usable), and to the engine's running batch: a stream that is
not read holds no other call up, and a dropped stream's rows leave the batch.
"""

from __future__ import annotations

import threading
import time

import pytest

import workbench as wb
from workbench.demo.tools import DEMO_TOOLS
from workbench.errors import GenerationCancelled

PROMPTS = ["The capital of France is", "Once upon a time", "One two three four", "Hello"]
TOOLS = [DEMO_TOOLS[k] for k in ("get_weather", "get_random_joke")]
DIALOGS = [
    [{"role": "user", "content": "What's the weather in Paris?"}],
    [{"role": "user", "content": "Hello, who are you?"}],
]


@pytest.fixture(scope="module")
def engine():
    return wb.load()


def _drain(stream):
    texts, finals, order = {}, {}, []
    for row, chunk in stream:
        order.append(row)
        texts[row] = texts.get(row, "") + chunk.text
        if chunk.final is not None:
            finals[row] = chunk.final
    return texts, finals, order


def test_rows_equal_batch_completion_and_interleave(engine):
    refs = engine.batch_completion(PROMPTS, max_tokens=12, logprobs=2)
    texts, finals, order = _drain(engine.stream_batch_completion(PROMPTS, max_tokens=12, logprobs=2))
    for i, ref in enumerate(refs):
        assert finals[i].tokens == ref.tokens and finals[i].text == ref.text == texts[i]
        assert finals[i].stop_reason == ref.stop_reason
        assert [lp.token for lp in finals[i].logprobs] == [lp.token for lp in ref.logprobs]
    assert len(set(order[: len(PROMPTS)])) > 1, "rows decode together, not one after another"


def test_chat_rows_equal_batch_chat_completion(engine):
    refs = engine.batch_chat_completion(DIALOGS, TOOLS, max_tokens=30)
    _, finals, _ = _drain(engine.stream_batch_chat_completion(DIALOGS, TOOLS, max_tokens=30))
    for i, ref in enumerate(refs):
        assert finals[i].tokens == ref.tokens and finals[i].message.content == ref.message.content
        assert [(c.tool_name, c.arguments) for c in finals[i].message.tool_calls] == [
            (c.tool_name, c.arguments) for c in ref.message.tool_calls
        ]


def test_cancelling_one_row_leaves_the_others_unchanged(engine):
    refs = engine.batch_completion(PROMPTS, max_tokens=24)
    stream = engine.stream_batch_completion(PROMPTS, max_tokens=24)
    finals, seen = {}, {}
    for row, chunk in stream:
        seen[row] = seen.get(row, 0) + 1
        if row == 1 and seen[row] == 3:
            stream.cancel(1)
        if chunk.final is not None:
            finals[row] = chunk.final
    assert finals[1].stop_reason == "cancelled" and len(finals[1].tokens) < len(refs[1].tokens)
    assert refs[1].tokens[: len(finals[1].tokens)] == finals[1].tokens
    for i in (0, 2, 3):
        assert finals[i].tokens == refs[i].tokens
    assert engine.completion(PROMPTS[1], max_tokens=24).tokens == refs[1].tokens  # the slot was freed cleanly


def test_engine_cancel_stops_the_batch_stream(engine):
    stream = engine.stream_batch_completion(PROMPTS, max_tokens=200)
    with pytest.raises(GenerationCancelled) as info:
        for n, _ in enumerate(stream):
            if n == 5:
                engine.cancel()
    assert len(info.value.partial) == len(PROMPTS)
    assert engine.completion("Hi", max_tokens=2).tokens


def test_a_suspended_stream_holds_no_other_thread_up(engine):
    """Another thread's call joins the running batch while a stream is suspended between two items; both give
    the tokens they give alone."""
    ref = engine.batch_completion(PROMPTS, max_tokens=16)
    alone = engine.completion(PROMPTS[0], max_tokens=16).tokens
    stream = engine.stream_batch_completion(PROMPTS, max_tokens=16, preemptible=False)
    first = next(stream)  # its rows are in the running batch; the stream is not read meanwhile
    other: list = []
    worker = threading.Thread(target=lambda: other.append(engine.completion(PROMPTS[0], max_tokens=16).tokens))
    worker.start()
    worker.join(120)
    assert not worker.is_alive() and other == [alone]
    finals = {first[0]: first[1].final} if first[1].final is not None else {}
    finals.update(_drain(stream)[1])
    assert [finals[i].tokens for i in range(len(PROMPTS))] == [r.tokens for r in ref]


def test_a_closed_stream_leaves_the_batch(engine):
    stream = engine.stream_batch_completion(PROMPTS, max_tokens=200)
    next(stream)
    stream.close()
    assert engine.completion(PROMPTS[0], max_tokens=4).tokens
    assert list(stream) == []
    deadline = time.monotonic() + 60
    while engine._loop.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine._loop.running == 0  # its rows were cancelled, not run to max_tokens


@pytest.mark.slow
def test_model_parallel_rows_cancel_too(llama3_dir):
    """With model-parallel workers the rank copies never see the flag: the engine drops the row's events."""
    from workbench.session import build_engine, resolve_settings

    engine = build_engine(
        resolve_settings(
            llama3_dir,
            model_parallel_size=2,
            max_seq_len=96,
            max_batch_size=4,
            device="cpu",
            dtype="float32",
            quantization="none",
        )
    )
    try:
        refs = engine.batch_completion(PROMPTS, max_tokens=12)
        stream = engine.stream_batch_completion(PROMPTS, max_tokens=12)
        finals, seen = {}, 0
        for row, chunk in stream:
            if row == 2:
                seen += 1
                if seen == 2:
                    stream.cancel(2)
            if chunk.final is not None:
                finals[row] = chunk.final
        assert finals[2].stop_reason == "cancelled"
        assert [finals[i].tokens for i in (0, 1, 3)] == [refs[i].tokens for i in (0, 1, 3)]
        assert engine.batch_completion(PROMPTS, max_tokens=12)[2].tokens == refs[2].tokens
    finally:
        engine.close()


def test_a_stream_read_in_another_thread_is_not_cut(engine):
    """A notebook call while another thread reads a stream waits for it; neither result changes."""
    ref = engine.completion(PROMPTS[1], max_tokens=20)
    other_ref = engine.completion(PROMPTS[0], max_tokens=8).tokens
    got: dict = {}

    def read() -> None:
        text = ""
        for chunk in engine.stream_completion(PROMPTS[1], max_tokens=20):
            text += chunk.text
            time.sleep(0.05)  # a slow reader: suspended between items most of the time
            got["final"] = chunk.final
        got["text"] = text

    thread = threading.Thread(target=read)
    thread.start()
    time.sleep(0.3)
    mine = engine.completion(PROMPTS[0], max_tokens=8).tokens
    thread.join(120)
    assert mine == other_ref
    assert got["final"] is not None and got["final"].tokens == ref.tokens and got["text"] == ref.text
