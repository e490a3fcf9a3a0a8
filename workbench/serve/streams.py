"""Engine stream items → server-sent-event chunks (``chat.completion.chunk`` and ``text_completion``).

Engine stream chunks arrive as ``(choice, chunk)`` pairs, so one request's ``n`` choices may interleave
(they share engine batch streams with other clients' rows).  Chat content is sent only as far as it is
certainly content (see :class:`~workbench.serve.shapes.ContentStreamer`); the parsed calls go out as
``delta.tool_calls`` with their indices once the reply is complete, so the accumulated stream equals the
non-streamed reply.
"""

from __future__ import annotations

import json
import time
from typing import Any

from . import shapes


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event (``data: ...`` and a blank line)."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


class ChatStream:
    """The chunks of one streamed chat request (all its choices)."""

    def __init__(
        self, model: str, n: int, tokenizer: Any, *, raw: bool, logprobs: bool, top: int, include_usage: bool
    ) -> None:
        self.id = shapes.new_id("chatcmpl")
        self.created = int(time.time())
        self.model = model
        self.tokenizer = tokenizer
        self.logprobs, self.top, self.include_usage = logprobs, top, include_usage
        self.content = [shapes.ContentStreamer(raw=raw) for _ in range(n)]
        self.started = [False] * n
        self.results: list[Any] = [None] * n

    def _chunk(self, choice: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict:
        usage: Any = None if self.include_usage else "absent"
        return shapes.chunk(
            self.id,
            self.model,
            self.created,
            [{"index": choice, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            usage,
        )

    def feed(self, choice: int, chunk: Any) -> list[dict]:
        """Chunks for one engine StreamChunk of ``choice`` (its raw reply text; the last one carries the
        ChatCompletion in ``final``)."""
        out = []
        if not self.started[choice]:
            self.started[choice] = True
            out.append(self._chunk(choice, {"role": "assistant", "content": ""}))
        streamer = self.content[choice]
        delta = streamer.push(chunk.text or "") if chunk.final is None else ""
        if delta:
            out.append(self._chunk(choice, {"content": delta}))
        result = chunk.final
        if result is not None:
            self.results[choice] = result
            message = shapes.chat_message(result)
            rest = streamer.finish(result.message.content if isinstance(result.message.content, str) else "")
            if rest:
                out.append(self._chunk(choice, {"content": rest}))
            for j, call in enumerate(message["tool_calls"] or ()):
                out.append(self._chunk(choice, {"tool_calls": [{"index": j, **call}]}))
            lps = shapes.chat_logprobs(self.tokenizer, result, self.top) if self.logprobs else None
            out.append(self._chunk(choice, {}, shapes.finish_reason(result), lps))
        return out

    def done(self) -> list[dict]:
        """The usage chunk (when asked for) after every choice has finished."""
        if not self.include_usage or any(r is None for r in self.results):
            return []
        usage = shapes.usage(self.results[0].prompt_tokens, sum(len(r.tokens) for r in self.results))
        return [shapes.chunk(self.id, self.model, self.created, [], usage)]


class CompletionStream:
    """The chunks of one streamed ``/v1/completions`` request (``text_completion`` objects)."""

    def __init__(self, model: str, rows: int, tokenizer: Any, *, logprobs: int | None, include_usage: bool) -> None:
        self.id = shapes.new_id("cmpl")
        self.created = int(time.time())
        self.model = model
        self.tokenizer = tokenizer
        self.logprobs, self.include_usage = logprobs, include_usage
        self.results: list[Any] = [None] * rows

    def _chunk(self, choice: int, text: str, finish: str | None = None, logprobs: Any = None) -> dict:
        out = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [shapes.completion_choice(choice, text, finish, logprobs)],
        }
        if self.include_usage:
            out["usage"] = None
        return out

    def feed(self, choice: int, item: Any) -> list[dict]:
        final = item.final
        if final is None:
            return [self._chunk(choice, item.text)] if item.text else []
        self.results[choice] = final
        lps = None
        if self.logprobs is not None:
            ids, values, tops = shapes.generated_logprobs(self.tokenizer, final, self.logprobs)
            lps = shapes.completion_logprobs(self.tokenizer, ids, values, tops)
        return [self._chunk(choice, item.text, shapes.finish_reason(final), lps)]

    def done(self, prompt_tokens: int) -> list[dict]:
        if not self.include_usage or any(r is None for r in self.results):
            return []
        return [
            {
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": shapes.usage(prompt_tokens, sum(len(r.tokens) for r in self.results)),
            }
        ]
