"""The engine's step loop: one running batch that every caller feeds (``workbench/engine/loop.py``).

Held to: calls from several threads and a stream at once, each equal to the same call alone; a request joining a
running batch and leaving it while the others go on; rows with different sampling in the same steps; an interrupt
that ends only the interrupted thread's call; the awaitable form under ``asyncio.gather``; chunked prefill equal
to whole prefill; closing the engine with requests in flight (every waiter answered, no thread left).
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time

import pytest

from workbench.errors import WorkbenchError
from workbench.generation import Request, SamplingParams, Scheduler
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.runtime.loading import load_model_for_rank
from workbench.session import build_engine, resolve_settings

PROMPTS = ["The capital of France is", "Once upon a time", "One two three four", "Hello", "Llamas are"]
CHAT = [{"role": "user", "content": "Tell me about llamas"}]
LONG = SamplingParams.create(max_tokens=200, ignore_stop_tokens=True)  # rows that surely run 200 steps


@pytest.fixture(scope="module")
def engine(llama3_dir):
    e = build_engine(resolve_settings(llama3_dir, max_batch_size=8, max_seq_len=256))
    yield e
    e.close()


@pytest.fixture(scope="module")
def alone(engine):
    """Each prompt's greedy tokens run alone (batch of one)."""
    return {p: engine.completion(p, max_tokens=24).tokens for p in PROMPTS}


def _threads(*targets):
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)


def test_two_threads_and_a_stream_at_once_each_equal_alone(engine, alone):
    chat_alone = engine.chat_completion(CHAT, max_tokens=16)
    out: dict[str, object] = {}
    stream = engine.stream_batch_completion(PROMPTS[3:], max_tokens=24)
    first = next(stream)  # the stream's rows run; it is read after the threads' calls

    def batch():
        out["batch"] = [r.tokens for r in engine.batch_completion(PROMPTS[:3], max_tokens=24)]

    def chat():
        out["chat"] = engine.chat_completion(CHAT, max_tokens=16)

    _threads(batch, chat)
    finals = {}
    for row, chunk in [first, *stream]:
        if chunk.final is not None:
            finals[row] = chunk.final.tokens
    assert out["batch"] == [alone[p] for p in PROMPTS[:3]]
    assert out["chat"].tokens == chat_alone.tokens and out["chat"].message == chat_alone.message
    assert [finals[0], finals[1]] == [alone[p] for p in PROMPTS[3:]]


def test_a_request_joins_a_running_batch_and_leaves_it(engine):
    """A short request sent while a long batch decodes finishes while the long rows still run (it did not wait
    for the batch), and every row equals its run alone."""
    long_alone = [r.tokens for r in engine.batch_completion(PROMPTS[:4], sampling=LONG)]
    short_alone = engine.completion(PROMPTS[4], max_tokens=4).tokens
    stream = engine.stream_batch_completion(PROMPTS[:4], sampling=LONG)
    chunks = [next(stream) for _ in range(8)]  # the long rows are decoding
    assert engine.completion(PROMPTS[4], max_tokens=4).tokens == short_alone
    assert engine._loop.running > 0  # the long rows were still running when the short one left
    finals = {row: chunk.final.tokens for row, chunk in [*chunks, *stream] if chunk.final is not None}
    assert [finals[i] for i in range(4)] == long_alone


def test_rows_with_different_sampling_share_steps_and_equal_alone(engine):
    """Sixteen concurrent calls with sixteen temperatures and seeds: each equals the same call alone."""
    settings = [dict(temperature=0.3 + 0.05 * i, top_p=0.9, seed=100 + i, max_tokens=12) for i in range(16)]
    expected = [engine.completion(PROMPTS[i % 5], **kw).tokens for i, kw in enumerate(settings)]
    got: dict[int, list[int]] = {}

    def call(i):
        return lambda: got.__setitem__(i, engine.completion(PROMPTS[i % 5], **settings[i]).tokens)

    _threads(*[call(i) for i in range(16)])
    assert [got[i] for i in range(16)] == expected


def _interrupt(thread: threading.Thread) -> None:
    """Raise KeyboardInterrupt in ``thread`` (what a kernel interrupt does to the thread it lands in)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))


def test_an_interrupt_ends_only_the_interrupted_call_of_three(engine, alone):
    """Three threads wait on calls; a KeyboardInterrupt in one (its rows run 200 steps, so it is still waiting)
    ends that call only: the other two equal their runs alone and its rows leave the batch."""
    outcome: dict[int, object] = {}
    started = threading.Event()

    def call(i):
        def run():
            try:
                if i == 1:
                    started.set()
                    engine.batch_completion(PROMPTS[i : i + 2], sampling=LONG)
                    outcome[i] = "finished"
                else:
                    outcome[i] = [r.tokens for r in engine.batch_completion(PROMPTS[i : i + 2], max_tokens=24)]
            except KeyboardInterrupt:
                outcome[i] = "interrupted"

        return run

    threads = [threading.Thread(target=call(i)) for i in range(3)]
    for t in threads:
        t.start()
    started.wait(10)
    _interrupt(threads[1])
    for t in threads:
        t.join(120)
    assert outcome[1] == "interrupted"
    for i in (0, 2):
        assert outcome[i] == [alone[p] for p in PROMPTS[i : i + 2]]
    deadline = time.monotonic() + 30
    while engine._loop.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine._loop.running == 0  # the interrupted call's rows left the batch
    assert engine.completion(PROMPTS[1], max_tokens=24).tokens == alone[PROMPTS[1]]


def test_the_awaitable_form_under_asyncio_gather(engine, alone):
    async def main():
        return await asyncio.gather(
            *[engine.aio.completion(p, max_tokens=24) for p in PROMPTS],
            engine.aio.chat_completion(CHAT, max_tokens=16),
        )

    *completions, reply = asyncio.run(main())
    assert [c.tokens for c in completions] == [alone[p] for p in PROMPTS]
    assert reply.tokens == engine.chat_completion(CHAT, max_tokens=16).tokens
    with pytest.raises(AttributeError, match="awaitable calls"):
        engine.aio.tokenizer  # noqa: B018 - only calls have an awaitable form


@pytest.fixture(scope="module")
def model(llama3_dir):
    ensure_model_parallel(1)
    return load_model_for_rank(resolve_settings(llama3_dir, max_seq_len=256), ModelArgs.from_checkpoint(llama3_dir))


def _scheduler(model) -> Scheduler:
    return Scheduler(model, stop_tokens={}, decode_text=lambda ids: "", max_batch_size=4, max_seq_len=256)


def test_chunked_prefill_equals_whole_prefill(model):
    """A 150-token prompt arriving while two rows decode is prefilled 16 tokens a step (the rows keep decoding
    meanwhile); its tokens and the running rows' tokens equal each run alone, whole."""
    params = SamplingParams.create(max_tokens=40)
    short = [[1, 500 + i, 600 + i] for i in range(2)]
    long = [(7 * k) % 1900 + 10 for k in range(150)]

    def run_alone(prompt):
        return [e.token for e in _scheduler(model).generate([Request(0, prompt, params)]) if e.token is not None]

    expected = [run_alone(p) for p in [*short, long]]
    scheduler = _scheduler(model)
    scheduler.prefill_chunk = 16
    tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
    steps_to_first = None
    for event in scheduler.step([Request(i, p, params) for i, p in enumerate(short)]):
        tokens[event.index].append(event.token)
    for step in range(1, 200):
        events = scheduler.step([Request(2, long, params)] if step == 3 else ())
        decoded = {e.index for e in events}
        for event in events:
            if event.token is not None:
                tokens[event.index].append(event.token)
        if step >= 3 and 2 in decoded and steps_to_first is None:
            steps_to_first = step - 3 + 1
        if 3 <= step < 3 + 150 // 16:
            assert {0, 1} <= decoded  # the running rows got a token at every step of the long prefill
        if not scheduler.busy:
            break
    assert steps_to_first == -(-150 // 16)  # one chunk per step
    assert [tokens[i] for i in range(3)] == expected


@pytest.mark.timeout(120)
def test_close_with_requests_in_flight_answers_every_waiter(llama3_dir):
    engine = build_engine(resolve_settings(llama3_dir, max_batch_size=2, max_seq_len=256))
    errors: list[BaseException] = []

    def call():
        try:
            engine.batch_completion(PROMPTS, sampling=LONG)  # more rows than slots: some wait
        except BaseException as exc:  # noqa: B036 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while engine._loop.running < 3 * len(PROMPTS) and time.monotonic() < deadline:
        time.sleep(0.01)
    loop_thread = engine._loop._thread  # this engine's own (other tests' engines in this process have theirs)
    assert loop_thread is not None and loop_thread.is_alive()
    engine.close()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == 3 and all(isinstance(e, WorkbenchError) and "unloaded" in str(e) for e in errors)
    assert not loop_thread.is_alive()  # close() joined it
    with pytest.raises(WorkbenchError, match="load"):
        engine.completion("Hi", max_tokens=2)


def test_exclusive_use_nests_in_one_thread_and_the_loop_resumes(engine, alone):
    """Work that needs the runner to itself (logits, scoring, re-loads) parks the loop; a nested use in the same
    thread runs inside the outer one, and the loop takes requests again once the outermost ends."""
    ids = engine.tokenizer.encode(PROMPTS[0], bos=True)
    expected = engine.logits([ids])[0]
    with engine._loop.exclusive(drain=True):
        with engine._loop.exclusive():
            assert (engine.logits([ids])[0] == expected).all()  # a third, nested use
        assert engine._loop._pause_wanted  # still parked: the outermost use has not ended
    assert engine.completion(PROMPTS[0], max_tokens=24).tokens == alone[PROMPTS[0]]
