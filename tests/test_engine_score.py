"""``engine.score``: log-probabilities of given continuation tokens and their greedy flags, without full logits.

Pinned: equal to ``log_softmax(engine.logits(...))`` at the scored positions (and to Meta's reference model) for
both families; only the scored positions are projected, a bounded chunk at a time; shared contexts are computed
once (within a call, across waves and across calls) with the same numbers as recomputing them; bad input is a
named error; model parallelism gives the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from oracle import reference_logits

import workbench as wb
from workbench.errors import InputError, PromptTooLongError
from workbench.generation import scoring

ATOL = 1e-5  # score vs logits of the same engine (packed, prefix-reusing forward vs one padded forward)
REF_ATOL = 1e-4  # vs the reference model


def rows_for(engine: wb.Engine) -> tuple[list[list[int]], list[int]]:
    """Mixed rows: one shared context with several answers (three of one token: identical inputs),
    unrelated rows, a row scored from its second token."""
    tok = engine.tokenizer
    context = tok.encode(
        "A shared context that every answer of this question repeats word for word, again and again, "
        "as contexts of multiple-choice questions do",
        bos=True,
    )
    answers = [" yes it is", " no, it is not at all", " maybe", " B", " C"]
    sequences = [context + tok.encode(a) for a in answers]
    starts = [len(context)] * len(answers)
    for text in ("Unrelated text about llamas.", "Another one", "Short"):
        sequences.append(tok.encode(text, bos=True))
        starts.append(3 if len(sequences[-1]) > 3 else 1)
    sequences.append(tok.encode("Every token after BOS is scored here", bos=True))
    starts.append(1)
    return sequences, starts


def expected(logits: torch.Tensor, sequence: list[int], start: int) -> tuple[torch.Tensor, list[bool]]:
    """Log-probs and greedy flags of ``sequence[start:]`` from full logits of ``sequence[:-1]``."""
    rows = logits[start - 1 :]  # [n, V]
    target = torch.tensor(sequence[start:])
    logp = torch.log_softmax(rows, dim=-1)[torch.arange(len(target)), target]
    return logp, (rows.argmax(-1) == target).tolist()


@pytest.fixture(scope="module", params=["llama3", "llama4"])
def ckpt(request: pytest.FixtureRequest, llama3_dir: Path, llama4_dir: Path) -> Path:
    return llama3_dir if request.param == "llama3" else llama4_dir


@pytest.fixture(scope="module")
def engine(ckpt: Path) -> wb.Engine:
    return wb.load(ckpt, max_seq_len=64, max_batch_size=4)  # 9 rows: three waves


def test_score_equals_logits_and_the_reference(engine: wb.Engine, ckpt: Path) -> None:
    sequences, starts = rows_for(engine)
    scored = engine.score(sequences, starts)
    logits = engine.logits([s[:-1] for s in sequences])
    reference = reference_logits(ckpt, [s[:-1] for s in sequences])
    for seq, start, row, full, ref in zip(sequences, starts, scored, logits, reference):
        assert len(row.logprobs) == len(row.greedy) == len(seq) - start
        want, greedy = expected(full, seq, start)
        torch.testing.assert_close(torch.tensor(row.logprobs), want, atol=ATOL, rtol=0)
        assert row.greedy == greedy
        torch.testing.assert_close(torch.tensor(row.logprobs), expected(ref, seq, start)[0], atol=REF_ATOL, rtol=0)
        assert row.logprob == pytest.approx(sum(row.logprobs)) and row.is_greedy == all(row.greedy)


def test_only_scored_positions_are_projected_in_bounded_chunks(
    engine: wb.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sequences, starts = rows_for(engine)
    vocab = engine.args.vocab_size
    monkeypatch.setattr(scoring, "SCORE_CHUNK_BYTES", 4 * vocab * 3)  # 3 positions per projection
    projected: list[int] = []
    model = engine._runner.model
    real = model.project
    monkeypatch.setattr(model, "project", lambda h: projected.append(h.shape[0]) or real(h))
    monkeypatch.setattr(model, "forward_full", lambda *a, **k: pytest.fail("scoring must not run full logits"))
    engine.score(sequences, starts)
    # positions needed: per distinct input, from its earliest scored position to its end
    distinct = {}
    for seq, start in zip(sequences, starts):
        key = tuple(seq[:-1])
        distinct[key] = min(distinct.get(key, len(key)), start - 1)
    assert sum(projected) == sum(len(key) - first for key, first in distinct.items())
    assert max(projected) <= 3


def test_shared_contexts_are_computed_once_with_the_same_numbers(engine: wb.Engine) -> None:
    sequences, starts = rows_for(engine)
    context = starts[0]  # the five answers' rows need positions from context - 1 on: that much is shareable
    assert context - 1 >= 16  # long enough to be shared (MIN_SHARED_PREFIX)
    scheduler = engine._runner.scheduler
    scheduler.forget_prefixes()
    scheduler.share_prefixes = False
    try:
        before = scheduler.stats["prefill_tokens"]
        whole = engine.score(sequences, starts)
        computed_whole = scheduler.stats["prefill_tokens"] - before
    finally:
        scheduler.share_prefixes = True
    distinct = {tuple(s[:-1]) for s in sequences}  # " maybe", " B" and " C" are one token: one input
    assert computed_whole == sum(len(k) for k in distinct)
    with_context = [k for k in distinct if list(k[:context]) == sequences[0][:context]]
    assert len(with_context) == 3
    scheduler.forget_prefixes()
    before = scheduler.stats["prefill_tokens"]
    shared = engine.score(sequences, starts)
    # one input computes the context, the two others reuse it (in its wave or from its slot in a later one)
    assert scheduler.stats["prefill_tokens"] - before <= computed_whole - 2 * (context - 1)
    before = scheduler.stats["prefill_tokens"]
    again = engine.score(sequences[:5], starts[:5])  # still resident: reused across calls, by all three
    assert scheduler.stats["prefill_tokens"] - before <= sum(len(k) for k in with_context) - 3 * (context - 1)
    for a, b in zip(whole, shared):
        assert b.logprobs == pytest.approx(a.logprobs, abs=ATOL) and b.greedy == a.greedy
    for a, b in zip(shared[:5], again):
        assert b.logprobs == pytest.approx(a.logprobs, abs=ATOL)


def test_generation_after_scoring_is_unchanged(engine: wb.Engine) -> None:
    prompts = [engine.tokenizer.encode("A shared context that every answer", bos=True), [engine.tokenizer.bos_id, 9]]
    engine._runner.scheduler.forget_prefixes()
    fresh = [c.tokens for c in engine.batch_completion(prompts, max_tokens=5)]
    engine.score(*rows_for(engine))  # leaves its rows resident in the slots
    assert [c.tokens for c in engine.batch_completion(prompts, max_tokens=5)] == fresh


def test_bad_input_is_named(engine: wb.Engine) -> None:
    bos = engine.tokenizer.bos_id
    with pytest.raises(InputError, match="list of token-id lists"):
        engine.score([bos, 5, 6])
    with pytest.raises(InputError, match=r"start 0 .* must be an int in 1\.\.2"):
        engine.score([[bos, 5, 6]], 0)
    with pytest.raises(InputError, match="start 3"):
        engine.score([[bos, 5, 6]], [3])
    with pytest.raises(InputError, match="2 sequences but 1 starts"):
        engine.score([[bos, 5], [bos, 6]], [1])
    with pytest.raises(InputError, match="not a token id"):
        engine.score([[bos, -1]])
    with pytest.raises(PromptTooLongError, match="needs 65 positions but max_seq_len is 64"):
        engine.score([[bos] * 66])
    assert engine.score([]) == []
    assert len(engine.score([[bos] * 65])[0].logprobs) == 64  # exactly max_seq_len positions fit


@pytest.mark.slow
def test_model_parallel_scores_the_same(llama3_dir: Path) -> None:
    one = wb.load(llama3_dir, max_seq_len=64, max_batch_size=4)
    sequences, starts = rows_for(one)
    want = one.score(sequences, starts)
    two = wb.load(llama3_dir, max_seq_len=64, max_batch_size=4, model_parallel_size=2)
    try:
        got = two.score(sequences, starts)
    finally:
        wb.unload()
    for a, b in zip(want, got):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4) and b.greedy == a.greedy
