"""The engine's running batch (issue 48): what a request that joins it, mixed sampling and per-dialog tool loops cost.

Workloads (each prints a table and one JSON line):

- ``join``: while 8 rows generate 256 tokens each (one ``batch_completion`` in a thread), a 1-row request for 8
  tokens is sent from another thread 1 s later; its latency against the same request alone.
- ``mixed``: 16 threads, each one ``completion`` of 64 tokens, with 16 different temperatures and seeds, against
  16 threads with identical greedy settings: wall times (the rows share the engine's steps either way).
- ``tools``: the demo model, 16 weather dialogs whose tool sleeps 1.5 s for half of them (0 s for the others):
  the per-dialog loop (``run_batch``), the turn-synchronous loop (``run_turns``) and the per-dialog loop with
  no sleeping at all.

Usage: ``OMP_NUM_THREADS=1 python bench/loop.py [--workloads join,mixed,tools] [--repeats 2]``.  Wall times on a
shared machine move with its load: the ratios of contenders measured alternately in one run are what to read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch
from common import make_prompts, small_llama3_dir

import workbench as wb
from workbench.generation import SamplingParams
from workbench.session import build_engine, resolve_settings


def _threads(targets) -> float:
    threads = [threading.Thread(target=t) for t in targets]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def join(engine, repeats: int) -> dict:
    prompts = make_prompts(8)
    long = SamplingParams.create(max_tokens=256, ignore_stop_tokens=True)
    short = "Write about llamas."
    alone, joined, batch = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.completion(short, max_tokens=8)
        alone.append(time.perf_counter() - start)
        done = {}

        def run_batch(done=done):
            start = time.perf_counter()
            engine.batch_completion(prompts, sampling=long)
            done["batch"] = time.perf_counter() - start

        worker = threading.Thread(target=run_batch)
        worker.start()
        time.sleep(1.0)
        start = time.perf_counter()
        engine.completion(short, max_tokens=8)
        joined.append(time.perf_counter() - start)
        worker.join()
        batch.append(done["batch"])
    out = {
        "alone_s": statistics.median(alone),
        "joined_s": statistics.median(joined),
        "batch_s": statistics.median(batch),
    }
    out["ratio"] = out["joined_s"] / out["alone_s"]
    print(
        f"join: alone {out['alone_s']:.3f} s, sent 1 s into the 8x256 batch {out['joined_s']:.3f} s "
        f"({out['ratio']:.2f}x); the batch took {out['batch_s']:.2f} s"
    )
    return out


def mixed(engine, repeats: int) -> dict:
    prompts = make_prompts(16)
    greedy, sampled, no_top_p = [], [], []

    def samplings(top_p: float) -> list:
        return [
            lambda p=p, i=i: engine.completion(p, max_tokens=64, temperature=0.2 + 0.05 * i, top_p=top_p, seed=i)
            for i, p in enumerate(prompts)
        ]

    for _ in range(repeats):
        greedy.append(_threads([lambda p=p: engine.completion(p, max_tokens=64) for p in prompts]))
        sampled.append(_threads(samplings(0.95)))
        no_top_p.append(_threads(samplings(1.0)))
    out = {
        "greedy_s": statistics.median(greedy),
        "mixed_s": statistics.median(sampled),
        "mixed_top_p_1_s": statistics.median(no_top_p),
    }
    out["ratio"] = out["mixed_s"] / out["greedy_s"]
    out["ratio_top_p_1"] = out["mixed_top_p_1_s"] / out["greedy_s"]
    print(f"mixed: 16 threads greedy {out['greedy_s']:.2f} s, 16 samplings (top_p 0.95) {out['mixed_s']:.2f} s")
    print(f"  ({out['ratio']:.2f}x); without top-p {out['mixed_top_p_1_s']:.2f} s ({out['ratio_top_p_1']:.2f}x)")
    return out


def tools_loop(repeats: int) -> dict:
    engine = wb.load()
    cities = ["Paris", "Oslo"] * 8
    dialogs = [[{"role": "user", "content": f"What's the weather in {c}?"}] for c in cities]

    def weather(pause: float):
        def get_weather(city: str) -> str:
            """Current weather for a city.

            Args:
                city: The city's name.
            """
            if city == "Paris":
                time.sleep(pause)
            return f"{len(city) + 10} C and sunny"

        return get_weather

    times: dict[str, list[float]] = {"per_dialog": [], "turn_synchronous": [], "no_sleep": []}
    for _ in range(repeats):
        for name, run, pause in (
            ("no_sleep", wb.tools.run_batch, 0.0),
            ("per_dialog", wb.tools.run_batch, 1.5),
            ("turn_synchronous", wb.tools.run_turns, 1.5),
        ):
            start = time.perf_counter()
            run(engine, dialogs, [weather(pause)], max_tokens=48, progress=False)
            times[name].append(time.perf_counter() - start)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["extra_s"] = out["per_dialog"] - out["no_sleep"]
    print(
        f"tools: 16 dialogs, 8 with a 1.5 s tool: per-dialog {out['per_dialog']:.2f} s, turn-synchronous "
        f"{out['turn_synchronous']:.2f} s, no sleep {out['no_sleep']:.2f} s (per-dialog costs {out['extra_s']:.2f} s "
        "more than no sleep)"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default="join,mixed,tools")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    chosen = args.workloads.split(",")
    result = {"threads": torch.get_num_threads()}
    if "join" in chosen or "mixed" in chosen:
        engine = build_engine(resolve_settings(small_llama3_dir(), max_batch_size=16, max_seq_len=512))
        if "join" in chosen:
            result["join"] = join(engine, args.repeats)
        if "mixed" in chosen:
            result["mixed"] = mixed(engine, args.repeats)
        engine.close()
    if "tools" in chosen:
        result["tools"] = tools_loop(args.repeats)
    print(json.dumps({"bench": "loop", **result}))


if __name__ == "__main__":
    main()
