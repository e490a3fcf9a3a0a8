"""Child processes of tests/test_runs_engine.py: engines that write the run store the test process then reads.

    python tests/_runs_engine_child.py slow-batch CKPT RUN   # the killed batch: rows made slow; prints "started"
    python tests/_runs_engine_child.py batch CKPT RUN        # the shared requests, stored under RUN; prints "done"
    python tests/_runs_engine_child.py cases RUN N           # the demo model's eval cases; the N-th tool call kills it

The store is ``$WORKBENCH_STORE`` (the test's).  The requests are defined here, so both processes make the same.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any

from workbench.session import build_engine, resolve_settings

MODEL = "Llama3.2-3B-Instruct"
SLOW_ROWS = 40
SLOW_TOKENS = 16


def engine(checkpoint: str) -> Any:
    return build_engine(resolve_settings(checkpoint, model=MODEL, max_batch_size=2, max_seq_len=256))


def slow_prompts() -> list[str]:
    return [f"Row {i}: the quick brown fox number {i} jumps" for i in range(SLOW_ROWS)]


def shared_prompts() -> list[str]:
    return [f"Shared request {i} from any process" for i in range(6)]


def cases() -> list[Any]:
    """One case, two questions: model steps 1 (a call), 2 (the answer), 3 (a call), 4 (the answer)."""
    from workbench.evals.cases import EvalCase, Turn

    weather = [{"tool_name": "get_weather", "arguments": {"city": "Paris"}}]
    time_in = [{"tool_name": "get_local_time", "arguments": {"city": "Tokyo"}}]
    return [
        EvalCase(
            "two-questions",
            ["get_weather", "get_local_time"],
            [Turn("What's the weather in Paris?", weather), Turn("What time is it in Tokyo?", time_in)],
        )
    ]


def tools(die_at: int | None = None) -> dict[str, Any]:
    """The demo tools; the ``die_at``-th call of any of them ends this process at once (a crash mid-loop)."""
    from workbench.demo.tools import DEMO_TOOLS

    calls = [0]

    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)  # the same name, signature and docstring: the same prompt
        def tool(**kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == die_at:
                sys.stdout.flush()
                os._exit(3)
            return fn(**kwargs)

        return tool

    return {name: wrap(fn) for name, fn in DEMO_TOOLS.items()}


def slow_batch(checkpoint: str, run: str) -> None:
    e = engine(checkpoint)
    runner = e.runner
    step = runner.step

    def slowly(add: Any, cancel: Any) -> Any:  # 10 ms per token event: the batch runs for seconds, rows end one by one
        events = step(add, cancel)
        time.sleep(0.01 * len(events))
        return events

    runner.step = slowly
    print("started", flush=True)
    e.batch_completion(slow_prompts(), max_tokens=SLOW_TOKENS, run=run, progress=False)
    print("finished", flush=True)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "slow-batch":
        slow_batch(args[0], args[1])
    elif mode == "batch":
        engine(args[0]).batch_completion(shared_prompts(), max_tokens=8, run=args[1], progress=False)
        print("done", flush=True)
    elif mode == "cases":
        import workbench as wb
        from workbench import evals

        evals.run_cases(wb.load(), cases(), tools=tools(die_at=int(args[1])), max_tokens=48, run=args[0])
        print("finished", flush=True)
