"""Two stored runs of one experiment, written straight into a run store (no model): the same tool questions
under two system prompts, each reply a chat row, scored by ``wb.runs.score``.  Shared by the viewer, report
and command-line tests.

Item ``question i`` is answered with a ``get_weather`` call in both runs, except: ``i % 7 == 3`` calls
``get_time`` under prompt B (a regression of ``right_tool``), ``i % 13 == 4`` calls ``get_time`` under prompt A
and ``get_weather`` under B (an improvement), ``i % 11 == 5`` words the reply differently under B (changed, the
score the same).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench import runs
from workbench.types import ChatCompletion, Message, ToolCall

LOAD = runs.load_fields({"dtype": "bfloat16", "quantization": None, "model_parallel_size": 1, "device": "cpu"})
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 16, "stop": [], "logprobs": 0, "seed": None}
SYSTEMS = {"prompt-a": "You call tools.", "prompt-b": "You are terse and call tools."}
CITIES = ["Paris", "Oslo", "Tokyo", "Lima", "Cairo"]
N_DEFAULT = 40


def tool_of(name: str, i: int) -> str:
    if name == "prompt-b" and i % 7 == 3:
        return "get_time"  # regressed
    if name == "prompt-a" and i % 13 == 4:
        return "get_time"  # improved under B
    return "get_weather"


def reply(name: str, i: int) -> ChatCompletion:
    city = CITIES[i % len(CITIES)]
    reworded = name == "prompt-b" and i % 11 == 5
    text = f"Looking up {city}." if reworded else f"Checking {city} now."
    call = ToolCall(tool_of(name, i), {"city": city}, f"call-{i}")
    tokens = [i % 50, 8 if reworded or call.tool_name == "get_time" else 7]  # the same reply: the same tokens
    return ChatCompletion(Message("assistant", text, [call]), tokens, "end_of_message", prompt_tokens=4)


def right_tool(row: dict[str, Any]) -> dict[str, Any]:
    """The score: did the reply call get_weather (pass/fail)."""
    return {"right_tool": "get_weather" in str(row["tool_calls"])}


def write_runs(
    store_file: Path,
    n_items: int = 40,
    names: tuple[str, ...] = ("prompt-a", "prompt-b"),
    first: int = 0,
    scored: bool = True,
) -> Path:
    """Runs ``names`` of ``n_items`` items each in ``store_file``, scored unless ``scored=False``; returns the
    file.  ``first`` > 0 writes items ``first...`` under the run name ``other-items`` instead (no item in common
    with the others)."""
    store = runs.store(store_file)
    for name in names:
        stored_as = "other-items" if first else name
        run = store.open_run(
            stored_as,
            runs.Provenance(identity="sha256:test", load=LOAD, model="tiny", checkpoint="/ckpt/tiny", device="cpu"),
        )
        rows = []
        for i in range(first, first + n_items):
            messages = [{"role": "system", "content": SYSTEMS[name]}, {"role": "user", "content": f"question {i}"}]
            prompt_ids = [1, 2 if name == "prompt-a" else 3, 100 + i]
            key = run.key(prompt_ids, GREEDY, kind="chat")
            rows.append(
                {
                    "key": key,
                    "request": {"messages": messages},
                    "prompt_ids": prompt_ids,
                    "output": reply(name, i),
                    "sampling": GREEDY,
                    "timings": {"seconds": 0.1},
                }
            )
        run.put_many(rows)
        if scored:
            runs.score(stored_as, right_tool, store=store)
    return store_file


def expected_counts(n_items: int) -> dict[str, int]:
    regressed = sum(1 for i in range(n_items) if i % 7 == 3 and i % 13 != 4)
    improved = sum(1 for i in range(n_items) if i % 13 == 4 and i % 7 != 3)
    return {"regressed": regressed, "improved": improved}
