"""The engine's ``formatter``: dialogs (with or without tools) to token ids, and replies back to messages."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence
from typing import Any

from workbench.errors import InputError
from workbench.formats.calls import normalize_tool_prompt_format
from workbench.formats.chat_format import ChatFormat, ImageTokens, Prompt, content_items
from workbench.formats.models import ModelInfo, resolve_model
from workbench.formats.parser import parse_assistant
from workbench.formats.tool_prompts import TodayLike, augment_llama3_1, augment_llama3_2
from workbench.formats.tool_specs import coerce_tools
from workbench.formats.tooldefs import ToolDefinition
from workbench.types import Message

DialogLike = Sequence[Message | dict[str, Any]]


def coerce_messages(messages: Any) -> list[Message]:
    """A dialog as a list of :class:`Message` (dicts accepted; role ``ipython`` becomes ``tool``); a bare string
    is one user message."""
    if isinstance(messages, (str, Message, dict)):
        messages = [messages if not isinstance(messages, str) else {"role": "user", "content": messages}]
    if not isinstance(messages, (list, tuple)):
        raise InputError(
            f"a dialog must be a list of messages like [{{'role': 'user', 'content': '...'}}], "
            f"got {type(messages).__name__}"
        )
    out = []
    for i, raw in enumerate(messages):
        try:
            message = Message.coerce(_plain(raw))
            content_items(message.content)  # content is checked here too, so the error can name the message
        except InputError as exc:
            raise InputError(f"message {i}: {exc}") from None
        out.append(dataclasses.replace(message, role="tool") if message.role == "ipython" else message)
    return out


def _plain(message: Any) -> Any:
    """Pydantic message objects of other stacks (llama-stack, llama-models) as plain dicts."""
    if isinstance(message, (Message, dict)) or not hasattr(message, "model_dump"):
        return message
    data = message.model_dump(mode="json")
    content = data.get("content")
    if isinstance(content, dict):
        data["content"] = [content]
    return data


def normalize_tool_choice(tool_choice: Any, tools: Sequence[ToolDefinition]) -> str:
    """``auto`` | ``required`` | ``none`` | the name of one of ``tools`` (enum members accepted).

    Dicts: OpenAI's ``{"type": "function", "function": {"name": ...}}``, ``{"type": "function", "name": ...}``
    and ``{"type": "auto" | "required" | "none"}``.
    """
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, enum.Enum):
        tool_choice = tool_choice.value
    if isinstance(tool_choice, dict):
        tool_choice = _tool_choice_from_dict(tool_choice)
    if not isinstance(tool_choice, str):
        raise InputError(f"tool_choice must be 'auto', 'required', 'none' or a tool name, got {tool_choice!r}")
    if tool_choice in ("auto", "none"):
        return tool_choice
    if not tools:
        raise InputError(f"tool_choice={tool_choice!r} needs tools; pass tools=[...] or use tool_choice='auto'")
    if tool_choice == "required":
        return tool_choice
    names = [t.tool_name for t in tools]
    if tool_choice not in names:
        raise InputError(f"tool_choice {tool_choice!r} is not one of the tools: {', '.join(names)}")
    return tool_choice


_TOOL_CHOICE_FORM = "{'type': 'function', 'function': {'name': 'TOOL'}}"


def _tool_choice_from_dict(choice: dict[str, Any]) -> str:
    kind = choice.get("type", "function")
    if kind in ("auto", "required", "none") and set(choice) <= {"type"}:
        return kind
    if kind != "function":
        raise InputError(
            f"tool_choice['type'] is {kind!r}; use 'function' (as in {_TOOL_CHOICE_FORM}), 'auto', 'required' or 'none'"
        )
    if "function" in choice:
        fn = choice["function"]
        if not isinstance(fn, dict):
            raise InputError(
                f"tool_choice['function'] must be a dict with a 'name', got {fn!r:.80}; write {_TOOL_CHOICE_FORM}"
            )
        name = fn.get("name")
        field = "tool_choice['function']['name']"
    else:
        name = choice.get("name")
        field = "tool_choice['name']"
    if not isinstance(name, str) or not name:
        raise InputError(
            f"{field} must be a tool name (a non-empty string), got {name!r:.80}; write {_TOOL_CHOICE_FORM}"
        )
    return name


class Formatter:
    """Prompt rendering and reply parsing for one tokenizer and model.

    ``model_id`` selects the tool-prompt style (Llama 3.1 vs 3.2/3.3/4); None infers it from the tokenizer
    family.  ``today`` pins the date written into Llama 3.1 tool prompts (a date, a string, or a callable);
    by default it is the current date, as in the reference.  ``vision_args`` (a Llama 4 checkpoint's
    :class:`~workbench.models.args.VisionArgs`) enables images in messages, tiled into at most
    ``max_image_tiles`` tiles (Meta's default 16); ``cross_attention_tiles`` (a Llama 3.2 Vision checkpoint's
    ``vision_chunk_size``, ``vision_max_num_chunks``) enables them as one ``<|image|>`` token each.
    """

    def __init__(
        self,
        tokenizer: Any,
        model_id: str | None = None,
        *,
        today: TodayLike = None,
        vision_args: Any = None,
        max_image_tiles: int = 16,
        cross_attention_tiles: tuple[int, int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.model: ModelInfo = resolve_model(model_id, getattr(tokenizer, "family", "llama3"))
        family = getattr(tokenizer, "family", "llama3")
        image_tokens, reason = None, None
        if family != "llama4" and cross_attention_tiles is not None:  # Llama 3.2 Vision: (chunk size, max chunks)
            image_tokens = ImageTokens(cross_attention_tiles[0], 1, cross_attention_tiles[1], cross_attention=True)
        elif family != "llama4":
            reason = (
                "this Llama 3 model is text-only: images need a Llama 3.2 Vision checkpoint (vision_chunk_size "
                "in params.json) or a Llama 4 one with vision_args"
            )
        elif vision_args is None:
            reason = (
                "this Llama 4 checkpoint is text-only: its params.json has no vision_args (no vision encoder); "
                "load a checkpoint with vision weights, such as Llama-4-Scout-17B-16E-Instruct"
            )
        else:
            image_tokens = ImageTokens(vision_args.tile_size, vision_args.tokens_per_tile, max_image_tiles)
        self.chat = ChatFormat(tokenizer, image_tokens, no_images_reason=reason)
        self.family = self.chat.family
        self.today = today

    def __repr__(self) -> str:
        return (
            f"Formatter(family={self.family!r}, model={self.model_id!r}, tool_style={self.model.tool_style!r}, "
            f"default_tool_prompt_format={self.default_tool_prompt_format!r})"
        )

    @property
    def default_tool_prompt_format(self) -> str:
        """The call syntax used when tools are given and ``tool_prompt_format`` is None."""
        return self.model.default_tool_prompt_format

    def prepare_dialog(
        self,
        messages: DialogLike,
        tools: Iterable[Any] | None = None,
        tool_choice: Any = "auto",
        tool_prompt_format: Any = None,
        *,
        system_message_behavior: str = "append",
        today: TodayLike = None,
    ) -> tuple[list[Message], str]:
        """The messages actually sent (tool prompts merged in) and the call syntax used for assistant turns.

        Without tools this is the dialog as given and ``json`` (as ``ChatFormat.encode_dialog_prompt``);
        with tools, the llama-stack meta-reference augmentation for the model's generation.  Tools are checked
        here unless they come as a :class:`~.tool_specs.ToolSet` (the chat layer checks a call's tools once and
        renders every dialog of the call with the same ToolSet).
        """
        msgs = coerce_messages(messages)
        defs = coerce_tools(tools)  # a ToolSet as it is: checked once per call, not once per dialog
        choice = normalize_tool_choice(tool_choice, defs)
        fmt = normalize_tool_prompt_format(tool_prompt_format)
        if not defs:
            return msgs, fmt or "json"
        style = self.model.tool_style
        fmt = fmt or self.default_tool_prompt_format
        if style is None:
            raise InputError(
                f"model {self.model_id!r} was not trained for tool calling; use a Llama 3.1+ instruct model "
                "(or pass model='Llama3.2-3B-Instruct' etc. to wb.load)"
            )
        if style == "llama3_1":
            return augment_llama3_1(msgs, defs, choice, fmt, self.today if today is None else today), fmt
        return augment_llama3_2(msgs, defs, choice, fmt, system_message_behavior), fmt

    def encode_dialog(
        self,
        messages: DialogLike,
        tools: Iterable[Any] | None = None,
        tool_choice: Any = "auto",
        tool_prompt_format: Any = None,
        *,
        system_message_behavior: str = "append",
        today: TodayLike = None,
    ) -> list[int]:
        """Token ids of the dialog, ending with the open assistant header the model completes."""
        return self.encode_prompt(
            messages,
            tools,
            tool_choice,
            tool_prompt_format,
            system_message_behavior=system_message_behavior,
            today=today,
        ).tokens

    def encode_prompt(
        self,
        messages: DialogLike,
        tools: Iterable[Any] | None = None,
        tool_choice: Any = "auto",
        tool_prompt_format: Any = None,
        *,
        system_message_behavior: str = "append",
        today: TodayLike = None,
    ) -> Prompt:
        """Like :meth:`encode_dialog`, plus the dialog's images (opened and tiled) in prompt order."""
        msgs, fmt = self.prepare_dialog(
            messages,
            tools,
            tool_choice,
            tool_prompt_format,
            system_message_behavior=system_message_behavior,
            today=today,
        )
        return self.chat.encode_prompt(msgs, fmt)

    def encode_content(self, content: Any) -> Prompt:
        """A completion prompt from raw content (a string, or a list of text and image items): BOS, then the
        items with no chat headers (Meta's ``ChatFormat.encode_content``)."""
        return self.chat.encode_raw(content)

    def render(
        self,
        messages: DialogLike,
        tools: Iterable[Any] | None = None,
        tool_choice: Any = "auto",
        tool_prompt_format: Any = None,
        **kwargs: Any,
    ) -> str:
        """The prompt of :meth:`encode_dialog` as text (special tokens shown by name), for inspection."""
        return self.tokenizer.decode(self.encode_dialog(messages, tools, tool_choice, tool_prompt_format, **kwargs))

    def encode_message(self, message: Message | dict[str, Any], tool_prompt_format: Any = None) -> list[int]:
        """Token ids of one message (header to end marker)."""
        fmt = normalize_tool_prompt_format(tool_prompt_format) or "json"
        return self.chat.encode_message(Message.coerce(message), fmt)

    def decode_assistant(self, text: str, stop_reason: str | None = None) -> Message:
        """Parse a reply's text into an assistant :class:`Message` with every tool call (never raises)."""
        return parse_assistant(text, stop_reason)

    def decode_assistant_tokens(self, tokens: Sequence[int], stop_reason: str | None = None) -> Message:
        """Parse generated token ids (stop token excluded or included) into an assistant message."""
        return parse_assistant(self.tokenizer.decode(list(tokens)), stop_reason)


def make_formatter(
    tokenizer: Any,
    model_id: str | None = None,
    *,
    today: TodayLike = None,
    vision_args: Any = None,
    max_image_tiles: int = 16,
    cross_attention_tiles: tuple[int, int] | None = None,
) -> Formatter:
    """The formatter for an engine: chat tokens from ``tokenizer.family``, tool prompts from ``model_id``, images
    when ``vision_args`` (Llama 4) or ``cross_attention_tiles`` (Llama 3.2 Vision: chunk size, max chunks) is given."""
    return Formatter(
        tokenizer,
        model_id,
        today=today,
        vision_args=vision_args,
        max_image_tiles=max_image_tiles,
        cross_attention_tiles=cross_attention_tiles,
    )
