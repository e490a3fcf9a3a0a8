"""Graphed decode (``wb.load(..., cuda_graphs=True)``): fixed-shape steps per (batch, span) bucket.  On this CPU
the same fixed-shape steps run uncaptured (the clean fallback), and must give the eager tokens."""

from __future__ import annotations

import random

import pytest
import torch

import workbench as wb
from workbench.errors import CompileError
from workbench.generation.graphs import MIN_SPAN, StaticDecode, buckets
from workbench.session import build_engine, resolve_settings

MAX_TOKENS = 8


def _engine(ckpt, max_batch_size=4, max_seq_len=320):
    return build_engine(resolve_settings(ckpt, max_batch_size=max_batch_size, max_seq_len=max_seq_len))


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 60000) for _ in range(n)]


def test_buckets_cover_every_width_and_span():
    assert buckets(1) == [1] and buckets(6) == [1, 2, 4, 6] and buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets(320, MIN_SPAN) == [256, 320] and buckets(100, MIN_SPAN) == [100]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_fixed_shape_steps_give_the_eager_tokens(llama3_dir, llama4_dir, family):
    """Mixed lengths, waves through 4 slots (rows at different positions, free slots inside the width, padding
    rows past it), prefix reuse, a span crossing its first bucket (256) and llama4's 32-token chunks."""
    engine = _engine(llama3_dir if family == "llama3" else llama4_dir)
    rng = random.Random(5)
    prompts = [_ids(rng, n) for n in (5, 40, 12, 33, 2, 60, 250)]
    shared = prompts[1][:30]
    prompts += [shared + _ids(rng, 4), shared + _ids(rng, 9)]  # share a resident prefix with an earlier row
    eager = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    single = engine.completion(prompts[3], max_tokens=MAX_TOKENS).tokens
    sampled = engine.completion(prompts[0], max_tokens=MAX_TOKENS, temperature=0.8, seed=3).tokens
    info = engine.use_cuda_graphs()
    assert info["graphs"] == 0 and "no CUDA device" in info["fallback"]  # CPU: uncaptured, no graphs
    assert info["widths"] == [1, 2, 4] and info["spans"] == [256, 320]
    assert engine.info()["cuda_graphs"] == info
    static = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    assert static == eager
    assert engine.completion(prompts[3], max_tokens=MAX_TOKENS).tokens == single
    assert engine.completion(prompts[0], max_tokens=MAX_TOKENS, temperature=0.8, seed=3).tokens == sampled
    engine.close()


def test_fixed_shape_logits_equal_the_eager_step(llama4_dir):
    """One step, rows at unequal positions: the static step's logits are the eager step's (masked keys add 0)."""
    engine = _engine(llama4_dir)
    model = engine._runner.model
    cache = model.new_cache(4, 320)
    tokens, positions = [1001, 1002, 1003], [64, 40, 9]
    for p in range(65):  # keys/values at positions 0..64 of rows 0..2, written by eager steps
        model.forward_decode(torch.tensor([1000 + p % 7, 2000 + p, 3000 + p % 3]), torch.tensor([p] * 3), cache)
    eager = model.forward_decode(torch.tensor(tokens), torch.tensor(positions), cache)  # [3, V]
    step = StaticDecode(model, cache)
    logits, greedy = step(tokens, positions)
    torch.testing.assert_close(logits, eager, rtol=1e-5, atol=1e-5)
    assert greedy.tolist() == eager.argmax(-1).tolist()
    assert step.bucket(3, 64) == (4, 256) and step.bucket(1, 300) == (1, 320)
    with pytest.raises(ValueError, match="exceed the cache"):
        step.bucket(5, 10)
    engine.close()


def test_cuda_graphs_are_refused_cleanly_where_they_cannot_run(llama3_dir, monkeypatch):
    engine = _engine(llama3_dir)
    before = [r.tokens for r in engine.batch_completion([[1000, 1001], [1002]], max_tokens=4)]

    def broken(self):
        raise RuntimeError("capture failed: operation not permitted when stream is capturing")

    monkeypatch.setattr(engine._runner.model.__class__, "device", property(lambda self: torch.device("cuda")))
    monkeypatch.setattr(StaticDecode, "capture", broken)
    monkeypatch.setattr(StaticDecode, "__post_init__", lambda self: None)
    with pytest.raises(CompileError, match="capture failed.*keeps decoding eagerly"):
        engine.use_cuda_graphs()
    monkeypatch.undo()
    assert engine.info()["cuda_graphs"] is None and engine._runner.scheduler.static is None
    after = [r.tokens for r in engine.batch_completion([[1000, 1001], [1002]], max_tokens=4)]
    assert after == before
    engine.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu.py runs it on one)")
def test_graphs_replay_the_eager_tokens_on_a_gpu(llama3_dir):
    # float32: the graphed step's masked SDPA and the eager step's kernels then agree to fp32 rounding
    settings = dict(device="cuda", dtype="float32", max_batch_size=8, max_seq_len=320)
    engine = wb.load(str(llama3_dir), **settings)
    rng = random.Random(2)
    prompts = [_ids(rng, n) for n in (5, 40, 12, 33, 2, 60, 250)]
    eager = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    info = wb.load(str(llama3_dir), **settings, cuda_graphs=True).info()
    assert info["cuda_graphs"]["graphs"] == len(info["cuda_graphs"]["widths"]) * len(info["cuda_graphs"]["spans"])
    assert info["cuda_graphs"]["capture_s"] > 0
    assert [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)] == eager
    wb.unload()
