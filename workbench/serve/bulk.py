"""OpenAI request bodies answered in bulk: the backend of the Batch API and of ``python -m workbench batch``.

A batch's requests go through the same translation, checks and response shapes as the OpenAI routes (so a
batch line's answer equals the same request sent alone), but not one request at a time: :meth:`answer` takes a
chunk of requests, turns them into engine rows, and hands every group of rows sharing one engine call (same
tools, tool choice and sampling) to the gatherer as ONE :class:`~workbench.serve.gather.BulkJob` — however many
rows, in one ``batch_chat_completion`` / ``batch_completion``, where the engine's continuous batching keeps its
slots full.  The gatherer runs jobs in arrival order, so interactive requests interleave between a batch's
chunks; :meth:`budget` keeps chunks to ``max_batch_size`` rows while interactive requests arrive and lets them
grow to ``bulk_rows`` once the endpoint has been quiet for ``quiet_s``.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.batches import Answer, Interrupted
from workbench.runs import call_keywords

from .app import Context, chat_rows, completion_body, completion_rows
from .errors import APIError
from .gather import BulkJob, Row
from .registry import served_ids
from .room import check_room
from .shapes import chat_response
from .translate import ChatRequest, CompletionRequest, check_model, parse_chat, parse_completion

BULK_FACTOR = 8  # rows per engine call when the batch has the engine alone: this many times max_batch_size


@dataclass
class Prepared:
    """A checked request: ``key`` (requests with equal keys share engine calls) and the engine ``rows`` it needs."""

    kind: str  # chat | completion
    req: ChatRequest | CompletionRequest
    key: tuple
    rows: int


class BulkBackend:
    """Answers OpenAI request bodies in engine batches through the server's gatherer (see the module docstring).

    ctx: the server's context (engine, gatherer, served model ids); bulk_rows: the largest chunk in rows
    (default ``BULK_FACTOR`` x the engine's ``max_batch_size``); quiet_s: how long without interactive
    requests before chunks grow from ``max_batch_size`` to ``bulk_rows``.
    """

    def __init__(self, ctx: Context, *, bulk_rows: int | None = None, quiet_s: float = 2.0) -> None:
        self.ctx = ctx
        self.bulk_rows = bulk_rows or BULK_FACTOR * ctx.gatherer.max_rows
        self.quiet_s = quiet_s
        self._closed = threading.Event()

    def close(self) -> None:
        """Stop waiting: an :meth:`answer` in progress raises :class:`Interrupted` (the server is stopping)."""
        self._closed.set()

    def budget(self) -> int:
        quiet = time.monotonic() - self.ctx.gatherer.last_interactive > self.quiet_s
        return self.bulk_rows if quiet else min(self.bulk_rows, self.ctx.gatherer.max_rows)

    def prepare(self, url: str, body: dict[str, Any]) -> Prepared:
        check_model(body, served_ids(self.ctx))
        if url == "/v1/chat/completions":
            chat = parse_chat(body)
            check_room(self.ctx.engine, chat)
            return Prepared("chat", chat, chat.row_key(0), chat.n)
        if url == "/v1/completions":
            completion = parse_completion(body)
            check_room(self.ctx.engine, completion)
            scores = len(completion.prompts) if completion.echo and completion.logprobs is not None else 0
            rows = (len(completion.rows) if completion.generate else 0) + scores
            return Prepared("completion", completion, completion.row_key(0), max(rows, 1))
        raise APIError(
            f"url {url!r:.60} is not served in a batch; use /v1/chat/completions or /v1/completions", param="url"
        )

    def answer(self, prepared: Sequence[Prepared], run: str | None = None) -> list[Answer]:
        """One answer per prepared request; their rows run as one engine call per key (see the module docstring)."""
        extra = call_keywords(run)  # a restarted batch gets its finished rows back from the run store
        plans: list[tuple[list[Row], list[Row]]] = []
        for item in prepared:
            if item.kind == "chat":
                rows, scores = chat_rows(item.req), []
            else:
                rows, scores = completion_rows(self.ctx, item.req)
            for row in rows:
                row.kwargs.update(extra)
            plans.append((rows, scores))
        groups: dict[tuple, list[Row]] = {}
        for rows, scores in plans:
            for row in rows + scores:
                groups.setdefault(row.key, []).append(row)
        for members in groups.values():
            self.ctx.gatherer.submit(BulkJob(members))
        futures = [row.future for rows, scores in plans for row in rows + scores]
        while concurrent.futures.wait(futures, timeout=0.5).not_done:
            if self._closed.is_set():
                raise Interrupted("the server is stopping")
        return [self._answer(item, rows, scores) for item, (rows, scores) in zip(prepared, plans)]

    def _answer(self, item: Prepared, rows: list[Row], scores: list[Row]) -> Answer:
        try:
            results = [row.future.result() for row in rows]
            scored = [row.future.result() for row in scores]
        except APIError as exc:
            # 503: the server stopped or the engine is unavailable; 499: engine.cancel() from a notebook cell hit
            # the chunk.  Neither is this request's fault: the chunk runs again (a batch stops by its own cancel).
            if exc.status in (499, 503):
                raise Interrupted(exc.message) from None
            return Answer(exc.status, exc.body())
        ctx = self.ctx
        if item.kind == "chat":
            req = item.req
            return Answer(200, chat_response(ctx.model, results, ctx.engine.tokenizer, req.logprobs, req.top_logprobs))
        return Answer(200, completion_body(ctx, item.req, results, scored))
