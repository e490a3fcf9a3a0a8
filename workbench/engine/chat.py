"""Chat APIs over an engine: render dialogs in the model's official format, generate, parse the replies.

The engine supplies ``formatter``, ``tokenizer``, ``batch_completion(list_of_token_id_lists, **sampling)`` and
``stream_completion(token_ids, **sampling)``; everything format-specific lives in :mod:`workbench.formats`.
``LLAMA_MODELS_DEBUG=1`` prints every rendered prompt to stderr (``=2`` adds the token ids), as the
reference implementation does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workbench.errors import FormatError, InputError
from workbench.formats import coerce_messages, coerce_tools, normalize_tool_choice
from workbench.formats.calls import normalize_tool_prompt_format
from workbench.structured import OutputFormat, per_row_formats, tool_call_format
from workbench.types import ChatCompletion, Completion, Message, ToolCall

_MARKERS_OPEN = ("<|python_start|>", "<|python_tag|>")
_MARKER_CLOSE = "<|python_end|>"


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


def _debug_print(engine: Any, prompt: Any) -> None:
    level = os.environ.get("LLAMA_MODELS_DEBUG", "0")
    if level not in ("1", "2"):
        return
    prompt = getattr(prompt, "tokens", prompt)
    print("Input to model:\n" + engine.tokenizer.decode(prompt), file=sys.stderr)
    if level == "2":
        print(f"Token ids ({len(prompt)}): {prompt}", file=sys.stderr)


def encode_prompt(
    engine: Any,
    messages: Any,
    tools: Iterable[Any] | None = None,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    system_message_behavior: str = "append",
) -> Any:
    """The prompt for one dialog (printed when ``LLAMA_MODELS_DEBUG`` is set): its token ids, or a
    :class:`~workbench.formats.Prompt` (ids + images) when the dialog holds images."""
    prompt = engine.formatter.encode_prompt(messages, tools=tools, tool_choice=tool_choice,
                                            tool_prompt_format=tool_prompt_format,
                                            system_message_behavior=system_message_behavior)
    _debug_print(engine, prompt)
    return prompt if prompt.images else prompt.tokens


def to_chat_completion(engine: Any, completion: Completion, fmt: OutputFormat | None = None) -> ChatCompletion:
    """Wrap an engine :class:`Completion` as a :class:`ChatCompletion` whose message carries the parsed calls.

    A reply under a ``response_format`` is data, not a tool call: its text is the content as it is."""
    if fmt is not None and fmt.kind != "tool_call":
        message = Message(role="assistant", content=completion.text)
    else:
        message = engine.formatter.decode_assistant(completion.text, completion.stop_reason)
    message.stop_reason = completion.stop_reason
    return ChatCompletion(
        message=message,
        tokens=list(completion.tokens),
        stop_reason=completion.stop_reason,
        logprobs=completion.logprobs,
        prompt_tokens=completion.prompt_tokens,
        parsed=getattr(completion, "parsed", None),
        format_error=getattr(completion, "format_error", None),
    )


def format_prompt(fmt: OutputFormat) -> str | None:
    """The user message Llama Stack appends to a dialog with a JSON-schema response format (same wording)."""
    import json

    if fmt.kind != "json_schema" or fmt.schema is None:
        return None
    return f"Please respond in JSON format with the schema: {json.dumps(fmt.schema)}"


def reply_formats(engine: Any, dialogs: Sequence[Any], tool_defs: Any, tool_choice: Any, tool_prompt_format: Any,
                  response_format: Any, constrain_tools: bool,
                  ) -> tuple[list[Any], list[OutputFormat | None]]:
    """The dialogs to render (a JSON-schema format adds Llama Stack's instruction) and each reply's format."""
    if constrain_tools:
        if response_format is not None:
            raise FormatError("give either response_format or constrain_tools=True, not both")
        if not tool_defs:
            raise FormatError("constrain_tools=True needs tools=[...] to choose from")
        choice = normalize_tool_choice(tool_choice, tool_defs)
        syntax = normalize_tool_prompt_format(tool_prompt_format) or engine.formatter.default_tool_prompt_format
        return list(dialogs), [tool_call_format(tool_defs, choice, syntax)] * len(dialogs)
    formats = per_row_formats(response_format, len(dialogs))
    out = []
    for dialog, fmt in zip(dialogs, formats):
        instruction = format_prompt(fmt) if fmt is not None else None
        if instruction is not None:
            dialog = [*coerce_messages(dialog), Message(role="user", content=instruction)]
        out.append(dialog)
    return out, formats


def _batch_prompts(engine: Any, method: str, dialogs: Sequence[Any], tools: Iterable[Any] | None, tool_choice: Any,
                   tool_prompt_format: Any, response_format: Any, constrain_tools: bool, system_message_behavior: str,
                   sampling: dict[str, Any]) -> tuple[list[Any], list[OutputFormat | None]]:
    """The prompts and reply formats of a batch of dialogs (the formats also go into ``sampling``)."""
    if not isinstance(dialogs, (list, tuple)) or any(isinstance(d, (dict, Message)) for d in dialogs):
        raise InputError(
            f"{method} takes a list of dialogs (each a list of messages); for a single dialog use chat_completion"
        )
    tool_defs = None if tools is None else coerce_tools(tools)  # once, not per dialog
    dialogs, formats = reply_formats(engine, dialogs, tool_defs, tool_choice, tool_prompt_format, response_format,
                                     constrain_tools)
    prompts = [encode_prompt(engine, d, tool_defs, tool_choice, tool_prompt_format, system_message_behavior)
               for d in dialogs]
    if any(f is not None for f in formats):
        sampling["response_format"] = formats
    return prompts, formats


def batch_chat_completion(
    engine: Any,
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
    """One reply per dialog, generated in one batch; same tools and sampling for every dialog.

    A dialog is a list of messages (dicts accepted) or a bare string (one user message).
    ``response_format`` (one for all, or one per dialog) constrains the replies as in
    ``Engine.batch_completion``; a JSON-schema format also appends Llama Stack's "Please respond in JSON
    format with the schema: ..." user message.  ``constrain_tools=True`` (with ``tool_choice="required"`` or a
    tool name) forces every reply to be a well-formed call, in the model's tool-call syntax, of an offered
    tool with arguments valid against its parameter schema.  ``system_message_behavior="replace"`` (Llama Stack's
    ``tool_config``) puts the dialog's system message in place of the default tool instructions, with
    ``{{function_description}}`` where the tool list goes (Llama 3.2+ formats; 3.1-style prompts ignore it, as
    Llama Stack does)."""
    prompts, formats = _batch_prompts(engine, "batch_chat_completion", dialogs, tools, tool_choice,
                                      tool_prompt_format, response_format, constrain_tools,
                                      system_message_behavior, sampling)
    if not prompts:
        return []
    completions = engine.batch_completion(prompts, **sampling)
    return [to_chat_completion(engine, c, f) for c, f in zip(completions, formats)]


def stream_batch_chat_completion(
    engine: Any,
    dialogs: Sequence[Any],
    tools: Iterable[Any] | None = None,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    *,
    response_format: Any = None,
    constrain_tools: bool = False,
    preemptible: bool = True,
    system_message_behavior: str = "append",
    **sampling: Any,
) -> Any:
    """:func:`batch_chat_completion` as one :class:`~workbench.engine.batch_stream.BatchStream`: the same
    prompts and formats, each row's final chunk carrying its ChatCompletion (what the batch call returns)."""
    prompts, formats = _batch_prompts(engine, "stream_batch_chat_completion", dialogs, tools, tool_choice,
                                      tool_prompt_format, response_format, constrain_tools,
                                      system_message_behavior, sampling)
    stream = engine.stream_batch_completion(prompts, preemptible=preemptible, **sampling)
    stream.finish = lambda row, completion: to_chat_completion(engine, completion, formats[row])
    return stream


def chat_completion(
    engine: Any,
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
    """One reply to ``messages``.  With ``stream=True``, an iterator of :class:`TextDelta` and
    :class:`ToolCallDelta` items ending with the full :class:`ChatCompletion`.  ``response_format`` and
    ``constrain_tools`` as in :func:`batch_chat_completion`."""
    if stream:
        tool_defs = None if tools is None else coerce_tools(tools)
        if isinstance(response_format, (list, tuple)):
            raise FormatError("chat_completion takes one response_format (a list is for batch_chat_completion)")
        dialogs, formats = reply_formats(engine, [messages], tool_defs, tool_choice, tool_prompt_format,
                                         response_format, constrain_tools)
        prompt = encode_prompt(engine, dialogs[0], tool_defs, tool_choice, tool_prompt_format, system_message_behavior)
        if formats[0] is not None:
            sampling["response_format"] = formats[0]
        return _stream(engine, prompt, formats[0], engine.stream_completion(prompt, **sampling))
    if isinstance(response_format, (list, tuple)):
        raise FormatError("chat_completion takes one response_format (a list is for batch_chat_completion)")
    replies = batch_chat_completion(engine, [messages], tools, tool_choice, tool_prompt_format,
                                    response_format=response_format, constrain_tools=constrain_tools,
                                    system_message_behavior=system_message_behavior, **sampling)
    return replies[0]


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


def _marker_ids(tokenizer: Any) -> dict[int, str]:
    special = getattr(tokenizer, "special_tokens", {}) or {}
    return {special[name]: name for name in (*_MARKERS_OPEN, _MARKER_CLOSE) if name in special}


def _stream(engine: Any, prompt: list[int], fmt: OutputFormat | None, chunks: Iterable[Any]) -> Iterator[StreamItem]:
    in_tool = False
    final: Completion | None = None
    markers = _marker_ids(engine.tokenizer)
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
    result = to_chat_completion(engine, final, fmt)
    if result.message.parse_error:
        yield ToolCallDelta(text=result.message.parse_error, parse_status="failed")
    for call in result.message.tool_calls:
        yield ToolCallDelta(tool_call=call, parse_status="succeeded")
    yield result
