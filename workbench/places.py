"""Where workbench keeps what it writes for the user to keep: the data folder.

Two kinds of files, two places: the *cache* (``$WORKBENCH_CACHE`` or ``~/.cache/workbench``: the demo model's
expansion, benchmark checkpoints — anything written again when missing, safe to delete) and the *data folder*
(``$WORKBENCH_DATA_DIR``, else ``$XDG_DATA_HOME/workbench``, by default ``~/.local/share/workbench``): results
that cost compute to make and are not made again by themselves — the run store (``runs.sqlite``) and the Batch
API's files and batch records.  The data folder is resolved here, once, for both.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "WORKBENCH_DATA_DIR"
CACHE_ENV = "WORKBENCH_CACHE"
STORE_ENV = "WORKBENCH_STORE"  # the run store's file (workbench.runs), else runs.sqlite in the data folder


def data_dir() -> Path:
    """The data folder: ``$WORKBENCH_DATA_DIR``, else ``$XDG_DATA_HOME/workbench`` (by default
    ``~/.local/share/workbench``).  Read from the environment at every call (not created here)."""
    named = os.environ.get(DATA_DIR_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "workbench"
