"""Chat APIs and the tool loop: control flow with a scripted fake engine, and end-to-end runs on the real engine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from _chat_helpers import FakeEngine, add

from workbench import chat, tools
from workbench.errors import InputError, ToolError
from workbench.tools import CodeInterpreter
from workbench.types import ChatCompletion, Completion, Message

USER = {"role": "user", "content": "What is 2 + 3?"}


def boom(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"bad {reason}")


def _last_user(prompt: str) -> str:
    return prompt.rsplit("user<|header_end|>\n\n", 1)[-1]


# --- chat API -----------------------------------------------------------------------------------------------


def test_chat_completion_parses_calls_and_uses_the_tool_prompt() -> None:
    engine = FakeEngine(lambda prompt, n: "[add(a=2, b=3)]<|eom|>", model_id="Llama-4-Scout-17B-16E-Instruct")
    reply = chat.chat_completion(engine, [USER], tools=[add], tool_choice="required", max_tokens=32, temperature=0.0)
    assert isinstance(reply, ChatCompletion)
    assert [(c.tool_name, c.arguments) for c in reply.message.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert reply.stop_reason == reply.message.stop_reason == "end_of_message"
    assert reply.tokens and reply.prompt_tokens > 0
    prompt = engine.calls[0][0]
    assert prompt == engine.formatter.render([USER], tools=[add], tool_choice="required")
    assert '"name": "add"' in prompt and "You MUST use one of the provided functions/tools" in prompt
    assert engine.sampling == [{"max_tokens": 32, "temperature": 0.0}]


def test_batch_chat_completion_is_one_engine_batch() -> None:
    engine = FakeEngine(lambda prompt, n: f"answer to {_last_user(prompt).split('<|')[0]}<|eot|>")
    dialogs = [[{"role": "user", "content": f"q{i}"}] for i in range(4)]
    replies = chat.batch_chat_completion(engine, dialogs, top_p=0.9, seed=3)
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 4
    assert [r.message.content for r in replies] == [f"answer to q{i}" for i in range(4)]
    assert all(r.message.stop_reason == "end_of_turn" and not r.message.tool_calls for r in replies)
    assert engine.sampling == [{"top_p": 0.9, "seed": 3}]
    assert chat.batch_chat_completion(engine, []) == []
    with pytest.raises(InputError, match="list of dialogs"):
        chat.batch_chat_completion(engine, [USER])  # a single dialog, not a list of dialogs


@pytest.mark.parametrize("names", [True, False])
def test_streaming_text_and_code(names: bool) -> None:
    engine = FakeEngine(
        lambda prompt, n: "Let me compute.<|python_start|>print(2 + 3)<|python_end|><|eom|>", stream_special_names=names
    )
    items = list(chat.chat_completion(engine, [USER], stream=True, max_tokens=64))
    final = items[-1]
    assert isinstance(final, ChatCompletion)
    text = "".join(i.text for i in items if isinstance(i, chat.TextDelta))
    code = "".join(i.text for i in items if isinstance(i, chat.ToolCallDelta) and i.parse_status == "in_progress")
    assert text == "Let me compute." and code == "print(2 + 3)"
    done = [i for i in items if isinstance(i, chat.ToolCallDelta) and i.parse_status == "succeeded"]
    assert [(d.tool_call.tool_name, d.tool_call.arguments) for d in done] == [
        ("code_interpreter", {"code": "print(2 + 3)"})
    ]
    assert final.message.tool_calls[0].call_id == done[0].tool_call.call_id
    assert final.stop_reason == "end_of_message" and final.message.content == "Let me compute."


def test_streaming_plain_text_and_python_list_calls() -> None:
    engine = FakeEngine(lambda prompt, n: "Bonjour, ça va ? 🙂<|eot|>")
    items = list(chat.chat_completion(engine, [USER], stream=True))
    assert "".join(i.text for i in items if isinstance(i, chat.TextDelta)) == "Bonjour, ça va ? 🙂"
    assert isinstance(items[-1], ChatCompletion) and items[-1].message.content == "Bonjour, ça va ? 🙂"
    engine = FakeEngine(lambda prompt, n: "[add(a=1, b=2), add(a=3, b=4)]")
    items = list(chat.chat_completion(engine, [USER], tools=[add], stream=True))
    done = [i.tool_call.arguments for i in items if isinstance(i, chat.ToolCallDelta) and i.parse_status == "succeeded"]
    assert done == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    assert items[-1].stop_reason == "out_of_tokens"
    engine = FakeEngine(lambda prompt, n: '<function=add>{"a": }</function>')
    items = list(chat.chat_completion(engine, [USER], tools=[add], stream=True))
    failed = [i for i in items if isinstance(i, chat.ToolCallDelta) and i.parse_status == "failed"]
    assert len(failed) == 1 and items[-1].message.parse_error == failed[0].text


@pytest.mark.parametrize("level", ["1", "2"])
def test_llama_models_debug_prints_prompts(level: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("LLAMA_MODELS_DEBUG", level)
    engine = FakeEngine(lambda prompt, n: "ok")
    chat.batch_chat_completion(engine, [[USER], [{"role": "user", "content": "second"}]])
    err = capsys.readouterr().err
    assert err.count("Input to model:") == 2 and "What is 2 + 3?" in err and "second" in err
    assert ("Token ids" in err) == (level == "2")
    monkeypatch.setenv("LLAMA_MODELS_DEBUG", "0")
    chat.chat_completion(engine, [USER])
    assert capsys.readouterr().err == ""


# --- tool loop ----------------------------------------------------------------------------------------------


def test_loop_runs_tools_until_final_answer() -> None:
    def script(prompt: str, n: int) -> str:
        return "[add(a=2, b=3)]<|eom|>" if n == 0 else "2 + 3 = 5.<|eot|>"

    engine = FakeEngine(script)
    transcript = tools.run(engine, [USER], tools=[add], max_turns=4, temperature=0.0)
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]
    call = transcript[1].tool_calls[0]
    assert transcript[2].call_id == call.call_id and transcript[2].content == "5"
    assert transcript[3].content == "2 + 3 = 5." and not transcript[3].tool_calls
    assert len(engine.calls) == 2
    # the second prompt carries the call and the ipython response, ending with the open assistant header
    assert (
        "<|header_start|>ipython<|header_end|>\n\n5<|eom|><|header_start|>assistant<|header_end|>\n\n"
        in engine.calls[1][0]
    )
    assert all(s == {"temperature": 0.0} for s in engine.sampling)


def test_tool_errors_unknown_tools_and_bad_arguments_become_messages() -> None:
    reply = '[boom(reason="x"), nope(q=1), add(a=1), add(a=1, b=2, c=3), add(a=1, b=2)]<|eom|>'
    engine = FakeEngine(lambda prompt, n: reply if n == 0 else "done<|eot|>")
    transcript = tools.run(engine, [USER], tools=[add, boom])
    results = [m.content for m in transcript if m.role == "tool"]
    assert results[0] == "Error: tool 'boom' raised ValueError: bad x"
    assert results[1].startswith("Error: unknown tool 'nope'. Available tools: add, boom")
    assert (
        results[2].startswith("Error: invalid arguments for tool 'add'") and "missing a required argument" in results[2]
    )
    assert results[3].startswith("Error: invalid arguments for tool 'add'")
    assert results[4] == "3"
    calls = transcript[1].tool_calls
    assert [m.call_id for m in transcript if m.role == "tool"] == [c.call_id for c in calls]
    assert transcript[-1].content == "done"


def test_max_turns_stops_a_model_that_keeps_calling() -> None:
    engine = FakeEngine(lambda prompt, n: "[add(a=1, b=1)]<|eom|>")
    transcript = tools.run(engine, [USER], tools=[add], max_turns=3)
    assert [m.role for m in transcript] == ["user"] + ["assistant", "tool"] * 3
    assert len(engine.calls) == 3
    with pytest.raises(InputError, match="max_turns"):
        tools.run(engine, [USER], tools=[add], max_turns=0)


def test_a_repeated_reply_gets_call_ids_of_its_own_turn() -> None:
    # call ids derive from the reply's text (a re-run equals the first run), so the same call in a later turn
    # needs the turn in its id: every tool message answers exactly one call of the transcript
    engine = FakeEngine(lambda prompt, n: "[add(a=1, b=1)]<|eom|>")
    first = tools.run(engine, [USER], tools=[add], max_turns=3)
    calls = [c.call_id for m in first if m.role == "assistant" for c in m.tool_calls]
    answers = [m.call_id for m in first if m.role == "tool"]
    assert len(set(calls)) == 3 and answers == calls
    assert first == tools.run(engine, [USER], tools=[add], max_turns=3)  # deterministic: the same ids again


def test_run_batch_batches_each_turn_over_running_dialogs() -> None:
    def script(prompt: str, n: int) -> str:
        question = _last_user(prompt).split("<|")[0]  # dialog k needs k tool calls before it answers
        needed = int(question[-1])
        done = prompt.count("<|header_start|>ipython")
        return "[add(a=1, b=1)]<|eom|>" if done < needed else f"finished {question}<|eot|>"

    engine = FakeEngine(script)
    dialogs = [[{"role": "user", "content": f"dialog {k}"}] for k in (0, 2, 1)]
    transcripts = tools.run_turns(engine, dialogs, tools=[add], max_turns=5)  # the turn-synchronous loop
    assert [len(batch) for batch in engine.calls] == [3, 2, 1]
    assert [t[-1].content for t in transcripts] == ["finished dialog 0", "finished dialog 2", "finished dialog 1"]
    assert [sum(m.role == "tool" for m in t) for t in transcripts] == [0, 2, 1]
    assert tools.run_turns(engine, [], tools=[add]) == []
    engine.calls.clear()
    per_dialog = tools.run_batch(engine, dialogs, tools=[add], max_turns=5)  # each dialog's turns on its own
    assert per_dialog == transcripts and sorted(len(batch) for batch in engine.calls) == [1] * 6
    assert tools.run_batch(engine, [], tools=[add]) == []


def test_forced_tool_choice_applies_to_first_turn_only() -> None:
    engine = FakeEngine(lambda prompt, n: "[add(a=1, b=2)]<|eom|>" if n == 0 else "3<|eot|>")
    tools.run(engine, [USER], tools=[add], tool_choice="add")
    assert "You MUST use the tool `add`" in engine.calls[0][0]
    assert "You MUST" not in engine.calls[1][0]


def test_tool_choice_none_does_not_run_tools() -> None:
    ran = []

    def record(x: int) -> int:
        ran.append(x)
        return x

    engine = FakeEngine(lambda prompt, n: "[record(x=1)]<|eom|>")
    transcript = tools.run(engine, [USER], tools=[record], tool_choice="none")
    assert ran == [] and [m.role for m in transcript] == ["user", "assistant"]


def test_malformed_call_ends_the_loop_with_parse_error() -> None:
    engine = FakeEngine(lambda prompt, n: '<function=add>{"a": 1,,}</function><|eom|>')
    transcript = tools.run(engine, [USER], tools=[add])
    assert [m.role for m in transcript] == ["user", "assistant"]
    assert transcript[-1].parse_error and transcript[-1].content.startswith("<function=add>")


def test_llama3_builtin_calls_and_results() -> None:
    def brave_search(query: str) -> list[str]:
        """Search the web."""
        return [f"result for {query}"]

    def script(prompt: str, n: int) -> str:
        return '<|python_tag|>brave_search.call(query="paris")<|eom_id|>' if n == 0 else "Found it.<|eot_id|>"

    engine = FakeEngine(script, family="llama3", model_id="Llama3.1-8B-Instruct")
    transcript = tools.run(engine, [USER], tools=[brave_search])
    assert "Environment: ipython\nTools: brave_search\nCutting Knowledge Date: December 2023" in engine.calls[0][0]
    assert transcript[2].content == '["result for paris"]'
    assert transcript[1].stop_reason == "end_of_message"
    assert 'brave_search.call(query="paris")<|eom_id|><|start_header_id|>ipython' in engine.calls[1][0]


# --- code interpreter ---------------------------------------------------------------------------------------


def test_code_interpreter_is_off_unless_enabled(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    code = f"open({str(marker)!r}, 'w').write('x')\nprint('hi')"
    engine = FakeEngine(lambda prompt, n: f"<|python_start|>{code}<|python_end|><|eom|>" if n == 0 else "ok<|eot|>")
    transcript = tools.run(engine, [USER])
    assert "not enabled" in transcript[2].content and not marker.exists()
    with pytest.raises(ToolError, match="never runs in the kernel"):

        def code_interpreter(code: str) -> str:
            return str(eval(code))  # noqa: S307

        tools.run(engine, [USER], tools=[code_interpreter])


def test_code_interpreter_runs_in_a_subprocess(tmp_path: Path) -> None:
    code = "import os\nprint('pid', os.getpid())\nprint(sum(range(10)))"
    engine = FakeEngine(lambda prompt, n: f"<|python_start|>{code}<|python_end|><|eom|>" if n == 0 else "45<|eot|>")
    transcript = tools.run(engine, [USER], code_interpreter=True)
    result = transcript[2].content
    assert result.startswith("completed\n[stdout]\npid ") and "\n45\n[/stdout]" in result
    assert f"pid {os.getpid()}\n" not in result
    # enabling the interpreter declares the built-in: the Llama 4 system prompt is the environment line alone
    assert engine.calls[0][0].startswith(
        "<|begin_of_text|><|header_start|>system<|header_end|>\n\nEnvironment: ipython<|eot|>"
    )


@pytest.mark.timeout(120)  # hang guard: the run only returns if the timeout also killed the grandchild
def test_code_interpreter_errors_and_timeout() -> None:
    interp = CodeInterpreter(timeout=1.0)
    failed = interp.run("raise SystemExit('nope')")
    assert failed.startswith("failed\n[stderr]\nnope")
    err = interp.run("1/0")
    assert err.startswith("failed") and "ZeroDivisionError" in err
    spawn = "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    slow = interp.run(spawn + "while True: pass")
    assert slow.startswith("timed out")
    assert CodeInterpreter(max_output_chars=10).run("print('x' * 100)").endswith("(90 chars cut)\n[/stdout]")
    with pytest.raises(ToolError, match="timeout"):
        CodeInterpreter(timeout=0)


# --- the real engine ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_engine():
    import workbench as wb

    return wb.load()


class _ScriptedFirstTurn:
    """The real engine generating every turn, with the first reply's text replaced by a tool call: the loop's
    later prompts (with the call and the tool response) then run through the real model."""

    def __init__(self, engine: Any, first_reply: str) -> None:
        self.engine, self.first_reply = engine, first_reply
        self.tokenizer, self.formatter, self.family = engine.tokenizer, engine.formatter, engine.family
        self.prompts: list[list[list[int]]] = []

    def batch_completion(self, prompts: list[list[int]], **sampling: Any) -> list[Completion]:
        self.prompts.append(prompts)
        real = self.engine.batch_completion(prompts, **sampling)
        if len(self.prompts) > 1:
            return real
        ids = self.tokenizer.encode(self.first_reply)
        return [
            Completion(text=self.first_reply, tokens=ids, stop_reason="end_of_message", prompt_tokens=r.prompt_tokens)
            for r in real
        ]

    def batch_chat_completion(self, dialogs: list[Any], tools: Any = None, **kwargs: Any) -> list[ChatCompletion]:
        return chat.batch_chat_completion(self, dialogs, tools, **kwargs)


def test_loop_end_to_end_on_real_engine(real_engine: Any) -> None:
    sampling = {"max_tokens": 6, "temperature": 0.0}
    transcript = tools.run(real_engine, [USER], tools=[add], max_turns=2, **sampling)
    assert transcript[0] == Message(role="user", content=USER["content"])
    reply = real_engine.chat_completion([USER], tools=[add], **sampling)
    assert transcript[1].role == "assistant" and transcript[1].content == reply.message.content
    n_calls = len(transcript[1].tool_calls)
    if n_calls:  # a random model could write a call; then each gets an answer
        assert [m.call_id for m in transcript[2 : 2 + n_calls]] == [c.call_id for c in transcript[1].tool_calls]
    else:
        assert len(transcript) == 2 and transcript[1].stop_reason in ("out_of_tokens", "end_of_turn", "end_of_message")

    proxy = _ScriptedFirstTurn(real_engine, "[add(a=2, b=3)]")
    dialogs = [[USER], [{"role": "user", "content": "And 7 + 8?"}]]
    # the turn-synchronous loop: the proxy scripts the first call, which holds both dialogs' first turns
    transcripts = tools.run_turns(proxy, dialogs, tools=[add], max_turns=2, **sampling)
    assert [len(p) for p in proxy.prompts] == [2, 2]
    for t in transcripts:
        # the second reply is the real model's: an answer, or (max_turns=2 reached) a call whose result ends it
        roles = ["user", "assistant", "tool", "assistant"] + ["tool"] * len(t[3].tool_calls)
        assert [m.role for m in t] == roles
        assert t[2].content == "5" and t[2].call_id == t[1].tool_calls[0].call_id
        assert t[3].stop_reason in ("out_of_tokens", "end_of_turn", "end_of_message")
    second_prompt = real_engine.tokenizer.decode(proxy.prompts[1][0])
    assert second_prompt.endswith(
        "<|header_start|>ipython<|header_end|>\n\n5<|eom|><|header_start|>assistant<|header_end|>\n\n"
    )
    assert "[add(a=2, b=3)]<|eom|>" in second_prompt
    expected = real_engine.chat_completion(transcripts[0][:3], tools=[add], **sampling)
    assert transcripts[0][3].content == expected.message.content


def test_streaming_on_real_engine(real_engine: Any) -> None:
    items = list(real_engine.chat_completion([USER], stream=True, max_tokens=6, temperature=0.0))
    final = items[-1]
    assert isinstance(final, ChatCompletion) and len(final.tokens) <= 6
    assert all(isinstance(i, (chat.TextDelta, chat.ToolCallDelta)) for i in items[:-1])
    streamed = "".join(i.text for i in items[:-1] if isinstance(i, chat.TextDelta) or i.parse_status == "in_progress")
    for marker in ("<|python_start|>", "<|python_end|>"):
        assert marker not in streamed
    assert streamed.strip() == final.message.content or final.message.tool_calls or final.message.parse_error
    assert streamed.strip() == final.text.strip() or "<|python_" in final.text
    again = real_engine.chat_completion([USER], max_tokens=6, temperature=0.0)
    assert again.tokens == final.tokens and again.message.content == final.message.content
