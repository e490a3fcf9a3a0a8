"""Replica pool overhead and scaling: a pool of 1 and of 2 replicas against the in-process engine.

One run, one batch, side by side: the in-process engine (``wb.load``), then ``workbench.cluster.load(replicas=1)``
and ``replicas=2`` on a local Ray (127.0.0.1), every engine with one torch thread per rank.  Reports
tokens/s of each, the pool-of-1 / engine ratio (the pool's overhead: Ray calls, pickling, chunking), the
2-replica speed-up (against one replica, and against the in-process engine using every core: the fair rival
of N single-thread replicas), and the per-row dispatch overhead (a batch of one-token rows: pool minus engine time,
per row, in ms).  Rows must equal the engine's (checked: ``rows_identical``).  Wall clock (the replicas are
other processes, so CPU time of this thread would not see their work).  On a 2-core machine two
single-thread replicas can only use the two cores one engine with two threads would use (and share them with
Ray's own processes): no real gain is expected there, and the numbers say so;
on a machine with free cores (or GPUs) replicas × tokens/s is what to look at.

    python bench/cluster.py [--checkpoint DIR] [--prompts 48] [--max-tokens 24] [--replicas 2]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import workbench as wb
import workbench.cluster as wbc

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, loopback-only Ray


def prompts_for(n: int) -> list[str]:
    topics = ["llamas", "the weather in Paris", "prime numbers", "jazz", "volcanoes", "the moon", "tea", "maps"]
    return [f"Tell me about {topics[i % len(topics)]}. " * (1 + i % 4) for i in range(n)]


def timed(fn, repeats: int) -> tuple[float, list]:
    """Best wall time of ``repeats`` runs (the machine is shared: the best run is the least disturbed)."""
    best, rows = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        rows = fn()
        best = min(best, time.perf_counter() - start)
    return best, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="default: the embedded demo model")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    prompts = prompts_for(args.prompts)
    tiny = [p[:12] for p in prompts] * 2  # one-token rows: what the pool adds per row
    kw = {"max_tokens": args.max_tokens, "temperature": 0.7, "top_p": 0.9, "seed": 0, "progress": False}

    engine = wb.load(args.checkpoint, device=args.device, max_batch_size=16)
    engine.batch_completion(prompts[:4], max_tokens=2, progress=False)  # warm-up
    eng_s, ref = timed(lambda: engine.batch_completion(prompts, **kw), args.repeats)
    tokens = sum(len(r.tokens) for r in ref)
    eng_tiny_s, _ = timed(lambda: engine.batch_completion(tiny, max_tokens=1, progress=False), args.repeats)
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)  # the fair rival of N single-thread replicas: one engine using every core
    eng_all_s, _ = timed(lambda: engine.batch_completion(prompts, **kw), args.repeats)
    torch.set_num_threads(1)

    wbc.connect(num_cpus=max(2, args.replicas), include_dashboard=False)
    results: dict[str, dict] = {
        "engine": {"seconds": eng_s, "tok_s": tokens / eng_s},
        f"engine_{cores}_threads": {"seconds": eng_all_s, "tok_s": tokens / eng_all_s},
    }
    try:
        for n in sorted({1, args.replicas}):
            pool = wbc.load(
                args.checkpoint, replicas=n, device=args.device, max_batch_size=16, threads=1, cpus_per_replica=1
            )
            try:
                pool.batch_completion(prompts[:4], max_tokens=2, progress=False)  # warm-up every replica's call path
                pool_s, rows = timed(lambda p=pool: p.batch_completion(prompts, **kw), args.repeats)
                tiny_s, _ = timed(lambda p=pool: p.batch_completion(tiny, max_tokens=1, progress=False), args.repeats)
            finally:
                pool.shutdown()
            results[f"pool_{n}"] = {
                "seconds": pool_s,
                "tok_s": tokens / pool_s,
                "vs_engine": eng_s / pool_s,
                "rows_identical": [r.tokens for r in rows] == [r.tokens for r in ref],
                "dispatch_ms_per_row": 1000 * (tiny_s - eng_tiny_s) / len(tiny),
            }
    finally:
        wbc.disconnect()
    one, many = results["pool_1"], results.get(f"pool_{args.replicas}", results["pool_1"])
    load = os.getloadavg()[0]
    print(
        f"{args.prompts} prompts x {args.max_tokens} tokens ({tokens} generated), {os.cpu_count()} cores, "
        f"1 torch thread per engine, load average {load:.1f}"
    )
    for name, r in results.items():
        extra = (
            f"  x{r['vs_engine']:.2f} of the engine, {r['dispatch_ms_per_row']:.2f} ms/row dispatch"
            if "vs_engine" in r
            else ""
        )
        print(f"  {name:>8}: {r['tok_s']:8.1f} tok/s ({r['seconds']:.2f} s){extra}")
    rival = results[f"engine_{cores}_threads"]["tok_s"]
    print(
        f"pool of 1: x{one['vs_engine']:.2f} of the in-process engine (its overhead); {args.replicas} replicas: "
        f"x{many['tok_s'] / one['tok_s']:.2f} of one replica, x{many['tok_s'] / rival:.2f} of one engine on all "
        f"{cores} cores"
        + (" (on 2 cores the replicas only trade intra-op threads for processes: no real gain)" if cores <= 2 else "")
    )
    print(
        json.dumps(
            {
                "bench": "cluster",
                "prompts": args.prompts,
                "max_tokens": args.max_tokens,
                "cores": os.cpu_count(),
                "threads_per_engine": 1,
                "load_average": round(load, 1),
                "results": {
                    k: {m: round(v, 3) if isinstance(v, float) else v for m, v in r.items()} for k, r in results.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
