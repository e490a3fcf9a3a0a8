"""Several streams in one engine batch: ``(row, StreamChunk)`` events as tokens arrive, and cancelling one row.

Why: a server with many streaming clients (``workbench.serve``) must not run their streams one after another;
rows streamed together decode together, exactly as ``batch_completion`` rows do (each row's tokens equal the
same prompt alone).  A client that goes away cancels its row only: the row stops at the next step and frees its
cache slot, the other rows go on.  Every row ends with one chunk carrying ``final`` (its Completion, or what
``finish`` makes of it — the chat layer turns it into a ChatCompletion); a cancelled row's final says
``stop_reason="cancelled"``.

``preemptible=False`` (what a server that drains the stream from its own thread passes) never lets another
call close the stream; the default keeps the engine's rule for streams (one abandoned by its thread gives way
to that thread's next call at once, and to another thread's after a second without being read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from workbench.engine.outputs import cancelled_event, stop_prefix_overlap
from workbench.errors import GenerationCancelled
from workbench.generation import Event, Request, RowCancel
from workbench.generation.sampling import SamplingParams
from workbench.types import StreamChunk, TokenLogprob


class _RowText:
    """One row's tokens and the text already streamed (stop strings and half UTF-8 characters held back)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.decoded = 0  # tokens decoded into `text`
        self.text = ""
        self.emitted = 0  # characters of `text` already yielded

    def add(self, event: Event) -> None:
        if event.token is not None:
            self.tokens.append(event.token)
            if event.logprob is not None:
                self.logprobs.append(event.logprob)

    def delta(self, decode: Callable[[list[int]], str], stops: tuple[str, ...]) -> str | None:
        piece = decode(self.tokens[self.decoded :])  # only the new tokens: no re-decoding per step
        if piece.endswith("\ufffd"):  # hold back a half-decoded UTF-8 character
            return None
        self.text, self.decoded = self.text + piece, len(self.tokens)
        safe = len(self.text) - stop_prefix_overlap(self.text, stops)  # never leak the start of a stop string
        delta, self.emitted = self.text[self.emitted : safe], max(self.emitted, safe)
        return delta


class BatchStream:
    """Iterator of ``(row, StreamChunk)``; ``cancel(row)`` ends one row, ``close()`` ends them all.

    Built by ``Engine.stream_batch_completion`` / ``Engine.stream_batch_chat_completion``.  The engine is
    held from the first ``next()`` until the last row ends or the stream is closed.
    """

    def __init__(self, engine: Any, prompts: list[list[int]], tiles: Sequence[Any], params: SamplingParams,
                 formats: Sequence[Any], constraints: Sequence[Any], *, preemptible: bool = True) -> None:
        self.rows = len(prompts)
        self.finish: Callable[[int, Any], Any] | None = None  # (row, Completion) -> the final object
        self._cancels = [RowCancel() for _ in prompts]
        self._gate = engine._gate
        self._gen = self._run(engine, prompts, list(tiles), params, list(formats), list(constraints), preemptible)

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> tuple[int, StreamChunk]:
        self._gate.progress += 1  # resumed: its reader is alive, other threads wait for it
        return next(self._gen)

    def cancel(self, row: int) -> None:
        """End ``row`` at the next decode step (its final chunk says ``cancelled``); safe from any thread."""
        self._cancels[row].set()

    def close(self) -> None:
        """Stop every row now and give the engine back (also what an abandoned stream does)."""
        self._gen.close()

    def _final(self, row: int, completion: Any) -> Any:
        return self.finish(row, completion) if self.finish is not None else completion

    def _run(self, engine: Any, prompts: list[list[int]], tiles: list[Any], params: SamplingParams,
             formats: list[Any], constraints: list[Any],
             preemptible: bool) -> Iterator[tuple[int, StreamChunk]]:
        with engine._gate.exclusive("stream_batch_completion", stream=self._gen if preemptible else None):
            texts = [_RowText() for _ in prompts]
            done = [False] * len(prompts)
            requests = [Request(i, p, params, c, image_tiles=t, cancel=self._cancels[i])
                        for i, (p, c, t) in enumerate(zip(prompts, constraints, tiles))]
            call = engine._calls.begin()
            events = engine._events(call, requests)
            try:
                for event in events:
                    i = event.index
                    if done[i]:  # a cancelled row that a model-parallel runner still decodes
                        continue
                    row = texts[i]
                    if event.stop_reason == "cancelled" or self._cancels[i].is_set():
                        done[i] = True
                        final = engine._completion(row.tokens, row.logprobs, cancelled_event(i), params,
                                                   len(prompts[i]), formats[i])
                        yield i, StreamChunk(token=None, text="", final=self._final(i, final))
                    else:
                        row.add(event)
                        if event.stop_reason is not None:
                            done[i] = True
                            final = engine._completion(row.tokens, row.logprobs, event, params, len(prompts[i]),
                                                       formats[i])
                            yield i, StreamChunk(token=event.token, text=final.text[row.emitted :],
                                                 final=self._final(i, final))
                        else:
                            delta = row.delta(engine.tokenizer.decode, params.stop)
                            if delta is not None:
                                yield i, StreamChunk(token=event.token, text=delta)
                    if all(done):
                        return
            finally:
                events.close()  # closing (or abandoning) the stream stops the runner too
                engine._calls.end(call)
            if not all(done):  # engine.cancel() ended the call: every unfinished row is cut
                partial = [engine._completion(t.tokens, t.logprobs, cancelled_event(i), params, len(prompts[i]),
                                              formats[i]) for i, t in enumerate(texts)]
                raise GenerationCancelled(
                    f"generation was cancelled ({sum(done)} of {len(prompts)} rows finished); the partial "
                    "results are in .partial", partial=partial)
