"""workbench: a Jupyter-first research workbench for Meta's Llama 3.x and Llama 4 checkpoints."""

from .engine import Engine
from .errors import WorkbenchError
from .session import current, load, unload
from .types import ChatCompletion, Completion, Message, StreamChunk, TokenLogprob, ToolCall

__all__ = [
    "ChatCompletion", "Completion", "Engine", "Message", "StreamChunk", "TokenLogprob", "ToolCall",
    "WorkbenchError", "current", "load", "unload",
]  # fmt: skip
__version__ = "0.1.0"
