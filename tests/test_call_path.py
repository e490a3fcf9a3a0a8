"""One straight path from a call to the model: from the public ``Engine.batch_chat_completion`` to the first
transformer forward there are at most seven workbench frames on the stack, none of them twice (no round trip back
through the engine's public methods, no second Llama Stack wrapper)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import workbench
from workbench.models.transformer import Transformer
from workbench.session import build_engine, resolve_settings

ROOT = Path(workbench.__file__).parent
FORWARDS = ("forward_packed", "forward_full", "forward_decode", "forward_decode_static")
MAX_FRAMES = 7


@pytest.fixture(scope="module")
def engine(llama3_dir):
    e = build_engine(resolve_settings(llama3_dir, model="Llama3.2-3B-Instruct", max_batch_size=2, max_seq_len=128))
    yield e
    e.close()


def _first_forward_stack(call) -> list[tuple[str, str]] | None:
    """The workbench frames between ``call()`` and the first transformer forward it reaches, outermost first
    (None: no forward ran).  The forwards are patched only while ``call`` runs."""
    seen: list[list[tuple[str, str]]] = []
    with pytest.MonkeyPatch.context() as patch:
        for name in FORWARDS:
            original = getattr(Transformer, name)

            def hook(self, *args, _original=original, **kwargs):
                if not seen:
                    frames = inspect.stack()[1:]  # the hook's callers, innermost first
                    seen.append(
                        [
                            (str(Path(f.filename).relative_to(ROOT)), f.function)
                            for f in frames
                            if Path(f.filename).is_relative_to(ROOT)
                        ]
                    )
                return _original(self, *args, **kwargs)

            patch.setattr(Transformer, name, hook)
        call()
    return list(reversed(seen[0])) if seen else None


def _frames_to_first_forward(call) -> list[tuple[str, str]]:
    frames = _first_forward_stack(call)
    assert frames is not None, "no transformer forward ran"
    return frames


def test_a_chat_batch_reaches_the_model_in_seven_frames_none_twice(engine) -> None:
    dialogs = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Hello"}]]
    frames = _frames_to_first_forward(lambda: engine.batch_chat_completion(dialogs, max_tokens=2))
    listing = "\n".join(f"  {path}:{function}" for path, function in frames)
    assert frames[0][0] == "engine/llama_stack.py" and frames[1] == ("engine/engine.py", "batch_chat_completion"), (
        listing
    )
    assert len(frames) <= MAX_FRAMES, f"{len(frames)} workbench frames to the first forward:\n{listing}"
    assert len(set(frames)) == len(frames), f"a frame appears twice:\n{listing}"


def test_a_call_with_a_run_store_takes_the_same_path(engine, monkeypatch, tmp_path) -> None:
    """``run=`` looks the rows up before the call reaches the model and stores them from the finish hook: no frame
    on the way to the forward is added or entered twice."""
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    dialogs = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Hello"}]]
    plain = _frames_to_first_forward(lambda: engine.batch_chat_completion(dialogs, max_tokens=2))
    stored = _frames_to_first_forward(lambda: engine.batch_chat_completion(dialogs, max_tokens=2, run="call-path"))
    assert stored == plain and len(stored) <= MAX_FRAMES and len(set(stored)) == len(stored)
    # the rows went to the store: the same call again is answered from there, no forward runs
    assert _first_forward_stack(lambda: engine.batch_chat_completion(dialogs, max_tokens=2, run="call-path")) is None


def test_the_measurement_sees_a_wrapper_entered_twice(engine) -> None:
    """The tool loop sits above the engine and calls its public ``batch_chat_completion`` (the one chat route): its
    stack holds the Llama Stack wrapper more than once, which the test above would refuse."""
    frames = _frames_to_first_forward(
        lambda: workbench.tools.run(engine, [{"role": "user", "content": "Hi"}], max_turns=1, max_tokens=1)
    )
    assert frames.count(("engine/llama_stack.py", "wrapper")) >= 2
    assert ("tools/loop.py", "complete_turn") in frames and ("engine/engine.py", "generate_tokens") in frames
    assert ("engine/engine.py", "batch_chat_completion") in frames
