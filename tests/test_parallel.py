"""Model parallelism on CPU (gloo): worker processes give the same tokens and logits as one process,
survive interrupts and exceptions, report dead workers, and leave no processes behind."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import workbench as wb
from workbench.checkpoints.factory import TINY_LLAMA3, TINY_LLAMA4
from workbench.errors import CheckpointError, WorkerError
from workbench.runtime import ParallelRunner
from workbench.session import build_engine, resolve_settings

SMALL = dict(max_seq_len=96, max_batch_size=4, device="cpu", dtype="float32", quantization="none")
PROMPTS = [
    "Hi",
    "The capital of France is",
    "Once upon a time " * 8,  # > 32 tokens: Llama 4's chunked attention in prefill and decode
    "def f(x):\n    return x * 2\n",
    "🦙 ünïcödé",
    "Q: What is 17 * 23?\nA:",
]
LLAMA4_KV1 = {**TINY_LLAMA4, "n_kv_heads": 1}  # 2 ranks > 1 KV head: the head is repeated on each rank


def running(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process."""
    try:
        import psutil
    except ImportError:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], limit_s: float = 30.0) -> list[int]:
    """Pids still running after waiting up to ``limit_s`` (a bound, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while (alive := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def engine_for(folder: Path, mp: int) -> wb.Engine:
    return build_engine(resolve_settings(folder, model_parallel_size=mp, **SMALL))


@pytest.fixture(scope="module")
def llama3_mp1(llama3_dir):
    engine = engine_for(llama3_dir, 1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def llama3_mp2(llama3_dir):
    engine = engine_for(llama3_dir, 2)
    yield engine
    pids = engine._runner.pids
    engine.close()
    assert not wait_gone(pids, 0)


@pytest.fixture(scope="module")
def llama4_kv1_dir(make_checkpoint):
    return make_checkpoint(LLAMA4_KV1, layout="fused", seed=5)


@pytest.fixture(scope="module")
def llama4_mp1(llama4_kv1_dir):
    engine = engine_for(llama4_kv1_dir, 1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def llama4_mp2(llama4_kv1_dir):
    engine = engine_for(llama4_kv1_dir, 2)
    yield engine
    engine.close()


def token_ids(engine: wb.Engine) -> list[list[int]]:
    return [engine.tokenizer.encode(p, bos=True) for p in PROMPTS]


def assert_same_model(mp1: wb.Engine, mp2: wb.Engine) -> None:
    greedy1 = mp1.batch_completion(PROMPTS, max_tokens=12)
    greedy2 = mp2.batch_completion(PROMPTS, max_tokens=12)
    assert [r.tokens for r in greedy2] == [r.tokens for r in greedy1]
    assert [r.stop_reason for r in greedy2] == [r.stop_reason for r in greedy1]
    sequences = [ids + r.tokens for ids, r in zip(token_ids(mp1), greedy1)]
    for a, b in zip(mp1.logits(sequences), mp2.logits(sequences)):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
        torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
    seeded = dict(max_tokens=10, temperature=0.9, top_p=0.95, seed=11, logprobs=2)
    s1, s2 = mp1.batch_completion(PROMPTS[:3], **seeded), mp2.batch_completion(PROMPTS[:3], **seeded)
    assert [r.tokens for r in s2] == [r.tokens for r in s1]
    for r1, r2 in zip(s1, s2):
        assert [lp.logprob for lp in r2.logprobs] == pytest.approx([lp.logprob for lp in r1.logprobs], abs=1e-4)


# --------------------------------------------------------------------------------------------- equivalence
def test_llama3_one_shard_split_over_two_ranks_matches_one_process(llama3_mp1, llama3_mp2):
    assert isinstance(llama3_mp2._runner, ParallelRunner) and len(llama3_mp2._runner.pids) == 2
    assert_same_model(llama3_mp1, llama3_mp2)


def test_llama4_more_ranks_than_kv_heads_matches_one_process(llama4_mp1, llama4_mp2):
    assert llama4_mp2.args.kv_heads == 1 and llama4_mp2.family == "llama4"
    assert_same_model(llama4_mp1, llama4_mp2)


def test_two_shard_checkpoints_merge_into_one_process(make_checkpoint, llama3_mp1, llama3_dir):
    for params, layout, seed, reference in ((TINY_LLAMA3, "modules", 0, llama3_mp1), (TINY_LLAMA4, "fused", 3, None)):
        one = reference or engine_for(make_checkpoint(params, layout=layout, seed=seed), 1)
        two = engine_for(make_checkpoint(params, n_shards=2, layout=layout, seed=seed), 1)
        ids = token_ids(one)
        for a, b in zip(one.logits(ids), two.logits(ids)):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
        assert [r.tokens for r in two.batch_completion(PROMPTS, max_tokens=8)] == [
            r.tokens for r in one.batch_completion(PROMPTS, max_tokens=8)
        ]
        two.close()


def test_four_ranks_split_two_shards_and_repeat_kv_heads(make_checkpoint, llama3_mp1):
    """TINY_LLAMA3 saved as 2 shards, run on 4 ranks: each shard is split in two, and the 2 KV heads
    are repeated so each rank holds one."""
    engine = engine_for(make_checkpoint(TINY_LLAMA3, n_shards=2), 4)
    try:
        assert len(engine._runner.pids) == 4
        ids = token_ids(llama3_mp1)[:3]
        for a, b in zip(llama3_mp1.logits(ids), engine.logits(ids)):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
        assert [r.tokens for r in engine.batch_completion(PROMPTS[:3], max_tokens=6)] == [
            r.tokens for r in llama3_mp1.batch_completion(PROMPTS[:3], max_tokens=6)
        ]
    finally:
        pids = engine._runner.pids
        engine.close()
    assert not wait_gone(pids, 0)


def test_unseeded_sampling_agrees_across_ranks(llama3_mp2):
    """Without a seed each row gets one in the kernel, so the ranks never diverge (a divergence hangs)."""
    rows = llama3_mp2.batch_completion(PROMPTS, max_tokens=8, temperature=1.2)
    assert all(len(r.tokens) == 8 for r in rows)
    assert llama3_mp2.completion("Hi", max_tokens=3).tokens == llama3_mp2.completion("Hi", max_tokens=3).tokens


def test_info_counts_the_whole_model(llama3_mp1, llama3_mp2, llama4_mp1, llama4_mp2):
    for mp1, mp2 in ((llama3_mp1, llama3_mp2), (llama4_mp1, llama4_mp2)):
        one, two = mp1.info(), mp2.info()
        assert two["parameters"] == one["parameters"] == mp1._runner.model.parameter_count()
        assert (two["model_parallel_size"], one["model_parallel_size"]) == (2, 1)
        # replicated norms/routers (and repeated KV heads) are resident on both ranks: a little more in total
        assert one["weights_bytes"] <= two["weights_bytes"] < 1.02 * one["weights_bytes"]
        per_rank = mp2.memory()["per_rank"]
        assert len(per_rank) == 2 and sum(r["weights_bytes"] for r in per_rank) == two["weights_bytes"]
        assert "mp=2" in repr(mp2) and f"params={one['parameters'] / 1e6:.1f}M" in repr(mp2)
    assert llama3_mp2.info()["kv_cache_bytes"] == llama3_mp1.info()["kv_cache_bytes"]  # 2 KV heads split
    assert llama4_mp2.info()["kv_cache_bytes"] == 2 * llama4_mp1.info()["kv_cache_bytes"]  # 1 head, repeated


# --------------------------------------------------------------------------------------------- interrupts
def record_ends(runner: ParallelRunner) -> list[tuple]:
    """Wrap the runner's receive to record every ("end", rid, rank, status, ...) message."""
    ends: list[tuple] = []
    receive = runner._recv

    def recording(*args, **kwargs):
        rank, message = receive(*args, **kwargs)
        if message[0] == "end":
            ends.append((message[1], rank, message[3]))
        return rank, message

    runner._recv = recording
    return ends


def test_interrupt_mid_batch_cancels_every_rank(llama3_mp2):
    """Ctrl-C in the waiting caller ends its call: the loop cancels its rows at the next step, on every rank (each
    step is one command to every rank), instead of running them to their 80 tokens."""
    expected = llama3_mp2.batch_completion(PROMPTS, max_tokens=10)
    runner = llama3_mp2._runner
    step = runner.step
    caller = threading.get_ident()
    steps = {"n": 0, "after": 0}

    def interrupting(add, cancel):
        events = step(add, cancel)
        steps["n"] += 1
        if steps["n"] == 5:  # what Ctrl-C does: KeyboardInterrupt in the kernel's waiting thread
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(caller), ctypes.py_object(KeyboardInterrupt))
        elif steps["n"] > 5:
            steps["after"] += 1
        return events

    runner.step = interrupting
    try:
        with pytest.raises(KeyboardInterrupt):
            llama3_mp2.batch_completion(PROMPTS, max_tokens=80)
        deadline = time.monotonic() + 60
        while llama3_mp2._loop.running and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        del runner.step
    assert llama3_mp2._loop.running == 0
    assert steps["after"] <= 3  # the rows were cancelled, not run to their end (75 more steps)
    again = llama3_mp2.batch_completion(PROMPTS, max_tokens=10)
    assert [r.tokens for r in again] == [r.tokens for r in expected]


def test_ctrl_c_while_waiting_for_workers(llama3_mp2):
    """KeyboardInterrupt where a real Ctrl-C lands: in the kernel's wait for the workers."""
    runner = llama3_mp2._runner
    ids = token_ids(llama3_mp2)
    expected_logits = llama3_mp2.logits(ids)
    expected = llama3_mp2.batch_completion(PROMPTS, max_tokens=10)
    receive = runner._recv
    for interrupt_at in (1, 7):
        calls = {"n": 0}

        def interrupted(*args, calls=calls, interrupt_at=interrupt_at, **kwargs):
            calls["n"] += 1
            if calls["n"] == interrupt_at:
                raise KeyboardInterrupt
            return receive(*args, **kwargs)

        runner._recv = interrupted
        try:
            with pytest.raises(KeyboardInterrupt):
                llama3_mp2.logits(ids) if interrupt_at == 1 else llama3_mp2.batch_completion(PROMPTS, max_tokens=10)
        finally:
            del runner._recv
        for a, b in zip(expected_logits, llama3_mp2.logits(ids)):
            assert torch.equal(a, b)
        assert [r.tokens for r in llama3_mp2.batch_completion(PROMPTS, max_tokens=10)] == [r.tokens for r in expected]


def test_exception_in_a_callback_and_abandoned_streams(llama3_mp2):
    expected = llama3_mp2.completion(PROMPTS[1], max_tokens=12)
    with pytest.raises(ValueError, match="callback"):
        for i, _chunk in enumerate(llama3_mp2.stream_completion(PROMPTS[1], max_tokens=12)):
            if i == 3:
                raise ValueError("user callback failed")
    stream = llama3_mp2.stream_completion(PROMPTS[1], max_tokens=12)
    next(stream)
    next(stream)  # abandoned mid-way and never closed (as when a cell's traceback keeps it alive)
    assert llama3_mp2.completion(PROMPTS[1], max_tokens=12).tokens == expected.tokens
    del stream  # closing it late must not disturb later requests
    assert llama3_mp2.completion(PROMPTS[1], max_tokens=12).tokens == expected.tokens


def test_exception_on_every_rank_keeps_the_engine_usable(llama3_mp2):
    expected = llama3_mp2.batch_completion(PROMPTS, max_tokens=6)
    llama3_mp2._runner._inject_fault(at_forward=3)  # both ranks raise before their third forward
    with pytest.raises(RuntimeError, match="injected fault") as info:
        llama3_mp2.batch_completion(PROMPTS, max_tokens=6)
    assert "model-parallel worker rank" in str(info.value.__cause__)
    assert llama3_mp2._runner.alive
    assert [r.tokens for r in llama3_mp2.batch_completion(PROMPTS, max_tokens=6)] == [r.tokens for r in expected]


def test_diverging_ranks_are_caught_before_they_hang(llama3_mp2):
    from workbench.runtime import RanksDivergedError

    expected = llama3_mp2.completion(PROMPTS[1], max_tokens=6)
    llama3_mp2._runner._inject_fault(at_forward=2, ranks=[1], action="diverge")
    with pytest.raises(RanksDivergedError, match="diverged at forward 2"):
        llama3_mp2.completion(PROMPTS[1], max_tokens=6)
    assert llama3_mp2.completion(PROMPTS[1], max_tokens=6).tokens == expected.tokens


# --------------------------------------------------------------------------------------------- failures
def test_failure_on_one_rank_stops_the_pool_and_names_it(llama4_mp1, llama4_mp2):
    runner = llama4_mp2._runner
    pids = runner.pids
    runner.sync_timeout_s = 3.0  # rank 0 waits in a collective for rank 1, which has given up
    runner._inject_fault(at_forward=2, ranks=[1])
    with pytest.raises(WorkerError) as info:
        llama4_mp2.batch_completion(PROMPTS, max_tokens=6)
    message = str(info.value)
    assert "rank 1 raised RuntimeError: injected fault" in message and "rank(s) [0]" in message
    assert "workbench.load" in message
    assert not wait_gone(pids, 10) and not runner.alive
    with pytest.raises(WorkerError, match="reload"):
        llama4_mp2.completion("Hi", max_tokens=2)
    runner.reload(llama4_mp2.settings)  # what engine.set_quantization does: fresh workers, same engine
    assert runner.alive and not set(runner.pids) & set(pids)
    assert [r.tokens for r in llama4_mp2.batch_completion(PROMPTS, max_tokens=6)] == [
        r.tokens for r in llama4_mp1.batch_completion(PROMPTS, max_tokens=6)
    ]


def test_killed_worker_is_reported_and_the_engine_reloads(llama3_dir, llama3_mp1):
    engine = wb.load(llama3_dir, model_parallel_size=2, **SMALL)
    old_pids = engine._runner.pids
    expected = llama3_mp1.batch_completion(PROMPTS, max_tokens=10)
    with pytest.raises(WorkerError) as info:
        for i, _chunk in enumerate(engine.stream_completion(PROMPTS[2], max_tokens=40)):
            if i == 3:
                os.kill(old_pids[1], signal.SIGKILL)
    message = str(info.value)
    assert f"rank 1 (pid {old_pids[1]}) was killed by SIGKILL" in message and "workbench.load(" in message
    assert not wait_gone(old_pids, 10)
    with pytest.raises(WorkerError):
        engine.completion("Hi", max_tokens=2)
    reloaded = wb.load(llama3_dir, model_parallel_size=2, **SMALL)
    assert reloaded is not engine and wb.current() is reloaded
    assert [r.tokens for r in reloaded.batch_completion(PROMPTS, max_tokens=10)] == [r.tokens for r in expected]
    new_pids = reloaded._runner.pids
    wb.unload()
    assert not wait_gone(old_pids + new_pids, 0)


def test_worker_that_fails_to_start_reports_its_exception(llama3_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(llama3_dir, broken)
    (broken / "consolidated.00.pth").write_bytes(b"not a checkpoint")
    before = set(_children())
    with pytest.raises(CheckpointError) as info:
        wb.load(broken, model_parallel_size=2, **SMALL)
    message = str(info.value)
    assert "model-parallel worker rank" in message and "re-download" in message
    assert "Traceback" in str(info.value.__cause__)
    assert wb.current() is None
    assert not wait_gone(sorted(set(_children()) - before), 10)


def test_bad_settings_fail_before_any_worker_starts(make_checkpoint):
    before = set(_children())
    with pytest.raises(wb.WorkbenchError, match="model_parallel_size=3"):
        wb.load(make_checkpoint(TINY_LLAMA3, n_shards=2), model_parallel_size=3, **SMALL)
    assert set(_children()) <= before


def _children() -> list[int]:
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children()]


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_no_orphans_when_the_kernel_exits_or_is_killed(llama3_dir, ending):
    """Interpreter exit runs workbench's atexit cleanup; a SIGKILLed kernel's workers notice and exit."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        import workbench as wb
        engine = wb.load({str(llama3_dir)!r}, model_parallel_size=2, max_seq_len=32, max_batch_size=1,
                         device="cpu")
        engine.completion("Hi", max_tokens=2)
        print(*engine._runner.pids, flush=True)
        if {ending!r} == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert out.returncode == (0 if ending == "exit" else -signal.SIGKILL), out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    assert not wait_gone(pids, 0 if ending == "exit" else 30)
