"""One generation call's rows, built from the runner's events as they arrive.

Every way of generating — a batch (results at the end), a batched stream (``(row, chunk)`` pairs) and a single
stream (a one-row batched stream) — feeds the runner's :class:`~workbench.generation.Event` s into one
:class:`RowAccumulator`, so tokens, log-probabilities, stop reasons, stop-string cuts, streamed text, a row's own
cancel and the partial results of a cancelled call are handled in one place.

A row's :class:`~workbench.types.Completion` is built the moment its last event arrives, and ``on_finish(row,
completion)`` is called then: the place to record rows as they finish (a progress bar, a store).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from workbench.engine.interfaces import TextTokenizer
from workbench.engine.outputs import parse_output, stop_prefix_overlap
from workbench.errors import GenerationCancelled
from workbench.generation import Event, RowCancel, SamplingParams
from workbench.structured import OutputFormat
from workbench.types import Completion, StreamChunk, TokenLogprob

FinishHook = Callable[[int, Completion], None]


class RowAccumulator:
    """The rows of one generation call: feed it every event with :meth:`add`; read :meth:`completions`.

    stream: also decode each row's text as it grows, so :meth:`add` returns the chunk to send (the new text,
        holding back half UTF-8 characters and whatever could still become a stop string, or the row's final
        chunk).  A batch leaves it off: no text is decoded until a row ends.
    on_finish: ``(row, completion)``, called once per row the moment the row ends — by its stop event, or by
        its own cancel (``stop_reason="cancelled"``); rows cut by a cancel of the whole call are not finished
        (they are in :meth:`partial`).
    """

    def __init__(self, tokenizer: TextTokenizer, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 formats: Sequence[OutputFormat | None] | None = None, *, stream: bool = False,
                 on_finish: FinishHook | None = None) -> None:
        n = len(prompts)
        self.tokenizer = tokenizer
        self.params = params
        self.prompt_lengths = [len(p) for p in prompts]
        self.formats = list(formats) if formats is not None else [None] * n
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
        self.results: list[Completion | None] = [None] * n  # a row's Completion once it has ended
        self.finished = 0  # rows ended
        self.generated = 0  # tokens generated, all rows together
        self.stream = stream
        self.on_finish = on_finish
        # One flag per row (the runner's Requests carry them): set by cancel(row), read by the scheduler.
        self.cancels = [RowCancel() for _ in range(n)]
        self._decoded = [0] * n  # streams: tokens decoded into _text
        self._text = [""] * n
        self._emitted = [0] * n  # streams: characters of _text already sent

    def __len__(self) -> int:
        return len(self.results)

    @property
    def done(self) -> bool:
        """Every row has ended."""
        return self.finished == len(self.results)

    def cancel(self, row: int) -> None:
        """End ``row`` at the next event (its final says ``cancelled``); the other rows go on.  Any thread."""
        self.cancels[row].set()

    def add(self, event: Event) -> StreamChunk | None:
        """Take one event; for a stream, the chunk to send for it (None: nothing to send yet)."""
        i = event.index
        if self.results[i] is not None:  # an ended (cancelled) row that a model-parallel runner still decodes
            return None
        if event.stop_reason == "cancelled" or self.cancels[i].flag:
            return self._end(i, "cancelled", None, None)
        if event.token is not None:
            self.tokens[i].append(event.token)
            self.generated += 1
            if event.logprob is not None:
                self.logprobs[i].append(event.logprob)
        if event.stop_reason is not None:
            return self._end(i, event.stop_reason, event.truncate_text_at, event.token)
        return self._delta(i, event.token) if self.stream else None

    def completions(self) -> list[Completion]:
        """Every row's Completion, in order; :class:`GenerationCancelled` (with :meth:`partial`) if the call
        ended before every row did (``engine.cancel()``)."""
        if not self.done:
            raise self.cancelled()
        return list(self.results)  # type: ignore[arg-type]

    def partial(self) -> list[Completion]:
        """What each row has so far: an ended row's result, else its tokens so far with ``stop_reason="cancelled"``."""
        return [r if r is not None else self._completion(i, "cancelled", None) for i, r in enumerate(self.results)]

    def cancelled(self) -> GenerationCancelled:
        """The error of a call cut before every row ended, carrying :meth:`partial`."""
        return GenerationCancelled(
            f"generation was cancelled after {self.generated} tokens ({self.finished} of {len(self)} rows finished); "
            "the partial results are in .partial",
            partial=self.partial(),
        )

    # ----------------------------------------------------------------------------- internals
    def _end(self, i: int, stop_reason: str, cut: int | None, token: int | None) -> StreamChunk | None:
        completion = self._completion(i, stop_reason, cut)
        self.results[i] = completion
        self.finished += 1
        if self.on_finish is not None:
            self.on_finish(i, completion)
        if not self.stream:
            return None
        if stop_reason == "cancelled":
            return StreamChunk(token=None, text="", final=completion)
        return StreamChunk(token=token, text=completion.text[self._emitted[i]:], final=completion)

    def _delta(self, i: int, token: int | None) -> StreamChunk | None:
        tokens = self.tokens[i]
        piece = self.tokenizer.decode(tokens[self._decoded[i]:])  # only the new tokens: no re-decoding per step
        if piece.endswith("\ufffd"):  # hold back a half-decoded UTF-8 character
            return None
        text = self._text[i] + piece
        self._text[i], self._decoded[i] = text, len(tokens)
        safe = len(text) - stop_prefix_overlap(text, self.params.stop)  # never leak the start of a stop string
        emitted = self._emitted[i]
        self._emitted[i] = max(emitted, safe)
        return StreamChunk(token=token, text=text[emitted:safe])

    def _completion(self, i: int, stop_reason: str, cut: int | None) -> Completion:
        tokens = self.tokens[i]
        text = self.tokenizer.decode(tokens)
        if cut is not None:
            text = text[:cut]
        fmt = self.formats[i]
        parsed, format_error = parse_output(fmt, text, stop_reason) if fmt is not None else (None, None)
        return Completion(
            text=text,
            tokens=list(tokens),
            stop_reason=stop_reason,  # type: ignore[arg-type]
            logprobs=self.logprobs[i][: len(tokens)] if self.params.logprobs else None,
            prompt_tokens=self.prompt_lengths[i],
            parsed=parsed,
            format_error=format_error,
        )
