"""The engine's batch APIs on real tiny checkpoints: batching exactness, stopping, sampling, logprobs."""

from __future__ import annotations

import pytest
import torch

import workbench as wb
from workbench.errors import InputError, PromptTooLongError, SamplingError, WorkbenchError
from workbench.session import build_engine, resolve_settings

# Very different lengths, including ones longer than the Llama 4 chunk (32 tokens).
PROMPTS = [
    "Hi",
    "The capital of France is",
    "Once upon a time " * 12,
    "def f(x):\n    return x * 2\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25",
    "a",
    "Llamas are domesticated South American camelids. " * 3,
    "Q: What is 17 * 23?\nA:",
    "🦙 ünïcödé test",
]


def engine_for(ckpt_dir, **kwargs) -> wb.Engine:
    return build_engine(resolve_settings(ckpt_dir, **kwargs))


@pytest.fixture(scope="module")
def llama4_engine(llama4_dir):
    return engine_for(llama4_dir, max_batch_size=16, max_seq_len=256)


@pytest.fixture(scope="module")
def llama3_engine(llama3_dir):
    return engine_for(llama3_dir, max_batch_size=16, max_seq_len=256)


@pytest.mark.parametrize("which", ["llama4_engine", "llama3_engine"])
def test_batched_greedy_equals_alone(which, request):
    engine = request.getfixturevalue(which)
    batched = engine.batch_completion(PROMPTS, max_tokens=40)
    assert len(batched) == len(PROMPTS)
    lengths = {r.prompt_tokens for r in batched}
    assert max(lengths) > 3 * min(lengths) and max(lengths) > 32
    for prompt, row in zip(PROMPTS, batched):
        alone = engine.completion(prompt, max_tokens=40)
        assert row.tokens == alone.tokens, prompt
        assert row.text == alone.text
        assert row.stop_reason == alone.stop_reason


def test_waves_beyond_max_batch_size(llama4_dir, llama4_engine):
    small = engine_for(llama4_dir, max_batch_size=3, max_seq_len=256)
    prompts = PROMPTS * 2  # 18 prompts through 3 slots
    rows = small.batch_completion(prompts, max_tokens=12)
    expected = llama4_engine.batch_completion(prompts, max_tokens=12)
    assert [r.tokens for r in rows] == [r.tokens for r in expected]
    assert all(len(r.tokens) == 12 and r.stop_reason == "out_of_tokens" for r in rows)


def test_token_id_prompts_are_used_as_given(llama3_engine):
    ids = llama3_engine.tokenizer.encode("The capital of France is", bos=True)
    from_text = llama3_engine.completion("The capital of France is", max_tokens=8)
    from_ids = llama3_engine.completion(ids, max_tokens=8)
    no_bos = llama3_engine.completion(ids[1:], max_tokens=8)
    assert from_ids.tokens == from_text.tokens
    assert from_ids.prompt_tokens == len(ids) and no_bos.prompt_tokens == len(ids) - 1


def test_max_tokens_and_max_seq_len(llama3_dir):
    engine = engine_for(llama3_dir, max_batch_size=2, max_seq_len=40)
    r = engine.completion("Hello there", max_tokens=5)
    assert len(r.tokens) == 5 and r.stop_reason == "out_of_tokens"
    prompt = list(range(1000, 1036))  # 36 tokens: room for 4 more
    r = engine.completion(prompt)
    assert len(r.tokens) == 4 and r.stop_reason == "out_of_tokens"


@pytest.mark.parametrize(
    "stop_name,reason", [("eot_id", "end_of_turn"), ("eom_id", "end_of_message"), ("eos_id", "end_of_turn")]
)
def test_stop_tokens_end_generation(llama3_dir, stop_name, reason):
    engine = engine_for(llama3_dir, max_batch_size=2, max_seq_len=128)
    free = engine.completion("The capital of France is", max_tokens=10)
    model = engine._runner.model
    stop_id = getattr(engine.tokenizer, stop_name)
    # Make the stop token score twice the 4th greedy token wherever that token would be chosen.
    with torch.no_grad():
        model.output.weight[stop_id] = 2.0 * model.output.weight[free.tokens[3]]
    stopped = engine.completion("The capital of France is", max_tokens=10)
    assert stopped.stop_reason == reason
    assert stop_id not in stopped.tokens
    assert len(stopped.tokens) <= 3 and stopped.tokens == free.tokens[: len(stopped.tokens)]


def test_stop_strings(llama3_engine):
    free = llama3_engine.completion("The capital of France is", max_tokens=12)
    needle = llama3_engine.tokenizer.decode(free.tokens[4:6])
    assert needle and needle in free.text
    cut = llama3_engine.completion("The capital of France is", max_tokens=12, stop=[needle, "\u2603never"])
    assert cut.stop_reason == "end_of_turn"
    assert needle not in cut.text and free.text.startswith(cut.text)
    assert cut.text == free.text[: free.text.find(needle)]
    assert len(cut.tokens) <= 6


def test_seeded_sampling_is_reproducible_and_batch_independent(llama4_engine):
    kw = dict(max_tokens=16, temperature=1.0, top_p=0.95, seed=123)
    a = llama4_engine.completion(PROMPTS[1], **kw)
    b = llama4_engine.completion(PROMPTS[1], **kw)
    c = llama4_engine.completion(PROMPTS[1], **{**kw, "seed": 7})
    batch = llama4_engine.batch_completion(PROMPTS[:4], **kw)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens
    assert batch[1].tokens == a.tokens
    greedy = llama4_engine.completion(PROMPTS[1], max_tokens=16)
    assert a.tokens != greedy.tokens


def test_top_k_one_and_tiny_top_p_equal_greedy(llama3_engine):
    greedy = llama3_engine.completion(PROMPTS[2], max_tokens=10)
    top_k = llama3_engine.completion(PROMPTS[2], max_tokens=10, temperature=1.3, top_k=1, seed=1)
    top_p = llama3_engine.completion(PROMPTS[2], max_tokens=10, temperature=1.3, top_p=1e-6, seed=2)
    assert top_k.tokens == greedy.tokens == top_p.tokens


def test_logprobs_are_logprobs_of_chosen_tokens(llama4_engine):
    for kw in (dict(), dict(temperature=0.8, seed=3)):
        r = llama4_engine.completion(PROMPTS[4], max_tokens=8, logprobs=3, **kw)
        assert r.logprobs is not None and len(r.logprobs) == len(r.tokens)
        prompt = llama4_engine.tokenizer.encode(PROMPTS[4], bos=True)
        logits = llama4_engine.logits([prompt + r.tokens])[0]
        reference = torch.log_softmax(logits, dim=-1)
        for i, (tok, lp) in enumerate(zip(r.tokens, r.logprobs)):
            assert lp.token == tok
            assert lp.logprob == pytest.approx(float(reference[len(prompt) - 1 + i, tok]), abs=1e-4)
            assert len(lp.top_tokens) == 3 and lp.logprob <= max(lp.top_logprobs.values()) + 1e-6
            if not kw:
                assert lp.top_tokens[0] == tok
    assert llama4_engine.completion(PROMPTS[4], max_tokens=2).logprobs is None


def test_logits_are_float32_and_batch_independent(llama4_engine):
    seqs = [llama4_engine.tokenizer.encode(p, bos=True) for p in PROMPTS[:4]]
    together = llama4_engine.logits(seqs)
    for seq, lg in zip(seqs, together):
        assert lg.dtype == torch.float32 and lg.shape == (len(seq), llama4_engine.args.vocab_size)
        assert torch.allclose(lg, llama4_engine.logits([seq])[0], atol=1e-5)


def test_streaming_matches_completion(llama4_engine):
    chunks = list(llama4_engine.stream_completion(PROMPTS[1], max_tokens=10))
    full = llama4_engine.completion(PROMPTS[1], max_tokens=10)
    assert chunks[-1].final is not None and chunks[-1].final.tokens == full.tokens
    assert "".join(c.text for c in chunks) == full.text


def test_empty_batch_returns_empty_list(llama3_engine):
    assert llama3_engine.batch_completion([]) == []
    assert llama3_engine.logits([]) == []


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=-1),
        dict(temperature=float("nan")),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-2),
        dict(max_tokens=0),
        dict(max_tokens=2.5),
        dict(logprobs=99),
        dict(seed="x"),
        dict(stop=[3]),
        dict(stop=""),
    ],
)
def test_bad_sampling_values_raise_clear_errors(llama3_engine, kw):
    with pytest.raises(SamplingError) as info:
        llama3_engine.completion("hi", **kw)
    assert next(iter(kw)) in str(info.value)
    assert llama3_engine.completion("hi", max_tokens=2).tokens  # still usable


def test_bad_prompts_raise_clear_errors(llama3_dir):
    engine = engine_for(llama3_dir, max_batch_size=2, max_seq_len=32)
    with pytest.raises(PromptTooLongError) as info:
        engine.batch_completion(["short", "word " * 100])
    msg = str(info.value)
    assert "row 1" in msg and "max_seq_len is 32" in msg and "102 tokens" in msg
    with pytest.raises(InputError, match="row 0 is empty"):
        engine.batch_completion([[]])
    with pytest.raises(InputError, match="not a token id"):
        engine.completion([1, 2, 10**9])
    with pytest.raises(InputError):
        engine.completion(3.5)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        engine.batch_completion("a string, not a list")  # type: ignore[arg-type]
    with pytest.raises(PromptTooLongError):
        engine.logits([list(range(100, 140))])
    assert isinstance(PromptTooLongError("x"), WorkbenchError)
    assert len(engine.completion("still works", max_tokens=3).tokens) == 3


def test_interrupt_mid_batch_leaves_engine_usable(llama4_engine):
    """A step of the engine's loop interrupted half-way (after its forwards ran) fails the call in flight with
    that exception; the next call gets exactly the tokens of a fresh engine."""
    expected = llama4_engine.batch_completion(PROMPTS, max_tokens=10)
    step = llama4_engine._runner.step
    calls = {"n": 0}

    def interrupting(add, cancel):
        events = step(add, cancel)
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return events

    llama4_engine._runner.step = interrupting
    try:
        with pytest.raises(KeyboardInterrupt):
            llama4_engine.batch_completion(PROMPTS, max_tokens=10)
    finally:
        del llama4_engine._runner.step
    again = llama4_engine.batch_completion(PROMPTS, max_tokens=10)
    assert [r.tokens for r in again] == [r.tokens for r in expected]


@pytest.mark.parametrize("which,ckpt", [("llama4_engine", "llama4_dir"), ("llama3_engine", "llama3_dir")])
def test_batched_greedy_equals_reference_cache_free_greedy(which, ckpt, request):
    """Every row of a batch equals Meta's reference model run as a cache-free greedy loop (full-sequence
    logits at each step): this covers the KV cache, per-row positions and, for Llama 4, chunked
    attention during decode past the chunk size (32)."""
    from oracle import reference_greedy

    engine = request.getfixturevalue(which)
    ckpt_dir = request.getfixturevalue(ckpt)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[3], PROMPTS[5], PROMPTS[7], PROMPTS[8], PROMPTS[2], PROMPTS[6]]
    rows = engine.batch_completion(prompts, max_tokens=30)
    assert any(r.prompt_tokens < 32 < r.prompt_tokens + len(r.tokens) for r in rows)  # decode crosses a chunk
    stops = engine.tokenizer.stop_tokens
    for prompt, row in zip(prompts, rows):
        ids = engine.tokenizer.encode(prompt, bos=True)
        assert row.tokens == reference_greedy(ckpt_dir, ids, 30, stops), prompt


def test_streaming_with_stop_strings_never_leaks_the_stop_text(llama3_engine):
    free = llama3_engine.completion("The capital of France is", max_tokens=12)
    needle = llama3_engine.tokenizer.decode(free.tokens[4:7])
    chunks = list(llama3_engine.stream_completion("The capital of France is", max_tokens=12, stop=needle))
    cut = llama3_engine.completion("The capital of France is", max_tokens=12, stop=needle)
    streamed = "".join(c.text for c in chunks)
    assert streamed == cut.text == chunks[-1].final.text
    assert all(needle not in "".join(c.text for c in chunks[: i + 1]) for i in range(len(chunks)))
