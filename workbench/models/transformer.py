"""The Llama 3.x / Llama 4 text transformer on fairscale's model-parallel layers.

One module family serves both generations: Llama 3 is the special case with dense feed-forwards,
RoPE everywhere and global attention.  Llama 4 adds sigmoid top-k MoE with a shared expert
(interleaved with dense layers), NoPE layers with attention-temperature tuning, weightless QK-norm on
RoPE layers and chunked local attention on RoPE layers.

Three entry points: :meth:`Transformer.forward_full` runs padded rows from position 0 (teacher-forced
scoring, image prompts), :meth:`Transformer.forward_packed` prefills rows laid end to end (no padding;
rows may continue cached prefixes), :meth:`Transformer.forward_decode` runs one token per row at
per-row positions against the KV cache.  Parameter names are Meta's module names, so a checkpoint in that
layout loads with ``load_state_dict`` directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.errors import ImageError, InputError
from workbench.models.args import ModelArgs
from workbench.models.distributed import model_parallel_size
from workbench.models.feed_forward import FeedForward, MoE
from workbench.models.kv_cache import KVCache
from workbench.models.layers import ColumnParallel, RowParallel, VocabParallel, divide
from workbench.models.rope import apply_rope, rope_frequencies, rope_tables
from workbench.models.vision import encode_tiles


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x), computed in float32 and cast back (Meta's numerics)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalize(x, self.eps) * self.weight


@dataclass
class StepContext:
    """Per-forward facts shared by all layers (computed once, not per layer)."""

    positions: torch.Tensor  # [B, T] absolute positions
    cos: torch.Tensor  # [B, T, D/2]
    sin: torch.Tensor  # [B, T, D/2]
    global_mask: torch.Tensor | None  # bool [B|1, 1, T, S]; None = plain causal over new tokens
    local_mask: torch.Tensor | None  # bool [B|1, 1, T, S] for chunked RoPE layers; None = same as global
    temperature: torch.Tensor | None  # [B, T, 1, 1] NoPE query scaling, None when tuning is off
    cache: KVCache | None
    cache_rows: torch.Tensor | None  # [B] cache slots written by a full pass
    decode: bool
    kv_len: int = 0  # keys read from the cache: positions 0..kv_len-1 (decode and extend)
    local_start: int = 0  # chunked layers read keys local_start..kv_len-1 only (decode)
    extend: bool = False  # rows continue after per-row cached prefixes (positions hold the offsets)
    segments: list[Segment] | None = None  # packed prefill: the rows laid end to end in one [1, N] sequence


@dataclass
class Segment:
    """One row of a packed prefill: its tokens are ``offset..offset+length-1`` of the packed sequence,
    at positions ``start..start+length-1`` of cache slot ``slot`` (which already holds ``0..start-1``)."""

    offset: int
    length: int
    start: int
    slot: int
    global_mask: torch.Tensor | None  # bool [1, 1, L, start+L]; None = plain causal (start 0)
    local_mask: torch.Tensor | None  # bool [1, 1, L, start+L] for chunked RoPE layers; None = as global


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        mp = model_parallel_size()
        self.layer_id = layer_id
        self.head_dim = args.rope_head_dim
        self.n_local_heads = divide(args.n_heads, mp, "n_heads")
        # With more ranks than KV heads each rank holds one (repeated) KV head.
        self.n_local_kv_heads = max(args.kv_heads // mp, 1)
        self.use_rope = not args.is_nope_layer(layer_id)
        self.use_qk_norm = args.use_qk_norm and self.use_rope
        self.norm_eps = args.norm_eps
        kv_out = self.n_local_kv_heads * self.head_dim * mp
        kw = dict(device=device, dtype=dtype)
        self.wq = ColumnParallel(args.dim, args.n_heads * self.head_dim, gather_output=False, **kw)
        self.wk = ColumnParallel(args.dim, kv_out, gather_output=False, **kw)
        self.wv = ColumnParallel(args.dim, kv_out, gather_output=False, **kw)
        self.wo = RowParallel(args.n_heads * self.head_dim, args.dim, **kw)

    def project_qkv(self, x: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of ``x`` [B, T, dim]: [B, T, Hq, D], [B, T, Hkv, D], [B, T, Hkv, D], with
        RoPE, QK-norm and the NoPE temperature applied (shared with the batch-invariant attention)."""
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_local_heads, self.head_dim)  # [B, T, Hq, D]
        xk = self.wk(x).view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)  # [B, T, Hkv, D]
        xv = self.wv(x).view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)  # [B, T, Hkv, D]
        if self.use_rope:
            xq, xk = apply_rope(xq, ctx.cos, ctx.sin), apply_rope(xk, ctx.cos, ctx.sin)
        if self.use_qk_norm:
            xq, xk = rms_normalize(xq, self.norm_eps), rms_normalize(xk, self.norm_eps)
        if ctx.temperature is not None and not self.use_rope:
            xq = (xq * ctx.temperature).to(xq.dtype)  # scales are float32: keep q in the model dtype
        return xq, xk, xv

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.project_qkv(x, ctx)
        if ctx.segments is not None:
            return self.wo(self._attend_segments(xq, xk, xv, ctx))
        q = xq.transpose(1, 2)  # [B, Hq, T, D]
        k = xk.transpose(1, 2)  # [B, Hkv, T, D]
        v = xv.transpose(1, 2)  # [B, Hkv, T, D]
        local = self.use_rope and ctx.local_mask is not None
        mask = ctx.local_mask if local else ctx.global_mask
        if ctx.cache is not None:
            cache_k, cache_v = ctx.cache.keys[self.layer_id], ctx.cache.values[self.layer_id]
            if ctx.decode:
                rows = torch.arange(bsz, device=x.device)
                pos = ctx.positions[:, 0]
                cache_k[rows, :, pos] = k[:, :, 0].to(cache_k.dtype)
                cache_v[rows, :, pos] = v[:, :, 0].to(cache_v.dtype)
                start = ctx.local_start if local else 0  # chunked layers: only keys some row's chunk holds
                k = cache_k[:bsz, :, start : ctx.kv_len].to(q.dtype)  # [B, Hkv, S, D]
                v = cache_v[:bsz, :, start : ctx.kv_len].to(q.dtype)
            elif ctx.extend:
                assert ctx.cache_rows is not None
                slot = ctx.cache_rows[:, None]  # [B, 1]
                pos = ctx.positions.clamp(max=cache_k.shape[2] - 1)  # [B, T]; padding past the end lands on junk
                cache_k[slot, :, pos] = xk.to(cache_k.dtype)  # [B, T, Hkv, D] into each row's own slot
                cache_v[slot, :, pos] = xv.to(cache_v.dtype)
                k = cache_k.index_select(0, ctx.cache_rows)[:, :, : ctx.kv_len].to(q.dtype)  # [B, Hkv, S, D]
                v = cache_v.index_select(0, ctx.cache_rows)[:, :, : ctx.kv_len].to(q.dtype)
            else:
                assert ctx.cache_rows is not None
                cache_k[:, :, :seqlen].index_copy_(0, ctx.cache_rows, k.to(cache_k.dtype))
                cache_v[:, :, :seqlen].index_copy_(0, ctx.cache_rows, v.to(cache_v.dtype))
        gqa = self.n_local_heads != self.n_local_kv_heads
        if gqa and seqlen == 1:
            # One query per row: fold each KV head's query heads into the query axis, [B, Hkv, G, D],
            # so attention reads every key once per KV head with G queries (1.6x faster decode
            # attention on CPU than enable_gqa at G=4); the mask [B|1, 1, 1, S] broadcasts over both.
            group = self.n_local_heads // self.n_local_kv_heads
            q = q.reshape(bsz, self.n_local_kv_heads, group, self.head_dim)  # [B, Hkv, G, D]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, Hkv, G, D]
            return self.wo(out.reshape(bsz, 1, -1))  # [B, 1, Hq*D]: heads in order h = kv * G + g
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=seqlen > 1, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)  # [B, Hq, T, D]
        out = out.transpose(1, 2).reshape(bsz, seqlen, -1)  # [B, T, Hq*D]
        return self.wo(out)

    def _attend_segments(self, xq: torch.Tensor, xk: torch.Tensor, xv: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Attention of a packed prefill, one row at a time: ``xq`` [1, N, Hq, D], ``xk``/``xv`` [1, N, Hkv, D]
        -> [1, N, Hq*D].  The linears ran on the N real tokens (no padding); only attention needs the
        rows apart, and each row attends to its own cached prefix and its own tokens."""
        assert ctx.cache is not None and ctx.segments is not None
        cache_k, cache_v = ctx.cache.keys[self.layer_id], ctx.cache.values[self.layer_id]
        gqa = self.n_local_heads != self.n_local_kv_heads
        outs = []
        for seg in ctx.segments:
            end = seg.start + seg.length
            rows = slice(seg.offset, seg.offset + seg.length)
            q = xq[:, rows].transpose(1, 2)  # [1, Hq, L, D]
            k = xk[:, rows].transpose(1, 2)  # [1, Hkv, L, D]
            v = xv[:, rows].transpose(1, 2)
            cache_k[seg.slot, :, seg.start : end] = k[0].to(cache_k.dtype)
            cache_v[seg.slot, :, seg.start : end] = v[0].to(cache_v.dtype)
            if seg.start:  # a cached prefix: attend to it as well
                k = cache_k[seg.slot : seg.slot + 1, :, :end].to(q.dtype)  # [1, Hkv, S, D]
                v = cache_v[seg.slot : seg.slot + 1, :, :end].to(q.dtype)
            mask = seg.local_mask if self.use_rope and seg.local_mask is not None else seg.global_mask
            if mask is None:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=seg.length > 1, enable_gqa=gqa)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)  # [1, Hq, L, D]
            outs.append(out[0].transpose(0, 1).reshape(seg.length, -1))  # [L, Hq*D]
        return torch.cat(outs)[None]  # [1, N, Hq*D]


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.attention = Attention(args, layer_id, **kw)
        if args.is_moe_layer(layer_id):
            self.feed_forward: nn.Module = MoE(args, **kw)
        else:
            self.feed_forward = FeedForward(args.dim, args.dense_hidden_dim(), **kw)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, **kw)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, **kw)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), ctx)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(
        self,
        args: ModelArgs,
        *,
        max_seq_len: int,
        device: torch.device | str = "meta",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.args = args
        self.max_seq_len = max_seq_len
        kw = dict(device=device, dtype=dtype)
        self.tok_embeddings = VocabParallel(args.vocab_size, args.dim, **kw)
        self.layers = nn.ModuleList(TransformerBlock(args, i, **kw) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps, **kw)
        self.output = ColumnParallel(args.dim, args.vocab_size, gather_output=True, **kw)
        self._rope_freqs = rope_frequencies(args.rope_head_dim, args.rope_theta, args.rope_scaling())
        self._rope_cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        # Vision weights (``vision_embeddings``, ``vision_projection``) are attached on first use: see attach_vision.
        self.vision_loader: Callable[[], nn.Module] | None = None
        self._decode_compiled: Any = None  # set by compile_decode()

    # ----------------------------------------------------------------------------- helpers
    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    def n_local_kv_heads(self) -> int:
        return self.layers[0].attention.n_local_kv_heads

    def new_cache(self, batch: int, seq_len: int, dtype: torch.dtype | None = None) -> KVCache:
        return KVCache.allocate(
            self.args.n_layers,
            batch,
            self.n_local_kv_heads(),
            seq_len,
            self.args.rope_head_dim,
            self.device,
            dtype or self.dtype,
        )

    def rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin tables at ``positions`` [B, T] (cached per device)."""
        device = positions.device
        if device not in self._rope_cache:
            self._rope_cache[device] = rope_tables(self._rope_freqs, self.max_seq_len + 1, device)
        cos, sin = self._rope_cache[device]
        return cos[positions], sin[positions]  # [B, T, D/2]

    def temperature_at(self, positions: torch.Tensor) -> torch.Tensor | None:
        """Llama 4's attention-temperature scales of NoPE layers at ``positions`` [B, T] (None when off)."""
        if not self.args.attn_temperature_tuning:
            return None
        pos = positions.float()
        scales = torch.log(torch.floor((pos + 1.0) / self.args.floor_scale) + 1.0) * self.args.attn_scale + 1.0
        return scales[:, :, None, None]  # [B, T, 1, 1]

    def _extend_context(
        self, tokens: torch.Tensor, starts: list[int], cache: KVCache, cache_rows: torch.Tensor
    ) -> StepContext:
        """Masks and positions for rows that continue cached prefixes of lengths ``starts``."""
        bsz, seqlen = tokens.shape
        device = tokens.device
        offsets = torch.tensor(starts, device=device)[:, None]  # [B, 1]
        positions = offsets + torch.arange(seqlen, device=device)[None, :]  # [B, T]
        kv_len = min(max(starts) + seqlen, cache.seq_len)
        cos, sin = self.rope_at(positions.clamp(max=self.max_seq_len))
        key_pos = torch.arange(kv_len, device=device)[None, None, :]  # [1, 1, S]
        # Padding queries past the cache end are masked as if at its last position: no all-masked rows
        # (they would turn into NaN keys/values, and NaN times a zero attention weight is still NaN).
        query_pos = positions.clamp(max=kv_len - 1)[:, :, None]  # [B, T, 1]
        causal = key_pos <= query_pos  # [B, T, S]
        local_mask = None
        chunk = self.args.attention_chunk_size
        if chunk is not None and kv_len > chunk:
            local_mask = (causal & (key_pos // chunk == query_pos // chunk))[:, None]  # [B, 1, T, S]
        return StepContext(
            positions,
            cos,
            sin,
            causal[:, None],
            local_mask,
            self.temperature_at(positions),
            cache,
            cache_rows,
            decode=False,
            kv_len=kv_len,
            extend=True,
        )

    def _packed_context(
        self, tokens: torch.Tensor, lengths: list[int], starts: list[int], cache: KVCache, cache_rows: list[int]
    ) -> StepContext:
        """Positions, RoPE tables and per-row masks of a packed prefill (``tokens`` [1, N])."""
        device = tokens.device
        chunk = self.args.attention_chunk_size
        segments, offset, pieces = [], 0, []
        for length, start, slot in zip(lengths, starts, cache_rows):
            end = start + length
            query_pos = torch.arange(start, end, device=device)  # [L]
            pieces.append(query_pos)
            key_pos = torch.arange(end, device=device)  # [S]
            causal = key_pos[None, :] <= query_pos[:, None]  # [L, S]
            local = None
            if chunk is not None and end > chunk:
                local = (causal & (key_pos[None, :] // chunk == query_pos[:, None] // chunk))[None, None]
            # a row from position 0 needs no global mask: SDPA's own causal mask is the same
            segments.append(Segment(offset, length, start, slot, causal[None, None] if start else None, local))
            offset += length
        positions = torch.cat(pieces)[None]  # [1, N]
        cos, sin = self.rope_at(positions)
        return StepContext(
            positions,
            cos,
            sin,
            None,
            None,
            self.temperature_at(positions),
            cache,
            None,
            decode=False,
            segments=segments,
        )

    @torch.inference_mode()
    def forward_packed(
        self, tokens: torch.Tensor, lengths: list[int], starts: list[int], cache: KVCache, cache_rows: list[int]
    ) -> torch.Tensor:
        """Prefill of rows laid end to end: ``tokens`` [1, N] (row ``b`` is ``lengths[b]`` tokens, to be
        placed at positions ``starts[b]..`` of cache slot ``cache_rows[b]``, whose positions
        ``0..starts[b]-1`` already hold its prefix) -> float32 logits of each row's last token [B, V].

        Why: a padded prefill runs every linear over its padding too, and on CPU the linears are the
        cost; here they run over the N real tokens only, and attention (cheap at these lengths) runs
        row by row.  Same arithmetic as :meth:`forward_full` per row.
        """
        ctx = self._packed_context(tokens, lengths, starts, cache, cache_rows)
        h = self.run_layers(self.embed(tokens), ctx)  # [1, N, D]
        ends = torch.tensor(lengths, device=h.device).cumsum(0) - 1  # [B] each row's last token
        return self._logits(h[0, ends])  # [B, V]

    @torch.inference_mode()
    def hidden_packed(
        self, tokens: torch.Tensor, lengths: list[int], starts: list[int], cache: KVCache, cache_rows: list[int]
    ) -> torch.Tensor:
        """:meth:`forward_packed` without the output projection: final hidden states of every packed token
        [N, D] (keys/values written alike).  Scoring projects only the positions it needs (:meth:`project`)."""
        ctx = self._packed_context(tokens, lengths, starts, cache, cache_rows)
        return self.run_layers(self.embed(tokens), ctx)[0]  # [N, D]

    @torch.inference_mode()
    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and output projection: hidden states [..., D] -> float32 logits [..., V]."""
        return self._logits(h)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings [..., D] (a hook: Llama 3.2 Vision embeds its image token differently)."""
        return self.tok_embeddings(tokens)

    def run_layers(self, h: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """The decoder layers over hidden states ``h`` (a hook: Llama 3.2 Vision interleaves cross-attention)."""
        for layer in self.layers:
            h = layer(h, ctx)
        return h

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(h)).float()

    # ----------------------------------------------------------------------------- vision
    @property
    def vision_loaded(self) -> bool:
        return "vision_embeddings" in self._modules

    def attach_vision(self, vision: nn.Module) -> None:
        """Register a loaded :class:`~workbench.models.vision.VisionModel`'s ``vision_embeddings`` and
        ``vision_projection`` as submodules (Meta's names), so they count in parameters and memory."""
        self.vision_embeddings = vision.vision_embeddings
        self.vision_projection = vision.vision_projection

    def ensure_vision(self) -> None:
        """Load the vision weights now if they are not loaded (through ``vision_loader``)."""
        if self.vision_loaded:
            return
        if self.args.vision_args is None or self.vision_loader is None:
            raise ImageError("this model has no vision encoder (params.json has no vision_args); it is text-only")
        self.attach_vision(self.vision_loader())

    @torch.inference_mode()
    def encode_images(self, tiles: torch.Tensor) -> torch.Tensor:
        """Normalized tiles [N, 3, T, T] -> one text embedding per ``<|patch|>`` token: [N, tokens_per_tile, D]."""

        self.ensure_vision()
        return encode_tiles(self.vision_embeddings, self.vision_projection, tiles.to(self.device))

    def _merge_images(
        self, h: torch.Tensor, tokens: torch.Tensor, images: Sequence[torch.Tensor | None], image_token: int
    ) -> torch.Tensor:
        """Replace the embeddings of each row's ``image_token`` positions by its images' patch embeddings."""
        rows = [b for b, tiles in enumerate(images) if tiles is not None]
        feats = self.encode_images(torch.cat([images[b] for b in rows])).to(h.dtype)  # [N, P, D]
        start = 0
        for b in rows:
            count = images[b].shape[0]
            row_feats = feats[start : start + count].reshape(-1, h.shape[-1])  # [count * P, D]
            start += count
            mask = tokens[b] == image_token  # [T]
            if int(mask.sum()) != row_feats.shape[0]:
                raise InputError(
                    f"prompt row {b} has {int(mask.sum())} <|patch|> tokens but its images give {row_feats.shape[0]} "
                    "patch embeddings; build image prompts with engine.formatter.encode_prompt"
                )
            h[b, mask] = row_feats
        return h

    # ----------------------------------------------------------------------------- forwards
    @torch.inference_mode()
    def forward_full(
        self,
        tokens: torch.Tensor,
        *,
        cache: KVCache | None = None,
        cache_rows: torch.Tensor | None = None,
        logit_index: torch.Tensor | None = None,
        images: Sequence[torch.Tensor | None] | None = None,
        image_token: int | None = None,
        starts: list[int] | None = None,
    ) -> torch.Tensor:
        """Whole sequences from position 0: ``tokens`` [B, T] -> float32 logits [B, T, V].

        With ``cache`` the keys/values are written to cache slots ``cache_rows`` [B] (prefill).
        With ``starts`` (one int per row) row ``b`` continues a prefix whose keys/values slot
        ``cache_rows[b]`` already holds at positions ``0..starts[b]-1``: its tokens sit at positions
        ``starts[b]..`` and attend to that prefix (shared-prefix prefill computes only the suffixes).
        With ``logit_index`` [B] only the logits at those (row-relative) positions are computed: [B, V].
        With ``images`` (per row: all its image tiles [n, 3, T, T] in prompt order, or None) the embeddings at
        the row's ``image_token`` (``<|patch|>``) positions are replaced by the encoded images.
        """
        bsz, seqlen = tokens.shape
        if starts is not None and max(starts) > 0:
            assert cache is not None and cache_rows is not None, "starts need the cache holding the prefixes"
            ctx = self._extend_context(tokens, starts, cache, cache_rows)
        else:
            positions = torch.arange(seqlen, device=tokens.device).expand(bsz, seqlen)  # [B, T]
            cos, sin = self.rope_at(positions)
            local_mask = None
            chunk = self.args.attention_chunk_size
            if chunk is not None and seqlen > chunk:
                idx = torch.arange(seqlen, device=tokens.device)
                local_mask = (idx[None, :] <= idx[:, None]) & (idx[None, :] // chunk == idx[:, None] // chunk)
                local_mask = local_mask[None, None]  # [1, 1, T, T]
            ctx = StepContext(
                positions, cos, sin, None, local_mask, self.temperature_at(positions), cache, cache_rows, decode=False
            )
        h = self.embed(tokens)  # [B, T, D]
        if images is not None and any(tiles is not None for tiles in images):
            assert image_token is not None, "images need the <|patch|> token id"
            h = self._merge_images(h, tokens, images, image_token)
        h = self.run_layers(h, ctx)
        if logit_index is not None:
            h = h[torch.arange(bsz, device=h.device), logit_index][:, None]  # [B, 1, D]
            return self._logits(h)[:, 0]  # [B, V]
        return self._logits(h)  # [B, T, V]

    @torch.inference_mode()
    def forward_decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, span: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """One token per cache slot 0..B-1: ``tokens``/``positions`` [B] -> float32 logits [B, V].

        ``span`` is (lowest, highest) position when the caller knows it (saves a device-to-host read);
        attention reads keys up to the highest live position only.
        """
        if span is None:
            host = positions.tolist()
            span = (min(host), max(host))
        low, high = span
        kv_len = high + 1  # no row needs keys past the furthest live position
        positions = positions[:, None]  # [B, 1]
        cos, sin = self.rope_at(positions)
        key_pos = torch.arange(kv_len, device=tokens.device)[None, :]  # [1, S]
        # Rows at one common position need no mask at all (keys 0..kv_len-1 are exactly theirs).
        global_mask = None if low == high else (key_pos <= positions)[:, None, None, :]  # [B, 1, 1, S]
        local_mask, local_start = None, 0
        chunk = self.args.attention_chunk_size
        if chunk is not None and kv_len > chunk:
            local_start = low - low % chunk  # keys before the earliest row's chunk are never read
            chunk_start = positions - positions % chunk  # [B, 1]
            local_pos = key_pos[:, local_start:]
            local_mask = ((local_pos <= positions) & (local_pos >= chunk_start))[:, None, None, :]  # [B, 1, 1, S']
        step = self._decode_compiled if self._decode_compiled is not None else self._decode_layers
        h = step(tokens, positions, cos, sin, global_mask, local_mask, cache, kv_len, local_start)  # [B, 1, D]
        return self._logits(h)[:, 0]  # [B, V]

    def forward_decode_static(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, span: int
    ) -> torch.Tensor:
        """A decode step with fixed shapes, as a CUDA graph needs (``workbench.generation.graphs``): ``tokens``
        [W], ``positions`` [W, 1] -> float32 logits [W, V].  Every row attends to keys ``0..span-1``, masked
        past its own position (and outside its chunk in chunked layers), so the shapes depend on ``W`` and
        ``span`` alone; masked keys add nothing, so the values are :meth:`forward_decode`'s."""
        cos, sin = self.rope_at(positions)
        key_pos = torch.arange(span, device=tokens.device)[None, :]  # [1, S]
        causal = key_pos <= positions  # [W, S]
        local_mask = None
        chunk = self.args.attention_chunk_size
        if chunk is not None:
            local_mask = (causal & (key_pos >= positions - positions % chunk))[:, None, None, :]  # [W, 1, 1, S]
        h = self._decode_layers(tokens, positions, cos, sin, causal[:, None, None, :], local_mask, cache, span, 0)
        return self._logits(h)[:, 0]  # [W, V]

    def _decode_layers(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        global_mask: torch.Tensor | None,
        local_mask: torch.Tensor | None,
        cache: KVCache,
        kv_len: int,
        local_start: int,
    ) -> torch.Tensor:
        """The transformer layers of one decode step (what ``compile_decode`` compiles): hidden states
        [B, 1, D].  The output projection stays outside: its packed CPU kernel is not traceable."""
        ctx = StepContext(
            positions,
            cos,
            sin,
            global_mask,
            local_mask,
            self.temperature_at(positions),
            cache,
            None,
            decode=True,
            kv_len=kv_len,
            local_start=local_start,
        )
        return self.run_layers(self.embed(tokens[:, None]), ctx)  # [B, 1, D]

    def compile_decode(self, enabled: bool = True) -> None:
        """Run decode steps through ``torch.compile`` (inductor; dynamic shapes, so the batch width and
        the attended key span vary without recompiling).  Compiles lazily on the first decode steps;
        ``Engine.compile_decode`` (``wb.load(compile=True)``) warms it up and times it.  Not CUDA graphs:
        the attended span grows every step, and a graph needs fixed shapes."""
        self._decode_compiled = torch.compile(self._decode_layers, dynamic=True) if enabled else None

    def use_fast_layouts(self, dtypes: tuple[torch.dtype, ...] | None = None) -> None:
        """Store tall float weights (out >= 2 x in: the output projection, w1/w3) column-major on CPU.

        Same values, same shapes and names; only the memory order changes.  MKL streams a matrix-vector
        or skinny product over a column-major ``[out, in]`` weight (a contiguous ``[in, out]``) about
        twice as fast as over a row-major one — and decode is exactly such products.  The output
        projection also gets a oneDNN-packed copy for products of several rows (batched decode), where
        MKL is slowest (see :meth:`ColumnParallel.pack_for_cpu`).  ``dtypes``: the weight dtypes to reorder
        (default all float types); without native bf16, torch's bf16 kernels are faster on row-major weights
        (:mod:`workbench.quantization.kernels` passes float32 only there).
        """
        if self.device.type != "cpu":
            return
        for module in self.modules():
            weight = getattr(module, "weight", None)
            if not isinstance(module, (ColumnParallel, RowParallel)) or not isinstance(weight, nn.Parameter):
                continue
            if dtypes is not None and weight.dtype not in dtypes:
                continue
            if weight.is_floating_point() and weight.is_contiguous() and weight.shape[0] >= 2 * weight.shape[1]:
                module.weight = nn.Parameter(weight.t().contiguous().t(), requires_grad=False)
        pack = getattr(self.output, "pack_for_cpu", None)
        if pack is not None:
            pack()

    def parameter_count(self) -> int:
        """Weights of the whole model (all ranks); quantized modules count the weights they stand for."""
        local = sum(p.numel() for p in self.parameters())
        local += sum(m.logical_numel() for m in self.modules() if hasattr(m, "logical_numel"))
        return local * model_parallel_size()
