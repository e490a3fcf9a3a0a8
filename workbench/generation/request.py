"""One request, from the engine's call to its result: nano-vllm's ``Sequence``.

A :class:`Request` is made when a call is validated and encoded, and the same object then goes everywhere the
row goes: the run store's lookup marks it answered (``stored``) or leaves it to compute (with the seed it runs
with), the scheduler admits it into a cache slot and keeps its running state on it (random stream, grammar
state, generated ``tokens`` and ``logprobs``, fed positions: the prefix cache's record of the slot is the
request itself), the accumulator builds its ``completion`` from it, and the store writes it when it ends.
Nothing is kept in lists aligned by row index.

The fields below the first group are plain values the generation layer never reads (the engine's output
format, the request as the caller gave it, ``item=``, the run-store key and results): they ride along so a row
is one object.  A model-parallel runner sends :meth:`Request.wire` (the generation fields only) to its worker
processes; the accumulator records every event on its request (:meth:`Request.record`), which appends what the
request does not hold yet (a worker's tokens; the in-process scheduler's are there already)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.generation.sampling import SamplingParams
from workbench.types import StopReason, TokenLogprob


class RowCancel:
    """Cancels one row of a running call (a disconnected client's stream) without stopping the others.

    A plain object, so a Request holding it still pickles; model-parallel workers get a copy (the engine
    then just drops the row's events until the call ends)."""

    __slots__ = ("flag",)

    def __init__(self) -> None:
        self.flag = False

    def set(self) -> None:
        self.flag = True

    def is_set(self) -> bool:
        return self.flag


@dataclass
class Event:
    """One generated token of request ``index``; ``stop_reason`` is set on the request's last event.

    A final event may carry ``token=None`` (stopped on a stop token or a stop string, nothing to add).
    """

    index: int
    token: int | None
    logprob: TokenLogprob | None = None
    stop_reason: StopReason | None = None
    truncate_text_at: int | None = None  # set when a stop string ended the row: cut text here
    # tokens the request has generated once this event is taken (the scheduler sets it: an in-process request
    # already holds the token, see Request.record); None: append the token
    count: int | None = None


@dataclass(eq=False)
class Request:
    """One row of a generation call (see the module docstring); ``index``: its place among the call's rows that
    run (events name it)."""

    index: int
    prompt: list[int]
    params: SamplingParams
    constraint: Any = None  # a structured.Constraint: the row's output must follow its grammar
    # Llama 4: [n, 3, T, T], the prompt's images' tiles in <|patch|> order; Llama 3.2 Vision: an ImageSet
    image_tiles: Any = None
    # a RowCancel: once set, the row ends at the next step with stop_reason "cancelled" and frees its slot
    cancel: Any = field(default_factory=RowCancel)

    # ---- what it generated (the scheduler's, or recorded from a worker's events)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: StopReason | None = None
    # ---- the scheduler's running state while it holds a cache slot
    rng: torch.Generator | None = None  # the row's own random stream (None for greedy rows)
    grammar: Any = None  # structured.RowConstraint of a constrained row
    fed: int = 0  # generated tokens whose keys/values are in the cache

    # ---- the engine's (plain values the generation layer never reads)
    row: int = 0  # its place in the call as given (stored rows included)
    format: Any = None  # the row's OutputFormat (structured output; a chat row's reply format), or None
    given: Any = None  # the request as the caller gave it (the run store keeps it for browsing)
    item: Any = None  # what the row is a case of (``item=``), handed to the run store
    key: Any = None  # its run-store RowKey (with ``run=``)
    stored: Any = None  # the result the run store answered it with: then it does not run
    sampling_record: dict[str, Any] | None = None  # its sampling as stored (a drawn seed included)
    seed_drawn: bool = False
    completion: Any = None  # its Completion once it ended (the accumulator's)
    result: Any = None  # what the call returns for it (the completion, or a chat reply parsed from it)
    # streams: how much of its text is decoded and sent
    text: str = ""
    decoded: int = 0
    emitted: int = 0

    # ---- scheduler views
    def held_tokens(self) -> list[int]:
        """Tokens whose keys/values this row's slot holds at positions 0..n-1 (its prefix-cache record)."""
        return self.prompt + self.tokens[: self.fed] if self.fed else self.prompt

    @property
    def position(self) -> int:
        """Cache position of the last sampled token (the next one fed to the model)."""
        return len(self.prompt) + len(self.tokens) - 1

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    # ---- runners
    def wire(self, image_tiles: Any = None) -> Request:
        """The generation fields alone, for a model-parallel worker's pipe (no results, callbacks or caller
        objects cross it); ``image_tiles``: the images in their wire form."""
        return Request(self.index, self.prompt, self.params, self.constraint, image_tiles, self.cancel)

    def record(self, event: Event) -> None:
        """Take one of this row's events: its token and log-probability, unless the request holds them already
        (the in-process scheduler appended them to this very object; a worker's or a stand-in runner's events
        are appended here)."""
        if event.token is not None and (event.count is None or len(self.tokens) < event.count):
            self.tokens.append(event.token)
            if event.logprob is not None:
                self.logprobs.append(event.logprob)
        if event.stop_reason is not None:
            self.finish_reason = event.stop_reason
