"""The chat layer: pure functions that their callers drive.

- :func:`prepare` renders dialogs in the model's official prompt format (tools, tool choice, call syntax,
  system-message behaviour, response format) into prompts (token ids, or a ``Prompt`` with images) and each
  reply's output format (None: unconstrained).
- :func:`finish` parses the generated :class:`~workbench.types.Completion` s into
  :class:`~workbench.types.ChatCompletion` s (tool calls, parse errors); :func:`finish_stream` does the same for
  one streamed reply, as :class:`TextDelta` / :class:`ToolCallDelta` items ending with the ChatCompletion.

Generation happens between the two, and every route to it is one method: ``batch_chat_completion(dialogs,
tools, ...)`` (:class:`~workbench.engine.interfaces.ChatEngine`), which renders each call's dialogs here once
(:func:`prepare`, checking the call's tools once) and parses the replies here once.  The Engine generates from the
token ids and stores parsed replies (``run=``); the Ray pool renders in the driver and its replicas generate
from token ids; the tool loop, serve and the evals only ever call ``batch_chat_completion``.
:func:`batch_chat_completion` and :func:`chat_completion` make that method of anything that completes rendered
prompts (:class:`~workbench.engine.interfaces.CompletionEngine`: a formatter and ``batch_completion``, as a
scripted stand-in or an adapter over a remote completions endpoint): a stand-in's ``batch_chat_completion`` is
``chat.batch_chat_completion(self, ...)``.
Everything format-specific lives in :mod:`workbench.formats`.  ``LLAMA_MODELS_DEBUG=1`` prints every rendered
prompt to stderr (``=2`` adds the token ids), as the reference implementation does.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workbench.engine.interfaces import ChatFormatter, CompletionEngine, StreamingEngine, TextTokenizer
from workbench.errors import FormatError, InputError
from workbench.formats import Prompt, ToolSet, coerce_messages, coerce_tools, normalize_tool_choice
from workbench.formats.calls import normalize_tool_prompt_format
from workbench.structured import OutputFormat, per_row_formats, tool_call_format
from workbench.types import ChatCompletion, Completion, Message, StreamChunk, ToolCall

_MARKERS_OPEN = ("<|python_start|>", "<|python_tag|>")
_MARKER_CLOSE = "<|python_end|>"

PromptRow = list[int] | Prompt  # a rendered dialog: token ids, or ids + images when the dialog holds images


@dataclass
class TextDelta:
    """A piece of the assistant's text, streamed as it is generated."""

    text: str
    type: Literal["text"] = "text"


@dataclass
class ToolCallDelta:
    """Tool-call progress in a stream.

    While the model writes code or a call between python tags, ``text`` carries the raw pieces with
    ``parse_status="in_progress"``; once the reply is complete every parsed call is sent with
    ``parse_status="succeeded"`` and ``tool_call`` set, or one delta with ``"failed"`` and the parse error in
    ``text``.
    """

    text: str = ""
    tool_call: ToolCall | None = None
    parse_status: Literal["in_progress", "succeeded", "failed"] = "in_progress"
    type: Literal["tool_call"] = "tool_call"


StreamItem = TextDelta | ToolCallDelta | ChatCompletion


# ---------------------------------------------------------------------------------------------- prepare
def prepare(
    formatter: ChatFormatter,
    dialogs: Sequence[Any],
    tools: Any = None,
    tool_choice: Any = "auto",
    tool_prompt_format: str | None = None,
    *,
    response_format: Any = None,
    constrain_tools: bool = False,
    system_message_behavior: str = "append",
) -> tuple[list[PromptRow], list[OutputFormat | None]]:
    """Render ``dialogs`` for generation: ``(prompts, formats)``, one entry per dialog.

    A dialog is a list of messages (dicts accepted) or a bare string (one user message).  ``tools`` (callables,
    OpenAI- or Llama-Stack-style definitions, built-in names) and ``tool_choice`` (``"auto"``, ``"required"``,
    ``"none"`` or a tool's name) are one for every dialog, or a list with one entry per dialog (see
    :func:`dialog_offers`: dialogs that each offer their own tools, as the evals' cases, share one call);
    ``tool_prompt_format`` applies to all.  Each distinct tool set is coerced and checked once per call, into a
    :class:`~workbench.formats.ToolSet` the formatter renders every dialog with as it is.
    ``response_format`` (one for all, or one per dialog) constrains each reply; a JSON-schema format also appends
    Llama Stack's "Please respond in JSON format with the schema: ..." user message.  ``constrain_tools=True``
    (with ``tool_choice="required"`` or a tool name) makes every reply's format a well-formed call of an offered
    tool in the model's call syntax.  ``system_message_behavior="replace"`` (Llama Stack's ``tool_config``) puts
    the dialog's system message in place of the default tool instructions (Llama 3.2+ formats).

    Raises InputError / FormatError / ToolError naming the problem before anything is generated.
    """
    if not isinstance(dialogs, (list, tuple)) or any(isinstance(d, (dict, Message)) for d in dialogs):
        raise InputError(
            "batch_chat_completion takes a list of dialogs (each a list of messages); for a single dialog use "
            "chat_completion"
        )
    offers = _checked(dialog_offers(len(dialogs), tools, tool_choice))
    formats = _reply_formats(formatter, offers, tool_prompt_format, response_format, constrain_tools)
    prompts: list[PromptRow] = []
    for dialog, (tool_set, choice), fmt in zip(dialogs, offers, formats):
        instruction = format_prompt(fmt) if fmt is not None else None
        if instruction is not None:
            dialog = [*coerce_messages(dialog), Message(role="user", content=instruction)]
        prompt = formatter.encode_prompt(
            dialog,
            tools=tool_set,
            tool_choice=choice,
            tool_prompt_format=tool_prompt_format,
            system_message_behavior=system_message_behavior,
        )
        _debug_print(formatter.tokenizer, prompt.tokens)
        prompts.append(prompt if prompt.images else prompt.tokens)
    return prompts, formats


def dialog_offers(n: int, tools: Any, tool_choice: Any) -> list[tuple[Any, Any]]:
    """Each of ``n`` dialogs' ``(tools, tool_choice)`` as given, not yet checked.

    ``tools`` is one set for every dialog (a list of tools, or None), or one set per dialog: a list whose every
    entry is a list, a tuple or None (a tool itself is never a list, so the two cannot be confused);
    ``tool_choice`` likewise one for all, or a list with one per dialog.  Why per dialog: the tool loop and the
    evals run dialogs that offer different tools in one batch through the one chat method."""
    per_dialog = (
        isinstance(tools, list) and bool(tools) and all(t is None or isinstance(t, (list, tuple)) for t in tools)
    )
    sets = list(tools) if per_dialog else [tools] * n
    choices = list(tool_choice) if isinstance(tool_choice, (list, tuple)) else [tool_choice] * n
    for name, given in (("tools", sets), ("tool_choice", choices)):
        if len(given) != n:
            raise InputError(
                f"{name} has {len(given)} entries for {n} dialogs; give one {name} for every dialog, "
                "or a list with one per dialog"
            )
    return list(zip(sets, choices))


def _checked(offers: list[tuple[Any, Any]]) -> list[tuple[ToolSet | None, Any]]:
    """The offers with each distinct tool set coerced and checked once (None stays None: no tools)."""
    checked: dict[int, ToolSet] = {}  # id of a set as given -> its ToolSet (the sets are alive in ``offers``)
    out: list[tuple[ToolSet | None, Any]] = []
    for tools, choice in offers:
        if tools is not None and id(tools) not in checked:
            checked[id(tools)] = coerce_tools(tools)
        out.append((None if tools is None else checked[id(tools)], choice))
    return out


def format_prompt(fmt: OutputFormat) -> str | None:
    """The user message Llama Stack appends to a dialog with a JSON-schema response format (same wording)."""
    if fmt.kind != "json_schema" or fmt.schema is None:
        return None
    return f"Please respond in JSON format with the schema: {json.dumps(fmt.schema)}"


def _reply_formats(
    formatter: ChatFormatter,
    offers: list[tuple[ToolSet | None, Any]],
    tool_prompt_format: Any,
    response_format: Any,
    constrain_tools: bool,
) -> list[OutputFormat | None]:
    if not constrain_tools:
        return per_row_formats(response_format, len(offers))
    if response_format is not None:
        raise FormatError("give either response_format or constrain_tools=True, not both")
    syntax = normalize_tool_prompt_format(tool_prompt_format) or formatter.default_tool_prompt_format
    made: dict[tuple[int, str], OutputFormat] = {}  # one grammar per tool set and choice
    for tools, choice in offers:
        if not tools:
            raise FormatError("constrain_tools=True needs tools=[...] to choose from")
        key = (id(tools), repr(choice))
        if key not in made:
            made[key] = tool_call_format(tools, normalize_tool_choice(choice, tools), syntax)
    return [made[(id(tools), repr(choice))] for tools, choice in offers]


def _debug_print(tokenizer: TextTokenizer, tokens: list[int]) -> None:
    level = os.environ.get("LLAMA_MODELS_DEBUG", "0")
    if level not in ("1", "2"):
        return
    print("Input to model:\n" + tokenizer.decode(tokens), file=sys.stderr)
    if level == "2":
        print(f"Token ids ({len(tokens)}): {tokens}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------- finish
def finish(
    completions: Sequence[Completion], formats: Sequence[OutputFormat | None] | None, formatter: ChatFormatter
) -> list[ChatCompletion]:
    """Each generated reply as a :class:`ChatCompletion` whose message carries its parsed tool calls (or the
    parse error); ``formats`` as :func:`prepare` returned them (None: every reply unconstrained)."""
    formats = list(formats) if formats is not None else [None] * len(completions)
    return [finish_row(c, f, formatter) for c, f in zip(completions, formats)]


def finish_row(completion: Completion, fmt: OutputFormat | None, formatter: ChatFormatter) -> ChatCompletion:
    """One reply of :func:`finish`.  A reply under a ``response_format`` is data, not a tool call: its text is
    the message content as it is."""
    if fmt is not None and fmt.kind != "tool_call":
        message = Message(role="assistant", content=completion.text)
    else:
        message = formatter.decode_assistant(completion.text, completion.stop_reason)
    message.stop_reason = completion.stop_reason
    return ChatCompletion(
        message=message,
        tokens=list(completion.tokens),
        stop_reason=completion.stop_reason,
        logprobs=completion.logprobs,
        prompt_tokens=completion.prompt_tokens,
        parsed=completion.parsed,
        format_error=completion.format_error,
        cached=completion.cached,
    )


def finish_stream(
    chunks: Iterable[StreamChunk], fmt: OutputFormat | None, formatter: ChatFormatter
) -> Iterator[StreamItem]:
    """One reply's stream chunks as chat items: :class:`TextDelta` for text, :class:`ToolCallDelta` for what the
    model writes between python tags (the tags removed), then each parsed call (or the parse failure) and
    finally the :class:`ChatCompletion` (what :func:`finish` makes of the last chunk's ``final``; a final that
    is one already — a reply the run store answered — as it is)."""
    in_tool = False
    final: Completion | None = None
    markers = _marker_ids(formatter.tokenizer)
    for chunk in chunks:
        text = chunk.text or ""
        marker = markers.get(chunk.token) if chunk.token is not None else None
        if marker is not None and marker not in text:  # an engine that streams special tokens as ""
            text = marker + text
        for piece, inside in list(_split_markers(text, in_tool)):
            in_tool = inside
            if piece:
                yield ToolCallDelta(text=piece) if inside else TextDelta(text=piece)
        if chunk.final is not None:
            final = chunk.final
            break
    if final is None:
        raise RuntimeError("the engine's stream ended without a final chunk")  # an engine bug, not user input
    result = final if isinstance(final, ChatCompletion) else finish_row(final, fmt, formatter)
    if result.message.parse_error:
        yield ToolCallDelta(text=result.message.parse_error, parse_status="failed")
    for call in result.message.tool_calls:
        yield ToolCallDelta(tool_call=call, parse_status="succeeded")
    yield result


def _split_markers(text: str, in_tool: bool) -> Iterator[tuple[str, bool]]:
    """Cut a text delta at python-tag markers: yields (piece, inside_tool) with the markers removed."""
    while text:
        if in_tool:
            idx = text.find(_MARKER_CLOSE)
            if idx < 0:
                yield text, True
                return
            if idx:
                yield text[:idx], True
            text, in_tool = text[idx + len(_MARKER_CLOSE) :], False
            yield "", False  # mode switch
            continue
        hits = [(text.find(m), m) for m in _MARKERS_OPEN if m in text]
        if not hits:
            yield text, False
            return
        idx, marker = min(hits)
        if idx:
            yield text[:idx], False
        text, in_tool = text[idx + len(marker) :], True
        yield "", True


def _marker_ids(tokenizer: TextTokenizer) -> dict[int, str]:
    special = tokenizer.special_tokens or {}
    return {special[name]: name for name in (*_MARKERS_OPEN, _MARKER_CLOSE) if name in special}


# ---------------------------------------------------------------------------------------------- over an engine
def batch_chat_completion(
    engine: CompletionEngine,
    dialogs: Sequence[Any],
    tools: Any = None,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    *,
    response_format: Any = None,
    constrain_tools: bool = False,
    system_message_behavior: str = "append",
    **sampling: Any,
) -> list[ChatCompletion]:
    """One reply per dialog from ``engine.batch_completion`` (one batch): :func:`prepare`, generate,
    :func:`finish` — the :class:`~workbench.engine.interfaces.ChatEngine` method of an engine that completes
    rendered prompts.  Keywords as :func:`prepare`'s (``tools`` / ``tool_choice`` one for all or one per dialog);
    ``sampling`` goes to ``batch_completion`` as it is."""
    prompts, formats = prepare(
        engine.formatter,
        dialogs,
        tools,
        tool_choice,
        tool_prompt_format,
        response_format=response_format,
        constrain_tools=constrain_tools,
        system_message_behavior=system_message_behavior,
    )
    if not prompts:
        return []
    if any(f is not None for f in formats):
        sampling["response_format"] = formats
    return finish(engine.batch_completion(prompts, **sampling), formats, engine.formatter)


def chat_completion(
    engine: StreamingEngine,
    messages: Any,
    tools: Iterable[Any] | None = None,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    stream: bool = False,
    *,
    response_format: Any = None,
    constrain_tools: bool = False,
    system_message_behavior: str = "append",
    **sampling: Any,
) -> ChatCompletion | Iterator[StreamItem]:
    """One reply to ``messages`` (see :func:`batch_chat_completion`).  With ``stream=True`` (the engine then
    needs ``stream_completion``), an iterator of :class:`TextDelta` and :class:`ToolCallDelta` items ending with
    the full :class:`ChatCompletion`."""
    if isinstance(response_format, (list, tuple)):
        raise FormatError("chat_completion takes one response_format (a list is for batch_chat_completion)")
    if not stream:
        return batch_chat_completion(
            engine,
            [messages],
            tools,
            tool_choice,
            tool_prompt_format,
            response_format=response_format,
            constrain_tools=constrain_tools,
            system_message_behavior=system_message_behavior,
            **sampling,
        )[0]
    prompts, formats = prepare(
        engine.formatter,
        [messages],
        tools,
        tool_choice,
        tool_prompt_format,
        response_format=response_format,
        constrain_tools=constrain_tools,
        system_message_behavior=system_message_behavior,
    )
    if formats[0] is not None:
        sampling["response_format"] = formats[0]
    return finish_stream(engine.stream_completion(prompts[0], **sampling), formats[0], engine.formatter)
