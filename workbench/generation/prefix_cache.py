"""What each KV-cache slot holds, and how new rows reuse it: the one owner of the slot records.

Each slot of the static KV cache remembers which tokens its keys/values hold at positions ``0..n-1`` (its
*record*: a prompt plus the generated tokens fed so far, kept after the row ends).  A new row whose tokens
start with tokens some slot holds copies those keys/values into its own slot (or simply lands in that slot)
and computes only the rest; rows of one wave that share a prefix nobody holds yet get it computed once
first.  Keys and values depend only on the tokens before them, so a reused prefix gives the same results as
recomputing it (up to float rounding in the attention sums).

The scheduler (generation) and :mod:`~workbench.generation.scoring` (teacher-forced log-probs) both fill
slots through this class, so a prefix one of them left behind serves the other.  The split follows
nano-vllm's block manager beside its scheduler: the scheduler decides which rows run; this class decides
where their keys/values come from and keeps the records honest.

The rule that keeps stale cache contents unread: a slot's record is cleared (:meth:`PrefixCache.prepare`,
:meth:`PrefixCache.truncate`) before anything writes into its prefix, and set (:meth:`PrefixCache.hold`)
only after the write completed.  An exception or ``KeyboardInterrupt`` mid-write therefore leaves a slot
that claims nothing (or less than it holds), never one that claims what it no longer holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from workbench.models.kv_cache import KVCache

# A common prefix shorter than this is recomputed: copying its keys/values would cost about as much.
MIN_SHARED_PREFIX = 16


class Resident(Protocol):
    """A slot's record: anything that says which tokens the slot's keys/values hold.

    A running row is its own record, so the tokens it feeds extend the record with no per-step work.
    """

    def held_tokens(self) -> list[int]:
        """Tokens whose keys/values the slot holds at positions 0..n-1."""
        ...


@dataclass(frozen=True)
class HeldTokens:
    """A fixed record: a finished write of ``tokens`` (a shared prefix, a scored row)."""

    tokens: list[int]

    def held_tokens(self) -> list[int]:
        return self.tokens


@dataclass(frozen=True)
class ReusePlan:
    """Where each item's keys/values come from: ``starts[k]`` positions of item ``k`` are already in its slot
    after ``copies`` ran, each ``(src, dst, n)`` copying positions ``0..n-1`` of slot ``src`` into ``dst``."""

    starts: list[int]
    copies: list[tuple[int, int, int]]


class PrefixCache:
    """The slot records of one KV cache, the reuse plans made from them, and the prefix copies.

    ``enabled`` (on by default) lets new rows reuse what slots hold, within a call and across calls; turned
    off, every row is computed whole (for comparisons) while the records stay exact, so turning it back on
    is safe.  ``stats`` counts computed and reused prefill tokens since construction (for benchmarks).
    """

    def __init__(self, cache: KVCache, *, enabled: bool = True) -> None:
        self.cache = cache
        self.enabled = enabled
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0}
        self._records: list[Resident | None] = [None] * cache.batch_size
        self._caps: list[int | None] = [None] * cache.batch_size  # a record ends here at the latest

    @property
    def slots(self) -> int:
        return len(self._records)

    # ----------------------------------------------------------------------------- records
    def held(self) -> dict[int, list[int]]:
        """slot -> the tokens its keys/values hold (only slots that hold something)."""
        out = {}
        for slot, record in enumerate(self._records):
            if record is not None:
                tokens = record.held_tokens()
                cap = self._caps[slot]
                if cap is not None:
                    tokens = tokens[:cap]
                if tokens:
                    out[slot] = tokens
        return out

    def hold(self, slot: int, record: Resident | Sequence[int], *, cap: int | None = None) -> None:
        """Record what ``slot`` holds, once its write completed: fixed tokens, or a running row (its tokens grow
        as it feeds them).  ``cap``: positions from here on hold something beyond token ids (image embeddings)
        and are never lent."""
        if isinstance(record, (list, tuple)):
            record = HeldTokens(list(record))
        self._records[slot] = record
        self._caps[slot] = cap

    def truncate(self, slot: int, length: int) -> None:
        """``slot`` is about to be written at position ``length`` (a decode step's padding row): its record ends
        there at the latest."""
        if self._records[slot] is not None:
            cap = self._caps[slot]
            self._caps[slot] = length if cap is None else min(cap, length)

    def forget(self) -> None:
        """Drop every record: the next rows are computed whole (cold-cache timings)."""
        self._records = [None] * self.slots
        self._caps = [None] * self.slots

    # ----------------------------------------------------------------------------- planning
    def assign(self, free: Sequence[int], prompts: Sequence[Sequence[int]]) -> list[int]:
        """A distinct slot of ``free`` for each prompt, preferring the slot that already holds its longest prefix
        (at least ``MIN_SHARED_PREFIX`` tokens, at most all but the last token)."""
        if not self.enabled:
            return list(free[: len(prompts)])
        held = self.held()
        candidates = [slot for slot in free if slot in held]
        assigned: list[int | None] = [None] * len(prompts)
        taken: set[int] = set()
        for j, prompt in enumerate(prompts):
            best, best_len = None, MIN_SHARED_PREFIX - 1
            for slot in candidates:
                if slot not in taken:
                    n = common_prefix(prompt, held[slot], len(prompt) - 1)
                    if n > best_len:
                        best, best_len = slot, n
            if best is not None:
                assigned[j] = best
                taken.add(best)
        rest = iter(slot for slot in free if slot not in taken)
        return [a if a is not None else next(rest) for a in assigned]

    def shared_prefixes(self, rows: Sequence[tuple[int, list[int]]]) -> list[tuple[int, list[int]]]:
        """Prefixes that several of ``rows`` (slot, tokens) share and no slot holds yet: (host slot, tokens) each.

        Rows sorted by content put rows with common prefixes next to each other; each run of neighbours
        sharing at least ``MIN_SHARED_PREFIX`` tokens gets its common prefix (never a row's last token)
        computed once, in the slot of its first member, which the others then copy from (:meth:`prepare`).
        """
        if not self.enabled or len(rows) < 2:
            return []
        order = sorted(range(len(rows)), key=lambda j: rows[j][1])
        held = list(self.held().values())
        out: list[tuple[int, list[int]]] = []
        run = [order[0]]
        shared = 0
        for prev, cur in zip(order, order[1:] + [None]):
            n = 0 if cur is None else common_prefix(rows[prev][1], rows[cur][1])
            if n >= MIN_SHARED_PREFIX:
                shared = n if len(run) == 1 else min(shared, n)
                run.append(cur)
                continue
            if len(run) > 1:
                length = min([shared] + [len(rows[j][1]) - 1 for j in run])
                prefix = rows[run[0]][1][:length]
                if length >= MIN_SHARED_PREFIX and not any(common_prefix(prefix, h) >= length for h in held):
                    out.append((rows[run[0]][0], prefix))
            run = [cur]
        return out

    def plan(self, items: Sequence[tuple[int, Sequence[int], int]]) -> ReusePlan:
        """For each item (slot, tokens, limit): the longest prefix of ``tokens`` (at most ``limit``) a slot holds.

        The item's own slot is reused at any length (no copy); another slot's prefix must reach
        ``MIN_SHARED_PREFIX`` to be copied.  Changes nothing.
        """
        starts = [0] * len(items)
        copies: list[tuple[int, int, int]] = []
        if not self.enabled:
            return ReusePlan(starts, copies)
        held = self.held()
        for k, (slot, tokens, limit) in enumerate(items):
            best, best_len = slot, 0
            own = held.get(slot)
            if own is not None:  # reusing the slot's own tokens costs no copy: any length pays
                best_len = common_prefix(tokens, own, limit)
            for src, held_tokens in held.items():
                if src != slot:
                    n = common_prefix(tokens, held_tokens, limit)
                    if n >= MIN_SHARED_PREFIX and n > best_len:
                        best, best_len = src, n
            starts[k] = best_len
            if best_len and best != slot:
                copies.append((best, slot, best_len))
        return ReusePlan(starts, copies)

    # ----------------------------------------------------------------------------- writing
    def prepare(self, items: Sequence[tuple[int, Sequence[int], int]]) -> list[int]:
        """Make each item's slot (slot, tokens, limit) start with the longest held prefix of its tokens and
        return how many positions each already holds; the caller computes the rest, then calls :meth:`hold`.

        The item slots' records are cleared before the copies write into them (their contents are about to
        change); all sources are read before any destination is written, so a slot may be both.
        """
        plan = self.plan(items)
        for slot, _, _ in items:
            self._records[slot] = None
            self._caps[slot] = None
        if plan.copies:
            self._copy(plan.copies)
        self.stats["prefill_tokens"] += sum(len(tokens) - n for (_, tokens, _), n in zip(items, plan.starts))
        self.stats["reused_tokens"] += sum(plan.starts)
        return plan.starts

    def _copy(self, copies: list[tuple[int, int, int]]) -> None:
        """Copy positions ``0..n-1`` of slot ``src`` into slot ``dst`` for every (src, dst, n), all layers."""
        device = self.cache.keys[0].device
        src = torch.tensor([c[0] for c in copies], device=device)
        dst = torch.tensor([c[1] for c in copies], device=device)
        width = max(c[2] for c in copies)  # positions past a row's own n are junk it overwrites or never reads
        for layer in self.cache.keys + self.cache.values:
            block = layer.index_select(0, src)[:, :, :width]  # [n, Hkv, width, D] (a copy)
            layer[:, :, :width].index_copy_(0, dst, block)


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (at most ``limit``).

    Binary search over slice comparisons: each comparison runs in C, so long prompts cost microseconds.
    """
    hi = min(len(a), len(b))
    if limit is not None:
        hi = min(hi, limit)
    if hi <= 0 or a[0] != b[0]:
        return 0
    a, b = list(a[:hi]), list(b[:hi])
    if a == b:
        return hi
    lo = 1  # a[:lo] == b[:lo] holds; a[:hi] == b[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
