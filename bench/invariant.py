"""The batch-invariant mode's cost: ``bench/peers.py``'s workloads on the default engine and on the
``batch_invariant=True`` engine of the same weights, alternating (every repeat runs each once; medians).

Both engines are resident at once (``build_engine``, not the ``wb.load`` singleton), float32 on CPU, greedy, stop
tokens ignored (every row prefills its prompt and generates exactly ``max_tokens``), every run cold (no resident
prefixes).  Reports seconds, tokens/s, the invariant mode's slowdown (``cost`` = invariant / default seconds - 1)
and how many rows' tokens agree between the modes, then one JSON line.

    OMP_NUM_THREADS=1 python bench/invariant.py [--models llama3-d256,llama4-moe16] [--workloads a16,b,c]
                                                [--prompts 64] [--repeats 3]

Times are CPU seconds of the benchmark thread (``common.clock``); ratios measured side by side hold on a busy
machine, absolute numbers do not.
"""

from __future__ import annotations

import argparse
import gc
import json
import os

import torch
from common import PEER_MODELS, peer_model_dir
from peers import MAX_SEQ_LEN, measure, workbench_runner, workload_a, workload_b, workload_c

from workbench.config import resolve_settings
from workbench.session import build_engine

BATCH = {"a16": 16, "a64": 64, "b": 1, "c": 16}
MAX_TOKENS = {"b": 128, "c": 32}


def bench_model(name: str, workloads: list[str], repeats: int, n_prompts: int) -> dict:
    ckpt = peer_model_dir(name)
    results = {}
    for work in workloads:
        batch = BATCH[work]
        engines = {
            mode: build_engine(
                resolve_settings(
                    ckpt, max_batch_size=batch, max_seq_len=MAX_SEQ_LEN, batch_invariant=mode == "invariant"
                )
            )
            for mode in ("default", "invariant")
        }
        try:
            if work == "c":
                prompts = workload_c(engines["default"], n_prompts)
            else:
                prompts = workload_b() if work == "b" else workload_a(n_prompts)
            max_tokens = MAX_TOKENS.get(work, 64)
            runs = {mode: (workbench_runner(engine), prompts) for mode, engine in engines.items()}
            for run, _ in runs.values():  # warm-up: first calls allocate and pick kernels
                run(prompts[:2] if batch > 1 else prompts, 2)
            res = measure(runs, max_tokens, repeats)
            res["cost"] = res["invariant"]["seconds"] / res["default"]["seconds"] - 1
            results[work] = res
            print(
                f"{name} {work} (batch {batch}, {len(prompts)} prompts, {max_tokens} new): default "
                f"{res['default']['seconds']:.2f} s, invariant {res['invariant']['seconds']:.2f} s, "
                f"cost {100 * res['cost']:+.1f} %, rows equal {res['invariant']['rows_equal_default']}",
                flush=True,
            )
        finally:
            for engine in engines.values():
                engine.close()
            gc.collect()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama3-d256,llama4-moe16")
    parser.add_argument("--workloads", default="a16,b,c")
    parser.add_argument("--prompts", type=int, default=64, help="prompts of workloads a and c (64 in peers.py)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    out = {
        "bench": "invariant",
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "prompts": args.prompts,
        "repeats": args.repeats,
        "models": {},
    }
    for name in args.models.split(","):
        assert name in PEER_MODELS, f"unknown model {name}; one of {sorted(PEER_MODELS)}"
        out["models"][name] = bench_model(name, args.workloads.split(","), args.repeats, args.prompts)
    print(json.dumps(out, default=lambda v: round(v, 4) if isinstance(v, float) else str(v)))


if __name__ == "__main__":
    main()
