"""workbench.cluster: engine replicas on Ray give one engine's rows, survive a killed replica, place GPUs apart.

Every Ray process runs on 127.0.0.1 and is this module's own: one local Ray started (and stopped) by the
module's pool, then one two-node ``ray.cluster_utils.Cluster`` (stopped with ``Cluster.shutdown()``, never
``ray stop``, which would end every Ray on the machine).  Ray starts cost seconds on two cores, so the pool
(and its Ray) is module-scoped, and only the two-node test starts another.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import time
from typing import Any

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray >= 2.59 turns on token auth; not for a test's own Ray
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")  # no idle Python workers: replicas are actors

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import workbench as wb  # noqa: E402
import workbench.cluster as wbc  # noqa: E402
from workbench.cluster.connect import loopback  # noqa: E402
from workbench.cluster.placement import PlacementError, ReplicaResources, actor_options, release, reserve  # noqa: E402
from workbench.cluster.replica import ReplicaSpec, remote_class  # noqa: E402
from workbench.demo.tools import DEMO_TOOLS  # noqa: E402
from workbench.errors import GenerationCancelled  # noqa: E402

PROMPTS = [
    "Hello there",
    "What is the weather in Paris?",
    "1 2 3 4",
    "Tell me a story about a llama",
    "def fib(n):",
    "Convert 3 km to miles",
    "The capital of France is",
]
DIALOGS = [
    [{"role": "user", "content": q}]
    for q in (
        "What's the weather in Paris?",
        "Convert 3 km to miles",
        "What time is it in Tokyo?",
        "hi there",
        "How many people live in Lima?",
    )
]
TOOLS = list(DEMO_TOOLS.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for every purpose but its table entry
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _plain(message: Any) -> Any:
    """A message without its call ids (fresh random ids at every parse, on one engine as on a pool)."""
    if message is None:
        return None
    calls = [dataclasses.replace(c, call_id="") for c in message.tool_calls or []]
    return dataclasses.replace(message, tool_calls=calls, call_id="")


def _same(a: list, b: list) -> None:
    """Rows equal field by field; logprob values to float noise (batch widths differ between pool and engine)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.tokens, x.stop_reason) == (y.tokens, y.stop_reason)
        assert getattr(x, "text", None) == getattr(y, "text", None)
        assert _plain(getattr(x, "message", None)) == _plain(getattr(y, "message", None))
        assert (x.logprobs is None) == (y.logprobs is None)
        for p, q in zip(x.logprobs or [], y.logprobs or []):
            assert p.token == q.token and abs(p.logprob - q.logprob) < 1e-4
            assert set(p.top_logprobs) == set(q.top_logprobs)


# ------------------------------------------------------------------------------------------ one machine
@pytest.fixture(scope="module")
def pool():
    """Two demo-model replicas on a Ray the pool starts itself (127.0.0.1; 6 CPUs and 4 fake GPUs declared)."""
    assert not ray.is_initialized()
    p = wbc.load(
        replicas=2, device="cpu", cpus_per_replica=1, threads=1, chunk_rows=3, ray_init={"num_cpus": 6, "num_gpus": 4}
    )
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def engine():
    return wb.load(device="cpu")


def test_the_pool_runs_on_its_own_loopback_ray(pool):
    assert ray.is_initialized() and {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    assert all(r["state"] == "live" for r in pool.replicas) and len({r["pid"] for r in pool.replicas}) == 2
    assert "replicas=2 (2/2 live) on 1 node(s)" in repr(pool) and "died=0, replaced=0" in repr(pool)
    assert pool.max_seq_len == wb.load(device="cpu").max_seq_len and pool.tokenizer is not None


def test_greedy_and_seeded_rows_equal_one_engines(pool, engine):
    fmt = [None, {"type": "regex", "regex": r"[a-z]{3} [0-9]{2}"}] + [None] * (len(PROMPTS) - 2)
    for kwargs in (
        {"max_tokens": 12, "logprobs": 2, "stop": ["."], "response_format": fmt},
        {"max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "seed": 7},
        {"sampling": wb.SamplingParams(max_tokens=12, repetition_penalty=0.3)},
    ):  # a new field: no pool edit
        got = pool.batch_completion(PROMPTS, **kwargs)
        _same(got, engine.batch_completion(PROMPTS, **kwargs))
    assert re.fullmatch(r"[a-z]{3} [0-9]{2}", pool.completion(PROMPTS[1], max_tokens=12, response_format=fmt[1]).text)
    # a seeded row is the same row whichever replica runs it: alone, or as the last row of a batch
    alone = pool.completion(PROMPTS[3], max_tokens=12, temperature=1.0, seed=11)
    assert alone.tokens == pool.batch_completion(PROMPTS, max_tokens=12, temperature=1.0, seed=11)[3].tokens


def test_chat_and_the_tool_loop_on_a_pool_equal_the_engines(pool, engine):
    _same(
        pool.batch_chat_completion(DIALOGS, TOOLS, max_tokens=24),
        engine.batch_chat_completion(DIALOGS, TOOLS, max_tokens=24),
    )
    on_pool = wb.tools.run_batch(pool, DIALOGS, tools=TOOLS, max_tokens=24, max_turns=3)
    on_engine = wb.tools.run_batch(engine, DIALOGS, tools=TOOLS, max_tokens=24, max_turns=3)
    assert [[_plain(m) for m in t] for t in on_pool] == [[_plain(m) for m in t] for t in on_engine]
    assert any(m.role == "tool" for t in on_pool for m in t)  # the loop really ran tools


def test_a_pool_stores_rows_in_the_driver_and_answers_from_the_store(pool, engine, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    first = pool.batch_completion(PROMPTS[:3], max_tokens=12, run="pool", item=["a", "b", "c"])
    assert not any(r.cached for r in first)
    both = pool.batch_completion(PROMPTS, max_tokens=12, run="pool")
    assert [r.cached for r in both] == [True] * 3 + [False] * (len(PROMPTS) - 3)
    _same(both, engine.batch_completion(PROMPTS, max_tokens=12))
    assert all(r.cached for r in engine.batch_completion(PROMPTS, max_tokens=12, run="pool"))  # keys as an engine's
    chats = pool.batch_chat_completion(DIALOGS, TOOLS, max_tokens=24, run="pool-chat")
    again = pool.batch_chat_completion(DIALOGS, TOOLS, max_tokens=24, run="pool-chat")
    assert again == chats and all(r.cached for r in again) and not any(r.cached for r in chats)
    sampled = pool.batch_completion(PROMPTS[:2], max_tokens=12, temperature=1.0, run="pool-sampled")
    by_prompt = {row.request["prompt"]: row for row in wb.runs.store().rows("pool-sampled")}
    for prompt, result in zip(PROMPTS[:2], sampled):  # each ran with its own drawn seed
        row = by_prompt[prompt]
        assert row.seed_drawn and result == engine.completion(prompt, max_tokens=12, temperature=1.0, seed=row.seed)


def test_llama_stack_spellings_on_a_pool_equal_the_native_keywords(pool):
    greedy = {"strategy": {"type": "greedy"}, "max_tokens": 12}
    native = pool.batch_chat_completion(DIALOGS, TOOLS, max_tokens=12, tool_choice="auto")
    spelled = pool.batch_chat_completion(
        messages_batch=DIALOGS, tools=TOOLS, sampling_params=greedy, tool_config={"tool_choice": "auto"}
    )
    assert [r.tokens for r in spelled] == [r.tokens for r in native]
    assert [r.tokens for r in pool.batch_completion(content_batch=PROMPTS, sampling_params=greedy)] == [
        r.tokens for r in pool.batch_completion(PROMPTS, max_tokens=12)
    ]


def test_evals_run_on_a_pool_unchanged(pool, engine):
    from workbench.evals import run_cases, synthetic_cases

    cases = synthetic_cases(4)
    on_pool = run_cases(pool, cases, max_tokens=24)
    on_engine = run_cases(engine, cases, max_tokens=24)
    assert on_pool.equals(on_engine)


def test_a_job_reports_progress_and_cancels_on_every_replica(pool, engine):
    rows = PROMPTS * 2
    kwargs = {"max_tokens": 40, "temperature": 1.0, "top_p": 0.9, "seed": 3}
    job = pool.submit_batch_completion(rows, **kwargs)
    assert job.result() and job.done and job.stats()["rows_done"] == len(rows)
    assert set(job.stats()["per_replica"]) == {0, 1}

    for r in pool.fleet.slots:  # every chunk now waits a little inside the replica: the cancel lands mid-job
        ray.get(r.handle.set_delay.remote(0.5))
    try:
        job = pool.submit_batch_completion(rows, **kwargs)
        while job.rows_done == 0:
            time.sleep(0.05)
        assert job.cancel()
        with pytest.raises(GenerationCancelled) as stopped:
            job.result(timeout=60)
    finally:
        for r in pool.fleet.slots:
            ray.get(r.handle.set_delay.remote(0.0))
    assert job.done and len(stopped.value.partial) == len(rows)
    reference = engine.batch_completion(rows, **kwargs)
    kept = job.partial()
    assert 0 < sum(r is not None for r in kept) < len(rows)
    for got, want in zip(kept, reference):
        if got is not None:
            assert got.tokens == want.tokens
    _same(pool.batch_completion(rows, **kwargs), reference)  # nothing of the cancelled job is left behind


def test_a_replica_killed_mid_call_loses_no_row(pool, engine):
    rows = PROMPTS * 2
    reference = engine.batch_completion(rows, max_tokens=10)
    victim = pool.fleet.slots[1]
    for r in pool.fleet.slots:
        ray.get(r.handle.set_delay.remote(1.0))
    try:
        job = pool.submit_batch_completion(rows, max_tokens=10)
        time.sleep(0.5)  # both replicas are inside their first chunk now
        assert victim.inflight > 0 and not job.done
        os.kill(victim.info["pid"], signal.SIGKILL)
        got = job.result(timeout=300)
    finally:
        for r in pool.fleet.slots:
            try:
                ray.get(r.handle.set_delay.remote(0.0), timeout=60)
            except Exception:  # the replacement may still be loading
                pass
    _same(got, reference)
    assert job.stats()["rerun_chunks"] >= 1
    assert pool.wait_ready(300) == 2
    assert "died=1, replaced=1" in repr(pool)
    _same(pool.batch_completion(rows, max_tokens=10), reference)


def test_fake_gpus_give_model_parallel_replicas_disjoint_devices(pool):
    """Placement only (no CUDA engine is built): two replicas of model_parallel_size=2 on 4 GPUs."""
    need = ReplicaResources.create("cuda", 2, cpus_per_replica=0.5)
    assert need.bundle() == {"CPU": 0.5, "GPU": 2.0}
    groups = reserve(2, need, timeout_s=60)
    actor = remote_class()
    replicas = [actor.options(**actor_options(g, need)).remote(ReplicaSpec(checkpoint=None)) for g in groups]
    try:
        seen = ray.get([r.where.remote() for r in replicas])
    finally:
        for r in replicas:
            ray.kill(r)
        release(groups)
    devices = [set(w["cuda_visible_devices"].split(",")) for w in seen]
    assert all(len(d) == 2 for d in devices) and not devices[0] & devices[1]
    assert devices[0] | devices[1] == {"0", "1", "2", "3"}


def test_a_request_no_node_can_meet_fails_at_once(pool):
    with pytest.raises(PlacementError, match=r"needs 8 GPU\(s\).*4 GPU\(s\)"):
        wbc.load(replicas=1, device="cuda", model_parallel_size=8)
    with pytest.raises(PlacementError, match=r"3 replicas need 2 GPU\(s\).*can hold only 2"):
        wbc.load(replicas=3, device="cuda", model_parallel_size=2)
    with pytest.raises(PlacementError, match=r"no node can hold one replica.*6 CPU"):
        wbc.load(replicas=1, device="cpu", cpus_per_replica=7)


def test_sweep_returns_one_frame(pool):
    table = wbc.sweep(
        {"tool_choice": ["auto", "none"], "temperature": [0.0]}, DIALOGS[:2], TOOLS, pool=pool, max_tokens=12
    )
    assert len(table) == 4 and list(table["tool_choice"]) == ["auto"] * 2 + ["none"] * 2
    assert not any(table[table["tool_choice"] == "none"]["tool_calls"])
    assert {"dialog", "content", "tool_calls", "stop_reason", "tokens", "point_tok_s"} <= set(table.columns)


@pytest.mark.slow
def test_model_parallel_replicas_share_a_node_and_leave_nothing(pool, llama3_dir):
    """Two replicas of model_parallel_size=2 on one node: their ranks rendezvous without colliding, give the
    in-process engine's rows, and shutdown ends the actors and their rank workers (the Ray stays: not theirs)."""
    reference = wb.load(llama3_dir, device="cpu", max_batch_size=4).batch_completion(PROMPTS, max_tokens=6)
    mp_pool = wbc.load(llama3_dir, replicas=2, device="cpu", model_parallel_size=2, max_batch_size=4, threads=1)
    try:
        _same(mp_pool.batch_completion(PROMPTS, max_tokens=6), reference)
        pids = mp_pool.pids()
        assert len(pids) >= 2 * 3 and all(_alive(p) for p in pids)  # two actors, each with its two rank workers
    finally:
        mp_pool.shutdown()
    assert not [p for p in pids if _alive(p)]
    assert ray.is_initialized() and pool.live == 2


def test_shutdown_leaves_no_actor_or_process_and_stops_its_ray(pool):
    pids = pool.pids()
    handles = [s.handle for s in pool.fleet.slots]
    assert pids and all(_alive(p) for p in pids)
    for handle in handles:
        assert ray.get(handle.where.remote())["pid"] in pids
    pool.shutdown()
    assert not [p for p in pids if _alive(p)]
    assert not ray.is_initialized()  # the pool started that Ray, so the pool stopped it
    assert "shut down" in repr(pool)
    with pytest.raises(wb.WorkbenchError, match="shut down"):
        pool.batch_completion(PROMPTS, max_tokens=2)


# ------------------------------------------------------------------------------------------ two nodes
def _start_cluster() -> Cluster:
    with loopback():  # Ray binds to 127.0.0.1 instead of the machine's outward address
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        try:
            c.add_node(num_cpus=1)
            ray.init(address=c.address)
        except BaseException:
            c.shutdown()
            raise
    return c


@pytest.mark.slow
def test_a_two_node_cluster_runs_a_replica_on_each_node():
    """``ray.cluster_utils.Cluster``: two nodes of one CPU on this machine, one replica each, rows as one engine's."""
    assert not ray.is_initialized()
    for attempt in range(3):  # Ray gives a node 30 s to register; a machine loaded by other work can miss that
        try:
            cluster = _start_cluster()
            break
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
    try:
        two = wbc.load(address=cluster.address, replicas=2, device="cpu", threads=1)
        try:
            assert len({r["node_id"] for r in two.replicas}) == 2
            assert "replicas=2 (2/2 live) on 2 node(s)" in repr(two)
            _same(
                two.batch_chat_completion(DIALOGS, TOOLS, max_tokens=16),
                wb.load(device="cpu").batch_chat_completion(DIALOGS, TOOLS, max_tokens=16),
            )
            pids = two.pids()
        finally:
            two.shutdown()
        assert not [p for p in pids if _alive(p)]
        assert ray.is_initialized()  # joined, not started: the cluster is left to its owner
    finally:
        ray.shutdown()
        cluster.shutdown()
