"""The chat layer: pure functions that their callers drive.

- :func:`prepare` renders dialogs in the model's official prompt format (tools, tool choice, call syntax,
  system-message behaviour, response format) into prompts (token ids, or a ``Prompt`` with images) and each
  reply's output format (None: unconstrained).
- :func:`finish` parses the generated :class:`~workbench.types.Completion` s into
  :class:`~workbench.types.ChatCompletion` s (tool calls, parse errors); :func:`finish_stream` does the same for
  one streamed reply, as :class:`TextDelta` / :class:`ToolCallDelta` items ending with the ChatCompletion.

Generation happens between the two and belongs to the caller: the Engine runs its own batch path, the Ray pool
renders and parses in the driver while its replicas generate from token ids, and the tool loop renders every
dialog with its own tools.  :func:`batch_chat_completion` and :func:`chat_completion` are the three steps over
any :class:`~workbench.engine.interfaces.CompletionEngine` (a formatter and ``batch_completion``).
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
from workbench.formats import Prompt, coerce_messages, coerce_tools, normalize_tool_choice
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
def prepare(formatter: ChatFormatter, dialogs: Sequence[Any], tools: Iterable[Any] | None = None,
            tool_choice: Any = "auto", tool_prompt_format: str | None = None, *, response_format: Any = None,
            constrain_tools: bool = False, system_message_behavior: str = "append",
            ) -> tuple[list[PromptRow], list[OutputFormat | None]]:
    """Render ``dialogs`` for generation: ``(prompts, formats)``, one entry per dialog.

    A dialog is a list of messages (dicts accepted) or a bare string (one user message); the same ``tools``
    (callables, OpenAI- or Llama-Stack-style definitions, built-in names), ``tool_choice`` (``"auto"``,
    ``"required"``, ``"none"`` or a tool's name) and ``tool_prompt_format`` apply to every dialog.
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
    tool_defs = None if tools is None else coerce_tools(tools)  # once, not per dialog
    formats = _reply_formats(formatter, len(dialogs), tool_defs, tool_choice, tool_prompt_format, response_format,
                             constrain_tools)
    prompts: list[PromptRow] = []
    for dialog, fmt in zip(dialogs, formats):
        instruction = format_prompt(fmt) if fmt is not None else None
        if instruction is not None:
            dialog = [*coerce_messages(dialog), Message(role="user", content=instruction)]
        prompt = formatter.encode_prompt(dialog, tools=tool_defs, tool_choice=tool_choice,
                                         tool_prompt_format=tool_prompt_format,
                                         system_message_behavior=system_message_behavior)
        _debug_print(formatter.tokenizer, prompt.tokens)
        prompts.append(prompt if prompt.images else prompt.tokens)
    return prompts, formats


def format_prompt(fmt: OutputFormat) -> str | None:
    """The user message Llama Stack appends to a dialog with a JSON-schema response format (same wording)."""
    if fmt.kind != "json_schema" or fmt.schema is None:
        return None
    return f"Please respond in JSON format with the schema: {json.dumps(fmt.schema)}"


def _reply_formats(formatter: ChatFormatter, n: int, tool_defs: Any, tool_choice: Any, tool_prompt_format: Any,
                   response_format: Any, constrain_tools: bool) -> list[OutputFormat | None]:
    if not constrain_tools:
        return per_row_formats(response_format, n)
    if response_format is not None:
        raise FormatError("give either response_format or constrain_tools=True, not both")
    if not tool_defs:
        raise FormatError("constrain_tools=True needs tools=[...] to choose from")
    choice = normalize_tool_choice(tool_choice, tool_defs)
    syntax = normalize_tool_prompt_format(tool_prompt_format) or formatter.default_tool_prompt_format
    return [tool_call_format(tool_defs, choice, syntax)] * n


def _debug_print(tokenizer: TextTokenizer, tokens: list[int]) -> None:
    level = os.environ.get("LLAMA_MODELS_DEBUG", "0")
    if level not in ("1", "2"):
        return
    print("Input to model:\n" + tokenizer.decode(tokens), file=sys.stderr)
    if level == "2":
        print(f"Token ids ({len(tokens)}): {tokens}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------- finish
def finish(completions: Sequence[Completion], formats: Sequence[OutputFormat | None] | None,
           formatter: ChatFormatter) -> list[ChatCompletion]:
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


def finish_stream(chunks: Iterable[StreamChunk], fmt: OutputFormat | None,
                  formatter: ChatFormatter) -> Iterator[StreamItem]:
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
    tools: Iterable[Any] | None = None,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    *,
    response_format: Any = None,
    constrain_tools: bool = False,
    system_message_behavior: str = "append",
    **sampling: Any,
) -> list[ChatCompletion]:
    """One reply per dialog from ``engine.batch_completion`` (one batch): :func:`prepare`, generate,
    :func:`finish`.  Keywords as :func:`prepare`'s; ``sampling`` goes to ``batch_completion`` as it is."""
    prompts, formats = prepare(engine.formatter, dialogs, tools, tool_choice, tool_prompt_format,
                               response_format=response_format, constrain_tools=constrain_tools,
                               system_message_behavior=system_message_behavior)
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
        return batch_chat_completion(engine, [messages], tools, tool_choice, tool_prompt_format,
                                     response_format=response_format, constrain_tools=constrain_tools,
                                     system_message_behavior=system_message_behavior, **sampling)[0]
    prompts, formats = prepare(engine.formatter, [messages], tools, tool_choice, tool_prompt_format,
                               response_format=response_format, constrain_tools=constrain_tools,
                               system_message_behavior=system_message_behavior)
    if formats[0] is not None:
        sampling["response_format"] = formats[0]
    return finish_stream(engine.stream_completion(prompts[0], **sampling), formats[0], engine.formatter)
