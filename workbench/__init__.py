"""workbench: a Jupyter-first research workbench for Meta's Llama 3.x and Llama 4 checkpoints.

The package face: what notebooks import (``import workbench as wb``).  Importing it also imports the
notebook face (:mod:`workbench.notebook`), which registers the HTML cards and DataFrames that results
display with.  What pulls heavy or optional dependencies loads on first use (PEP 562): ``wb.bench`` and
``wb.plots`` (pandas, matplotlib), ``wb.serve`` (fastapi, uvicorn) and ``wb.cluster`` (Ray), and
``wb.runs``'s browsing functions (pandas, inspect_ai), so ``import workbench`` stays fast and works without the
extras.
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

# name -> (module, attribute or None for the module itself), imported on first access
_LAZY = {"serve": ("workbench.serve", "serve"), "cluster": ("workbench.cluster", None),
         "bench": ("workbench.notebook.bench", None), "plots": ("workbench.notebook.plots", None)}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        loaded = importlib.import_module(module)
        return loaded if attribute is None else getattr(loaded, attribute)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


__all__ = [
    "ChatCompletion", "Completion", "Engine", "Message", "SamplingParams", "StreamChunk", "TokenLogprob", "ToolCall",
    "Transcript", "WorkbenchError", "bench", "chat", "current", "display", "load", "plots", "require",
    "runs", "show_prompt", "to_frame", "tools", "unload",
]
__version__ = "0.1.0"
