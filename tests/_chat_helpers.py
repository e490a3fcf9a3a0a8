"""Helpers for the chat-format tests: the reference oracles (llama-models 0.3.0, llama-stack 0.2.2) driven from
our message dicts, and a scripted fake engine for the chat API and tool-loop tests.

The references are only imported here, in tests; workbench itself never imports them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.engine import chat
from workbench.formats import make_formatter
from workbench.formats.tokenizer import Tokenizer
from workbench.types import Completion, Message, ToolCall

PINNED_DATE = dt.date(2024, 9, 21)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return a + b


def install_torchvision_stub() -> None:
    """The Llama 4 reference chat format imports torchvision for image preprocessing; without an installable
    torchvision the tests use a minimal stand-in of the transforms it needs (tests/torchvision_standin.py)."""
    import torchvision_standin

    torchvision_standin.install()


# --- our side -----------------------------------------------------------------------------------------------


@functools.cache
def our_tokenizer(family: str) -> Tokenizer:
    return Tokenizer.for_checkpoint(None, family)  # type: ignore[arg-type]


def our_formatter(model: str | None, family: str | None = None, today: Any = PINNED_DATE):
    fam = family or ("llama4" if model and "llama-4" in model.lower() else "llama3")
    return make_formatter(our_tokenizer(fam), model, today=today)


# --- llama-models (raw chat format) --------------------------------------------------------------------------


@functools.cache
def ref_models_chat_format(family: str):
    if family == "llama4":
        install_torchvision_stub()
        from llama_models.llama4.chat_format import ChatFormat
        from llama_models.llama4.tokenizer import Tokenizer as RefTokenizer
    else:
        from llama_models.llama3.chat_format import ChatFormat
        from llama_models.llama3.tokenizer import Tokenizer as RefTokenizer
    return ChatFormat(RefTokenizer.get_instance())


def _models_datatypes():
    from llama_models import datatypes

    return datatypes


def to_raw_message(m: dict[str, Any] | Message, datatypes: Any):
    """Our message (dict or Message) as a reference ``RawMessage``."""
    msg = Message.coerce(m)
    role = "tool" if msg.role in ("tool", "ipython") else msg.role
    content = msg.content
    if isinstance(content, list):
        content = [datatypes.RawTextItem(text=c if isinstance(c, str) else c["text"]) for c in content]
    calls = [
        datatypes.ToolCall(call_id=c.call_id or "id", tool_name=c.tool_name, arguments=c.arguments)
        for c in msg.tool_calls
    ]
    stop = datatypes.StopReason(msg.stop_reason) if msg.stop_reason else None
    return datatypes.RawMessage(role=role, content=content, tool_calls=calls, stop_reason=stop)


def ref_raw_tokens(dialog: Sequence[Any], family: str, tool_prompt_format: str | None = None) -> list[int]:
    """``ChatFormat.encode_dialog_prompt`` of llama-models 0.3.0."""
    datatypes = _models_datatypes()
    fmt = datatypes.ToolPromptFormat(tool_prompt_format) if tool_prompt_format else None
    raw = [to_raw_message(m, datatypes) for m in dialog]
    chat_format = ref_models_chat_format(family)
    if fmt is None:
        return chat_format.encode_dialog_prompt(raw).tokens
    return chat_format.encode_dialog_prompt(raw, fmt).tokens


# --- llama-stack (tool prompts) ------------------------------------------------------------------------------


@functools.cache
def ref_stack_chat_format(family: str):
    if family == "llama4":
        install_torchvision_stub()
        from llama_stack.models.llama.llama4.chat_format import ChatFormat
        from llama_stack.models.llama.llama4.tokenizer import Tokenizer as RefTokenizer
    else:
        from llama_stack.models.llama.llama3.chat_format import ChatFormat
        from llama_stack.models.llama.llama3.tokenizer import Tokenizer as RefTokenizer
    return ChatFormat(RefTokenizer.get_instance())


def pin_reference_date(monkeypatch: Any, date: dt.date = PINNED_DATE) -> None:
    """Make the reference's ``datetime.now()`` (Llama 3.1 'Today Date') return ``date``."""
    from llama_stack.models.llama.llama3.prompt_templates import system_prompts

    class _FixedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> dt.datetime:  # noqa: ARG003
            return cls(date.year, date.month, date.day, 12, 0, 0)

    monkeypatch.setattr(system_prompts, "datetime", _FixedDatetime)


def to_stack_message(m: dict[str, Any] | Message):
    from llama_stack.apis.common.content_types import TextContentItem
    from llama_stack.apis.inference import CompletionMessage, SystemMessage, ToolResponseMessage, UserMessage
    from llama_stack.models.llama.datatypes import StopReason
    from llama_stack.models.llama.datatypes import ToolCall as StackToolCall

    msg = Message.coerce(m)
    content = msg.content
    if isinstance(content, list):
        content = [TextContentItem(text=c if isinstance(c, str) else c["text"]) for c in content]
    if msg.role == "system":
        return SystemMessage(content=content)
    if msg.role == "user":
        return UserMessage(content=content)
    if msg.role in ("tool", "ipython"):
        return ToolResponseMessage(call_id=msg.call_id or "id", content=content)
    calls = [
        StackToolCall(call_id=c.call_id or "id", tool_name=c.tool_name, arguments=c.arguments) for c in msg.tool_calls
    ]
    return CompletionMessage(
        content=content, stop_reason=StopReason(msg.stop_reason or "end_of_turn"), tool_calls=calls
    )


def to_stack_tool(tool: dict[str, Any] | str):
    from llama_stack.models.llama.datatypes import ToolDefinition

    if isinstance(tool, str):
        return ToolDefinition(tool_name=tool)
    return ToolDefinition(**tool)


def ref_stack_messages(
    dialog,
    tools,
    tool_choice="auto",
    tool_prompt_format=None,
    model="Llama3.2-3B-Instruct",
    system_message_behavior="append",
):
    """``chat_completion_request_to_messages`` of llama-stack 0.2.2, converted to raw messages."""
    from llama_stack.apis.inference import ChatCompletionRequest, ToolConfig
    from llama_stack.models.llama.sku_list import resolve_model
    from llama_stack.providers.utils.inference.prompt_adapter import (
        chat_completion_request_to_messages,
        convert_request_to_raw,
    )

    config = {"tool_choice": tool_choice, "system_message_behavior": system_message_behavior}
    if tool_prompt_format:
        config["tool_prompt_format"] = tool_prompt_format
    request = ChatCompletionRequest(
        model=model,
        messages=[to_stack_message(m) for m in dialog],
        tools=[to_stack_tool(t) for t in tools],
        tool_config=ToolConfig(**config),
    )
    core_id = resolve_model(model).core_model_id.value  # what the meta-reference provider passes
    request.messages = chat_completion_request_to_messages(request, core_id)
    raw = asyncio.run(convert_request_to_raw(request))
    return raw


def ref_stack_tokens(
    dialog,
    tools,
    tool_choice="auto",
    tool_prompt_format=None,
    model="Llama3.2-3B-Instruct",
    system_message_behavior="append",
    replace: Callable[[list], list] | None = None,
) -> list[int]:
    """Token ids of the meta-reference path: tool augmentation, then the model family's chat format.

    ``replace`` may edit the augmented raw messages first (used to substitute our documented fix where the
    reference output is broken, so the rest of the prompt is still checked token for token)."""
    from llama_stack.providers.utils.inference.prompt_adapter import get_default_tool_prompt_format

    raw = ref_stack_messages(dialog, tools, tool_choice, tool_prompt_format, model, system_message_behavior)
    messages = raw.messages if replace is None else replace(raw.messages)
    fmt = raw.tool_config.tool_prompt_format or get_default_tool_prompt_format(model)
    family = "llama4" if "llama-4" in model.lower() else "llama3"
    return ref_stack_chat_format(family).encode_dialog_prompt(messages, fmt).tokens


# --- fake engine ---------------------------------------------------------------------------------------------


@dataclass
class FakeStreamChunk:
    token: int
    text: str
    final: Completion | None = None


@dataclass
class FakeEngine:
    """An engine whose replies are scripted: ``script(prompt_text, call_index) -> reply text``.

    Replies are tokenized with the real tokenizer; a reply may contain special-token names (they are
    mapped to their ids), and a trailing stop-token name sets the stop reason.
    """

    script: Callable[[str, int], str]
    family: str = "llama4"
    model_id: str | None = None
    calls: list[list[str]] = field(default_factory=list)
    sampling: list[dict[str, Any]] = field(default_factory=list)
    stream_special_names: bool = True  # the real engine streams special tokens by name; False sends ""

    def __post_init__(self) -> None:
        self.tokenizer = our_tokenizer(self.family)
        self.formatter = make_formatter(self.tokenizer, self.model_id, today=PINNED_DATE)
        self._n = 0

    def _tokens(self, text: str) -> tuple[list[int], str]:
        sp = self.tokenizer.special_tokens
        ids: list[int] = []
        stop = "out_of_tokens"
        rest = text
        while rest:
            idx = rest.find("<|")
            if idx < 0:
                ids += self.tokenizer.encode(rest)
                break
            end = rest.find("|>", idx)
            name = rest[idx : end + 2] if end >= 0 else ""
            if name in sp:
                ids += self.tokenizer.encode(rest[:idx])
                ids.append(sp[name])
                rest = rest[end + 2 :]
            else:
                ids += self.tokenizer.encode(rest[: idx + 2])
                rest = rest[idx + 2 :]
        if ids and ids[-1] in (self.tokenizer.eot_id, self.tokenizer.eos_id):
            ids, stop = ids[:-1], "end_of_turn"
        elif ids and ids[-1] == self.tokenizer.eom_id:
            ids, stop = ids[:-1], "end_of_message"
        return ids, stop

    def _complete(self, prompt: list[int]) -> Completion:
        text = self.script(self.tokenizer.decode(prompt), self._n)
        self._n += 1
        ids, stop = self._tokens(text)
        return Completion(text=self.tokenizer.decode(ids), tokens=ids, stop_reason=stop, prompt_tokens=len(prompt))

    def batch_completion(self, prompts: list[list[int]], **sampling: Any) -> list[Completion]:
        self.calls.append([self.tokenizer.decode(p) for p in prompts])
        self.sampling.append(sampling)
        return [self._complete(p) for p in prompts]

    def batch_chat_completion(self, dialogs: Sequence[Any], tools: Any = None, **kwargs: Any) -> list[Any]:
        """The one chat route the tool loop drives, made by the chat layer over ``batch_completion``."""
        return chat.batch_chat_completion(self, dialogs, tools, **kwargs)

    def stream_completion(self, prompt: list[int], **sampling: Any) -> Iterator[FakeStreamChunk]:
        self.calls.append([self.tokenizer.decode(prompt)])
        self.sampling.append(sampling)
        completion = self._complete(prompt)
        for tok in completion.tokens:
            special = self.tokenizer.is_special(tok)
            text = self.tokenizer.decode([tok]) if self.stream_special_names or not special else ""
            yield FakeStreamChunk(token=tok, text=text)
        stop_tok = {"end_of_turn": self.tokenizer.eot_id, "end_of_message": self.tokenizer.eom_id}.get(
            completion.stop_reason, completion.tokens[-1] if completion.tokens else 0
        )
        yield FakeStreamChunk(token=stop_tok, text="", final=completion)


def tool_call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(tool_name=name, arguments=arguments, call_id=f"call-{name}")
