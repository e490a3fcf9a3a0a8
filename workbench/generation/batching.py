"""How a wave's rows are cut into prefill forwards: packed (text rows end to end, no padding) or padded
(rows with images, teacher-forced logits), each forward kept under a token budget.

Shared by the scheduler's prefill and :mod:`~workbench.generation.scoring`, which run the same packed
forwards.  The numbers behind the budgets are in docs/benchmarks.md (2026-11-30: "tighter prefill groups"
and "After cutting CPU prefill into ≤ 12 MB forwards").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch

from workbench.models.transformer import Transformer

# Keep each prefill forward below this many (padded) tokens to bound activation memory.
MAX_PREFILL_TOKENS = 16384
# A padded forward pads its rows to the longest: a row joins a group only while the padded total stays within
# this factor of the real tokens (+64).  Every padded token costs a full pass through the linears, so a
# tight factor with more, smaller forwards wins.
PREFILL_PAD_FACTOR = 1.25
# On CPU a packed forward keeps its widest activation (the feed-forward's hidden states) under this many bytes,
# by cutting the rows into several forwards: larger blocks get fresh pages from the OS on every allocation
# (glibc maps blocks over 32 MB anew, each page faulting on first touch), smaller ones reuse freed heap memory
# and stay in cache.  The linears run at full GEMM speed down to about CPU_PREFILL_MIN_TOKENS rows.
CPU_PREFILL_ACTIVATION_BYTES = 12 * 2**20
CPU_PREFILL_MIN_TOKENS = 512


def packed_token_limit(model: Transformer) -> int:
    """Tokens per packed prefill forward: MAX_PREFILL_TOKENS, and on CPU what keeps the widest activation under
    CPU_PREFILL_ACTIVATION_BYTES (at least CPU_PREFILL_MIN_TOKENS, for full-speed linears)."""
    if model.device.type != "cpu":
        return MAX_PREFILL_TOKENS
    args = model.args
    widest = max(args.dim, args.dense_hidden_dim(), args.moe_hidden_dim() if args.moe_args is not None else 0)
    per_token = widest * model.dtype.itemsize
    return max(CPU_PREFILL_MIN_TOKENS, min(MAX_PREFILL_TOKENS, CPU_PREFILL_ACTIVATION_BYTES // per_token))


def packed_groups(lengths: Sequence[int], limit: int) -> Iterator[list[int]]:
    """Rows in order, cut into packed forwards of at most ``limit`` tokens (a longer row alone)."""
    group: list[int] = []
    total = 0
    for i, length in enumerate(lengths):
        if group and total + length > limit:
            yield group
            group, total = [], 0
        group.append(i)
        total += length
    if group:
        yield group


class PackedBatch(NamedTuple):
    """One packed prefill forward: which ``rows`` it computes, their suffixes end to end (``tokens`` [1, N]), and
    per row the tokens computed (``lengths``), the position they start at (``starts``) and the cache ``slots``."""

    rows: list[int]
    tokens: torch.Tensor
    lengths: list[int]
    starts: list[int]
    slots: list[int]


def packed_batches(
    items: Sequence[tuple[int, Sequence[int]]], starts: Sequence[int], model: Transformer
) -> Iterator[PackedBatch]:
    """The packed forwards that compute ``items`` (slot, tokens) from ``starts`` (what a held prefix already
    covers), in order, each under :func:`packed_token_limit` tokens."""
    lengths = [len(tokens) - n for (_, tokens), n in zip(items, starts)]
    for group in packed_groups(lengths, packed_token_limit(model)):
        tokens = torch.tensor([[t for j in group for t in items[j][1][starts[j] :]]], device=model.device)  # [1, N]
        yield PackedBatch(
            group, tokens, [lengths[j] for j in group], [starts[j] for j in group], [items[j][0] for j in group]
        )


def padded_groups(order: Sequence[int], lengths: Sequence[int]) -> Iterator[list[int]]:
    """Rows ``order`` split into padded forwards of similar lengths, each under MAX_PREFILL_TOKENS padded tokens."""
    group: list[int] = []
    real = 0  # unpadded tokens in the group
    for i in sorted(order, key=lambda i: lengths[i]):
        padded = lengths[i] * (len(group) + 1)  # ascending order: the newcomer sets the width
        if group and (padded > MAX_PREFILL_TOKENS or padded > PREFILL_PAD_FACTOR * (real + lengths[i]) + 64):
            yield group
            group, real = [], 0
        group.append(i)
        real += lengths[i]
    if group:
        yield group


def padded(prompts: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """Token ids of ``prompts`` right-padded with zeros to the longest: [b, T] on ``device``."""
    width = max(len(p) for p in prompts)
    tokens = torch.zeros((len(prompts), width), dtype=torch.long)
    for j, p in enumerate(prompts):
        tokens[j, : len(p)] = torch.tensor(p, dtype=torch.long)
    return tokens.to(device)  # [b, T]
