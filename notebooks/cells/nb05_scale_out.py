"""The cells of 05_scale_out.ipynb: engine replicas on Ray."""

from __future__ import annotations

from cells.common import CHECK, IGNORE, requires

SCALE_OUT = [
    requires("cluster", "Needs the cluster extra (Ray), which the README quick start does not install:"),
    (
        "md",
        """# Scale out: engine replicas on Ray

`workbench.cluster.load(..., replicas=N)` starts N engines, each in its own Ray actor (on its own GPUs when
the cluster has them), behind the engine's batch APIs: `batch_completion`, `batch_chat_completion`, the tool
loop and `workbench.evals` run on a pool unchanged, and every row is what one engine gives.

These cells run a local Ray on this machine. To run the **same cells on a cluster of GPU nodes**, set
`WORKBENCH_RAY_ADDRESS=auto` (on a node of the cluster) or `ray://head:10001` (from outside), and
`WORKBENCH_NOTEBOOK_CHECKPOINT` to a checkpoint folder that every node can read. About a minute on a 2-core
CPU, most of it starting Ray and the replicas.""",
    ),
    (
        "code",
        """import logging
import os

import workbench.cluster as wbc
from workbench.demo.tools import get_local_time, get_population, get_random_joke, get_weather

CHECKPOINT = os.environ.get("WORKBENCH_NOTEBOOK_CHECKPOINT")  # None: the embedded demo model
ADDRESS = os.environ.get("WORKBENCH_RAY_ADDRESS")  # None: a local Ray (127.0.0.1); "auto" / "ray://...": a cluster
TOOLS = [get_weather, get_local_time, get_population, get_random_joke]  # 1-4 tools, as the demo model was trained

# a local Ray with room for 3 one-CPU replicas; Ray's own start-up log lines stay out of the notebook
wbc.connect(ADDRESS, **({} if ADDRESS else {"num_cpus": 3, "logging_level": logging.ERROR}))
pool = wbc.load(CHECKPOINT, replicas=2, max_batch_size=8, max_seq_len=2048, threads=1)
pool""",
        IGNORE,
    ),
    (
        "md",
        """Each replica is a Ray actor in its own placement group: on GPUs it holds `model_parallel_size` GPUs of
one node. `pool.replicas` says where each one runs.""",
    ),
    (
        "code",
        """import pandas as pd

pd.DataFrame(pool.replicas)[["index", "state", "host", "cuda_visible_devices"]]""",
        IGNORE,
    ),
    (
        "md",
        """## The same rows as one engine

A batch is cut into chunks that the replicas pull; rows come back in input order. Batching never changes a
row and a seeded row is seeded the same on every replica, so greedy and seeded rows equal single runs.""",
    ),
    (
        "code",
        """prompts = ["The capital of France is", "def fib(n):", "Llamas are", "Tell me a story"] * 3
batch = pool.batch_completion(prompts, max_tokens=12, temperature=0.8, top_p=0.9, seed=1, progress=False)
alone = [pool.completion(p, max_tokens=12, temperature=0.8, top_p=0.9, seed=1) for p in prompts]
print("rows identical to single runs:", [b.tokens for b in batch] == [a.tokens for a in alone])""",
        CHECK,
    ),
    (
        "md",
        """## The tool loop and evaluations on a pool

`wb.tools.run_batch(pool, ...)` and `workbench.evals.run_cases(pool, ...)` take the pool where they take an
engine. The dialogs below offer four tools, as the demo model was trained (one to four at a time).""",
    ),
    (
        "code",
        """asked = [("What's the weather in Paris?", "get_weather"), ("What time is it in Tokyo?", "get_local_time"),
         ("What is the population of Peru?", "get_population"), ("Tell me a joke.", "get_random_joke"),
         ("What's the weather in Rome?", "get_weather"), ("What time is it in Seoul?", "get_local_time"),
         ("How many people live in Brazil?", "get_population"), ("Tell me a story about dragons.", None)]
dialogs = [[{"role": "user", "content": q}] for q, _ in asked]
transcripts = wb.tools.run_batch(pool, dialogs, tools=TOOLS, max_tokens=48, max_turns=3)
transcripts[0]""",
        IGNORE,
    ),
    (
        "code",
        """for (question, expected), transcript in zip(asked, transcripts):
    called = [c.tool_name for m in transcript for c in m.tool_calls]
    broken = [m.parse_error for m in transcript if getattr(m, "parse_error", None)]  # a call that does not parse
    mark = "✓" if called[:1] == ([expected] if expected else []) and not broken else "✗"
    print(f"{mark} {question:<34} calls={called} -> {transcript[-1].content!r}" + (f" ({broken[0]})" if broken else ""))""",
        CHECK,
    ),
    (
        "md",
        """The tool results are the demo tools' made-up values (a hash of the arguments picks them: Brazil's
"32.3 million" is not its population). Where a mark is ✗, the model did something it should not: for the
story no offered tool fits, and here the model called `get_capital` — a tool it was **not offered** — so the
loop answered with an error, which the model then garbled into the answer above. Declining in words is what
its training meant it to do when no offered tool fits; it does so in most such dialogs, not in all
(`02_tool_experiments.ipynb`, with another tool set, declines the same story, and measures direct answers on
held-out cases with n and an interval).""",
    ),
    (
        "md",
        """## A sweep

`wbc.sweep(grid, dialogs, tools)` runs every grid point (load settings such as `quantization` or
`checkpoint`, call settings such as `tool_choice`, `tool_prompt_format` or `temperature`) over the same dialogs and
returns one DataFrame. A quantization change re-loads the replicas in place (and the pool's mode is restored
after). Each rate below is over the 8 dialogs, with its 95% Wilson interval; "right first reply" is the expected
tool (or, for the story, no call).""",
    ),
    (
        "code",
        """from workbench.reports import rate_text

table = wbc.sweep({"quantization": [None, "int4_mixed"], "tool_choice": ["auto", "required"]},
                  dialogs, TOOLS, pool=pool, max_tokens=48)
expected = {i: tool for i, (_, tool) in enumerate(asked)}
table["called_a_tool"] = table["tool_calls"].map(bool)
table["repeats_a_call"] = table["tool_calls"].map(  # the same call (name and arguments) twice in one reply
    lambda calls: len({(c["tool_name"], repr(c["arguments"])) for c in calls}) < len(calls))
table["right_first_reply"] = [([c["tool_name"] for c in calls][:1] == ([expected[i]] if expected[i] else []))
                              for i, calls in zip(table["dialog"], table["tool_calls"])]
table["quantization"] = table["quantization"].fillna("none")
rates = table.groupby(["quantization", "tool_choice"], sort=False).agg(
    dialogs=("dialog", "size"), called=("called_a_tool", "sum"), right=("right_first_reply", "sum"),
    repeated=("repeats_a_call", "sum"), tokens=("tokens", "mean"))
rates["called a tool"] = [rate_text(k, n) for k, n in zip(rates["called"], rates["dialogs"])]
rates["right first reply"] = [rate_text(k, n) for k, n in zip(rates["right"], rates["dialogs"])]
rates["replies that repeat a call"] = [f"{k}/{n}" for k, n in zip(rates["repeated"], rates["dialogs"])]
rates["generated tokens per reply (mean)"] = rates["tokens"].round(1)
rates[["called a tool", "right first reply", "replies that repeat a call", "generated tokens per reply (mean)"]]""",
        IGNORE,
    ),
    (
        "md",
        """`tool_choice="required"` adds Llama Stack's sentence *"You MUST use one of the provided functions/tools to
answer the user query."* to the system prompt. The demo model never saw that sentence in training, so what it
does with it is not something it was taught: compare the `required` rows with the `auto` ones — here the same
first calls, but most `required` replies write their call twice (the same name and arguments), hence more
generated tokens per reply (the `tokens` of each first reply, stop token excluded) — and the int4_mixed rows
with none's. To enforce a call whatever the model was trained on, `constrain_tools=True` masks every token
that would not continue a valid call of an offered tool (see the README, "Structured output").""",
    ),
    (
        "md",
        """## Jobs: progress across replicas, cancel

`pool.submit_batch_chat_completion(...)` returns at once with a job: a progress bar of rows and tokens/s
over all replicas, `job.result()`, `job.cancel()` (stops within a decode step on every replica; finished
rows stay in `job.partial()`), `job.done` and per-replica statistics.""",
    ),
    (
        "code",
        """job = pool.submit_batch_chat_completion(dialogs * 3, TOOLS, max_tokens=48, progress=True)
replies = job.result()
per_replica = pd.DataFrame(job.stats()["per_replica"]).T.sort_index().rename_axis("replica")
per_replica.astype({"rows": int, "tokens": int}).round({"seconds": 2, "tok_s": 1})""",
        IGNORE,
    ),
    (
        "md",
        """## Throughput against the replica count

The same seeded batch (32 prompts, up to 24 tokens each) on **one engine in this kernel** (no Ray, one CPU
thread like each replica), on **1 replica** and on **2 replicas**, three rounds with the contenders taking turns
(so a burst of load hits all of them alike); each bar is the median rate with the slowest and fastest round as
its whiskers. One engine against one replica is the pool's overhead (Ray's calls, moving the rows between
processes); one replica against two is the scaling. On a 2-core machine the two one-thread replicas get a core
each only when nothing else runs (Ray's own processes and any other load share the same two cores), so **the
gain is at most 2× here and moves with the machine's load** (`bench/cluster.py` measures both). On a machine with
a core group or GPU per replica the rate grows with the replicas.""",
    ),
    (
        "code",
        """%matplotlib inline
import time

import numpy as np
import torch
from matplotlib.figure import Figure

work = [f"Tell me about topic {i}. " * (1 + i % 3) for i in range(32)]


def rate(p):
    start = time.perf_counter()
    rows = p.batch_completion(work, max_tokens=24, temperature=0.7, seed=0, progress=False)
    return sum(len(r.tokens) for r in rows) / (time.perf_counter() - start)


threads = torch.get_num_threads()
torch.set_num_threads(1)  # the one engine gets one thread, as each replica does (put back below)
one_replica = wbc.load(CHECKPOINT, replicas=1, max_batch_size=8, max_seq_len=2048, threads=1)
try:
    contenders = {"one engine\\n(no Ray)": wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=2048),
                  "1 replica": one_replica,
                  "2 replicas": pool}
    for p in contenders.values():
        p.batch_completion(work[:2], max_tokens=2, progress=False)  # warm-up: first calls allocate
    rates = {name: [] for name in contenders}
    for _ in range(3):  # rounds, the contenders taking turns
        for name, p in contenders.items():
            rates[name].append(rate(p))
finally:
    torch.set_num_threads(threads)
    one_replica.shutdown()
    wb.unload()
names = list(rates)
medians = [float(np.median(rates[n])) for n in names]
fig = Figure(figsize=(5.4, 3.6))
ax = fig.subplots()
errors = [[m - min(rates[n]) for n, m in zip(names, medians)], [max(rates[n]) - m for n, m in zip(names, medians)]]
bars = ax.bar(names, medians, yerr=errors, capsize=4, color=["#90a4ae", "#66bb6a", "#388e3c"])
ax.bar_label(bars, labels=[f"{m:.0f} tok/s\\n({min(rates[n]):.0f}–{max(rates[n]):.0f})" for n, m in
                           zip(names, medians)], fontsize=8, padding=2)
ax.set_ylim(0, 1.35 * max(max(r) for r in rates.values()))
ax.set_ylabel("generated tokens / s (median, min–max of 3 rounds)")
ax.set_title(f"batch_completion: {len(work)} prompts, one CPU thread per engine")
fig.tight_layout()
print(f"1 replica ÷ one engine: {medians[1] / medians[0]:.2f} (rounds from {min(rates[names[1]]) / max(rates[names[0]]):.2f} "
      f"to {max(rates[names[1]]) / min(rates[names[0]]):.2f}); 2 replicas ÷ 1 replica: {medians[2] / medians[1]:.2f} "
      f"(rounds from {min(rates[names[2]]) / max(rates[names[1]]):.2f} to {max(rates[names[2]]) / min(rates[names[1]]):.2f})")
fig""",
        IGNORE,
    ),
    ("md", "`pool.shutdown()` ends every replica and its worker processes; `wbc.disconnect()` stops the local Ray."),
    (
        "code",
        """pool.shutdown()
wbc.disconnect()
print(pool)""",
        IGNORE,
    ),
    (
        "code",
        'print("every replica ended:", all(r["state"] == "closed" for r in pool.replicas), "| died:", pool.deaths)',
        CHECK,
    ),
    (
        "md",
        """## Where to go next

- `06_evaluations.ipynb`: lm-evaluation-harness, BFCL and Inspect on an engine (each takes a pool's
  checkpoint the same way).
- The README's "Scale out on Ray": a cluster of GPU nodes (`ray start`, a shared checkpoint path,
  `address="auto"`).
- `bench/cluster.py` and `docs/benchmarks.md`: the pool's overhead, measured.""",
    ),
]
