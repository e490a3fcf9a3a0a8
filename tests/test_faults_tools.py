"""Fault tests of the tool loop and the code interpreter: whatever the model writes and whatever a tool returns
or does, ``tools.run`` returns a transcript, and no process started by model-written code is left running."""

from __future__ import annotations

import _thread
import math
import os
import signal
import subprocess
import threading
import time
from typing import Any

import pytest
from _chat_helpers import FakeEngine

from workbench import tools
from workbench.errors import ToolError
from workbench.tools import CodeInterpreter

USER = {"role": "user", "content": "go"}
MARK = "wb-fault-sleeper"  # argv marker of processes the tests start through model-written code

# Forks a grandchild that leaves the session (setsid) and sleeps with stdout still open.  The parent goes on
# once the grandchild has printed (a byte on a pipe), so the code never ends before that line is out.
DETACH = f"""
import os, sys
printed, tell = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print("detached child alive", flush=True)
        os.write(tell, b"1")
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", "{MARK}"])
    os._exit(0)
os.read(printed, 1)
print("parent done", flush=True)
"""


def _marked() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if MARK in line and "ps -eo" not in line and " Z" not in line]


def _no_marked_process_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _marked():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(autouse=True)
def nothing_left_running():
    assert not _marked(), "a previous test left processes running"
    yield
    assert _no_marked_process_within(5), _marked()


# --- code interpreter --------------------------------------------------------------------------------------
@pytest.mark.timeout(60)  # hang guard: the old interpreter waited forever on the detached child's pipe
def test_detached_child_is_killed_when_the_code_ends() -> None:
    result = CodeInterpreter(timeout=30).run(DETACH)
    assert result.startswith("completed") and "parent done" in result and "detached child alive" in result


@pytest.mark.timeout(60)
def test_detached_child_is_killed_on_timeout() -> None:
    result = CodeInterpreter(timeout=3).run(DETACH + "\nwhile True: pass\n")
    assert result.startswith("timed out") and "Execution timed out after 3 s" in result
    assert "killed by signal" not in result


@pytest.mark.timeout(60)
def test_ctrl_c_kills_the_code_and_everything_it_started() -> None:
    sleeper = f"[sys.executable, '-c', 'import time; time.sleep(600)', '{MARK}']"
    code = DETACH + f"\nimport subprocess, sys\nsubprocess.Popen({sleeper})\nwhile True: pass\n"
    # Ctrl-C as a user's kernel gets it: KeyboardInterrupt in the main thread (interrupt_main does nothing when
    # the handler in place is SIG_IGN/SIG_DFL, which a library used by an earlier test may have left behind)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(3.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            CodeInterpreter(timeout=60).run(code)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert _no_marked_process_within(5), _marked()


@pytest.mark.timeout(60)
def test_nul_bytes_huge_code_and_huge_output() -> None:
    nul = CodeInterpreter(timeout=20).run("print('a')\x00\nprint('b')")
    assert nul.startswith("failed") and "null bytes" in nul
    interp = CodeInterpreter(timeout=20, max_output_chars=100)
    big = interp.run("x = 1\n" * 30_000 + "print(x)")  # 180 KB: more than one argv string may hold (128 KB)
    assert big.startswith("completed") and "\n1\n" in big
    flood = CodeInterpreter(timeout=3, max_output_chars=100).run(
        "import sys\nwhile True: sys.stdout.write('y' * 65536)"
    )
    assert flood.startswith("timed out") and "chars cut)" in flood and len(flood) < 1000
    lines = interp.run("for i in range(20000): print(i)")
    assert lines.startswith("completed") and lines.count("\n") < 50 and "chars cut" in lines


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(timeout="5"),
        dict(timeout=math.nan),
        dict(timeout=-1),
        dict(timeout=True),
        dict(max_output_chars=0),
        dict(memory_mb="big"),
        dict(env={"A": 1}),
    ],
)
def test_bad_interpreter_settings_are_tool_errors(kwargs: dict) -> None:
    with pytest.raises(ToolError, match=next(iter(kwargs))):
        CodeInterpreter(**kwargs)


# --- the loop --------------------------------------------------------------------------------------------------
class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    __repr__ = __str__


def unprintable() -> Any:
    """Returns something whose str() raises."""
    return Unprintable()


def listed() -> Any:
    """Returns a list holding something whose str() raises."""
    return [1, Unprintable()]


def exits() -> str:
    """Calls sys.exit."""
    raise SystemExit(3)


def raises_unprintable() -> str:
    """Raises an exception whose str() raises."""

    class Weird(Exception):
        def __str__(self) -> str:
            raise ValueError("nope")

    raise Weird()


def sleeper(seconds: float) -> str:
    """Sleeps."""
    time.sleep(seconds)
    return "woke"


def echo(x: Any = None) -> str:
    """Echoes."""
    return f"got {x!r}"


def _loop(reply: str, **kwargs: Any) -> list:
    engine = FakeEngine(lambda prompt, n: reply if n == 0 else "done<|eot|>")
    return tools.run(engine, [USER], [unprintable, listed, exits, raises_unprintable, sleeper, echo], **kwargs)


@pytest.mark.parametrize(
    "call,needle",
    [
        ("unprintable()", "cannot be printed"),
        ("listed()", "[1, "),
        ("exits()", "raised SystemExit: 3"),
        ("raises_unprintable()", "raised Weird"),
        ("nope(a=1)", "unknown tool 'nope'"),
        ("echo(y=2)", "invalid arguments for tool 'echo'"),
    ],
)
def test_tool_results_and_failures_always_become_messages(call: str, needle: str) -> None:
    transcript = _loop(f"[{call}]<|eom|>")
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]
    assert needle in transcript[2].content and transcript[-1].content == "done"


@pytest.mark.parametrize(
    "reply",
    [
        '{"name": "echo", "parameters": {"x": NaN}}<|eom|>',
        "[echo(x=" + "[" * 300 + "]" * 300 + ")]<|eom|>",
        '{"name": "echo", "parameters": {"x": ' + "[" * 5000 + "]" * 5000 + "}}<|eom|>",
        "[echo(x=1e999)]<|eom|>",
        '<function=e cho>{"x": 1}</function><|eom|>',
        '[echo(x="unterminated)]<|eom|>',
    ],
)
def test_unrenderable_calls_end_the_loop_with_a_parse_error(reply: str) -> None:
    transcript = _loop(reply)
    assert [m.role for m in transcript] == ["user", "assistant"]
    assert transcript[1].tool_calls == [] and transcript[1].parse_error


@pytest.mark.timeout(60)
def test_python_tools_get_an_optional_timeout() -> None:
    transcript = _loop("[sleeper(seconds=30)]<|eom|>", tool_timeout=0.5)
    assert "did not finish within 0.5 s" in transcript[2].content and transcript[-1].content == "done"
    fast = _loop("[sleeper(seconds=0)]<|eom|>", tool_timeout=5)
    assert fast[2].content == "woke"
    with pytest.raises(ToolError, match="tool_timeout"):
        _loop("x<|eot|>", tool_timeout="1")


@pytest.mark.timeout(90)
def test_loop_with_a_detaching_code_run_returns_and_leaves_nothing() -> None:
    engine = FakeEngine(
        lambda prompt, n: (
            f"<|python_start|>{DETACH}\nwhile True: pass<|python_end|><|eom|>" if n == 0 else "done<|eot|>"
        )
    )
    transcript = tools.run(engine, [USER], code_interpreter=CodeInterpreter(timeout=2))
    assert transcript[2].content.startswith("timed out") and transcript[-1].content == "done"


def test_tool_results_too_long_for_the_engine_end_that_dialog_only() -> None:
    from workbench.errors import PromptTooLongError

    class ShortEngine(FakeEngine):
        max_seq_len = 600

        def batch_completion(self, prompts: list, **sampling: Any) -> list:
            too_long = [i for i, p in enumerate(prompts) if len(p) >= self.max_seq_len]
            if too_long:  # as the real engine: the whole batch is refused, naming every row that does not fit
                raise PromptTooLongError("prompt too long", rows=too_long)
            return super().batch_completion(prompts, **sampling)

    def big(size: int) -> str:
        """Returns many words."""
        return "word " * size

    def script(prompt: str, n: int) -> str:
        last = prompt.rsplit("user<|header_end|>", 1)[-1]
        if "ipython" in last:
            return "fine<|eot|>"
        return "[big(size=2000)]<|eom|>" if "long" in last else "[big(size=3)]<|eom|>"

    dialogs = [[{"role": "user", "content": "long"}], [{"role": "user", "content": "short"}]]
    out = tools.run_batch(ShortEngine(script), dialogs, [big], max_turns=3)
    assert [m.role for m in out[0]] == ["user", "assistant", "tool"]  # ended with the tool result
    assert [m.role for m in out[1]] == ["user", "assistant", "tool", "assistant"] and out[1][-1].content == "fine"
    with pytest.raises(PromptTooLongError):  # the caller's own dialog too long: the caller's error
        tools.run(ShortEngine(script), [{"role": "user", "content": "word " * 2000}], [big])


def test_the_guard_processes_are_reaped() -> None:
    """After all of the above, this test process has no guard or code process left as a child."""
    listing = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(os.getpid())], capture_output=True, text=True)
    leftovers = [line for line in listing.stdout.splitlines() if "-I -S -c" in line or "wb-code-" in line]
    assert not leftovers
