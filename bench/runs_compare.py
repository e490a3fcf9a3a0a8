"""Scoring, comparing and summarizing two stored runs of 10,000 rows each (issue 41: under 2 s together).

Two synthetic runs are written straight through ``Run.put_many`` (chat rows: a system prompt that differs
between the runs, 10,000 user questions, short replies; a tenth of the replies differ between the runs, some
with a tool call), then timed, each step on the same store file, one Python thread:

* ``score``: ``wb.runs.score`` of both runs (a pass/fail and a numeric score per row: read, apply, store);
* ``compare``: ``wb.runs.compare(a, b)`` by item (with the settings that differ);
* ``summary``: ``wb.runs.summary([a, b])`` (Wilson and t intervals, McNemar's exact test, a 2,000-pattern
  sign-flip test);
* contender ``by_request``: ``wb.runs.compare(a, b, by="request")``, the pairing of earlier versions, which
  decodes every row into result objects (``Store.rows``) — the ratio says what reading the stored JSON
  directly (``workbench.runs.outline``) saves.

Each step is timed in wall seconds (``time.perf_counter``) and in CPU seconds of this process
(``time.process_time``: robust to a shared machine's preemption, which inflates wall time). ``cold`` is the
first repeat (every run read from the file), ``warm`` the best later one (the runs' rows come from the
in-process outline cache, as when a notebook scores, compares and summarizes the same runs).  pandas and the
comparing modules are imported before any timing (a notebook has them loaded).

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/runs_compare.py [--rows 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench import runs
from workbench.runs import pairing, significance  # noqa: F401  (loaded before timing, as a notebook has pandas)
from workbench.types import ChatCompletion, Message, ToolCall

LOAD = runs.load_fields({"dtype": "bfloat16", "quantization": None, "model_parallel_size": 1, "device": "cpu"})
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 32, "stop": [], "logprobs": 0, "seed": None}


def build(store: runs.Store, name: str, system: str, rows: int, variant: int) -> None:
    """A run of ``rows`` chat rows; ``variant`` changes every tenth reply (and its tokens)."""
    run = store.open_run(name, runs.Provenance(identity="sha256:bench", load=LOAD, model="bench"))
    requests, records = [], []
    for i in range(rows):
        requests.append(runs.RowRequest([1, variant, i % 50_000, 7], GREEDY, "chat"))
    keys = run.keys(requests)
    for i in range(rows):
        changed = variant and i % 10 == 0
        text = f"the answer is {i % 17 + (1 if changed else 0)}"
        calls = [ToolCall(call_id=f"c{i}", tool_name="lookup", arguments={"q": i})] if i % 5 == 0 else []
        reply = ChatCompletion(
            message=Message(role="assistant", content=text, tool_calls=calls),
            tokens=[400 + (i % 17), 500 + int(changed), 128009],
            stop_reason="end_of_turn",
        )
        records.append(
            {
                "key": keys[i],
                "prompt_ids": requests[i].prompt_ids,
                "output": reply,
                "sampling": GREEDY,
                "request": {
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"question {i}: what is {i} mod 17?"},
                    ]
                },
            }
        )
    for start in range(0, rows, 2000):
        run.put_many(records[start : start + 2000])


def judge(row: dict) -> dict:
    return {
        "correct": row["output"].endswith(str(int(row["item"].split()[1].rstrip(":")) % 17)),
        "length": len(row["output"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wb-runs-compare-"))
    store = runs.store(folder / "runs.sqlite")
    build(store, "a", "You are terse.", args.rows, 0)
    build(store, "b", "You are helpful and precise.", args.rows, 1)
    rounds: list[dict[str, float]] = []
    for _ in range(args.repeats):
        times: dict[str, float] = {}

        def timed(step: str, work: Callable[[], Any], times: dict[str, float] = times) -> Any:
            wall, cpu = time.perf_counter(), time.process_time()
            result = work()
            times[f"{step}_s"] = time.perf_counter() - wall
            times[f"{step}_cpu_s"] = time.process_time() - cpu
            return result

        timed("score", lambda: [runs.score(name, judge, store=store) for name in ("a", "b")])
        frame = timed("compare", lambda: runs.compare("a", "b", store=store))
        table = timed("summary", lambda: runs.summary(["a", "b"], store=store))
        timed("by_request", lambda: runs.compare("a", "b", by="request", store=store))
        for unit in ("s", "cpu_s"):
            times[f"total_{unit}"] = sum(times[f"{step}_{unit}"] for step in ("score", "compare", "summary"))
        rounds.append(times)
    cold = rounds[0]
    warm = {k: min(r[k] for r in rounds[1:]) for k in cold} if len(rounds) > 1 else cold
    counts = frame.attrs["counts"]
    print(f"{'step':<11} {'cold wall':>10} {'cold cpu':>9} {'warm wall':>10} {'warm cpu':>9}")
    for step in ("score", "compare", "summary", "total", "by_request"):
        print(
            f"{step:<11} {cold[step + '_s']:10.3f} {cold[step + '_cpu_s']:9.3f} {warm[step + '_s']:10.3f} "
            f"{warm[step + '_cpu_s']:9.3f}"
        )
    print(
        f"items in both {counts['both']}, differ {counts['differ']}, regressed {counts['regressed']}, improved "
        f"{counts['improved']}; settings that differ: {sorted(frame.attrs['settings'])}"
    )
    print(
        table[["run", "score", "n", "mean", "low", "high", "diff", "diff_low", "diff_high", "p_value"]].to_string(
            index=False
        )
    )
    print(
        f"score+compare+summary (target < 2 s): cold {cold['total_s']:.3f} s wall / {cold['total_cpu_s']:.3f} s "
        f"CPU, warm {warm['total_s']:.3f} s / {warm['total_cpu_s']:.3f} s; compare by='request' (decodes every row) "
        f"/ by item, CPU: cold {cold['by_request_cpu_s'] / cold['compare_cpu_s']:.2f}x, warm "
        f"{warm['by_request_cpu_s'] / warm['compare_cpu_s']:.2f}x"
    )
    print(
        json.dumps(
            {
                "bench": "runs-compare",
                "threads": 1,
                "rows": args.rows,
                "repeats": args.repeats,
                "load_average_1m": round(os.getloadavg()[0], 2),
                **{f"cold_{k}": round(v, 4) for k, v in cold.items()},
                **{f"warm_{k}": round(v, 4) for k, v in warm.items()},
                "under_2s_cold_cpu": cold["total_cpu_s"] < 2.0,
                "store_bytes": store.size_bytes(),
            }
        )
    )


if __name__ == "__main__":
    main()
