"""BFCL multi-turn: entries per minute with every entry in flight vs one entry at a time; the ground-truth replay.

1. ``replay``: all 800 entries of the four multi-turn categories answered by
   ``bfcl.GroundTruthEngine`` (no model: the harness, BFCL's backends and BFCL's checker alone), wall seconds.
2. ``demo``: the first ``--entries`` entries of ``multi_turn_base`` on the demo model (``max_seq_len`` 8192,
   ``--max-tokens`` per reply, greedy), two contenders alternating ``--rounds`` times in one process:
   ``concurrent`` (``bfcl.run``: every step one batched engine call over all running entries) and
   ``one_at_a_time`` (the same run with each engine call split into one call per dialog, as BFCL's own runner
   drives a server one entry at a time).  Both give the same rows (checked).  Wall time; the ratio is the number
   to read on a loaded machine.

    OMP_NUM_THREADS=1 python bench/bfcl_multi_turn.py [--entries 4] [--max-tokens 16] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import workbench as wb
from workbench.evals import bfcl


class OneAtATime:
    """The engine's chat route, one dialog per call (per-dialog tools, choices and items split out)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def batch_chat_completion(self, dialogs: list[Any], tools: Any = None, tool_choice: Any = "auto", **kw: Any):
        per_dialog = isinstance(tools, list) and tools and isinstance(tools[0], (list, tuple))
        out = []
        for k, dialog in enumerate(dialogs):
            one = dict(kw)
            if isinstance(kw.get("item"), list):
                one["item"] = [kw["item"][k]]
            choice = tool_choice[k] if isinstance(tool_choice, list) else tool_choice
            out += self.engine.batch_chat_completion(
                [dialog], tools=tools[k] if per_dialog else tools, tool_choice=choice, **one
            )
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    started = time.perf_counter()
    replay = bfcl.run(bfcl.GroundTruthEngine(bfcl.MULTI_TURN_CATEGORIES), bfcl.MULTI_TURN_CATEGORIES, progress=False)
    replay_s = time.perf_counter() - started
    assert len(replay) == 800 and replay["valid"].all()
    print(f"ground-truth replay: {len(replay)} entries scored in {replay_s:.1f} s")

    engine = wb.load(max_seq_len=8192)
    times: dict[str, list[float]] = {"concurrent": [], "one_at_a_time": []}
    rows: dict[str, Any] = {}
    for _ in range(args.rounds):
        for name, target in (("one_at_a_time", OneAtATime(engine)), ("concurrent", engine)):
            t = time.perf_counter()
            res = bfcl.run(target, ["multi_turn_base"], limit=args.entries, max_tokens=args.max_tokens, progress=False)
            times[name].append(time.perf_counter() - t)
            rows[name] = res[["id", "valid", "error", "steps"]].to_dict(orient="records")
    assert rows["concurrent"] == rows["one_at_a_time"], "the two contenders gave different rows"
    per_min = {k: args.entries * 60 / min(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:14s} best {min(v):6.1f} s  {per_min[k]:6.2f} entries/min")
    print(
        json.dumps(
            {
                "bench": "bfcl_multi_turn",
                "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
                "replay_entries": len(replay),
                "replay_s": round(replay_s, 1),
                "demo_entries": args.entries,
                "max_tokens": args.max_tokens,
                "steps": int(sum(r["steps"] for r in rows["concurrent"])),
                "seconds": {k: [round(x, 1) for x in v] for k, v in times.items()},
                "entries_per_min": {k: round(v, 2) for k, v in per_min.items()},
                "speedup": round(per_min["concurrent"] / per_min["one_at_a_time"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
