"""Cancellation between decode steps (``engine.cancel()``), progress bars and discoverable signatures."""

from __future__ import annotations

import inspect
import threading

import pytest
from tqdm import tqdm

import workbench as wb
from workbench.errors import GenerationCancelled, InputError
from workbench.progress import tqdm_bars_off
from workbench.session import build_engine, resolve_settings

PROMPTS = ["The capital of France is", "Once upon a time", "def f(x):", "Llamas are"]


@pytest.fixture(scope="module")
def engine(llama3_dir):
    return build_engine(resolve_settings(llama3_dir, max_batch_size=4, max_seq_len=128))


class _CountingRunner:
    """Wraps the engine's runner: counts decode forwards and calls ``engine.cancel()`` after the step that made
    the N-th event, as a Stop button's callback on another thread would."""

    def __init__(self, engine: wb.Engine, cancel_after: int) -> None:
        self.engine, self.inner, self.cancel_after = engine, engine._runner, cancel_after
        self.events = 0
        self.forwards = 0
        model = self.inner.model
        original = model.forward_decode

        def counted(*args, **kwargs):
            self.forwards += 1
            return original(*args, **kwargs)

        model.forward_decode = counted
        self._restore = lambda: delattr(model, "forward_decode")

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self, add, cancel):
        events = self.inner.step(add, cancel)
        self.events += len(events)
        if self.events == self.cancel_after:
            assert self.engine.cancel() is True
        return events


@pytest.fixture
def cancelling(engine):
    made: list[_CountingRunner] = []

    def install(after: int) -> _CountingRunner:
        runner = _CountingRunner(engine, after)
        made.append(runner)
        engine._runner = runner
        return runner

    yield install
    for runner in made:
        engine._runner = runner.inner
        runner._restore()


@pytest.mark.timeout(120)
def test_cancel_stops_a_batch_within_one_step_and_the_engine_is_unchanged(engine, cancelling):
    expected = engine.batch_completion(PROMPTS, max_tokens=40)
    runner = cancelling(after=4 * 5)  # 4 rows: the prefill step plus 4 decode steps
    with pytest.raises(GenerationCancelled) as caught:
        engine.batch_completion(PROMPTS, max_tokens=40)
    assert runner.forwards == 4  # no forward pass started after the cancel (the loop's next step only cancels)
    partial = caught.value.partial
    assert [p.stop_reason for p in partial] == ["cancelled"] * 4
    for got, want in zip(partial, expected):  # what the call had read when it saw the cancel: at most 5 tokens
        assert got.tokens == want.tokens[: len(got.tokens)] and len(got.tokens) <= 5
    engine._runner = runner.inner
    again = engine.batch_completion(PROMPTS, max_tokens=40)
    assert [r.tokens for r in again] == [r.tokens for r in expected]


@pytest.mark.timeout(120)
def test_cancel_ends_a_stream_and_the_next_stream_is_identical(engine):
    full = list(engine.stream_completion("Once upon a time", max_tokens=30))
    stream = engine.stream_completion("Once upon a time", max_tokens=30)
    seen = [next(stream) for _ in range(3)]
    assert engine.cancel() is True
    with pytest.raises(GenerationCancelled) as caught:
        next(stream)
    (partial,) = caught.value.partial
    assert partial.tokens == [c.token for c in full[:3]] and partial.stop_reason == "cancelled"
    assert [c.text for c in seen] == [c.text for c in full[:3]]
    again = list(engine.stream_completion("Once upon a time", max_tokens=30))
    assert again[-1].final.tokens == full[-1].final.tokens
    assert "".join(c.text for c in again) == full[-1].final.text


def test_cancel_between_calls_does_not_touch_the_next_call(engine):
    assert engine.cancel() is False  # nothing running
    result = engine.completion("Hello", max_tokens=6)
    assert len(result.tokens) == 6


@pytest.mark.timeout(120)
def test_cancel_from_another_thread_stops_a_running_chat(engine):
    messages = [{"role": "user", "content": "Tell me a long story"}]
    errors: list[BaseException] = []
    started = threading.Event()

    def consume():
        try:
            for _item in engine.chat_completion(messages, stream=True, max_tokens=100):
                started.set()
        except BaseException as exc:  # noqa: B036 - collected for the assertion below
            errors.append(exc)
        finally:
            started.set()

    worker = threading.Thread(target=consume)
    worker.start()
    assert started.wait(60)
    engine.cancel()
    worker.join(60)
    assert not worker.is_alive()
    if errors:  # the reply may also have ended on its own before the cancel landed
        assert isinstance(errors[0], GenerationCancelled)
        assert len(errors[0].partial[0].tokens) < 100
    reference = engine.chat_completion(messages, max_tokens=20)
    assert reference.tokens == engine.chat_completion(messages, max_tokens=20).tokens


def test_progress_bar_counts_rows_and_tokens(engine, capsys):
    results = engine.batch_completion(PROMPTS, max_tokens=5, progress=True)
    err = capsys.readouterr().err
    assert "4/4" in err and "row" in err and f"{sum(len(r.tokens) for r in results)} tok" in err
    engine.batch_completion(PROMPTS, max_tokens=5, progress=False)
    assert capsys.readouterr().err == ""
    with pytest.raises(InputError, match="progress"):
        engine.batch_completion(PROMPTS, max_tokens=5, progress="yes")


def test_the_automatic_bar_threshold_follows_workbench_progress_delay(engine, capsys, monkeypatch):
    """progress=None shows a bar only after the threshold: with $WORKBENCH_PROGRESS_DELAY=0 every automatic bar
    shows (what notebooks/build.py runs with, so that a bar that would appear on a slow machine appears at build
    time too); with a threshold far above the call's length none does; a value that is no number of seconds is a
    clear error."""
    monkeypatch.setenv("WORKBENCH_PROGRESS_DELAY", "0")
    results = engine.batch_completion(PROMPTS, max_tokens=5)
    err = capsys.readouterr().err
    assert "4/4" in err or f"{sum(len(r.tokens) for r in results)} tokens" in err
    monkeypatch.setenv("WORKBENCH_PROGRESS_DELAY", "3600")
    engine.batch_completion(PROMPTS, max_tokens=5)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("WORKBENCH_PROGRESS_DELAY", "soon")
    with pytest.raises(InputError, match="WORKBENCH_PROGRESS_DELAY='soon' is not a number of seconds"):
        engine.batch_completion(PROMPTS, max_tokens=5)
    monkeypatch.setenv("WORKBENCH_PROGRESS_DELAY", "0")
    assert engine.batch_completion(PROMPTS, max_tokens=5, progress=False) == results  # still usable, no bar
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "name",
    [
        "completion",
        "batch_completion",
        "stream_completion",
        "chat_completion",
        "batch_chat_completion",
        "stream_chat_completion",
    ],
)
def test_sampling_options_are_explicit_keyword_only_and_documented(name):
    method = getattr(wb.Engine, name)
    params = inspect.signature(method).parameters
    for option, default in [
        ("max_tokens", None),
        ("temperature", 0.0),
        ("top_p", 1.0),
        ("top_k", 0),
        ("seed", None),
        ("logprobs", 0),
        ("stop", None),
    ]:
        assert params[option].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[option].default == default
        assert option + ":" in method.__doc__
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def test_unknown_keyword_is_a_type_error(engine):
    with pytest.raises(TypeError, match="temprature"):
        engine.completion("Hi", temprature=0.5)


def test_shard_loading_and_set_quantization_show_progress(make_checkpoint, capsys):
    from workbench.checkpoints.factory import TINY_LLAMA3

    folder = make_checkpoint(TINY_LLAMA3, n_shards=2)
    from workbench.checkpoints.load import load_state_dict_for_rank
    from workbench.models.args import ModelArgs

    args = ModelArgs.from_checkpoint(folder)
    load_state_dict_for_rank(folder, args, progress=True)
    err = capsys.readouterr().err
    assert "loading shards" in err and "2/2" in err
    engine = build_engine(resolve_settings(folder, max_batch_size=2, max_seq_len=64))
    engine.set_quantization("bf16", progress=True)
    err = capsys.readouterr().err
    assert "quantization -> bf16" in err and "1/1" in err
    assert engine.settings.quantization == "bf16"
    engine.close()


def test_tqdm_bars_off_silences_every_tqdm_bar_in_the_block_and_restores_tqdm(capsys):
    """Third-party bars (lm-eval's) pass ``disable=False`` or nothing; inside the block neither draws, and tqdm
    is itself again after it, an exception included."""
    with tqdm_bars_off():
        assert list(tqdm(range(3), desc="building")) == [0, 1, 2]  # the iterable still runs through
        list(tqdm(range(3), desc="requests", disable=False))
    assert capsys.readouterr().err == ""
    with pytest.raises(RuntimeError), tqdm_bars_off():
        raise RuntimeError("a failing evaluation")
    list(tqdm(range(3), desc="after"))
    assert "after" in capsys.readouterr().err
