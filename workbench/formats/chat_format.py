"""Token-level chat format of Llama 3 and Llama 4 (what goes between the special tokens).

A dialog is ``<|begin_of_text|>`` then, per message, a header (role between header tokens, then
``"\\n\\n"``), the content, any tool calls, and an end marker; it ends with an open assistant header
for the model to complete.  Each piece is tokenized separately (header role, ``"\\n\\n"``, every
content item, every tool call): the token boundaries are part of the format, so joining the strings
first would produce different ids.  Rules that differ by family:

* Llama 3: an assistant turn ends with ``<|eom_id|>`` only when its stop reason was end_of_message;
  everything else ends with ``<|eot_id|>``; a turn whose first call is a code-interpreter call starts
  with ``<|python_tag|>``.
* Llama 4: assistant turns with tool calls (or stop reason end_of_message) and all tool responses end
  with ``<|eom|>``; ``<|python_start|>``/``<|python_end|>`` are never written into prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InputError
from ..types import Message
from .calls import render_tool_call

_TOKENS = {
    "llama3": {"header_start": "<|start_header_id|>", "header_end": "<|end_header_id|>",
               "eot": "<|eot_id|>", "eom": "<|eom_id|>"},
    "llama4": {"header_start": "<|header_start|>", "header_end": "<|header_end|>",
               "eot": "<|eot|>", "eom": "<|eom|>"},
}  # fmt: skip


def content_items(content: Any) -> list[str]:
    """The text items of a message's content (a string, or a list of strings / ``{"type": "text"}`` items).

    Images are refused: the engine is text-only, and silently dropping them would change the prompt.
    """
    if isinstance(content, str):
        return [content]
    items = content if isinstance(content, (list, tuple)) else [content]
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and item.get("type", "text") == "text" and isinstance(item.get("text"), str):
            out.append(item["text"])
        elif isinstance(getattr(item, "text", None), str) and getattr(item, "type", "text") == "text":
            out.append(item.text)
        else:
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise InputError(
                f"message content item of type {kind!r} is not supported; workbench is text-only, give strings "
                "or {'type': 'text', 'text': ...} items"
            )
    return out


def content_text(content: Any, sep: str = "\n") -> str:
    """Content as one string (items joined by ``sep``), for places that paste it into a prompt."""
    return sep.join(content_items(content))


class ChatFormat:
    """Encodes messages into token ids for one tokenizer family (``tokenizer.family``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.family = getattr(tokenizer, "family", "llama3")
        if self.family not in _TOKENS:
            raise InputError(f"unknown tokenizer family {self.family!r}; expected llama3 or llama4")
        names = _TOKENS[self.family]
        sp = tokenizer.special_tokens
        self.bos = sp["<|begin_of_text|>"]
        self.header_start = sp[names["header_start"]]
        self.header_end = sp[names["header_end"]]
        self.eot = sp[names["eot"]]
        self.eom = sp[names["eom"]]
        self.python_tag = sp.get("<|python_tag|>")

    def encode_header(self, role: str) -> list[int]:
        role = "ipython" if role in ("tool", "ipython") else role
        return [
            self.header_start,
            *self.tokenizer.encode(role, bos=False, eos=False),
            self.header_end,
            *self.tokenizer.encode("\n\n", bos=False, eos=False),
        ]

    def encode_content(self, content: Any) -> list[int]:
        ids: list[int] = []
        for text in content_items(content):
            ids.extend(self.tokenizer.encode(text, bos=False, eos=False))
        return ids

    def encode_message(self, message: Message, tool_prompt_format: str) -> list[int]:
        role = "tool" if message.role in ("tool", "ipython") else message.role
        ids = self.encode_header(role)
        calls = message.tool_calls if role == "assistant" else []
        if self.family == "llama3" and calls and str(_name(calls[0])) == "code_interpreter":
            ids.append(self.python_tag)
        ids.extend(self.encode_content(message.content))
        for call in calls:
            ids.extend(self.tokenizer.encode(render_tool_call(call, tool_prompt_format), bos=False, eos=False))
        stop = _stop_value(message.stop_reason)
        if self.family == "llama4":
            eom = (role == "assistant" and (stop == "end_of_message" or bool(calls))) or role == "tool"
        else:
            eom = role == "assistant" and stop == "end_of_message"
        ids.append(self.eom if eom else self.eot)
        return ids

    def encode_dialog(self, messages: Sequence[Message], tool_prompt_format: str) -> list[int]:
        ids = [self.bos]
        for message in messages:
            ids.extend(self.encode_message(message, tool_prompt_format))
        ids.extend(self.encode_header("assistant"))
        return ids


def _name(call: Any) -> str:
    name = call.tool_name
    return getattr(name, "value", name)


def _stop_value(stop: Any) -> str | None:
    return getattr(stop, "value", stop)
