"""Batched generation over a static KV cache with continuous batching and shared-prefix reuse.

Every prompt owns one cache slot while it runs.  New prompts are prefilled together (text prompts in
one packed forward, rows end to end with no padding; prompts with images in padded groups of similar
lengths), then all running rows decode one token per step at their own positions.  A row that stops
frees its slot; freed slots are refilled in batches (a wave waits until a quarter of the slots are
free) so prefill forwards stay wide.

Shared prefixes are computed once.  Each slot remembers which tokens its keys/values hold (its
*resident* tokens: a prompt plus the generated tokens fed so far, kept after the row ends).  A new
prompt that starts with tokens some slot holds copies those keys/values into its own slot (or simply
lands in that slot) and prefills only the rest; prompts of one wave that share a prefix nobody holds
yet get it computed once first.  Keys and values depend only on the tokens before them, so a reused
prefix gives the same tokens as recomputing it (up to float rounding in the attention sums).

Nothing here outlives a call except the cache and the resident records.  A slot's record is cleared
before anything writes into its prefix and set only after the write completed, and positions past a
row's own position are never attended to, so an exception or ``KeyboardInterrupt`` mid-batch leaves
the generator ready for the next call.

It runs over 500 lines because one class owns the cache slots: admission, prefix reuse, waves, per-row
cancel and the static (graphed) decode branch all change the same slot records, and splitting them would
split the invariants that keep stale cache contents unread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator as Generator_
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.generation.constraints import MaskRow
from workbench.generation.graphs import StaticDecode
from workbench.generation.sampling import SamplingParams, fast_argmax, sample_token
from workbench.models.transformer import Transformer
from workbench.types import StopReason, TokenLogprob

# Keep each prefill forward below this many (padded) tokens to bound activation memory.
MAX_PREFILL_TOKENS = 16384
# Text prompts are prefilled packed (rows end to end, no padding: ``Transformer.forward_packed``).
# Image prompts and teacher-forced scoring use padded forwards, which pad their rows to the longest: a
# row joins a group only while the padded total stays within this factor of the real tokens (+64).
# Every padded token costs a full pass through the linears (compute-bound on CPU), so a tight factor
# with more, smaller forwards wins: on bench/peers.py's workload (a) 1.25 pads 1.17x where 2 padded 1.49x.
PREFILL_PAD_FACTOR = 1.25
# On CPU a packed prefill forward keeps its widest activation (the feed-forward's hidden states) under this
# many bytes, by cutting the rows into several forwards.  Larger blocks get fresh pages from the OS on
# every allocation (glibc maps blocks over 32 MB anew, and each page faults on first touch), smaller ones
# reuse freed heap memory and stay in cache; the linears are at full GEMM speed down to ~512 rows.
# Prefill of bench/peers.py's workload (a), one process, one thread: d256 (64 prompts) 3.6 s with one
# 16384-token forward, ~2.9 s at 12 MB (3510 tokens); d1024 (32 prompts) 30.0-34.1 s, 25.2 s at 12 MB
# (877 tokens), 26.1 s at 8 MB, 30.5 s at 4 MB (292 tokens: too few rows for full GEMM speed).
CPU_PREFILL_ACTIVATION_BYTES = 12 * 2**20
CPU_PREFILL_MIN_TOKENS = 512
# A common prefix shorter than this is recomputed: copying its keys/values would cost about as much.
MIN_SHARED_PREFIX = 16


@dataclass
class Request:
    index: int
    prompt: list[int]
    params: SamplingParams
    constraint: Any = None  # a structured.Constraint: the row's output must follow its grammar
    # Llama 4: [n, 3, T, T], the prompt's images' tiles in <|patch|> order; Llama 3.2 Vision: an ImageSet
    image_tiles: Any = None
    # a RowCancel: once set, the row ends at the next step with stop_reason "cancelled" and frees its slot
    cancel: Any = None


class RowCancel:
    """Cancels one row of a running call (a disconnected client's stream) without stopping the others.

    A plain object, so a Request holding it still pickles; model-parallel workers get a copy (the engine
    then just drops the row's events until the call ends)."""

    __slots__ = ("flag",)

    def __init__(self) -> None:
        self.flag = False

    def set(self) -> None:
        self.flag = True

    def is_set(self) -> bool:
        return self.flag


@dataclass
class Event:
    """One generated token of request ``index``; ``stop_reason`` is set on the request's last event.

    A final event may carry ``token=None`` (stopped on a stop token or a stop string, nothing to add).
    """

    index: int
    token: int | None
    logprob: TokenLogprob | None = None
    stop_reason: StopReason | None = None
    truncate_text_at: int | None = None  # set when a stop string ended the row: cut text here


@dataclass
class _Row:
    request: Request
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    grammar: Any = None  # structured.RowConstraint of a constrained row
    fed: int = 0  # generated tokens whose keys/values are in the cache
    cap: int | None = None  # resident tokens end here at the latest (a decode step wrote junk past it)

    def resident(self) -> list[int]:
        """Tokens whose keys/values this row's slot holds at positions 0..n-1."""
        tokens = self.request.prompt + self.tokens[: self.fed] if self.fed else self.request.prompt
        return tokens if self.cap is None else tokens[: self.cap]

    @property
    def position(self) -> int:
        """Cache position of the last sampled token (the next one fed to the model)."""
        return len(self.request.prompt) + len(self.tokens) - 1


class Generator:
    """Runs requests through a model with a preallocated KV cache of ``max_batch_size`` slots.

    ``share_prefixes`` (on by default) reuses the keys/values of common prompt prefixes, within a
    call and across calls; turning it off recomputes every prompt whole (for comparisons).
    """

    def __init__(self, model: Transformer, *, stop_tokens: dict[int, StopReason], decode_text,
                 max_batch_size: int, max_seq_len: int, grammars: Any = None,
                 share_prefixes: bool = True, image_token: int | None = None) -> None:
        self.model = model
        self.grammars = grammars  # structured.GrammarRuntime (token masks of constrained rows), or None
        self.image_token = image_token  # <|patch|>: where prefill places image embeddings
        self.stop_tokens = stop_tokens
        self.decode_text = decode_text  # ids -> str, for stop strings and logprob labels
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.cache = model.new_cache(max_batch_size, max_seq_len)
        self.share_prefixes = share_prefixes
        self._resident: list[_Row | None] = [None] * max_batch_size  # what each slot's cache holds
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0}  # since construction (for benchmarks)
        self.static: StaticDecode | None = None  # fixed-shape (CUDA-graphed) decode steps, see use_static_decode

    def use_static_decode(self, enabled: bool = True, capture: bool = True) -> StaticDecode | None:
        """Decode through fixed-shape steps per (batch, span) bucket (:mod:`workbench.generation.graphs`),
        captured as CUDA graphs when ``capture`` (CUDA only; a failed capture raises and leaves eager steps);
        without capture the same steps run eagerly.  Same tokens as the eager step."""
        self.static = None
        if enabled:
            static = StaticDecode(self.model, self.cache)
            if capture:
                static.capture()
            self.static = static
        return self.static

    def forget_prefixes(self) -> None:
        """Drop every resident record: the next prompts are computed whole (cold-cache timings)."""
        self._resident = [None] * self.max_batch_size

    # ----------------------------------------------------------------------------- public
    def generate(self, requests: Sequence[Request]) -> Iterator[Event]:
        """Yield events in generation order (rows interleave); each request ends with one stop event."""
        pending = deque(requests)
        slots: list[_Row | None] = [None] * min(self.max_batch_size, len(requests))
        refill_at = max(1, len(slots) // 4)  # wait for this many free slots before a new prefill wave
        while pending or any(slots):
            yield from self._drop_cancelled(pending, slots)
            free = [i for i, row in enumerate(slots) if row is None]
            running = len(slots) - len(free)
            if free and pending and (len(free) >= min(refill_at, len(pending)) or not running):
                admitted = self._assign_slots(free, [pending.popleft() for _ in range(min(len(free), len(pending)))])
                yield from self._prefill(admitted, slots)
            active = [i for i, row in enumerate(slots) if row is not None]
            if active:
                yield from self._decode(slots, active[-1] + 1)

    def _drop_cancelled(self, pending: deque[Request], slots: list[_Row | None]) -> Iterator[Event]:
        """End the rows whose ``cancel`` is set (waiting or running): a "cancelled" event each, slot freed."""
        for request in [r for r in pending if r.cancel is not None and r.cancel.is_set()]:
            pending.remove(request)
            yield Event(request.index, None, stop_reason="cancelled")
        for i, row in enumerate(slots):
            if row is not None and row.request.cancel is not None and row.request.cancel.is_set():
                slots[i] = None  # its resident record stays valid: the cache holds what it fed
                yield Event(row.request.index, None, stop_reason="cancelled")

    @torch.inference_mode()
    def logits(self, token_lists: Sequence[Sequence[int]], images: Sequence[Any] | None = None
               ) -> list[torch.Tensor]:
        """Teacher-forced float32 logits ``[len, V]`` of each sequence (batched, padded); ``images`` gives each
        row's images as its requests would (tiles, or a Llama 3.2 Vision ImageSet), or None."""
        out: list[torch.Tensor | None] = [None] * len(token_lists)
        for group in self._prefill_groups(list(range(len(token_lists))), [len(t) for t in token_lists]):
            tokens = self._padded([token_lists[i] for i in group])
            rows = [images[i] for i in group] if images is not None else []
            extra = {"images": rows, "image_token": self.image_token} if any(r is not None for r in rows) else {}
            logits = self.model.forward_full(tokens, **extra)  # [b, T, V]
            for j, i in enumerate(group):
                out[i] = logits[j, : len(token_lists[i])].cpu()
        return out  # type: ignore[return-value]

    # ----------------------------------------------------------------------------- prefix reuse
    def _resident_tokens(self) -> dict[int, list[int]]:
        """slot -> the tokens its keys/values hold (only slots that hold something)."""
        held = {}
        for slot, row in enumerate(self._resident):
            if row is not None:
                tokens = row.resident()
                if tokens:
                    held[slot] = tokens
        return held

    def _assign_slots(self, free: list[int], requests: list[Request]) -> list[tuple[int, Request]]:
        """Put each request in a free slot, preferring the slot that already holds its longest prefix."""
        if not self.share_prefixes:
            return list(zip(free, requests))
        held = self._resident_tokens()
        candidates = [slot for slot in free if slot in held]
        assigned: list[tuple[int, Request] | None] = [None] * len(requests)
        taken: set[int] = set()
        for j, request in enumerate(requests):
            best, best_len = None, MIN_SHARED_PREFIX - 1
            for slot in candidates:
                if slot not in taken:
                    n = common_prefix(request.prompt, held[slot], len(request.prompt) - 1)
                    if n > best_len:
                        best, best_len = slot, n
            if best is not None:
                assigned[j] = (best, request)
                taken.add(best)
        rest = iter(slot for slot in free if slot not in taken)
        return [a if a is not None else (next(rest), requests[j]) for j, a in enumerate(assigned)]

    def _shared_prefixes(self, admitted: list[tuple[int, Request]]) -> list[tuple[int, list[int]]]:
        """Prefixes that several admitted prompts share and no slot holds yet: (host slot, tokens) each.

        Prompts sorted by content put prompts with common prefixes next to each other; each run of
        neighbours sharing at least ``MIN_SHARED_PREFIX`` tokens gets its common prefix computed once,
        in the slot of its first member, which the others then copy from.
        """
        if len(admitted) < 2:
            return []
        order = sorted(range(len(admitted)), key=lambda j: admitted[j][1].prompt)
        held = list(self._resident_tokens().values())
        out: list[tuple[int, list[int]]] = []
        run = [order[0]]
        shared = 0
        for prev, cur in zip(order, order[1:] + [None]):
            n = 0 if cur is None else common_prefix(admitted[prev][1].prompt, admitted[cur][1].prompt)
            if n >= MIN_SHARED_PREFIX:
                shared = n if len(run) == 1 else min(shared, n)
                run.append(cur)
                continue
            if len(run) > 1:
                length = min([shared] + [len(admitted[j][1].prompt) - 1 for j in run])
                prefix = admitted[run[0]][1].prompt[:length]
                if length >= MIN_SHARED_PREFIX and not any(common_prefix(prefix, h) >= length for h in held):
                    out.append((admitted[run[0]][0], prefix))
            run = [cur]
        return out

    def _first_image_position(self, tokens: list[int]) -> int:
        return tokens.index(self.image_token) if self.image_token in tokens else len(tokens)

    def _fill(self, items: list[tuple[int, list[int]]],
              images: list[torch.Tensor | None] | None = None) -> torch.Tensor:
        """Write the keys/values of ``items`` (slot, tokens) into their slots; last-token logits [n, V].

        Each item starts from the longest prefix any slot holds (copied into its own slot when it
        lives elsewhere); only the remaining tokens are computed, batched in groups of similar length.
        Reuse compares token ids only: a row whose prompt embeds something beyond its ids (image patch
        embeddings) must not reuse or lend positions from its first such token on.
        """
        device = self.model.device
        starts = [0] * len(items)
        sources = [-1] * len(items)
        if self.share_prefixes:
            held = self._resident_tokens()
            for k, (slot, tokens) in enumerate(items):
                limit = len(tokens) - 1  # at least one token is computed: its logits are needed
                if images is not None and images[k] is not None:
                    limit = min(limit, self._first_image_position(tokens))  # image positions are computed
                best, best_len = -1, 0
                own = held.get(slot)
                if own is not None:  # reusing the slot's own tokens costs no copy: any length pays
                    best, best_len = slot, common_prefix(tokens, own, limit)
                for src, held_tokens in held.items():
                    if src != slot:
                        n = common_prefix(tokens, held_tokens, limit)
                        if n >= MIN_SHARED_PREFIX and n > best_len:
                            best, best_len = src, n
                if best_len:
                    starts[k], sources[k] = best_len, best
        for slot, _ in items:
            self._resident[slot] = None  # its prefix is about to change
        copies = [(src, slot, n) for (slot, _), src, n in zip(items, sources, starts) if n and src != slot]
        if copies:
            self._copy_prefixes(copies)
        suffix_lengths = [len(tokens) - n for (_, tokens), n in zip(items, starts)]
        self.stats["prefill_tokens"] += sum(suffix_lengths)
        self.stats["reused_tokens"] += sum(starts)
        out = torch.empty(len(items), self.model.args.vocab_size, device=device)
        if images is None or all(t is None for t in images):  # text only: rows packed end to end, no padding
            for group in self._packed_groups(suffix_lengths):
                tokens = torch.tensor([[t for j in group for t in items[j][1][starts[j] :]]], device=device)  # [1, N]
                out[group] = self.model.forward_packed(tokens, [suffix_lengths[j] for j in group],
                                                       [starts[j] for j in group], self.cache,
                                                       [items[j][0] for j in group])
            return out
        for group in self._prefill_groups(list(range(len(items))), suffix_lengths):
            tokens = self._padded([items[j][1][starts[j] :] for j in group])
            rows = torch.tensor([items[j][0] for j in group], device=device)
            last = torch.tensor([suffix_lengths[j] - 1 for j in group], device=device)
            group_starts = [starts[j] for j in group]
            tiles = [images[j] for j in group] if images is not None else []
            extra = {"images": tiles, "image_token": self.image_token} if any(t is not None for t in tiles) else {}
            logits = self.model.forward_full(tokens, cache=self.cache, cache_rows=rows, logit_index=last,
                                             starts=group_starts if any(group_starts) else None,
                                             **extra)
            out[group] = logits
        return out

    def _copy_prefixes(self, copies: list[tuple[int, int, int]]) -> None:
        """Copy positions ``0..n-1`` of slot ``src`` into slot ``dst`` for every (src, dst, n), all layers.

        All sources are read before any destination is written, so a slot may be both.
        """
        device = self.model.device
        src = torch.tensor([c[0] for c in copies], device=device)
        dst = torch.tensor([c[1] for c in copies], device=device)
        width = max(c[2] for c in copies)  # positions past a row's own n are junk it overwrites or never reads
        for layer in self.cache.keys + self.cache.values:
            block = layer.index_select(0, src)[:, :, :width]  # [n, Hkv, width, D] (a copy)
            layer[:, :, :width].index_copy_(0, dst, block)

    # ----------------------------------------------------------------------------- steps
    def _padded(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        width = max(len(p) for p in prompts)
        tokens = torch.zeros((len(prompts), width), dtype=torch.long)
        for j, p in enumerate(prompts):
            tokens[j, : len(p)] = torch.tensor(p, dtype=torch.long)
        return tokens.to(self.model.device)  # [b, T]

    def _packed_token_limit(self) -> int:
        """Tokens per packed prefill forward: MAX_PREFILL_TOKENS, and on CPU what keeps the widest activation
        under CPU_PREFILL_ACTIVATION_BYTES (at least CPU_PREFILL_MIN_TOKENS, for full-speed linears)."""
        if self.model.device.type != "cpu":
            return MAX_PREFILL_TOKENS
        args = self.model.args
        widest = max(args.dim, args.dense_hidden_dim(), args.moe_hidden_dim() if args.moe_args is not None else 0)
        per_token = widest * torch.empty((), dtype=self.model.dtype).element_size()
        return max(CPU_PREFILL_MIN_TOKENS, min(MAX_PREFILL_TOKENS, CPU_PREFILL_ACTIVATION_BYTES // per_token))

    def _packed_groups(self, lengths: list[int]) -> Iterator[list[int]]:
        """Rows in order, cut into packed forwards of at most ``_packed_token_limit()`` tokens (a longer row alone)."""
        limit = self._packed_token_limit()
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

    def _prefill_groups(self, order: list[int], lengths: list[int]) -> Iterator[list[int]]:
        """Split into forwards of similar lengths, each under MAX_PREFILL_TOKENS padded tokens."""
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

    @torch.inference_mode()
    def _prefill(self, admitted: list[tuple[int, Request]], slots: list[_Row | None]) -> Iterator[Event]:
        if self.share_prefixes:
            shared = self._shared_prefixes([a for a in admitted if a[1].image_tiles is None])
            if shared:
                self._fill(shared)
                for slot, prefix in shared:  # the slot now holds the prefix (a row that generated nothing)
                    self._resident[slot] = _Row(Request(-1, prefix, admitted[0][1].params), None)
        logits = self._fill([(slot, request.prompt) for slot, request in admitted],
                            [request.image_tiles for _, request in admitted])  # [n, V]
        new_rows = []
        for slot, request in admitted:
            row = _Row(request, request.params.make_generator(), grammar=self._start_grammar(request))
            if request.image_tiles is not None:  # positions from the first image on hold image embeddings
                row.cap = self._first_image_position(request.prompt)
            slots[slot] = self._resident[slot] = row
            new_rows.append((slot, row))
        yield from self._advance_all(new_rows, logits, slots)

    @torch.inference_mode()
    def _decode(self, slots: list[_Row | None], width: int) -> Iterator[Event]:
        live = [i for i in range(width) if slots[i] is not None]
        live_positions = [slots[i].position for i in live]  # type: ignore[union-attr]
        low, high = min(live_positions), max(live_positions)
        tokens = [0] * width
        positions = [high] * width  # free slots inside the width compute a junk row at the top position
        for i, pos in zip(live, live_positions):
            tokens[i] = slots[i].tokens[-1]  # type: ignore[union-attr]
            positions[i] = pos
        if len(live) < width:
            for i in range(width):
                resident = self._resident[i]
                if slots[i] is None and resident is not None:  # the junk row overwrites position `high`
                    resident.cap = min(high, resident.cap if resident.cap is not None else high)
        constrained = [slots[i].grammar for i in live if slots[i].grammar is not None]  # type: ignore[union-attr]
        if constrained:  # their next masks are computed on a worker while the forward runs
            self.grammars.prefetch(constrained)
        device = self.model.device
        greedy = None
        if self.static is not None:  # fixed shapes (a CUDA graph replay on a GPU); argmax taken on the device
            logits, greedy = self.static(tokens, positions)  # [W, V], [W]
        else:
            logits = self.model.forward_decode(torch.tensor(tokens, device=device),
                                               torch.tensor(positions, device=device),
                                               self.cache, span=(low, high))  # [W, V]
        for i in live:
            slots[i].fed += 1  # type: ignore[union-attr]
        if len(live) < width:
            logits, greedy = logits[live], None if greedy is None else greedy[live]
        yield from self._advance_all([(i, slots[i]) for i in live], logits, slots, greedy)

    def _advance_all(self, rows: list[tuple[int, _Row]], logits: torch.Tensor, slots: list[_Row | None],
                     argmax: torch.Tensor | None = None) -> Iterator[Event]:
        """Pick every row's next token from ``logits`` [n, V] (one argmax for all greedy rows; ``argmax`` [n]
        when the step already took it on the device)."""
        chosen: dict[int, int] = {}  # rows whose grammar already decided their greedy token
        # before any mask: constrained greedy rows keep their argmax when the grammar allows it
        greedy: list[int] = []
        if any(r.request.params.greedy for _, r in rows):
            greedy = (argmax if argmax is not None else fast_argmax(logits)).tolist()
        if any(row.grammar is not None for _, row in rows):
            chosen = yield from self._mask_grammars(rows, logits, slots, greedy)
            for k, (_, row) in enumerate(rows):  # greedy rows whose logits the mask rewrote (logprobs asked)
                if row.grammar is not None and row.request.params.greedy and k not in chosen:
                    greedy[k] = int(fast_argmax(logits[k : k + 1])[0])
        for k, (slot, row) in enumerate(rows):
            if slots[slot] is not row:  # ended by its grammar
                continue
            params = row.request.params
            if k in chosen:
                token = chosen[k]
            else:
                token = greedy[k] if params.greedy else sample_token(logits[k], params, row.generator)
            yield from self._advance(row, token, logits[k], slots, slot)

    def _advance(self, row: _Row, token: int, logits: torch.Tensor, slots: list[_Row | None],
                 slot: int) -> Iterator[Event]:
        """Emit the row's new ``token`` and free the slot if the row is done."""
        params = row.request.params
        logprob = self._logprob(logits, token, params.logprobs) if params.logprobs else None
        index = row.request.index
        if token in self.stop_tokens and not params.ignore_stop_tokens:
            slots[slot] = None
            yield Event(index, None, logprob, stop_reason=self.stop_tokens[token])
            return
        row.tokens.append(token)
        if row.grammar is not None:
            row.grammar.consume(token)
            if row.grammar.complete:  # nothing but the end token could follow: end the row now
                slots[slot] = None
                yield Event(index, token, logprob, stop_reason=row.grammar.constraint.end_reason)
                return
        stop_at = self._stop_string_hit(row) if params.stop else None
        if stop_at is not None:
            slots[slot] = None
            yield Event(index, token, logprob, stop_reason="end_of_turn", truncate_text_at=stop_at)
            return
        limit = params.max_tokens if params.max_tokens is not None else self.max_seq_len
        if len(row.tokens) >= limit or row.position + 1 >= self.max_seq_len:
            slots[slot] = None
            done = row.grammar is not None and row.grammar.accepting  # a complete grammar ends the turn
            reason: StopReason = row.grammar.constraint.end_reason if done else "out_of_tokens"
            yield Event(index, token, logprob, stop_reason=reason)
            return
        yield Event(index, token, logprob)

    def _start_grammar(self, request: Request) -> Any:
        if request.constraint is None:
            return None
        if self.grammars is None:
            raise RuntimeError("a constrained request reached a generator built without a grammar runtime")
        return self.grammars.start(request.constraint)

    def _mask_grammars(self, rows: list[tuple[int, _Row]], logits: torch.Tensor, slots: list[_Row | None],
                       argmax: list[int]) -> Generator_[Event, None, dict[int, int]]:
        """Apply every constrained row's token mask to its logits (one batched mask computation per step);
        returns the tokens it chose for greedy rows (see ``GrammarRuntime.mask_logits``).

        A row whose grammar allows no token at all (an unsatisfiable schema) ends as ``out_of_tokens``.
        """

        constrained = [MaskRow(k, row.grammar, row.request.params.greedy and not row.request.params.logprobs)
                       for k, (_, row) in enumerate(rows) if row.grammar is not None]
        chosen = self.grammars.mask_logits(logits, constrained, argmax)
        for item in constrained:
            if item.state.dead:
                slot, row = rows[item.index]
                slots[slot] = None
                yield Event(row.request.index, None, stop_reason="out_of_tokens")
        return chosen

    def _stop_string_hit(self, row: _Row) -> int | None:
        """Character offset where the first stop string starts in the text so far, if any.

        Checked after every token, so a new hit can only involve the last few tokens: only that tail is
        decoded on the hot path (a character spans at most 4 tokens), the whole text only on a hit.
        """
        stops = row.request.params.stop
        tail = self.decode_text(row.tokens[-(4 * max(map(len, stops)) + 4) :])
        if not any(s in tail for s in stops):
            return None
        text = self.decode_text(row.tokens)
        hits = [text.find(s) for s in stops]
        hits = [h for h in hits if h >= 0]
        return min(hits) if hits else None

    def _logprob(self, logits: torch.Tensor, token: int, k: int) -> TokenLogprob:
        logp = torch.log_softmax(logits.float(), dim=-1)  # [V]
        top = torch.topk(logp, k)
        top_tokens = top.indices.tolist()
        top_map: dict[str, float] = {}
        values = top.values.tolist()
        if values[-1] == float("-inf"):  # tokens masked out by the row's grammar are no alternatives
            top_tokens = [t for t, lp in zip(top_tokens, values) if lp != float("-inf")]
        for t, lp in zip(top_tokens, values):
            top_map.setdefault(self.decode_text([t]), lp)
        return TokenLogprob(token, self.decode_text([token]), float(logp[token]), top_map, top_tokens)

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
