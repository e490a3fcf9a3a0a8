"""One sampling object: ``SamplingParams`` defines every sampling setting once, and the engine's keywords,
signatures, docstrings and run-store keys follow from it; ``repetition_penalty`` (added through that one
definition) checked against transformers' own processor; ``item=`` carried to the store."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import workbench as wb
from workbench.engine.remember import row_sampling
from workbench.errors import FormatError, InputError, SamplingError
from workbench.session import build_engine, resolve_settings

try:  # at collection, before any test installs the torchvision stand-in that transformers' import trips over
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
except Exception:  # noqa: BLE001 - transformers is in the dev extra; without it the oracle tests skip
    RepetitionPenaltyLogitsProcessor = None

GENERATION_METHODS = [
    "completion",
    "batch_completion",
    "stream_completion",
    "stream_batch_completion",
    "chat_completion",
    "batch_chat_completion",
    "stream_chat_completion",
    "stream_batch_chat_completion",
]
PROMPTS = ["Hi", "The capital of France is", "1, 2, 3, 1, 2, 3, 1, 2, 3", "a b a b a b a b"]


@pytest.fixture(scope="module")
def engine(llama3_dir):
    e = build_engine(resolve_settings(llama3_dir, max_batch_size=4, max_seq_len=128))
    yield e
    e.close()


@pytest.mark.parametrize("name", GENERATION_METHODS)
def test_every_method_shows_each_field_as_a_keyword_with_its_default(name):
    method = getattr(wb.Engine, name)
    params = inspect.signature(method).parameters
    for field in wb.SamplingParams.keywords():
        assert params[field.name].kind is inspect.Parameter.KEYWORD_ONLY, field.name
        assert params[field.name].default == field.metadata["keyword"], field.name
        assert f"{field.name}:" in method.__doc__, field.name
    assert params["sampling"].default is None and params["item"].default is None
    assert "ignore_stop_tokens" not in params  # a benchmark setting, no keyword


def test_sampling_object_equals_keywords_and_keywords_override_its_fields(engine):
    sampled = wb.SamplingParams(temperature=0.8, top_k=20, seed=3, max_tokens=6)
    by_object = engine.batch_completion(PROMPTS, sampling=sampled)
    by_keywords = engine.batch_completion(PROMPTS, temperature=0.8, top_k=20, seed=3, max_tokens=6)
    assert [r.tokens for r in by_object] == [r.tokens for r in by_keywords]
    # a keyword beside sampling= overrides that field only
    greedy = engine.completion(PROMPTS[1], sampling=sampled, temperature=0.0)
    assert greedy.tokens == engine.completion(PROMPTS[1], max_tokens=6).tokens
    assert len(engine.completion(PROMPTS[1], sampling=sampled, max_tokens=2).tokens) <= 2
    # the dict of fields works too; anything else is refused with the fix
    assert engine.completion(PROMPTS[1], sampling={"max_tokens": 6}).tokens == greedy.tokens
    with pytest.raises(SamplingError, match="sampling= takes a workbench SamplingParams"):
        engine.completion("x", sampling=0.7)
    with pytest.raises(SamplingError, match="temperature must be a finite number >= 0"):
        wb.SamplingParams(temperature=-1)


def test_per_row_seeds_and_the_single_methods_list_check(engine):
    rows = engine.batch_completion(PROMPTS[:2], sampling=wb.SamplingParams(temperature=1.0, max_tokens=6), seed=[5, 6])
    alone = [engine.completion(p, temperature=1.0, max_tokens=6, seed=s) for p, s in zip(PROMPTS[:2], (5, 6))]
    assert [r.tokens for r in rows] == [r.tokens for r in alone]
    with pytest.raises(SamplingError, match="seed has 1 entries for 2 prompts"):
        engine.batch_completion(PROMPTS[:2], seed=[1])
    with pytest.raises(
        SamplingError,
        match=r"completion takes one seed \(a list with one per row is for "
        r"batch_completion\)",
    ):
        engine.completion("x", seed=[1, 2])
    with pytest.raises(
        FormatError,
        match=r"stream_chat_completion takes one response_format \(a list is for "
        r"batch_chat_completion\)",
    ):
        engine.stream_chat_completion([{"role": "user", "content": "x"}], response_format=[None])


def test_keys_of_default_fields_are_what_they_were():
    """A field added later is absent from the key at its default: the stores written before it still answer."""
    before = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 8, "stop": [], "logprobs": 0, "seed": None}
    assert row_sampling(wb.SamplingParams(max_tokens=8), None, None, 128) == before
    assert row_sampling(wb.SamplingParams(max_tokens=8, repetition_penalty=1.3), None, None, 128) == {
        **before,
        "repetition_penalty": 1.3,
    }


# ------------------------------------------------------------------------------------------- repetition_penalty
def _reference_tokens(engine, ids: list[int], penalty: float, n: int) -> list[int]:
    """Greedy tokens of a loop over the engine's own logits with transformers' processor applied."""
    if RepetitionPenaltyLogitsProcessor is None:
        pytest.skip("transformers is not importable: pip install -e '.[dev]'")
    processor = RepetitionPenaltyLogitsProcessor(penalty=penalty)
    out: list[int] = []
    for _ in range(n):
        logits = engine.logits([ids])[0][-1:]  # [1, V]
        token = int(processor(torch.tensor([ids]), logits.clone()).argmax(-1)[0])
        if token in engine.tokenizer.stop_tokens:
            break
        out.append(token)
        ids = ids + [token]
    return out


@pytest.mark.parametrize("penalty", [4.0, 0.2])
def test_repetition_penalty_matches_transformers_in_a_batch(engine, penalty):
    n = 10
    rows = [engine.tokenizer.encode(p, bos=True, eos=False) for p in PROMPTS]
    # the tiny random model never repeats by itself: a prompt that already holds its greedy next token lets a
    # penalty > 1 change the reply (0.2 makes seen tokens likelier: every row repeats)
    first = engine.completion(rows[3], max_tokens=1).tokens
    rows.append(rows[3][:1] + first + rows[3][1:])
    batch = engine.batch_completion(rows, max_tokens=n, repetition_penalty=penalty)
    plain = engine.batch_completion(rows, max_tokens=n)
    for ids, row in zip(rows, batch):
        assert row.tokens == _reference_tokens(engine, ids, penalty, n), ids
    assert batch[-1].tokens != plain[-1].tokens  # the penalty changed the reply
    # one row alone gives the batch's tokens: each row keeps its own record of seen tokens
    assert engine.completion(rows[-1], max_tokens=n, repetition_penalty=penalty).tokens == batch[-1].tokens


def test_repetition_penalty_is_in_the_key_only_when_set(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    first = engine.batch_completion(PROMPTS[:2], max_tokens=6, run="penalty")
    assert [
        r.cached for r in engine.batch_completion(PROMPTS[:2], max_tokens=6, repetition_penalty=1.0, run="penalty")
    ] == [True, True]
    penalized = engine.batch_completion(PROMPTS[:2], max_tokens=6, repetition_penalty=1.4, run="penalty")
    assert [r.cached for r in penalized] == [False, False] and len(first) == 2
    again = engine.batch_completion(
        PROMPTS[:2], sampling=wb.SamplingParams(max_tokens=6, repetition_penalty=1.4), run="penalty"
    )
    assert [r.cached for r in again] == [True, True]


def test_a_new_field_is_one_definition():
    """The engine's keywords are SamplingParams' fields: nothing restates the list."""
    names = [f.name for f in dataclasses.fields(wb.SamplingParams)]
    assert names.index("repetition_penalty") > names.index("stop")
    assert [f.name for f in wb.SamplingParams.keywords()] == [n for n in names if n != "ignore_stop_tokens"]


# ------------------------------------------------------------------------------------------- item=
def test_item_reaches_the_store_per_row_and_a_wrong_count_says_the_fix(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    seen: list = []
    original = wb.runs.Run.put_many

    def put_many(self, rows):
        rows = list(rows)
        seen.extend(r["item"] for r in rows)
        return original(self, rows)

    monkeypatch.setattr(wb.runs.Run, "put_many", put_many)
    engine.batch_completion(PROMPTS[:2], max_tokens=3, item=["q1", "q2"], run="items")
    engine.completion(PROMPTS[2], max_tokens=3, item="q3", run="items")
    dialog = [{"role": "user", "content": "Hello"}]
    engine.batch_chat_completion(
        [dialog, dialog + [{"role": "user", "content": "again"}]], max_tokens=3, item="case-7", run="items"
    )
    list(engine.stream_batch_completion(PROMPTS[3:], max_tokens=3, item=["q4"], run="items"))
    assert sorted(seen, key=str) == ["case-7", "case-7", "q1", "q2", "q3", "q4"]
    with pytest.raises(InputError, match="batch_completion got 1 items for 2 rows; give one item for every row"):
        engine.batch_completion(PROMPTS[:2], max_tokens=3, item=["only-one"])
