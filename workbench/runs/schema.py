"""The run store's file format: how a file is recognised as a store, its tables, the creation of a new one, the
in-place migration of older ones, and WAL mode.  :class:`~workbench.runs.database.Database` runs
:func:`check_format` on every connection it opens, before any query.

Tables (schema :data:`SCHEMA_VERSION`, recorded in ``meta``; the file is marked with ``PRAGMA
application_id``):

* ``meta(key, value)``: ``schema_version``, ``created_at``, ``created_by`` (workbench version);
* ``runs(id, name UNIQUE, created_at, tags, note, updated_at)``: ``tags`` a JSON list, ``updated_at`` when a
  row or score was last written;
* ``sessions(id, run_id, started_at, ended_at, identity, load, provenance)``: one per process that opened the
  run with a given provenance (engine, settings, versions, host, git commit, times);
* ``rows(id, run_id, session_id, key, match, kind, request, prompt_ids, sampling, seed_drawn, output, timings,
  computed, created_at, item, turn)``, unique on ``(run_id, key)``: ``request`` as given (JSON), ``prompt_ids``
  packed (little-endian uint32, or int64 after a ``q`` byte), ``sampling`` as the row ran (a drawn seed
  included), ``output`` the exact result (:mod:`workbench.runs.codec`), ``computed`` 0 for a row this run took
  from another run's identical key, ``item`` the item it answers (:mod:`workbench.runs.items`), ``turn`` its
  number within a tool-loop item (NULL for a one-row item);
* ``scores(row_id, name, value, kind)``, one per row and name: ``kind`` ``bool`` (value 0/1) or ``number``;
  a row whose output is replaced (``refresh=True``) loses its scores (a trigger);
* ``file_hashes(path, size, mtime_ns, ctime_ns, inode, sha256, hashed_at)``: the checkpoint-hash memo.

Schema 1 files (before items and scores) are migrated in place when first opened for writing: the new columns
and tables are added (``ALTER TABLE``, no row rewritten but for its item), and every row's item is derived from
its stored request (:func:`workbench.runs.items.derive_item`).  A schema 1 file opened read-only raises
:class:`~workbench.errors.StoreError` saying to open it once for writing.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from workbench.errors import StoreError
from workbench.places import STORE_ENV
from workbench.runs.items import derive_item
from workbench.runs.provenance import now_iso, package_version

SCHEMA_VERSION = 2
APPLICATION_ID = 0x57427253  # "WBrS": marks the file as a workbench run store
SQLITE_HEADER = b"SQLite format 3\x00"

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    note TEXT NOT NULL DEFAULT '',
    updated_at REAL
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
    item TEXT,
    turn INTEGER,
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

# What schema 2 adds to a schema 1 file (also the tail of a new file's schema): one statement each.
_V2 = [
    "CREATE INDEX rows_by_item ON rows(run_id, item)",
    "CREATE TABLE scores (row_id INTEGER NOT NULL REFERENCES rows(id) ON DELETE CASCADE, name TEXT NOT NULL, "
    "value REAL NOT NULL, kind TEXT NOT NULL, PRIMARY KEY (row_id, name)) WITHOUT ROWID",
    "CREATE INDEX scores_by_name ON scores(name)",
    "CREATE TRIGGER rows_output_replaced AFTER UPDATE OF output ON rows WHEN old.output IS NOT new.output "
    "BEGIN DELETE FROM scores WHERE row_id = new.id; END",
]
_V1_TO_V2 = [
    "ALTER TABLE runs ADD COLUMN tags TEXT NOT NULL DEFAULT '[]'",
    "ALTER TABLE runs ADD COLUMN note TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE runs ADD COLUMN updated_at REAL",
    "ALTER TABLE rows ADD COLUMN item TEXT",
    "ALTER TABLE rows ADD COLUMN turn INTEGER",
]


def not_a_store(path: Path, what: str) -> StoreError:
    """The error for a file that is something other than a run store (``what`` says what it is)."""
    return StoreError(
        f"{str(path)!r} {what}, so it is not a workbench run store; point {STORE_ENV} at "
        "another file (a new one is created) or move this file away"
    )


def check_header(path: Path) -> None:
    """Refuse a non-empty file that is not an SQLite database, before SQLite opens it."""
    with open(path, "rb") as f:
        header = f.read(len(SQLITE_HEADER))
    if header != SQLITE_HEADER:
        raise not_a_store(path, "is not an SQLite database")


def check_format(conn: sqlite3.Connection, path: Path, *, readonly: bool, busy_timeout_s: float) -> bool:
    """Make a freshly opened connection's file a current store: an empty file is created one (unless
    ``readonly``), a schema 1 file is migrated, and a writable one is put in WAL mode.  Returns whether the
    schema is there to query (False: an empty file opened read-only, nothing stored yet).  Raises StoreError for a
    file that is no store, a newer store, or an old one opened read-only."""
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc) or "malformed" in str(exc):
            raise not_a_store(path, f"cannot be read as a database ({exc})") from None
        raise
    if app_id == 0 and tables == 0:
        if readonly:
            return False  # an empty file: nothing stored yet, nothing to read
        create(conn)
    elif app_id != APPLICATION_ID:
        raise not_a_store(path, "is an SQLite database of another program")
    version = schema_version(conn, path)
    if version < SCHEMA_VERSION:
        if readonly:
            raise StoreError(
                f"the run store {str(path)!r} has store schema {version}, which this workbench "
                f"upgrades to schema {SCHEMA_VERSION} in place (keeping every row); open it once "
                "for writing (wb.runs.store(path)), then read-only"
            )
        migrate(conn, path)
    elif version > SCHEMA_VERSION:
        raise StoreError(
            f"the run store {str(path)!r} was written by a newer workbench (store schema {version}; this "
            f"workbench reads schema {SCHEMA_VERSION} and older); upgrade workbench (pip install -U workbench), "
            f"or point {STORE_ENV} at another file"
        )
    if not readonly:
        ensure_wal(conn, busy_timeout_s)
    return True


def ensure_wal(conn: sqlite3.Connection, busy_timeout_s: float) -> None:
    """WAL mode (persistent in the file once set).  Switching needs a moment alone with the file, so a
    switch that meets another process's lock is retried within the busy timeout."""
    deadline = time.monotonic() + busy_timeout_s
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


def schema_version(conn: sqlite3.Connection, path: Path) -> int:
    """The store schema the file records in ``meta``; StoreError (naming ``path``) when it records none."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None or not str(row[0]).isdigit():
        raise not_a_store(path, "has no schema version")
    return int(row[0])


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Upgrade a schema 1 file to schema 2 in one transaction (see the module docstring): new columns and
    tables, every row's item derived from its stored request, ``updated_at`` from the last row.  Two
    processes may race here: the second finds the file upgraded."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if schema_version(conn, path) == 1:
            for statement in [*_V1_TO_V2, *_V2]:
                conn.execute(statement)
            last = -1
            while True:
                page = conn.execute(
                    "SELECT id, request FROM rows WHERE id > ? ORDER BY id LIMIT 1000", (last,)
                ).fetchall()
                if not page:
                    break
                conn.executemany(
                    "UPDATE rows SET item = ?, turn = ? WHERE id = ?",
                    [(*derive_item(json.loads(request)), row_id) for row_id, request in page],
                )
                last = page[-1][0]
            conn.execute("UPDATE runs SET updated_at = (SELECT max(created_at) FROM rows WHERE run_id = runs.id)")
            conn.execute("UPDATE runs SET updated_at = created_at WHERE updated_at IS NULL")
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('migrated_at', ?)", (now_iso(),))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def create(conn: sqlite3.Connection) -> None:
    """Make an empty file a store (WAL mode follows in :func:`ensure_wal`).  Two processes may race here: the
    second finds the first's tables."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("PRAGMA application_id").fetchone()[0] == 0:
            for statement in [*_SCHEMA.split(";"), *_V2]:
                if statement.strip():
                    conn.execute(statement)
            conn.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?)",
                [
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("created_at", now_iso()),
                    ("created_by", f"workbench {package_version('workbench')}"),
                ],
            )
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
