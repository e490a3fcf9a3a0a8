"""Cells for 03_throughput.ipynb (or 01): the batch-invariant mode — one prompt's log-probabilities alone and
inside batches of 1, 4 and 16 with random neighbours, default mode vs ``batch_invariant=True``, and its cost."""

from __future__ import annotations

from cells.common import IGNORE, LOAD

INVARIANCE = [
    (
        "md",
        """## Batch invariance: does a row's answer depend on its neighbours?

In the default mode the CPU's matmul and attention kernels pick their order of summation from the shapes they
are given, so one prompt's log-probabilities move in the last bits with the batch it runs in, its neighbours'
lengths and a warm prefix cache — enough, near a tie, to flip a greedy token or a sampled one. With
`wb.load(..., batch_invariant=True)` every product has a shape fixed by the row's own tokens (linears in
16-row tiles, attention in 16-position tiles over the KV cache), so a row's numbers are **bit-identical** to
the same row alone. Below: the same prompt alone and among 0, 3 and 15 random neighbours, both modes, then the
mode's cost on one batch (`bench/invariant.py` measures it on `bench/peers.py`'s workloads).""",
    ),
    (
        "code",
        LOAD
        + """
import random
import time

import pandas as pd
import torch

PROMPT = "The three most useful things to pack for a week of hiking in the mountains are"


def neighbours(engine, n, seed):
    \"\"\"n random token prompts of random lengths (3 to 200 tokens).\"\"\"
    rng = random.Random(seed)
    vocab = engine.tokenizer.n_words if hasattr(engine.tokenizer, "n_words") else 100000
    return [[rng.randrange(1000, min(vocab, 100000)) for _ in range(rng.randrange(3, 200))] for _ in range(n)]


def compare(engine, label):
    \"\"\"The prompt's 16 greedy log-probs and teacher-forced logits alone, then in batches of 1, 4 and 16.\"\"\"
    alone = engine.batch_completion([PROMPT], max_tokens=16, temperature=0.0, logprobs=1)[0]
    ids = engine.tokenizer.encode(PROMPT, bos=True, eos=False)
    alone_lp = torch.tensor([t.logprob for t in alone.logprobs])
    alone_logits = engine.logits([ids + alone.tokens])[0]
    rows = []
    for size in (1, 4, 16):
        others = neighbours(engine, size - 1, seed=size)
        where = size // 2
        batch = others[:where] + [PROMPT] + others[where:]
        got = engine.batch_completion(batch, max_tokens=16, temperature=0.0, logprobs=1)[where]
        lp = torch.tensor([t.logprob for t in got.logprobs])
        logits = engine.logits(others[:where] + [ids + got.tokens] + others[where:])[where]
        same_len = min(len(lp), len(alone_lp))
        rows.append({
            "mode": label,
            "batch": size,
            "same tokens": got.tokens == alone.tokens,
            "max |Δ logprob|": float((lp[:same_len] - alone_lp[:same_len]).abs().max()),
            "max |Δ logit|": float((logits - alone_logits).abs().max()) if logits.shape == alone_logits.shape else None,
            "bit-identical": got.tokens == alone.tokens and torch.equal(lp, alone_lp)
            and torch.equal(logits, alone_logits),
        })
    return rows


def seconds(engine, repeats=3):
    \"\"\"Median seconds of one call: 16 prompts, 16 new tokens each.\"\"\"
    batch = [PROMPT] + neighbours(engine, 15, seed=99)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.batch_completion(batch, max_tokens=16, temperature=0.0)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


engine = wb.load(CHECKPOINT, max_batch_size=16, max_seq_len=512)
default_rows, default_s = compare(engine, "default"), seconds(engine)
engine.batch_invariant = True  # switched in place: the weights are re-loaded with the invariant kernels
invariant_rows, invariant_s = compare(engine, "batch_invariant"), seconds(engine)
table = pd.DataFrame(default_rows + invariant_rows)
table""",
        IGNORE,
    ),
    (
        "code",
        """assert table[table["mode"] == "batch_invariant"]["bit-identical"].all(), "a row moved in batch-invariant mode"
print(f"default: {default_s:.2f} s, batch_invariant: {invariant_s:.2f} s per call "
      f"(cost {100 * (invariant_s / default_s - 1):+.0f} %, measured once each on this machine)")
engine.batch_invariant = False  # back to the default kernels for the cells below""",
        IGNORE,
    ),
    (
        "md",
        """**What to look at:** in the default mode `max |Δ logprob|` is small but not zero (float32: a few 1e-6;
bfloat16 or quantized modes: up to 1e-2) — even for the batch of 1, which runs warm (the prompt's prefix is
reused from the cache, so only its last token is computed, in another shape than the cold run alone). In batch-invariant mode every difference is exactly `0.0` and
`bit-identical` is `True` for every batch. The cost line times one call per mode once here (a busy machine moves
it); `docs/benchmarks.md` has the alternating measurement on the `bench/peers.py` workloads, and
`docs/design/batch-invariance.md` what the mode does and does not guarantee (another machine's kernels or another
model-parallel size may give other — still batch-invariant — bits).""",
    ),
]
