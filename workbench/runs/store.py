"""The run store: one SQLite file (standard library) holding every finished row of every named run.

Why SQLite in WAL mode: a row is one short transaction (a few tens of microseconds, no fsync per row with
``synchronous=NORMAL``), readers never block the writer, two kernels, a server and a notebook can write one
file at once (writers queue on the busy timeout), and a killed process never leaves a torn file — a
transaction is in the file whole or not at all.  ``synchronous=NORMAL`` keeps every committed row through a
crash or SIGKILL of the process; only a power loss can drop the last rows.

Tables (schema :data:`SCHEMA_VERSION`, recorded in ``meta``; the file is marked with ``PRAGMA
application_id``):

* ``meta(key, value)``: ``schema_version``, ``created_at``, ``created_by`` (workbench version);
* ``runs(id, name UNIQUE, created_at)``;
* ``sessions(id, run_id, started_at, ended_at, identity, load, provenance)``: one per process that opened the
  run with a given provenance (engine, settings, versions, host, git commit, times);
* ``rows(id, run_id, session_id, key, match, kind, request, prompt_ids, sampling, seed_drawn, output, timings,
  computed, created_at)``, unique on ``(run_id, key)``: ``request`` as given (JSON), ``prompt_ids`` packed
  (little-endian uint32, or int64 after a ``q`` byte), ``sampling`` as the row ran (a drawn seed included),
  ``output`` the exact result (:mod:`workbench.runs.codec`), ``computed`` 0 for a row this run took from
  another run's identical key;
* ``file_hashes(path, size, mtime_ns, ctime_ns, inode, sha256, hashed_at)``: the checkpoint-hash memo.

The engine-facing contract (:meth:`Run.lookup`, :meth:`Run.put`): a store that cannot be read or written
(read-only file, full disk, locked past the busy timeout, I/O error) never raises into a call — it warns once
(:class:`~workbench.errors.StoreWarning`), lookups answer nothing and puts return False, so the call computes
and returns all its rows.  Only a file that is not a store, or one a newer workbench wrote, raises
:class:`~workbench.errors.StoreError` (naming the file and the fix) — at open, before any work.
"""

from __future__ import annotations

import atexit
import json
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from workbench.errors import InputError, StoreError, StoreWarning
from workbench.places import STORE_ENV, data_dir
from workbench.reports import BOX, esc, human_bytes
from workbench.runs import codec
from workbench.runs.identity import CheckpointIdentity, FileStat, checkpoint_identity
from workbench.runs.keys import RowKey, RowRequest, pack_ids, request_keys, unpack_ids
from workbench.runs.provenance import Provenance, environment, now_iso, package_version

SCHEMA_VERSION = 1
APPLICATION_ID = 0x57427253  # "WBrS": marks the file as a workbench run store
DEFAULT_NAME = "runs.sqlite"
BUSY_TIMEOUT_S = 30.0
# NORMAL: a committed row survives a crash or kill of the process (WAL); FULL: also a power loss (an fsync per row)
SYNCHRONOUS = ("NORMAL", "FULL")
_SQLITE_HEADER = b"SQLite format 3\x00"
_MAX_VARS = 500  # keys per SELECT ... IN (...)
RUN_NAME_MAX = 200  # characters of a run name

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL
);
CREATE TABLE sessions (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    started_at REAL NOT NULL,
    ended_at REAL,
    identity TEXT NOT NULL,
    load TEXT NOT NULL,
    provenance TEXT NOT NULL
);
CREATE TABLE rows (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    session_id INTEGER REFERENCES sessions(id) ON DELETE SET NULL,
    key TEXT NOT NULL,
    match TEXT NOT NULL,
    kind TEXT NOT NULL,
    request TEXT NOT NULL,
    prompt_ids BLOB NOT NULL,
    sampling TEXT NOT NULL,
    seed_drawn INTEGER NOT NULL DEFAULT 0,
    output TEXT NOT NULL,
    timings TEXT NOT NULL,
    computed INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL,
    UNIQUE (run_id, key)
);
CREATE INDEX rows_by_key ON rows(key);
CREATE INDEX rows_by_match ON rows(run_id, match);
CREATE INDEX sessions_by_run ON sessions(run_id);
CREATE TABLE file_hashes (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    hashed_at REAL NOT NULL
);
"""

_ROW_COLUMNS = ("r.id, r.key, r.match, r.kind, r.request, r.prompt_ids, r.sampling, r.seed_drawn, r.output, "
                "r.timings, r.computed, r.created_at, r.session_id, runs.name")

# Connections a forked child inherited: never used and never closed there (closing would touch the parent's
# WAL state), only kept alive.
_ABANDONED: list[sqlite3.Connection] = []


_STORES: dict[tuple[str, bool], Store] = {}
_STORES_LOCK = threading.Lock()


@atexit.register
def _close_stores() -> None:
    """At exit: record the sessions' end times and checkpoint the WAL into the file."""
    for store in list(_STORES.values()):
        try:
            store.close()
        except Exception:  # an exiting interpreter must not fail on a store it cannot write
            pass


def store_path() -> Path:
    """Where the run store lives: ``$WORKBENCH_STORE`` (a file; a folder gets ``runs.sqlite`` inside), else
    ``runs.sqlite`` in workbench's data folder (:func:`workbench.places.data_dir`: ``$WORKBENCH_DATA_DIR``, by
    default ``~/.local/share/workbench``) — not the cache: stored results are not made again by themselves."""
    named = os.environ.get(STORE_ENV, "").strip()
    if named:
        path = Path(named).expanduser()
        return path / DEFAULT_NAME if path.is_dir() else path
    return data_dir() / DEFAULT_NAME


def open_store(where: str | Path | Store | None = None, *, readonly: bool = False) -> Store:
    """The :class:`Store` of file ``where`` (default :func:`store_path`): one object per file and process,
    opened and checked now (a file that is not a store raises :class:`~workbench.errors.StoreError`)."""
    if isinstance(where, Store):
        return where
    target = Path(where).expanduser() if where is not None else store_path()
    slot = (str(target.absolute()), readonly)
    with _STORES_LOCK:
        found = _STORES.get(slot)
        if found is None:
            found = _STORES[slot] = Store(target, readonly=readonly)
    return found.check()


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=repr)


def check_run_name(name: Any) -> str:
    """A run name: a non-empty string of at most 200 printable characters."""
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"a run name must be a non-empty string, got {name!r}; e.g. run='sweep-bf16'")
    if len(name) > RUN_NAME_MAX or not name.isprintable():
        raise InputError(f"run name {name[:80]!r} must be at most {RUN_NAME_MAX} printable characters")
    return name


def call_keywords(run: str | None, refresh: bool = False) -> dict[str, Any]:
    """The ``run=`` / ``refresh=`` keywords a caller passes on to every engine call it makes (none without a run;
    the name checked now).  ``refresh`` without a run is refused here, before any work, with the fix."""
    if run is None:
        if refresh:
            raise InputError("refresh=True recomputes the rows a run stored; give the run's name too "
                             "(run='name', refresh=True)")
        return {}
    return {"run": check_run_name(run), "refresh": bool(refresh)}


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

    @property
    def seed(self) -> int | None:
        return self.sampling.get("seed")

    def _repr_html_(self) -> str:
        head = (f"<div style='{BOX}'><b>{esc(self.run)}</b> · {esc(self.kind)} · "
                f"{'computed' if self.computed else 'from another run'} · seed {esc(self.seed)} · "
                f"key <code>{esc(self.key[:12])}</code></div>")
        body = self.output._repr_html_() if hasattr(self.output, "_repr_html_") else f"<pre>{esc(self.output)}</pre>"
        return head + body


class Store:
    """One run-store file.  Get it with :func:`workbench.runs.store` (one object per file and process);
    ``readonly`` opens it for reading only, ``synchronous="FULL"`` fsyncs every row (see :data:`SYNCHRONOUS`)."""

    def __init__(self, path: str | Path, *, readonly: bool = False, busy_timeout_s: float = BUSY_TIMEOUT_S,
                 synchronous: str = "NORMAL") -> None:
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
        self._runs: dict[tuple[str, str], Run] = {}
        self._hashes: dict[FileStat, str] = {}  # also in memory: a read-only store must not rehash every call

    # ------------------------------------------------------------------------------------ connection
    def connection(self) -> sqlite3.Connection:
        """The open connection (reopened after a fork).  Raises StoreError for a file that is no store or a
        newer one, sqlite3/OS errors for everything else (the callers decide whether those are faults)."""
        with self._lock:
            if self._conn is not None and self._pid != os.getpid():
                _ABANDONED.append(self._conn)
                self._conn, self._runs = None, {}
            if self._conn is None:
                self._pid = os.getpid()
                self._conn = self._connect()
            return self._conn

    def _connect(self) -> sqlite3.Connection:
        path = self.path
        if path.is_dir():
            raise StoreError(f"the run store {str(path)!r} is a folder; set {STORE_ENV} to a file path (e.g. "
                             f"{str(path / DEFAULT_NAME)!r})")
        if path.exists() and path.stat().st_size > 0:
            with open(path, "rb") as f:
                header = f.read(len(_SQLITE_HEADER))
            if header != _SQLITE_HEADER:
                raise self._not_a_store("is not an SQLite database")
        elif not self.readonly:
            path.parent.mkdir(parents=True, exist_ok=True)
        mode = "ro" if self.readonly else "rwc"
        conn = sqlite3.connect(f"file:{quote(str(path.absolute()))}?mode={mode}", uri=True,
                               timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            self._check_format(conn)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _not_a_store(self, what: str) -> StoreError:
        return StoreError(f"{str(self.path)!r} {what}, so it is not a workbench run store; point {STORE_ENV} at "
                          "another file (a new one is created) or move this file away")

    def _check_format(self, conn: sqlite3.Connection) -> None:
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise self._not_a_store(f"cannot be read as a database ({exc})") from None
            raise
        if app_id == 0 and tables == 0:
            if self.readonly:
                return  # an empty file: nothing stored yet, nothing to read
            self._create(conn)
        elif app_id != APPLICATION_ID:
            raise self._not_a_store("is an SQLite database of another program")
        version = self._schema_version(conn)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the run store {str(self.path)!r} was written by a newer workbench (store schema {version}; this "
                f"workbench reads schema {SCHEMA_VERSION} and older); upgrade workbench (pip install -U workbench), "
                f"or point {STORE_ENV} at another file")
        if not self.readonly:
            self._ensure_wal(conn)
        self._schema_ready = True

    def _ensure_wal(self, conn: sqlite3.Connection) -> None:
        """WAL mode (persistent in the file once set).  Switching needs a moment alone with the file, so a
        switch that meets another process's lock is retried within the busy timeout."""
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                mode = "locked"
            if mode == "wal":
                return
            if time.monotonic() > deadline:
                raise sqlite3.OperationalError(f"could not switch the run store to WAL mode (it stays {mode})")
            time.sleep(0.01)

    def _schema_version(self, conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or not str(row[0]).isdigit():
            raise self._not_a_store("has no schema version")
        return int(row[0])

    def _create(self, conn: sqlite3.Connection) -> None:
        """Make an empty file a store (WAL mode follows in :meth:`_ensure_wal`).  Two processes may race here:
        the second finds the first's tables."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("PRAGMA application_id").fetchone()[0] == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", [
                    ("schema_version", str(SCHEMA_VERSION)), ("created_at", now_iso()),
                    ("created_by", f"workbench {package_version('workbench')}")])
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

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
            consequence = ("results are computed and returned but not stored. Free disk space or make the file "
                           f"writable, or point {STORE_ENV} at another file")
        warnings.warn(f"the run store {str(self.path)!r} could not be {doing} ({type(exc).__name__}: {exc}); "
                      f"{consequence}", StoreWarning, stacklevel=3)

    def check(self) -> Store:
        """Open the file now: raises :class:`~workbench.errors.StoreError` for a file that is no store (or a
        newer one's); other failures warn once and leave the store answering nothing."""
        try:
            self.connection()
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self.fault(exc, "opened")
        return self

    # ------------------------------------------------------------------------------------ runs
    def open_run(self, name: str, provenance: Provenance) -> Run:
        """The run ``name`` (created if new) as written by an engine with ``provenance``: one session row per
        process and provenance (opening it again returns the same :class:`Run`).  Raises only
        :class:`~workbench.errors.StoreError` (not a store) and :class:`~workbench.errors.InputError` (a bad
        name); a store that cannot be written gives a Run that looks up what it can and stores nothing."""
        name = check_run_name(name)
        if not isinstance(provenance, Provenance):
            raise InputError(f"provenance must be a workbench.runs.Provenance, got {type(provenance).__name__}")
        signature = _json(provenance.to_dict())
        with self._lock:
            self.check()
            cached = self._runs.get((name, signature))
            if cached is not None:
                return cached
            run = Run(self, name, provenance)
            run.start()
            self._runs[(name, signature)] = run
            return run

    def run_names(self) -> list[str]:
        return [r[0] for r in self.query("SELECT name FROM runs ORDER BY created_at, id")]

    def summaries(self) -> list[dict[str, Any]]:
        """One dict per run: counts, times and the provenance of its latest session."""
        out = []
        rows = self.query(
            "SELECT runs.id, runs.name, runs.created_at, count(r.id), coalesce(sum(r.computed), 0), "
            "max(r.created_at) FROM runs LEFT JOIN rows r ON r.run_id = runs.id GROUP BY runs.id "
            "ORDER BY runs.created_at, runs.id")
        for run_id, name, created, n_rows, n_computed, last in rows:
            count, latest = self.query("SELECT count(*), max(id) FROM sessions WHERE run_id = ?", (run_id,))[0]
            prov = self._sessions("id = ?", (latest,)).get(latest, {}) if latest is not None else {}
            out.append({"name": name, "rows": n_rows, "computed": n_computed, "sessions": count,
                        "created_at": created, "last_row_at": last, "provenance": prov})
        return out

    def _sessions(self, where: str, params: Sequence[Any] = ()) -> dict[int, dict[str, Any]]:
        found = {}
        for sid, started, ended, prov in self.query(
                f"SELECT id, started_at, ended_at, provenance FROM sessions WHERE {where}", params):
            data = json.loads(prov)
            data["session_started_at"], data["session_ended_at"] = started, ended
            found[sid] = data
        return found

    def _run_id(self, name: str) -> int:
        row = self.query("SELECT id FROM runs WHERE name = ?", (name,))
        if not row:
            known = ", ".join(repr(n) for n in self.run_names()[:20]) or "none yet"
            raise InputError(f"no run named {name!r} in the run store {str(self.path)!r} (runs: {known}); "
                             "wb.runs.table() lists them")
        return row[0][0]

    def sessions(self, name: str) -> dict[int, dict[str, Any]]:
        """The provenance of each session that wrote run ``name``, by session id."""
        return self._sessions("run_id = ?", (self._run_id(name),))

    def rows(self, name: str) -> Iterator[StoredRow]:
        """Every stored row of run ``name`` in the order they were stored, read a page at a time (memory stays
        flat, and no read transaction stays open between pages)."""
        run_id = self._run_id(name)
        provenance = self.sessions(name)
        last = -1
        while True:
            page = self.query(f"SELECT {_ROW_COLUMNS} FROM rows r JOIN runs ON runs.id = r.run_id "
                              "WHERE r.run_id = ? AND r.id > ? ORDER BY r.id LIMIT 256", (run_id, last))
            if not page:
                return
            for record in page:
                row = _stored_row(record)
                row.provenance = provenance.get(row.session, {})
                yield row
            last = page[-1][0]

    def delete(self, name: str) -> int:
        """Delete run ``name``, its sessions and rows; returns the number of rows deleted."""
        run_id = self._run_id(name)

        def statements(conn: sqlite3.Connection) -> int:
            n = conn.execute("SELECT count(*) FROM rows WHERE run_id = ?", (run_id,)).fetchone()[0]
            conn.execute("DELETE FROM rows WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM sessions WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            return n

        try:
            n = self.transaction(statements)
        except sqlite3.Error as exc:
            raise StoreError(f"could not delete run {name!r} from {str(self.path)!r} ({exc}); is the file "
                             "read-only or the disk full?") from exc
        self._runs = {k: v for k, v in self._runs.items() if k[0] != name}
        return n

    # ------------------------------------------------------------------------------------ checkpoint hashes
    def checkpoint_identity(self, folder: str | Path, *, extra_files: Iterable[str | Path] = (),
                            progress: bool | None = None) -> CheckpointIdentity:
        """:func:`~workbench.runs.identity.checkpoint_identity` with this store's memo of file hashes."""
        return checkpoint_identity(folder, lookup=self._known_hash, remember=self._remember_hash,
                                   extra_files=extra_files, progress=progress)

    def _known_hash(self, stat: FileStat) -> str | None:
        if stat in self._hashes:
            return self._hashes[stat]
        try:
            row = self.query("SELECT sha256 FROM file_hashes WHERE path = ? AND size = ? AND mtime_ns = ? AND "
                             "ctime_ns = ? AND inode = ?", (stat.path, stat.size, stat.mtime_ns, stat.ctime_ns,
                                                            stat.inode))
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self.fault(exc, "read", "the checkpoint's files are hashed again (nothing else changes)")
            return None
        return row[0][0] if row else None

    def _remember_hash(self, stat: FileStat, digest: str) -> None:
        self._hashes[stat] = digest
        try:
            self.transaction(lambda conn: conn.execute(
                "INSERT OR REPLACE INTO file_hashes(path, size, mtime_ns, ctime_ns, inode, sha256, hashed_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (stat.path, stat.size, stat.mtime_ns, stat.ctime_ns, stat.inode, digest, time.time())))
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self.fault(exc, "written")

    # ------------------------------------------------------------------------------------ maintenance
    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: ``"ok"`` for an intact file."""
        return "\n".join(str(r[0]) for r in self.query("PRAGMA integrity_check"))

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())

    def close(self) -> None:
        """End this process's sessions and close the connection (it reopens on next use).  In a forked child
        the parent's connection and sessions are left alone."""
        with self._lock:
            if self._conn is not None and self._pid != os.getpid():
                _ABANDONED.append(self._conn)
            elif self._conn is not None:
                for run in list(self._runs.values()):
                    run.close()
                self._conn.close()
            self._conn, self._runs, self._schema_ready = None, {}, False

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    def _repr_html_(self) -> str:
        try:
            runs = self.summaries()
        except (StoreError, sqlite3.Error, OSError) as exc:
            return f"<div style='{BOX}'>run store <code>{esc(self.path)}</code>: {esc(exc)}</div>"
        lines = "".join(f"<tr><td>{esc(r['name'])}</td><td>{r['rows']}</td><td>{r['computed']}</td>"
                        f"<td>{esc(r['provenance'].get('model'))}</td></tr>" for r in runs)
        return (f"<div style='{BOX}'><b>run store</b> <code>{esc(self.path)}</code> · {len(runs)} runs · "
                f"{human_bytes(self.size_bytes())}<table><tr><th>run</th><th>rows</th><th>computed</th>"
                f"<th>model</th></tr>{lines}</table></div>")


def _stored_row(record: Sequence[Any], parsed_type: Any = None) -> StoredRow:
    (row_id, key, match, kind, request, prompt_ids, sampling, seed_drawn, output, timings, computed, created,
     session, run_name) = record
    result = codec.loads(output, parsed_type=parsed_type)
    _mark_cached(result)
    return StoredRow(key=key, match=match, kind=kind, run=run_name, request=json.loads(request),
                     prompt_ids=unpack_ids(prompt_ids), output=result, sampling=json.loads(sampling),
                     seed_drawn=bool(seed_drawn), timings=json.loads(timings), computed=bool(computed),
                     created_at=created, session=session, row_id=row_id)


def _mark_cached(result: Any) -> None:
    if isinstance(result, list) and not hasattr(result, "stop_reason"):
        for item in result:
            _mark_cached(item)
    elif hasattr(result, "cached"):
        result.cached = True


class Run:
    """A named run as one engine (one :class:`~workbench.runs.Provenance`) writes it: build keys, look rows up,
    put finished rows.  Get one from :meth:`Store.open_run`; it is safe to use from several threads."""

    def __init__(self, store: Store, name: str, provenance: Provenance) -> None:
        self.store = store
        self.name = name
        self.provenance = provenance
        self.run_id: int | None = None
        self.session_id: int | None = None
        self.started_at = time.time()

    # ------------------------------------------------------------------------------------ keys
    def keys(self, requests: Sequence[RowRequest]) -> list[RowKey]:
        """The keys of one call's rows on this run's engine (see :func:`workbench.runs.keys.request_keys`)."""
        return request_keys(self.provenance.identity, self.provenance.load, requests)

    def key(self, prompt_ids: Sequence[int], sampling: Mapping[str, Any], *, kind: str = "completion",
            images: Sequence[Any] = (), extra: Mapping[str, Any] | None = None) -> RowKey:
        """The key of one row (a single call; repeats within a call need :meth:`keys`)."""
        return self.keys([RowRequest(prompt_ids, sampling, kind, images, extra)])[0]

    # ------------------------------------------------------------------------------------ session
    def start(self) -> bool:
        """Create the run (if new) and this session's row; False (after the store's one warning) when the
        store cannot be written."""
        prov = {**self.provenance.to_dict(), **environment()}

        def statements(conn: sqlite3.Connection) -> tuple[int, int]:
            conn.execute("INSERT OR IGNORE INTO runs(name, created_at) VALUES (?, ?)", (self.name, time.time()))
            run_id = conn.execute("SELECT id FROM runs WHERE name = ?", (self.name,)).fetchone()[0]
            cursor = conn.execute(
                "INSERT INTO sessions(run_id, started_at, identity, load, provenance) VALUES (?, ?, ?, ?, ?)",
                (run_id, self.started_at, self.provenance.identity, _json(dict(self.provenance.load)), _json(prov)))
            return run_id, cursor.lastrowid

        try:
            self.run_id, self.session_id = self.store.transaction(statements)
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self.store.fault(exc, "written")
            self._find_run_id()
            return False
        return True

    def _find_run_id(self) -> None:
        try:
            row = self.store.query("SELECT id FROM runs WHERE name = ?", (self.name,))
        except (sqlite3.Error, OSError):
            row = []
        self.run_id = row[0][0] if row else None

    def close(self) -> None:
        """Record this session's end time (also safe on a failing store)."""
        if self.session_id is None:
            return
        try:
            self.store.transaction(lambda conn: conn.execute("UPDATE sessions SET ended_at = ? WHERE id = ?",
                                                        (time.time(), self.session_id)))
        except (sqlite3.Error, OSError, StoreError) as exc:
            self.store.fault(exc, "written")

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ lookup / put
    def lookup(self, keys: Iterable[RowKey | str], *, anywhere: bool = True, parsed_type: Any = None
               ) -> dict[str, StoredRow]:
        """The stored rows of ``keys`` (by key string; missing keys are absent).  This run's own row wins;
        with ``anywhere`` a key stored only by another run is answered from there too (an exact key means the
        same numbers) and copied into this run (``computed=False``), so the run holds every row it returned.
        Outputs come back with ``cached=True``; ``parsed_type`` rebuilds pydantic ``parsed`` objects.
        Never raises for a store that cannot be read: the answer is then ``{}`` (after one warning)."""
        wanted = list(dict.fromkeys(str(k) for k in keys))
        if not wanted:
            return {}
        try:
            records = []
            for start in range(0, len(wanted), _MAX_VARS):
                part = wanted[start:start + _MAX_VARS]
                marks = ",".join("?" * len(part))
                scope = "" if anywhere else " AND r.run_id = ?"
                params: list[Any] = [*part] + ([] if anywhere else [self.run_id if self.run_id is not None else -1])
                records += self.store.query(
                    f"SELECT {_ROW_COLUMNS}, r.run_id FROM rows r JOIN runs ON runs.id = r.run_id "
                    f"WHERE r.key IN ({marks}){scope} ORDER BY r.id", params)
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self.store.fault(exc, "read", "every row is computed as if the store held none. Check the file "
                                          f"(wb.runs.path()) or point {STORE_ENV} at another file")
            return {}
        best: dict[str, tuple] = {}
        for record in records:  # ascending ids: a later row of the same key replaces an earlier one
            key, run_id = record[1], record[-1]
            held = best.get(key)
            if held is None or run_id == self.run_id or held[-1] != self.run_id:
                best[key] = record
        found = {}
        for key, record in list(best.items()):
            try:
                found[key] = _stored_row(record[:-1], parsed_type)
            except (ValueError, KeyError, TypeError, InputError) as exc:  # an unreadable row is recomputed
                self.store.fault(exc, "read: a stored row did not decode",
                                 f"row {key[:12]} is computed again and replaced")
                del best[key]
        foreign = [record[0] for record in best.values() if record[-1] != self.run_id]
        if foreign:
            self._adopt(foreign)
        return found

    def _adopt(self, row_ids: list[int]) -> None:
        """Copy other runs' rows into this run (one transaction); a failure only warns."""
        if self.run_id is None or self.session_id is None:
            return

        def statements(conn: sqlite3.Connection) -> None:
            for start in range(0, len(row_ids), _MAX_VARS):
                part = row_ids[start:start + _MAX_VARS]
                conn.execute(
                    "INSERT OR IGNORE INTO rows(run_id, session_id, key, match, kind, request, prompt_ids, sampling, "
                    "seed_drawn, output, timings, computed, created_at) SELECT ?, ?, key, match, kind, request, "
                    "prompt_ids, sampling, seed_drawn, output, timings, 0, ? FROM rows WHERE id IN "
                    f"({','.join('?' * len(part))})", [self.run_id, self.session_id, time.time(), *part])

        try:
            self.store.transaction(statements)
        except (sqlite3.Error, OSError, StoreError) as exc:
            self.store.fault(exc, "written")

    def put(self, key: RowKey, *, request: Any, prompt_ids: Sequence[int], output: Any,
            sampling: Mapping[str, Any] | None = None, seed_drawn: bool = False,
            timings: Mapping[str, Any] | None = None, item: Any = None) -> bool:
        """Store one finished row now (one transaction), replacing this run's row of the same key (what
        ``refresh=True`` needs).  ``request``: the request as given (stored as browsable JSON, lossy for
        callables); ``output``: the result exactly as returned (a Completion, ChatCompletion, Transcript...);
        ``sampling``: the settings it ran with, a drawn seed included (``seed_drawn=True``); ``timings``: JSON
        data about the row's time (``seconds``, wall time from the call's start to the row's finish, shows in
        ``rows()``).

        Contract: **never raises** for a failing store (read-only, full disk, locked, I/O error, an output it
        cannot encode): it warns once per store and returns False, so the caller returns its result anyway.
        Returns True once the row is committed (it survives a kill of the process from then on)."""
        return self.put_many([{"key": key, "request": request, "prompt_ids": prompt_ids, "output": output,
                               "sampling": sampling, "seed_drawn": seed_drawn, "timings": timings, "item": item}])

    def put_many(self, rows: Iterable[Mapping[str, Any]]) -> bool:
        """:meth:`put` of several finished rows in one transaction (each a dict of put's keywords)."""
        try:
            values = [self._values(**row) for row in rows]
        except Exception as exc:  # a value that cannot be encoded must not cost the caller its results
            self.store.fault(exc, "written")
            return False
        if not values:
            return True
        if self.session_id is None and not self._retry_start():
            return False

        def statements(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO rows(run_id, session_id, key, match, kind, request, prompt_ids, sampling, seed_drawn, "
                "output, timings, computed, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?) "
                "ON CONFLICT(run_id, key) DO UPDATE SET session_id = excluded.session_id, match = excluded.match, "
                "kind = excluded.kind, request = excluded.request, prompt_ids = excluded.prompt_ids, "
                "sampling = excluded.sampling, seed_drawn = excluded.seed_drawn, output = excluded.output, "
                "timings = excluded.timings, computed = 1, created_at = excluded.created_at",
                [(self.run_id, self.session_id, *v) for v in values])

        try:
            self.store.transaction(statements)
        except Exception as exc:  # never into the caller: see the contract above
            self.store.fault(exc, "written")
            return False
        return True

    def _retry_start(self) -> bool:
        try:
            self.store.connection()
        except Exception as exc:
            self.store.fault(exc, "opened")
            return False
        return self.start()

    def _values(self, *, key: RowKey, request: Any, prompt_ids: Sequence[int], output: Any,
                sampling: Mapping[str, Any] | None = None, seed_drawn: bool = False,
                timings: Mapping[str, Any] | None = None, item: Any = None) -> tuple:  # item: stored by i41
        if not isinstance(key, RowKey):
            raise InputError(f"put needs the RowKey from Run.keys(), got {type(key).__name__}")
        return (key.key, key.match, key.kind, _json(codec.plain(request)), pack_ids(prompt_ids),
                _json(codec.plain(dict(sampling or {}))), int(bool(seed_drawn)), codec.dumps(output),
                _json(codec.plain(dict(timings or {}))), time.time())

    def __repr__(self) -> str:
        return f"Run({self.name!r}, store={str(self.store.path)!r})"

    def _repr_html_(self) -> str:
        prov = self.provenance
        return (f"<div style='{BOX}'><b>run {esc(self.name)}</b> in <code>{esc(self.store.path)}</code><br>"
                f"model {esc(prov.model)} · checkpoint <code>{esc(prov.identity[:19])}</code> · "
                f"{esc(', '.join(f'{k}={v}' for k, v in prov.load.items()))}</div>")
