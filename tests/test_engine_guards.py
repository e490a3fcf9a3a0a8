"""Guards of the engine against what a hostile user, a notebook's threads or the environment can do:
numeric edge cases of sampling and scoring, concurrent calls, impossible resource requests, bad environment
variables and files."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import workbench as wb
from workbench.checkpoints.factory import TINY_LLAMA3
from workbench.checkpoints.preflight import estimate_memory
from workbench.config import ConfigFile, resolve_settings
from workbench.errors import (
    CheckpointError,
    ConfigError,
    InputError,
    InsufficientMemoryError,
    MissingCheckpointFileError,
    SamplingError,
)
from workbench.session import build_engine

PROMPTS = ["The capital of France is", "Once upon a time " * 6, "1, 2, 3, 4, 5", "Hi", "🦙 ünïcödé"]


@pytest.fixture(scope="module")
def engine(llama3_dir: Path):
    engine = build_engine(resolve_settings(llama3_dir, max_batch_size=4, max_seq_len=128))
    yield engine
    engine.close()


# --- numeric edge cases --------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1e-30, 1e-300, 5e-324])
def test_tiny_temperature_samples_the_greedy_token(engine: wb.Engine, temperature: float) -> None:
    greedy = engine.completion(PROMPTS[0], max_tokens=6)
    tiny = engine.completion(PROMPTS[0], max_tokens=6, temperature=temperature, seed=1)
    assert tiny.tokens == greedy.tokens  # the limit of the softmax as t -> 0 is the argmax


def test_seed_range(engine: wb.Engine) -> None:
    for seed in (0, -1, 2**64 - 1, -(2**63)):
        assert engine.completion("Hi", max_tokens=2, temperature=1.0, seed=seed).tokens
    for seed in (2**64, -(2**63) - 1, 10**30):
        with pytest.raises(SamplingError, match="seed must be an integer in"):
            engine.completion("Hi", max_tokens=2, temperature=1.0, seed=seed)


def test_logits_of_an_empty_sequence(engine: wb.Engine) -> None:
    with pytest.raises(InputError, match="row 1 of logits\\(\\) is empty"):
        engine.logits([[1, 2], []])
    assert engine.logits([]) == []
    assert engine.logits([[128000, 791]])[0].shape == (2, engine.args.vocab_size)


# --- concurrency -------------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)  # hang guard
def test_threads_calling_one_engine_get_their_own_rows(engine: wb.Engine) -> None:
    expected = {p: engine.completion(p, max_tokens=12).tokens for p in PROMPTS}
    results: dict[int, list] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(k: int) -> None:
        try:
            start.wait()
            rows = PROMPTS[k:] + PROMPTS[:k]  # every thread its own order: rows land in different cache slots
            results[k] = [(p, r.tokens) for p, r in zip(rows, engine.batch_completion(rows, max_tokens=12))]
            results[k + 10] = [
                (
                    PROMPTS[k],
                    list(engine.logits([engine.tokenizer.encode(PROMPTS[k], bos=True)])[0].argmax(-1).tolist()),
                )
            ]
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in range(4):
        assert all(tokens == expected[p] for p, tokens in results[k])
    logits_rows = [results[k + 10][0][1] for k in range(4)]
    for k in range(4):
        alone = engine.logits([engine.tokenizer.encode(PROMPTS[k], bos=True)])[0].argmax(-1).tolist()
        assert logits_rows[k] == alone


def test_an_abandoned_stream_holds_the_next_call_up_not(engine: wb.Engine) -> None:
    expected = engine.completion(PROMPTS[0], max_tokens=8).tokens
    stream = engine.stream_completion(PROMPTS[0], max_tokens=8)
    next(stream)  # suspended half-way (as when a cell's traceback keeps it alive)
    assert engine.completion(PROMPTS[0], max_tokens=8).tokens == expected  # runs beside it
    assert list(stream)[-1].final.tokens == expected  # the suspended stream went on too
    results = []
    other = engine.stream_completion(PROMPTS[1], max_tokens=8)
    next(other)  # a stream suspended by this thread does not block another thread either
    worker = threading.Thread(target=lambda: results.append(engine.completion(PROMPTS[0], max_tokens=8).tokens))
    worker.start()
    worker.join(120)
    assert results == [expected]


def test_a_call_from_a_callback_inside_a_call_joins_the_batch(engine: wb.Engine) -> None:
    """A call made while this thread's stream is running (a callback, a tool) joins the running batch instead
    of waiting for the stream or being refused; both give their tokens alone."""
    alone = engine.completion("Hi", max_tokens=2).tokens
    whole = engine.completion("Hi", max_tokens=4).tokens
    stream = engine.stream_batch_completion(["Hi"], max_tokens=4, preemptible=False)
    next(stream)  # the stream's call is running
    assert engine.completion("Hi", max_tokens=2).tokens == alone
    rest = [chunk for _, chunk in stream]
    assert rest[-1].final.tokens == whole


# --- resource preflight -----------------------------------------------------------------------------------------
def test_the_estimate_is_what_the_engine_allocates(engine: wb.Engine) -> None:
    est = estimate_memory(engine.settings, engine.args)
    memory = engine.memory()
    assert est.kv_cache_bytes == memory["kv_cache_bytes"]
    assert est.weights_bytes == memory["weights_bytes"]


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(max_batch_size=10**9), "load with max_batch_size <= "),
        (dict(max_seq_len=10**12), "max_seq_len=1000000000000 (from argument)"),
        (dict(max_batch_size=10**5, max_seq_len=10**6), "load with max_seq_len <= "),
    ],
)
def test_impossible_sizes_are_refused_before_allocating(llama3_dir: Path, kwargs: dict, needle: str) -> None:
    before = wb.current()
    with pytest.raises(InsufficientMemoryError) as info:
        wb.load(llama3_dir, **kwargs)
    message = str(info.value)
    assert needle in message and "of KV cache" in message and "available" in message
    assert wb.current() is before


def test_suggested_sizes_fit(llama3_dir: Path) -> None:
    with pytest.raises(InsufficientMemoryError) as info:
        wb.load(llama3_dir, max_batch_size=10**9, max_seq_len=64)
    fits = int(str(info.value).split("max_batch_size <= ")[1].split()[0])
    from workbench.config import check_settings

    check_settings(resolve_settings(llama3_dir, max_batch_size=fits // 2, max_seq_len=64))  # well within it fits
    with pytest.raises(InsufficientMemoryError):
        check_settings(resolve_settings(llama3_dir, max_batch_size=2 * fits + 2, max_seq_len=64))


# --- environment and files ------------------------------------------------------------------------------------
def test_environment_values_that_only_look_like_numbers(monkeypatch: pytest.MonkeyPatch, llama3_dir: Path) -> None:
    for value in ("²", "٣", "1e3", "-5", "12 34"):
        monkeypatch.setenv("MAX_SEQ_LEN", value)
        with pytest.raises(ConfigError, match="environment variable MAX_SEQ_LEN"):
            resolve_settings(llama3_dir)
    monkeypatch.setenv("MAX_SEQ_LEN", " 64 ")
    assert resolve_settings(llama3_dir).max_seq_len == 64


def test_cache_variable_pointing_at_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    file = tmp_path / "cache"
    file.write_text("x")
    monkeypatch.setenv("WORKBENCH_CACHE", str(file))
    with pytest.raises(ConfigError, match="WORKBENCH_CACHE.*is a file, not a folder"):
        resolve_settings()
    monkeypatch.setenv("WORKBENCH_CACHE", str(file / "sub"))
    with pytest.raises(ConfigError, match="WORKBENCH_CACHE"):
        resolve_settings()


def test_binary_checkpoints_toml(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints.toml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    with pytest.raises(ConfigError, match="checkpoints.toml is not a UTF-8 text file"):
        ConfigFile.read(path)


def test_paths_are_named_once_and_files_are_not_missing(tmp_path: Path, llama3_dir: Path) -> None:
    file = tmp_path / "weights.pth"
    file.write_bytes(b"x")
    with pytest.raises(CheckpointError) as info:
        wb.load(file)
    assert "is a file, not a folder" in str(info.value) and "does not exist" not in str(info.value)
    assert str(info.value).count(str(file)) == 1
    missing = tmp_path / "nowhere"
    with pytest.raises(MissingCheckpointFileError) as info:
        wb.load(missing)
    assert "does not exist" in str(info.value) and str(info.value).count(str(missing)) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "params.json").write_text(json.dumps({**TINY_LLAMA3, "n_layers": 0}))
    with pytest.raises(CheckpointError) as info:
        wb.load(empty)
    assert "params.json: n_layers must be >= 1" in str(info.value) and str(info.value).count(str(empty)) == 1


def test_unknown_model_id_is_rejected_at_load(llama3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="model='gpt-4' \\(from argument\\) is not a model name"):
        wb.load(llama3_dir, model="gpt-4")
    monkeypatch.setenv("INFERENCE_MODEL", "mistral-7b")
    with pytest.raises(ConfigError, match="environment variable INFERENCE_MODEL"):
        resolve_settings(llama3_dir)


def test_close_twice_is_harmless(llama3_dir: Path) -> None:
    engine = build_engine(resolve_settings(llama3_dir, max_batch_size=2, max_seq_len=32))
    engine.close()
    engine.close()
    assert engine.closed and "unloaded" in repr(engine)


@pytest.mark.parametrize("vocab", [202_048, 128_256, 1_000, 64 * 5 + 17])
def test_fast_argmax_is_argmax(vocab: int) -> None:
    """The blocked CPU argmax gives torch's argmax exactly: ties (first one wins), -inf, NaN, ragged tails."""
    import torch

    from workbench.generation.sampling import fast_argmax

    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(12, vocab, generator=gen)  # [n, V]
    logits[1] = 0.0  # all tied
    logits[2, [5, vocab - 1]] = 50.0  # a tie across blocks, one in the tail
    logits[3, vocab - 1] = 50.0  # the very last id
    logits[4] = float("-inf")
    logits[4, vocab // 2] = -1e30
    logits[5, 7] = float("nan")
    logits[6, ::3] = float("-inf")
    logits[7] = torch.randint(0, 3, (vocab,), generator=gen).float()  # many ties
    assert torch.equal(fast_argmax(logits), logits.argmax(dim=-1))
    half = logits[:, : vocab // 2 + 1].contiguous()
    assert torch.equal(fast_argmax(half), half.argmax(dim=-1))
