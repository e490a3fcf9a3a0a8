"""The tool loop that moves each dialog on its own: ``as_completed``, ``run_batch`` and ``run``.

Why: in a turn-synchronous loop (:func:`~.loop.run_turns`) every dialog waits for the slowest reply of its turn
and then for every tool call of every dialog, run one after another; a 1 s tool in 8 dialogs costs 8 s a turn.
Here each dialog is driven by a thread of its own: its turn is one chat call of its own (the engine's running
batch decodes it beside every other dialog's, :mod:`workbench.engine.loop`), and the moment its reply ends its
tool calls run in a shared pool of ``tool_concurrency`` workers (``1``: one call at a time, for tools that are not
thread-safe; ``async def`` tools are awaited) while the other dialogs keep decoding; its next turn then joins the
running batch.  Each dialog's transcript depends only on its own replies and tool results, so greedy and seeded
transcripts equal the turn-synchronous loop's, and the run store's rows (one per turn, keyed by the turn's prompt)
are the same rows: a store written by either loop answers the other.

``as_completed`` yields ``(index, transcript)`` as each dialog ends; ``run_batch`` returns them in input order.
A cancel (``engine.cancel()``) ends the dialogs whose call it hit with their cut replies and the others at their
next turn (``stop_reason="cancelled"``), then raises :class:`~workbench.errors.GenerationCancelled` carrying every
transcript; an error in one dialog's call (bad input) stops the others the same way and is raised.  Ctrl-C (or
leaving ``as_completed`` early) interrupts the loop's own threads: their engine calls end, a running
code-interpreter run is killed, a Python tool still running is abandoned (as ``tool_timeout`` does).
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from workbench.engine.interfaces import ChatEngine
from workbench.engine.llama_stack import llama_stack_spellings
from workbench.errors import GenerationCancelled, InputError, PromptTooLongError
from workbench.progress import TokenRate, progress_bar
from workbench.tools.loop import CHAT_OPTIONS, Dialog, complete_turn, later_choice, make_dialogs
from workbench.tools.toolbox import CodeInterpreter
from workbench.types import Message, ToolCall, Transcript

# Tool calls running at once, all dialogs together (``tool_concurrency=``).
DEFAULT_TOOL_CONCURRENCY = 8
# Dialogs driven at once (each by a thread that mostly waits); more wait for one to end.
MAX_DIALOG_THREADS = 128
POLL_S = 0.1


def _interrupt(thread_id: int) -> None:
    """Raise KeyboardInterrupt in the thread ``thread_id`` at its next bytecode (what Ctrl-C does to the kernel's
    main thread), so that a dialog's engine call ends its rows and a sandboxed run is killed."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(KeyboardInterrupt))


class _Flow:
    """One ``as_completed`` run: the dialogs, their threads, the tool pool and the events they report."""

    def __init__(
        self,
        engine: ChatEngine,
        dialogs: list[Dialog],
        *,
        max_turns: int,
        tool_choice: Any,
        tool_prompt_format: Any,
        constrain_tools: bool,
        chat_options: dict[str, Any],
        sampling: dict[str, Any],
        tool_concurrency: int,
    ) -> None:
        self.engine = engine
        self.dialogs = dialogs
        self.max_turns = max_turns
        self.tool_choice = tool_choice
        self.tool_prompt_format = tool_prompt_format
        self.constrain_tools = constrain_tools
        self.chat_options = chat_options
        seeds = sampling.get("seed")
        self.seeds = list(seeds) if isinstance(seeds, (list, tuple)) else None  # one seed per dialog
        if self.seeds is not None and len(self.seeds) != len(dialogs):
            raise InputError(f"seed has {len(self.seeds)} entries for {len(dialogs)} dialogs; give one per dialog")
        self.sampling = sampling
        self.events: queue.SimpleQueue[tuple[str, int, Any]] = queue.SimpleQueue()
        self.stop = threading.Event()  # a cancel, an error or an interrupt: every dialog ends at its next turn
        self.pool = ThreadPoolExecutor(tool_concurrency, thread_name_prefix="workbench-tool")
        self.lock = threading.Lock()
        self.busy: set[int] = set()  # ids of the threads running a dialog or a tool now

    # ----------------------------------------------------------------------------- one dialog (its thread)
    def drive(self, k: int) -> None:
        with self.lock:
            self.busy.add(threading.get_ident())
        try:
            self._turns(k, self.dialogs[k])
            self.events.put(("done", k, None))
        except BaseException as exc:  # noqa: BLE001 - reported to the consumer, which decides
            self.events.put(("done", k, exc))
        finally:
            with self.lock:
                self.busy.discard(threading.get_ident())

    def _turns(self, k: int, dialog: Dialog) -> None:
        """Dialog ``k``'s turns, as :func:`~.loop.run_turns` takes them for every dialog at once."""
        sampling = self.sampling if self.seeds is None else {**self.sampling, "seed": self.seeds[k]}
        from_store: bool | None = None
        for turn in range(self.max_turns):
            if self.stop.is_set():
                dialog.end("cancelled")
                return
            options = self.chat_options
            if self.constrain_tools and turn == 0:
                options = dict(options, constrain_tools=True)
            try:
                replies = complete_turn(
                    self.engine,
                    [dialog],
                    tool_prompt_format=self.tool_prompt_format,
                    chat_options=options,
                    sampling=sampling,
                    too_long="raise" if turn == 0 else "end",
                )
            except PromptTooLongError as error:  # the caller's own dialog does not fit: name its place
                error.rows = [k]
                raise
            if not replies:  # a tool result made it too long: ended
                break
            reply = replies[0][1]
            calls = dialog.add(reply).tool_calls
            from_store = (from_store is not False) and reply.cached
            self.events.put(("tokens", k, len(reply.tokens)))
            if not calls:  # a call cut by max_tokens is no call (it stays text)
                dialog.end("out_of_tokens" if reply.stop_reason == "out_of_tokens" else "answered")
                break
            if self.tool_choice == "none":
                dialog.end("tool_choice_none")
                break
            dialog.transcript.extend(self._run_tools(dialog, calls))
            self.events.put(("tools", k, len(calls)))
            dialog.tool_choice = later_choice(self.tool_choice)
        if dialog.running:  # every reply called tools
            dialog.end("max_turns")
        dialog.transcript.cached = bool(from_store)

    def _run_tools(self, dialog: Dialog, calls: Sequence[ToolCall]) -> list[Message]:
        """Every call of one reply, at once in the shared pool; the tool messages in the calls' order."""

        def execute(call: ToolCall) -> Message:
            with self.lock:
                self.busy.add(threading.get_ident())
            try:
                return dialog.toolbox.execute(call)
            finally:
                with self.lock:
                    self.busy.discard(threading.get_ident())

        futures = [self.pool.submit(execute, call) for call in calls]
        return [future.result() for future in futures]

    # ----------------------------------------------------------------------------- the consumer
    def results(self, progress: bool | None) -> Iterator[tuple[int, Transcript]]:
        n = len(self.dialogs)
        rate = TokenRate()
        tools_run = 0
        failure: BaseException | None = None
        started = finished = 0
        bar = progress_bar(n, desc="tool loop", unit="dialog", progress=progress, rate=rate)

        def start_next() -> None:
            nonlocal started
            if started < n:
                threading.Thread(target=self.drive, args=(started,), name="workbench-dialog", daemon=True).start()
                started += 1

        try:
            for _ in range(min(n, MAX_DIALOG_THREADS)):
                start_next()
            while finished < n:
                try:
                    kind, k, value = self.events.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if kind == "tokens":
                    rate.add(value)
                elif kind == "tools":
                    tools_run += value
                if kind != "done":
                    bar.set_postfix_str(f"{rate}, {tools_run} tool calls", refresh=False)
                    continue
                finished += 1
                bar.update(1)
                start_next()
                if value is not None:
                    if failure is None or (isinstance(failure, GenerationCancelled) and not _cancel(value)):
                        failure = value  # a real error outranks the cancels it caused
                    self.stop.set()
                elif failure is None:
                    yield k, self.dialogs[k].transcript
        except BaseException:  # Ctrl-C, or the caller left as_completed early: stop our threads' work now
            self.stop.set()
            with self.lock:
                busy = list(self.busy)
            for thread_id in busy:
                _interrupt(thread_id)
            raise
        finally:
            bar.close()
            self.pool.shutdown(wait=False)
        if failure is not None:
            transcripts = [d.transcript for d in self.dialogs]
            if isinstance(failure, GenerationCancelled):
                for transcript in transcripts:
                    if transcript.stop_reason is None:
                        transcript.stop_reason = "cancelled"
                failure.transcripts = transcripts
            raise failure


def _cancel(error: BaseException) -> bool:
    return isinstance(error, GenerationCancelled)


@llama_stack_spellings(batch=("dialogs", "messages_batch"), chat=True)
def as_completed(
    engine: ChatEngine,
    dialogs: Sequence[Any],
    tools: Iterable[Any] | None = None,
    *,
    max_turns: int = 8,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    code_interpreter: bool | CodeInterpreter = False,
    constrain_tools: bool = False,
    tool_timeout: float | None = None,
    tool_concurrency: int = DEFAULT_TOOL_CONCURRENCY,
    progress: bool | None = None,
    item: Sequence[str | None] | None = None,
    **sampling: Any,
) -> Iterator[tuple[int, Transcript]]:
    """Run the tool loop on many dialogs, each on its own (see the module docstring): ``(index, transcript)`` as
    each dialog ends.  Arguments as :func:`run_batch`'s.  The dialogs start when iteration starts."""
    if not isinstance(tool_concurrency, int) or isinstance(tool_concurrency, bool) or tool_concurrency < 1:
        raise InputError(
            f"tool_concurrency must be a positive integer (1: one tool call at a time), got {tool_concurrency!r}"
        )
    loop = make_dialogs(
        dialogs,
        tools,
        max_turns=max_turns,
        tool_choice=tool_choice,
        code_interpreter=code_interpreter,
        tool_timeout=tool_timeout,
        item=item,
    )
    chat_options = {k: sampling.pop(k) for k in CHAT_OPTIONS if k in sampling}
    # One bar for the whole loop (dialogs and tool calls), so the engine's per-call bars stay off; an automatic
    # bar counts dialogs, and a single dialog gets none (as the engine's automatic bars count rows).
    single = progress is None and len(loop) == 1
    flow = _Flow(
        engine,
        loop,
        max_turns=max_turns,
        tool_choice=tool_choice,
        tool_prompt_format=tool_prompt_format,
        constrain_tools=constrain_tools,
        chat_options=chat_options,
        sampling=sampling if single else {**sampling, "progress": False},
        tool_concurrency=tool_concurrency,
    )
    return flow.results(False if single else progress)


@llama_stack_spellings(batch=("dialogs", "messages_batch"), chat=True)
def run_batch(
    engine: ChatEngine,
    dialogs: Sequence[Any],
    tools: Iterable[Any] | None = None,
    *,
    max_turns: int = 8,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    code_interpreter: bool | CodeInterpreter = False,
    constrain_tools: bool = False,
    tool_timeout: float | None = None,
    tool_concurrency: int = DEFAULT_TOOL_CONCURRENCY,
    progress: bool | None = None,
    item: Sequence[str | None] | None = None,
    **sampling: Any,
) -> list[Transcript]:
    """Run the tool loop on many dialogs, each moving on its own (its tools run while the others decode), and
    return one transcript (input messages + generated and tool messages) per dialog, in input order.

    ``constrain_tools=True`` (with ``tool_choice="required"`` or a tool name) makes the forced first reply a
    well-formed call of an offered tool with schema-valid arguments (grammar-constrained decoding).

    Whatever the model writes and whatever a tool returns or does, the loop returns transcripts: tool
    failures become tool messages, and a dialog whose tool results no longer fit ``max_seq_len`` ends with
    them.  Each transcript's ``stop_reason`` says why it ended (see :func:`run`).  A cancelled call
    (``engine.cancel()``) raises :class:`~workbench.errors.GenerationCancelled` whose ``transcripts`` hold every
    dialog so far, the cut replies included (``stop_reason="cancelled"``).  ``tool_timeout`` (seconds) bounds each
    Python tool call; ``tool_concurrency`` (default 8) bounds the tool calls running at once, all dialogs
    together (1 for tools that are not thread-safe).  ``run="name"`` (``refresh=True`` to recompute) remembers
    every turn in the run store, so a re-run loop is answered from there up to where the last one stopped (see
    :mod:`workbench.tools.loop`); each dialog is one item of the run, its turns the item's rows numbered from 0
    (``item=``: one id per dialog, e.g. case ids; default: the dialog's input without the settings, so runs that
    differ only in system prompt, tools or sampling line up).  The other keywords (``max_tokens``,
    ``temperature``, ``seed`` — one for all, or one per dialog —...) go to every turn's engine call.
    :func:`as_completed` gives the transcripts as the dialogs end; :func:`~.loop.run_turns` is the
    turn-synchronous loop (same transcripts)."""
    out: list[Transcript | None] = [None] * len(dialogs) if isinstance(dialogs, (list, tuple)) else []
    for k, transcript in as_completed(
        engine,
        dialogs,
        tools,
        max_turns=max_turns,
        tool_choice=tool_choice,
        tool_prompt_format=tool_prompt_format,
        code_interpreter=code_interpreter,
        constrain_tools=constrain_tools,
        tool_timeout=tool_timeout,
        tool_concurrency=tool_concurrency,
        progress=progress,
        item=item,
        **sampling,
    ):
        out[k] = transcript
    return out  # type: ignore[return-value]


@llama_stack_spellings(chat=True)
def run(
    engine: ChatEngine,
    messages: Any,
    tools: Iterable[Any] | None = None,
    *,
    max_turns: int = 8,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    code_interpreter: bool | CodeInterpreter = False,
    constrain_tools: bool = False,
    tool_timeout: float | None = None,
    tool_concurrency: int = DEFAULT_TOOL_CONCURRENCY,
    item: str | None = None,
    **sampling: Any,
) -> Transcript:
    """Run the tool loop on one dialog and return the whole transcript (list of :class:`Message`).

    The transcript ends with the model's final answer, or — when ``max_turns`` replies all called tools —
    with the tool messages answering the last calls; its ``stop_reason`` says which (``"answered"``,
    ``"max_turns"``, ``"prompt_too_long"``, ``"out_of_tokens"``, ``"tool_choice_none"``).  ``run="name"``
    remembers every turn in the run store as the rows of one item (``item=``, default the dialog's input without
    the settings; see :func:`run_batch`).
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
        tool_timeout=tool_timeout,
        tool_concurrency=tool_concurrency,
        item=None if item is None else [item],
        **sampling,
    )[0]
