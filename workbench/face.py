"""The package face's eager names: what ``import workbench as wb`` holds at once (``workbench/__init__.py``
re-exports them and adds the ones loaded on first use).

Why a module of its own: the face imports the notebook face, the tool loop, the session and the engine, so it
sits in the layers contract just above them (pyproject.toml).  A module below that writes ``import workbench``
or ``from workbench import load`` reaches the face through the package root, and import-linter reports that
chain as an import going up.  With these imports in ``__init__.py`` the root was in no layer, and such an
arrow went unseen (import-linter cannot make a package a layer among its own children).
"""

import importlib
from typing import Any

from workbench import runs, tools
from workbench.engine import Engine, SamplingParams, chat
from workbench.errors import WorkbenchError
from workbench.notebook import display
from workbench.notebook.display import show_prompt, to_frame
from workbench.notebook.extras import require
from workbench.session import current, load, unload
from workbench.types import ChatCompletion, Completion, Message, StreamChunk, TokenLogprob, ToolCall, Transcript


def view_runs(*names: str, baseline: str | None = None, store: Any = None) -> Any:
    """The viewer of stored runs ``names`` against ``baseline`` (default: the first), as ``wb.runs.view``:
    runs, tags, notes, differing settings, the score summary, the item grid (regressions first) and both
    transcripts of an item side by side.  It lives in the notebook face (ipywidgets, itables), above the run
    store, so the package face hands it to ``wb.runs`` and imports it on first use."""
    return importlib.import_module("workbench.notebook.runs_view").view(*names, baseline=baseline, store=store)


runs.view = view_runs

__all__ = [
    "ChatCompletion",
    "Completion",
    "Engine",
    "Message",
    "SamplingParams",
    "StreamChunk",
    "TokenLogprob",
    "ToolCall",
    "Transcript",
    "WorkbenchError",
    "chat",
    "current",
    "display",
    "load",
    "require",
    "runs",
    "show_prompt",
    "to_frame",
    "tools",
    "unload",
]
