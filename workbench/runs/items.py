"""Which item a stored row answers: the id that lines rows of two runs up when the runs differ in a setting.

A row's item is given (``item=`` on a call, a case id in ``workbench.evals`` and BFCL, the dialog of a tool-loop
transcript) or derived here from the request the row stored, *without the settings*: a chat row's messages
after its leading system message(s), a completion row's prompt.  The system prompt, the tools, the tool format,
the tool choice, sampling, quantization and the checkpoint are all left out, so two runs that differ only in
those answer the same items and compare item by item.

The derived id is readable and stable: a short text of the input (the last user message, or the prompt's
start; whitespace collapsed, at most :data:`SNIPPET_CHARS` characters) and ``#`` with the first
:data:`HASH_CHARS` hex digits of the sha256 of the whole input as canonical JSON — ``"What is the weather in
Paris? #3fa2b1c9e0"``.  The text is for people, the hash makes it unique; two inputs with the same text get
the same id exactly when they are the same input.

A tool loop's request carries its item and turn (``{"messages": ..., "item": ..., "turn": n}``), so every turn
of one dialog is a row of one item, numbered from 0.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from workbench.errors import InputError
from workbench.runs.codec import plain

SNIPPET_CHARS = 48
HASH_CHARS = 10
ITEM_MAX = 500  # characters of a given item id


def item_id(text: str, payload: Any) -> str:
    """``"<text, shortened> #<sha256 of payload>"``: the readable, stable id of one input."""
    digest = hashlib.sha256(
        json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr).encode(
            "utf-8", "surrogatepass"
        )
    ).hexdigest()[:HASH_CHARS]
    snippet = " ".join(str(text).split())
    if len(snippet) > SNIPPET_CHARS:
        snippet = snippet[: SNIPPET_CHARS - 1].rstrip() + "…"
    return f"{snippet} #{digest}" if snippet else f"#{digest}"


def _call(call: Any) -> Any:
    if isinstance(call, Mapping):
        return {"tool_name": call.get("tool_name", call.get("name")), "arguments": call.get("arguments")}
    return call


def _message(message: Any) -> Any:
    """A message as the item sees it: role, content and calls (not ids, stop reasons or parse notes)."""
    if not isinstance(message, Mapping):
        return message
    out: dict[str, Any] = {"role": message.get("role"), "content": message.get("content")}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_call(c) for c in calls]
    return out


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # interleaved items: their text parts
        parts = [p.get("text", "") if isinstance(p, Mapping) else p for p in content]
        return " ".join(p for p in parts if isinstance(p, str))
    return json.dumps(content, default=str, ensure_ascii=False)


def dialog_item(messages: Any) -> str:
    """The item of a dialog (plain JSON messages): its messages after the leading system message(s)."""
    plain = [_message(m) for m in messages] if isinstance(messages, list) else [messages]
    start = 0
    while start < len(plain) and isinstance(plain[start], Mapping) and plain[start].get("role") == "system":
        start += 1
    body = plain[start:]
    users = [m for m in body if isinstance(m, Mapping) and m.get("role") == "user"]
    last = users[-1] if users else (body[-1] if body else None)
    text = _content_text(last.get("content")) if isinstance(last, Mapping) else ("" if last is None else str(last))
    return item_id(text, {"messages": body})


def input_item(messages: Any) -> str:
    """The default item of a dialog given as messages (Message objects or dicts): what a tool loop names a
    dialog's rows by, and what a chat row of the same dialog derives (so both line up)."""
    return dialog_item(plain(list(messages)))


def prompt_item(prompt: Any) -> str:
    """The item of a completion row: its prompt text (or token ids)."""
    if isinstance(prompt, str):
        return item_id(prompt, {"prompt": prompt})
    if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        return item_id(f"{len(prompt)} tokens", {"prompt_ids": prompt})
    return item_id(_content_text(prompt), {"prompt": prompt})


def derive_item(request: Any) -> tuple[str, int | None]:
    """``(item, turn)`` of a row from its request as stored (plain JSON, :func:`workbench.runs.codec.plain`):
    the request's own ``item`` / ``turn`` when it carries them, else the item of its input without the settings
    (see the module docstring); a chat row's turn is the number of assistant replies in its input (a tool loop
    passes its dialog's item, so every turn of one dialog is a row of one item, numbered from 0)."""
    if isinstance(request, Mapping):
        turn = request.get("turn")
        turn = turn if isinstance(turn, int) and not isinstance(turn, bool) else None
        messages = request.get("messages")
        if turn is None and isinstance(messages, list):  # a chat row is its dialog's reply number (replies so far)
            turn = sum(isinstance(m, Mapping) and m.get("role") == "assistant" for m in messages)
        given = request.get("item")
        if given is not None:
            return check_item(given), turn
        if "messages" in request:
            return dialog_item(request["messages"]), turn
        if "prompt" in request:
            return prompt_item(request["prompt"]), turn
        if "prompt_ids" in request:
            return prompt_item(list(request["prompt_ids"])), turn
    return item_id(_content_text(request), {"request": request}), None


def check_item(item: Any) -> str:
    """A given item id as stored: a string (numbers are taken by their text), at most :data:`ITEM_MAX`
    characters."""
    if isinstance(item, bool) or not isinstance(item, (str, int)):
        raise InputError(
            f"an item id must be a string (or an int), got {type(item).__name__} {item!r:.80}; "
            "give item='case-17' (one per row for a batch)"
        )
    text = str(item)
    if not text or len(text) > ITEM_MAX:
        raise InputError(f"an item id must have 1 to {ITEM_MAX} characters, got {len(text)}")
    return text
