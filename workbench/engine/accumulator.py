"""One generation call's rows, built from the runner's events as they arrive.

Every way of generating — a batch (results at the end), a batched stream (``(row, chunk)`` pairs) and a single
stream (a one-row batched stream) — feeds the runner's :class:`~workbench.generation.Event` s into one
:class:`RowAccumulator`, so stop reasons, stop-string cuts, streamed text, a row's own cancel and the partial
results of a cancelled call are handled in one place.  Each row is its :class:`~workbench.generation.Request`:
each event is recorded on it (tokens and log-probabilities; the in-process scheduler has put them there
already), and the accumulator keeps the row's stream state and its Completion there too.

A row's :class:`~workbench.types.Completion` is built the moment its last event arrives, and ``on_finish(request,
completion)`` is called then: the place to record rows as they finish (a progress bar, a store).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from workbench.engine.interfaces import TextTokenizer
from workbench.engine.outputs import parse_output, stop_prefix_overlap
from workbench.errors import GenerationCancelled
from workbench.generation import Event, Request
from workbench.types import Completion, StreamChunk

FinishHook = Callable[[Request, Completion], None]


class RowAccumulator:
    """The rows (requests) of one generation call: feed it every event with :meth:`add`; read :meth:`completions`.

    stream: also decode each row's text as it grows, so :meth:`add` returns the chunk to send (the new text,
        holding back half UTF-8 characters and whatever could still become a stop string, or the row's final
        chunk).  A batch leaves it off: no text is decoded until a row ends.
    on_finish: ``(request, completion)``, called once per row the moment the row ends — by its stop event, or by
        its own cancel (``stop_reason="cancelled"``); rows cut by a cancel of the whole call are not finished
        (they are in :meth:`partial`).
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        requests: Sequence[Request],
        *,
        stream: bool = False,
        on_finish: FinishHook | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.requests = list(requests)
        self.finished = 0  # rows ended
        self.generated = 0  # tokens generated, all rows together
        self.stream = stream
        self.on_finish = on_finish

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def done(self) -> bool:
        """Every row has ended."""
        return self.finished == len(self.requests)

    def cancel(self, row: int) -> None:
        """End ``row`` at the next event (its final says ``cancelled``); the other rows go on.  Any thread."""
        self.requests[row].cancel.set()

    def add(self, event: Event) -> StreamChunk | None:
        """Take one event; for a stream, the chunk to send for it (None: nothing to send yet)."""
        request = self.requests[event.index]
        if request.completion is not None:  # an ended (cancelled) row that a model-parallel runner still decodes
            return None
        if event.stop_reason == "cancelled" or request.cancel.flag:
            return self._end(request, "cancelled", None, None)
        request.record(event)
        if event.token is not None:
            self.generated += 1
        if event.stop_reason is not None:
            return self._end(request, event.stop_reason, event.truncate_text_at, event.token)
        return self._delta(request, event.token) if self.stream else None

    def completions(self) -> list[Completion]:
        """Every row's Completion, in order; :class:`GenerationCancelled` (with :meth:`partial`) if the call
        ended before every row did (``engine.cancel()``)."""
        if not self.done:
            raise self.cancelled()
        return [r.completion for r in self.requests]

    def partial(self) -> list[Completion]:
        """What each row has so far: an ended row's result, else its tokens so far with ``stop_reason="cancelled"``."""
        return [
            r.completion if r.completion is not None else self._completion(r, "cancelled", None) for r in self.requests
        ]

    def cancelled(self) -> GenerationCancelled:
        """The error of a call cut before every row ended, carrying :meth:`partial`."""
        return GenerationCancelled(
            f"generation was cancelled after {self.generated} tokens ({self.finished} of {len(self)} rows finished); "
            "the partial results are in .partial",
            partial=self.partial(),
        )

    # ----------------------------------------------------------------------------- internals
    def _end(self, request: Request, stop_reason: str, cut: int | None, token: int | None) -> StreamChunk | None:
        completion = self._completion(request, stop_reason, cut)
        request.completion = completion
        request.finish_reason = stop_reason  # type: ignore[assignment]
        self.finished += 1
        if self.on_finish is not None:
            self.on_finish(request, completion)
        if not self.stream:
            return None
        if stop_reason == "cancelled":
            return StreamChunk(token=None, text="", final=completion)
        return StreamChunk(token=token, text=completion.text[request.emitted :], final=completion)

    def _delta(self, request: Request, token: int | None) -> StreamChunk | None:
        tokens = request.tokens
        piece = self.tokenizer.decode(tokens[request.decoded :])  # only the new tokens: no re-decoding per step
        if piece.endswith("\ufffd"):  # hold back a half-decoded UTF-8 character
            return None
        text = request.text + piece
        request.text, request.decoded = text, len(tokens)
        safe = len(text) - stop_prefix_overlap(text, request.params.stop)  # never leak the start of a stop string
        emitted = request.emitted
        request.emitted = max(emitted, safe)
        return StreamChunk(token=token, text=text[emitted:safe])

    def _completion(self, request: Request, stop_reason: str, cut: int | None) -> Completion:
        tokens = request.tokens
        text = self.tokenizer.decode(tokens)
        if cut is not None:
            text = text[:cut]
        fmt = request.format
        parsed, format_error = parse_output(fmt, text, stop_reason) if fmt is not None else (None, None)
        return Completion(
            text=text,
            tokens=list(tokens),
            stop_reason=stop_reason,  # type: ignore[arg-type]
            logprobs=request.logprobs[: len(tokens)] if request.params.logprobs else None,
            prompt_tokens=len(request.prompt),
            parsed=parsed,
            format_error=format_error,
        )
