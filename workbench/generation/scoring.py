"""Memory-light teacher-forced scoring: log-probabilities of given continuation tokens, and whether each is
the greedy choice, without ``[len, vocab]`` logits for every position.

Why: likelihood evaluations (lm-eval's loglikelihood, multiple choice, perplexity) need one number per
continuation token, yet ``Scheduler.logits`` materialises float32 logits for every position (1 GiB per
2,048-token row at a 128k vocabulary) and runs the output projection — on small models most of the work —
over context positions whose logits are thrown away.  Here the decoder layers run over the sequences and
only the hidden states of continuation positions are projected, a chunk of positions at a time, each chunk
reduced to (log-prob of its target, argmax == target) before the next.

The forward is the scheduler's prefill without its output projection (``Transformer.hidden_packed``):
rows packed end to end (no padding) into cache slots, and shared prefixes computed once through the same
:class:`~workbench.generation.prefix_cache.PrefixCache` — rows of one wave
(sorted, so neighbours share the most) that share a prefix get it computed once and copied, and a prefix
some slot still holds (an earlier wave's or call's sequence, e.g. a few-shot preamble every document
repeats) is copied instead of recomputed.  Rows whose inputs are identical (one context, one-token answers
that differ only in their last token) share one forward and one projection per position.  After a call
each used slot holds its row's input tokens, like a finished generation row, so later calls (scoring or
generation) may reuse them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.generation import batching
from workbench.generation.prefix_cache import PrefixCache
from workbench.models.transformer import Transformer

# Bytes of float32 logits one projection chunk may hold ([chunk, V]): 64 MiB is 130 positions at 128k.
SCORE_CHUNK_BYTES = 64 * 2**20


@torch.inference_mode()
def score(
    model: Transformer, prefix_cache: PrefixCache, sequences: Sequence[Sequence[int]], starts: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Score ``sequences[i][starts[i]:]``, each token given every token before it, on ``model`` and the KV
    cache whose slots ``prefix_cache`` keeps (the scheduler's :meth:`~workbench.generation.scheduler.Scheduler.score`).

    Validated by the caller: ``1 <= starts[i] < len(sequences[i])`` and ``len(sequences[i]) - 1`` fits the
    cache.  Returns flat float32 log-probs [K] and bool greedy flags [K] (row after row, ``len - start``
    values each) and the per-row counts.
    """
    inputs: dict[tuple[int, ...], int] = {}  # distinct model inputs (a sequence without its last token)
    for seq in sequences:
        inputs.setdefault(tuple(seq[:-1]), len(inputs))
    unique = [list(key) for key in inputs]
    first = [len(u) for u in unique]  # earliest position of each input whose hidden state is needed
    for seq, start in zip(sequences, starts):
        u = inputs[tuple(seq[:-1])]
        first[u] = min(first[u], start - 1)
    order = sorted(range(len(unique)), key=lambda u: unique[u])  # neighbours share the longest prefixes
    hidden: list[torch.Tensor | None] = [None] * len(unique)  # [len(u) - first[u], D] each
    width = prefix_cache.slots
    for begin in range(0, len(order), width):
        wave = order[begin : begin + width]
        rows = [(slot, unique[u], first[u]) for slot, u in enumerate(wave)]
        for slot, h in zip(range(len(wave)), _wave_hidden(model, prefix_cache, rows)):
            hidden[wave[slot]] = h
        for slot, tokens, _ in rows:
            prefix_cache.hold(slot, tokens)  # the slot now holds the row's keys/values
    return _project(model, sequences, starts, inputs, first, hidden)


def _wave_hidden(
    model: Transformer, prefix_cache: PrefixCache, rows: list[tuple[int, list[int], int]]
) -> list[torch.Tensor]:
    """Prefill each (slot, tokens, first) into its slot and return the final hidden states of positions
    ``first..len-1`` of each row ([len - first, D]); positions before ``first`` may come from a prefix."""
    # prefixes several rows share and no slot holds: computed once, in the first sharer's slot
    shared = prefix_cache.shared_prefixes([(slot, tokens[: first + 1]) for slot, tokens, first in rows])
    if shared:
        _fill_hidden(model, prefix_cache, [(slot, prefix, len(prefix) - 1) for slot, prefix in shared])
        for slot, prefix in shared:
            prefix_cache.hold(slot, prefix)
    return _fill_hidden(model, prefix_cache, rows)


def _fill_hidden(
    model: Transformer, prefix_cache: PrefixCache, rows: list[tuple[int, list[int], int]]
) -> list[torch.Tensor]:
    """Write each row's keys/values into its slot, starting from the longest prefix a slot holds (never past
    position ``first``, which is computed), and return the hidden states of positions ``first..`` of each."""
    starts = prefix_cache.prepare(rows)
    out: list[torch.Tensor] = []
    for batch in batching.packed_batches([(slot, tokens) for slot, tokens, _ in rows], starts, model):
        h = model.hidden_packed(batch.tokens, batch.lengths, batch.starts, prefix_cache.cache, batch.slots)  # [N, D]
        offset = 0
        for j, length in zip(batch.rows, batch.lengths):
            skip = rows[j][2] - starts[j]  # computed positions before the first scored one
            out.append(h[offset + skip : offset + length])
            offset += length
    return out


def _project(
    model: Transformer,
    sequences: Sequence[Sequence[int]],
    starts: Sequence[int],
    inputs: dict[tuple[int, ...], int],
    first: list[int],
    hidden: list[torch.Tensor | None],
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Project the needed hidden states in chunks and reduce each chunk to its targets' log-probs."""
    offsets, total = [], 0
    for h in hidden:
        offsets.append(total)
        total += h.shape[0]  # type: ignore[union-attr]
    states = torch.cat([h for h in hidden if h is not None])  # [M, D]: each needed position once
    where, targets, counts = [], [], []
    for seq, start in zip(sequences, starts):
        u = inputs[tuple(seq[:-1])]
        base = offsets[u] + (start - 1 - first[u])
        where.extend(range(base, base + len(seq) - start))
        targets.extend(seq[start:])
        counts.append(len(seq) - start)
    where_t = torch.tensor(where, device=states.device)  # [K] row of `states` predicting each target
    target_t = torch.tensor(targets, device=states.device)  # [K]
    logprobs = torch.empty(len(targets), dtype=torch.float32, device=states.device)
    greedy = torch.empty(len(targets), dtype=torch.bool, device=states.device)
    chunk = max(1, SCORE_CHUNK_BYTES // (4 * model.args.vocab_size))
    by_row = torch.argsort(where_t, stable=True)
    sorted_where = where_t[by_row]
    for a in range(0, states.shape[0], chunk):
        b = min(a + chunk, states.shape[0])
        lo, hi = torch.searchsorted(sorted_where, torch.tensor([a, b], device=states.device)).tolist()
        if lo == hi:
            continue
        logits = model.project(states[a:b])  # float32 [b - a, V]
        logp = torch.log_softmax(logits, dim=-1)
        pick = by_row[lo:hi]
        local = where_t[pick] - a
        logprobs[pick] = logp[local, target_t[pick]]
        greedy[pick] = logits.argmax(dim=-1)[local] == target_t[pick]
    return logprobs.cpu(), greedy.cpu(), counts
