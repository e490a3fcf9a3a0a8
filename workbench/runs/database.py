"""The run store's file: one SQLite database (standard library, WAL mode), its connection, transactions, faults,
and the queries that read runs, rows and scores.  Its format (tables, the creation of a new file, the migration of
older ones) is :mod:`workbench.runs.schema`'s; :mod:`workbench.runs.store` builds the engine-facing
:class:`~workbench.runs.store.Run` on top of it.

Why SQLite in WAL mode: a row is one short transaction (a few tens of microseconds, no fsync per row with
``synchronous=NORMAL``), readers never block the writer, two kernels, a server and a notebook can write one
file at once (writers queue on the busy timeout), and a killed process never leaves a torn file — a
transaction is in the file whole or not at all.  ``synchronous=NORMAL`` keeps every committed row through a
crash or SIGKILL of the process; only a power loss can drop the last rows.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from workbench.errors import InputError, StoreError, StoreWarning
from workbench.places import STORE_ENV
from workbench.reports import BOX, esc, human_bytes
from workbench.runs import codec, schema
from workbench.runs.identity import CheckpointIdentity, FileStat, checkpoint_identity
from workbench.runs.keys import unpack_ids

DEFAULT_NAME = "runs.sqlite"
BUSY_TIMEOUT_S = 30.0
# NORMAL: a committed row survives a crash or kill of the process (WAL); FULL: also a power loss (an fsync per row)
SYNCHRONOUS = ("NORMAL", "FULL")
MAX_VARS = 500  # keys per SELECT ... IN (...)
RUN_NAME_MAX = 200  # characters of a run name
SCORE_KINDS = ("bool", "number")

ROW_COLUMNS = (
    "r.id, r.key, r.match, r.kind, r.request, r.prompt_ids, r.sampling, r.seed_drawn, r.output, "
    "r.timings, r.computed, r.created_at, r.session_id, runs.name, r.item, r.turn"
)

# Connections a forked child inherited: never used and never closed there (closing would touch the parent's
# WAL state), only kept alive.
_ABANDONED: list[sqlite3.Connection] = []


def to_json(value: Any) -> str:
    """Compact JSON text of plain data (what the store's JSON columns hold)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=repr)


def check_run_name(name: Any) -> str:
    """A run name: a non-empty string of at most 200 printable characters."""
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"a run name must be a non-empty string, got {name!r}; e.g. run='sweep-bf16'")
    if len(name) > RUN_NAME_MAX or not name.isprintable():
        raise InputError(f"run name {name[:80]!r} must be at most {RUN_NAME_MAX} printable characters")
    return name


@dataclass
class StoredRow:
    """One stored result: ``output`` is the decoded result (``cached=True``: it comes from the store),
    ``request`` the request as given (JSON data), ``sampling`` the settings it ran with (its seed, drawn or
    given: ``seed_drawn``), ``computed`` False when this run took it from another run's identical key."""

    key: str
    match: str
    kind: str
    run: str
    request: Any
    prompt_ids: list[int]
    output: Any
    sampling: dict[str, Any]
    seed_drawn: bool
    timings: dict[str, Any]
    computed: bool
    created_at: float
    session: int | None = None
    provenance: dict[str, Any] = field(default_factory=dict, repr=False)
    row_id: int = 0
    item: str | None = None
    turn: int | None = None
    scores: dict[str, Any] = field(default_factory=dict)

    @property
    def seed(self) -> int | None:
        return self.sampling.get("seed")

    def _repr_html_(self) -> str:
        head = (
            f"<div style='{BOX}'><b>{esc(self.run)}</b> · {esc(self.kind)} · "
            f"{'computed' if self.computed else 'from another run'} · seed {esc(self.seed)} · "
            f"key <code>{esc(self.key[:12])}</code></div>"
        )
        body = self.output._repr_html_() if hasattr(self.output, "_repr_html_") else f"<pre>{esc(self.output)}</pre>"
        return head + body


def stored_row(record: Sequence[Any], parsed_type: Any = None) -> StoredRow:
    """A :class:`StoredRow` of one record of :data:`ROW_COLUMNS` (its output decoded, marked ``cached``)."""
    (
        row_id,
        key,
        match,
        kind,
        request,
        prompt_ids,
        sampling,
        seed_drawn,
        output,
        timings,
        computed,
        created,
        session,
        run_name,
        item,
        turn,
    ) = record[:16]
    result = codec.loads(output, parsed_type=parsed_type)
    mark_cached(result)
    return StoredRow(
        key=key,
        match=match,
        kind=kind,
        run=run_name,
        request=json.loads(request),
        prompt_ids=unpack_ids(prompt_ids),
        output=result,
        sampling=json.loads(sampling),
        seed_drawn=bool(seed_drawn),
        timings=json.loads(timings),
        computed=bool(computed),
        created_at=created,
        session=session,
        row_id=row_id,
        item=item,
        turn=turn,
    )


def mark_cached(result: Any) -> None:
    """Mark a result (or a list of them) as coming from the store."""
    if isinstance(result, list) and not hasattr(result, "stop_reason"):
        for item in result:
            mark_cached(item)
    elif hasattr(result, "cached"):
        result.cached = True


class Database:
    """One run-store file: the connection (its format checked, created or migrated by :mod:`.schema` as it
    opens), transactions, faults and the reading queries.  :class:`workbench.runs.store.Store` adds the runs
    engines write through."""

    def __init__(
        self,
        path: str | Path,
        *,
        readonly: bool = False,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
        synchronous: str = "NORMAL",
    ) -> None:
        if synchronous not in SYNCHRONOUS:
            raise InputError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}, got {synchronous!r}")
        self.path = Path(path).expanduser()
        self.readonly = readonly
        self.busy_timeout_s = busy_timeout_s
        self.synchronous = synchronous
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._schema_ready = False
        self._warned = False
        self._hashes: dict[FileStat, str] = {}  # also in memory: a read-only store must not rehash every call

    def forget_runs(self, name: str | None = None) -> None:
        """Drop what this object keeps per open run (``name``'s, or all: a forked child starts afresh);
        :class:`Store` keeps some."""

    def end_sessions(self) -> None:
        """Record the end of this process's sessions (before the connection closes); :class:`Store` has some."""

    # ------------------------------------------------------------------------------------ connection
    def connection(self) -> sqlite3.Connection:
        """The open connection (reopened after a fork).  Raises StoreError for a file that is no store or a
        newer one, sqlite3/OS errors for everything else (the callers decide whether those are faults)."""
        with self._lock:
            if self._conn is not None and self._pid != os.getpid():
                _ABANDONED.append(self._conn)
                self._conn = None
                self.forget_runs()
            if self._conn is None:
                self._pid = os.getpid()
                self._conn = self._connect()
            return self._conn

    def _connect(self) -> sqlite3.Connection:
        path = self.path
        if path.is_dir():
            raise StoreError(
                f"the run store {str(path)!r} is a folder; set {STORE_ENV} to a file path (e.g. "
                f"{str(path / DEFAULT_NAME)!r})"
            )
        if path.exists() and path.stat().st_size > 0:
            schema.check_header(path)
        elif not self.readonly:
            path.parent.mkdir(parents=True, exist_ok=True)
        mode = "ro" if self.readonly else "rwc"
        conn = sqlite3.connect(
            f"file:{quote(str(path.absolute()))}?mode={mode}",
            uri=True,
            timeout=self.busy_timeout_s,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            if schema.check_format(conn, path, readonly=self.readonly, busy_timeout_s=self.busy_timeout_s):
                self._schema_ready = True
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        except BaseException:
            conn.close()
            raise
        return conn

    def transaction(self, statements: Any) -> Any:
        """Run ``statements(conn)`` in one IMMEDIATE transaction (a writer takes its lock up front, so two
        writers queue on the busy timeout instead of failing to upgrade a read lock)."""
        with self._lock:
            conn = self.connection()
            if self.readonly:
                raise sqlite3.OperationalError("attempt to write a readonly database (opened readonly)")
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = statements(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            self._warned = False  # the store works (again): the next failure is news worth a warning
            return result

    def query(self, query: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            conn = self.connection()
            if not self._schema_ready:
                return []
            return conn.execute(query, params).fetchall()

    def fault(self, exc: BaseException, doing: str, consequence: str | None = None) -> None:
        """Warn that the store cannot be used (``doing``: what failed; ``consequence``: what happens instead and
        the fix, by default those of a failed write) once per failure episode (a successful write ends one), so
        a read-only file or a full disk warns once, not once per row."""
        if self._warned:
            return
        self._warned = True
        if consequence is None:
            consequence = (
                "results are computed and returned but not stored. Free disk space or make the file "
                f"writable, or point {STORE_ENV} at another file"
            )
        warnings.warn(
            f"the run store {str(self.path)!r} could not be {doing} ({type(exc).__name__}: {exc}); {consequence}",
            StoreWarning,
            stacklevel=3,
        )

    def check(self) -> Any:
        """Open the file now: raises :class:`~workbench.errors.StoreError` for a file that is no store (or a
        newer one's); other failures warn once and leave the store answering nothing."""
        try:
            self.connection()
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self.fault(exc, "opened")
        return self

    # ------------------------------------------------------------------------------------ reading
    def run_names(self) -> list[str]:
        return [r[0] for r in self.query("SELECT name FROM runs ORDER BY created_at, id")]

    def summaries(self) -> list[dict[str, Any]]:
        """One dict per run: counts (rows, computed, items), times (created, last row, last written), tags,
        note, score names, the bytes its rows take (payload, not pages) and its latest session's provenance."""
        out = []
        rows = self.query(
            "SELECT runs.id, runs.name, runs.created_at, count(r.id), coalesce(sum(r.computed), 0), "
            "max(r.created_at), count(DISTINCT r.item), runs.tags, runs.note, runs.updated_at, "
            "coalesce(sum(length(r.request) + length(r.output) + length(r.prompt_ids) + length(r.sampling)), 0) "
            "FROM runs LEFT JOIN rows r ON r.run_id = runs.id GROUP BY runs.id ORDER BY runs.created_at, runs.id"
        )
        for run_id, name, created, n_rows, n_computed, last, n_items, tags, note, updated, size in rows:
            count, latest = self.query("SELECT count(*), max(id) FROM sessions WHERE run_id = ?", (run_id,))[0]
            prov = self._sessions("id = ?", (latest,)).get(latest, {}) if latest is not None else {}
            names = [
                n
                for (n,) in self.query(
                    "SELECT DISTINCT s.name FROM scores s JOIN rows r ON r.id = s.row_id "
                    "WHERE r.run_id = ? ORDER BY s.name",
                    (run_id,),
                )
            ]
            out.append(
                {
                    "name": name,
                    "rows": n_rows,
                    "computed": n_computed,
                    "sessions": count,
                    "created_at": created,
                    "last_row_at": last,
                    "provenance": prov,
                    "items": n_items,
                    "tags": json.loads(tags),
                    "note": note,
                    "updated_at": updated or last or created,
                    "scores": names,
                    "bytes": size,
                }
            )
        return out

    def _sessions(self, where: str, params: Sequence[Any] = ()) -> dict[int, dict[str, Any]]:
        found = {}
        for sid, started, ended, prov in self.query(
            f"SELECT id, started_at, ended_at, provenance FROM sessions WHERE {where}", params
        ):
            data = json.loads(prov)
            data["session_started_at"], data["session_ended_at"] = started, ended
            found[sid] = data
        return found

    def run_id(self, name: str) -> int:
        """The id of run ``name``; an unknown name raises InputError listing the runs."""
        row = self.query("SELECT id FROM runs WHERE name = ?", (name,))
        if not row:
            known = ", ".join(repr(n) for n in self.run_names()[:20]) or "none yet"
            raise InputError(
                f"no run named {name!r} in the run store {str(self.path)!r} (runs: {known}); wb.runs.table() lists them"
            )
        return row[0][0]

    def sessions(self, name: str) -> dict[int, dict[str, Any]]:
        """The provenance of each session that wrote run ``name``, by session id."""
        return self._sessions("run_id = ?", (self.run_id(name),))

    def rows(self, name: str) -> Iterator[StoredRow]:
        """Every stored row of run ``name`` in the order they were stored, read a page at a time (memory stays
        flat, and no read transaction stays open between pages)."""
        run_id = self.run_id(name)
        provenance = self.sessions(name)
        scores = self.scores_of(run_id)
        last = -1
        while True:
            page = self.query(
                f"SELECT {ROW_COLUMNS} FROM rows r JOIN runs ON runs.id = r.run_id "
                "WHERE r.run_id = ? AND r.id > ? ORDER BY r.id LIMIT 256",
                (run_id, last),
            )
            if not page:
                return
            for record in page:
                row = stored_row(record)
                row.provenance = provenance.get(row.session, {})
                row.scores = scores.get(row.row_id, {})
                yield row
            last = page[-1][0]

    def scores_of(self, run_id: int) -> dict[int, dict[str, bool | float]]:
        """Every score of a run's rows: ``{row_id: {name: value}}`` (a ``bool`` score as True/False)."""
        out: dict[int, dict[str, bool | float]] = {}
        for row_id, name, value, kind in self.query(
            "SELECT s.row_id, s.name, s.value, s.kind FROM scores s JOIN rows r ON r.id = s.row_id WHERE r.run_id = ?",
            (run_id,),
        ):
            out.setdefault(row_id, {})[name] = bool(value) if kind == "bool" else value
        return out

    def delete(self, name: str) -> int:
        """Delete run ``name``, its sessions and rows; returns the number of rows deleted."""
        run_id = self.run_id(name)

        def statements(conn: sqlite3.Connection) -> int:
            n = conn.execute("SELECT count(*) FROM rows WHERE run_id = ?", (run_id,)).fetchone()[0]
            conn.execute("DELETE FROM rows WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM sessions WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            return n

        try:
            n = self.transaction(statements)
        except sqlite3.Error as exc:
            raise StoreError(
                f"could not delete run {name!r} from {str(self.path)!r} ({exc}); is the file "
                "read-only or the disk full?"
            ) from exc
        self.forget_runs(name)
        return n

    # ------------------------------------------------------------------------------------ checkpoint hashes
    def checkpoint_identity(
        self, folder: str | Path, *, extra_files: Iterable[str | Path] = (), progress: bool | None = None
    ) -> CheckpointIdentity:
        """:func:`~workbench.runs.identity.checkpoint_identity` with this store's memo of file hashes."""
        return checkpoint_identity(
            folder, lookup=self._known_hash, remember=self._remember_hash, extra_files=extra_files, progress=progress
        )

    def _known_hash(self, stat: FileStat) -> str | None:
        if stat in self._hashes:
            return self._hashes[stat]
        try:
            row = self.query(
                "SELECT sha256 FROM file_hashes WHERE path = ? AND size = ? AND mtime_ns = ? AND "
                "ctime_ns = ? AND inode = ?",
                (stat.path, stat.size, stat.mtime_ns, stat.ctime_ns, stat.inode),
            )
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self.fault(exc, "read", "the checkpoint's files are hashed again (nothing else changes)")
            return None
        return row[0][0] if row else None

    def _remember_hash(self, stat: FileStat, digest: str) -> None:
        self._hashes[stat] = digest
        try:
            self.transaction(
                lambda conn: conn.execute(
                    "INSERT OR REPLACE INTO file_hashes(path, size, mtime_ns, ctime_ns, inode, sha256, hashed_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (stat.path, stat.size, stat.mtime_ns, stat.ctime_ns, stat.inode, digest, time.time()),
                )
            )
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self.fault(exc, "written")

    # ------------------------------------------------------------------------------------ maintenance
    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: ``"ok"`` for an intact file."""
        return "\n".join(str(r[0]) for r in self.query("PRAGMA integrity_check"))

    def vacuum(self) -> None:
        """Checkpoint the WAL into the file and rewrite it without the free pages (SQLite's ``VACUUM``)."""
        with self._lock:
            conn = self.connection()
            for statement in ("PRAGMA wal_checkpoint(TRUNCATE)", "VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)"):
                conn.execute(statement)

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())

    def close(self) -> None:
        """End this process's sessions and close the connection (it reopens on next use).  In a forked child
        the parent's connection and sessions are left alone."""
        with self._lock:
            if self._conn is not None and self._pid != os.getpid():
                _ABANDONED.append(self._conn)
            elif self._conn is not None:
                self.end_sessions()
                self._conn.close()
            self._conn, self._schema_ready = None, False
            self.forget_runs()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    def _repr_html_(self) -> str:
        try:
            runs = self.summaries()
        except (StoreError, sqlite3.Error, OSError) as exc:
            return f"<div style='{BOX}'>run store <code>{esc(self.path)}</code>: {esc(exc)}</div>"
        lines = "".join(
            f"<tr><td>{esc(r['name'])}</td><td>{r['rows']}</td><td>{r['computed']}</td>"
            f"<td>{esc(r['provenance'].get('model'))}</td></tr>"
            for r in runs
        )
        return (
            f"<div style='{BOX}'><b>run store</b> <code>{esc(self.path)}</code> · {len(runs)} runs · "
            f"{human_bytes(self.size_bytes())}<table><tr><th>run</th><th>rows</th><th>computed</th>"
            f"<th>model</th></tr>{lines}</table></div>"
        )
