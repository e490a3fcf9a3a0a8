"""Rich display: HTML cards, readable info/memory with raw numbers, DataFrames, the prompt inspector."""

from __future__ import annotations

import pandas as pd
import pytest

import workbench as wb
from workbench.demo.artifact import DEFAULT_MODEL_NAME
from workbench.errors import InputError
from workbench.notebook.display import human_bytes, messages_html
from workbench.reports import InfoReport, MemoryReport, rate_text, short_path, wilson_interval
from workbench.session import build_engine, resolve_settings
from workbench.types import Message, ToolCall


@pytest.fixture(scope="module")
def engine(llama4_dir):
    return build_engine(resolve_settings(llama4_dir, max_batch_size=4, max_seq_len=256))


def test_human_sizes():
    assert human_bytes(512) == "512 B" and human_bytes(1536) == "1.5 KiB" and human_bytes(3 * 2**30) == "3.0 GiB"


def test_info_and_memory_are_readable_and_keep_raw_numbers(engine):
    info = engine.info()
    assert isinstance(info["weights_bytes"], int) and info["weights_bytes"] > 0
    assert info.readable()["weights_bytes"].endswith("MiB")
    assert "MiB" in repr(info) and str(info["weights_bytes"]) not in repr(info)
    assert "<table" in info._repr_html_()
    memory = engine.memory()
    assert memory["kv_cache_bytes"] == info["kv_cache_bytes"]
    assert "KiB" in memory.readable()["by_kind"] or "MiB" in memory.readable()["by_kind"]


def test_wilson_interval_matches_its_closed_forms():
    z2 = 1.96**2
    assert wilson_interval(0, 15) == (0.0, pytest.approx(z2 / (15 + z2)))  # no successes: [0, z²/(n+z²)]
    assert wilson_interval(5, 5) == (pytest.approx(5 / (5 + z2)), 1.0)  # all successes: [n/(n+z²), 1]
    low, high = wilson_interval(4, 15)
    assert (round(low, 4), round(high, 4)) == (0.109, 0.5195)  # scipy's binomtest(4, 15) Wilson interval
    mirror = wilson_interval(11, 15)
    assert mirror == (pytest.approx(1 - high), pytest.approx(1 - low))
    assert all(v != v for v in wilson_interval(0, 0))  # no trials: nan
    assert rate_text(4, 15) == "0.27 [0.11, 0.52] n=15" and rate_text(0, 0) == "- (n=0)"


def test_paths_and_unnamed_models_display_without_machine_details(monkeypatch, tmp_path):
    home = tmp_path / "home" / "alice"
    monkeypatch.setattr("pathlib.Path.home", lambda: home)
    monkeypatch.delenv("WORKBENCH_CACHE", raising=False)
    assert short_path(home / ".cache" / "workbench" / "demo") == "~/.cache/workbench/demo"
    assert short_path("/ckpts/Llama3.1-8B") == "/ckpts/Llama3.1-8B"
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    assert short_path(tmp_path / "cache" / "demo") == "$WORKBENCH_CACHE/demo"
    info = InfoReport({"model_id": None, "checkpoint": str(tmp_path / "cache" / "demo")})
    assert "not given" in repr(info) and "$WORKBENCH_CACHE/demo" in repr(info) and str(tmp_path) not in repr(info)
    memory = MemoryReport(
        {"by_part": {"embedding": {"bfloat16": 2048}, "routed_experts": {"int4": 1024, "bfloat16 scales": 512}}}
    )
    assert memory.readable()["by_part"] == (
        "embedding: bfloat16 2.0 KiB; routed_experts: int4 1.0 KiB + bfloat16 scales 512 B"
    )


def test_engine_card_and_repr(engine):
    card = engine._repr_html_()
    assert "llama4" in card and "python_list" in card and "max_seq_len 256" in card
    text = repr(engine)
    assert all(len(line) < 100 for line in text.splitlines())


def test_default_engine_says_what_it_is():
    engine = wb.load()
    try:
        card = engine._repr_html_()
        assert f"embedded default: {DEFAULT_MODEL_NAME}" in card
    finally:
        wb.unload()


def test_completion_html_shades_tokens_by_logprob(engine):
    plain = engine.completion("The capital of France is", max_tokens=6)
    html = plain._repr_html_()
    assert "6 tokens" in html and "out_of_tokens" in html
    scored = engine.completion("The capital of France is", max_tokens=6, logprobs=3)
    html = scored._repr_html_()
    assert html.count("rgba(229,57,53,") == 6 and "p=" in html and "mean logprob" in html
    frame = scored.to_pandas()
    assert list(frame.columns[:4]) == ["token", "text", "logprob", "prob"] and len(frame) == 6
    assert frame["token"].tolist() == scored.tokens
    assert ((frame["prob"] > 0) & (frame["prob"] <= 1)).all()


def test_special_tokens_are_dimmed():
    from workbench.notebook.display import text_with_specials

    out = text_with_specials("a <|eot|> b <script>")
    assert "color:#999" in out and "&lt;script&gt;" in out


def test_transcript_cards_link_results_to_calls():
    call_a = ToolCall("get_weather", {"city": "Paris"}, call_id="c1")
    call_b = ToolCall("convert", {"amount": 3}, call_id="c2")
    dialog = [
        Message("user", "weather?"),
        Message("assistant", "", tool_calls=[call_a, call_b], stop_reason="end_of_message"),
        Message("tool", "sunny", call_id="c2"),
        Message("tool", "22C", call_id="c1"),
        Message("assistant", "It is sunny."),
    ]
    html = messages_html(dialog)
    assert html.count("call #1") == 2 and html.count("call #2") == 2  # each call card and its result card
    assert "result of call #2 convert" in html and "result of call #1 get_weather" in html
    transcript = wb.Transcript(dialog)
    assert transcript == dialog and "[tool] (answers c1) 22C" in repr(transcript)
    frame = wb.to_frame(transcript)
    assert frame["answers_call"].fillna("-").tolist() == ["-", "-", "convert #2", "get_weather #1", "-"]
    assert frame["role"].tolist() == ["user", "assistant", "tool", "tool", "assistant"]


def test_to_frame_of_results_and_of_transcripts(engine):
    rows = engine.batch_completion(["Hi", "Hello there"], max_tokens=4, logprobs=1)
    frame = wb.to_frame(rows)
    assert isinstance(frame, pd.DataFrame) and frame["tokens"].tolist() == [4, 4]
    assert "mean_logprob" in frame
    chats = engine.batch_chat_completion([[{"role": "user", "content": "Hi"}]] * 2, max_tokens=3)
    assert wb.to_frame(chats)["stop_reason"].tolist() == [c.stop_reason for c in chats]
    frame = wb.to_frame([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]])
    assert frame["dialog"].tolist() == [0, 1]
    with pytest.raises(TypeError):
        wb.to_frame([1, 2])


def test_tool_loop_returns_transcripts(engine):
    transcript = wb.tools.run(engine, [{"role": "user", "content": "Hi"}], max_tokens=4)
    assert isinstance(transcript, wb.Transcript) and "<div" in transcript._repr_html_()


def _weather(city: str) -> str:
    """Weather in a city.

    Args:
        city: the city
    """
    return "sunny"


def test_show_prompt_matches_the_engine_prompt(engine):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    view = wb.show_prompt(messages, tools=[_weather], engine=engine)
    assert view.ids == engine.formatter.encode_dialog(messages, tools=[_weather])
    labels = [label for label, _ in view.segments]
    assert labels[0] == "begin" and labels[-1] == "assistant (to complete)" and "user #1" in labels
    html = view._repr_html_()
    assert "#7e57c2" in html and f"{len(view)} tokens" in html and "token by token" in html
    assert sum(len(ids) for _, ids in view.segments) == len(view.ids)


def test_show_prompt_without_a_loaded_model():
    wb.unload()
    messages = [{"role": "user", "content": "Hi"}]
    view = wb.show_prompt(messages, model="Llama3.2-3B-Instruct")
    assert view.text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    assert wb.current() is None
    llama4 = wb.show_prompt(messages, model="Llama-4-Scout-17B-16E-Instruct")
    assert "<|header_start|>" in llama4.text
    with pytest.raises(InputError, match="model"):
        wb.show_prompt(messages)
