"""The chat layer's pure functions (``chat.prepare`` / ``chat.finish``) and the one row accumulator under every way
of generating (``RowAccumulator``): each checked on its own, and against what the engine's public calls return."""

from __future__ import annotations

import pytest
from _chat_helpers import add, our_formatter

from workbench.engine import chat
from workbench.engine.accumulator import RowAccumulator
from workbench.errors import GenerationCancelled, InputError
from workbench.generation import Event, Request, SamplingParams
from workbench.session import build_engine, resolve_settings
from workbench.types import Completion

USER = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def engine(llama3_dir):
    e = build_engine(resolve_settings(llama3_dir, model="Llama3.2-3B-Instruct", max_batch_size=4, max_seq_len=512))
    yield e
    e.close()


# --- prepare / finish --------------------------------------------------------------------------------------------
def test_prepare_renders_each_dialog_and_its_format_without_an_engine() -> None:
    formatter = our_formatter("Llama-4-Scout-17B-16E-Instruct")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    dialogs = [USER, "Hello"]
    prompts, formats = chat.prepare(
        formatter, dialogs, [add], "required", response_format=[None, {"type": "json_schema", "json_schema": schema}]
    )
    assert prompts[0] == formatter.encode_dialog(USER, [add], "required")
    assert formats[0] is None and formats[1].kind == "json_schema"
    # a JSON-schema format adds Llama Stack's instruction as the last user message
    assert "Please respond in JSON format with the schema" in formatter.tokenizer.decode(prompts[1])
    assert chat.prepare(formatter, []) == ([], [])
    with pytest.raises(InputError, match="list of dialogs"):
        chat.prepare(formatter, USER)  # one dialog is not a list of dialogs


def test_finish_parses_calls_and_keeps_data_replies_as_they_are() -> None:
    formatter = our_formatter("Llama-4-Scout-17B-16E-Instruct")
    call = Completion(text="[add(a=2, b=3)]", tokens=[1, 2], stop_reason="end_of_message", prompt_tokens=9)
    data = Completion(text='{"n": 5}', tokens=[3], stop_reason="end_of_turn", parsed={"n": 5})
    _, formats = chat.prepare(formatter, [USER, USER], response_format=[None, {"type": "regex", "regex": ".*"}])
    replies = chat.finish([call, data], formats, formatter)
    assert [(c.tool_name, c.arguments) for c in replies[0].message.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert replies[0].prompt_tokens == 9 and replies[0].message.stop_reason == "end_of_message"
    assert replies[1].message.content == '{"n": 5}' and not replies[1].message.tool_calls
    assert replies[1].parsed == {"n": 5}
    assert chat.finish([call], None, formatter)[0].message.tool_calls[0].tool_name == "add"


def test_the_engine_is_prepare_then_its_batch_then_finish(engine) -> None:
    dialogs = [USER, [{"role": "user", "content": "Say hello"}]]
    got = engine.batch_chat_completion(dialogs, tools=[add], max_tokens=8)
    prompts, formats = chat.prepare(engine.formatter, dialogs, [add])
    completions = engine.batch_completion(prompts, max_tokens=8)
    assert got == chat.finish(completions, formats, engine.formatter)  # call ids included: they derive from the text
    streamed = list(engine.stream_chat_completion(USER, tools=[add], max_tokens=8))
    assert streamed[-1] == got[0]


# --- the row accumulator -------------------------------------------------------------------------------------------
def _requests(prompts: list[list[int]], params: SamplingParams | None = None) -> list[Request]:
    return [Request(i, p, params or SamplingParams()) for i, p in enumerate(prompts)]


def _events(tokenizer, rows: list[str]) -> list[Event]:
    """Each row's text as one event per token, rows interleaved; the last event of a row carries its stop."""
    ids = [tokenizer.encode(t) for t in rows]
    out = []
    for step in range(max(map(len, ids))):
        for i, row in enumerate(ids):
            if step < len(row):
                out.append(Event(i, row[step], stop_reason="end_of_turn" if step == len(row) - 1 else None))
    return out


def test_rows_finish_once_each_with_their_completion_the_moment_they_end(engine) -> None:
    tokenizer = engine.tokenizer
    texts = ["one two", "three four five six", "seven"]
    finished: list[tuple[int, Completion]] = []
    rows = RowAccumulator(
        tokenizer, _requests([[1], [1, 2], [1, 2, 3]]), on_finish=lambda r, c: finished.append((r.index, c))
    )
    for event in _events(tokenizer, texts):
        assert rows.add(event) is None  # a batch sends nothing while it runs
        assert rows.done == (len(finished) == 3)
        if event.stop_reason is not None:  # the hook ran for this row as its last event arrived
            assert finished[-1][0] == event.index and finished[-1][1].text == texts[event.index]
    assert [i for i, _ in finished] == [2, 0, 1] and rows.done
    done = rows.completions()
    assert [c.text for c in done] == texts and [c.prompt_tokens for c in done] == [1, 2, 3]
    assert [c for _, c in sorted(finished, key=lambda f: f[0])] == done


def test_a_cut_call_keeps_finished_rows_and_cuts_the_others(engine) -> None:
    tokenizer = engine.tokenizer
    rows = RowAccumulator(tokenizer, _requests([[1], [1]]))
    events = _events(tokenizer, ["a", "b c d"])
    for event in events[:3]:  # row 0 ends, row 1 has two tokens
        rows.add(event)
    with pytest.raises(GenerationCancelled) as cut:
        rows.completions()
    first, second = cut.value.partial
    assert first.stop_reason == "end_of_turn" and first.text == "a"
    assert second.stop_reason == "cancelled" and second.tokens == tokenizer.encode("b c")


def test_a_stream_holds_back_stop_strings_and_a_row_cancel_ends_only_that_row(engine) -> None:
    tokenizer = engine.tokenizer
    params = SamplingParams.create(stop=["STOP"])
    rows = RowAccumulator(tokenizer, _requests([[1], [1]], params), stream=True)
    sent: dict[int, str] = {0: "", 1: ""}
    ids = tokenizer.encode(" hello ST")
    for token in ids:
        chunk = rows.add(Event(0, token))
        sent[0] += chunk.text if chunk is not None else ""
    assert sent[0] == " hello "  # "ST" could still become "STOP"
    rows.cancel(1)
    final = rows.add(Event(1, 42))
    assert final.final.stop_reason == "cancelled" and final.final.tokens == [] and final.text == ""
    assert rows.add(Event(1, 43)) is None  # a cancelled row's late events are dropped
    last = rows.add(Event(0, None, stop_reason="end_of_turn"))
    assert last.final.text == " hello ST" and last.text == "ST" and rows.done


def test_the_engine_calls_the_finish_hook_for_every_row(engine) -> None:
    seen: list[tuple[int, Completion]] = []
    prompts = [engine.tokenizer.encode("Hello", bos=True), engine.tokenizer.encode("Once upon", bos=True)]
    results = engine.generate_tokens(
        prompts, SamplingParams.create(max_tokens=3), on_finish=lambda i, c: seen.append((i, c))
    )
    assert sorted(i for i, _ in seen) == [0, 1]
    assert [c for _, c in sorted(seen, key=lambda s: s[0])] == results
    assert results == engine.batch_completion(prompts, max_tokens=3)
