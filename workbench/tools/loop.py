"""The tool loop: dialogs whose replies call tools until they answer, each dialog with its own tools.

A turn is :func:`complete_turn`: one ``engine.batch_chat_completion`` over every running :class:`Dialog` — the one
chat route (:class:`~workbench.engine.interfaces.ChatEngine`), which renders each dialog with its own tools and
tool choice and parses the replies, once per call — so anything with that method drives the loop: an Engine, a
Ray pool, a scripted stand-in, an adapter over a remote endpoint.  The caller then answers each reply's calls with
its dialog's :class:`~.toolbox.Toolbox` (:meth:`Dialog.answer`).  :func:`run_batch` / :func:`run` drive it for
dialogs sharing one set of tools until each answers; the evals harness (:mod:`workbench.evals.harness`) drives it
for cases that each offer their own tools and ask several questions.

A dialog whose prompt no longer fits ``max_seq_len`` (a long tool result) ends with ``prompt_too_long`` while the
others go on (the engine's :class:`~workbench.errors.PromptTooLongError` names its rows); a cancelled call
(``engine.cancel()``, Ctrl-C) leaves every dialog's cut reply in its transcript (``stop_reason="cancelled"``) and
raises.

``run="name"`` (with the sampling keywords) stores every turn in the run store as chat rows keyed by the turn's
prompt ids, which hold the dialog so far, tool results included.  Re-running a loop answers each turn from the
store while its prompt is the same — the tools run again (their code is not keyed: their results enter the
next prompt) — so a loop killed at turn 3 is answered up to turn 2 and computes from turn 3, and a tool that
now returns something else changes every later key.  A transcript whose replies all came from the store says
``cached``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from workbench import runs
from workbench.engine.interfaces import ChatEngine
from workbench.engine.llama_stack import llama_stack_spellings
from workbench.errors import GenerationCancelled, InputError, PromptTooLongError
from workbench.formats import coerce_messages
from workbench.progress import TokenRate, progress_bar
from workbench.tools.toolbox import CodeInterpreter, Toolbox
from workbench.types import ChatCompletion, Message, ToolCall, Transcript

# Keywords of a chat call that shape the prompts and the reply formats (chat.prepare), not the sampling.
CHAT_OPTIONS = ("response_format", "system_message_behavior")


@dataclass
class Dialog:
    """One dialog in the loop: its transcript, its tools, and the tool choice of its next reply."""

    transcript: Transcript
    toolbox: Toolbox
    tool_choice: Any = "auto"
    item: str | None = None  # the item its rows answer in a run store (None: its input without the settings)

    def __post_init__(self) -> None:
        if self.item is None:  # named by its input as given, so every turn's row answers the same item
            self.item = runs.input_item(self.transcript)

    @property
    def running(self) -> bool:
        return self.transcript.stop_reason is None

    def end(self, reason: str) -> None:
        """End the dialog (``reason``: one of :data:`~workbench.types.TRANSCRIPT_STOP_REASONS`)."""
        self.transcript.stop_reason = reason

    def add(self, reply: ChatCompletion) -> Message:
        """Append a reply's message to the transcript, count its tokens and return the message as appended.

        A call's id derives from its reply's text, so the same reply in a later turn would repeat an id the
        transcript already answered; such calls get the turn's number appended (still a function of the dialog,
        so a re-run's transcript equals the first run's), and every tool message answers exactly one call."""
        message = reply.message
        seen = {m.call_id for m in self.transcript if m.role == "tool"}
        seen |= {c.call_id for m in self.transcript for c in (m.tool_calls or [])}
        if any(c.call_id in seen for c in message.tool_calls or []):
            turn = sum(m.role == "assistant" for m in self.transcript)
            calls = [replace(c, call_id=f"{c.call_id}_t{turn}") if c.call_id in seen else c for c in message.tool_calls]
            message = replace(message, tool_calls=calls)
        self.transcript.append(message)
        self.transcript.generated_tokens += len(reply.tokens)
        return message

    def answer(self, calls: Sequence[ToolCall], fixed: Sequence[str] | None = None) -> list[Message]:
        """Answer each call with a tool message (``fixed[k]`` when given, else the toolbox runs the call),
        appended to the transcript; the tool messages."""
        answers = [
            Message(role="tool", content=fixed[k], call_id=call.call_id)
            if fixed is not None and k < len(fixed)
            else self.toolbox.execute(call)
            for k, call in enumerate(calls)
        ]
        self.transcript.extend(answers)
        return answers


def complete_turn(
    engine: ChatEngine,
    dialogs: Sequence[Dialog],
    *,
    tool_prompt_format: Any = None,
    chat_options: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None,
    too_long: Literal["end", "raise"] = "end",
) -> list[tuple[Dialog, ChatCompletion]]:
    """One reply for every dialog of ``dialogs``, generated in one batch: ``(dialog, reply)`` pairs, in order,
    for the dialogs that were generated (the replies are not added to the transcripts: the caller decides).

    Each dialog is rendered with its own tools and tool choice (one set for the call when the dialogs share one,
    as in :func:`run_batch`; one per dialog otherwise, as the evals' cases); ``chat_options``
    (``response_format``, ``system_message_behavior``, ``constrain_tools``) apply to all, ``sampling`` goes to
    the engine as it is.
    too_long: a dialog whose prompt no longer fits the engine's ``max_seq_len`` ends with ``prompt_too_long``
        (``"end"``: the engine's PromptTooLongError names those rows, and the others are asked again without
        them), or the engine's error is raised (``"raise"``: the caller's own dialog).
    """
    options = {**(chat_options or {}), **(sampling or {})}
    kept = list(dialogs)
    while kept:
        try:
            return list(zip(kept, _batch(engine, kept, tool_prompt_format, options)))
        except PromptTooLongError as error:
            too_long_rows = {row for row in error.rows if 0 <= row < len(kept)}
            if too_long == "raise" or not too_long_rows:
                raise
            for row in too_long_rows:  # a tool result made it too long: this dialog ends, the others go on
                kept[row].end("prompt_too_long")
            kept = [d for i, d in enumerate(kept) if i not in too_long_rows]
    return []


def _batch(
    engine: ChatEngine, dialogs: list[Dialog], tool_prompt_format: Any, options: dict[str, Any]
) -> list[ChatCompletion]:
    """The turn's one engine call (the only place the loop generates).  The dialogs' tools and tool choices go
    as one when all dialogs share them (what a stand-in written for ``batch_chat_completion(dialogs, tools,
    tool_choice=...)`` expects), else as one entry per dialog; the engine checks each distinct tool set once and
    renders every dialog once.  Each dialog goes as a snapshot of its transcript (the engine may keep it: a run
    store writes it as the row's request).  A cancelled call leaves every dialog's cut reply in its transcript."""
    sets = [d.toolbox.definitions for d in dialogs]
    choices = [d.tool_choice for d in dialogs]
    shared = all(t is sets[0] for t in sets) and all(c == choices[0] for c in choices)
    if options.get("run") is not None:  # a run store names each row by its dialog: every turn one item
        options = {**options, "item": [d.item for d in dialogs]}
    try:
        return engine.batch_chat_completion(
            [list(d.transcript) for d in dialogs],
            tools=sets[0] if shared else sets,
            tool_choice=choices[0] if shared else choices,
            tool_prompt_format=tool_prompt_format,
            **options,
        )
    except GenerationCancelled as cancelled:  # nothing is lost: the transcripts so far travel with the error
        for dialog, partial in zip(dialogs, cancelled.partial):
            text = partial.text if isinstance(partial.text, str) else str(partial.text)
            dialog.transcript.append(Message(role="assistant", content=text, stop_reason="cancelled"))
            dialog.transcript.generated_tokens += len(partial.tokens)
        for dialog in dialogs:
            dialog.end("cancelled")
        raise


def later_choice(tool_choice: Any) -> Any:
    """A forced tool choice applies to the first reply only; afterwards the model may answer."""
    return tool_choice if tool_choice in ("auto", "none", None) else "auto"


def _turns(
    engine: ChatEngine,
    dialogs: list[Dialog],
    max_turns: int,
    tool_choice: Any,
    tool_prompt_format: Any,
    constrain_tools: bool,
    chat_options: dict[str, Any],
    sampling: dict[str, Any],
    bar: Any,
    rate: TokenRate,
) -> None:
    """The turns of :func:`run_batch`: complete the running dialogs, run their calls, until none is running.  A
    transcript is ``cached`` when every reply of it came from a run store."""
    from_store: dict[int, bool] = {}  # dialog -> every reply so far came from a run store
    for turn in range(max_turns):
        running = [d for d in dialogs if d.running]
        if not running:
            break
        options = dict(chat_options, constrain_tools=True) if constrain_tools and turn == 0 else chat_options
        # the caller's own dialogs must fit (the engine says why not); later, a tool result may have made one too long
        replies = complete_turn(
            engine,
            running,
            tool_prompt_format=tool_prompt_format,
            chat_options=options,
            sampling=sampling,
            too_long="raise" if turn == 0 else "end",
        )
        for dialog, reply in replies:
            calls = dialog.add(reply).tool_calls
            from_store[id(dialog)] = from_store.get(id(dialog), True) and reply.cached
            rate.add(len(reply.tokens))
            if not calls:  # a call cut by max_tokens is no call (it stays text)
                dialog.end("out_of_tokens" if reply.stop_reason == "out_of_tokens" else "answered")
            elif tool_choice == "none":
                dialog.end("tool_choice_none")
            else:
                dialog.answer(calls)
                dialog.tool_choice = later_choice(tool_choice)
        bar.update(len(running) - sum(d.running for d in running))
    still = [d for d in dialogs if d.running]
    bar.update(len(still))
    for dialog in still:  # every reply so far called tools
        dialog.end("max_turns")
    for dialog in dialogs:
        dialog.transcript.cached = from_store.get(id(dialog), False)


def make_dialogs(
    dialogs: Sequence[Any],
    tools: Iterable[Any] | None,
    *,
    max_turns: int,
    tool_choice: Any,
    code_interpreter: bool | CodeInterpreter,
    tool_timeout: float | None,
    item: Sequence[str | None] | None,
) -> list[Dialog]:
    """The loop's :class:`Dialog` s for ``dialogs`` sharing one toolbox (the arguments checked, each transcript
    started from its input); what :func:`run_turns` and the per-dialog loop (:mod:`.flow`) both start from."""
    if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
        raise InputError(f"max_turns must be a positive integer, got {max_turns!r}")
    if not isinstance(dialogs, (list, tuple)):
        raise InputError("run_batch takes a list of dialogs (each a list of messages); for one dialog use run()")
    if item is not None and (isinstance(item, str) or not isinstance(item, (list, tuple)) or len(item) != len(dialogs)):
        raise InputError(
            f"item= takes one id per dialog (a list of {len(dialogs)}), got {item!r:.80}; for one "
            "dialog use run(..., item='case-1')"
        )
    toolbox = Toolbox.create(tools, code_interpreter, tool_timeout)
    items = [None if item is None or item[k] is None else runs.check_item(item[k]) for k in range(len(dialogs))]
    return [Dialog(Transcript(coerce_messages(d)), toolbox, tool_choice, items[k]) for k, d in enumerate(dialogs)]


@llama_stack_spellings(batch=("dialogs", "messages_batch"), chat=True)
def run_turns(
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
    progress: bool | None = None,
    item: Sequence[str | None] | None = None,
    **sampling: Any,
) -> list[Transcript]:
    """The turn-synchronous tool loop: each turn is one batched chat completion over every dialog still running,
    then every call of every dialog is run, one after another.  :func:`run_batch` moves each dialog on its own
    and gives the same transcripts (greedy or seeded); this form stays for engines that take one call at a time
    (one batch per turn suits them) and as the reference the per-dialog loop is held to.  Arguments and result
    as :func:`run_batch`'s (without ``tool_concurrency``)."""
    loop = make_dialogs(
        dialogs,
        tools,
        max_turns=max_turns,
        tool_choice=tool_choice,
        code_interpreter=code_interpreter,
        tool_timeout=tool_timeout,
        item=item,
    )
    transcripts = [d.transcript for d in loop]
    chat_options = {k: sampling.pop(k) for k in CHAT_OPTIONS if k in sampling}
    # One bar for the whole loop, so the engine's per-turn bars stay off; an automatic bar counts dialogs, and a
    # single dialog gets none (as the engine's automatic bars count rows), nor does it change the engine's.
    single = progress is None and len(transcripts) == 1
    inner = sampling if single else {**sampling, "progress": False}
    rate = TokenRate()
    with progress_bar(
        len(transcripts), desc="tool loop", unit="dialog", progress=False if single else progress, rate=rate
    ) as bar:
        try:
            _turns(
                engine,
                loop,
                max_turns,
                tool_choice,
                tool_prompt_format,
                constrain_tools,
                chat_options,
                inner,
                bar,
                rate,
            )
        except GenerationCancelled as cancelled:
            cancelled.transcripts = transcripts
            raise
    return transcripts
