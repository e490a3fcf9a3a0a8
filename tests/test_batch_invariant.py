"""The batch-invariant mode (``wb.load(..., batch_invariant=True)``, workbench/models/invariant.py): a row's logits,
log-probabilities and tokens are bit-identical to the same row run alone, cold, at batch 1.

Every equality is exact (``torch.equal``, ``==`` on floats).  Where the default mode differs on the same rows the
same check is run on a default engine and asserted to *fail* there, so each test shows it can fail.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import workbench as wb
from workbench.checkpoints.factory import TINY_LLAMA3, TINY_LLAMA4
from workbench.config import resolve_settings
from workbench.errors import ConfigError, ImageError
from workbench.models import invariant
from workbench.session import build_engine

SEQ = 256
FAMILIES = {"llama3": TINY_LLAMA3, "llama4": TINY_LLAMA4}


@pytest.fixture(scope="module")
def engines(make_checkpoint) -> Iterator[dict[tuple[str, bool], wb.Engine]]:
    """(family, batch_invariant) -> an engine with 16 slots, built on first use, closed at the end."""
    built: dict[tuple[str, bool], wb.Engine] = {}

    class Lazy(dict):
        def __missing__(self, key: tuple[str, bool]) -> wb.Engine:
            family, inv = key
            folder = make_checkpoint(FAMILIES[family])
            engine = build_engine(resolve_settings(folder, max_batch_size=16, max_seq_len=SEQ, batch_invariant=inv))
            built[key] = engine
            self[key] = engine
            return engine

    yield Lazy()
    for engine in built.values():
        engine.close()


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(1000, 100000) for _ in range(length)]


def _batch(rng: random.Random, target: list[int], size: int, shared: int) -> tuple[list[list[int]], int]:
    """``size`` rows holding ``target`` at a random place among neighbours of random lengths (the first
    ``shared`` tokens of each neighbour are the target's: a shared prefix)."""
    rows = [target[:shared] + _prompt(rng, rng.randrange(3, 120)) for _ in range(size - 1)]
    where = rng.randrange(size)
    rows.insert(where, target)
    return rows, where


def _run(engine: wb.Engine, prompts: list[list[int]], **kw) -> list[tuple[list[int], list[float]]]:
    kw = {"max_tokens": 8, "temperature": 0.0, "logprobs": 1, **kw}
    out = engine.batch_completion(prompts, **kw)
    return [(c.tokens, [lp.logprob for lp in c.logprobs]) for c in out]


def _forget(engine: wb.Engine) -> None:
    engine.runner.scheduler.forget_prefixes()  # cold: no slot holds any prefix


def _alone_vs_batches(engine: wb.Engine, shared: int, seed: int = 0) -> list[bool]:
    """For batches of 2, 5 and 16: did the target's tokens, log-probs and teacher-forced logits equal its run
    alone (cold, batch 1)?"""
    rng = random.Random(seed)
    target = _prompt(rng, 60)
    _forget(engine)
    alone = _run(engine, [target])[0]
    alone_logits = engine.logits([target + alone[0]])[0]
    same = []
    for size in (2, 5, 16):
        rows, where = _batch(rng, target, size, shared)
        _forget(engine)
        got = _run(engine, rows)[where]
        logits = engine.logits([r + got[0] if i == where else r for i, r in enumerate(rows)])[where]
        same.append(got == alone and torch.equal(logits, alone_logits))
    return same


@pytest.mark.parametrize("family", ["llama3", "llama4"])
@pytest.mark.parametrize("shared", [0, 40], ids=["no-prefix", "shared-prefix"])
def test_alone_vs_batches_of_2_5_16(engines, family: str, shared: int) -> None:
    assert all(_alone_vs_batches(engines[family, True], shared))
    # the default mode's row moves with its neighbours (float32: ~1e-6): the same check fails there
    assert not all(_alone_vs_batches(engines[family, False], shared))


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_cold_and_warm_cache(engines, family: str) -> None:
    """Alone cold, then again with the prompt's prefix held by a slot (warm), and warm inside a batch."""

    def runs(engine: wb.Engine) -> list[tuple[list[int], list[float]]]:
        rng = random.Random(7)
        target = _prompt(rng, 50)
        _forget(engine)
        out = [_run(engine, [target])[0]]  # cold
        out.append(_run(engine, [target])[0])  # warm: the slot holds all but its last token
        out.append(_run(engine, [target[:30] + _prompt(rng, 10), target[:45]])[0])  # warm from other rows' prefixes
        _forget(engine)
        _run(engine, [target[:30], target[:45] + _prompt(rng, 20)])  # slots hold parts of it
        rows, where = _batch(rng, target, 5, 30)
        out.append(_run(engine, rows)[where])
        return [o for o in out[:2]] + [out[3]]

    got = runs(engines[family, True])
    assert got[0] == got[1] == got[2]
    default = runs(engines[family, False])
    assert not default[0] == default[1] == default[2]


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_generate_logprobs_equal_logits_and_score(engines, family: str) -> None:
    """Scoring equals generating: the log-prob a row got while generating is ``log_softmax(engine.logits)`` of the
    same tokens and ``engine.score``'s, bit for bit (prefill, decode and teacher forcing sum in one order)."""

    def check(engine: wb.Engine) -> bool:
        rng = random.Random(3)
        target = _prompt(rng, 45)
        rows, where = _batch(rng, target, 5, 0)
        tokens, logprobs = _run(engine, rows, max_tokens=12)[where]
        logits = engine.logits([target + tokens])[0][len(target) - 1 : -1]  # [12, V]
        teacher = torch.log_softmax(logits, dim=-1)[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()
        scored = engine.score([_prompt(rng, 30), target + tokens], starts=[5, len(target)])[1].logprobs
        return teacher == logprobs and scored == logprobs

    assert check(engines[family, True])
    assert not check(engines[family, False])


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_sampled_tokens_at_temperature_1_with_seed(engines, family: str) -> None:
    """64 sampled tokens (temperature 1, a seed per row) alone and among 15 sampled neighbours."""
    engine = engines[family, True]
    rng = random.Random(11)
    target = _prompt(rng, 40)
    kw = {"max_tokens": 64, "temperature": 1.0}
    _forget(engine)
    alone = _run(engine, [target], seed=1234, **kw)[0]
    rows, where = _batch(rng, target, 16, 20)
    seeds = tuple(1234 if i == where else 99 + i for i in range(len(rows)))
    _forget(engine)
    got = _run(engine, rows, seed=seeds, **kw)[where]
    assert len(alone[0]) == 64 and got == alone


def test_stream_equals_blocking_alone(engines) -> None:
    engine = engines["llama4", True]
    rng = random.Random(5)
    target = _prompt(rng, 33)
    _forget(engine)
    alone = _run(engine, [target])[0]
    rows, where = _batch(rng, target, 5, 10)
    finals = {}
    for row, chunk in engine.stream_batch_completion(rows, max_tokens=8, temperature=0.0, logprobs=1):
        if chunk.final is not None:
            finals[row] = chunk.final
    final = finals[where]
    assert (final.tokens, [lp.logprob for lp in final.logprobs]) == alone


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bf16", "fp8_mixed", "int4_mixed"])
def test_quantization_modes(make_checkpoint, mode: str) -> None:
    """Each quantization mode on Llama 4 (dense, MoE experts, shared expert) and Llama 3."""
    for family in ("llama4", "llama3"):
        folder = make_checkpoint(FAMILIES[family])
        settings = resolve_settings(folder, max_batch_size=16, max_seq_len=SEQ, quantization=mode)
        engine = build_engine(
            resolve_settings(folder, max_batch_size=16, max_seq_len=SEQ, quantization=mode, batch_invariant=True)
        )
        try:
            assert engine.batch_invariant and engine.settings.quantization == mode
            assert all(_alone_vs_batches(engine, 40, seed=2))
        finally:
            engine.close()
        if mode == "bf16":  # bf16's default mode differs by up to 0.03 in a log-prob
            default = build_engine(settings)
            try:
                assert not all(_alone_vs_batches(default, 40, seed=2))
            finally:
                default.close()


# --------------------------------------------------------------------------------------------- settings
def test_settings_sources(llama3_dir: Path, tmp_path: Path) -> None:
    assert resolve_settings(llama3_dir, environ={}).batch_invariant is False
    assert resolve_settings(llama3_dir, batch_invariant=True, environ={}).batch_invariant is True
    env = {"WORKBENCH_BATCH_INVARIANT": "1"}
    assert resolve_settings(llama3_dir, environ=env).batch_invariant is True
    assert resolve_settings(llama3_dir, batch_invariant=False, environ=env).batch_invariant is False
    with pytest.raises(ConfigError, match="WORKBENCH_BATCH_INVARIANT"):
        resolve_settings(llama3_dir, environ={"WORKBENCH_BATCH_INVARIANT": "maybe"})
    toml = tmp_path / "checkpoints.toml"
    toml.write_text(f'[tiny]\npath = "{llama3_dir}"\nbatch_invariant = true\n')
    assert resolve_settings("tiny", environ={"WORKBENCH_CHECKPOINTS": str(toml)}).batch_invariant is True
    toml.write_text(f'[tiny]\npath = "{llama3_dir}"\nbatch_invariant = "yes"\n')
    with pytest.raises(ConfigError, match="batch_invariant.*boolean"):
        resolve_settings("tiny", environ={"WORKBENCH_CHECKPOINTS": str(toml)})
    other = resolve_settings(llama3_dir, environ={})
    assert other.identity() != resolve_settings(llama3_dir, batch_invariant=True, environ={}).identity()


def test_switch_in_place_and_refusals(llama3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = build_engine(resolve_settings(llama3_dir, max_batch_size=4, max_seq_len=128, environ={}))
    try:
        rng = random.Random(1)
        target = _prompt(rng, 20)
        assert engine.batch_invariant is False
        engine.batch_invariant = True  # re-loads the weights with the invariant kernels
        assert engine.batch_invariant is True
        alone = _run(engine, [target])[0]
        assert _run(engine, [_prompt(rng, 50), target, _prompt(rng, 7)])[1] == alone
        with pytest.raises(ConfigError, match="compile=True"):
            engine.compile_decode()
        with pytest.raises(ConfigError, match="cuda_graphs=True"):
            engine.use_cuda_graphs()
        with pytest.raises(ConfigError, match="compile=True"):  # the model itself refuses too (worker ranks)
            engine.runner.model.compile_decode()
        assert _run(engine, [target])[0] == alone  # still usable
        # a kernel that gives a row other bits at another place in the tile: refused, named, old model kept
        monkeypatch.setattr(invariant, "probe_rows", lambda fn, *a: "FeedForward" not in repr(fn))
        engine.batch_invariant = False
        with pytest.raises(ConfigError, match=r"layers\.\d+\.feed_forward.*another place"):
            engine.batch_invariant = True
        assert engine.batch_invariant is False and _run(engine, [target])[0][0] == alone[0]
    finally:
        engine.close()


def test_refused_models_and_images(make_checkpoint) -> None:
    from workbench.checkpoints.factory import TINY_LLAMA4_VISION

    folder = make_checkpoint(TINY_LLAMA4_VISION)
    engine = build_engine(resolve_settings(folder, max_batch_size=2, max_seq_len=128, batch_invariant=True))
    try:
        with pytest.raises(ImageError, match="batch-invariant"):
            engine.load_vision()
    finally:
        engine.close()


def test_tile_kernels_row_independent() -> None:
    """The building blocks alone: a tiled product and the tiled attention give a row the same bits whatever
    the rows around it, where plain ``F.linear`` does not (float32, 1 vs 2+ rows on MKL)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=gen)
    x = torch.randn(40, 64, generator=gen)
    alone = invariant.tiled(torch.nn.functional.linear, x[:1], w)
    for m in (2, 5, 16, 17, 40):
        assert torch.equal(invariant.tiled(torch.nn.functional.linear, x[:m], w)[:1], alone)
    assert not all(
        torch.equal(torch.nn.functional.linear(x[:m], w)[:1], torch.nn.functional.linear(x[:1], w))
        for m in (2, 5, 16, 17, 40)
    )
    q = torch.randn(37, 4, 16, generator=gen)
    k = torch.randn(2, 37, 16, generator=gen)
    v = torch.randn(2, 37, 16, generator=gen)
    whole = invariant.attend_row(q, k, v, 0, None)  # prefill of 37 positions
    for p in (0, 15, 16, 36):  # decode of one position against the same keys (and junk past it)
        junk_k = torch.cat([k[:, : p + 1], torch.randn(2, 8, 16, generator=gen)], dim=1)
        junk_v = torch.cat([v[:, : p + 1], torch.randn(2, 8, 16, generator=gen)], dim=1)
        assert torch.equal(invariant.attend_row(q[p : p + 1], junk_k, junk_v, p, None)[0], whole[p])
    chunk = invariant.attend_row(q[20:], k, v, 20, None)  # a chunked prefill from position 20
    assert torch.equal(chunk, whole[20:])


def test_through_the_server_with_concurrent_neighbours(engines) -> None:
    """Requests to the served engine, the target alone and then with 4 concurrent neighbours (which the server
    gathers into one engine call): the target's generated log-probs are the engine's alone, bit for bit."""
    openai = pytest.importorskip("openai")
    from concurrent.futures import ThreadPoolExecutor

    from workbench.serve import serve

    engine = engines["llama3", True]
    rng = random.Random(9)
    target = _prompt(rng, 30)
    _forget(engine)
    alone = _run(engine, [target])[0]
    server = serve(engine, port=0)
    try:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)

        def ask(prompt: list[int]) -> list[float]:
            reply = client.completions.create(
                model=server.model, prompt=[prompt], max_tokens=8, temperature=0.0, logprobs=1
            )
            return list(reply.choices[0].logprobs.token_logprobs)

        assert ask(target) == alone[1]
        rows, where = _batch(rng, target, 5, 12)
        with ThreadPoolExecutor(5) as pool:
            got = list(pool.map(ask, rows))
        assert got[where] == alone[1]
    finally:
        server.stop()
