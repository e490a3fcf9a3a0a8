"""The interfaces the engine layer is written against, as ``typing.Protocol`` classes (structural: any object
with these members fits, so the chat layer, the tool loop and the evals run on an Engine, a Ray replica pool or
a scripted stand-in alike).

- :class:`Runner`: what executes requests on the loaded model — the in-process runner or the model-parallel
  worker pool (``workbench.runtime``); the Engine holds one and nothing else touches the model.
- :class:`TextTokenizer` and :class:`ChatFormatter`: the formatter/tokenizer pair the chat layer renders prompts
  and parses replies with (``workbench.formats``).
- :class:`ChatEngine`: the one chat route — ``batch_chat_completion(dialogs, tools, ...)`` — through which the
  tool loop, the evals, serve and the Ray pool's callers reach generation (an Engine, a replica pool, a scripted
  stand-in, an adapter over a remote endpoint).
- :class:`CompletionEngine`: what the chat layer's own ``batch_chat_completion`` needs to make that method for an
  engine that completes rendered prompts — a formatter and ``batch_completion`` (:class:`StreamingEngine`: also
  ``stream_completion``).
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
from workbench.types import ChatCompletion, Completion, Message, StreamChunk


class Runner(Protocol):
    """Runs requests on one loaded model (every rank of it).  ``step(add, cancel)`` runs one step of the running
    batch (the engine's loop: requests join and leave at any step) and returns its token events; ``generate``
    runs some requests alone to their ends (warm-ups)."""

    def generate(self, requests: Sequence[Request]) -> Iterator[Event]: ...

    def step(self, add: Sequence[Request] = (), cancel: Sequence[int] = ()) -> list[Event]: ...

    def logits(
        self, token_lists: Sequence[Sequence[int]], images: Sequence[Any] | None = None
    ) -> list[torch.Tensor]: ...

    def score(
        self, sequences: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]: ...

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

    def encode_prompt(
        self,
        messages: Any,
        tools: Iterable[Any] | None = None,
        tool_choice: Any = "auto",
        tool_prompt_format: Any = None,
        system_message_behavior: str = "append",
    ) -> Prompt: ...

    def encode_content(self, content: Any) -> Prompt: ...

    def decode_assistant(self, text: str, stop_reason: str | None = None) -> Message: ...


class ChatEngine(Protocol):
    """The one method every caller above the engine generates chat replies through: one
    :class:`~workbench.types.ChatCompletion` per dialog, in order, parsed (tool calls, parse errors).

    Why one method: rendering and parsing then happen once per call, inside it (``workbench.engine.chat``), and a
    caller never picks among routes by probing attributes — anything with this method (an Engine, a replica
    pool, a scripted stand-in, an adapter over a remote OpenAI endpoint) drives ``workbench.tools.run`` /
    ``run_batch`` and the evals.  ``tools`` and ``tool_choice=`` are one for every dialog, or a list with
    one per dialog (``chat.dialog_offers``): the tool loop sends one set whenever its dialogs share one (always,
    in ``tools.run`` / ``run_batch``), one per dialog only when they differ (the evals' cases).  An engine
    with a context limit raises :class:`~workbench.errors.PromptTooLongError` whose ``rows`` name the dialogs
    that do not fit (the tool loop ends those and goes on)."""

    def batch_chat_completion(
        self, dialogs: Sequence[Any], tools: Any = None, **kwargs: Any
    ) -> list[ChatCompletion]: ...


class CompletionEngine(Protocol):
    """An engine that completes rendered prompts: one :class:`~workbench.types.Completion` per prompt (an Engine,
    a replica pool, a scripted stand-in); ``chat.batch_chat_completion`` makes its :class:`ChatEngine` method."""

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
