"""A differentiable forward over the engine's own model modules, for training the demo model.

The engine's forwards are inference-only (``torch.inference_mode``, KV cache).  Training needs
gradients and one more trick: every dialog of a batch starts with the same system-prompt text, so
that shared prefix is run once (batch 1) and its keys/values are reused by every row, which roughly
halves a step.  The arithmetic is the engine's: the same parameters, RoPE tables, QK-norm, NoPE
temperature, chunked masks and the MoE module's own forward, so the trained weights mean the same
thing when the engine loads them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.rope import apply_rope
from workbench.models.transformer import Attention, Transformer, rms_normalize

KV = tuple[torch.Tensor, torch.Tensor]


def _attend(
    attn: Attention, model: Transformer, x: torch.Tensor, positions: torch.Tensor, past: KV | None
) -> tuple[torch.Tensor, KV]:
    """Attention of ``x`` [B, T, D] at ``positions`` [T] over ``past`` keys/values (batch 1) + its own."""
    bsz, seqlen, _ = x.shape
    xq = attn.wq(x).view(bsz, seqlen, attn.n_local_heads, attn.head_dim)  # [B, T, Hq, Dh]
    xk = attn.wk(x).view(bsz, seqlen, attn.n_local_kv_heads, attn.head_dim)  # [B, T, Hkv, Dh]
    xv = attn.wv(x).view(bsz, seqlen, attn.n_local_kv_heads, attn.head_dim)
    pos_b = positions.expand(bsz, seqlen)  # [B, T]
    if attn.use_rope:
        cos, sin = model.rope_at(pos_b)
        xq, xk = apply_rope(xq, cos, sin), apply_rope(xk, cos, sin)
    if attn.use_qk_norm:
        xq, xk = rms_normalize(xq, attn.norm_eps), rms_normalize(xk, attn.norm_eps)
    temperature = model.temperature_at(pos_b)
    if temperature is not None and not attn.use_rope:
        xq = xq * temperature
    q, k, v = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)  # [B, H, T, Dh]
    own = (k, v)
    if past is not None:
        k = torch.cat([past[0].expand(bsz, -1, -1, -1), k], dim=2)  # [B, Hkv, P+T, Dh]
        v = torch.cat([past[1].expand(bsz, -1, -1, -1), v], dim=2)
    key_pos = torch.arange(k.shape[2], device=x.device)  # [S]
    mask = key_pos[None, :] <= positions[:, None]  # [T, S]
    chunk = model.args.attention_chunk_size
    if chunk is not None and attn.use_rope:
        mask = mask & (key_pos[None, :] // chunk == positions[:, None] // chunk)
    gqa = attn.n_local_heads != attn.n_local_kv_heads
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None], enable_gqa=gqa)  # [B, Hq, T, Dh]
    return attn.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1)), own


def _layers(
    model: Transformer, h: torch.Tensor, positions: torch.Tensor, pasts: list[KV] | None
) -> tuple[torch.Tensor, list[KV]]:
    kvs = []
    for i, layer in enumerate(model.layers):
        out, kv = _attend(layer.attention, model, layer.attention_norm(h), positions, pasts[i] if pasts else None)
        h = h + out
        h = h + layer.feed_forward(layer.ffn_norm(h))
        kvs.append(kv)
    return h, kvs


def hidden_states(
    model: Transformer, tokens: torch.Tensor, shared_prefix: int = 0, embeddings: torch.Tensor | None = None
) -> torch.Tensor:
    """Final-norm hidden states [B, T, D] of ``tokens`` [B, T] (right-padded; padding only sees itself
    and what precedes it).  The first ``shared_prefix`` tokens must be identical in every row; they are
    computed once.  ``embeddings`` [V, D] replaces the model's table (spelled embeddings).
    """
    bsz, seqlen = tokens.shape
    device = tokens.device
    table = model.tok_embeddings.weight if embeddings is None else embeddings  # [V, D]

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, table)

    if shared_prefix > 0:
        prefix = tokens[:1, :shared_prefix]  # [1, P]
        h_prefix, pasts = _layers(model, embed(prefix), torch.arange(shared_prefix, device=device), None)
        suffix = tokens[:, shared_prefix:]  # [B, T-P]
        h_suffix, _ = _layers(model, embed(suffix), torch.arange(shared_prefix, seqlen, device=device), pasts)
        h = torch.cat([h_prefix.expand(bsz, -1, -1), h_suffix], dim=1)  # [B, T, D]
    else:
        h, _ = _layers(model, embed(tokens), torch.arange(seqlen, device=device), None)
    return model.norm(h)


def common_prefix_length(rows: list[list[int]]) -> int:
    """Length of the longest prefix shared by all ``rows``."""
    first = rows[0]
    n = min(len(r) for r in rows)
    for i in range(n):
        if any(r[i] != first[i] for r in rows[1:]):
            return i
    return n


def build_model(params: dict[str, Any], vocab_size: int, seed: int) -> Transformer:
    """The engine's Transformer over the compact vocabulary, initialised for training, tied embeddings."""
    ensure_model_parallel(1)
    args = ModelArgs.from_dict({**params, "vocab_size": vocab_size}, source="demo params")
    model = Transformer(args, max_seq_len=4096, device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.data = torch.ones_like(p)
        elif name == "tok_embeddings.weight":
            p.data = torch.randn(p.shape, generator=gen) / math.sqrt(args.dim)
        elif name.endswith(("experts.w1", "experts.w3", "experts.w2", "router_DE")):
            p.data = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-2])  # [.., in, out]
        else:
            p.data = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1])  # [out, in]
        if name.endswith(("wo.weight", "w2.weight", "experts.w2")):
            p.data /= math.sqrt(2 * args.n_layers)  # residual branches start small
        p.requires_grad_(True)
    model.output.weight = model.tok_embeddings.weight  # tied
    return model
