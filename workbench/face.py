"""The package face's eager names: what ``import workbench as wb`` holds at once (``workbench/__init__.py``
re-exports them and adds the ones loaded on first use).

Why a module of its own: the face imports the notebook face, the tool loop, the session and the engine, so it
sits in the layers contract just above them (pyproject.toml).  A module below that writes ``import workbench``
or ``from workbench import load`` reaches the face through the package root, and import-linter reports that
chain as an import going up.  With these imports in ``__init__.py`` the root was in no layer, and such an
arrow went unseen (import-linter cannot make a package a layer among its own children).
"""

from workbench import runs, tools
from workbench.engine import Engine, chat
from workbench.errors import WorkbenchError
from workbench.notebook import display
from workbench.notebook.display import show_prompt, to_frame
from workbench.notebook.extras import require
from workbench.session import current, load, unload
from workbench.types import ChatCompletion, Completion, Message, StreamChunk, TokenLogprob, ToolCall, Transcript

__all__ = [
    "ChatCompletion", "Completion", "Engine", "Message", "StreamChunk", "TokenLogprob", "ToolCall",
    "Transcript", "WorkbenchError", "chat", "current", "display", "load", "require",
    "runs", "show_prompt", "to_frame", "tools", "unload",
]
