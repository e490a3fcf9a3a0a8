"""The Llama 3.2 Vision text decoder: a Llama 3 :class:`Transformer` with gated cross-attention layers.

Meta's checkpoint names it ``text_model.*`` (``tok_embeddings``, ``learnable_embedding``, ``layers``,
``cross_attention_layers``, ``norm``, ``output``) next to ``vision_model.*``.  This module *is* the text model
(the loader strips the ``text_model.`` prefix, exactly as the Llama 4 loader renames fused keys), so everything
that drives a :class:`Transformer` — the scheduler's packed/padded prefill and decode, the KV cache, prefix
reuse, compilation, memory reports — drives it unchanged.  The vision model (``vision_model.*``) is loaded on
the first image, as for Llama 4, and registered as ``vision_model``.

What it adds:

* ``<|image|>`` tokens (and any id past the vocabulary, Meta's rule) embed from ``learnable_embedding``;
* per row, an :class:`~workbench.models.cross_attention.ImageState` (the cross-attention keys/values of the
  row's images) is computed once when the row is prefilled with images, kept per cache slot, and read by every
  later decode step of that slot;
* the cross-attention block paired with a self-attention layer runs before it, for the rows and positions that
  see an image; a forward where no row sees an image (text-only inference) skips them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from workbench.errors import ImageError
from workbench.models.args import ModelArgs
from workbench.models.cross_attention import (
    CrossAttentionTransformerBlock,
    ImageSet,
    ImageState,
    fusion_schedule,
    image_state,
)
from workbench.models.distributed import model_parallel_size
from workbench.models.layers import VocabParallel
from workbench.models.transformer import StepContext, Transformer
from workbench.models.vision_llama3 import stack_tiles

LLAMA32_VISION_DEFAULT_NAME = "Llama3.2-11B-Vision-Instruct"  # the prompt format of a nameless 3.2 Vision checkpoint
IMAGES_PER_ENCODER_FORWARD = 8
LLAMA3_SPECIAL_TOKENS = 256  # bounds the encoder's activation memory; images never attend to each other


def is_cross_attention_vision(args: ModelArgs) -> bool:
    """Llama 3.2 Vision params.json: ``vision_chunk_size`` > 0 (Meta's test for building the vision model)."""
    return args.family == "llama3" and args.vision_chunk_size > 0


def cross_attention_layer_count(args: ModelArgs) -> int:
    """``vision_num_cross_attention_layers``, or the nested ``vision_model.cross_attention_adapter.num_layers``."""
    nested = (args.vision_model or {}).get("cross_attention_adapter", {}) if isinstance(args.vision_model, dict) else {}
    if isinstance(nested, dict) and "num_layers" in nested:
        return int(nested["num_layers"])
    return args.vision_num_cross_attention_layers


class CrossAttentionTextModel(Transformer):
    def __init__(
        self,
        args: ModelArgs,
        *,
        max_seq_len: int,
        device: torch.device | str = "meta",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(args, max_seq_len=max_seq_len, device=device, dtype=dtype)
        kw = dict(device=device, dtype=dtype)
        self.learnable_embedding = VocabParallel(max(model_parallel_size(), 8), args.dim, **kw)
        self.schedule = fusion_schedule(args.n_layers, cross_attention_layer_count(args))
        self.cross_attention_layers = nn.ModuleList(CrossAttentionTransformerBlock(args, **kw) for _ in self.schedule)
        self._cross_of = {layer: k for k, layer in enumerate(self.schedule)}
        # <|image|>: the 12th of the 256 special tokens after the base vocabulary in every Llama 3 tokenizer
        self.image_token: int | None = args.vocab_size - LLAMA3_SPECIAL_TOKENS + 11 if args.vocab_size > 0 else None
        self.vision_loader: Callable[[], nn.Module] | None = None
        self._slot_states: dict[int, ImageState] = {}  # cache slot -> its row's image keys/values
        self._row_states: list[ImageState | None] | None = None  # the rows of the padded forward running now

    # ----------------------------------------------------------------------------- embeddings
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings; ``<|image|>`` and ids past the vocabulary come from ``learnable_embedding``."""
        vocab = self.args.vocab_size
        ids = tokens if self.image_token is None else torch.where(tokens == self.image_token, vocab, tokens)
        extra = ids >= vocab  # [B, T]
        base = self.tok_embeddings(ids.clamp(max=vocab - 1))  # [B, T, D]
        learned = self.learnable_embedding((ids - vocab).clamp(min=0, max=self.learnable_embedding.num_embeddings - 1))
        return torch.where(extra[..., None], learned.to(base.dtype), base)

    # ----------------------------------------------------------------------------- vision
    @property
    def vision_loaded(self) -> bool:
        return "vision_model" in self._modules

    def attach_vision(self, vision: nn.Module) -> None:
        self.vision_model = vision

    def ensure_vision(self) -> None:
        if self.vision_loaded:
            return
        if self.vision_loader is None:
            raise ImageError("this Llama 3.2 Vision model has no vision loader; load it with wb.load(checkpoint)")
        self.attach_vision(self.vision_loader())

    @torch.inference_mode()
    def image_states(self, images: Sequence[ImageSet | None]) -> list[ImageState | None]:
        """Encode every row's images (a few images per encoder forward) and compute their cross-attention
        keys/values: one :class:`ImageState` per row with images."""
        self.ensure_vision()
        flat = [(b, i) for b, row in enumerate(images) if row is not None for i in range(len(row.tiles))]
        if not flat:
            return [None] * len(images)
        chunks = self.args.vision_max_num_chunks
        tokens = []
        for start in range(0, len(flat), IMAGES_PER_ENCODER_FORWARD):
            part = flat[start : start + IMAGES_PER_ENCODER_FORWARD]
            tiles = stack_tiles([images[b].tiles[i] for b, i in part], chunks).to(self.device)  # type: ignore[union-attr]
            aspects = [images[b].aspects[i] for b, i in part]  # type: ignore[union-attr]
            tokens.append(self.vision_model(tiles, aspects).to(self.dtype))  # [m, C, N, D]
        vision = torch.cat(tokens)  # [M, C, N, D]
        out: list[ImageState | None] = []
        offset = 0
        for row in images:
            if row is None:
                out.append(None)
                continue
            out.append(image_state(self.cross_attention_layers, vision[offset : offset + len(row.tiles)], row))
            offset += len(row.tiles)
        return out

    # ----------------------------------------------------------------------------- forwards
    @torch.inference_mode()
    def forward_full(
        self,
        tokens: torch.Tensor,
        *,
        cache: Any = None,
        cache_rows: torch.Tensor | None = None,
        logit_index: torch.Tensor | None = None,
        images: Sequence[Any] | None = None,
        image_token: int | None = None,
        starts: list[int] | None = None,
    ) -> torch.Tensor:
        """As :meth:`Transformer.forward_full`; ``images`` holds one :class:`ImageSet` (or None) per row.  With
        ``cache_rows`` the rows' image states stay with their cache slots for the decode steps that follow."""
        if image_token is not None:
            self.image_token = image_token  # the scheduler's <|image|> id
        states = None
        if images is not None and any(row is not None for row in images):
            for row in images:
                if row is not None and not isinstance(row, ImageSet):
                    raise ImageError(f"Llama 3.2 Vision takes images as ImageSet rows, got {type(row).__name__}")
            states = self.image_states(images)
        if cache_rows is not None:
            for b, slot in enumerate(cache_rows.tolist()):
                state = states[b] if states is not None else None
                if state is None:
                    self._slot_states.pop(slot, None)
                else:
                    self._slot_states[slot] = state
        self._row_states = states
        try:
            return super().forward_full(
                tokens, cache=cache, cache_rows=cache_rows, logit_index=logit_index, starts=starts
            )
        finally:
            self._row_states = None

    def _states_for(self, h: torch.Tensor, ctx: StepContext) -> list[tuple[int, ImageState, torch.Tensor]]:
        """(row, state, visible [T, S]) for the rows of this forward that see an image at some position."""
        if ctx.segments is not None:  # packed prefill: text rows only; their slots no longer hold images
            for seg in ctx.segments:
                self._slot_states.pop(seg.slot, None)
            return []
        if self._row_states is not None:
            states: Sequence[ImageState | None] = self._row_states
        elif ctx.decode:
            states = [self._slot_states.get(b) for b in range(h.shape[0])]
        else:
            return []
        out = []
        for b, state in enumerate(states):
            if state is None:
                continue
            visible = state.visible(ctx.positions[b])  # [T, S]
            if bool(visible.any()):
                out.append((b, state, visible))
        return out

    def run_layers(self, h: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Self-attention layers, each preceded by its cross-attention block for the rows that see images."""
        rows = self._states_for(h, ctx) if self.schedule else []
        for index, layer in enumerate(self.layers):
            k = self._cross_of.get(index)
            if k is not None and rows:
                block = self.cross_attention_layers[k]
                h = h.clone()
                for b, state, visible in rows:
                    h[b : b + 1] = block(h[b : b + 1], state.keys[k], state.values[k], visible)
            h = layer(h, ctx)
        return h

    def forget_images(self) -> None:
        """Drop every slot's image keys/values (their memory)."""
        getattr(self, "_slot_states", {}).clear()

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        """Moving or converting the model (``.to("meta")`` when the engine unloads) drops the image states."""
        self.forget_images()
        return super()._apply(fn, recurse)
