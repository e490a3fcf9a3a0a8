"""OpenAI's Batch API over a backend: batch records, their lifecycle, and the thread that runs them.

Lifecycle (OpenAI's statuses): ``validating`` (the input file is read and every line checked; a bad line
becomes an error line, never a failed batch) → ``in_progress`` (chunks of requests answered in engine
batches, each chunk's lines appended to ``done.jsonl`` and the record's ``request_counts`` updated as it
finishes) → ``finalizing`` (the output and error files are written into the file store) → ``completed``.
``cancel`` moves a running batch to ``cancelling`` and, after the chunk in flight, to ``cancelled`` with the
lines answered so far; a batch not done by ``expires_at`` ends ``expired`` the same way (its unanswered lines
in the error file, code ``batch_expired``).  Only a batch whose input file is gone or empty is ``failed``.

Restart: records and ``done.jsonl`` are on disk, so a new process serving the same model finds every
unfinished batch when it starts (and whenever it is idle), re-reads its input, skips the lines already in
``done.jsonl`` and runs the rest; the record counts the resumption and the lines recovered
(``workbench.restarts``: times the batch was resumed, after a restart or an interrupted chunk;
``workbench.recovered``).  A lock file per batch keeps two processes sharing a data
folder from running one batch twice.  The backend's engine calls carry ``run=run_name(batch_id)``, so every row
is in the run store the moment it finishes: the rows of the chunk in flight when a process dies that had
finished come back from the store, and only the rows still running then are computed again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from .errors import BatchAPIError
from .lines import ENDPOINTS, LineError, error_line, iter_lines, output_line, parse_line, read_appended
from .runner import Answer, Backend, Interrupted, Work, prepare, run_chunks, run_name
from .store import BatchRecords, FileStore, default_data_dir, new_id

try:
    import fcntl
except ImportError:  # not on POSIX: one process per data folder, unchecked
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("workbench.batches")
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
WINDOWS = {"24h": 24 * 3600}


class BatchService:
    """The Batch API's state: the file store, the batch records and the runner thread (``start``/``stop``).

    backend: answers requests (see :mod:`.runner`); model: the served model id (a process runs only the
    batches created for its model); data_dir: where files and records live (default
    :func:`~workbench.batches.store.default_data_dir`); poll_s: how often an idle runner looks for batches
    left by another process.
    """

    def __init__(
        self, backend: Backend, *, model: str, data_dir: str | Path | None = None, poll_s: float = 2.0
    ) -> None:
        self.backend = backend
        self.model = model
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.files = FileStore(self.data_dir)
        self.records = BatchRecords(self.data_dir)
        self.poll_s = poll_s
        self._wake = threading.Event()  # set when a batch was created or cancelled, or the service stops
        self._stopping = threading.Event()
        self._edit = threading.Lock()  # record read-modify-write: the API thread (cancel) and the runner
        self._thread: threading.Thread | None = None

    # --------------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="workbench-batches", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the chunk in flight (unfinished batches stay on disk for the next start)."""
        self._stopping.set()
        self._notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _notify(self) -> None:
        self._wake.set()

    # --------------------------------------------------------------------------------------- the API
    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/batches``: check the body, record the batch (``validating``) and wake the runner."""
        file_id = body.get("input_file_id")
        try:
            info = self.files.get(file_id)
        except BatchAPIError:
            info = None
        if info is None:
            raise BatchAPIError(
                "'input_file_id' must name an uploaded file (POST /v1/files, purpose 'batch')", param="input_file_id"
            )
        if info["purpose"] != "batch":
            raise BatchAPIError(
                f"file {file_id} has purpose {info['purpose']!r}; a batch reads a file uploaded with purpose 'batch'",
                param="input_file_id",
            )
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise BatchAPIError(
                f"'endpoint' is {endpoint!r:.60}; this server runs {' or '.join(ENDPOINTS)}", param="endpoint"
            )
        window = body.get("completion_window")
        if window not in WINDOWS:
            raise BatchAPIError(
                f"'completion_window' is {window!r:.20}; the only window is '24h'", param="completion_window"
            )
        metadata = body.get("metadata")
        if metadata is not None and (
            not isinstance(metadata, dict)
            or len(metadata) > 16
            or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                for k, v in metadata.items()
            )
        ):
            raise BatchAPIError(
                "'metadata' must be an object of at most 16 string values (keys up to 64 characters, values up to 512)",
                param="metadata",
            )
        now = int(time.time())
        batch_id = new_id("batch")
        record = {
            "id": batch_id,
            "object": "batch",
            "endpoint": endpoint,
            "errors": None,
            "input_file_id": file_id,
            "completion_window": window,
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + WINDOWS[window],
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata,
            "workbench": {
                "model": self.model,
                "run": run_name(batch_id),
                "restarts": 0,
                "recovered": 0,
                "computed": 0,
                "started": False,
            },
        }
        self.records.save(record)
        self._notify()
        return record

    def get(self, batch_id: Any) -> dict[str, Any]:
        return self.records.load(batch_id)

    def list(self, *, after: str | None = None, limit: int = 20) -> tuple[list[dict[str, Any]], bool]:
        """Batch records, newest first, after the id ``after``; and whether more remain."""
        records = self.records.all()[::-1]
        if after is not None:
            ids = [r["id"] for r in records]
            records = records[ids.index(after) + 1 :] if after in ids else []
        return records[:limit], len(records) > limit

    def cancel(self, batch_id: Any) -> dict[str, Any]:
        """``POST /v1/batches/{id}/cancel``: ``cancelling`` now, ``cancelled`` after the chunk in flight."""
        with self._edit:
            record = self.records.load(batch_id)
            if record["status"] in ("cancelling", "cancelled"):
                return record
            if record["status"] not in ("validating", "in_progress"):
                raise BatchAPIError(
                    f"batch {record['id']} is {record['status']}; only a validating or in_progress "
                    "batch can be cancelled",
                    status=409,
                    param="batch_id",
                    code="batch_not_cancellable",
                )
            record.update(status="cancelling", cancelling_at=int(time.time()))
            self.records.save(record)
        self._notify()
        return record

    # --------------------------------------------------------------------------------------- the runner
    def _loop(self) -> None:
        while not self._stopping.is_set():
            claimed = self._claim()
            if claimed is None:
                self._wake.wait(self.poll_s)  # a set() since the scan returns at once: no wake-up is lost
                self._wake.clear()
                continue
            batch_id, lock = claimed
            try:
                self._process(batch_id)
            except Interrupted:
                if not self._stopping.is_set():  # the engine is unavailable: try again a little later
                    self._stopping.wait(self.poll_s)
            except Exception:  # noqa: BLE001 - the runner must outlive any one batch
                log.exception("batch %s: unexpected error; it stays in progress and is retried", batch_id)
                self._stopping.wait(self.poll_s)
            finally:
                _unlock(lock)

    def _claim(self) -> tuple[str, Any] | None:
        """The oldest unfinished batch of this model that no other process holds (its lock held)."""
        for record in self.records.all():
            if record["status"] not in ACTIVE or record.get("workbench", {}).get("model") != self.model:
                continue
            lock = _lock(self.records.work_dir(record["id"]) / "lock")
            if lock is not False:
                return record["id"], lock
        return None

    def _update(self, batch_id: str, **changes: Any) -> dict[str, Any]:
        with self._edit:
            record = self.records.load(batch_id)
            extra = changes.pop("workbench", None)
            if record["status"] == "cancelling" and changes.get("status") in ("in_progress", "finalizing"):
                changes.pop("status")  # a cancel arrived meanwhile: it wins
            record.update(changes)
            if extra:
                record["workbench"].update(extra)
            self.records.save(record)
            return record

    def _process(self, batch_id: str) -> None:
        record = self.records.load(batch_id)
        done_path = self.records.work_dir(batch_id) / "done.jsonl"
        if record["status"] in ("validating", "in_progress"):
            try:
                works, refused, total = self._read_input(record)
            except BatchAPIError as exc:
                self._fail(batch_id, exc.code or "invalid_file", exc.message)
                return
            done = read_done(done_path)
            state = record["workbench"]
            extra: dict[str, Any] = {"started": True}
            if state.get("started"):
                extra.update(restarts=state["restarts"] + 1, recovered=len(done))
            now = int(time.time())
            ok = sum(1 for entry in done.values() if entry["ok"])  # the counts of what is on disk (a kill may have
            counts = {"total": total, "completed": ok, "failed": len(done) - ok}  # come between line and record)
            record = self._update(
                batch_id,
                status="in_progress",
                in_progress_at=record["in_progress_at"] or now,
                request_counts=counts,
                workbench=extra,
            )
            fresh = [(line, custom_id, answer) for line, custom_id, answer in refused if line not in done]
            self._append(batch_id, done_path, [(line, cid, ans, False) for line, cid, ans in fresh])
            works = [w for w in works if w.request.line not in done]
            finished = run_chunks(
                self.backend,
                works,
                run=record["workbench"]["run"],
                emit=lambda pairs: self._append(
                    batch_id, done_path, [(w.request.line, w.request.custom_id, a, True) for w, a in pairs]
                ),
                stop=lambda: self._stopping.is_set() or self._ending(batch_id) is not None,
            )
            if not finished and self._ending(batch_id) is None:
                return  # stopping: the rest runs after the next start
        self._finalize(batch_id, done_path)

    def _read_input(self, record: dict[str, Any]) -> tuple[list[Work], list[tuple[int, str | None, Any]], int]:
        """The input's requests (prepared), the refused lines (line, custom_id, answer or error line), and the
        count of lines."""
        try:
            path = self.files.path(record["input_file_id"])
        except BatchAPIError:
            raise BatchAPIError(
                f"the input file {record['input_file_id']} was deleted before the batch ran", code="file_not_found"
            ) from None
        works: list[Work] = []
        refused: list[tuple[int, str | None, Any]] = []
        seen: set[str] = set()
        total = 0
        for number, text in iter_lines(path):
            total += 1
            try:
                request = parse_line(text, number, record["endpoint"])
            except LineError as exc:
                refused.append((number, exc.custom_id, error_line(exc.custom_id, exc.code, exc.message)))
                continue
            if request.custom_id in seen:
                message = f"line {number}: custom_id {request.custom_id!r:.80} was used by an earlier line"
                refused.append(
                    (number, request.custom_id, error_line(request.custom_id, "duplicate_custom_id", message))
                )
                continue
            seen.add(request.custom_id)
            work = prepare(self.backend, request)
            if isinstance(work, Answer):
                refused.append((number, request.custom_id, work))
            else:
                works.append(work)
        if total == 0:
            raise BatchAPIError(f"the input file {record['input_file_id']} has no requests", code="empty_file")
        return works, refused, total

    def _append(self, batch_id: str, done_path: Path, entries: list[tuple[int, str | None, Any, bool]]) -> None:
        """Write answered lines to ``done.jsonl`` (flushed to disk), then count them in the record."""
        if not entries:
            return
        ok = failed = 0
        with open(done_path, "a", encoding="utf-8") as f:
            for line, custom_id, answer, _computed in entries:
                if isinstance(answer, Answer):
                    entry = {
                        "line": line,
                        "ok": answer.ok,
                        "out": output_line(custom_id or "", answer.status, answer.body),
                    }
                else:
                    entry = {"line": line, "ok": False, "out": answer}
                ok += entry["ok"]
                failed += not entry["ok"]
                f.write(json.dumps(entry, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        computed = sum(1 for e in entries if e[3])
        with self._edit:
            record = self.records.load(batch_id)
            counts = record["request_counts"]
            counts.update(completed=counts["completed"] + ok, failed=counts["failed"] + failed)
            record["workbench"]["computed"] += computed
            self.records.save(record)

    def _ending(self, batch_id: str) -> str | None:
        """``cancelled`` or ``expired`` when the batch must stop now, else None."""
        record = self.records.load(batch_id)
        if record["status"] == "cancelling":
            return "cancelled"
        if time.time() > record["expires_at"]:
            return "expired"
        return None

    def _finalize(self, batch_id: str, done_path: Path) -> None:
        """Write the output and error files from ``done.jsonl`` and end the batch."""
        record = self.records.load(batch_id)
        done = read_done(done_path)
        unanswered = self._unanswered(record, done)
        if record["status"] == "cancelling":
            ending = "cancelled"
        elif unanswered and time.time() > record["expires_at"]:
            ending = "expired"
        else:
            ending = "completed"
            record = self._update(
                batch_id, status="finalizing", finalizing_at=record["finalizing_at"] or int(time.time())
            )
        outputs = [done[line] for line in sorted(done)]
        if ending == "expired":
            outputs += unanswered
        files: dict[str, str | None] = {}
        for kind, ok in (("output", True), ("error", False)):
            lines = [entry["out"] for entry in outputs if entry["ok"] is ok]
            if not lines:
                files[kind] = None
                continue
            tmp = self.records.work_dir(batch_id) / f"{kind}.jsonl"
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
                f.flush()
                os.fsync(f.fileno())
            file_id = "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]  # the same on a rerun
            files[kind] = self.files.adopt(
                tmp, filename=f"{batch_id}_{kind}.jsonl", purpose="batch_output", file_id=file_id
            )["id"]
        now = int(time.time())
        self._update(
            batch_id,
            status=ending,
            output_file_id=files["output"],
            error_file_id=files["error"],
            **{f"{ending}_at": now},
        )

    def _unanswered(self, record: dict[str, Any], done: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
        """Error lines (``batch_expired``) for the input lines not in ``done``."""
        out: list[dict[str, Any]] = []
        try:
            lines = list(iter_lines(self.files.path(record["input_file_id"])))
        except BatchAPIError:
            return out
        for number, text in lines:
            if number not in done:
                try:
                    custom_id: str | None = parse_line(text, number, record["endpoint"]).custom_id
                except LineError as exc:
                    custom_id = exc.custom_id
                out.append(
                    {
                        "line": number,
                        "ok": False,
                        "out": error_line(custom_id, "batch_expired", "the batch expired before this request ran"),
                    }
                )
        return out

    def _fail(self, batch_id: str, code: str, message: str) -> None:
        errors = {
            "object": "list",
            "data": [{"code": code, "message": message, "param": "input_file_id", "line": None}],
        }
        self._update(batch_id, status="failed", failed_at=int(time.time()), errors=errors)


def read_done(path: Path) -> dict[int, dict[str, Any]]:
    """The answered lines of a batch by line number; a torn last line (a killed write) is cut off."""
    return {int(entry["line"]): entry for entry in read_appended(path)}


def _lock(path: Path) -> Any:
    """An exclusive lock on ``path`` (the open file; False when another process holds it)."""
    handle = open(path, "a+")  # noqa: SIM115 - held open while the batch runs
    if fcntl is None:
        return handle
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    return handle


def _unlock(handle: Any) -> None:
    if handle:
        handle.close()  # closing releases the flock
