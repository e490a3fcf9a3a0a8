"""Engine results → the OpenAI response shapes (chat completions, legacy completions, stream chunks).

Why one module: the non-streamed reply and the streamed chunks must tell the same story (same content, same
calls, same finish reason), so both are built from the same helpers.  Tool-call arguments go out as JSON
strings, as the official client expects; ``finish_reason`` is ``tool_calls`` when the reply is a call.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

_FINISH = {"end_of_turn": "stop", "end_of_message": "stop", "out_of_tokens": "length", "cancelled": "stop"}
# What may start a tool call in a reply (see workbench.formats' parser): brackets, tags, `name(` at the start,
# and `name.call(` anywhere.  Content streams only up to the first of these; the rest waits for the parse.
_OPENERS = re.compile(r"[\[{<]|\b[A-Za-z_]\w*\.call\s*\(")
_IDENT_START = re.compile(r"[A-Za-z_][\w.]*\s*(\(|$)")
_TAIL_IDENT = re.compile(r"[A-Za-z_][\w.]*\s*\Z")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def finish_reason(result: Any) -> str:
    if getattr(result, "message", None) is not None and result.message.tool_calls:
        return "tool_calls"
    return _FINISH.get(result.stop_reason, "stop")


def tool_calls(message: Any) -> list[dict[str, Any]] | None:
    """The message's calls in OpenAI's shape (arguments as a JSON string), or None when there are none."""
    if not message.tool_calls:
        return None
    return [
        {
            "id": call.call_id or new_id("call"),
            "type": "function",
            "function": {"name": call.tool_name, "arguments": json.dumps(call.arguments)},
        }
        for call in message.tool_calls
    ]


def _top(tokenizer: Any, lp: Any, k: int) -> list[dict[str, Any]]:
    out = []
    for tid in lp.top_tokens[:k]:
        text = tokenizer.decode([tid])
        if text in lp.top_logprobs:
            out.append({"token": text, "logprob": lp.top_logprobs[text], "bytes": list(text.encode())})
    return out


def chat_logprobs(tokenizer: Any, result: Any, top: int) -> dict[str, Any] | None:
    if result.logprobs is None:
        return None
    content = [
        {
            "token": lp.text,
            "logprob": lp.logprob,
            "bytes": list(lp.text.encode()),
            "top_logprobs": _top(tokenizer, lp, top),
        }
        for lp in result.logprobs
    ]
    return {"content": content, "refusal": None}


def chat_message(result: Any) -> dict[str, Any]:
    message = result.message
    content = message.content if isinstance(message.content, str) else str(message.content)
    calls = tool_calls(message)
    return {"role": "assistant", "content": None if calls and not content else content, "tool_calls": calls}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_response(model: str, results: list[Any], tokenizer: Any, want_logprobs: bool, top: int) -> dict[str, Any]:
    """``chat.completion`` for the ``n`` results of one request (the prompt is counted once in usage)."""
    choices = [
        {
            "index": i,
            "message": chat_message(r),
            "finish_reason": finish_reason(r),
            "logprobs": chat_logprobs(tokenizer, r, top) if want_logprobs else None,
        }
        for i, r in enumerate(results)
    ]
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(results[0].prompt_tokens, sum(len(r.tokens) for r in results)),
    }


def chunk(cid: str, model: str, created: int, choices: list[dict[str, Any]], usage_: Any = "absent") -> dict:
    out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}
    if usage_ != "absent":
        out["usage"] = usage_
    return out


def safe_content_end(text: str) -> int:
    """How much of a reply's text (so far) is certainly content: the stream may send ``text[:end]`` now.

    The parser finds calls anywhere and strips the content around them, so the safe part stops before
    anything that may start a call (``[``, ``{``, ``<``, ``name.call(``), before trailing whitespace and a
    trailing word that may grow into ``name.call(``, and is empty while the whole reply may still be a bare
    ``name(...)`` call.  What is sent is then always a prefix of the parsed content (a test holds it to that).
    """
    start = len(text) - len(text.lstrip())
    body = text[start:]
    if _IDENT_START.match(body):
        return 0  # may be a bare call `name(...)` making up the whole reply
    found = _OPENERS.search(body)
    end = found.start() if found else len(body)
    head = body[:end]
    tail = _TAIL_IDENT.search(head)
    if tail and found is None:
        head = head[: tail.start()]
    head = head.rstrip()
    return start + len(head) if head else 0


class ContentStreamer:
    """Turns a chat stream's text deltas into the content deltas safe to send now, and the rest at the end.

    ``push(text)`` returns the new safe content (maybe ""); ``finish(content)`` returns what must follow so the
    streamed content equals the parsed reply's ``content`` exactly.  ``hold()`` stops sending (a tool-call
    delta arrived: from there on everything waits for the parse).
    """

    def __init__(self, hold_all: bool = False, raw: bool = False) -> None:
        self.text = ""
        self.sent = ""
        self.held = hold_all
        self.raw = raw  # a response_format reply: the text is the content, as it is

    def push(self, text: str) -> str:
        self.text += text
        if self.held:
            return ""
        if self.raw:
            delta, self.sent = self.text[len(self.sent) :], self.text
            return delta
        start = len(self.text) - len(self.text.lstrip())
        end = safe_content_end(self.text)
        safe = self.text[start:end] if end else ""
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent) :], safe
        return delta

    def hold(self) -> None:
        self.held = True

    def finish(self, content: str) -> str:
        if content.startswith(self.sent):
            rest, self.sent = content[len(self.sent) :], content
            return rest
        return ""  # cannot happen for parsed replies (see safe_content_end); never resend what was sent


def completion_choice(index: int, text: str, finish: str | None, logprobs: Any) -> dict[str, Any]:
    return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}


def completion_logprobs(
    tokenizer: Any, ids: list[int], token_lps: list[float | None], tops: list[dict[str, float] | None], offset0: int = 0
) -> dict[str, Any]:
    """The legacy ``logprobs`` object: tokens, their log-probabilities, top alternatives and text offsets."""
    tokens = [tokenizer.decode([t]) for t in ids]
    offsets, at = [], offset0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def generated_logprobs(tokenizer: Any, result: Any, k: int) -> tuple[list[int], list[float | None], list[Any]]:
    """Ids, log-probabilities and top-``k`` dicts of a completion's generated tokens (engine values)."""
    lps = result.logprobs or []
    ids = [lp.token for lp in lps]
    values: list[float | None] = [lp.logprob for lp in lps]
    tops = [{t: v for t, v in list(lp.top_logprobs.items())[:k]} for lp in lps]
    return ids, values, tops
