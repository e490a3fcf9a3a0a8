"""Batched generation over a static KV cache with continuous batching.

Every prompt owns one cache slot while it runs.  New prompts are prefilled whole (one forward for
all prompts admitted together, right-padded), then all running rows decode one token per step at
their own positions.  A row that stops frees its slot for the next waiting prompt, so more prompts
than ``max_batch_size`` simply flow through.  Nothing here outlives a call except the cache, whose
stale contents are never read (attention masks stop at each row's position), so an exception or
``KeyboardInterrupt`` mid-batch leaves the generator ready for the next call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator as Generator_
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..models.transformer import Transformer
from ..types import StopReason, TokenLogprob
from .sampling import SamplingParams, sample_token

# Keep each prefill forward below this many (padded) tokens to bound activation memory.
MAX_PREFILL_TOKENS = 16384


@dataclass
class Request:
    index: int
    prompt: list[int]
    params: SamplingParams
    constraint: Any = None  # a structured.Constraint: the row's output must follow its grammar


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

    @property
    def position(self) -> int:
        """Cache position of the last sampled token (the next one fed to the model)."""
        return len(self.request.prompt) + len(self.tokens) - 1


class Generator:
    """Runs requests through a model with a preallocated KV cache of ``max_batch_size`` slots."""

    def __init__(self, model: Transformer, *, stop_tokens: dict[int, StopReason], decode_text,
                 max_batch_size: int, max_seq_len: int, grammars: Any = None) -> None:  # fmt: skip
        self.model = model
        self.grammars = grammars  # structured.GrammarRuntime (token masks of constrained rows), or None
        self.stop_tokens = stop_tokens
        self.decode_text = decode_text  # ids -> str, for stop strings and logprob labels
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.cache = model.new_cache(max_batch_size, max_seq_len)

    # ----------------------------------------------------------------------------- public
    def generate(self, requests: Sequence[Request]) -> Iterator[Event]:
        """Yield events in generation order (rows interleave); each request ends with one stop event."""
        pending = deque(requests)
        slots: list[_Row | None] = [None] * min(self.max_batch_size, len(requests))
        while pending or any(slots):
            free = [i for i, row in enumerate(slots) if row is None]
            if free and pending:
                admitted = [(slot, pending.popleft()) for slot in free[: len(pending)]]
                yield from self._prefill(admitted, slots)
            active = [i for i, row in enumerate(slots) if row is not None]
            if active:
                yield from self._decode(slots, active[-1] + 1)

    @torch.inference_mode()
    def logits(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Teacher-forced float32 logits ``[len, V]`` of each sequence (batched, padded)."""
        out: list[torch.Tensor | None] = [None] * len(token_lists)
        for group in self._prefill_groups(list(range(len(token_lists))), [len(t) for t in token_lists]):
            tokens = self._padded([token_lists[i] for i in group])
            logits = self.model.forward_full(tokens)  # [b, T, V]
            for j, i in enumerate(group):
                out[i] = logits[j, : len(token_lists[i])].cpu()
        return out  # type: ignore[return-value]

    # ----------------------------------------------------------------------------- steps
    def _padded(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        width = max(len(p) for p in prompts)
        tokens = torch.zeros((len(prompts), width), dtype=torch.long)
        for j, p in enumerate(prompts):
            tokens[j, : len(p)] = torch.tensor(p, dtype=torch.long)
        return tokens.to(self.model.device)  # [b, T]

    def _prefill_groups(self, order: list[int], lengths: list[int]) -> Iterator[list[int]]:
        """Split into forwards of similar lengths, each under MAX_PREFILL_TOKENS padded tokens."""
        group: list[int] = []
        real = 0  # unpadded tokens in the group
        for i in sorted(order, key=lambda i: lengths[i]):
            padded = lengths[i] * (len(group) + 1)  # ascending order: the newcomer sets the width
            if group and (padded > MAX_PREFILL_TOKENS or padded > 2 * (real + lengths[i]) + 64):
                yield group
                group, real = [], 0
            group.append(i)
            real += lengths[i]
        if group:
            yield group

    @torch.inference_mode()
    def _prefill(self, admitted: list[tuple[int, Request]], slots: list[_Row | None]) -> Iterator[Event]:
        lengths = [len(r.prompt) for _, r in admitted]
        for group in self._prefill_groups(list(range(len(admitted))), lengths):
            tokens = self._padded([admitted[j][1].prompt for j in group])
            rows = torch.tensor([admitted[j][0] for j in group], device=self.model.device)
            last = torch.tensor([lengths[j] - 1 for j in group], device=self.model.device)
            logits = self.model.forward_full(tokens, cache=self.cache, cache_rows=rows, logit_index=last)  # [b, V]
            new_rows = []
            for j in group:
                slot, request = admitted[j]
                slots[slot] = _Row(request, request.params.make_generator(), grammar=self._start_grammar(request))
                new_rows.append((slot, slots[slot]))
            yield from self._advance_all(new_rows, logits, slots)

    @torch.inference_mode()
    def _decode(self, slots: list[_Row | None], width: int) -> Iterator[Event]:
        tokens = torch.zeros(width, dtype=torch.long)
        positions = torch.zeros(width, dtype=torch.long)
        for i in range(width):
            row = slots[i]
            if row is not None:
                tokens[i] = row.tokens[-1]
                positions[i] = row.position
        device = self.model.device
        logits = self.model.forward_decode(tokens.to(device), positions.to(device), self.cache)  # [W, V]
        live = [i for i in range(width) if slots[i] is not None]
        yield from self._advance_all([(i, slots[i]) for i in live], logits[live] if len(live) < width else logits,
                                     slots)  # fmt: skip

    def _advance_all(self, rows: list[tuple[int, _Row]], logits: torch.Tensor,
                     slots: list[_Row | None]) -> Iterator[Event]:  # fmt: skip
        """Pick every row's next token from ``logits`` [n, V] (one argmax for all greedy rows)."""
        chosen: dict[int, int] = {}  # rows whose grammar already decided their greedy token
        if any(row.grammar is not None for _, row in rows):
            chosen = yield from self._mask_grammars(rows, logits, slots)
        need_argmax = any(r.request.params.greedy and k not in chosen for k, (_, r) in enumerate(rows))
        greedy = logits.argmax(dim=-1).tolist() if need_argmax else []
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
                 slot: int) -> Iterator[Event]:  # fmt: skip
        """Emit the row's new ``token`` and free the slot if the row is done."""
        params = row.request.params
        logprob = self._logprob(logits, token, params.logprobs) if params.logprobs else None
        index = row.request.index
        if token in self.stop_tokens:
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

    def _mask_grammars(self, rows: list[tuple[int, _Row]], logits: torch.Tensor,
                       slots: list[_Row | None]) -> Generator_[Event, None, dict[int, int]]:  # fmt: skip
        """Apply every constrained row's token mask to its logits (one batched mask computation per step);
        returns the tokens it chose for greedy rows (see ``GrammarRuntime.mask_logits``).

        A row whose grammar allows no token at all (an unsatisfiable schema) ends as ``out_of_tokens``.
        """
        from ..structured.runtime import MaskRow

        constrained = [MaskRow(k, row.grammar, row.request.params.greedy and not row.request.params.logprobs)
                       for k, (_, row) in enumerate(rows) if row.grammar is not None]  # fmt: skip
        chosen = self.grammars.mask_logits(logits, constrained)
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
