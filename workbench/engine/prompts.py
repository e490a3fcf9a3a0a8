"""Checking and encoding prompt rows before anything reaches the runner: strings, token ids, text + image
lists and ``Prompt`` objects become token ids (and image tiles), and every row is checked against the
vocabulary and ``max_seq_len`` so a bad row fails with its index before any generation starts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from workbench.engine.interfaces import LoadedModel
from workbench.errors import ImageError, InputError, PromptTooLongError
from workbench.formats import Prompt
from workbench.models.cross_attention import ImageSet, image_spans
from workbench.models.llama32_vision import is_cross_attention_vision
from workbench.vision.images import is_image_item
from workbench.vision.preprocess import prepare_image
from workbench.vision.tiling_llama3 import tile_image

Content = str | Sequence[int] | Any  # Any: a formats.Prompt (token ids + images) from formatter.encode_prompt


def prepare_images(model: LoadedModel, images: Sequence[Any], ids: list[int], row: int) -> Any:
    """The prompt's images as one tile batch [n, 3, T, T] (checked against its ``<|patch|>`` tokens), or for
    Llama 3.2 Vision an :class:`~workbench.models.cross_attention.ImageSet` (checked against its ``<|image|>``s)."""
    if not images:
        return None
    if is_cross_attention_vision(model.args):
        return prepare_cross_attention_images(model, images, ids, row)
    vision = model.args.vision_args
    if vision is None:
        raise ImageError(model.formatter.chat.no_images_reason or "this model has no vision encoder")
    if any(im.layout.tile_size != vision.tile_size for im in images):
        raise InputError(
            f"prompt row {row} was tiled for another model; build it with this engine's formatter.encode_prompt"
        )
    tiles = torch.cat([prepare_image(im.image, vision.tile_size, layout=im.layout).tiles for im in images])
    patches = ids.count(model.tokenizer.special_tokens["<|patch|>"])
    if patches != tiles.shape[0] * vision.tokens_per_tile:
        raise InputError(
            f"prompt row {row} has {patches} <|patch|> tokens but its {len(images)} image(s) need "
            f"{tiles.shape[0] * vision.tokens_per_tile}; build image prompts with engine.formatter.encode_prompt"
        )
    return tiles


def prepare_cross_attention_images(model: LoadedModel, images: Sequence[Any], ids: list[int], row: int) -> ImageSet:
    """Llama 3.2 Vision: each image tiled (at most ``vision_max_num_chunks`` tiles of ``vision_chunk_size``), with
    the positions that see it (from the prompt's ``<|image|>`` tokens)."""
    chunk, max_chunks = model.args.vision_chunk_size, model.args.vision_max_num_chunks
    if any(im.layout.tile_size != chunk for im in images):
        raise InputError(
            f"prompt row {row} was tiled for another model; build it with this engine's formatter.encode_prompt"
        )
    image_id = model.tokenizer.special_tokens["<|image|>"]
    spans = image_spans(ids, image_id)
    if len(spans) != len(images):
        raise InputError(
            f"prompt row {row} has {len(spans)} <|image|> tokens but {len(images)} image(s); build "
            "image prompts with engine.formatter.encode_prompt"
        )
    tiled = [tile_image(im.image, chunk, max_chunks) for im in images]
    return ImageSet([t.tiles for t in tiled], [t.aspect_ratio for t in tiled], spans)


def encode_row(model: LoadedModel, content: Content, row: int) -> tuple[list[int], torch.Tensor | None]:
    """Token ids of one prompt row, and its image tiles when it is a Prompt with images."""
    if isinstance(content, (list, tuple)) and any(isinstance(c, str) or is_image_item(c) for c in content):
        content = model.formatter.encode_content(content)  # raw text + images
    if isinstance(content, Prompt):
        ids = check_ids(model, list(content.tokens), row)
        return ids, prepare_images(model, content.images, ids, row)
    return encode_content(model, content, row), None


def prompt_row(model: LoadedModel, prompt: Sequence[int] | Prompt, row: int) -> tuple[list[int], Any]:
    """A prompt the chat layer rendered (token ids, or a ``Prompt`` with images): its ids as they are (the
    formatter built them) and its images' tiles."""
    if isinstance(prompt, Prompt):
        ids = list(prompt.tokens)
        return ids, prepare_images(model, prompt.images, ids, row)
    return list(prompt), None


def encode_content(model: LoadedModel, content: Content, row: int) -> list[int]:
    if isinstance(content, str):
        return model.tokenizer.encode(content, bos=True)
    if isinstance(content, torch.Tensor):
        content = content.tolist()
    if isinstance(content, (list, tuple)):
        return check_ids(model, list(content), row)
    raise InputError(f"prompt row {row} is a {type(content).__name__}; give a string or a list of token ids")


def check_ids(model: LoadedModel, ids: list[Any], row: int) -> list[int]:
    vocab = model.args.vocab_size
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise InputError(
                f"prompt row {row} holds {t!r}, which is not a token id in 0..{vocab - 1}; "
                "pass token ids from engine.tokenizer.encode()"
            )
    return ids


def check_lengths(model: LoadedModel, prompts: list[list[int]], image_tiles: Sequence[Any] | None = None) -> None:
    """Every row non-empty and shorter than ``max_seq_len``; a :class:`PromptTooLongError` names the first row
    too long and carries all of them (``rows``)."""
    rows = [i for i, p in enumerate(prompts) if len(p) >= model.max_seq_len]
    for i, p in enumerate(prompts):
        if not p:
            raise InputError(f"prompt row {i} is empty; give at least one token (strings get a BOS token)")
        tiles = image_tiles[i] if image_tiles is not None else None
        if isinstance(tiles, ImageSet) and len(p) >= model.max_seq_len:
            raise PromptTooLongError(
                f"prompt row {i} has {len(p)} tokens ({len(tiles.tiles)} of them <|image|>) but max_seq_len is "
                f"{model.max_seq_len} (room is needed for at least one generated token); shorten the prompt or "
                f"load with max_seq_len > {len(p)}",
                rows=rows,
            )
        if tiles is not None and len(p) >= model.max_seq_len:
            vision = model.args.vision_args
            image_tokens = p.count(model.tokenizer.special_tokens["<|patch|>"])
            raise PromptTooLongError(
                f"prompt row {i} has {len(p)} tokens, {image_tokens} of them for its images ({tiles.shape[0]} "
                f"tiles of {vision.tokens_per_tile} tokens), but max_seq_len is {model.max_seq_len}; load with "
                f"max_seq_len > {len(p)}, or send fewer or smaller images (an image of at most "
                f"{vision.tile_size}x{vision.tile_size} pixels takes one tile)",
                rows=rows,
            )
        if len(p) >= model.max_seq_len:
            raise PromptTooLongError(
                f"prompt row {i} has {len(p)} tokens but max_seq_len is {model.max_seq_len} (room is needed "
                f"for at least one generated token); shorten the prompt or load with max_seq_len > {len(p)}",
                rows=rows,
            )
