"""workbench vs its peers on the same weights: Meta's reference generator and transformers ``generate``.

Contenders run side by side in one process, interleaved (every repeat runs each contender once, the
median is reported), with the same threads, float32 on CPU, the same weights, greedy, and stop tokens
ignored so that every contender prefills every prompt and generates exactly ``max_tokens`` tokens:

- ``workbench``: ``Engine.batch_completion`` with ``max_batch_size`` = the workload's batch (all
  prompts in one call: continuous batching, shared-prefix reuse on; every run starts with no resident
  prefixes, so repeats do not reuse earlier runs' keys/values);
- ``transformers``: ``LlamaForCausalLM.generate`` on the converted weights (Llama 3 only), prompts in
  batches of the workload's size, left padding, its default attention;
- ``reference``: Meta's generator from ``llama-models`` 0.3.0 (see ``contenders.py``), prompts in
  batches; it prefills token by token from the shortest prompt, so it runs the first
  ``--ref-prompts`` prompts of a workload only (tokens/s is a rate, comparable across counts).

Workloads: (a) 64 prompts, lengths spread evenly over 8..512 in shuffled order, 64 new tokens, batch
16 and batch 64; (b) one 32-token prompt, 128 new tokens; (c) 64 tool dialogs sharing one system
prompt with 6 tool definitions, 32 new tokens, batch 16 — plus workbench's prefill time with and
without shared-prefix reuse.  Models: ``bench/common.py:PEER_MODELS``.  Prints a table per model and
one JSON line.

Times are CPU seconds of the benchmark process (``common.clock``; ``BENCH_CLOCK=wall`` for wall time).

    OMP_NUM_THREADS=1 python bench/peers.py [--models llama3-d256,llama3-d1024,llama4-moe16]
                                            [--workloads a16,a64,b,c] [--repeats 3] [--ref-prompts 16]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import threading
from collections.abc import Callable
from functools import partial

import contenders
import torch
from common import PEER_MODELS, clock, median, peer_model_dir

import workbench as wb

MAX_SEQ_LEN = 1024  # (a): 512 + 64 tokens; (c): ~790-token tool dialogs + 32


# --------------------------------------------------------------------------------------------- workloads
def workload_a(n: int = 64) -> list[list[int]]:
    rng = random.Random(0)
    lengths = [8 + (512 - 8) * i // (n - 1) for i in range(n)]
    rng.shuffle(lengths)
    return [[128000] + [rng.randrange(1000, 100000) for _ in range(length - 1)] for length in lengths]


def workload_b() -> list[list[int]]:
    rng = random.Random(1)
    return [[128000] + [rng.randrange(1000, 100000) for _ in range(31)]]


TOOL_TOPICS = ["weather", "stock_price", "flight_status", "currency_rate", "restaurant_search", "calendar_event"]


def six_tools() -> list[dict]:
    """Six OpenAI-style tool definitions (one or two typed parameters each)."""
    tools = []
    for topic in TOOL_TOPICS:
        words = topic.replace("_", " ")
        properties = {"query": {"type": "string", "description": f"What {words} to look up"}}
        if len(tools) % 2:
            properties["city"] = {"type": "string", "description": "City name"}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"get_{topic}",
                    "description": f"Current {words} for a query.",
                    "parameters": {"type": "object", "properties": properties, "required": ["query"]},
                },
            }
        )
    return tools


def workload_c(engine: wb.Engine, n: int = 64) -> list[list[int]]:
    system = {
        "role": "system",
        "content": "You are a helpful travel and finance assistant. Use the tools when they help; answer briefly.",
    }
    cities = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Denver", "Hanoi", "Perth"]
    questions = [
        f"What is the {TOOL_TOPICS[i % 6].replace('_', ' ')} in {cities[i % 8]} for request {i}?" for i in range(n)
    ]
    return [
        engine.formatter.encode_dialog([system, {"role": "user", "content": q}], tools=six_tools()) for q in questions
    ]


# --------------------------------------------------------------------------------------------- measuring
class PeakRSS:
    """Peak resident memory of this process while the block runs (sampled every 5 ms), minus the start."""

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        self.extra = self.peak - self.start


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def batched(run: Callable[[list[list[int]], int], list[list[int]]], batch: int) -> Callable:
    """A contender that takes ``batch`` prompts per call, applied to a whole workload."""

    def go(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        out: list[list[int]] = []
        for i in range(0, len(prompts), batch):
            out += run(prompts[i : i + batch], max_tokens)
        return out

    return go


def workbench_runner(engine: wb.Engine, share: bool = True) -> Callable:
    scheduler = engine._runner.scheduler
    scheduler.stop_tokens = {}  # stop tokens ignored: every row generates exactly max_tokens

    def go(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        scheduler.forget_prefixes()  # cold start every run: nothing resident from an earlier repeat
        scheduler.share_prefixes = share
        try:
            return [c.tokens for c in engine.batch_completion(prompts, max_tokens=max_tokens)]
        finally:
            scheduler.share_prefixes = True

    return go


def measure(
    runs: dict[str, tuple[Callable, list[list[int]]]],
    max_tokens: int,
    repeats: int,
    outputs: dict[str, list[list[int]]] | None = None,
    against: tuple[str, list[list[int]]] | None = None,
) -> dict:
    """Interleaved repeats of every contender; median seconds, tokens/s, peak extra memory, agreement with
    the first contender (or with ``against``: a name and its rows).  ``outputs`` receives every run's rows."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    memory: dict[str, int] = {}
    outputs = {} if outputs is None else outputs
    for _ in range(repeats):
        for name, (run, prompts) in runs.items():
            gc.collect()
            with PeakRSS() as rss:
                start = clock()
                outputs[name] = run(prompts, max_tokens)
                seconds[name].append(clock() - start)
            memory[name] = max(memory.get(name, 0), rss.extra)
    first, first_rows = against or (next(iter(runs)), outputs[next(iter(runs))])
    out = {}
    for name, (_, prompts) in runs.items():
        secs = median(seconds[name])
        n_new = sum(len(t) for t in outputs[name])
        assert n_new == len(prompts) * max_tokens, f"{name} generated {n_new} tokens, not {len(prompts) * max_tokens}"
        same = sum(a == b for a, b in zip(outputs[name], first_rows))
        out[name] = {
            "seconds": secs,
            "tok_s": n_new / secs,
            "prompts": len(prompts),
            "prompt_tokens": sum(len(p) for p in prompts),
            "peak_extra_MB": memory[name] / 2**20,
            f"rows_equal_{first}": f"{same}/{min(len(prompts), len(first_rows))}",
        }
    return out


# --------------------------------------------------------------------------------------------- main
def bench_model(
    name: str,
    workloads: list[str],
    repeats: int,
    ref_prompts: int,
    n_prompts: int = 64,
    peers: tuple[str, ...] = ("transformers", "reference"),
    compiled: bool = False,
) -> dict:
    ckpt = peer_model_dir(name)
    llama4 = PEER_MODELS[name].get("moe_args") is not None
    results: dict[str, dict] = {}
    ref = contenders.reference_model(ckpt, 64, MAX_SEQ_LEN) if "reference" in peers else None
    hf = contenders.hf_llama(ckpt, MAX_SEQ_LEN) if "transformers" in peers and not llama4 else None
    for work in workloads:
        batch = {"a16": 16, "a64": 64, "b": 1, "c": 16}[work]
        engine = wb.load(ckpt, max_batch_size=batch, max_seq_len=MAX_SEQ_LEN)
        if work == "c":
            prompts = workload_c(engine, n_prompts)
        else:
            prompts = workload_b() if work == "b" else workload_a(n_prompts)
        max_tokens = {"b": 128, "c": 32}.get(work, 64)
        runs: dict[str, tuple[Callable, list[list[int]]]] = {"workbench": (workbench_runner(engine), prompts)}
        if work == "c":
            runs["workbench_no_reuse"] = (workbench_runner(engine, share=False), prompts)
        if hf is not None:
            runs["transformers"] = (batched(partial(contenders.hf_generate, hf), batch), prompts)
        if ref is not None and work != "a64":  # token-by-token prefill: batch 64 of long prompts takes too long
            runs["reference"] = (batched(partial(contenders.reference_generate, ref), batch), prompts[:ref_prompts])
        for warm in runs.values():  # warm-up: first calls allocate and pick kernels
            warm[0](prompts[:2] if batch > 1 else prompts, 2)
        rows: dict[str, list[list[int]]] = {}
        res = measure(runs, max_tokens, repeats, outputs=rows)
        if work == "c":  # prefill alone (one new token), shared-prefix reuse on vs off
            pre = measure(
                {
                    "reuse": (workbench_runner(engine), prompts),
                    "no_reuse": (workbench_runner(engine, share=False), prompts),
                },
                1,
                repeats,
            )
            res["prefill"] = {
                "reuse_s": pre["reuse"]["seconds"],
                "no_reuse_s": pre["no_reuse"]["seconds"],
                "speedup": pre["no_reuse"]["seconds"] / pre["reuse"]["seconds"],
                "shared_prefix_tokens": _common_len(prompts),
            }
        if compiled and work != "c":  # the same engine after compile_decode(), measured alone
            _print(name, work, batch, max_tokens, res)  # the eager results first, whatever compiling does
            compile_s = engine.compile_decode()
            run = workbench_runner(engine)
            run(prompts[:2] if batch > 1 else prompts, 2)
            res.update(
                measure(
                    {"workbench_compiled": (run, prompts)},
                    max_tokens,
                    repeats,
                    against=("workbench", rows["workbench"]),
                )
            )
            res["workbench_compiled"]["compile_s"] = compile_s
        for peer in ("transformers", "reference"):
            if peer in res:
                res[f"x_{peer}"] = res["workbench"]["tok_s"] / res[peer]["tok_s"]
        results[work] = res
        _print(name, work, batch, max_tokens, res)
    wb.unload()
    gc.collect()
    return results


def _common_len(prompts: list[list[int]]) -> int:
    n = 0
    while all(len(p) > n and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def _print(model: str, work: str, batch: int, max_tokens: int, res: dict) -> None:
    print(f"\n{model} — workload {work} (batch {batch}, {max_tokens} new tokens)")
    print(f"  {'contender':>20} {'prompts':>7} {'seconds':>8} {'tok/s':>8} {'peak +MB':>9} {'rows equal':>10}")
    for name, r in res.items():
        if isinstance(r, dict) and "tok_s" in r:
            eq = next(v for k, v in r.items() if k.startswith("rows_equal"))
            print(
                f"  {name:>20} {r['prompts']:7d} {r['seconds']:8.2f} {r['tok_s']:8.1f} {r['peak_extra_MB']:9.0f} "
                f"{eq:>10}"
            )
    ratios = {k: round(v, 2) for k, v in res.items() if k.startswith("x_")}
    if ratios:
        print(f"  workbench speed ratios: {ratios}")
    if "workbench_compiled" in res:
        print(f"  compile_decode() took {res['workbench_compiled']['compile_s']:.1f}s")
    if "prefill" in res:
        p = res["prefill"]
        print(
            f"  prefill: {p['no_reuse_s']:.2f}s without reuse, {p['reuse_s']:.2f}s with "
            f"({p['speedup']:.2f}x; {p['shared_prefix_tokens']} shared tokens per prompt)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(PEER_MODELS))
    parser.add_argument("--workloads", default="a16,a64,b,c")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ref-prompts", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=64, help="prompts of workloads a and c (64 in the issue)")
    parser.add_argument("--peers", default="transformers,reference", help="peers to run beside workbench ('' = none)")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="also run workbench after compile_decode() (workloads a and b; compile time reported)",
    )
    args = parser.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, float32, CPU")
    summary = {}
    for name in args.models.split(","):
        summary[name] = bench_model(
            name,
            args.workloads.split(","),
            args.repeats,
            args.ref_prompts,
            args.prompts,
            tuple(p for p in args.peers.split(",") if p),
            args.compiled,
        )
    print(
        json.dumps(
            {
                "bench": "peers",
                "threads": torch.get_num_threads(),
                "repeats": args.repeats,
                "prompts": args.prompts,
                "results": _rounded(summary),
            }
        )
    )


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    main()
