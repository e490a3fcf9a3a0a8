"""The loop that answers a batch's requests in engine batches, shared by the Batch API and the command line.

Why a backend: turning an OpenAI request body into engine rows and the rows' results into a response body is
the OpenAI endpoint's work (:mod:`workbench.serve` does it, and sits above this package); this loop only
decides what runs together and when.  A backend has

* ``prepare(url, body)`` → a prepared request with ``key`` (requests of equal keys can share one engine
  call: same tools, tool choice and sampling) and ``rows`` (engine rows it needs: ``n`` choices, prompts);
  it raises an :class:`~workbench.errors.InputError` (with ``status`` and ``body()`` when it has them) for a
  request the endpoint would refuse;
* ``answer(prepared, run)`` → one :class:`Answer` per prepared request, computed as engine batches (one
  engine call per key among them); it raises :class:`Interrupted` when it cannot answer now (the server is
  stopping): nothing of that chunk is written and the batch resumes later;
* ``budget()`` → how many rows the next chunk may hold (small while interactive requests are being served,
  large when the engine is the batch's alone).

Requests are grouped by key (first appearance order, so a file of one setting keeps its order) and cut into
chunks of at most ``budget()`` rows; each chunk is one ``answer`` call, and its answers are handed to
``emit`` before the next starts, so a killed process loses at most the chunk in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from workbench.errors import InputError

from .lines import Request

RUN_PREFIX = "batch:"


class Interrupted(Exception):
    """The backend cannot answer now (the server is stopping or the engine is unavailable)."""


@dataclass
class Answer:
    """A request's HTTP status and response body (OpenAI's error body for a 4xx)."""

    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class Backend(Protocol):
    def prepare(self, url: str, body: dict[str, Any]) -> Any: ...

    def answer(self, prepared: Sequence[Any], run: str | None) -> list[Answer]: ...

    def budget(self) -> int: ...


@dataclass
class Work:
    """A request that passed ``prepare``, waiting for its answer."""

    request: Request
    prepared: Any


def run_name(batch_id: str) -> str:
    """The run-store name a batch's rows are stored under (one per batch, so a resumed batch finds them)."""
    return RUN_PREFIX + batch_id


def refusal(exc: BaseException) -> Answer:
    """The answer of a request ``prepare`` refused: its status and error body (400 and a plain body when the
    error carries none)."""
    status = getattr(exc, "status", 400 if isinstance(exc, InputError) else 500)
    body = (
        exc.body()
        if callable(getattr(exc, "body", None))
        else {
            "error": {
                "message": str(exc) or type(exc).__name__,
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    )
    return Answer(int(status), body)


def prepare(backend: Backend, request: Request) -> Work | Answer:
    """``backend.prepare`` of one request: the work to run, or the refusal to write."""
    try:
        return Work(request, backend.prepare(request.url, request.body))
    except Exception as exc:  # noqa: BLE001 - every refusal is a line of the batch, never its failure
        return refusal(exc)


def in_key_order(works: Sequence[Work]) -> list[Work]:
    """``works`` grouped by key, keys in the order they first appear (stable within a key)."""
    groups: dict[Any, list[Work]] = {}
    for work in works:
        groups.setdefault(work.prepared.key, []).append(work)
    return [work for group in groups.values() for work in group]


def run_chunks(
    backend: Backend,
    works: Sequence[Work],
    *,
    run: str | None,
    emit: Callable[[list[tuple[Work, Answer]]], None],
    stop: Callable[[], bool] = lambda: False,
) -> bool:
    """Answer ``works`` chunk by chunk (see the module docstring); True when all were answered, False when
    ``stop()`` said so between chunks.  :class:`Interrupted` propagates (the chunk in flight is not emitted)."""
    order = in_key_order(works)
    at = 0
    while at < len(order):
        if stop():
            return False
        budget = max(1, int(backend.budget()))
        chunk, rows = [], 0
        while at < len(order) and (not chunk or rows + order[at].prepared.rows <= budget):
            chunk.append(order[at])
            rows += order[at].prepared.rows
            at += 1
        answers = backend.answer([w.prepared for w in chunk], run)
        emit(list(zip(chunk, answers)))
    return True
