"""Keeping a store tidy: tags and notes on runs, renaming, and giving deleted space back to the disk.  Every
change is one transaction; nothing here touches a row's output."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from workbench.errors import InputError, StoreError
from workbench.runs.database import check_run_name
from workbench.runs.store import Store, open_store

NOTE_MAX = 10_000


def _write(store: Store, what: str, statements: Any) -> Any:
    try:
        return store.transaction(statements)
    except sqlite3.Error as exc:
        raise StoreError(
            f"could not {what} in {str(store.path)!r} ({exc}); is the file read-only or the disk "
            "full? Nothing was changed"
        ) from exc


def _tags(store: Store, run_id: int) -> list[str]:
    return json.loads(store.query("SELECT tags FROM runs WHERE id = ?", (run_id,))[0][0])


def _check_tags(tags: tuple[Any, ...]) -> list[str]:
    bad = [t for t in tags if not isinstance(t, str) or not t.strip() or len(t) > 100 or not t.isprintable()]
    if bad or not tags:
        raise InputError(
            f"tags are printable strings of 1 to 100 characters, got {list(tags) or 'none'}; e.g. "
            "wb.runs.tag('sweep', 'baseline', 'paper')"
        )
    return list(tags)


def tag(name: str, *tags: str, store: str | Path | Store | None = None) -> list[str]:
    """Add ``tags`` to run ``name`` (kept once each, in the order added); returns the run's tags."""
    st = open_store(store)
    run_id = st.run_id(name)
    wanted = _check_tags(tags)
    merged = list(dict.fromkeys([*_tags(st, run_id), *wanted]))
    _write(
        st,
        f"tag run {name!r}",
        lambda conn: conn.execute("UPDATE runs SET tags = ? WHERE id = ?", (json.dumps(merged), run_id)),
    )
    return merged


def untag(name: str, *tags: str, store: str | Path | Store | None = None) -> list[str]:
    """Remove ``tags`` from run ``name``; returns the run's tags."""
    st = open_store(store)
    run_id = st.run_id(name)
    drop = set(_check_tags(tags))
    kept = [t for t in _tags(st, run_id) if t not in drop]
    _write(
        st,
        f"untag run {name!r}",
        lambda conn: conn.execute("UPDATE runs SET tags = ? WHERE id = ?", (json.dumps(kept), run_id)),
    )
    return kept


def note(name: str, text: str, *, store: str | Path | Store | None = None) -> str:
    """Set run ``name``'s note (what the run was for; an empty text clears it); returns it."""
    if not isinstance(text, str) or len(text) > NOTE_MAX:
        raise InputError(f"a note is a string of at most {NOTE_MAX} characters, got {type(text).__name__}")
    st = open_store(store)
    run_id = st.run_id(name)
    _write(st, f"note run {name!r}", lambda conn: conn.execute("UPDATE runs SET note = ? WHERE id = ?", (text, run_id)))
    return text


def rename(old: str, new: str, *, store: str | Path | Store | None = None) -> str:
    """Rename run ``old`` to ``new`` (rows, sessions, scores, tags and note stay with it).  A ``new`` that exists
    raises InputError: delete or rename that run first."""
    st = open_store(store)
    run_id = st.run_id(old)
    new = check_run_name(new)
    if st.query("SELECT 1 FROM runs WHERE name = ?", (new,)):
        raise InputError(
            f"a run named {new!r} exists already in {str(st.path)!r}; pick another name, or delete it "
            f"first (wb.runs.delete({new!r}))"
        )
    _write(st, f"rename run {old!r}", lambda conn: conn.execute("UPDATE runs SET name = ? WHERE id = ?", (new, run_id)))
    st.forget_runs(old)
    return new


def vacuum(*, store: str | Path | Store | None = None) -> dict[str, int]:
    """Give the space of deleted runs back to the disk (SQLite's ``VACUUM`` after a WAL checkpoint);
    returns the file's size in bytes ``{"before": ..., "after": ...}`` (the WAL file included)."""
    st = open_store(store)
    before = st.size_bytes()
    try:
        st.vacuum()
    except sqlite3.Error as exc:
        raise StoreError(
            f"could not vacuum {str(st.path)!r} ({exc}); another process may hold it open with a "
            "transaction, or the disk lacks room for a copy of the file; try again later"
        ) from exc
    return {"before": before, "after": st.size_bytes()}
