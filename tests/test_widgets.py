"""The chat playground and quantization toggle, driven programmatically on real tiny engines."""

from __future__ import annotations

import pytest

from workbench.errors import QuantizationError
from workbench.generation import Event
from workbench.notebook import widgets
from workbench.session import build_engine, resolve_settings

SYSTEM = "You are a terse assistant."


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: the city name
    """
    return f"sunny, 22C in {city}"


@pytest.fixture(scope="module")
def engine(llama4_dir):
    return build_engine(resolve_settings(llama4_dir, max_batch_size=2, max_seq_len=512))


@pytest.fixture(autouse=True)
def draw_every_token(monkeypatch):
    monkeypatch.setattr(widgets, "STREAM_REFRESH_S", 0.0)


class ScriptedRunner:
    """Stands in for the model: emits scripted replies token by token through the real engine, so the real
    streaming, prompt format and call parser run.  Records every prompt."""

    def __init__(self, engine, replies):
        self.inner, self.tokenizer, self.replies, self.prompts = engine._runner, engine.tokenizer, list(replies), []
        self.pending: list[list[Event]] = []  # the scripted events each running request has left

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, requests):
        sp = self.tokenizer.special_tokens
        for request in requests:
            self.prompts.append(request.prompt)
            text, stop = self.replies.pop(0)
            for tok in self.tokenizer.encode(text):
                yield Event(request.index, tok)
            yield Event(request.index, None, stop_reason="end_of_message" if stop == "<|eom|>" else "end_of_turn")
            assert stop in sp

    def step(self, add, cancel):
        """One step of the engine's loop: each running request's next scripted event (one token a step)."""
        self.pending.extend(list(self.generate([request])) for request in add)
        events = [left.pop(0) for left in self.pending]
        self.pending = [left for left in self.pending if left]
        return events


def _watch(playground, callback):
    playground.transcript.observe(lambda change: callback(change["new"]), names="value")


def test_send_streams_the_reply_and_matches_chat_completion(engine):
    pg = widgets.ChatPlayground(engine, system=SYSTEM, max_tokens=24)
    frames, states = [], []
    _watch(pg, lambda html: (frames.append(html), states.append((pg.send_button.disabled, pg.stop_button.disabled))))
    new = pg.send("Hello there")
    assert [m.role for m in new] == ["user", "assistant"]
    dialog = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}]
    expected = engine.chat_completion(dialog, max_tokens=24)
    assert new[1].content == expected.message.content
    streaming = [f for f in frames if "▌" in f]
    assert len(streaming) >= 3 and len(set(streaming)) == len(streaming)  # the text grows token by token
    assert all(state == (True, False) for state, f in zip(states, frames) if "▌" in f)  # Send off, Stop on
    assert not pg.send_button.disabled and pg.stop_button.disabled and "done" in pg.status.value
    assert "prompt · " in pg.transcript.value and f"{len(pg.prompts[2])} tokens" in pg.transcript.value


def test_stop_mid_generation_then_identical_results(engine):
    dialog = [{"role": "user", "content": "Tell me a long story"}]
    reference = engine.chat_completion(dialog, max_tokens=60)
    assert len(reference.tokens) > 20
    pg = widgets.ChatPlayground(engine, max_tokens=60)
    seen = []

    def click_stop(html):
        if "▌" in html:
            seen.append(html)
            if len(seen) == 5:
                pg.stop()  # what the Stop button's callback does

    _watch(pg, click_stop)
    pg.input.value = "Tell me a long story"
    pg.send(wait=False)  # the Send button: the turn runs on a worker thread
    pg.wait(120)
    assert not pg.busy
    reply = pg.messages[-1]
    assert reply.stop_reason == "cancelled" and "stopped" in pg.status.value
    assert 0 < len(reply.content) < len(reference.message.content)
    assert reference.message.content.startswith(reply.content)
    stopped_after = int(pg.status.value.split("stopped after ")[1].split()[0])
    assert 5 <= stopped_after < len(reference.tokens)
    again = engine.chat_completion(dialog, max_tokens=60)
    assert again.tokens == reference.tokens


def test_enter_sends_and_clear_resets(engine):
    pg = widgets.ChatPlayground(engine, system=SYSTEM, max_tokens=8)
    pg.input.value = "first question"
    pg.input.submits += 1  # what Enter does in the browser
    pg.wait(60)
    assert [m.role for m in pg.messages] == ["system", "user", "assistant"] and pg.input.value == ""
    pg.clear()
    assert [m.role for m in pg.messages] == ["system"] and pg.prompts == {}
    assert "No messages yet" not in pg.transcript.value and "first question" not in pg.transcript.value


def test_error_rolls_back_the_turn_and_restores_the_text(engine):
    pg = widgets.ChatPlayground(engine, max_tokens=8)
    pg.send("short one")
    before = list(pg.messages)
    too_long = "lorem ipsum dolor " * 200
    pg.input.value = too_long
    assert pg.send() == []
    assert pg.messages == before and pg.input.value == too_long
    assert "PromptTooLongError" in pg.transcript.value and "error" in pg.status.value
    assert not pg.busy and not pg.send_button.disabled
    new = pg.send("and now a short one")  # not wedged
    assert [m.role for m in new] == ["user", "assistant"] and pg.error is None


def test_old_turns_are_trimmed_to_fit_max_seq_len(llama4_dir):
    small = build_engine(resolve_settings(llama4_dir, max_batch_size=1, max_seq_len=400))  # tool prompt: ~300
    pg = widgets.ChatPlayground(small, [get_weather], system=SYSTEM, max_tokens=8, tool_choice="none")
    for i in range(8):
        pg.send(f"question number {i} about llamas and alpacas and their wool")
    assert pg.first_sent > 1 and "older message(s) are no longer sent" in pg.transcript.value
    assert len(pg.messages) == 1 + 8 * 2  # the transcript keeps everything
    last_prompt = small.tokenizer.decode(pg.prompts[len(pg.messages) - 1])
    assert len(pg.prompts[len(pg.messages) - 1]) + 8 <= 400 and pg.error is None
    assert SYSTEM in last_prompt and "get_weather" in last_prompt and "question number 7" in last_prompt
    assert "question number 0" not in last_prompt
    small.close()


def test_tool_calls_and_results_are_linked_cards(llama4_dir):
    scripted = build_engine(resolve_settings(llama4_dir, max_batch_size=1, max_seq_len=512))
    runner = ScriptedRunner(
        scripted, [('[get_weather(city="Paris")]', "<|eom|>"), ("It is sunny in Paris.", "<|eot|>")]
    )
    scripted._runner = runner
    pg = widgets.ChatPlayground(scripted, [get_weather], max_tokens=64)
    new = pg.send("Weather in Paris?")
    assert [m.role for m in new] == ["user", "assistant", "tool", "assistant"]
    call = new[1].tool_calls[0]
    assert (call.tool_name, call.arguments) == ("get_weather", {"city": "Paris"})
    assert new[2].call_id == call.call_id and new[2].content == "sunny, 22C in Paris"
    html = pg.transcript.value
    assert "result of call #1 get_weather" in html and html.count("call #1") == 2
    assert html.count("prompt · ") == 2  # one toggle per model reply
    assert "sunny, 22C in Paris" in scripted.tokenizer.decode(runner.prompts[1])  # the result went back in
    bundle = pg._repr_mimebundle_()
    assert "VBox" not in bundle["text/plain"] and "-> get_weather" in bundle["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in bundle
    scripted._runner = runner.inner
    scripted.close()


def test_controls_change_what_is_sent(engine):
    pg = widgets.ChatPlayground(engine, [get_weather], max_tokens=4)
    pg.tools_select.value = ()
    pg.send("hi")
    assert "get_weather" not in engine.tokenizer.decode(pg.prompts[1])
    pg.tools_select.value = ("get_weather",)
    pg.max_tokens.value = 3
    new = pg.send("hi again")
    assert "get_weather" in engine.tokenizer.decode(pg.prompts[3])
    direct = engine.chat_completion(pg.messages[:-1], tools=[get_weather], max_tokens=3)
    assert new[-1].content == direct.message.content and len(direct.tokens) <= 3
    assert "quantization none" in pg.header.value and "python_list" in pg.header.value


def test_quantization_toggle_reports_and_reverts(llama4_dir, monkeypatch):
    engine = build_engine(resolve_settings(llama4_dir, max_batch_size=1, max_seq_len=64))
    toggle = widgets.QuantizationToggle(engine)
    assert toggle.dropdown.options[0] == ("none (full precision)", None)
    assert "mode <b>none</b>" in toggle.status.value
    toggle.select("bf16")
    assert engine.settings.quantization == "bf16" and "mode <b>bf16</b>" in toggle.status.value
    assert "re-loaded in" in toggle.status.value and not toggle.dropdown.disabled

    def refuse(mode, progress=None):
        raise QuantizationError(f"{mode} is not available here")

    monkeypatch.setattr(engine, "set_quantization", refuse)
    toggle.select("int4_mixed")
    assert toggle.dropdown.value == "bf16" and "could not switch to int4_mixed" in toggle.status.value
    assert "still bf16" in toggle.status.value
    assert "quantization toggle: mode bf16" in toggle._repr_mimebundle_()["text/plain"]
    engine.close()
