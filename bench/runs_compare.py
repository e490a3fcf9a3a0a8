"""Scoring, comparing and summarizing two stored runs of 10,000 rows each (issue 41: under 2 s together).

Two synthetic runs are written straight through ``Run.put_many`` (chat rows: a system prompt that differs
between the runs, 10,000 user questions, short replies; a tenth of the replies differ between the runs, some
with a tool call), then timed, each step on the same store file, one Python thread:

* ``score``: ``wb.runs.score`` of both runs (a pass/fail and a numeric score per row: read, apply, store);
* ``compare``: ``wb.runs.compare(a, b)`` by item (with the settings that differ);
* ``summary``: ``wb.runs.summary([a, b])`` (Wilson and t intervals, McNemar's exact test, a 2,000-pattern
  sign-flip test);
* contender ``exact_read``: reading one run back as decoded result objects (``Store.rows``), what browsing read
  before the fast outline reader — the ratio says what reading the stored JSON directly saves.

Wall seconds (``time.perf_counter``), best of ``--repeats``; a shared machine makes single timings noisy.

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/runs_compare.py [--rows 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from workbench import runs
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
        reply = ChatCompletion(message=Message(role="assistant", content=text, tool_calls=calls),
                               tokens=[400 + (i % 17), 500 + int(changed), 128009], stop_reason="end_of_turn")
        records.append({"key": keys[i], "prompt_ids": requests[i].prompt_ids, "output": reply, "sampling": GREEDY,
                        "request": {"messages": [{"role": "system", "content": system},
                                                 {"role": "user", "content": f"question {i}: what is {i} mod 17?"}]}})
    for start in range(0, rows, 2000):
        run.put_many(records[start:start + 2000])


def judge(row: dict) -> dict:
    return {"correct": row["output"].endswith(str(int(row["item"].split()[1].rstrip(":")) % 17)),
            "length": len(row["output"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wb-runs-compare-"))
    store = runs.store(folder / "runs.sqlite")
    build(store, "a", "You are terse.", args.rows, 0)
    build(store, "b", "You are helpful and precise.", args.rows, 1)
    best: dict[str, float] = {}
    for _ in range(args.repeats):
        times = {}
        start = time.perf_counter()
        for name in ("a", "b"):
            runs.score(name, judge, store=store)
        times["score"] = time.perf_counter() - start
        start = time.perf_counter()
        frame = runs.compare("a", "b", store=store)
        times["compare"] = time.perf_counter() - start
        start = time.perf_counter()
        table = runs.summary(["a", "b"], store=store)
        times["summary"] = time.perf_counter() - start
        start = time.perf_counter()
        sum(1 for _ in store.rows("a"))
        times["exact_read"] = time.perf_counter() - start
        times["total"] = times["score"] + times["compare"] + times["summary"]
        best = {k: min(v, best.get(k, v)) for k, v in times.items()}
    counts = frame.attrs["counts"]
    for name, value in best.items():
        print(f"{name:<11} {value:7.3f} s")
    print(f"items in both {counts['both']}, differ {counts['differ']}, regressed {counts['regressed']}, improved "
          f"{counts['improved']}; settings that differ: {sorted(frame.attrs['settings'])}")
    print(table[["run", "score", "n", "mean", "low", "high", "diff", "diff_low", "diff_high", "p_value"]]
          .to_string(index=False))
    print(f"score+compare+summary: {best['total']:.3f} s (target < 2 s); one exact read of a run / one outline "
          f"compare of two: {best['exact_read'] / best['compare']:.2f}x")
    print(json.dumps({"bench": "runs-compare", "threads": 1, "rows": args.rows, "repeats": args.repeats,
                      **{f"{k}_s": round(v, 4) for k, v in best.items()},
                      "under_2s": best["total"] < 2.0, "store_bytes": store.size_bytes()}))


if __name__ == "__main__":
    main()
