"""The kernel-resident singleton: one engine per effective settings, real memory release, and
survival of package reloads (``importlib.reload`` and IPython's ``%autoreload``)."""

from __future__ import annotations

import gc
import importlib
import json
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest
import torch
from fairscale.nn.model_parallel import initialize as fs_init

import workbench as wb
import workbench.session as session
from workbench.config import ENV_VARS
from workbench.errors import ConfigError, MissingCheckpointFileError, WorkbenchError

SMALL = dict(max_seq_len=64, max_batch_size=2)


def kernel_state():
    return sys.modules[session._STATE_MODULE]


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """No Llama Stack variables or checkpoints.toml from the host; no engine before or after a test."""
    for var in (*ENV_VARS.values(), "WORKBENCH_CHECKPOINTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))
    monkeypatch.chdir(tmp_path)
    wb.unload()
    yield
    wb.unload()


def test_same_effective_settings_return_the_same_engine(llama3_dir):
    engine = wb.load(llama3_dir, **SMALL)
    loads = kernel_state().loads
    assert wb.load(llama3_dir, **SMALL) is engine
    # the same settings spelled differently: defaults made explicit, a relative path, a str
    assert (
        wb.load(str(llama3_dir), model_parallel_size=1, device="cpu", dtype="fp32", quantization="none", **SMALL)
        is engine
    )
    assert wb.current() is engine and kernel_state().loads == loads


def test_compile_keyword_compiles_the_loaded_engine_once(llama3_dir, monkeypatch):
    """``wb.load(..., compile=True)`` compiles the (same) engine once; compile_decode itself is tested in
    test_throughput.py."""
    from workbench.engine.engine import Engine

    calls = []

    def fake_compile(self):
        calls.append(self)
        self.compile_seconds = 1.5
        return 1.5

    monkeypatch.setattr(Engine, "compile_decode", fake_compile)
    engine = wb.load(llama3_dir, **SMALL)
    assert wb.load(llama3_dir, compile=True, **SMALL) is engine and calls == [engine]
    assert wb.load(llama3_dir, compile=True, **SMALL) is engine and calls == [engine]  # already compiled
    assert engine.info()["compile_seconds"] == 1.5


def test_named_entry_and_environment_resolve_to_the_loaded_engine(monkeypatch, tmp_path, llama3_dir):
    engine = wb.load(llama3_dir, **SMALL)
    (tmp_path / "checkpoints.toml").write_text(f'[tiny]\npath = "{llama3_dir}"\nmax_seq_len = 64\n')
    assert wb.load("tiny", max_batch_size=2) is engine
    monkeypatch.setenv("MAX_BATCH_SIZE", "2")
    monkeypatch.setenv("MAX_SEQ_LEN", "64")
    assert wb.load(llama3_dir) is engine
    monkeypatch.setenv("INFERENCE_CHECKPOINT_DIR", str(llama3_dir))
    assert wb.load() is engine


def test_other_settings_free_the_old_engine(llama3_dir):
    old = wb.load(llama3_dir, **SMALL)
    expected = old.completion("Hello there", max_tokens=6).tokens
    model_ref = weakref.ref(old._runner.model)
    new = wb.load(llama3_dir, max_seq_len=96, max_batch_size=2)
    assert new is not old and wb.current() is new and old.closed
    gc.collect()
    assert model_ref() is None
    assert "unloaded" in repr(old)
    with pytest.raises(WorkbenchError, match=r"workbench\.load"):
        old.completion("Hello there", max_tokens=2)
    assert new.completion("Hello there", max_tokens=6).tokens == expected


def test_memory_is_released_even_when_a_traceback_holds_the_model(llama3_dir):
    """After an interrupted cell, IPython keeps the traceback (and so the model's frames) alive."""
    engine = wb.load(llama3_dir, **SMALL)
    model = engine._runner.model
    weight_ref = weakref.ref(model.output.weight)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    model.layers[1].feed_forward.forward = interrupt
    try:
        engine.completion("Hello", max_tokens=3)
    except KeyboardInterrupt:
        kept = sys.exc_info()  # like sys.last_traceback in a notebook
    del model
    wb.unload()
    gc.collect()
    weight = weight_ref()
    assert weight is None or weight.device.type == "meta"  # the storage is gone either way
    assert kept[2] is not None


def test_interrupt_inside_a_forward_in_process(llama4_dir):
    """Ctrl-C lands mid-forward (a layer's KV cache half written) or in a streaming callback: the next
    call returns exactly what a fresh engine would."""
    engine = wb.load(llama4_dir, max_seq_len=96, max_batch_size=3)
    prompts = ["Hi", "The capital of France is", "Once upon a time " * 8, "a", "b c d"]
    expected = engine.batch_completion(prompts, max_tokens=10)
    attention = engine._runner.model.layers[2].attention
    calls = {"n": 0}
    real_forward = attention.forward

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:  # a decode step, after other layers already wrote this step's keys
            raise KeyboardInterrupt
        return real_forward(*args, **kwargs)

    attention.forward = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.batch_completion(prompts, max_tokens=10)
    finally:
        del attention.forward
    with pytest.raises(ZeroDivisionError):
        for i, _chunk in enumerate(engine.stream_completion(prompts[2], max_tokens=10)):
            if i == 4:
                raise ZeroDivisionError("user callback")
    assert [r.tokens for r in engine.batch_completion(prompts, max_tokens=10)] == [r.tokens for r in expected]
    fresh = wb.load(llama4_dir, max_seq_len=96, max_batch_size=2)  # other settings: a fresh engine
    assert [r.tokens for r in fresh.batch_completion(prompts, max_tokens=10)] == [r.tokens for r in expected]


def test_current_unload_and_closing_by_hand(llama3_dir):
    assert wb.current() is None
    engine = wb.load(llama3_dir, **SMALL)
    assert wb.current() is engine
    wb.unload()
    assert wb.current() is None and engine.closed
    wb.unload()  # nothing loaded: a no-op
    engine = wb.load(llama3_dir, **SMALL)
    engine.close()
    assert wb.current() is None
    again = wb.load(llama3_dir, **SMALL)
    assert again is not engine and not again.closed


def test_bad_settings_leave_the_loaded_engine_alone(llama3_dir, tmp_path):
    engine = wb.load(llama3_dir, **SMALL)
    with pytest.raises(ConfigError, match="max_seq= .*did you mean max_seq_len="):
        wb.load(llama3_dir, max_seq=64)
    with pytest.raises(MissingCheckpointFileError):
        wb.load(tmp_path / "missing", **SMALL)
    with pytest.raises(WorkbenchError):
        wb.load(llama3_dir, max_seq_len=-3)
    assert wb.current() is engine and len(engine.completion("Hi", max_tokens=2).tokens) == 2


def test_set_quantization_is_remembered_by_load(llama3_dir):
    engine = wb.load(llama3_dir, **SMALL)
    reloaded = []
    engine._runner.reload = reloaded.append  # quantization itself is not under test here
    engine.set_quantization("int4_mixed")
    del engine._runner.reload
    assert [s.quantization for s in reloaded] == ["int4_mixed"]
    assert wb.load(llama3_dir, quantization="int4_mixed", **SMALL) is engine
    other = wb.load(llama3_dir, **SMALL)  # no quantization: a different engine
    assert other is not engine and other.settings.quantization is None


def test_repeated_loads_never_trip_fairscale(llama3_dir, llama4_dir):
    for folder in (llama3_dir, llama4_dir, llama3_dir):
        engine = wb.load(folder, **SMALL)
        assert len(engine.completion("Hi", max_tokens=2).tokens) == 2
        wb.unload()
        assert fs_init.model_parallel_is_initialized() and fs_init.get_model_parallel_world_size() == 1


def test_importlib_reload_keeps_the_engine(llama3_dir):
    engine = wb.load(llama3_dir, **SMALL)
    loads = kernel_state().loads
    importlib.reload(importlib.import_module("workbench.config"))  # a new Settings class from here on
    importlib.reload(importlib.import_module("workbench.session"))
    importlib.reload(wb)
    assert wb.current() is engine
    assert wb.load(llama3_dir, **SMALL) is engine
    assert kernel_state().loads == loads


def test_ipython_autoreload_keeps_the_engine(llama3_dir, tmp_path):
    """``%autoreload 2`` in a real IPython shell, with every workbench module marked as changed."""
    script = textwrap.dedent(f"""
        import json, sys
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "autoreload")
        shell.run_line_magic("autoreload", "2 --full")  # the classic full reload: new classes, new functions
        def run(code):
            result = shell.run_cell(code)
            if not result.success:
                result.raise_error()
        run("import sys, workbench as wb\\nengine = wb.load({str(llama3_dir)!r}, max_seq_len=64, max_batch_size=2)")
        run("config_before = sys.modules['workbench.config'].Settings")
        reloader = shell.magics_manager.registry["AutoreloadMagics"]._reloader
        changed = [name for name in list(sys.modules) if name == "workbench" or name.startswith("workbench.")]
        for name in changed:  # pretend every workbench file was edited
            reloader.modules_mtimes[name] = 0.0
        run("again = wb.load({str(llama3_dir)!r}, max_seq_len=64, max_batch_size=2)")
        run("reloaded = sys.modules['workbench.config'].Settings is not config_before")
        ns = shell.user_ns
        print(json.dumps({{"same": ns["again"] is ns["engine"], "current": ns["wb"].current() is ns["engine"],
                          "loads": sys.modules["_workbench_kernel_state"].loads, "changed": len(changed),
                          "reloaded": ns["reloaded"]}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"same": True, "current": True, "loads": 1, "changed": result["changed"], "reloaded": True}
    assert result["changed"] > 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the allocator check is CUDA-only")
def test_cuda_memory_drops_after_replacement(llama3_dir):
    wb.load(llama3_dir, device="cuda", **SMALL)
    held = torch.cuda.memory_allocated()
    wb.unload()
    assert torch.cuda.memory_allocated() < held and torch.cuda.memory_reserved() < held
