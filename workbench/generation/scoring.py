"""Memory-light teacher-forced scoring: log-probabilities of given continuation tokens, and whether each is
the greedy choice, without ``[len, vocab]`` logits for every position.

Why: likelihood evaluations (lm-eval's loglikelihood, multiple choice, perplexity) need one number per
continuation token, yet ``Generator.logits`` materialises float32 logits for every position (1 GiB per
2,048-token row at a 128k vocabulary) and runs the output projection — on small models most of the work —
over context positions whose logits are thrown away.  Here the decoder layers run over the sequences and
only the hidden states of continuation positions are projected, a chunk of positions at a time, each chunk
reduced to (log-prob of its target, argmax == target) before the next.

The forward is the generator's prefill without its output projection (``Transformer.hidden_packed``):
rows packed end to end (no padding) into cache slots, and shared prefixes computed once — rows of one wave
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

from workbench.generation import generator as _gen
from workbench.generation.sampling import SamplingParams

# Bytes of float32 logits one projection chunk may hold ([chunk, V]): 64 MiB is 130 positions at 128k.
SCORE_CHUNK_BYTES = 64 * 2**20


@torch.inference_mode()
def score(gen: _gen.Generator, sequences: Sequence[Sequence[int]],
          starts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Score ``sequences[i][starts[i]:]``, each token given every token before it, on ``gen``'s model and KV
    cache (the runners call this next to ``gen.generate`` / ``gen.logits``).

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
    width = gen.max_batch_size
    for begin in range(0, len(order), width):
        wave = order[begin : begin + width]
        rows = [(slot, unique[u], first[u]) for slot, u in enumerate(wave)]
        for slot, h in zip(range(len(wave)), _wave_hidden(gen, rows)):
            hidden[wave[slot]] = h
        for slot, tokens, _ in rows:
            gen._resident[slot] = _gen._Row(_record(tokens), None)  # the slot now holds the row's keys/values
    return _project(gen, sequences, starts, inputs, first, hidden)


def _record(tokens: list[int]) -> _gen.Request:
    """A placeholder request whose prompt is what a slot holds (the generator's resident records)."""
    return _gen.Request(-1, tokens, SamplingParams.create())


def _wave_hidden(gen: _gen.Generator, rows: list[tuple[int, list[int], int]]) -> list[torch.Tensor]:
    """Prefill each (slot, tokens, first) into its slot and return the final hidden states of positions
    ``first..len-1`` of each row ([len - first, D]); positions before ``first`` may come from a prefix."""
    if gen.share_prefixes:
        # prefixes several rows share and no slot holds: computed once, in the first sharer's slot
        shared = gen._shared_prefixes([(slot, _record(tokens[: first + 1])) for slot, tokens, first in rows])
        if shared:
            _fill_hidden(gen, [(slot, prefix, len(prefix) - 1) for slot, prefix in shared])
            for slot, prefix in shared:
                gen._resident[slot] = _gen._Row(_record(prefix), None)
    return _fill_hidden(gen, rows)


def _fill_hidden(gen: _gen.Generator, rows: list[tuple[int, list[int], int]]) -> list[torch.Tensor]:
    """Write each row's keys/values into its slot, starting from the longest prefix a slot holds (never past
    position ``first``, which is computed), and return the hidden states of positions ``first..`` of each."""
    held = gen._resident_tokens() if gen.share_prefixes else {}
    starts, copies = [], []
    for slot, tokens, first in rows:
        best, best_len = slot, _gen.common_prefix(tokens, held[slot], first) if slot in held else 0
        for src, held_tokens in held.items():
            n = _gen.common_prefix(tokens, held_tokens, first)
            if src != slot and n >= _gen.MIN_SHARED_PREFIX and n > best_len:
                best, best_len = src, n
        starts.append(best_len)
        if best_len and best != slot:
            copies.append((best, slot, best_len))
    for slot, _, _ in rows:
        gen._resident[slot] = None  # its keys/values are about to change
    if copies:
        gen._copy_prefixes(copies)
    lengths = [len(tokens) - n for (_, tokens, _), n in zip(rows, starts)]
    gen.stats["prefill_tokens"] += sum(lengths)
    gen.stats["reused_tokens"] += sum(starts)
    out: list[torch.Tensor] = []
    for group in gen._packed_groups(lengths):
        tokens = torch.tensor([[t for j in group for t in rows[j][1][starts[j] :]]], device=gen.model.device)  # [1, N]
        h = gen.model.hidden_packed(tokens, [lengths[j] for j in group], [starts[j] for j in group], gen.cache,
                                    [rows[j][0] for j in group])  # [N, D]
        offset = 0
        for j in group:
            skip = rows[j][2] - starts[j]  # computed positions before the first scored one
            out.append(h[offset + skip : offset + lengths[j]])
            offset += lengths[j]
    return out


def _project(gen: _gen.Generator, sequences: Sequence[Sequence[int]], starts: Sequence[int],
             inputs: dict[tuple[int, ...], int], first: list[int],
             hidden: list[torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
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
    chunk = max(1, SCORE_CHUNK_BYTES // (4 * gen.model.args.vocab_size))
    by_row = torch.argsort(where_t, stable=True)
    sorted_where = where_t[by_row]
    for a in range(0, states.shape[0], chunk):
        b = min(a + chunk, states.shape[0])
        lo, hi = torch.searchsorted(sorted_where, torch.tensor([a, b], device=states.device)).tolist()
        if lo == hi:
            continue
        logits = gen.model.project(states[a:b])  # float32 [b - a, V]
        logp = torch.log_softmax(logits, dim=-1)
        pick = by_row[lo:hi]
        local = where_t[pick] - a
        logprobs[pick] = logp[local, target_t[pick]]
        greedy[pick] = logits.argmax(dim=-1)[local] == target_t[pick]
    return logprobs.cpu(), greedy.cpu(), counts
