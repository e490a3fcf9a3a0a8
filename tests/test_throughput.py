"""The faster paths give the same tokens as the plain ones: shared-prefix prefill, grouped MoE experts.

Shared prefixes are checked against the same engine with reuse turned off, prompt by prompt (greedy,
so any difference in the reused keys/values beyond float rounding would show as different tokens),
across prefix/suffix shapes, waves through few slots, slot reuse across calls and multi-turn growth;
on Llama 3 and on Llama 4 (chunked attention: prefixes ending before, at and after a chunk boundary).
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch

from workbench.checkpoints.factory import TINY_LLAMA4
from workbench.generation.prefix_cache import MIN_SHARED_PREFIX, common_prefix
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.feed_forward import MoE, eager_in_compiled_graphs
from workbench.session import build_engine, resolve_settings

MAX_TOKENS = 6


def _engine(ckpt, max_batch_size=8):
    return build_engine(resolve_settings(ckpt, max_batch_size=max_batch_size, max_seq_len=256))


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 60000) for _ in range(n)]


def _alone(engine, prompts):
    """Each prompt by itself with prefix reuse off: the tokens every shared run must reproduce."""
    scheduler = engine._runner.scheduler
    scheduler.share_prefixes = False
    try:
        return [engine.completion(p, max_tokens=MAX_TOKENS).tokens for p in prompts]
    finally:
        scheduler.share_prefixes = True
        scheduler.forget_prefixes()


def _shared(engine, prompts):
    scheduler = engine._runner.scheduler
    before = scheduler.stats["reused_tokens"]
    rows = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    return rows, scheduler.stats["reused_tokens"] - before


@pytest.fixture(scope="module")
def engines(llama3_dir, llama4_dir):
    return {"llama3": _engine(llama3_dir), "llama4": _engine(llama4_dir)}


def _fresh(engines, family: str):
    """The family's shared engine with no prefix resident from an earlier test."""
    engine = engines[family]
    engine._runner.scheduler.forget_prefixes()
    return engine


# Prefix lengths around Llama 4's 32-token chunk (16 = shortest reused prefix), suffixes from 1 token.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", ["llama3", "llama4"])
@pytest.mark.parametrize("prefix_len", [16, 31, 32, 33, 70])
def test_shared_prefix_rows_equal_unshared_rows(engines, family, prefix_len):
    engine = _fresh(engines, family)
    rng = random.Random(prefix_len)
    prefix = [engine.tokenizer.bos_id] + _ids(rng, prefix_len - 1)
    suffix_lengths = [1, 2, 5, 17, 40]
    prompts = [prefix + _ids(rng, n) for n in suffix_lengths] + [_ids(rng, 12)]  # one row shares nothing
    rows, reused = _shared(engine, prompts)
    assert reused >= (len(suffix_lengths) - 1) * prefix_len  # the prefix was computed once, copied to the rest
    assert rows == _alone(engine, prompts)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_nested_prefixes_and_prompt_that_is_a_prefix(engines, family):
    engine = _fresh(engines, family)
    rng = random.Random(7)
    system = [engine.tokenizer.bos_id] + _ids(rng, 35)
    few_shot = system + _ids(rng, 30)
    prompts = [
        system,
        system + [rng.randrange(1000, 60000)],
        few_shot,
        few_shot + _ids(rng, 3),
        few_shot + _ids(rng, 45),
        system + _ids(rng, 20),
    ]
    rows, reused = _shared(engine, prompts)
    assert reused > 0
    assert rows == _alone(engine, prompts)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_waves_and_slot_reuse_across_calls(llama3_dir, llama4_dir, family):
    engine = _engine(llama3_dir if family == "llama3" else llama4_dir, max_batch_size=3)
    rng = random.Random(11)
    prefix = [engine.tokenizer.bos_id] + _ids(rng, 44)
    prompts = [prefix + _ids(rng, 1 + 7 * i) for i in range(8)]  # 8 prompts through 3 slots: 3+ waves
    first, reused_first = _shared(engine, prompts)
    assert reused_first > 0  # later waves copy the prefix left in a slot by an earlier wave
    # A second call finds the prefix (and whole prompts) resident in slots written by the first call.
    second, reused_second = _shared(engine, list(reversed(prompts)))
    assert reused_second >= 3 * len(prefix)
    expected = _alone(engine, prompts)
    assert first == expected
    assert second == list(reversed(expected))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_multi_turn_prompt_extends_previous_turn(engines, family):
    """A tool loop's next prompt is the previous prompt + reply + more: only the new part is computed."""
    engine = _fresh(engines, family)
    rng = random.Random(5)
    dialogs = [[engine.tokenizer.bos_id] + _ids(rng, 20 + 9 * i) for i in range(3)]
    turns = []
    for _ in range(3):
        rows, reused = _shared(engine, dialogs)
        turns.append((list(dialogs), rows, reused))
        dialogs = [d + r + _ids(rng, 4) for d, r in zip(dialogs, rows)]
    assert all(reused >= sum(len(d) for d in prev) for (_, _, reused), (prev, _, _) in zip(turns[1:], turns))
    for prompts, rows, _ in turns:
        assert rows == _alone(engine, prompts)


def test_shared_prefixes_respect_sampling_seeds(engines):
    """Reuse changes where keys/values come from, never the per-row random streams."""
    engine = engines["llama3"]
    rng = random.Random(3)
    prefix = [engine.tokenizer.bos_id] + _ids(rng, 40)
    prompts = [prefix + _ids(rng, n) for n in (2, 9, 30)]
    kw = dict(max_tokens=MAX_TOKENS, temperature=0.9, top_k=50, seed=1234)
    shared = [r.tokens for r in engine.batch_completion(prompts, **kw)]
    engine._runner.scheduler.share_prefixes = False
    try:
        alone = [engine.completion(p, **kw).tokens for p in prompts]
    finally:
        engine._runner.scheduler.share_prefixes = True
    assert shared == alone


@pytest.mark.parametrize(
    ("a", "b", "limit", "expected"),
    [
        ([1, 2, 3], [1, 2, 4], None, 2),
        ([1, 2, 3], [1, 2, 3], None, 3),
        ([1, 2, 3], [1, 2, 3], 2, 2),
        ([5], [1], None, 0),
        ([], [1], None, 0),
        (list(range(100)), list(range(57)) + [0], None, 57),
    ],
)
def test_common_prefix(a, b, limit, expected):
    assert common_prefix(a, b, limit) == expected
    assert MIN_SHARED_PREFIX >= 1


# --------------------------------------------------------------------------------------------- MoE
@pytest.mark.parametrize(("num_experts", "top_k"), [(4, 1), (16, 1), (16, 2), (64, 1)])
def test_grouped_experts_equal_per_expert_loop(num_experts, top_k):
    """The grouped-matmul MoE path gives the per-expert loop's results (decode- and prefill-sized inputs)."""
    ensure_model_parallel(1)
    params = {**TINY_LLAMA4, "moe_args": {**TINY_LLAMA4["moe_args"], "num_experts": num_experts, "top_k": top_k}}
    args = ModelArgs.from_dict(params, source="test")
    moe = MoE(args, device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(num_experts)
    for p in moe.parameters():
        p.data = torch.randn(p.shape, generator=gen) / p.shape[-2] ** 0.5
    assert moe.experts.grouped(torch.zeros(3, args.dim), torch.tensor([3] + [0] * (num_experts - 1))) is not None
    for tokens in (1, 5, 200):
        x = torch.randn(2, tokens, args.dim, generator=gen)
        grouped = moe(x)
        moe.experts.grouped = lambda *_: None  # force the per-expert loop
        looped = moe(x)
        del moe.experts.grouped
        torch.testing.assert_close(grouped, looped, rtol=1e-5, atol=1e-5)


def test_the_per_expert_loop_runs_eagerly_inside_a_compiled_graph():
    """A function wrapped by ``eager_in_compiled_graphs`` (the per-expert loop: its group sizes are data) runs
    eagerly when a compiled graph calls it: new group sizes trace nothing again, and results equal eager ones."""
    compiling = []

    @eager_in_compiled_graphs
    def doubled_groups(x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        compiling.append(torch.compiler.is_compiling())
        starts = [0, *torch.cumsum(counts, 0).tolist()]
        return torch.cat([x[a:b] * (i + 1) for i, (a, b) in enumerate(zip(starts, starts[1:])) if b > a])

    def step(x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return doubled_groups(x.sin(), counts).cos()

    compiled = torch.compile(step, backend="eager")
    x = torch.rand(6, 3, generator=torch.Generator().manual_seed(0))
    for counts in ([1, 5], [2, 4]):  # the first calls trace (sizes first static, then dynamic)
        compiled(x, torch.tensor(counts))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for counts in ([3, 3], [6, 0], [0, 6]):
            torch.testing.assert_close(compiled(x, torch.tensor(counts)), step(x, torch.tensor(counts)))
    assert compiling and not any(compiling)


def test_loading_and_generating_do_not_import_the_compiler(llama4_dir):
    """torch._dynamo (a second of CPU per process) is imported only by a process that compiles: not by importing
    workbench, nor by loading a Llama 4 (MoE) model and generating with it."""
    code = (
        "import sys, workbench as wb\n"
        "assert 'torch._dynamo' not in sys.modules, 'imported by import workbench'\n"
        "engine = wb.load(sys.argv[1], max_batch_size=2, max_seq_len=64)\n"
        "assert engine.batch_completion(['Hello there', 'a b c d e f'], max_tokens=4)[0].tokens\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(llama4_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


# --------------------------------------------------------------------------------------------- packed output
@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_packed_output_projection_gives_the_plain_tokens(llama3_dir, llama4_dir, family):
    """The oneDNN-packed output projection (batched decode on CPU) gives the plain projection's tokens,
    and an in-place edit of the weight after loading reaches batched decode too (it packs again)."""
    engine = _engine(llama3_dir if family == "llama3" else llama4_dir)
    output = engine._runner.model.output
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN: the packed path is never taken")
    assert output._packed is not None
    assert engine.memory()["packed_bytes"] == output.weight.numel() * 4
    rng = random.Random(7)
    prompts = [_ids(rng, n) for n in (3, 17, 40, 9, 25)]
    x = torch.randn(4, output.in_features, generator=torch.Generator().manual_seed(1))  # [4, D]
    torch.testing.assert_close(output(x), torch.nn.functional.linear(x, output.weight), rtol=1e-5, atol=1e-4)
    packed = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    saved, output._packed = output._packed, None
    plain = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    assert packed == plain
    output._packed = saved
    with torch.no_grad():  # make the first row's next token unbeatable
        output.weight[plain[0][1]] *= 0.0
        output.weight[plain[0][1], 0] = 1e4
    edited = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    output._packed = None
    assert edited == [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    assert edited != plain


# --------------------------------------------------------------------------------------------- compiled decode
@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_compiled_decode_gives_the_eager_tokens(llama3_dir, llama4_dir, family):
    """``compile_decode`` (``wb.load(compile=True)``): same greedy tokens as eager over mixed lengths,
    waves and slot reuse (batch width and attended span vary), with its compile time reported."""
    engine = _engine(llama3_dir if family == "llama3" else llama4_dir, max_batch_size=4)
    rng = random.Random(11)
    prompts = [_ids(rng, n) for n in (5, 40, 12, 33, 2, 60)]  # 6 rows through 4 slots; llama4 crosses chunk 32
    eager = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    seconds = engine.compile_decode()
    assert seconds > 0 and engine.info()["compile_seconds"] == round(seconds, 2)
    compiled = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    assert compiled == eager
    assert engine.completion(prompts[1], max_tokens=MAX_TOKENS).tokens == eager[1]


def test_a_failed_compile_leaves_the_engine_eager_and_usable(llama3_dir, monkeypatch):
    from workbench.errors import CompileError

    engine = _engine(llama3_dir, max_batch_size=4)
    before = engine.batch_completion([[1000, 1001], [1002]], max_tokens=4)

    def broken(fn, **kwargs):
        def step(*args, **kw):
            raise RuntimeError("inductor: no C++ compiler")

        return step

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.raises(CompileError, match="no C\\+\\+ compiler.*keeps decoding eagerly"):
        engine.compile_decode()
    assert engine.info()["compile_seconds"] is None
    after = engine.batch_completion([[1000, 1001], [1002]], max_tokens=4)
    assert [r.tokens for r in after] == [r.tokens for r in before]


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_packed_prefill_equals_each_row_alone(engines, family):
    """Rows laid end to end (no padding) give each row's own logits and keys/values, also when rows
    continue cached prefixes and cross Llama 4's 32-token attention chunks."""
    model = engines[family]._runner.scheduler.model
    rng = random.Random(5)
    prompts = [_ids(rng, n) for n in (1, 7, 33, 70, 40)]
    alone = torch.stack([model.forward_full(torch.tensor([p]))[0, -1] for p in prompts])  # [B, V]
    cache = model.new_cache(len(prompts), 128)
    slots = [4, 2, 0, 1, 3]
    flat = torch.tensor([[t for p in prompts for t in p]])  # [1, N]
    packed = model.forward_packed(flat, [len(p) for p in prompts], [0] * len(prompts), cache, slots)
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-4)
    reference = model.new_cache(1, 128)
    for prompt, slot in zip(prompts, slots):
        model.forward_full(torch.tensor([prompt]), cache=reference, cache_rows=torch.tensor([0]))
        for layer in range(len(cache.keys)):
            n = len(prompt)
            torch.testing.assert_close(cache.keys[layer][slot, :, :n], reference.keys[layer][0, :, :n])
            torch.testing.assert_close(cache.values[layer][slot, :, :n], reference.values[layer][0, :, :n])
    # continuing cached prefixes: the slots hold each prompt's first `cut` tokens; the rest follows packed
    cuts = [0, 3, 32, 35, 20]
    suffix = torch.tensor([[t for p, c in zip(prompts, cuts) for t in p[c:]]])
    cont = model.forward_packed(suffix, [len(p) - c for p, c in zip(prompts, cuts)], cuts, cache, slots)
    torch.testing.assert_close(cont, alone, rtol=1e-4, atol=1e-4)


def test_cpu_prefill_cut_into_small_forwards_gives_the_same_tokens(engines, monkeypatch):
    """The CPU activation budget cuts a wave's packed prefill into several forwards; tokens do not change."""
    import workbench.generation.batching as batching_module

    engine = _fresh(engines, "llama3")
    scheduler = engine._runner.scheduler
    rng = random.Random(11)
    prompts = [_ids(rng, n) for n in (9, 40, 3, 25, 60, 17)]
    whole = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    calls = []
    forward = scheduler.model.forward_packed

    def counted(tokens, *args):
        calls.append(tokens.shape[1])
        return forward(tokens, *args)

    monkeypatch.setattr(scheduler.model, "forward_packed", counted)
    monkeypatch.setattr(batching_module, "CPU_PREFILL_MIN_TOKENS", 1)
    per_token = max(scheduler.model.args.dim, scheduler.model.args.dense_hidden_dim()) * 4
    monkeypatch.setattr(batching_module, "CPU_PREFILL_ACTIVATION_BYTES", 64 * per_token)  # 64 tokens a forward
    scheduler.forget_prefixes()
    cut = [r.tokens for r in engine.batch_completion(prompts, max_tokens=MAX_TOKENS)]
    assert cut == whole
    assert len(calls) > 1 and max(calls) <= 64
