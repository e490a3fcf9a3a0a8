"""Several streams in one engine batch: ``(row, StreamChunk)`` events as tokens arrive, and cancelling one row.

Why: a server with many streaming clients (``workbench.serve``) must not run their streams one after another;
rows streamed together decode together, exactly as ``batch_completion`` rows do (each row's tokens equal the
same prompt alone).  A client that goes away cancels its row only: the row stops at the next step and frees its
cache slot, the other rows go on.  Every row ends with one chunk carrying ``final`` (its Completion, or what
``finish`` makes of it — the chat layer turns it into a ChatCompletion); a cancelled row's final says
``stop_reason="cancelled"``.  A single stream (``Engine.stream_completion``) is a one-row batch stream.

``preemptible=False`` (what a server that drains the stream from its own thread passes) never lets another
call close the stream; the default keeps the engine's rule for streams (one abandoned by its thread gives way
to that thread's next call at once, and to another thread's after a second without being read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from workbench.engine.accumulator import RowAccumulator
from workbench.engine.calls import CallGate, Calls
from workbench.engine.interfaces import Runner
from workbench.engine.outputs import close_events
from workbench.errors import GenerationCancelled
from workbench.generation import Request
from workbench.types import StreamChunk


class BatchStream:
    """Iterator of ``(row, StreamChunk)``; ``cancel(row)`` ends one row, ``close()`` ends them all.

    Built by ``Engine.stream_batch_completion`` / ``Engine.stream_batch_chat_completion`` (and, one row, by the
    single streams) from the engine's runner, gate and call counter, the rows' requests and their
    :class:`~workbench.engine.accumulator.RowAccumulator` (in stream mode).  The engine is held from the first
    ``next()`` until the last row ends or the stream is closed.
    """

    def __init__(
        self,
        runner: Runner,
        gate: CallGate,
        calls: Calls,
        requests: Sequence[Request],
        rows: RowAccumulator,
        *,
        what: str = "stream_batch_completion",
        preemptible: bool = True,
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
        self._gate = gate
        self._slot = {request.row: j for j, request in enumerate(requests)}
        self._replays = dict(replays or {})
        self._on_close = on_close
        self._partial = partial
        self._gen = self._run(runner, calls, list(requests), what, preemptible)

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> tuple[int, StreamChunk]:
        self._gate.progress += 1  # resumed: its reader is alive, other threads wait for it
        return next(self._gen)

    def cancel(self, row: int) -> None:
        """End ``row`` at the next decode step (its final chunk says ``cancelled``); safe from any thread.  A row
        answered from the run store has nothing to stop."""
        if row in self._slot:
            self._accumulator.cancel(self._slot[row])

    def close(self) -> None:
        """Stop every row now and give the engine back (also what an abandoned stream does)."""
        self._gen.close()

    def chunks(self) -> Iterator[StreamChunk]:
        """The chunks alone (a one-row stream's view); closing it closes the stream."""
        try:
            for _, chunk in self:
                yield chunk
        finally:
            self.close()

    def _run(
        self, runner: Runner, calls: Calls, requests: list[Request], what: str, preemptible: bool
    ) -> Iterator[tuple[int, StreamChunk]]:
        try:
            for row, chunks in sorted(self._replays.items()):  # stored rows: no model, no engine lock
                for chunk in chunks:
                    yield row, chunk
            if requests:
                yield from self._generate(runner, calls, requests, what, preemptible)
        finally:
            if self._on_close is not None:
                self._on_close()

    def _generate(
        self, runner: Runner, calls: Calls, requests: list[Request], what: str, preemptible: bool
    ) -> Iterator[tuple[int, StreamChunk]]:
        rows = self._accumulator
        with self._gate.exclusive(what, stream=self._gen if preemptible else None):
            call = calls.begin()
            events = runner.generate(requests)
            try:
                # the cancel flag is read before each event is pulled: no forward pass starts after a cancel
                while not calls.cancelled(call) and (event := next(events, None)) is not None:
                    chunk = rows.add(event)
                    if chunk is not None:
                        request = requests[event.index]
                        if chunk.final is not None and self.finish is not None:
                            chunk = replace(chunk, final=self.finish(request, chunk.final))
                        yield request.row, chunk
                    if rows.done:
                        return
            finally:
                close_events(events)  # closing (or abandoning) the stream stops the runner too
                calls.end(call)
        cancelled = rows.cancelled()  # engine.cancel() ended the call: every unfinished row is cut
        if self._partial is not None:
            raise GenerationCancelled(str(cancelled), partial=self._partial(cancelled.partial))
        raise cancelled
