"""Gated cross-attention layers of the Llama 3.2 Vision text decoder (Meta's ``text_model.cross_attention_layers``).

A 3.2 Vision decoder is a Llama 3 text model with ``vision_num_cross_attention_layers`` extra blocks spread
evenly over its depth (:func:`fusion_schedule`); each runs just *before* the self-attention layer it is paired
with.  A block attends from the text to the projected vision tokens of the row's images: queries and keys are
RMS-normalized per head (``q_norm``/``k_norm``), keys/values come from the vision tokens only, so they are
computed once per image set (:func:`image_state`) and reused for every prefill and decode step.  Both the
attention and the feed-forward branch are scaled by tanh of learned gates.

Which text position sees which image (:func:`image_spans`, Meta's ``create_vision_mask``): image ``i`` is seen
from its ``<|image|>`` token up to the next image's token; an image directly followed by another image is seen as
long as the following one; the last image to the end.  Within an image only its real tiles are keys (padding
tiles are not).  A position that sees no image at all — every position before the first ``<|image|>``, and
every position of a row without images — has its attention *and* feed-forward outputs zeroed
(``full_text_row_masked_out_mask``), so the block leaves it exactly unchanged and is skipped for it.

One difference from Meta's generator, by design: with two or more images it lets the last image be seen up to
the prompt's end only, so tokens it *generates* see no image; here the last image is seen to the end of the
sequence (as with one image, and as teacher-forced scoring of the whole sequence sees it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.args import ModelArgs
from workbench.models.distributed import model_parallel_size
from workbench.models.layers import ColumnParallel, RowParallel, divide
from workbench.models.transformer import FeedForward, RMSNorm


def fusion_schedule(n_layers: int, n_cross: int) -> list[int]:
    """Self-attention layers preceded by a cross-attention block: every k-th from the top, k = ceil(n / n_cross)."""
    if n_cross <= 0:
        return []
    step = math.ceil(n_layers / n_cross)
    return list(range(n_layers))[::-1][::step][:n_cross][::-1]


def image_spans(tokens: Sequence[int], image_token: int) -> list[tuple[int, int | None]]:
    """Per image, in prompt order, the positions ``[start, end)`` that see it (``end`` None: to the end)."""
    where = [i for i, t in enumerate(tokens) if t == image_token]
    if not where:
        return []
    spans: list[list[int | None]] = [[a, b] for a, b in zip(where, where[1:])] + [[where[-1], None]]
    later_end: int | None = None
    for span in reversed(spans):  # consecutive images: each is seen as long as the one after it
        assert span[0] is not None
        if span[1] is not None and span[1] == span[0] + 1:
            span[1] = later_end
        later_end = span[1]
    return [(int(a), b) for a, b in spans]  # type: ignore[arg-type]


@dataclass
class ImageSet:
    """One prompt's images for the cross-attention decoder: tiles per image ``[n_i, 3, T, T]``, their aspect
    ratios (rows, cols) and the positions that see each (:func:`image_spans` of the *whole* prompt)."""

    tiles: list[torch.Tensor]
    aspects: list[tuple[int, int]]
    spans: list[tuple[int, int | None]]

    def __post_init__(self) -> None:
        if not (len(self.tiles) == len(self.aspects) == len(self.spans)):
            raise ValueError(
                f"{len(self.tiles)} images, {len(self.aspects)} aspect ratios and {len(self.spans)} "
                "<|image|> tokens: each image needs one <|image|> token in the prompt"
            )

    @property
    def first_position(self) -> int:
        return min(start for start, _ in self.spans)

    def to_numpy(self) -> ImageSet:
        """The same set with numpy tiles: pickled by value (to send to model-parallel workers)."""
        return ImageSet([t.cpu().numpy() for t in self.tiles], list(self.aspects), list(self.spans))

    def to_torch(self) -> ImageSet:
        """The inverse of :meth:`to_numpy`."""
        return ImageSet([torch.as_tensor(t) for t in self.tiles], list(self.aspects), list(self.spans))


@dataclass
class ImageState:
    """The cross-attention keys/values of one row's images (per cross layer), computed once per image set."""

    keys: list[torch.Tensor]  # per cross layer [Hkv_local, S, D], k_norm applied
    values: list[torch.Tensor]  # per cross layer [Hkv_local, S, D]
    key_image: torch.Tensor  # long [S]: the image of each key, -1 for keys of padding tiles
    spans: list[tuple[int, int | None]]

    def visible(self, positions: torch.Tensor) -> torch.Tensor:
        """bool [T, S]: which keys each text position (``positions`` [T]) attends to."""
        starts = torch.tensor([s for s, _ in self.spans], device=positions.device)  # [I]
        ends = torch.tensor([e if e is not None else 2**62 for _, e in self.spans], device=positions.device)
        sees = (positions[:, None] >= starts) & (positions[:, None] < ends)  # [T, I]
        real = self.key_image >= 0
        return sees[:, self.key_image.clamp(min=0)] & real  # [T, S]


class CrossAttention(nn.Module):
    """Text queries against vision keys/values; heads split across ranks like the self-attention's."""

    def __init__(self, args: ModelArgs, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        mp = model_parallel_size()
        self.head_dim = args.dim // args.n_heads
        self.n_local_heads = divide(args.n_heads, mp, "n_heads")
        # with more ranks than KV heads each rank holds one (repeated) KV head, as in self-attention
        self.n_local_kv_heads = max(args.kv_heads // mp, 1)
        kv_out = self.n_local_kv_heads * self.head_dim * mp
        kw = dict(device=device, dtype=dtype)
        self.wq = ColumnParallel(args.dim, args.n_heads * self.head_dim, gather_output=False, **kw)
        self.wk = ColumnParallel(args.dim, kv_out, gather_output=False, **kw)
        self.wv = ColumnParallel(args.dim, kv_out, gather_output=False, **kw)
        self.wo = RowParallel(args.n_heads * self.head_dim, args.dim, **kw)
        self.q_norm = RMSNorm(self.head_dim, args.norm_eps, **kw)
        self.k_norm = RMSNorm(self.head_dim, args.norm_eps, **kw)

    def keys_values(self, vision: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``vision`` [S, D] -> keys, values [Hkv_local, S, head_dim] (keys RMS-normalized)."""
        seq = vision.shape[0]
        k = self.wk(vision).view(seq, self.n_local_kv_heads, self.head_dim).transpose(0, 1)
        v = self.wv(vision).view(seq, self.n_local_kv_heads, self.head_dim).transpose(0, 1)
        return self.k_norm(k), v

    def forward(
        self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, sees_any: torch.Tensor
    ) -> torch.Tensor:
        """``x`` [1, T, D], keys/values [Hkv, S, hd], ``visible`` bool [T, S], ``sees_any`` [T, 1] -> [1, T, D]."""
        seq = x.shape[1]
        q = self.q_norm(self.wq(x).view(1, seq, self.n_local_heads, self.head_dim)).transpose(1, 2)  # [1, H, T, hd]
        # a position that sees no image attends uniformly (Meta's zeroed mask row) and is zeroed after: no NaN
        mask = (visible | ~sees_any.bool())[None, None]  # [1, 1, T, S]
        out = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask, enable_gqa=True)
        out = out * sees_any  # [1, H, T, hd]
        return self.wo(out.transpose(1, 2).reshape(1, seq, -1))


class CrossAttentionTransformerBlock(nn.Module):
    """``x + tanh(gate_attn) * xattn(norm(x))``, then ``+ tanh(gate_ffwd) * ffn(norm(h))``, both zeroed where
    the position sees no image."""

    def __init__(self, args: ModelArgs, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.attention = CrossAttention(args, **kw)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, **kw)
        self.gate_attn = nn.Parameter(torch.empty(1, **kw), requires_grad=False)
        self.feed_forward = FeedForward(args.dim, args.dense_hidden_dim(), **kw)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, **kw)
        self.gate_ffwd = nn.Parameter(torch.empty(1, **kw), requires_grad=False)

    def forward(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """One row: ``x`` [1, T, D], its image keys/values [Hkv, S, hd] and ``visible`` bool [T, S] -> [1, T, D]."""
        sees_any = visible.any(dim=-1, keepdim=True).to(x.dtype)  # [T, 1]: full_text_row_masked_out_mask
        h = x + self.gate_attn.tanh() * self.attention(self.attention_norm(x), keys, values, visible, sees_any)
        ffn = self.feed_forward(self.ffn_norm(h)) * sees_any
        return h + self.gate_ffwd.tanh() * ffn


def image_state(
    layers: Sequence[CrossAttentionTransformerBlock], vision_tokens: torch.Tensor, images: ImageSet
) -> ImageState:
    """Keys/values of every cross layer for one row's images.

    ``vision_tokens`` [I, C, N, D] (the projection's output for the row's I images, C tiles each, padding tiles
    included); keys of padding tiles are kept (so shapes stay fixed) but never visible.
    """
    n_images, chunks, tokens, dim = vision_tokens.shape
    tile_real = torch.zeros(n_images, chunks, dtype=torch.bool, device=vision_tokens.device)
    for i, (rows, cols) in enumerate(images.aspects):
        tile_real[i, : rows * cols] = True
    owner = torch.arange(n_images, device=vision_tokens.device)[:, None].expand(n_images, chunks)
    key_image = torch.where(tile_real, owner, -1)[:, :, None].expand(-1, -1, tokens).reshape(-1)  # [S]
    flat = vision_tokens.reshape(-1, dim)  # [S, D]
    keys, values = [], []
    for layer in layers:
        k, v = layer.attention.keys_values(flat)
        keys.append(k)
        values.append(v)
    return ImageState(keys, values, key_image, list(images.spans))
