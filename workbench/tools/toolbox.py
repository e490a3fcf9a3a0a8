"""The tools of a loop: :class:`Toolbox` (the tools' definitions for the prompt and their implementations, which
run calls) and :class:`CodeInterpreter` (model-written code in a subprocess).

A tool that raises, a call to an unknown tool, or bad arguments become tool messages saying so — the model
sees the error and the notebook never crashes.  Model-written code is never executed in the kernel:
``code_interpreter`` calls only run when the caller opts in (``code_interpreter=True`` or a
:class:`CodeInterpreter`), in a separate Python process with a time limit, an empty temporary working directory
and a minimal environment, under the guard of :mod:`workbench.tools.sandbox`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import ToolError
from workbench.formats import ToolDefinition, coerce_tools
from workbench.formats.results import format_result, safe_str
from workbench.tools.sandbox import KILLED_BY, run_guarded
from workbench.types import Message, ToolCall


@dataclass
class CodeInterpreter:
    """Runs Python source in a fresh ``python -I`` subprocess and reports what happened.

    The result text follows llama-stack's code-interpreter tool: the status (``completed`` / ``failed`` /
    ``timed out``), then ``[stdout]``…``[/stdout]`` and ``[stderr]``…``[/stderr]`` blocks when non-empty.
    ``memory_mb`` (POSIX only) caps the child's address space.  The code runs under a guard process
    (:mod:`workbench.tools.sandbox`): on a timeout or Ctrl-C every process it started is killed, detached ones
    included, and reading its output never blocks on a process that outlived it.
    """

    timeout: float = 10.0
    python: str = sys.executable
    max_output_chars: int = 20_000
    memory_mb: int | None = None
    env: dict[str, str] | None = None

    def __post_init__(self) -> None:
        t = self.timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ToolError(f"CodeInterpreter timeout must be a positive number of seconds, got {t!r}")
        if (
            isinstance(self.max_output_chars, bool)
            or not isinstance(self.max_output_chars, int)
            or self.max_output_chars < 1
        ):
            raise ToolError(
                f"CodeInterpreter max_output_chars must be a positive integer, got {self.max_output_chars!r}"
            )
        if self.memory_mb is not None and (
            isinstance(self.memory_mb, bool) or not isinstance(self.memory_mb, int) or self.memory_mb < 1
        ):
            raise ToolError(f"CodeInterpreter memory_mb must be a positive integer or None, got {self.memory_mb!r}")
        if not isinstance(self.python, (str, os.PathLike)) or not str(self.python):
            raise ToolError(f"CodeInterpreter python must be the path of a Python executable, got {self.python!r}")
        if self.env is not None and (
            not isinstance(self.env, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items())
        ):
            raise ToolError("CodeInterpreter env must be a dict of str -> str")

    def run(self, code: str) -> str:
        """Run ``code``; never raises for problems in the code itself (they are reported in the text).
        Ctrl-C stops the code (and everything it started) and is re-raised."""
        if not isinstance(code, str):
            return "failed\n[stderr]\ncode_interpreter needs a string 'code' argument\n[/stderr]"
        with tempfile.TemporaryDirectory(prefix="wb-code-") as root:
            workdir = os.path.join(root, "work")
            os.mkdir(workdir)
            script = os.path.join(root, "main.py")  # a file, not `-c`: any size, and NUL bytes are a SyntaxError
            with open(script, "w", encoding="utf-8", errors="surrogatepass") as fh:
                fh.write(code)
            env = {
                "PATH": os.environ.get("PATH", ""),
                "PYTHONIOENCODING": "utf-8",
                "HOME": workdir,
                "MPLBACKEND": "Agg",
                **(self.env or {}),
            }
            try:
                result = run_guarded(
                    [str(self.python), "-I", script],
                    timeout=float(self.timeout),
                    cwd=workdir,
                    env=env,
                    output_cap=4 * self.max_output_chars + 4096,
                    memory_bytes=self.memory_mb * 1024 * 1024 if self.memory_mb else None,
                )
            except OSError as exc:
                return f"failed\n[stderr]\ncould not start {self.python!r}: {exc}\n[/stderr]"
        status = "timed out" if result.timed_out else ("completed" if result.returncode == 0 else "failed")
        err = result.stderr.decode("utf-8", "replace")
        note = ""
        if result.timed_out:  # the guard may have reported the kill it saw: the timeout says it better
            err = err.replace(f"\n{KILLED_BY} 9\n", "")
            note = f"Execution timed out after {float(self.timeout):g} s"
        return self._report(
            status,
            (result.stdout.decode("utf-8", "replace"), result.stdout_dropped),
            (err, result.stderr_dropped),
            note,
        )

    __call__ = run

    def _report(self, status: str, stdout: tuple[str, int], stderr: tuple[str, int], note: str = "") -> str:
        pieces = [status]
        for name, (text, dropped) in (("stdout", stdout), ("stderr", stderr)):
            text = text.strip()
            if len(text) > self.max_output_chars or dropped:
                cut = len(text) - self.max_output_chars + dropped
                text = text[: self.max_output_chars] + f"\n... ({cut} chars cut)"
            if name == "stderr" and note:
                text = f"{text}\n\n{note}" if text else note
            if text:
                pieces += [f"[{name}]", text, f"[/{name}]"]
        return "\n".join(pieces)


@dataclass
class Toolbox:
    """The tools of a loop: their definitions (for the prompt) and implementations (to run calls)."""

    definitions: list[ToolDefinition]
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    code_interpreter: CodeInterpreter | None = None
    tool_timeout: float | None = None  # seconds a Python tool may run (None: no limit)

    @classmethod
    def create(
        cls,
        tools: Iterable[Any] | None,
        code_interpreter: bool | CodeInterpreter | None = False,
        tool_timeout: float | None = None,
    ) -> Toolbox:
        if tool_timeout is not None and (
            isinstance(tool_timeout, bool)
            or not isinstance(tool_timeout, (int, float))
            or not math.isfinite(tool_timeout)
            or tool_timeout <= 0
        ):
            raise ToolError(f"tool_timeout must be a positive number of seconds or None, got {tool_timeout!r}")
        items: list[Any] = []
        if tools is not None:
            items = [tools] if isinstance(tools, (str, dict)) or callable(tools) else list(tools)
        given = [t for t in items if isinstance(t, CodeInterpreter)]  # an interpreter in tools is an opt-in too
        defs = list(coerce_tools([t for t in items if not isinstance(t, CodeInterpreter)]))
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
        return cls(
            definitions=defs,
            functions=functions,
            code_interpreter=interpreter,
            tool_timeout=None if tool_timeout is None else float(tool_timeout),
        )

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
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # no signature available: just try the call
            signature = None
        if signature is not None:
            try:
                signature.bind(**call.arguments)
            except TypeError as exc:
                return f"Error: invalid arguments for tool {name!r}: {exc}. Expected {name}{signature}."
        outcome = self._call(fn, call.arguments)
        if isinstance(outcome, _Failure):
            return f"Error: tool {name!r} {outcome.text}"
        return format_result(outcome)

    def _call(self, fn: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        """Call a Python tool (in a worker thread when ``tool_timeout`` is set); failures become :class:`_Failure`."""

        def attempt() -> Any:
            try:
                result = fn(**arguments)
                return awaited(result) if inspect.isawaitable(result) else result  # an ``async def`` tool
            except (Exception, SystemExit) as exc:  # a tool failure is information for the model, not a crash
                return _Failure(f"raised {type(exc).__name__}: {safe_str(exc)}")

        if self.tool_timeout is None:
            return attempt()
        box: list[Any] = []
        worker = threading.Thread(target=lambda: box.append(attempt()), daemon=True, name="workbench-tool")
        worker.start()
        worker.join(self.tool_timeout)
        if worker.is_alive():  # a thread cannot be killed: it is abandoned, and its result ignored
            return _Failure(f"did not finish within {self.tool_timeout:g} s (tool_timeout); it was abandoned")
        return box[0]


def awaited(awaitable: Any) -> Any:
    """The result of an ``async def`` tool's coroutine, run to its end on an event loop of its own (in a helper
    thread when this thread already runs one: a notebook cell's)."""

    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop running in this thread
        return asyncio.run(wait())
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, asyncio.run(wait())))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            box.append((False, exc))

    helper = threading.Thread(target=run, name="workbench-async-tool")
    helper.start()
    helper.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


@dataclass
class _Failure:
    text: str
