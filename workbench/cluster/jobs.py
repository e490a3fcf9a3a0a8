"""Jobs: a batch split into chunks that the pool's replicas pull, with progress, cancel and re-runs.

A job cuts its rows into contiguous chunks and keeps up to ``PIPELINE`` chunks queued on every live
replica (the next chunk waits inside the replica while the current one generates, so a replica never
idles between chunks).  Results land at their rows' positions, so rows come back in input order whatever
replica ran them.  A replica that dies (its process killed, its node lost) has its unfinished chunks put
back at the front of the queue for the other replicas while the pool starts a replacement in the dead
one's placement group; a chunk is re-run at most ``MAX_ATTEMPTS`` times, so a row that kills every
replica it touches fails the job instead of looping.  Rows are deterministic per row (greedy, or seeded
per row), so a re-run row is the row it would have been.

``job.cancel()`` asks every replica to stop the job: chunks not started return at once, the running one
stops at its next decode step (the replica engine's ``cancel()``); rows finished by then are kept in
``job.partial()``.  A chat job's rows are Completions of prompts the pool rendered; its ``to_results`` parses
them (``chat.finish``) when they are asked for, so no dialog is rendered twice.  A job of a ``run=`` call runs
only the rows its run store did not hold and writes each as its chunk comes back (the driver is the store's
one writer: replicas never open it).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.remember import StoredCall
from ..errors import FormatError, GenerationCancelled, InputError, WorkerError
from ..progress import TokenRate, auto_delay, progress_bar
from ..types import Completion
from .fleet import Fleet

__all__ = ["Job", "MAX_ATTEMPTS", "PIPELINE", "chunk_size"]

PIPELINE = 2  # chunks queued per replica
MAX_ATTEMPTS = 3  # runs of one chunk (the first and the re-runs after replica deaths)
POLL_S = 0.2  # how often the dispatcher looks at the cancel flag and redraws the bar
CANCEL_WAIT_S = 60.0  # how long a cancelled job waits for its replicas' partial rows

_job_ids = itertools.count(1)


@dataclass
class _Chunk:
    start: int
    stop: int
    attempts: int = 0


class Job:
    """A batch running on a :class:`~workbench.cluster.pool.ReplicaPool` (from ``pool.submit_...``).

    ``job.done`` (finished, failed or cancelled), ``job.result()`` (waits; raises the job's error or
    GenerationCancelled), ``job.cancel()``, ``job.partial()`` (finished rows, None for the others),
    ``job.stats()`` (rows, tokens and tokens/s per replica).

    The pool builds it with the rows, the engine method and keywords each chunk runs with, and ``to_results``
    (``(row indices, Completions) -> results``, for chat jobs), then :meth:`start` s it.
    """

    def __init__(
        self,
        fleet: Fleet,
        kind: str,
        method: str,
        rows: list[Any],
        kwargs: dict[str, Any],
        progress: bool | None,
        *,
        chunk_rows: Callable[[int], int],
        to_results: Callable[[list[int], list[Any]], list[Any]] | None = None,
        stored: StoredCall | None = None,
    ) -> None:
        if progress not in (None, True, False):
            raise InputError(f"progress must be True, False or None (automatic), got {progress!r}")
        self.id = next(_job_ids)
        self.kind = kind
        self.n_rows = len(rows)
        self._fleet = fleet
        self._method, self._inputs, self._kwargs = method, rows, kwargs
        self._chunk_rows = chunk_rows
        self._progress = progress
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._dispatching = threading.Event()  # set once rows go out (or the job ended before that)
        self._cancel = threading.Event()
        self._began = False  # rows were handed to the dispatcher (input checks passed)
        self._rows: list[Any] = [None] * self.n_rows  # finished rows (Completions), by input position
        self._cut: dict[int, Any] = {}  # rows stopped by a cancel (stop_reason "cancelled")
        self._result: list[Any] | None = None
        self._error: BaseException | None = None
        self._to_results = to_results
        # run=: the call's rows against the run store; this job runs its rows to compute (``stored.todo``), each
        # written as its chunk comes back (the driver is the store's one writer), and answers all of them
        self._stored = stored
        self._bar: Any = None
        self._start = time.perf_counter()
        self._end: float | None = None
        self.rows_done = 0
        self.tokens = 0
        self.rerun_chunks = 0
        self._per_replica: dict[int, dict[str, float]] = {}

    # ----------------------------------------------------------------------------- public
    @property
    def done(self) -> bool:
        """True once the job has finished, failed or been cancelled."""
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> list[Any]:
        """The rows in input order (waits for them).  Raises the job's error, or GenerationCancelled (its
        ``.partial`` as the engine's: unfinished rows with ``stop_reason="cancelled"``).  Ctrl-C cancels the job."""
        try:
            if not self._finished.wait(timeout):
                raise TimeoutError(
                    f"job {self.id} is still running after {timeout} s ({self.rows_done} of "
                    f"{self.n_rows} rows done); wait longer or job.cancel()"
                )
        except KeyboardInterrupt:
            self.cancel()
            self._finished.wait(CANCEL_WAIT_S)
            raise
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> bool:
        """Stop the job on every replica (the running chunks within a decode step); True if it was running."""
        if self.done:
            return False
        self._cancel.set()
        self._fleet.cancel_job(self.id)
        return True

    def partial(self) -> list[Any]:
        """Rows finished so far, in input order; None where a row has not finished (or was cancelled)."""
        if self._stored is not None:
            return self._stored.so_far()
        with self._lock:
            rows = list(self._rows)
        if self._to_results is None:
            return rows
        done = [i for i, r in enumerate(rows) if r is not None]
        converted = self._to_results(done, [rows[i] for i in done]) if done else []
        out: list[Any] = [None] * len(rows)
        for i, r in zip(done, converted):
            out[i] = r
        return out

    def stats(self) -> dict[str, Any]:
        """Rows, tokens and tokens/s, in all and per replica (``per_replica[index]``), and chunks re-run."""
        elapsed = (self._end or time.perf_counter()) - self._start
        with self._lock:
            per = {
                k: dict(v, tok_s=v["tokens"] / v["seconds"] if v["seconds"] else 0.0)
                for k, v in self._per_replica.items()
            }
        return {
            "rows": self.n_rows,
            "rows_done": self.rows_done,
            "tokens": self.tokens,
            "seconds": elapsed,
            "tok_s": self.tokens / elapsed if elapsed > 0 else 0.0,
            "rerun_chunks": self.rerun_chunks,
            "per_replica": per,
        }

    def __repr__(self) -> str:
        state = (
            "done"
            if self.done and self._error is None
            else ("cancelled" if isinstance(self._error, GenerationCancelled) else "failed" if self.done else "running")
        )
        return f"Job({self.id}, {self.kind}, {state}: {self.rows_done}/{self.n_rows} rows, {self.tokens} tokens)"

    def start(self) -> Job:
        """Run the job in a thread; returns once its rows go out to the replicas, so that bad input (a
        ``response_format`` list of the wrong length) raises here, in the caller."""

        def main() -> None:
            try:
                rows = self._dispatch()
                if self._stored is not None:
                    self._stored.close()  # written before result() returns (the finally below is for failures)
                    self._result = self._stored.results()
                else:
                    self._result = self._to_results(list(range(len(rows))), rows) if self._to_results else rows
            except BaseException as exc:  # noqa: BLE001  (handed to result(), in the caller's thread)
                self._error = exc
            finally:
                if self._stored is not None:
                    self._stored.close()
                self._end = time.perf_counter()
                self._close_bar()
                self._dispatching.set()
                self._finished.set()

        threading.Thread(target=main, name=f"workbench-cluster-job{self.id}", daemon=True).start()
        self._dispatching.wait()
        if not self._began:
            self._finished.wait()
            if self._error is not None:
                raise self._error
        return self

    # ----------------------------------------------------------------------------- internals
    def _store(self, chunk: _Chunk, rows: Sequence[Any], replica: int, seconds: float) -> None:
        tokens = sum(len(r.tokens) for r in rows if r is not None)
        with self._lock:
            for offset, row in enumerate(rows):
                if row is None:
                    continue
                if row.stop_reason == "cancelled":
                    self._cut[chunk.start + offset] = row
                elif self._rows[chunk.start + offset] is None:
                    self._rows[chunk.start + offset] = row
                    self.rows_done += 1
                    if self._stored is not None:
                        self._stored.finished(chunk.start + offset, row)
            self.tokens += tokens
            stats = self._per_replica.setdefault(replica, {"rows": 0, "tokens": 0, "seconds": 0.0})
            stats["rows"] += sum(r is not None and r.stop_reason != "cancelled" for r in rows)
            stats["tokens"] += tokens
            stats["seconds"] += seconds
        self._draw()

    def _draw(self) -> None:
        if self._progress is False or self.n_rows <= 1 and self._progress is None:
            return
        elapsed = time.perf_counter() - self._start
        if self._bar is None:
            if self._progress is None and (elapsed < auto_delay() or os.environ.get("WORKBENCH_PROGRESS") == "0"):
                return
            self._rate = TokenRate()
            self._rate.start = self._start
            self._bar = progress_bar(
                self.n_rows,
                desc=f"{self.kind} on {self._fleet.live} replicas",
                unit="row",
                progress=True,
                rate=self._rate,
                auto=self._progress is None,
            )
            self._bar.start = self._start  # its closing summary counts the seconds since the job began
        self._rate.tokens = self.tokens
        per = ", ".join(f"r{k}:{int(v['rows'])}" for k, v in sorted(self._per_replica.items()))
        self._bar.set_postfix_str(f"{self.tokens / max(elapsed, 1e-9):.0f} tok/s {per}", refresh=False)
        self._bar.update(self.rows_done - self._bar.n)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._draw()
            self._bar.close()

    def _cancelled_error(self, n: int) -> GenerationCancelled:
        with self._lock:
            partial = [
                self._rows[i] or self._cut.get(i) or Completion(text="", tokens=[], stop_reason="cancelled")
                for i in range(n)
            ]
        if self._stored is not None:
            partial = self._stored.partial(partial)
        return GenerationCancelled(
            f"the job was cancelled after {self.tokens} tokens ({self.rows_done} of {n} rows finished); the partial "
            "results are in .partial (and job.partial())",
            partial=partial,
        )

    def _dispatch(self) -> list[Any]:
        """Run the job's method over its rows on the fleet's replicas; the rows' results in input order."""
        import ray
        from ray.exceptions import RayError, RayTaskError

        method, rows, kwargs, fleet = self._method, self._inputs, self._kwargs, self._fleet
        n = len(rows)
        formats = kwargs.get("response_format")
        per_row = isinstance(formats, (list, tuple))
        seeds = kwargs.get("seed")
        seed_per_row = isinstance(seeds, (list, tuple))
        if per_row and len(formats) != n:
            raise FormatError(
                f"response_format has {len(formats)} entries for {n} prompts; give one format for all "
                "rows or one entry (None for unconstrained) per row"
            )
        self._began = True
        self._dispatching.set()
        if n == 0:
            return []
        size = self._chunk_rows(n)
        queue = _chunks(n, size)
        inflight: dict[Any, tuple[Any, Any, _Chunk]] = {}  # ref -> (slot, handle, chunk)
        try:
            while queue or inflight:
                if self._cancel.is_set():
                    break
                while queue:
                    room = fleet.slots_with_room(PIPELINE)  # the least busy live replica first
                    if not room:
                        break
                    slot, chunk = room[0], queue.popleft()
                    chunk_kwargs = dict(kwargs)
                    if per_row:
                        chunk_kwargs["response_format"] = list(formats[chunk.start : chunk.stop])
                    if seed_per_row:
                        chunk_kwargs["seed"] = list(seeds[chunk.start : chunk.stop])
                    ref = slot.handle.run.remote(self.id, method, rows[chunk.start : chunk.stop], chunk_kwargs)
                    slot.inflight += 1
                    inflight[ref] = (slot, slot.handle, chunk)
                starting = fleet.starting_refs()
                if not inflight and not starting and queue and fleet.live:
                    time.sleep(POLL_S)  # every live replica's pipeline is full of other jobs' chunks: wait a turn
                    continue
                if not inflight and not starting:
                    raise WorkerError(
                        f"no replica is left to run the job ({fleet.failure_summary()}); "
                        "shut the pool down and load it again"
                    )
                ready, _ = ray.wait([*inflight, *starting], num_returns=1, timeout=POLL_S)
                self._draw()
                for ref in ready:
                    if ref not in inflight:
                        fleet.finish_start(ref)
                        continue
                    slot, handle, chunk = inflight.pop(ref)
                    slot.inflight -= 1
                    try:
                        status, payload, seconds = ray.get(ref)
                    except RayTaskError:
                        raise
                    except RayError as exc:  # the replica died with the chunk: put it back for the others
                        fleet.replica_died(slot, handle, exc)
                        chunk.attempts += 1
                        if chunk.attempts >= MAX_ATTEMPTS:
                            raise WorkerError(
                                f"rows {chunk.start}..{chunk.stop - 1} were running on a replica that died "
                                f"{chunk.attempts} times ({type(exc).__name__}); one of them probably exhausts a "
                                "replica's memory: run them alone on an engine to see"
                            ) from exc
                        self.rerun_chunks += 1
                        queue.appendleft(chunk)
                        continue
                    if status == "error":
                        error, remote_tb = payload
                        raise _renumbered(error, chunk.start) from WorkerError(f"on replica {slot.index}:\n{remote_tb}")
                    self._store(chunk, payload, slot.index, seconds)
                    if status == "cancelled":
                        self._cancel.set()  # someone cancelled the replica's engine: the job stops as a whole
        except BaseException:
            self._cancel.set()
            fleet.cancel_job(self.id)
            raise
        if self._cancel.is_set():
            fleet.cancel_job(self.id)
            deadline = time.monotonic() + CANCEL_WAIT_S
            while inflight and time.monotonic() < deadline:
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                for ref in ready:
                    slot, _handle, chunk = inflight.pop(ref)
                    slot.inflight -= 1
                    try:
                        status, payload, seconds = ray.get(ref)
                    except RayError:
                        continue
                    if status != "error":
                        self._store(chunk, payload, slot.index, seconds)
            raise self._cancelled_error(n)
        with self._lock:
            results = list(self._rows)
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:  # cannot happen: every chunk either stored its rows or raised
            raise WorkerError(f"rows {missing[:5]} came back empty; this is a workbench bug — please report it")
        return results


def _renumbered(exc: BaseException, start: int) -> BaseException:
    """A replica's error about "row k" of its chunk, renumbered to the row of the whole batch."""
    if start == 0 or not isinstance(exc, (InputError, FormatError, ValueError)):
        return exc
    text = re.sub(r"\brow (\d+)\b", lambda m: f"row {int(m.group(1)) + start}", str(exc))
    try:
        renamed = type(exc)(text)
    except Exception:  # noqa: BLE001  (an exception type with another constructor: keep it as it was)
        return exc
    renamed.__cause__ = exc.__cause__
    return renamed


def _chunks(n: int, size: int) -> deque[_Chunk]:
    return deque(_Chunk(start, min(n, start + size)) for start in range(0, n, size))


def chunk_size(n_rows: int, live: int, max_batch_size: int, chunk_rows: int | None) -> int:
    """Rows per chunk: ``chunk_rows`` if set, else two batches' worth (a replica's slots stay full while the chunk
    runs), smaller when that would leave replicas idle."""
    if chunk_rows is not None:
        return chunk_rows
    return max(1, min(2 * max_batch_size, math.ceil(n_rows / max(1, live))))
