"""Scores on stored rows: a name and a number or a pass/fail (bool) per row, stored beside the row (the
``scores`` table), shown as one column per name by ``rows()`` and compared by ``compare`` and ``summary``.

:func:`score` applies a function to every row of a run *without generating anything* (it reads the store
only), so a run can be scored again and again, another way each time; the evals harness and BFCL store their
own scores with :func:`put_scores` (one dict per item, on the item's last row: a tool-loop item's final
turn).  A name holds one type in a run: pass/fail or numbers.
"""

from __future__ import annotations

import math
import numbers
import sqlite3
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.errors import InputError, ScoreWarning, StoreError, StoreWarning
from workbench.runs.database import Database
from workbench.runs.items import check_item
from workbench.runs.keys import pack_ids
from workbench.runs.outline import FRAME_COLUMNS, NOT_SCORES, gc_paused, outline
from workbench.runs.store import Store, open_store

ScoreValue = bool | int | float
SCORE_NAME_MAX = 100
# the columns and fields rows() already has: not score names (the viewer adds "change" and "same")
RESERVED_NAMES = frozenset({*FRAME_COLUMNS, *NOT_SCORES, "change", "same"})


def score_kind(name: str, value: Any) -> tuple[str, float] | None:
    """``(kind, stored value)`` of one score value: ``bool`` (numpy's too) as 0/1, a finite number as a float;
    None: no score.  Anything else raises InputError naming the fix."""
    if value is None:
        return None
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return "bool", float(bool(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isnan(number):
            return None
        if math.isinf(number):
            raise InputError(f"score {name!r} is {number}; scores are finite numbers or pass/fail (bool)")
        return "number", number
    raise InputError(
        f"score {name!r} is a {type(value).__name__} ({value!r:.60}); a score is a number or a bool "
        "(pass/fail): return e.g. {'exact': output == target} or {'length': len(output)}"
    )


def check_score_name(name: Any) -> str:
    """A score name: printable, 1 to 100 characters, not a column ``rows()`` already shows."""
    if not isinstance(name, str) or not name.strip() or len(name) > SCORE_NAME_MAX or not name.isprintable():
        raise InputError(
            f"a score name must be a printable string of 1 to {SCORE_NAME_MAX} characters, got {name!r:.80}"
        )
    if name in RESERVED_NAMES:
        raise InputError(
            f"{name!r} is a column of wb.runs.rows() already, so it cannot name a score; use another "
            f"name (e.g. {name + '_score'!r})"
        )
    return name


def stored_kinds(store: Database, run_id: int) -> dict[str, str]:
    """The kind each score name of a run holds now."""
    return dict(
        store.query(
            "SELECT s.name, min(s.kind) FROM scores s JOIN rows r ON r.id = s.row_id "
            "WHERE r.run_id = ? GROUP BY s.name",
            (run_id,),
        )
    )


def _check_kinds(
    run: str, new: Sequence[tuple[int, str, str, float]], held: Mapping[str, str], replaced: set[str]
) -> None:
    """One kind per score name (the new values together with those kept): else InputError naming the fix."""
    kinds: dict[str, dict[str, int]] = {}
    for _, name, kind, _ in new:
        kinds.setdefault(name, {}).setdefault(kind, 0)
        kinds[name][kind] += 1
    for name, held_kind in held.items():
        if name in kinds and name not in replaced:
            kinds[name].setdefault(held_kind, 0)
    for name, found in kinds.items():
        if len(found) > 1:
            counts = ", ".join(
                f"{'pass/fail (bool)' if k == 'bool' else 'numbers'} on {n} rows"
                if n
                else f"{'pass/fail (bool)' if k == 'bool' else 'numbers'} already stored"
                for k, n in sorted(found.items())
            )
            raise InputError(
                f"score {name!r} of run {run!r} would hold {counts}; a score name holds one type: "
                f"return one type for it (e.g. float(passed), or bool(value > threshold)) or use "
                f"another name (e.g. {name + '_rate'!r})"
            )


def write_scores(
    store: Database, run: str, values: Sequence[tuple[int, str, Any]], *, replace_names: bool = False
) -> int:
    """Store ``(row_id, name, value)`` scores of run ``run`` in one transaction (``replace_names``: the names
    given drop their old values on every row first).  Returns how many were stored."""
    run_id = store.run_id(run)
    typed = []
    for name in {name for _, name, _ in values}:
        check_score_name(name)
    for row_id, name, value in values:
        kind = score_kind(name, value)
        if kind is not None:
            typed.append((row_id, name, *kind))
    names = {name for _, name, _, _ in typed}
    _check_kinds(run, typed, stored_kinds(store, run_id), names if replace_names else set())

    def statements(conn: sqlite3.Connection) -> None:
        if replace_names:
            for name in names:
                conn.execute(
                    "DELETE FROM scores WHERE name = ? AND row_id IN (SELECT id FROM rows WHERE run_id = ?)",
                    (name, run_id),
                )
        conn.executemany(
            "INSERT OR REPLACE INTO scores(row_id, name, value, kind) VALUES (?, ?, ?, ?)",
            [(row_id, name, value, kind) for row_id, name, kind, value in typed],
        )
        conn.execute("UPDATE runs SET updated_at = ? WHERE id = ?", (time.time(), run_id))

    try:
        store.transaction(statements)
    except sqlite3.Error as exc:
        raise StoreError(
            f"could not store scores of run {run!r} in {str(store.path)!r} ({exc}); is the file "
            "read-only or the disk full? Nothing was changed"
        ) from exc
    return len(typed)


def row_view(record: Mapping[str, Any], scores: Mapping[str, Any]) -> dict[str, Any]:
    """The row a score function sees: ``item``, ``turn``, ``kind``, ``output`` (text), ``tool_calls`` (text),
    ``calls`` (``[(name, arguments)]``), ``stop_reason``, ``tokens``, ``request``, ``sampling`` and the row's
    scores so far (``scores``)."""
    view = {k: record[k] for k in _VIEW}
    view["scores"] = dict(scores)
    return view


_VIEW = (
    "row_id",
    "item",
    "turn",
    "kind",
    "output",
    "tool_calls",
    "calls",
    "n_tool_calls",
    "stop_reason",
    "tokens",
    "generated_tokens",
    "request",
    "sampling",
    "key",
)


def score(
    name: str, fn: Callable[[dict[str, Any]], Mapping[str, ScoreValue]], *, store: str | Path | Store | None = None
) -> dict[str, Any]:
    """Score every row of run ``name`` with ``fn(row) -> {score_name: number or bool}`` and store the scores
    (replacing earlier values of those names); nothing is generated.  ``row`` is a dict (:func:`row_view`:
    ``item``, ``output``, ``tool_calls``, ``stop_reason``, ...).  A row on which ``fn`` raises gets no score: the
    failures are counted and shown once (a :class:`~workbench.errors.ScoreWarning` with the first error) and
    the other rows are stored.  Returns ``{"scored": rows, "failed": rows, "first_error": str | None,
    "names": [...]}``."""
    if not callable(fn):
        raise InputError(f"score takes a function row -> {{name: value}}, got {type(fn).__name__}")
    st = open_store(store)
    values: list[tuple[int, str, Any]] = []
    scored = failed = 0
    first_error: str | None = None
    names: dict[str, None] = {}
    found = outline(st, name)
    checked: set[str] = set()
    with gc_paused():
        for record in found.records:
            try:
                result = fn(row_view(record, found.scores_of(record)))
            except Exception as exc:  # a row the function cannot score: counted, shown once, the others stored
                failed += 1
                if first_error is None:
                    first_error = f"{type(exc).__name__}: {exc} (item {record['item']!r})"
                continue
            if not isinstance(result, Mapping):
                raise InputError(
                    f"the score function returned a {type(result).__name__}; return a dict of score "
                    "name -> number or bool, e.g. {'exact': row['output'] == target}"
                )
            scored += 1
            for key, value in result.items():
                if key not in checked:
                    names[check_score_name(key)] = None
                    checked.add(key)
                values.append((record["row_id"], key, value))
    write_scores(st, name, values, replace_names=True)
    if failed:
        warnings.warn(
            f"the score function raised on {failed} of {scored + failed} rows of run {name!r}; those "
            f"rows have no score, the other {scored} were stored. First error: {first_error}. Fix the "
            "function and score again (new scores replace the old ones)",
            ScoreWarning,
            stacklevel=2,
        )
    return {"scored": scored, "failed": failed, "first_error": first_error, "names": list(names)}


def put_scores(
    name: str, scores: Mapping[Any, Mapping[str, ScoreValue]], *, store: str | Path | Store | None = None
) -> dict[str, Any]:
    """Store scores by item: ``{item: {score_name: value}}``, each on the item's last row (its final turn, the
    latest stored).  What the evals harness and BFCL call after scoring their cases.  Returns ``{"stored":
    scores stored, "missing": [items with no row]}``."""
    st = open_store(store)
    run_id = st.run_id(name)
    last: dict[str, int] = {}
    for row_id, item in st.query(
        "SELECT id, item FROM rows WHERE run_id = ? ORDER BY coalesce(turn, 0), id", (run_id,)
    ):
        last[item] = row_id
    values, missing = [], []
    for item, by_name in scores.items():
        row_id = last.get(check_item(item))
        if row_id is None:
            missing.append(item)
            continue
        values += [(row_id, key, value) for key, value in by_name.items()]
    return {"stored": write_scores(st, name, values), "missing": missing}


def set_items(name: str, items: Sequence[tuple[Sequence[int], Any]], *, store: str | Path | Store | None = None) -> int:
    """Name the items of run ``name``'s rows by their prompt ids: ``[(prompt_ids, item), ...]`` (for callers
    that know a row's case id but not its key, e.g. BFCL).  Returns how many rows were renamed."""
    st = open_store(store)
    run_id = st.run_id(name)
    wanted = {pack_ids(ids): check_item(item) for ids, item in items}
    updates = [
        (wanted[blob], row_id)
        for row_id, blob in st.query("SELECT id, prompt_ids FROM rows WHERE run_id = ?", (run_id,))
        if blob in wanted
    ]
    if updates:
        try:
            st.transaction(lambda conn: conn.executemany("UPDATE rows SET item = ? WHERE id = ?", updates))
        except sqlite3.Error as exc:
            raise StoreError(f"could not name the items of run {name!r} in {str(st.path)!r} ({exc})") from exc
    return len(updates)


def keep_scores(
    name: str,
    scores: Mapping[Any, Mapping[str, ScoreValue]],
    *,
    items: Sequence[tuple[Sequence[int], Any]] = (),
    store: str | Path | Store | None = None,
) -> bool:
    """What a harness calls after scoring the cases of a ``run=`` call: name the rows' items by their prompt ids
    (``items``, see :func:`set_items`; rows the engine named already need none) and store the scores by item
    (:func:`put_scores`).  Like every write from a call, it never raises for a store that cannot be written: it
    warns (:class:`~workbench.errors.StoreWarning`) and returns False; the harness's results stand."""
    try:
        if items:
            set_items(name, items, store=store)
        put_scores(name, scores, store=store)
    except (StoreError, sqlite3.Error, OSError) as exc:
        warnings.warn(
            f"the scores of run {name!r} could not be stored ({exc}); the results are returned but "
            "wb.runs.compare/summary will not see them. Free disk space or make the store writable, then "
            "run again (every row is answered from the store)",
            StoreWarning,
            stacklevel=2,
        )
        return False
    return True


def set_turns(
    name: str, turns: Sequence[tuple[Sequence[int], Any, int]], *, store: str | Path | Store | None = None
) -> int:
    """Number the rows of run ``name`` that a completion call stored for an item: ``[(prompt_ids, item, turn)]``
    (a chat row's turn comes from its dialog; a harness that renders its own prompts, e.g. BFCL's handler
    prompt, knows the step instead).  Returns how many rows were numbered."""
    st = open_store(store)
    run_id = st.run_id(name)
    wanted = {(pack_ids(ids), check_item(item)): int(turn) for ids, item, turn in turns}
    updates = [
        (wanted[(blob, item)], row_id)
        for row_id, blob, item in st.query("SELECT id, prompt_ids, item FROM rows WHERE run_id = ?", (run_id,))
        if (blob, item) in wanted
    ]
    if updates:
        try:
            st.transaction(lambda conn: conn.executemany("UPDATE rows SET turn = ? WHERE id = ?", updates))
        except sqlite3.Error as exc:
            raise StoreError(f"could not number the turns of run {name!r} in {str(st.path)!r} ({exc})") from exc
    return len(updates)


__all__ = ["keep_scores", "put_scores", "score", "score_kind", "set_items", "set_turns", "write_scores"]
