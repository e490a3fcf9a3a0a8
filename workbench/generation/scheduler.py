"""The scheduler: continuous batching of requests over a static KV cache, one step at a time (nano-vllm's
``add_request`` / ``step``).

Requests join at any step (:meth:`Scheduler.step`'s ``add``) and leave at any step (a stop, a cancel).  Every
request owns one cache slot while it runs.  Each step admits waiting requests into free slots (in waves: a wave
waits until a quarter of the slots are free, or nothing runs, so prefill forwards stay wide), prefills (text
prompts packed end to end with no padding, under a per-step token budget while other rows decode: a long
prompt is prefilled in chunks, so it delays each running row's next token by one chunk, not by the whole
prompt; prompts with images whole, in padded groups of similar lengths), then decodes one token for every
running row at its own position.  A row that stops frees its slot.

Where a prefilled row's keys/values come from is the :class:`~workbench.generation.prefix_cache.PrefixCache`'s
business: it picks the slot that already holds a prompt's prefix, computes prefixes a wave shares once,
copies held prefixes and keeps the slot records.  This module decides which rows run and turns logits
into tokens (sampling, grammars, stop tokens and strings, per-row cancel).

The running state (waiting, prefilling and running rows) lives between steps; a step that raises (or a
``KeyboardInterrupt``) drops it all (:meth:`Scheduler.reset`) and leaves the cache and its records honest, and
positions past a row's own position are never attended to, so the scheduler is ready for the next request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.generation import batching, scoring
from workbench.generation.constraints import MaskRow
from workbench.generation.graphs import StaticDecode
from workbench.generation.prefix_cache import PrefixCache
from workbench.generation.request import Event, Request
from workbench.generation.sampling import apply_repetition_penalty, fast_argmax, sample_token
from workbench.models.transformer import Transformer
from workbench.types import StopReason, TokenLogprob

# Prompt tokens prefilled per step while other rows decode (a chunk); with nothing decoding a prompt is
# prefilled whole (in forwards cut by batching.packed_token_limit).
PREFILL_CHUNK_TOKENS = 512


@dataclass
class Filling:
    """A row being prefilled: its cache ``slot``, the positions ``done`` (a reused prefix, chunks computed) and the
    position its record ends at (``cap``: the first image token, or None)."""

    slot: int
    request: Request
    done: int
    cap: int | None


class Scheduler:
    """Runs requests through a model with a preallocated KV cache of ``max_batch_size`` slots.

    ``share_prefixes`` (on by default) reuses the keys/values of common prompt prefixes, within a
    call and across calls; turning it off recomputes every prompt whole (for comparisons).  The slot records
    behind that reuse belong to ``prefix_cache`` (:class:`~workbench.generation.prefix_cache.PrefixCache`).
    """

    def __init__(
        self,
        model: Transformer,
        *,
        stop_tokens: dict[int, StopReason],
        decode_text: Callable[[Sequence[int]], str],
        max_batch_size: int,
        max_seq_len: int,
        grammars: Any = None,
        share_prefixes: bool = True,
        image_token: int | None = None,
    ) -> None:
        self.model = model
        self.grammars = grammars  # structured.GrammarRuntime (token masks of constrained rows), or None
        self.image_token = image_token  # <|patch|>: where prefill places image embeddings
        self.stop_tokens = stop_tokens
        self.decode_text = decode_text  # ids -> str, for stop strings and logprob labels
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.cache = model.new_cache(max_batch_size, max_seq_len)
        self.prefix_cache = PrefixCache(self.cache, enabled=share_prefixes)
        self.static: StaticDecode | None = None  # fixed-shape (CUDA-graphed) decode steps, see use_static_decode
        # [max_batch_size, V] bool on the model's device: the tokens each slot's row has seen (prompt and reply),
        # kept only for rows with a repetition penalty; made at the first such row
        self.seen: torch.Tensor | None = None
        self.prefill_chunk = PREFILL_CHUNK_TOKENS  # prompt tokens per step while rows decode (chunked prefill)
        # the running state between steps: rows waiting for a slot, rows being prefilled, rows decoding
        self.waiting: deque[Request] = deque()
        self.filling: list[Filling] = []
        self.slots: list[Request | None] = [None] * max_batch_size

    @property
    def stats(self) -> dict[str, int]:
        """Prefill tokens computed and reused since construction (the prefix cache's counts)."""
        return self.prefix_cache.stats

    @property
    def share_prefixes(self) -> bool:
        return self.prefix_cache.enabled

    @share_prefixes.setter
    def share_prefixes(self, enabled: bool) -> None:
        self.prefix_cache.enabled = enabled

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
        """Drop every slot record: the next prompts are computed whole (cold-cache timings)."""
        self.prefix_cache.forget()

    def close(self) -> None:
        """Free the cache's storage now and drop the model: frames an interrupted cell keeps alive may still
        reference this scheduler or its cache object."""
        if self.cache is not None:
            self.cache.keys.clear()
            self.cache.values.clear()
        self.prefix_cache.forget()
        self.static = None
        self.seen = None
        self.model = None  # type: ignore[assignment]
        self.cache = None  # type: ignore[assignment]

    # ----------------------------------------------------------------------------- public
    @property
    def busy(self) -> bool:
        """Rows are waiting, being prefilled or decoding."""
        return bool(self.waiting or self.filling or any(row is not None for row in self.slots))

    def step(self, add: Iterable[Request] = (), cancel: Iterable[int] = ()) -> list[Event]:
        """One step of the running batch: take the requests ``add`` (they wait for a slot), end the rows whose
        ``index`` is in ``cancel`` (or whose own cancel is set: a "cancelled" event each), admit waiting rows,
        prefill (a chunk of each long prompt while other rows decode), decode one token for every running row.
        Returns the step's events; each request's last event carries its ``stop_reason``.  A step that raises
        drops every row (:meth:`reset`)."""
        self.waiting.extend(add)
        events: list[Event] = []
        try:
            events.extend(self._drop_cancelled(set(cancel)))
            self._admit()
            events.extend(self._prefill_step())
            active = [i for i, row in enumerate(self.slots) if row is not None]
            if active:
                events.extend(self._decode(self.slots, active[-1] + 1))
        except BaseException:
            self.reset()
            raise
        return events

    def reset(self) -> None:
        """Drop every waiting, prefilling and running row (after a failed step; the loop failed their calls).
        The slot records stay true: a running row's record holds only what it fed, a prefilling slot has none."""
        self.waiting.clear()
        self.filling = []
        self.slots = [None] * self.max_batch_size

    def generate(self, requests: Sequence[Request]) -> Iterator[Event]:
        """Run ``requests`` alone to their ends: events in generation order (rows interleave), each request
        ending with one stop event.  Steps until they are done (the engine's loop calls :meth:`step` itself)."""
        if self.busy:
            raise RuntimeError("Scheduler.generate() while a step loop has rows running")
        self.waiting.extend(requests)
        try:
            while self.busy:
                yield from self.step()
        finally:
            self.reset()

    @torch.inference_mode()
    def logits(self, token_lists: Sequence[Sequence[int]], images: Sequence[Any] | None = None) -> list[torch.Tensor]:
        """Teacher-forced float32 logits ``[len, V]`` of each sequence (batched, padded); ``images`` gives each
        row's images as its requests would (tiles, or a Llama 3.2 Vision ImageSet), or None."""
        out: list[torch.Tensor | None] = [None] * len(token_lists)
        for group in batching.padded_groups(range(len(token_lists)), [len(t) for t in token_lists]):
            tokens = batching.padded([token_lists[i] for i in group], self.model.device)
            rows = [images[i] for i in group] if images is not None else []
            extra = {"images": rows, "image_token": self.image_token} if any(r is not None for r in rows) else {}
            logits = self.model.forward_full(tokens, **extra)  # [b, T, V]
            for j, i in enumerate(group):
                out[i] = logits[j, : len(token_lists[i])].cpu()
        return out  # type: ignore[return-value]

    def score(
        self, sequences: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Log-probs and greedy flags of ``sequences[i][starts[i]:]`` (:func:`workbench.generation.scoring.score`),
        on this scheduler's model and cache slots."""
        return scoring.score(self.model, self.prefix_cache, sequences, starts)

    def _drop_cancelled(self, cancel: set[int]) -> Iterator[Event]:
        """End the rows named in ``cancel`` or whose ``cancel`` is set (waiting, prefilling or running): a
        "cancelled" event each, slot freed."""

        def gone(request: Request) -> bool:
            return request.cancelled or request.index in cancel

        for request in [r for r in self.waiting if gone(r)]:
            self.waiting.remove(request)
            yield Event(request.index, None, stop_reason="cancelled")
        for fill in [f for f in self.filling if gone(f.request)]:
            self.filling.remove(fill)  # its slot has no record while it fills
            yield Event(fill.request.index, None, stop_reason="cancelled")
        for i, row in enumerate(self.slots):
            if row is not None and gone(row):
                self.slots[i] = None  # its slot record stays valid: the cache holds what it fed
                yield Event(row.index, None, stop_reason="cancelled")

    @torch.inference_mode()
    def _admit(self) -> None:
        """Waiting rows into free slots, in waves (see the module docstring): each slot is chosen by the prefix
        cache, prefixes the wave shares are computed once, held prefixes copied; the rows then wait to fill."""
        if not self.waiting:
            return
        filling = {f.slot for f in self.filling}
        free = [i for i, row in enumerate(self.slots) if row is None and i not in filling]
        running = self.max_batch_size - len(free)
        refill_at = max(1, min(self.max_batch_size, running + len(self.waiting)) // 4)
        if not free or (len(free) < min(refill_at, len(self.waiting)) and running):
            return
        wave = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
        admitted = list(zip(self.prefix_cache.assign(free, [r.prompt for r in wave]), wave))
        shared = self.prefix_cache.shared_prefixes([(slot, r.prompt) for slot, r in admitted if r.image_tiles is None])
        if shared:
            self._fill(shared)
            for slot, prefix in shared:  # the slot now holds the prefix
                self.prefix_cache.hold(slot, prefix)
        # positions from the first image on hold image embeddings: never reused, never lent to other rows
        caps = [self._first_image_position(r.prompt) if r.image_tiles is not None else None for _, r in admitted]
        limits = [len(r.prompt) - 1 for _, r in admitted]  # at least one token is computed: its logits are needed
        limits = [limit if cap is None else min(limit, cap) for limit, cap in zip(limits, caps)]
        starts = self.prefix_cache.prepare([(slot, r.prompt, limit) for (slot, r), limit in zip(admitted, limits)])
        self.filling.extend(Filling(slot, r, start, cap) for (slot, r), start, cap in zip(admitted, starts, caps))

    # ----------------------------------------------------------------------------- steps
    def _first_image_position(self, tokens: list[int]) -> int:
        return tokens.index(self.image_token) if self.image_token in tokens else len(tokens)

    def _fill(self, items: list[tuple[int, list[int]]]) -> torch.Tensor:
        """Write the keys/values of ``items`` (slot, tokens) into their slots, each from the longest prefix any slot
        holds (the prefix cache copies it in); last-token logits [n, V].  The caller records what the slots hold
        once this returns."""
        starts = self.prefix_cache.prepare([(slot, tokens, len(tokens) - 1) for slot, tokens in items])
        return self._compute([(slot, tokens, start) for (slot, tokens), start in zip(items, starts)])

    def _compute(
        self, items: list[tuple[int, list[int], int]], images: list[torch.Tensor | None] | None = None
    ) -> torch.Tensor:
        """Compute the keys/values of ``items`` (slot, tokens, start): positions ``start..len(tokens)-1`` of each
        slot, whose positions before ``start`` hold the prefix already; last-token logits [n, V].  Text rows are
        packed end to end (no padding); rows with images (``images``: each row's tiles or None) in padded groups."""
        device = self.model.device
        starts = [start for _, _, start in items]
        pairs = [(slot, tokens) for slot, tokens, _ in items]
        suffix_lengths = [len(tokens) - n for (_, tokens), n in zip(pairs, starts)]
        out = torch.empty(len(items), self.model.args.vocab_size, device=device)
        if images is None or all(t is None for t in images):  # text only: rows packed end to end, no padding
            for batch in batching.packed_batches(pairs, starts, self.model):
                out[batch.rows] = self.model.forward_packed(
                    batch.tokens, batch.lengths, batch.starts, self.cache, batch.slots
                )
            return out
        for group in batching.padded_groups(range(len(items)), suffix_lengths):
            tokens = batching.padded([pairs[j][1][starts[j] :] for j in group], device)
            rows = torch.tensor([pairs[j][0] for j in group], device=device)
            last = torch.tensor([suffix_lengths[j] - 1 for j in group], device=device)
            group_starts = [starts[j] for j in group]
            tiles = [images[j] for j in group]
            extra = {"images": tiles, "image_token": self.image_token} if any(t is not None for t in tiles) else {}
            logits = self.model.forward_full(
                tokens,
                cache=self.cache,
                cache_rows=rows,
                logit_index=last,
                starts=group_starts if any(group_starts) else None,
                **extra,
            )
            out[group] = logits
        return out

    @torch.inference_mode()
    def _prefill_step(self) -> list[Event]:
        """Prefill the filling rows in order: whole while nothing decodes, else up to ``prefill_chunk`` prompt
        tokens this step (a row with images is never cut).  Rows whose prompt is complete start running and
        get their first token."""
        if not self.filling:
            return []
        budget = self.prefill_chunk if any(row is not None for row in self.slots) else None
        chunks: list[tuple[Filling, int]] = []  # (row, prompt positions computed once this step is done)
        for fill in self.filling:
            prompt = fill.request.prompt
            if budget is not None and budget <= 0:
                break
            end = len(prompt)
            if budget is not None:
                if fill.request.image_tiles is None:
                    end = min(end, fill.done + budget)
                budget -= end - fill.done
            chunks.append((fill, end))
        tiles = [fill.request.image_tiles for fill, _ in chunks]
        logits = self._compute([(f.slot, f.request.prompt[:end], f.done) for f, end in chunks], tiles)  # [n, V]
        ready: list[tuple[int, Request]] = []
        rows: list[int] = []
        for k, (fill, end) in enumerate(chunks):
            fill.done = end
            if end < len(fill.request.prompt):
                continue  # more chunks to come; the slot has no record meanwhile
            self.filling.remove(fill)
            slot, request = fill.slot, fill.request
            request.rng, request.grammar = request.params.make_rng(), self._start_grammar(request)
            if request.params.penalized:
                self._see_prompt(slot, request.prompt)
            self.prefix_cache.hold(slot, request, cap=fill.cap)  # a running row is its slot's record
            self.slots[slot] = request
            ready.append((slot, request))
            rows.append(k)
        if not ready:
            return []
        return list(self._advance_all(ready, logits[rows], self.slots))

    @torch.inference_mode()
    def _decode(self, slots: list[Request | None], width: int) -> Iterator[Event]:
        live = [i for i in range(width) if slots[i] is not None]
        live_positions = [slots[i].position for i in live]  # type: ignore[union-attr]
        low, high = min(live_positions), max(live_positions)
        tokens = [0] * width
        positions = [high] * width  # free slots inside the width compute a junk row at the top position
        for i, pos in zip(live, live_positions):
            tokens[i] = slots[i].tokens[-1]  # type: ignore[union-attr]
            positions[i] = pos
        if len(live) < width:
            filling = {f.slot: f.done for f in self.filling}
            for i in range(width):
                if i in filling:  # a slot being prefilled: the junk row writes its next position (the next chunk's)
                    positions[i] = filling[i]
                elif slots[i] is None:  # the junk row overwrites position `high` of this slot
                    self.prefix_cache.truncate(i, high)
        constrained = [slots[i].grammar for i in live if slots[i].grammar is not None]  # type: ignore[union-attr]
        if constrained:  # their next masks are computed on a worker while the forward runs
            self.grammars.prefetch(constrained)
        device = self.model.device
        greedy = None
        if self.static is not None:  # fixed shapes (a CUDA graph replay on a GPU); argmax taken on the device
            logits, greedy = self.static(tokens, positions)  # [W, V], [W]
        else:
            logits = self.model.forward_decode(
                torch.tensor(tokens, device=device),
                torch.tensor(positions, device=device),
                self.cache,
                span=(low, high),
            )  # [W, V]
        for i in live:
            slots[i].fed += 1  # type: ignore[union-attr]
        if len(live) < width:
            logits, greedy = logits[live], None if greedy is None else greedy[live]
        yield from self._advance_all([(i, slots[i]) for i in live], logits, slots, greedy)

    def _advance_all(
        self,
        rows: list[tuple[int, Request]],
        logits: torch.Tensor,
        slots: list[Request | None],
        argmax: torch.Tensor | None = None,
    ) -> Iterator[Event]:
        """Pick every row's next token from ``logits`` [n, V] (one argmax for all greedy rows; ``argmax`` [n]
        when the step already took it on the device)."""
        chosen: dict[int, int] = {}  # rows whose grammar already decided their greedy token
        penalized = [k for k, (_, row) in enumerate(rows) if row.params.penalized]
        if penalized:  # before anything reads the logits; the device's argmax saw them unpenalized
            self._penalize(logits, penalized, rows)
            argmax = None
        # before any mask: constrained greedy rows keep their argmax when the grammar allows it
        greedy: list[int] = []
        if any(r.params.greedy for _, r in rows):
            greedy = (argmax if argmax is not None else fast_argmax(logits)).tolist()
        if any(row.grammar is not None for _, row in rows):
            chosen = yield from self._mask_grammars(rows, logits, slots, greedy)
            for k, (_, row) in enumerate(rows):  # greedy rows whose logits the mask rewrote (logprobs asked)
                if row.grammar is not None and row.params.greedy and k not in chosen:
                    greedy[k] = int(fast_argmax(logits[k : k + 1])[0])
        for k, (slot, row) in enumerate(rows):
            if slots[slot] is not row:  # ended by its grammar
                continue
            params = row.params
            if k in chosen:
                token = chosen[k]
            else:
                token = greedy[k] if params.greedy else sample_token(logits[k], params, row.rng)
            yield from self._advance(row, token, logits[k], slots, slot)

    def _advance(
        self, row: Request, token: int, logits: torch.Tensor, slots: list[Request | None], slot: int
    ) -> Iterator[Event]:
        """Emit the row's new ``token`` and free the slot if the row is done."""
        params = row.params
        logprob = self._logprob(logits, token, params.logprobs) if params.logprobs else None
        index = row.index
        if token in self.stop_tokens and not params.ignore_stop_tokens:
            slots[slot] = None
            yield Event(index, None, logprob, stop_reason=self.stop_tokens[token])
            return
        row.tokens.append(token)
        if logprob is not None:
            row.logprobs.append(logprob)
        if params.penalized:
            self.seen[slot, token] = True  # type: ignore[index]
        if row.grammar is not None:
            row.grammar.consume(token)
            if row.grammar.complete:  # nothing but the end token could follow: end the row now
                slots[slot] = None
                yield Event(index, token, logprob, stop_reason=row.grammar.constraint.end_reason, count=len(row.tokens))
                return
        stop_at = self._stop_string_hit(row) if params.stop else None
        if stop_at is not None:
            slots[slot] = None
            yield Event(
                index, token, logprob, stop_reason="end_of_turn", truncate_text_at=stop_at, count=len(row.tokens)
            )
            return
        limit = params.max_tokens if params.max_tokens is not None else self.max_seq_len
        if len(row.tokens) >= limit or row.position + 1 >= self.max_seq_len:
            slots[slot] = None
            done = row.grammar is not None and row.grammar.accepting  # a complete grammar ends the turn
            reason: StopReason = row.grammar.constraint.end_reason if done else "out_of_tokens"
            yield Event(index, token, logprob, stop_reason=reason, count=len(row.tokens))
            return
        yield Event(index, token, logprob, count=len(row.tokens))

    def _see_prompt(self, slot: int, prompt: list[int]) -> None:
        """Start a penalized row's record of seen tokens: its prompt's ids."""
        if self.seen is None:
            self.seen = torch.zeros(
                self.max_batch_size, self.model.args.vocab_size, dtype=torch.bool, device=self.model.device
            )
        self.seen[slot].zero_()
        self.seen[slot, torch.tensor(prompt, device=self.model.device)] = True

    def _penalize(self, logits: torch.Tensor, ks: list[int], rows: list[tuple[int, Request]]) -> None:
        """Apply the repetition penalty of rows ``ks`` (places in ``rows``) to their logits [n, V], in place, on
        the device (no value comes back to the host)."""
        device = logits.device
        at = torch.tensor(ks, device=device)  # [m]
        slot_ids = torch.tensor([rows[k][0] for k in ks], device=self.seen.device)  # type: ignore[union-attr]
        penalty = torch.tensor(
            [[rows[k][1].params.repetition_penalty] for k in ks], device=device, dtype=logits.dtype
        )  # [m, 1]
        logits[at] = apply_repetition_penalty(logits[at], self.seen[slot_ids].to(device), penalty)  # type: ignore[index]

    def _start_grammar(self, request: Request) -> Any:
        if request.constraint is None:
            return None
        if self.grammars is None:
            raise RuntimeError("a constrained request reached a scheduler built without a grammar runtime")
        return self.grammars.start(request.constraint)

    def _mask_grammars(
        self, rows: list[tuple[int, Request]], logits: torch.Tensor, slots: list[Request | None], argmax: list[int]
    ) -> Generator[Event, None, dict[int, int]]:
        """Apply every constrained row's token mask to its logits (one batched mask computation per step);
        returns the tokens it chose for greedy rows (see ``GrammarRuntime.mask_logits``).

        A row whose grammar allows no token at all (an unsatisfiable schema) ends as ``out_of_tokens``.
        """

        constrained = [
            MaskRow(k, row.grammar, row.params.greedy and not row.params.logprobs)
            for k, (_, row) in enumerate(rows)
            if row.grammar is not None
        ]
        chosen = self.grammars.mask_logits(logits, constrained, argmax)
        for item in constrained:
            if item.state.dead:
                slot, row = rows[item.index]
                slots[slot] = None
                yield Event(row.index, None, stop_reason="out_of_tokens")
        return chosen

    def _stop_string_hit(self, row: Request) -> int | None:
        """Character offset where the first stop string starts in the text so far, if any.

        Checked after every token, so a new hit can only involve the last few tokens: only that tail is
        decoded on the hot path (a character spans at most 4 tokens), the whole text only on a hit.
        """
        stops = row.params.stop
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
