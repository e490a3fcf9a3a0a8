"""The interfaces the engine layer is written against, as ``typing.Protocol`` classes (structural: any object
with these members fits, so the chat layer, the tool loop and the evals run on an Engine, a Ray replica pool or
a scripted stand-in alike).

- :class:`Runner`: what executes requests on the loaded model — the in-process runner or the model-parallel
  worker pool (``workbench.runtime``); the Engine holds one and nothing else touches the model.
- :class:`TextTokenizer` and :class:`ChatFormatter`: the formatter/tokenizer pair the chat layer renders prompts
  and parses replies with (``workbench.formats``).
- :class:`CompletionEngine`: what the chat functions, the tool loop and the evals need of an engine — a formatter
  and ``batch_completion`` over rendered prompts (:class:`StreamingEngine`: also ``stream_completion``).
- :class:`LoadedModel`: what prompt encoding and checks read (model args, tokenizer, formatter, ``max_seq_len``).
- :class:`ModelIdentity`: what names a loaded model (``model_id``, ``family``, ``settings``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import torch

from workbench.formats import Prompt
from workbench.generation import Event, Request
from workbench.models.args import ModelArgs
from workbench.runtime.settings import Settings
from workbench.types import Completion, Message, StreamChunk


class Runner(Protocol):
    """Runs requests on one loaded model (every rank of it).  ``generate`` streams token events; closing its
    iterator stops the call (on every rank)."""

    def generate(self, requests: Sequence[Request]) -> Iterator[Event]: ...

    def logits(self, token_lists: Sequence[Sequence[int]], images: Sequence[Any] | None = None
               ) -> list[torch.Tensor]: ...

    def score(self, sequences: Sequence[Sequence[int]],
              starts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]: ...

    def memory(self) -> dict[str, Any]: ...

    def parameter_count(self) -> int: ...

    def reload(self, settings: Settings) -> None: ...

    def load_vision(self) -> None: ...

    @property
    def vision_loaded(self) -> bool: ...

    def compile_decode(self, enabled: bool = True) -> None: ...

    @property
    def alive(self) -> bool: ...

    def close(self) -> None: ...


class TextTokenizer(Protocol):
    """Token ids <-> text, and the special tokens by name."""

    special_tokens: dict[str, int]
    bos_id: int
    eot_id: int
    eom_id: int

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ChatFormatter(Protocol):
    """Renders dialogs in a model's official prompt format and parses its replies."""

    tokenizer: TextTokenizer
    chat: Any  # the family's chat format (``no_images_reason``: why a model takes no images)

    @property
    def default_tool_prompt_format(self) -> str: ...

    def encode_prompt(self, messages: Any, tools: Iterable[Any] | None = None, tool_choice: Any = "auto",
                      tool_prompt_format: Any = None, system_message_behavior: str = "append") -> Prompt: ...

    def encode_content(self, content: Any) -> Prompt: ...

    def decode_assistant(self, text: str, stop_reason: str | None = None) -> Message: ...


class CompletionEngine(Protocol):
    """An engine the chat functions, the tool loop and the evals can drive: rendered prompts in, one
    :class:`~workbench.types.Completion` per prompt out (an Engine, a replica pool, a scripted stand-in)."""

    formatter: ChatFormatter

    def batch_completion(self, contents: Sequence[Any], **kwargs: Any) -> list[Completion]: ...


class StreamingEngine(CompletionEngine, Protocol):
    """A :class:`CompletionEngine` that also streams one prompt's completion as it is generated."""

    def stream_completion(self, content: Any, **kwargs: Any) -> Iterator[StreamChunk]: ...


class LoadedModel(Protocol):
    """What checking and encoding a prompt row reads from a loaded model."""

    args: ModelArgs
    tokenizer: TextTokenizer

    @property
    def formatter(self) -> ChatFormatter: ...

    @property
    def max_seq_len(self) -> int: ...


class ModelIdentity(Protocol):
    """What names a loaded model: its model id (None when not given), family and load settings."""

    model_id: str | None
    family: str
    settings: Settings
