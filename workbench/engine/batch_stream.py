"""Several streams in one engine batch: ``(row, StreamChunk)`` events as tokens arrive, and cancelling one row.

Why: a server with many streaming clients (``workbench.serve``) must not run their streams one after another;
rows streamed together decode together, exactly as ``batch_completion`` rows do (each row's tokens equal the
same prompt alone).  A client that goes away cancels its row only: the row stops at the next step and frees its
cache slot, the other rows go on.  Every row ends with one chunk carrying ``final`` (its Completion, or what
``finish`` makes of it — the chat layer turns it into a ChatCompletion); a cancelled row's final says
``stop_reason="cancelled"``.  A single stream (``Engine.stream_completion``) is a one-row batch stream.

A stream's rows run in the engine's running batch (:mod:`.loop`) beside every other call's: a stream that is
not read holds no other call up (its rows go on to their ends and their chunks wait), and a stream closed or
dropped ends its rows at the next step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from workbench.engine.accumulator import RowAccumulator
from workbench.engine.calls import Calls
from workbench.engine.loop import EngineLoop, call_events
from workbench.errors import GenerationCancelled
from workbench.generation import Request
from workbench.types import StreamChunk


class BatchStream:
    """Iterator of ``(row, StreamChunk)``; ``cancel(row)`` ends one row, ``close()`` ends them all.

    Built by ``Engine.stream_batch_completion`` / ``Engine.stream_batch_chat_completion`` (and, one row, by the
    single streams) from the engine's loop and call counter, the rows' requests and their
    :class:`~workbench.engine.accumulator.RowAccumulator` (in stream mode).  The rows join the running batch at
    the first ``next()`` and leave it when they end or the stream is closed.
    """

    def __init__(
        self,
        loop: EngineLoop,
        calls: Calls,
        requests: Sequence[Request],
        rows: RowAccumulator,
        *,
        total: int | None = None,
        replays: dict[int, list[StreamChunk]] | None = None,
        on_close: Callable[[], None] | None = None,
        partial: Callable[[list[Any]], list[Any]] | None = None,
        finish: Callable[[Request, Any], Any] | None = None,
    ) -> None:
        # ``requests``/``rows`` are the rows to generate; with a run store (``run=``) they are some of the call's
        # ``total`` rows (``request.row``: its place in the call), and ``replays`` holds the chunks of each stored
        # row, sent first.  ``on_close`` runs when the stream ends (the store's last write); ``partial`` turns the
        # generated rows' partial results into the call's (a cancel); ``finish``: (request, Completion) -> the
        # final object a row's last chunk carries.
        self.rows = len(requests) if total is None else total
        self.finish = finish
        self._accumulator = rows
        self._slot = {request.row: j for j, request in enumerate(requests)}
        self._replays = dict(replays or {})
        self._on_close = on_close
        self._partial = partial
        self._gen = self._run(loop, calls, list(requests))

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> tuple[int, StreamChunk]:
        return next(self._gen)

    def cancel(self, row: int) -> None:
        """End ``row`` at the next decode step (its final chunk says ``cancelled``); safe from any thread.  A row
        answered from the run store has nothing to stop."""
        if row in self._slot:
            self._accumulator.cancel(self._slot[row])

    def close(self) -> None:
        """Stop every row at the next step (also what a dropped stream does)."""
        self._gen.close()

    def chunks(self) -> Iterator[StreamChunk]:
        """The chunks alone (a one-row stream's view); closing it closes the stream."""
        try:
            for _, chunk in self:
                yield chunk
        finally:
            self.close()

    def _run(self, loop: EngineLoop, calls: Calls, requests: list[Request]) -> Iterator[tuple[int, StreamChunk]]:
        try:
            for row, chunks in sorted(self._replays.items()):  # stored rows: no model
                for chunk in chunks:
                    yield row, chunk
            if requests:
                yield from self._generate(loop, calls, requests)
        finally:
            if self._on_close is not None:
                self._on_close()

    def _generate(self, loop: EngineLoop, calls: Calls, requests: list[Request]) -> Iterator[tuple[int, StreamChunk]]:
        rows = self._accumulator
        events = call_events(loop, calls, requests)
        try:
            for event in events:
                chunk = rows.add(event)
                if chunk is not None:
                    request = requests[event.index]
                    if chunk.final is not None and self.finish is not None:
                        chunk = replace(chunk, final=self.finish(request, chunk.final))
                    yield request.row, chunk
                if rows.done:
                    return
        finally:
            events.close()  # closing (or dropping) the stream ends its rows at the next step
        cancelled = rows.cancelled()  # engine.cancel() ended the call: every unfinished row is cut
        if self._partial is not None:
            raise GenerationCancelled(str(cancelled), partial=self._partial(cancelled.partial))
        raise cancelled
