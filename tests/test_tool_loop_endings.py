"""Why a tool-loop transcript ended (``Transcript.stop_reason``), for every ending, and that a tool call cut
by ``max_tokens`` is never a call: it stays text, says why, and the loop never runs it."""

from __future__ import annotations

import threading

import pytest

import workbench as wb
from workbench import tools
from workbench.demo.tools import get_weather
from workbench.errors import GenerationCancelled
from workbench.types import TRANSCRIPT_STOP_REASONS, ChatCompletion, Message, ToolCall

PARIS = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture(scope="module")
def demo():
    engine = wb.load()
    yield engine
    wb.unload()


class _Recorder:
    """A get_weather that remembers every call it ran."""

    def __init__(self, result: str = "29 C and snowy") -> None:
        self.calls: list[str] = []
        self.result = result

    def get_weather(self, city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city's name.
        """
        self.calls.append(city)
        return self.result


def test_answered_and_the_card_and_frame_say_so(demo) -> None:
    transcript = tools.run(demo, PARIS, [get_weather], max_tokens=64)
    assert transcript.stop_reason == "answered" and transcript[-1].role == "assistant"
    assert transcript.generated_tokens > 0 and "(ended: answered)" in repr(transcript)
    assert "ended:" in transcript._repr_html_() and "answered" in transcript._repr_html_()
    assert set(wb.to_frame(transcript)["dialog_ended"]) == {"answered"}


def test_max_turns(demo) -> None:
    transcript = tools.run(demo, PARIS, [get_weather], max_tokens=64, max_turns=1)
    assert transcript.stop_reason == "max_turns" and transcript[-1].role == "tool"


def test_prompt_too_long_ends_only_the_dialog_that_no_longer_fits(demo) -> None:
    huge = _Recorder(result="snow " * demo.max_seq_len)  # the tool's answer alone exceeds max_seq_len
    small = _Recorder()
    dialogs = [PARIS, [{"role": "user", "content": "What's the weather in Oslo?"}]]

    # one toolbox for both dialogs: the huge result goes to Paris only
    def get_weather(city: str) -> str:  # noqa: ANN202
        """Current weather for a city.

        Args:
            city: The city's name.
        """
        return (huge if city == "Paris" else small).get_weather(city)

    paris, oslo = tools.run_batch(demo, dialogs, [get_weather], max_tokens=64)
    assert huge.calls == ["Paris"] and paris.stop_reason == "prompt_too_long" and paris[-1].role == "tool"
    assert oslo.stop_reason == "answered" and small.calls == ["Oslo"]


def test_out_of_tokens_inside_a_call_runs_nothing(demo) -> None:
    recorder = _Recorder()
    transcript = tools.run(demo, PARIS, [recorder.get_weather], max_tokens=4)
    assert recorder.calls == [] and transcript.stop_reason == "out_of_tokens"
    reply = transcript[-1]
    assert reply.role == "assistant" and reply.tool_calls == [] and "ran out of tokens" in reply.parse_error


@pytest.mark.parametrize("constrained", [True, False], ids=["constrained", "plain"])
def test_a_call_cut_by_max_tokens_is_no_call(demo, constrained: bool) -> None:
    kwargs = {"tool_choice": "get_weather", "constrain_tools": True} if constrained else {}
    whole = demo.chat_completion(PARIS, tools=[get_weather], max_tokens=64, **kwargs)
    assert [c.tool_name for c in whole.message.tool_calls] == ["get_weather"]  # the uncut reply is a call
    cut = demo.chat_completion(PARIS, tools=[get_weather], max_tokens=4, **kwargs)
    assert cut.stop_reason == "out_of_tokens" and cut.message.tool_calls == []
    assert cut.message.content and whole.message.content == "" and cut.text.startswith("[get_weather(")
    assert "ran out of tokens" in cut.message.parse_error and "max_tokens" in cut.message.parse_error
    if constrained:
        assert cut.format_error and "max_tokens" in cut.format_error
    streamed = list(demo.stream_chat_completion(PARIS, tools=[get_weather], max_tokens=4, **kwargs))
    final = streamed[-1]
    assert isinstance(final, ChatCompletion) and final.message.tool_calls == [] and final.tokens == cut.tokens
    assert not any(getattr(item, "tool_call", None) for item in streamed[:-1])


class _Scripted:
    """An engine stand-in whose replies are fixed, for the endings a tiny model does not reach on demand."""

    max_seq_len = 4096

    def __init__(self, reply: Message) -> None:
        self.reply = reply

    def batch_chat_completion(self, dialogs, **kwargs):  # noqa: ANN001, ANN201
        return [ChatCompletion(message=self.reply, tokens=[1, 2], stop_reason="end_of_message") for _ in dialogs]


def test_tool_choice_none_does_not_run_the_call() -> None:
    recorder = _Recorder()
    call = Message(role="assistant", content="", tool_calls=[ToolCall("get_weather", {"city": "Paris"})])
    transcript = tools.run(_Scripted(call), PARIS, [recorder.get_weather], tool_choice="none")
    assert transcript.stop_reason == "tool_choice_none" and recorder.calls == []


def test_cancelled_keeps_the_transcripts(llama3_dir) -> None:
    engine = wb.load(llama3_dir, model="Llama3.2-1B-Instruct", max_seq_len=1024)
    try:
        timer = threading.Timer(1.0, engine.cancel)
        timer.start()
        with pytest.raises(GenerationCancelled) as stopped:
            tools.run_batch(engine, [PARIS, PARIS], [get_weather], max_tokens=800)
        timer.cancel()
        transcripts = stopped.value.transcripts
        assert [t.stop_reason for t in transcripts] == ["cancelled", "cancelled"]
        assert all(t[-1].role == "assistant" and t[-1].stop_reason == "cancelled" for t in transcripts)
        again = tools.run(engine, PARIS, [get_weather], max_tokens=4)  # the engine is still usable
        assert again.stop_reason in TRANSCRIPT_STOP_REASONS
    finally:
        wb.unload()
