"""Many clients, one engine: every request's rows go straight into the engine's running batch.

The engine keeps one running batch that any thread feeds (:mod:`workbench.engine.loop`): rows join and leave it
at every step, whatever their sampling, tools or tool choice.  So the server gathers nothing: each job (a
request's rows, a stream, a Batch API chunk) runs at once as its own engine call on a worker thread, and the
engine decodes every job's rows together; ``max_batch_size`` bounds the rows in flight and the rest wait in the
engine in arrival order.  A short request that arrives while a long batch decodes joins it at the next step.  A
row's answer equals the in-process call because the engine guarantees per-row results independent of the batch;
a bad request fails alone.

Streams are jobs too: their worker hands each item to the client's queue; a client that disconnects sets
``cancelled`` and the worker closes the stream (or cancels its rows), which frees them at the next step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from workbench.engine import Engine
from workbench.errors import GenerationCancelled, WorkbenchError

from .errors import APIError, from_engine_error

log = logging.getLogger("workbench.serve")
# Jobs running at once (each a thread that mostly waits for the engine); more wait for a thread.
MAX_JOBS = 256


@dataclass
class Row:
    """One engine row: ``kind`` is ``chat`` (``payload``: dialog, response_format), ``completion`` (a prompt)
    or ``score`` (token ids to score with ``engine.logits``); ``kwargs`` are the engine call's keywords."""

    kind: str
    key: tuple
    payload: Any
    kwargs: dict[str, Any]
    where: str = "messages"
    future: Future = field(default_factory=Future)
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class StreamJob:
    """A stream the worker runs alone: ``start(engine, keywords)`` gives the engine's iterator (``keywords``: the
    server's own engine keywords, e.g. its ``run``), ``sink`` receives ``("item", x)``, then ``("end", None)`` or
    ``("error", APIError)``."""

    start: Callable[[Any, dict[str, Any]], Iterator[Any]]
    sink: Callable[[tuple[str, Any]], None]
    where: str = "messages"
    cancelled: threading.Event = field(default_factory=threading.Event)
    rows: int = 1


@dataclass
class BatchedStreamJob:
    """A stream whose rows may share one engine batch stream with other clients' (equal ``key``).

    ``kind`` is ``chat`` (``payloads``: (dialog, response_format) per choice) or ``completion`` (a prompt per
    row); ``kwargs`` are the engine call's keywords (``tools`` included for chat).  ``sink`` receives
    ``("item", (choice, StreamChunk))`` (the last chunk of a choice carries ``final``), then ``("end", None)``,
    or ``("error", APIError)``."""

    kind: str
    key: tuple
    payloads: list[Any]
    kwargs: dict[str, Any]
    sink: Callable[[tuple[str, Any]], None]
    where: str = "messages"
    cancelled: threading.Event = field(default_factory=threading.Event)
    choices: list[int] | None = None  # the request's choice index of each row (default: 0, 1, ...)

    @property
    def rows(self) -> int:
        return len(self.payloads)


@dataclass
class BulkJob:
    """Rows of one key that run as ONE engine call however many they are (a Batch API chunk).

    Its rows join the engine's running batch like any request's, so interactive requests share the steps with
    it: a batch that submits one chunk at a time interleaves with them."""

    members: list[Row]
    cancelled: threading.Event = field(default_factory=threading.Event)

    @property
    def rows(self) -> int:
        return len(self.members)


@dataclass
class Stats:
    """What the server's card shows: requests answered, tokens generated, and the engine seconds they took
    (``batches``: engine calls; ``largest_batch``: the most rows in flight at once, sharing the running batch)."""

    requests: int = 0
    rows: int = 0
    batches: int = 0
    tokens: int = 0
    busy_seconds: float = 0.0
    largest_batch: int = 0
    cancelled_streams: int = 0  # streams stopped because their client went away (or the server stopped)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.busy_seconds if self.busy_seconds else 0.0


class Gatherer:
    """The server's side of the engine (see the module docstring): each submitted job runs at once on a worker
    thread of its own, as its own engine call; the engine's loop decodes every job's rows together.

    window_s, max_wait_s: accepted for compatibility and unused (there is no gathering window any more).
    keywords: engine keywords every call of the server gets unless its rows carry their own (``run``: the server's
    run store name; a batch's rows carry the batch's).
    """

    def __init__(
        self, engine: Engine, *, window_s: float = 0.0, max_wait_s: float = 0.0, keywords: dict[str, Any] | None = None
    ) -> None:
        self.engine = engine
        self.keywords = dict(keywords or {})
        self.window_s = window_s
        self.max_wait_s = max_wait_s
        self.stats = Stats()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._current: set[int] = set()  # ids of the jobs submitted and not yet answered
        self._jobs: dict[int, Any] = {}
        self._in_flight = 0  # rows of the jobs running now
        self.last_interactive = 0.0  # time.monotonic() of the last request that was not a BulkJob
        self._pool = ThreadPoolExecutor(MAX_JOBS, thread_name_prefix="workbench-serve-job")

    @property
    def max_rows(self) -> int:
        return max(1, int(getattr(self.engine, "max_batch_size", 1) or 1))

    def submit(self, job: Row | StreamJob) -> None:
        if self._stopping.is_set():
            raise APIError("the server is stopping", status=503, type="server_error")
        if not isinstance(job, BulkJob):
            self.last_interactive = time.monotonic()
        with self._lock:
            self._current.add(id(job))
            self._jobs[id(job)] = job
        self._pool.submit(self._job, job)

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new work, fail what has not started, stop streams at their next item and wait (up to
        ``timeout``) for the running jobs."""
        self._stopping.set()
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.cancelled.set()
        self._pool.shutdown(wait=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._current:
                    return
            time.sleep(0.01)

    # ------------------------------------------------------------------------------------------- workers
    def _job(self, job: Any) -> None:
        rows = _rows(job)
        try:
            if self._stopping.is_set():
                _fail(job, APIError("the server stopped before this request ran", status=503, type="server_error"))
                return
            with self._lock:
                self._in_flight += rows
                self.stats.largest_batch = max(self.stats.largest_batch, self._in_flight)
            try:
                self._run([job])
            except BaseException as exc:  # noqa: BLE001 - a worker must survive anything a request causes
                log.exception("serve worker: unexpected error")
                _fail(job, from_engine_error(exc, getattr(job, "where", "messages")))
            finally:
                with self._lock:
                    self._in_flight -= rows
        finally:
            with self._lock:
                self._current.discard(id(job))
                self._jobs.pop(id(job), None)

    def _run(self, jobs: list[Any]) -> None:
        groups: dict[tuple, list[Row]] = {}
        order: list[Any] = []
        for job in jobs:
            if job.cancelled.is_set():
                _fail(job, APIError("the client went away", status=499, type="cancelled"))
            elif isinstance(job, (StreamJob, BulkJob)):
                order.append(job)
            else:  # a Row or a BatchedStreamJob: grouped by key
                if job.key not in groups:
                    groups[job.key] = []
                    order.append(job.key)
                groups[job.key].append(job)
        for item in order:
            if isinstance(item, StreamJob):
                self._run_stream(item)
                continue
            if isinstance(item, BulkJob):
                self._run_rows(item.members)
                continue
            members = groups[item]
            if isinstance(members[0], BatchedStreamJob):
                for chunk in _by_rows(members, self.max_rows):
                    self._run_stream_batch(chunk)
                continue
            for start in range(0, len(members), self.max_rows):
                self._run_rows(members[start : start + self.max_rows])

    def _run_rows(self, rows: list[Row]) -> None:
        started = time.perf_counter()
        try:
            results = run_rows(self.engine, rows, self.keywords)
        except GenerationCancelled as exc:  # engine.cancel() from the notebook: every row of the call ends
            for row in rows:
                _fail(row, from_engine_error(exc, row.where))
            return
        except Exception as exc:
            if len(rows) == 1 or not isinstance(exc, WorkbenchError):
                for row in rows:
                    _fail(row, from_engine_error(exc, row.where))
                return
            half = len(rows) // 2  # isolate the bad rows by halves: their neighbours still get their answers
            self._run_rows(rows[:half])
            self._run_rows(rows[half:])
            return
        self._account(len(rows), sum(len(getattr(r, "tokens", ())) for r in results), started)
        for row, result in zip(rows, results):
            if not row.future.done():
                row.future.set_result(result)

    def _run_stream(self, job: StreamJob) -> None:
        started = time.perf_counter()
        tokens = 0
        try:
            items = job.start(self.engine, self.keywords)
            try:
                for item in items:
                    if job.cancelled.is_set():
                        with self._lock:
                            self.stats.cancelled_streams += 1
                        break
                    tokens += _final_tokens(item)
                    job.sink(("item", item))
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    close()  # a disconnected client: closing the stream stops its engine rows
            job.sink(("end", None))
        except Exception as exc:
            job.sink(("error", from_engine_error(exc, job.where)))
        self._account(job.rows, tokens, started)

    def _run_stream_batch(self, jobs: list[BatchedStreamJob]) -> None:
        """One engine batch stream for the jobs' rows; events go to each job's sink, and a job whose client
        went away has its rows cancelled (the others go on)."""
        started = time.perf_counter()
        owners = [(job, choice) for job in jobs for choice in range(job.rows)]
        try:
            stream = open_stream(self.engine, jobs, self.keywords)
        except Exception as exc:
            if len(jobs) > 1 and isinstance(exc, WorkbenchError):
                for job in jobs:  # isolate the bad request: the others still stream
                    self._run_stream_batch([job])
            else:
                for job in jobs:
                    job.sink(("error", from_engine_error(exc, job.where)))
            return
        left = {id(job): job.rows for job in jobs}
        dropped: set[int] = set()
        tokens = 0
        try:
            for row, chunk in stream:
                for job in jobs:  # a disconnected client cancels its rows at the next step
                    if id(job) not in dropped and job.cancelled.is_set():
                        dropped.add(id(job))
                        with self._lock:
                            self.stats.cancelled_streams += 1
                        for r, (owner, _) in enumerate(owners):
                            if owner is job:
                                stream.cancel(r)
                job, choice = owners[row]
                if chunk.final is not None:
                    tokens += len(chunk.final.tokens)
                    left[id(job)] -= 1
                if id(job) in dropped:
                    continue
                job.sink(("item", (job.choices[choice] if job.choices else choice, chunk)))
                if left[id(job)] == 0:
                    job.sink(("end", None))
        except Exception as exc:  # engine.cancel() from the notebook, or an engine failure
            for job in jobs:
                if left[id(job)] and id(job) not in dropped:
                    job.sink(("error", from_engine_error(exc, job.where)))
        finally:
            stream.close()
        self._account(len(owners), tokens, started)

    def _account(self, rows: int, tokens: int, started: float) -> None:
        with self._lock:
            s = self.stats
            s.rows += rows
            s.batches += 1
            s.tokens += tokens
            s.busy_seconds += time.perf_counter() - started
            s.largest_batch = max(s.largest_batch, rows)


def _final_tokens(item: Any) -> int:
    """Tokens of a stream's final item (a ChatCompletion, or a StreamChunk carrying the Completion); else 0."""
    final = getattr(item, "final", None) or (item if hasattr(item, "message") else None)
    return len(final.tokens) if final is not None else 0


def _rows(job: Any) -> int:
    return getattr(job, "rows", 1)


def _fail(job: Any, error: APIError) -> None:
    if isinstance(job, BulkJob):
        for row in job.members:
            _fail(row, error)
    elif isinstance(job, (StreamJob, BatchedStreamJob)):
        job.sink(("error", error))
    elif not job.future.done():
        job.future.set_exception(error)


def _by_rows(jobs: list[BatchedStreamJob], max_rows: int) -> list[list[BatchedStreamJob]]:
    """Consecutive chunks of jobs holding at most ``max_rows`` rows (a job bigger than that goes alone)."""
    chunks: list[list[BatchedStreamJob]] = []
    for job in jobs:
        if chunks and sum(j.rows for j in chunks[-1]) + job.rows <= max_rows:
            chunks[-1].append(job)
        else:
            chunks.append([job])
    return chunks


def open_stream(engine: Engine, jobs: list[BatchedStreamJob], keywords: dict[str, Any] | None = None) -> Any:
    """One engine batch stream over every row of ``jobs`` (all of one key), in order;
    ``keywords``: the server's own engine keywords (under the jobs' own)."""
    kwargs = {**(keywords or {}), **jobs[0].kwargs}
    payloads = [p for job in jobs for p in job.payloads]
    if jobs[0].kind == "chat":
        formats = [fmt for _, fmt in payloads]
        tools = kwargs.pop("tools")
        return engine.stream_batch_chat_completion(
            [d for d, _ in payloads],
            tools,
            preemptible=False,
            response_format=formats if any(formats) else None,
            **kwargs,
        )
    return engine.stream_batch_completion(payloads, preemptible=False, **kwargs)


def run_rows(engine: Engine, rows: list[Row], keywords: dict[str, Any] | None = None) -> list[Any]:
    """One engine call for rows of one key: chat replies, completions, or prompt scores (in row order);
    ``keywords``: the server's own engine keywords (under the rows' own)."""
    kind = rows[0].kind
    kwargs = {**(keywords or {}), **rows[0].kwargs}
    if kind == "chat":
        formats = [r.payload[1] for r in rows]
        fmt = formats if any(f is not None for f in formats) else None
        tools = kwargs.pop("tools")
        return engine.batch_chat_completion(
            [r.payload[0] for r in rows], tools, response_format=fmt, progress=False, **kwargs
        )
    if kind == "completion":
        return engine.batch_completion([r.payload for r in rows], progress=False, **kwargs)
    if kind == "score":  # teacher-forced logits of the prompt (echo): not stored
        return [score_prompt(engine, r.payload, r.kwargs["k"]) for r in rows]
    raise ValueError(f"unknown row kind {kind!r}")


@dataclass
class PromptScore:
    """Teacher-forced log-probabilities of a prompt's tokens (the first has none) and their top-k."""

    ids: list[int]
    logprobs: list[float | None]
    top: list[dict[str, float] | None]
    # the stop token most likely after the prompt, with its log-probability and the top-k there: what echo
    # reports as the generated token when generation stopped at once (the engine drops stop tokens)
    next_stop: tuple[int, float, dict[str, float]] | None = None


def score_prompt(engine: Engine, ids: list[int], k: int) -> PromptScore:
    """``engine.logits`` of one prompt reduced at once to what a response needs (a row of logits is
    ``[len, vocab]`` float32: hundreds of MB for a long prompt, so rows are scored one at a time)."""
    logits = engine.logits([ids])[0]  # [len, vocab]
    logp = logits.log_softmax(dim=-1)  # [len, vocab]
    values: list[float | None] = [None]
    tops: list[dict[str, float] | None] = [None]
    for pos in range(1, len(ids)):
        row = logp[pos - 1]  # [vocab]: the distribution that predicted ids[pos]
        values.append(float(row[ids[pos]]))
        if k:
            best = row.topk(k)
            tops.append({engine.tokenizer.decode([int(t)]): float(v) for v, t in zip(best.values, best.indices)})
        else:
            tops.append({})
    last = logp[-1]  # [vocab]: the distribution of the first generated token
    stop = max(engine.tokenizer.stop_tokens, key=lambda t: float(last[t]))
    best = last.topk(k) if k else None
    top = {engine.tokenizer.decode([int(t)]): float(v) for v, t in zip(best.values, best.indices)} if k else {}
    return PromptScore(list(ids), values, tops, (stop, float(last[stop]), top))
