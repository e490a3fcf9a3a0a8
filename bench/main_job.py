"""Why the main job's batch of tool dialogs is only a few times faster than the same dialogs one at a time.

``python -m workbench`` runs 6 tool dialogs through the tool loop batched, then one at a time, and prints the
ratio.  This script runs the same dialogs and settings on the same engine and counts what bounds that ratio:

* **decode steps** — on the demo model a decode step's cost is the 202k-row output projection, about the same
  for 1 row as for 6 (memory-bound: the matrix is read once per step, see ``bench/roofline.py``), so time goes
  with steps, not tokens.  One at a time, every generated token is a step; batched, the tool loop moves the
  dialogs in lockstep, so a round takes as many steps as its *longest* reply.  The ratio of the two step counts
  is the speed-up batching can give here, whatever the engine does.
* **the timing itself** — the main job timed a cold batched run (the first calls after loading: first
  allocations, the shared tool prompt not yet in the prefix cache) against a warm one-at-a-time run, once each,
  not alternated: the ratio came out low, and on a loaded machine it moved with the load.

Prints the per-round reply lengths, both step counts, the bound, the ratio as the main job measured it (cold,
once) and as measured here (warm, ``--rounds`` alternating rounds, medians), and one JSON line.

    OMP_NUM_THREADS=1 python bench/main_job.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

import workbench as wb
from workbench import tools
from workbench.__main__ import DEMO_TOOLS, QUESTIONS


class Counting:
    """The engine's chat calls, counted: the reply lengths (generated tokens) of every call, per call."""

    def __init__(self, engine: wb.Engine) -> None:
        self.engine, self.calls = engine, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def batch_chat_completion(self, dialogs: Any, *args: Any, **kwargs: Any) -> Any:
        replies = self.engine.batch_chat_completion(dialogs, *args, **kwargs)
        self.calls.append([len(r.tokens) + 1 for r in replies])  # + the stop token: a step too
        return replies

    def chat_completion(self, dialog: Any, *args: Any, **kwargs: Any) -> Any:
        reply = self.engine.chat_completion(dialog, *args, **kwargs)
        self.calls.append([len(reply.tokens) + 1])
        return reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    engine = wb.load(None)
    dialogs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    settings = dict(max_turns=3, max_tokens=args.max_tokens, temperature=0.0, progress=False)

    def batched() -> float:
        start = time.perf_counter()
        tools.run_batch(engine, dialogs, DEMO_TOOLS, **settings)
        return time.perf_counter() - start

    def one_at_a_time() -> float:
        start = time.perf_counter()
        for dialog in dialogs:
            tools.run(engine, dialog, DEMO_TOOLS, **settings)
        return time.perf_counter() - start

    cold = {"batched_s": batched()}  # as the main job: the first call after loading, then one at a time, once
    cold["one_at_a_time_s"] = one_at_a_time()
    counted = Counting(engine)
    tools.run_batch(counted, dialogs, DEMO_TOOLS, **settings)
    rounds = counted.calls
    counted.calls = []
    for dialog in dialogs:
        tools.run(counted, dialog, DEMO_TOOLS, **settings)
    single_steps = sum(sum(call) for call in counted.calls)
    batched_steps = sum(max(call) for call in rounds)
    times: dict[str, list[float]] = {"one_at_a_time_s": [], "batched_s": []}
    for _ in range(args.rounds):  # alternating, warm
        times["one_at_a_time_s"].append(one_at_a_time())
        times["batched_s"].append(batched())
    warm = {k: statistics.median(v) for k, v in times.items()}
    ratios = [s / b for s, b in zip(times["one_at_a_time_s"], times["batched_s"])]  # each round's own ratio
    print(f"threads: {torch.get_num_threads()}; {len(dialogs)} dialogs, {len(rounds)} rounds of the tool loop")
    for number, call in enumerate(rounds, 1):
        print(f"  round {number}: {len(call)} replies of {call} steps -> {max(call)} batched steps")
    print(
        f"decode steps: one at a time {single_steps}, batched {batched_steps}: "
        f"bound {single_steps / batched_steps:.2f}x"
    )
    print(
        f"as the main job timed it (cold batch, once each): {cold['one_at_a_time_s'] / cold['batched_s']:.2f}x "
        f"({cold['one_at_a_time_s']:.2f} s / {cold['batched_s']:.2f} s)"
    )
    print(
        f"warm, {args.rounds} alternating rounds: median of the rounds' ratios {statistics.median(ratios):.2f}x "
        f"(median times {warm['one_at_a_time_s']:.2f} s / {warm['batched_s']:.2f} s; per round "
        + ", ".join(f"{r:.2f}x" for r in ratios)
        + ")"
    )
    summary = {
        "threads": torch.get_num_threads(),
        "dialogs": len(dialogs),
        "round_steps": rounds,
        "steps_one_at_a_time": single_steps,
        "steps_batched": batched_steps,
        "step_bound": round(single_steps / batched_steps, 2),
        "cold_speedup": round(cold["one_at_a_time_s"] / cold["batched_s"], 2),
        "warm_speedup": round(statistics.median(ratios), 2),
        "warm_speedups": [round(r, 2) for r in ratios],
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
