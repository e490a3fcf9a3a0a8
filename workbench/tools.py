"""The multi-turn tool loop, and a code interpreter that runs model-written code in a subprocess.

``run(engine, messages, tools=[functions...])`` lets the model call Python functions until it answers:
each turn is one chat completion; every tool call in the reply is run and answered with a tool
(``ipython``) message; the loop ends at a reply without calls or after ``max_turns`` replies.  A tool
that raises, a call to an unknown tool, or bad arguments become tool messages saying so — the model
sees the error and the notebook never crashes.  ``run_batch`` runs many dialogs with each turn
batched across the dialogs still running.

Model-written code is never executed in the kernel: ``code_interpreter`` calls only run when the caller
opts in (``code_interpreter=True`` or a :class:`CodeInterpreter`), in a separate Python process with a
time limit, an empty temporary working directory and a minimal environment.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import chat
from .errors import InputError, ToolError
from .formats import ToolDefinition, coerce_messages, coerce_tools
from .types import ChatCompletion, Message, ToolCall


@dataclass
class CodeInterpreter:
    """Runs Python source in a fresh ``python -I`` subprocess and reports what happened.

    The result text follows llama-stack's code-interpreter tool: the status (``completed`` / ``failed`` /
    ``timed out``), then ``[stdout]``…``[/stdout]`` and ``[stderr]``…``[/stderr]`` blocks when non-empty.
    ``memory_mb`` (POSIX only) caps the child's address space.
    """

    timeout: float = 10.0
    python: str = sys.executable
    max_output_chars: int = 20_000
    memory_mb: int | None = None
    env: dict[str, str] | None = None

    def __post_init__(self) -> None:
        if not self.timeout or self.timeout <= 0:
            raise ToolError(f"CodeInterpreter timeout must be a positive number of seconds, got {self.timeout!r}")

    def _limits(self) -> Callable[[], None] | None:
        if self.memory_mb is None or os.name != "posix":
            return None
        limit = int(self.memory_mb) * 1024 * 1024

        def apply() -> None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        return apply

    def run(self, code: str) -> str:
        """Run ``code``; never raises for problems in the code itself (they are reported in the text)."""
        if not isinstance(code, str):
            return "failed\n[stderr]\ncode_interpreter needs a string 'code' argument\n[/stderr]"
        with tempfile.TemporaryDirectory(prefix="wb-code-") as workdir:
            env = {"PATH": os.environ.get("PATH", ""), "PYTHONIOENCODING": "utf-8", "HOME": workdir,
                   "MPLBACKEND": "Agg", **(self.env or {})}  # fmt: skip
            proc = subprocess.Popen(
                [self.python, "-I", "-c", code],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, so a timeout kills any children too
                preexec_fn=self._limits(),
            )
            try:
                out, err = proc.communicate(timeout=self.timeout)
                status = "completed" if proc.returncode == 0 else "failed"
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                out, err = proc.communicate()
                status = "timed out"
                err += f"\nExecution timed out after {self.timeout:g} s".encode()
        return self._report(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    __call__ = run

    def _report(self, status: str, stdout: str, stderr: str) -> str:
        pieces = [status]
        for name, text in (("stdout", stdout.strip()), ("stderr", stderr.strip())):
            if text:
                if len(text) > self.max_output_chars:
                    text = text[: self.max_output_chars] + f"\n... ({len(text) - self.max_output_chars} chars cut)"
                pieces += [f"[{name}]", text, f"[/{name}]"]
        return "\n".join(pieces)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()


@dataclass
class Toolbox:
    """The tools of a loop: their definitions (for the prompt) and implementations (to run calls)."""

    definitions: list[ToolDefinition]
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    code_interpreter: CodeInterpreter | None = None

    @classmethod
    def create(cls, tools: Iterable[Any] | None, code_interpreter: bool | CodeInterpreter | None = False) -> Toolbox:
        items: list[Any] = []
        if tools is not None:
            items = [tools] if isinstance(tools, (str, dict)) or callable(tools) else list(tools)
        given = [t for t in items if isinstance(t, CodeInterpreter)]  # an interpreter in tools is an opt-in too
        defs = coerce_tools([t for t in items if not isinstance(t, CodeInterpreter)])
        if given and code_interpreter in (False, None, True):
            code_interpreter = given[0]
        interpreter: CodeInterpreter | None
        if code_interpreter is True:
            interpreter = CodeInterpreter()
        elif isinstance(code_interpreter, CodeInterpreter):
            interpreter = code_interpreter
        elif code_interpreter in (False, None):
            interpreter = None
        else:
            raise ToolError("code_interpreter must be True/False or a CodeInterpreter(...) instance")
        for d in defs:
            if (
                d.tool_name == "code_interpreter"
                and d.function is not None
                and not isinstance(d.function, CodeInterpreter)
            ):
                raise ToolError(
                    "model-written code never runs in the kernel: enable the code interpreter with "
                    "code_interpreter=True (or CodeInterpreter(timeout=...)) instead of passing a function for it"
                )
        if interpreter is not None and not any(d.tool_name == "code_interpreter" for d in defs):
            defs.append(ToolDefinition(tool_name="code_interpreter"))
        functions = {d.tool_name: d.function for d in defs if d.function is not None}
        return cls(definitions=defs, functions=functions, code_interpreter=interpreter)

    def execute(self, call: ToolCall) -> Message:
        """Run one call; the answer (or the error) as a tool message with the call's id."""
        return Message(role="tool", content=self._run(call), call_id=call.call_id)

    def _run(self, call: ToolCall) -> str:
        name = call.tool_name
        if name == "code_interpreter":
            if self.code_interpreter is None:
                return (
                    "Error: code_interpreter is not enabled in this session; the code was not run. "
                    "Answer without running code."
                )
            return self.code_interpreter.run(call.arguments.get("code"))
        fn = self.functions.get(name)
        if fn is None:
            names = [d.tool_name for d in self.definitions]
            if name in names:
                return f"Error: tool {name!r} has no implementation in this session."
            return f"Error: unknown tool {name!r}. Available tools: {', '.join(names) or 'none'}."
        try:
            bound = inspect.signature(fn).bind(**call.arguments)
        except TypeError as exc:
            return f"Error: invalid arguments for tool {name!r}: {exc}. Expected {name}{inspect.signature(fn)}."
        except ValueError:  # no signature available: just try the call
            bound = None
        try:
            result = fn(*bound.args, **bound.kwargs) if bound is not None else fn(**call.arguments)
        except Exception as exc:  # a tool failure is information for the model, not a crash
            return f"Error: tool {name!r} raised {type(exc).__name__}: {exc}"
        return format_result(result)


def format_result(result: Any) -> str:
    """A tool's return value as message text: strings as they are, anything else as JSON."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


def _later_choice(tool_choice: Any) -> Any:
    """A forced tool choice applies to the first reply only; afterwards the model may answer."""
    return tool_choice if tool_choice in ("auto", "none", None) else "auto"


def _complete(engine: Any, dialogs: list[list[Message]], toolbox: Toolbox, tool_choice: Any,
              tool_prompt_format: Any, sampling: dict[str, Any]) -> list[ChatCompletion]:  # fmt: skip
    method = getattr(engine, "batch_chat_completion", None)
    kwargs = dict(tools=toolbox.definitions, tool_choice=tool_choice, tool_prompt_format=tool_prompt_format,
                  **sampling)  # fmt: skip
    if callable(method):
        return method(dialogs, **kwargs)
    return chat.batch_chat_completion(engine, dialogs, **kwargs)


def run_batch(
    engine: Any,
    dialogs: Sequence[Any],
    tools: Iterable[Any] | None = None,
    *,
    max_turns: int = 8,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    code_interpreter: bool | CodeInterpreter = False,
    constrain_tools: bool = False,
    **sampling: Any,
) -> list[list[Message]]:
    """Run the tool loop on many dialogs; each turn is one batched chat completion over the dialogs that
    are still running.  Returns one transcript (input messages + generated and tool messages) per dialog.

    ``constrain_tools=True`` (with ``tool_choice="required"`` or a tool name) makes the forced first reply a
    well-formed call of an offered tool with schema-valid arguments (grammar-constrained decoding)."""
    if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
        raise InputError(f"max_turns must be a positive integer, got {max_turns!r}")
    if not isinstance(dialogs, (list, tuple)):
        raise InputError("run_batch takes a list of dialogs (each a list of messages); for one dialog use run()")
    from .display import Transcript

    toolbox = Toolbox.create(tools, code_interpreter)
    transcripts = [Transcript(coerce_messages(d)) for d in dialogs]
    active = list(range(len(transcripts)))
    for turn in range(max_turns):
        if not active:
            break
        choice = tool_choice if turn == 0 else _later_choice(tool_choice)
        turn_sampling = dict(sampling, constrain_tools=True) if constrain_tools and turn == 0 else sampling
        replies = _complete(engine, [transcripts[i] for i in active], toolbox, choice, tool_prompt_format,
                            turn_sampling)  # fmt: skip
        still_running = []
        for i, reply in zip(active, replies):
            message = reply.message
            transcripts[i].append(message)
            if not message.tool_calls or tool_choice == "none":
                continue
            for call in message.tool_calls:
                transcripts[i].append(toolbox.execute(call))
            still_running.append(i)
        active = still_running
    return transcripts


def run(
    engine: Any,
    messages: Any,
    tools: Iterable[Any] | None = None,
    *,
    max_turns: int = 8,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    code_interpreter: bool | CodeInterpreter = False,
    constrain_tools: bool = False,
    **sampling: Any,
) -> list[Message]:
    """Run the tool loop on one dialog and return the whole transcript (list of :class:`Message`).

    The transcript ends with the model's final answer, or — when ``max_turns`` replies all called tools —
    with the tool messages answering the last calls.
    """
    return run_batch(
        engine,
        [messages],
        tools,
        max_turns=max_turns,
        tool_choice=tool_choice,
        tool_prompt_format=tool_prompt_format,
        code_interpreter=code_interpreter,
        constrain_tools=constrain_tools,
        **sampling,
    )[0]
