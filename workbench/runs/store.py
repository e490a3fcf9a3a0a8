"""The run store: one SQLite file (:mod:`workbench.runs.database`: connection, faults, queries;
:mod:`workbench.runs.schema`: tables, migrations) holding every finished row of every named run, and the
:class:`Run` an engine writes through.

The engine-facing contract (:meth:`Run.lookup`, :meth:`Run.put`): a store that cannot be read or written
(read-only file, full disk, locked past the busy timeout, I/O error) never raises into a call — it warns once
(:class:`~workbench.errors.StoreWarning`), lookups answer nothing and puts return False, so the call computes
and returns all its rows.  Only a file that is not a store, or one a newer workbench wrote, raises
:class:`~workbench.errors.StoreError` (naming the file and the fix) — at open, before any work.

Every row names the item it answers (:mod:`workbench.runs.items`): ``put(..., item=)`` when the caller knows it
(a case id), else derived from the request it stores (the input without the settings; a tool loop's request
carries its item and turn).
"""

from __future__ import annotations

import atexit
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.errors import InputError, StoreError
from workbench.places import STORE_ENV, data_dir
from workbench.reports import BOX, esc
from workbench.runs import codec
from workbench.runs.database import (
    BUSY_TIMEOUT_S,
    DEFAULT_NAME,
    MAX_VARS,
    ROW_COLUMNS,
    RUN_NAME_MAX,
    Database,
    StoredRow,
    check_run_name,
    stored_row,
    to_json,
)
from workbench.runs.items import check_item, derive_item
from workbench.runs.keys import RowKey, RowRequest, pack_ids, request_keys
from workbench.runs.provenance import Provenance, environment
from workbench.runs.schema import SCHEMA_VERSION

__all__ = [
    "RUN_NAME_MAX",
    "SCHEMA_VERSION",
    "STORE_ENV",
    "Run",
    "Store",
    "StoredRow",
    "call_keywords",
    "check_run_name",
    "open_store",
    "store_path",
]

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


def call_keywords(run: str | None, refresh: bool = False) -> dict[str, Any]:
    """The ``run=`` / ``refresh=`` keywords a caller passes on to every engine call it makes (none without a run;
    the name checked now).  ``refresh`` without a run is refused here, before any work, with the fix."""
    if run is None:
        if refresh:
            raise InputError(
                "refresh=True recomputes the rows a run stored; give the run's name too (run='name', refresh=True)"
            )
        return {}
    return {"run": check_run_name(run), "refresh": bool(refresh)}


class Store(Database):
    """One run-store file.  Get it with :func:`workbench.runs.store` (one object per file and process);
    ``readonly`` opens it for reading only, ``synchronous="FULL"`` fsyncs every row (see
    :data:`~workbench.runs.database.SYNCHRONOUS`)."""

    def __init__(
        self,
        path: str | Path,
        *,
        readonly: bool = False,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
        synchronous: str = "NORMAL",
    ) -> None:
        super().__init__(path, readonly=readonly, busy_timeout_s=busy_timeout_s, synchronous=synchronous)
        self._runs: dict[tuple[str, str], Run] = {}

    def forget_runs(self, name: str | None = None) -> None:
        self._runs = {k: v for k, v in self._runs.items() if name is not None and k[0] != name}

    def end_sessions(self) -> None:
        for run in list(self._runs.values()):
            run.close()

    def open_run(self, name: str, provenance: Provenance) -> Run:
        """The run ``name`` (created if new) as written by an engine with ``provenance``: one session row per
        process and provenance (opening it again returns the same :class:`Run`).  Raises only
        :class:`~workbench.errors.StoreError` (not a store) and :class:`~workbench.errors.InputError` (a bad
        name); a store that cannot be written gives a Run that looks up what it can and stores nothing."""
        name = check_run_name(name)
        if not isinstance(provenance, Provenance):
            raise InputError(f"provenance must be a workbench.runs.Provenance, got {type(provenance).__name__}")
        signature = to_json(provenance.to_dict())
        with self._lock:
            self.check()
            cached = self._runs.get((name, signature))
            if cached is not None:
                return cached
            run = Run(self, name, provenance)
            run.start()
            self._runs[(name, signature)] = run
            return run


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

    def key(
        self,
        prompt_ids: Sequence[int],
        sampling: Mapping[str, Any],
        *,
        kind: str = "completion",
        images: Sequence[Any] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> RowKey:
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
                (run_id, self.started_at, self.provenance.identity, to_json(dict(self.provenance.load)), to_json(prov)),
            )
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
            self.store.transaction(
                lambda conn: conn.execute(
                    "UPDATE sessions SET ended_at = ? WHERE id = ?", (time.time(), self.session_id)
                )
            )
        except (sqlite3.Error, OSError, StoreError) as exc:
            self.store.fault(exc, "written")

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ lookup / put
    def lookup(
        self,
        keys: Iterable[RowKey | str],
        *,
        anywhere: bool = True,
        parsed_type: Any = None,
        requests: Sequence[Any] | None = None,
        items: Sequence[Any] | None = None,
    ) -> dict[str, StoredRow]:
        """The stored rows of ``keys`` (by key string; missing keys are absent).  This run's own row wins;
        with ``anywhere`` a key stored only by another run is answered from there too (an exact key means the
        same numbers) and copied into this run (``computed=False``), so the run holds every row it returned;
        the copy answers the caller's item — ``items[i]`` (None: derived), else derived from ``requests[i]`` (the
        request as given, what :meth:`put` would store), else the item it was stored with.
        Outputs come back with ``cached=True``; ``parsed_type`` rebuilds pydantic ``parsed`` objects.
        Never raises for a store that cannot be read: the answer is then ``{}`` (after one warning)."""
        keys = list(keys)
        wanted = list(dict.fromkeys(str(k) for k in keys))
        if not wanted:
            return {}
        try:
            records = []
            for start in range(0, len(wanted), MAX_VARS):
                part = wanted[start : start + MAX_VARS]
                marks = ",".join("?" * len(part))
                scope = "" if anywhere else " AND r.run_id = ?"
                params: list[Any] = [*part] + ([] if anywhere else [self.run_id if self.run_id is not None else -1])
                records += self.store.query(
                    f"SELECT {ROW_COLUMNS}, r.run_id FROM rows r JOIN runs ON runs.id = r.run_id "
                    f"WHERE r.key IN ({marks}){scope} ORDER BY r.id",
                    params,
                )
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            self.store.fault(
                exc,
                "read",
                "every row is computed as if the store held none. Check the file "
                f"(wb.runs.path()) or point {STORE_ENV} at another file",
            )
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
                found[key] = stored_row(record[:-1], parsed_type)
            except (ValueError, KeyError, TypeError, InputError) as exc:  # an unreadable row is recomputed
                self.store.fault(
                    exc, "read: a stored row did not decode", f"row {key[:12]} is computed again and replaced"
                )
                del best[key]
        foreign = [record[0] for record in best.values() if record[-1] != self.run_id]
        if foreign:
            self._adopt(foreign, self._callers_items(keys, requests, items, best))
        return found

    def _callers_items(
        self,
        keys: list[RowKey | str],
        requests: Sequence[Any] | None,
        items: Sequence[Any] | None,
        best: Mapping[str, tuple],
    ) -> list[tuple[str, int | None, str]]:
        """``(item, turn, key)`` the caller gives the rows copied from other runs (none without requests/items)."""
        if requests is None and items is None:
            return []
        out = []
        for i, key in enumerate(keys):
            record = best.get(str(key))
            if record is None or record[-1] == self.run_id:
                continue
            try:
                derived = derive_item(codec.plain(requests[i])) if requests is not None else (None, None)
                given = items[i] if items is not None else None
                item = check_item(given) if given is not None else derived[0]
            except (InputError, IndexError):
                continue  # the copy keeps the item it was stored with
            if item is not None:
                out.append((item, derived[1], str(key)))
        return out

    def _adopt(self, row_ids: list[int], items: Sequence[tuple[str, int | None, str]] = ()) -> None:
        """Copy other runs' rows into this run (one transaction), naming their items ``(item, turn, key)``; a
        failure only warns."""
        if self.run_id is None or self.session_id is None:
            return

        def statements(conn: sqlite3.Connection) -> None:
            for start in range(0, len(row_ids), MAX_VARS):
                part = row_ids[start : start + MAX_VARS]
                conn.execute(
                    "INSERT OR IGNORE INTO rows(run_id, session_id, key, match, kind, request, prompt_ids, sampling, "
                    "seed_drawn, output, timings, computed, created_at, item, turn) SELECT ?, ?, key, match, kind, "
                    "request, prompt_ids, sampling, seed_drawn, output, timings, 0, ?, item, turn FROM rows "
                    "WHERE id IN "
                    f"({','.join('?' * len(part))})",
                    [self.run_id, self.session_id, time.time(), *part],
                )
            conn.executemany(
                "UPDATE rows SET item = ?, turn = ? WHERE run_id = ? AND key = ? AND computed = 0",
                [(item, turn, self.run_id, key) for item, turn, key in items],
            )
            conn.execute("UPDATE runs SET updated_at = ? WHERE id = ?", (time.time(), self.run_id))

        try:
            self.store.transaction(statements)
        except (sqlite3.Error, OSError, StoreError) as exc:
            self.store.fault(exc, "written")

    def put(
        self,
        key: RowKey,
        *,
        request: Any,
        prompt_ids: Sequence[int],
        output: Any,
        sampling: Mapping[str, Any] | None = None,
        seed_drawn: bool = False,
        timings: Mapping[str, Any] | None = None,
        item: str | None = None,
        turn: int | None = None,
    ) -> bool:
        """Store one finished row now (one transaction), replacing this run's row of the same key (what
        ``refresh=True`` needs).  ``request``: the request as given (stored as browsable JSON, lossy for
        callables); ``output``: the result exactly as returned (a Completion, ChatCompletion, Transcript...);
        ``sampling``: the settings it ran with, a drawn seed included (``seed_drawn=True``); ``timings``: JSON
        data about the row's time (``seconds``, wall time from the call's start to the row's finish, shows in
        ``rows()``); ``item``: the item the row answers (a case id; None: derived from ``request``, see
        :mod:`workbench.runs.items`), ``turn``: its number within a multi-row item (None: the request's
        ``turn`` if it has one).

        Contract: **never raises** for a failing store (read-only, full disk, locked, I/O error, an output it
        cannot encode): it warns once per store and returns False, so the caller returns its result anyway.
        Returns True once the row is committed (it survives a kill of the process from then on)."""
        return self.put_many(
            [
                {
                    "key": key,
                    "request": request,
                    "prompt_ids": prompt_ids,
                    "output": output,
                    "sampling": sampling,
                    "seed_drawn": seed_drawn,
                    "timings": timings,
                    "item": item,
                    "turn": turn,
                }
            ]
        )

    def put_many(self, rows: Iterable[Mapping[str, Any]]) -> bool:
        """:meth:`put` of several finished rows in one transaction (each a dict of put's keywords, ``item`` and
        ``turn`` optional)."""
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
                "output, timings, computed, created_at, item, turn) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?) "
                "ON CONFLICT(run_id, key) DO UPDATE SET session_id = excluded.session_id, match = excluded.match, "
                "kind = excluded.kind, request = excluded.request, prompt_ids = excluded.prompt_ids, "
                "sampling = excluded.sampling, seed_drawn = excluded.seed_drawn, output = excluded.output, "
                "timings = excluded.timings, computed = 1, created_at = excluded.created_at, item = excluded.item, "
                "turn = excluded.turn",
                [(self.run_id, self.session_id, *v) for v in values],
            )
            conn.execute("UPDATE runs SET updated_at = ? WHERE id = ?", (time.time(), self.run_id))

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

    def _values(
        self,
        *,
        key: RowKey,
        request: Any,
        prompt_ids: Sequence[int],
        output: Any,
        sampling: Mapping[str, Any] | None = None,
        seed_drawn: bool = False,
        timings: Mapping[str, Any] | None = None,
        item: Any = None,
        turn: int | None = None,
    ) -> tuple:
        if not isinstance(key, RowKey):
            raise InputError(f"put needs the RowKey from Run.keys(), got {type(key).__name__}")
        given = codec.plain(request)
        derived, derived_turn = derive_item(given)
        item = check_item(item) if item is not None else derived
        turn = int(turn) if turn is not None else derived_turn
        return (
            key.key,
            key.match,
            key.kind,
            to_json(given),
            pack_ids(prompt_ids),
            to_json(codec.plain(dict(sampling or {}))),
            int(bool(seed_drawn)),
            codec.dumps(output),
            to_json(codec.plain(dict(timings or {}))),
            time.time(),
            item,
            turn,
        )

    def __repr__(self) -> str:
        return f"Run({self.name!r}, store={str(self.store.path)!r})"

    def _repr_html_(self) -> str:
        prov = self.provenance
        return (
            f"<div style='{BOX}'><b>run {esc(self.name)}</b> in <code>{esc(self.store.path)}</code><br>"
            f"model {esc(prov.model)} · checkpoint <code>{esc(prov.identity[:19])}</code> · "
            f"{esc(', '.join(f'{k}={v}' for k, v in prov.load.items()))}</div>"
        )
