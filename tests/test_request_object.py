"""One request object: a row of a call is one ``generation.Request`` from the engine's call through the run store's
lookup, the scheduler and the accumulator to its result (nano-vllm's ``Sequence``); nothing is kept in lists
aligned by row index."""

from __future__ import annotations

import pickle

import pytest

from workbench.engine.remember import generation_call
from workbench.generation import Request, SamplingParams
from workbench.session import build_engine, resolve_settings

PROMPTS = ["Hi", "The capital of France is", "1, 2, 3"]


@pytest.fixture(scope="module")
def engine(llama3_dir):
    e = build_engine(resolve_settings(llama3_dir, max_batch_size=2, max_seq_len=128))  # 3 rows: two waves
    yield e
    e.close()


def _requests(engine, params: SamplingParams) -> list[Request]:
    return [
        Request(i, engine.tokenizer.encode(p, bos=True, eos=False), params, row=i, item=f"q{i}", given={"prompt": p})
        for i, p in enumerate(PROMPTS)
    ]


def test_a_request_carries_its_tokens_logprobs_and_finish_to_its_completion(engine):
    requests = _requests(engine, SamplingParams(max_tokens=5, logprobs=2))
    results = engine.generate_tokens(requests)
    assert [r.tokens for r in results] == [r.tokens for r in engine.batch_completion(PROMPTS, max_tokens=5)]
    for request, completion in zip(requests, results):
        assert request.completion is completion and request.tokens == completion.tokens
        assert request.finish_reason == completion.stop_reason and request.logprobs[:5] == completion.logprobs
        assert request.held_tokens()[: len(request.prompt)] == request.prompt  # its slot's prefix-cache record


def test_the_run_store_marks_the_same_objects_and_settles_their_seeds(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    run = engine.open_run("requests")
    sampled = SamplingParams(max_tokens=5, temperature=1.0)
    first = _requests(engine, sampled)
    stored = generation_call(run, first, kind="completion", max_seq_len=engine.max_seq_len, refresh=False)
    assert stored.todo == first and all(r.key is not None and r.seed_drawn for r in first)
    assert all(r.params.seed == r.sampling_record["seed"] for r in first)  # runs with the seed it is stored with
    engine.generate_tokens(first, stored=stored)
    again = _requests(engine, sampled)
    answered = generation_call(run, again, kind="completion", max_seq_len=engine.max_seq_len, refresh=False)
    assert answered.todo == [] and [r.stored.tokens for r in again] == [r.tokens for r in first]
    assert [row.request for row in run.store.rows("requests")] == [{"prompt": p} for p in PROMPTS]


def test_the_wire_form_carries_generation_fields_only():
    request = Request(0, [1, 2, 3], SamplingParams(max_tokens=2), row=4, item="q", given={"f": lambda: 1})
    request.result = object()
    wire = pickle.loads(pickle.dumps(request.wire()))  # the caller's objects (a lambda) never cross the pipe
    assert (wire.prompt, wire.params, wire.row, wire.item, wire.given, wire.result) == (
        [1, 2, 3],
        request.params,
        0,
        None,
        None,
        None,
    )
