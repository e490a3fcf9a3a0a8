"""One straight path from a call to the model.  The path has two halves since every call feeds the engine's
running batch: in the calling thread, from the public ``Engine.batch_chat_completion`` to handing the rows to the
engine's loop (``EngineLoop.submit``), at most five workbench frames; in the loop's thread, from its step to the
first transformer forward, at most five.  No frame appears twice in a half (no round trip back through the
engine's public methods, no second Llama Stack wrapper)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import workbench
from workbench.engine.loop import EngineLoop
from workbench.models.transformer import Transformer
from workbench.session import build_engine, resolve_settings

ROOT = Path(workbench.__file__).parent
FORWARDS = ("forward_packed", "forward_full", "forward_decode", "forward_decode_static")
MAX_FRAMES = 5  # in each half


@pytest.fixture(scope="module")
def engine(llama3_dir):
    e = build_engine(resolve_settings(llama3_dir, model="Llama3.2-3B-Instruct", max_batch_size=2, max_seq_len=128))
    yield e
    e.close()


def _workbench_frames() -> list[tuple[str, str]]:
    """The workbench frames calling the caller of this function, outermost first."""
    frames = inspect.stack()[2:]  # innermost first
    return list(
        reversed(
            [
                (str(Path(f.filename).relative_to(ROOT)), f.function)
                for f in frames
                if Path(f.filename).is_relative_to(ROOT)
            ]
        )
    )


def _first_forward_stack(call) -> list[tuple[str, str]] | None:
    """The workbench frames between ``call()`` and the first transformer forward it reaches, outermost first: the
    calling thread's up to ``EngineLoop.submit`` and then the loop thread's (None: no forward ran).  The forwards
    and ``submit`` are patched only while ``call`` runs."""
    seen: list[list[tuple[str, str]]] = []
    submitted: list[list[tuple[str, str]]] = []
    with pytest.MonkeyPatch.context() as patch:
        for name in FORWARDS:
            original = getattr(Transformer, name)

            def hook(self, *args, _original=original, **kwargs):
                if not seen:
                    seen.append(_workbench_frames())
                return _original(self, *args, **kwargs)

            patch.setattr(Transformer, name, hook)
        submit = EngineLoop.submit

        def submit_hook(self, requests):
            if not submitted:
                submitted.append(_workbench_frames() + [("engine/loop.py", "submit")])
            return submit(self, requests)

        patch.setattr(EngineLoop, "submit", submit_hook)
        call()
    if not seen:
        return None
    return (submitted[0] if submitted else []) + seen[0]


def _halves(frames: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    cut = frames.index(("engine/loop.py", "submit")) + 1
    return frames[:cut], frames[cut:]


def _frames_to_first_forward(call) -> list[tuple[str, str]]:
    frames = _first_forward_stack(call)
    assert frames is not None, "no transformer forward ran"
    return frames


def test_a_chat_batch_reaches_the_model_in_five_frames_per_thread_none_twice(engine) -> None:
    dialogs = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Hello"}]]
    frames = _frames_to_first_forward(lambda: engine.batch_chat_completion(dialogs, max_tokens=2))
    listing = "\n".join(f"  {path}:{function}" for path, function in frames)
    assert frames[0][0] == "engine/llama_stack.py" and frames[1] == ("engine/engine.py", "batch_chat_completion"), (
        listing
    )
    caller, loop = _halves(frames)
    assert loop[0] == ("engine/loop.py", "_run"), listing
    for half in (caller, loop):
        assert len(half) <= MAX_FRAMES, f"{len(half)} workbench frames in one thread:\n{listing}"
        assert len(set(half)) == len(half), f"a frame appears twice:\n{listing}"


def test_a_call_with_a_run_store_takes_the_same_path(engine, monkeypatch, tmp_path) -> None:
    """``run=`` looks the rows up before the call reaches the model and stores them from the finish hook: no frame
    on the way to the forward is added or entered twice."""
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    dialogs = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Hello"}]]
    plain = _frames_to_first_forward(lambda: engine.batch_chat_completion(dialogs, max_tokens=2))
    stored = _frames_to_first_forward(lambda: engine.batch_chat_completion(dialogs, max_tokens=2, run="call-path"))
    assert stored == plain and all(len(half) <= MAX_FRAMES for half in _halves(stored))
    # the rows went to the store: the same call again is answered from there, no forward runs
    assert _first_forward_stack(lambda: engine.batch_chat_completion(dialogs, max_tokens=2, run="call-path")) is None


def test_the_measurement_sees_a_wrapper_entered_twice(engine) -> None:
    """The tool loop sits above the engine and calls its public ``batch_chat_completion`` (the one chat route): its
    stack holds the Llama Stack wrapper more than once, which the test above would refuse.  (The turn-synchronous
    loop, which calls from the caller's thread; the per-dialog loop calls from a thread of each dialog's.)"""
    frames = _frames_to_first_forward(
        lambda: workbench.tools.run_turns(engine, [[{"role": "user", "content": "Hi"}]], max_turns=1, max_tokens=1)
    )
    assert frames.count(("engine/llama_stack.py", "wrapper")) >= 2
    assert ("tools/loop.py", "complete_turn") in frames and ("engine/engine.py", "generate_tokens") in frames
    assert ("engine/engine.py", "batch_chat_completion") in frames
