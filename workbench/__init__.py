"""workbench: a Jupyter-first research workbench for Meta's Llama 3.x and Llama 4 checkpoints."""

from . import chat, tools
from .display import Transcript, show_prompt, to_frame
from .engine import Engine
from .errors import WorkbenchError
from .session import current, load, unload
from .types import ChatCompletion, Completion, Message, StreamChunk, TokenLogprob, ToolCall

__all__ = [
    "ChatCompletion", "Completion", "Engine", "Message", "StreamChunk", "TokenLogprob", "ToolCall",
    "Transcript", "WorkbenchError", "chat", "current", "load", "show_prompt", "to_frame", "tools", "unload",
]  # fmt: skip
__version__ = "0.1.0"
