"""The run store: every result of a ``run="name"`` call remembered on disk, answered from there when the same
work comes again, and traceable to the checkpoint, settings and seed that made it.

Layer: below the engine (which stores and answers rows through it), above the runtime.  ``import workbench``
imports this package; the browsing functions (pandas, and inspect_ai for :func:`to_inspect`) load on first use.

For people (``wb.runs``)::

    wb.runs.path()                       # the store file ($WORKBENCH_STORE, else runs.sqlite in the data folder)
    wb.runs.table()                      # DataFrame: one row per run
    wb.runs.rows("sweep")                # DataFrame: one row per stored result: item, turn, output, scores...
    wb.runs.settings("sweep")            # dict: load and call settings (Varies where they vary in the run)
    wb.runs.diff_settings("a", "b")      # {setting: (value in a, value in b)}: only what differs
    wb.runs.score("sweep", fn)           # fn(row) -> {"passed": bool, ...} on every row; nothing generated
    wb.runs.compare("a", "b")            # DataFrame: one row per item in both runs (by="request": exact pairs)
    wb.runs.transcript("a", item)        # one item's rows, turn by turn
    wb.runs.explanation("a", item)       # why the item scored as it did, where its harness said (BFCL multi-turn)
    wb.runs.summary(["a", "b"])          # per run x score: mean, 95 % interval, paired diff, p-value
    wb.runs.tag("a", "baseline"); wb.runs.note("a", "..."); wb.runs.rename("a", "b"); wb.runs.vacuum()
    wb.runs.export("sweep", "sweep.parquet")   # or .jsonl
    wb.runs.to_inspect("sweep", "sweep.eval")  # an Inspect log: `inspect view` browses the transcripts
    wb.runs.delete("sweep")
    wb.runs.report(["bf16", "int4"], "report.html")   # one self-contained HTML file: summary, settings, changes
    wb.runs.view("bf16", "int4")         # the viewer in the notebook (set by the package face: it needs widgets)

For the engine and integrations (see :class:`Run`)::

    store = wb.runs.store()
    identity = store.checkpoint_identity(settings.checkpoint_dir)       # hashed once, remembered
    run = store.open_run("sweep", Provenance.of(settings, identity, model=model_id))
    keys = run.keys([RowRequest(prompt_ids, sampling, kind="chat"), ...])
    found = run.lookup(keys)                                             # {key: StoredRow}
    sampling, drawn = settle_seed(sampling)                              # rows computed: seed drawn if needed
    run.put(keys[i], request=..., prompt_ids=..., output=result, sampling=sampling, seed_drawn=drawn,
            timings=...)                                                 # never raises; True once committed
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from workbench.runs.codec import decode, dumps, encode, loads
from workbench.runs.explanations import explanation, put_explanations
from workbench.runs.identity import CheckpointIdentity, checkpoint_identity
from workbench.runs.items import check_item, derive_item, input_item, item_id
from workbench.runs.keys import (
    NUMERICS_VERSION,
    RowKey,
    RowRequest,
    cache_key,
    canonical_sampling,
    draw_seed,
    image_digest,
    load_fields,
    needs_seed,
    request_identity,
    request_keys,
    row_key,
    settle_seed,
)
from workbench.runs.manage import note, rename, tag, untag, vacuum
from workbench.runs.provenance import Provenance
from workbench.runs.scores import keep_scores, put_scores, score, set_items, set_turns
from workbench.runs.settings import Varies, diff_settings, settings, tool_schema_hash
from workbench.runs.store import (
    SCHEMA_VERSION,
    STORE_ENV,
    Run,
    Store,
    StoredRow,
    call_keywords,
    check_run_name,
    open_store,
    store_path,
)

store = open_store  # wb.runs.store(): the Store of $WORKBENCH_STORE (or of a given file)

# browsing: imported on first use (pandas; inspect_ai for to_inspect)
_LAZY = {
    "table": "workbench.runs.browse",
    "rows": "workbench.runs.browse",
    "compare": "workbench.runs.pairing",
    "transcript": "workbench.runs.pairing",
    "summary": "workbench.runs.significance",
    "export": "workbench.runs.browse",
    "to_inspect": "workbench.runs.inspect_log",
    "report": "workbench.runs.report_html",
}


def path() -> Path:
    """The run store file this process uses: ``$WORKBENCH_STORE``, else ``runs.sqlite`` in workbench's data
    folder (``$WORKBENCH_DATA_DIR``, by default ``~/.local/share/workbench``)."""
    return store_path()


def delete(name: str, *, store: str | Path | Store | None = None) -> int:
    """Delete run ``name`` (its rows and sessions) from the store; returns how many rows were deleted."""
    return open_store(store).delete(name)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'workbench.runs' has no attribute {name!r}")


__all__ = [
    "NUMERICS_VERSION",
    "SCHEMA_VERSION",
    "STORE_ENV",
    "CheckpointIdentity",
    "Provenance",
    "RowKey",
    "RowRequest",
    "Run",
    "Store",
    "StoredRow",
    "Varies",
    "cache_key",
    "call_keywords",
    "canonical_sampling",
    "check_item",
    "check_run_name",
    "checkpoint_identity",
    "compare",
    "decode",
    "delete",
    "derive_item",
    "diff_settings",
    "draw_seed",
    "dumps",
    "encode",
    "explanation",
    "export",
    "image_digest",
    "input_item",
    "item_id",
    "keep_scores",
    "load_fields",
    "loads",
    "needs_seed",
    "note",
    "path",
    "put_explanations",
    "put_scores",
    "rename",
    "report",
    "request_identity",
    "request_keys",
    "row_key",
    "rows",
    "score",
    "set_items",
    "set_turns",
    "settings",
    "settle_seed",
    "store",
    "summary",
    "table",
    "tag",
    "to_inspect",
    "tool_schema_hash",
    "transcript",
    "untag",
    "vacuum",
]
