"""Why an item scored as it did, in words, kept beside a run's scores (BFCL multi-turn's failure explanations).

Scores are numbers; a harness whose checker says *why* (a turn, the backend state that differs, the expected result
that is missing) keeps that text here, one per item, and the viewer (``wb.runs.view``) shows it when the item is
opened.  The texts live in the store's ``meta`` table under the run's name and creation time, so a deleted run's
name reused later does not inherit them; storing a run's explanations again replaces them.
"""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.errors import InputError, StoreError, StoreWarning
from workbench.runs.items import check_item
from workbench.runs.store import Store, open_store


def _prefix(st: Store, name: str) -> str:
    run_id = st.run_id(name)
    created = st.query("SELECT created_at FROM runs WHERE id = ?", (run_id,))[0][0]
    return f"explanation\t{name}\t{created!r}\t"


def put_explanations(name: str, explanations: Mapping[Any, str], *, store: str | Path | Store | None = None) -> bool:
    """Keep ``{item: text}`` for run ``name`` (an empty text: nothing to explain).  Like every write from a
    harness, a store that cannot be written warns (StoreWarning) and returns False."""
    try:
        st = open_store(store)
        prefix = _prefix(st, name)
        values = [(prefix + check_item(item), str(text)) for item, text in explanations.items() if text]
        dropped = [(prefix + check_item(item),) for item, text in explanations.items() if not text]

        def write(conn: sqlite3.Connection) -> None:
            conn.executemany("DELETE FROM meta WHERE key = ?", dropped)
            conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", values)

        st.transaction(write)
    except (StoreError, InputError, sqlite3.Error, OSError) as exc:
        warnings.warn(
            f"the explanations of run {name!r} could not be stored ({exc}); the results are returned",
            StoreWarning,
            stacklevel=2,
        )
        return False
    return True


def explanation(name: str, item: Any, *, store: str | Path | Store | None = None) -> str | None:
    """The text kept for ``item`` of run ``name``, or None."""
    st = open_store(store)
    found = st.query("SELECT value FROM meta WHERE key = ?", (_prefix(st, name) + check_item(item),))
    return found[0][0] if found else None
