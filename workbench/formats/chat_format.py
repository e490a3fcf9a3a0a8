"""Token-level chat format of Llama 3 and Llama 4 (what goes between the special tokens).

A dialog is ``<|begin_of_text|>`` then, per message, a header (role between header tokens, then
``"\\n\\n"``), the content, any tool calls, and an end marker; it ends with an open assistant header
for the model to complete.  Each piece is tokenized separately (header role, ``"\\n\\n"``, every
content item, every tool call): the token boundaries are part of the format, so joining the strings
first would produce different ids.  Rules that differ by family:

* Llama 3: an assistant turn ends with ``<|eom_id|>`` only when its stop reason was end_of_message;
  everything else ends with ``<|eot_id|>``; a turn whose first call is a code-interpreter call starts
  with ``<|python_tag|>``.
* Llama 4: assistant turns with tool calls (or stop reason end_of_message) and all tool responses end
  with ``<|eom|>``; ``<|python_start|>``/``<|python_end|>`` are never written into prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import ImageError, InputError
from workbench.formats.calls import render_tool_call
from workbench.types import Message
from workbench.vision.images import is_image_item, open_image
from workbench.vision.layout import ImageLayout, image_layout

_TOKENS = {
    "llama3": {
        "header_start": "<|start_header_id|>",
        "header_end": "<|end_header_id|>",
        "eot": "<|eot_id|>",
        "eom": "<|eom_id|>",
    },
    "llama4": {"header_start": "<|header_start|>", "header_end": "<|header_end|>", "eot": "<|eot|>", "eom": "<|eom|>"},
}


@dataclass
class PromptImage:
    """An image placed in a prompt: the RGB PIL image and how it is tiled (which fixed its tokens)."""

    image: Any
    layout: ImageLayout


@dataclass
class Prompt:
    """A rendered dialog: token ids plus the images whose ``<|patch|>`` tokens it holds, in prompt order."""

    tokens: list[int]
    images: list[PromptImage] = field(default_factory=list)


@dataclass(frozen=True)
class ImageTokens:
    """What the chat format needs to lay out image tokens: tile side, tokens per tile, tile budget."""

    tile_size: int
    tokens_per_tile: int
    max_tiles: int = 16
    cross_attention: bool = False  # Llama 3.2 Vision: one <|image|> per image (images enter by cross-attention)


def content_items(content: Any) -> list[Any]:
    """The items of a message's content: strings, and image items (see :mod:`workbench.vision.images`) as given.

    Content is a string, one item, or a list of strings / ``{"type": "text"}`` items / image items.
    """
    if isinstance(content, str):
        return [content]
    items = content if isinstance(content, (list, tuple)) else [content]
    out: list[Any] = []
    for item in items:
        if isinstance(item, str) and not is_image_item(item):
            out.append(item)
        elif isinstance(item, dict) and item.get("type", "text") == "text" and isinstance(item.get("text"), str):
            out.append(item["text"])
        elif isinstance(getattr(item, "text", None), str) and getattr(item, "type", "text") == "text":
            out.append(item.text)
        elif is_image_item(item):
            out.append(_ImageRef(item))
        else:
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise InputError(
                f"message content item of type {kind!r} is not supported; give strings, {{'type': 'text', 'text': "
                "...}} items or images (PIL image, Path, bytes, data URL, {'type': 'image', 'image': ...})"
            )
    return out


@dataclass
class _ImageRef:
    """An image item not opened yet (opening happens only where images are allowed)."""

    item: Any


def content_text(content: Any, sep: str = "\n") -> str:
    """Content as one string (items joined by ``sep``), for places that paste it into a prompt (no images there)."""
    items = content_items(content)
    if any(isinstance(i, _ImageRef) for i in items):
        raise InputError(
            "images are not supported in this message (it is pasted into a tool prompt as text); "
            "put images in user messages"
        )
    return sep.join(items)


class ChatFormat:
    """Encodes messages into token ids for one tokenizer family (``tokenizer.family``)."""

    def __init__(
        self, tokenizer: Any, image_tokens: ImageTokens | None = None, *, no_images_reason: str | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.image_tokens = image_tokens
        self.no_images_reason = no_images_reason
        self.family = getattr(tokenizer, "family", "llama3")
        if self.family not in _TOKENS:
            raise InputError(f"unknown tokenizer family {self.family!r}; expected llama3 or llama4")
        names = _TOKENS[self.family]
        sp = tokenizer.special_tokens
        self.bos = sp["<|begin_of_text|>"]
        self.header_start = sp[names["header_start"]]
        self.header_end = sp[names["header_end"]]
        self.eot = sp[names["eot"]]
        self.eom = sp[names["eom"]]
        self.python_tag = sp.get("<|python_tag|>")

    def encode_header(self, role: str) -> list[int]:
        role = "ipython" if role in ("tool", "ipython") else role
        return [
            self.header_start,
            *self.tokenizer.encode(role, bos=False, eos=False),
            self.header_end,
            *self.tokenizer.encode("\n\n", bos=False, eos=False),
        ]

    def encode_content(self, content: Any, images: list[PromptImage] | None = None) -> list[int]:
        """Token ids of the content; opened images are appended to ``images``."""
        ids: list[int] = []
        for item in content_items(content):
            if isinstance(item, _ImageRef):
                image = self.place_image(item.item)
                if images is not None:
                    images.append(image)
                ids.extend(self.encode_image(image.layout))
            else:
                ids.extend(self.tokenizer.encode(item, bos=False, eos=False))
        return ids

    def place_image(self, item: Any) -> PromptImage:
        """Open an image item and plan its tiles (errors when this model takes no images)."""
        if self.image_tokens is None:
            raise ImageError(self.no_images_reason or "this model is text-only: it has no vision encoder")
        image = open_image(item)
        cfg = self.image_tokens
        return PromptImage(image, image_layout(image.width, image.height, cfg.tile_size, cfg.max_tiles))

    def encode_image(self, layout: ImageLayout) -> list[int]:
        """The image's tokens: ``<|image_start|>``, per tile ``<|patch|>`` x tokens_per_tile with
        ``<|tile_x_separator|>`` between columns and ``<|tile_y_separator|>`` after each row, then ``<|image|>``
        and the global thumbnail's patches, ``<|image_end|>``.  A single tile has no separators and no
        thumbnail: ``<|image_start|><|image|>`` patches ``<|image_end|>``."""
        assert self.image_tokens is not None
        sp = self.tokenizer.special_tokens
        if self.image_tokens.cross_attention:
            return [sp["<|image|>"]]
        patches = [sp["<|patch|>"]] * self.image_tokens.tokens_per_tile
        ids = [sp["<|image_start|>"]]
        if layout.rows * layout.cols > 1:
            for _ in range(layout.rows):
                for col in range(layout.cols):
                    ids.extend(patches)
                    if col < layout.cols - 1:
                        ids.append(sp["<|tile_x_separator|>"])
                ids.append(sp["<|tile_y_separator|>"])
        ids.append(sp["<|image|>"])
        ids.extend(patches)
        ids.append(sp["<|image_end|>"])
        return ids

    def encode_message(
        self, message: Message, tool_prompt_format: str, images: list[PromptImage] | None = None
    ) -> list[int]:
        role = "tool" if message.role in ("tool", "ipython") else message.role
        ids = self.encode_header(role)
        calls = message.tool_calls if role == "assistant" else []
        if self.family == "llama3" and calls and str(_name(calls[0])) == "code_interpreter":
            ids.append(self.python_tag)
        ids.extend(self.encode_content(message.content, images))
        for call in calls:
            ids.extend(self.tokenizer.encode(render_tool_call(call, tool_prompt_format), bos=False, eos=False))
        stop = _stop_value(message.stop_reason)
        if self.family == "llama4":
            eom = (role == "assistant" and (stop == "end_of_message" or bool(calls))) or role == "tool"
        else:
            eom = role == "assistant" and stop == "end_of_message"
        ids.append(self.eom if eom else self.eot)
        return ids

    def encode_raw(self, content: Any) -> Prompt:
        """Plain content (text and images, no chat headers) after ``<|begin_of_text|>``: a completion prompt."""
        images: list[PromptImage] = []
        ids = [self.bos, *self.encode_content(content, images)]
        return Prompt(ids, images)

    def encode_dialog(self, messages: Sequence[Message], tool_prompt_format: str) -> list[int]:
        return self.encode_prompt(messages, tool_prompt_format).tokens

    def encode_prompt(self, messages: Sequence[Message], tool_prompt_format: str) -> Prompt:
        """The dialog's token ids and its images in prompt order."""
        images: list[PromptImage] = []
        ids = [self.bos]
        for message in messages:
            ids.extend(self.encode_message(message, tool_prompt_format, images))
        ids.extend(self.encode_header("assistant"))
        return Prompt(ids, images)


def _name(call: Any) -> str:
    name = call.tool_name
    return getattr(name, "value", name)


def _stop_value(stop: Any) -> str | None:
    return getattr(stop, "value", stop)
