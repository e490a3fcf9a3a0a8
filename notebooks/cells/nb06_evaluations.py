"""The cells of 06_evaluations.ipynb: lm-evaluation-harness, BFCL and Inspect on the kernel's engine."""

from __future__ import annotations

from cells.common import IGNORE, LOAD, requires

EVALUATIONS_INTRO = [
    requires("evals", "Needs lm-evaluation-harness, Inspect and BFCL, which the README quick start does not install:"),
    (
        "md",
        """# The evaluations researchers already run

lm-evaluation-harness, BFCL and Inspect on the kernel's engine: each harness's own tasks, data and scoring,
with workbench's batch APIs underneath (requests gathered into engine batches, the model's official prompt
formats). Everything here runs offline on the embedded demo model; set `WORKBENCH_NOTEBOOK_CHECKPOINT` to
run the same cells on a real checkpoint. Every score comes with the number of items it counts and its 95%
Wilson interval: these tasks are tiny. Under a minute on a 2-core CPU.""",
    ),
    (
        "code",
        "%matplotlib inline\n"
        + LOAD
        + """
from workbench.demo.tools import convert_currency, get_local_time, get_weather
from workbench.reports import rate_text

engine = wb.load(CHECKPOINT, max_batch_size=16, max_seq_len=2048)
engine""",
        IGNORE,
    ),
]

LM_EVAL_CELLS = [
    (
        "md",
        """## lm-evaluation-harness: `WorkbenchLM`

lm-evaluation-harness runs on the loaded engine through `WorkbenchLM` (importing it registers lm-eval's
`"workbench"` model; `python -m workbench.evals.lm_eval --model_args checkpoint=...,model=... --tasks ...`
is lm-eval's own command line). Log-likelihoods go through `engine.score` — requests sorted by length in
engine batches, shared contexts computed once, only the continuation's positions projected to the
vocabulary — and equal Meta's reference model's to 1e-4. The tasks here are tiny and offline: JSONL files
given to lm-eval as inline configs (the same dicts a task YAML holds); with a real checkpoint, pass task
names (`tasks=["arc_easy", "hellaswag"]`). Here: which call does the model rank first for a question, and
does it write that call? The demo model answers with calls of the tools its prompt offers — it was trained
on nothing else — so the chat prompt must offer them, as `chat_completion(..., tools=...)` does:
`WorkbenchLM(engine, tools=...)` puts them in every chat-template prompt. The same tasks without tools in the
prompt are the second run.""",
    ),
    (
        "code",
        """import json
import tempfile
from pathlib import Path

import datasets
import lm_eval
import pandas as pd
from lm_eval.tasks import TaskManager

from workbench.evals.lm_eval import WorkbenchLM
from workbench.progress import tqdm_bars_off

datasets.disable_progress_bars()  # the task files are local: no download bars
folder = Path(tempfile.mkdtemp(prefix="lm-eval-tasks-"))
cities = ["Paris", "Tokyo", "Oslo", "Lima", "Cairo", "Quito", "Rome", "Seoul"]
docs = [{"q": f"What's the weather in {c}?", "choices": [f'[get_weather(city="{c}")]', f'[get_local_time(city="{c}")]',
                                                          f'[convert_currency(amount=1, from_currency="{c}")]'],
         "label": 0} for c in cities]
(folder / "calls.jsonl").write_text("".join(json.dumps(d) + "\\n" for d in docs))
metric = lambda name: [{"metric": name, "aggregation": "mean", "higher_is_better": True}]  # noqa: E731
mc = {"task": "calls_mc", "dataset_path": "json", "test_split": "test",
      "dataset_kwargs": {"data_files": {"test": str(folder / "calls.jsonl")}},
      "output_type": "multiple_choice", "doc_to_text": "{{q}}", "doc_to_choice": "{{choices}}",
      "doc_to_target": "{{label}}", "metric_list": metric("acc")}
gen = {**{k: v for k, v in mc.items() if k != "doc_to_choice"}, "task": "calls_gen", "output_type": "generate_until",
       "doc_to_target": "{{choices[0]}}", "generation_kwargs": {"until": ["\\n"], "max_gen_toks": 24},
       "metric_list": metric("exact_match")}
runs = {}
for label, offered in (("the three tools", [get_weather, get_local_time, convert_currency]), ("no tools", None)):
    with tqdm_bars_off():  # lm-eval draws a tqdm bar per task and per request type; no option of its own stops them
        runs[label] = lm_eval.simple_evaluate(
            model=WorkbenchLM(engine, tools=offered), tasks=[mc, gen], apply_chat_template=True, log_samples=True,
            bootstrap_iters=0, task_manager=TaskManager(include_defaults=False), verbosity="ERROR")
first = [max(range(3), key=lambda i: s["resps"][i][0][0]) for s in runs["no tools"]["samples"]["calls_mc"]]
print("without tools, the call ranked first:", {c.split("(")[0].strip("["): first.count(i)
                                                for i, c in enumerate(docs[0]["choices"])})
pd.DataFrame({label: {"calls_mc acc": rate_text(r["results"]["calls_mc"]["acc,none"] * len(docs), len(docs)),
                      "calls_gen exact_match": rate_text(r["results"]["calls_gen"]["exact_match,none"] * len(docs),
                                                         len(docs))}
              for label, r in runs.items()}).T.rename_axis("tools in the prompt")""",
        IGNORE,
    ),
    (
        "md",
        """With the tools in its prompt the model ranks the right call first and writes it; a miss in the generated
calls is a city it miscopies (Cairo, a held-out value it never saw in training). Without tools it
has nothing to call: it was trained to call only offered tools, never to answer these questions in words.
Its multiple-choice score without tools is *below* chance (a third, for three choices; 0 of 8 has a 4 %
chance by guessing) because it does not guess: the line printed above counts which call it ranks first, and
without a tool list it prefers the same wrong call for every question (a fixed bias of a model that never saw a
prompt without tools — plus lm-eval's `acc`, which sums the log-probabilities of each choice's tokens, so
choices of different lengths do not start even). Below chance here measures that bias, not a skill.
Each answer below is one `engine.score` row: the log-probability of its tokens after the question, in the
model's chat format with the tools offered.""",
    ),
    (
        "code",
        """from matplotlib.figure import Figure

samples = runs["the three tools"]["samples"]["calls_mc"]
scores = pd.DataFrame([[r[0][0] for r in s["resps"]] for s in samples], index=[s["doc"]["q"] for s in samples],
                      columns=["get_weather", "get_local_time", "convert_currency"])
fig = Figure(figsize=(7.5, 3.6))
ax = fig.subplots()
for (name, values), marker in zip(scores.items(), "os^"):
    ax.plot(values, range(len(values)), marker, label=name)
ax.set_yticks(range(len(scores)), scores.index)
ax.set_xlabel("log-likelihood of the call (nats; 0 = certain)")
ax.set_title("calls_mc: each candidate call, scored after the question")
ax.grid(axis="x", alpha=0.3)
ax.legend(title="candidate call", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
fig.tight_layout()
fig""",
        IGNORE,
    ),
]

BFCL_INSPECT_CELLS = [
    (
        "md",
        """## BFCL: the Berkeley Function Calling Leaderboard, batched

`bfcl.run` answers BFCL's own questions (read from the installed `bfcl-eval` package) with the engine — every
entry with its own function set, all of them in one batch — and scores each reply with **BFCL's own AST
checker**. `prompt="official"` renders each entry in the model's own tool-calling format (what it was
trained on); `prompt="bfcl"` reproduces BFCL's Llama handler prompt, so numbers compare with the public
leaderboard. On a real checkpoint the two side by side show what the prompt format is worth. **The demo
model cannot show it:** it knows only its 14 demo tools and none of BFCL's functions. On a BFCL question it
calls one of its *own* tools, calls some other name (garbled ones such as `convert`), writes a call that does
not parse, or writes no call at all — the count below says which, per category and prompt (under BFCL's own
prompt, which it never saw in training, it writes no call). BFCL's checker rejects every one of them ("Function
name ... not found", the wrong number of functions, no call), so it scores 0 on the four AST categories under
both prompts; on `irrelevance` (where no function fits and the right answer is no call) it scores where it
writes no call. **So its 1.00 on irrelevance is no judgement of relevance:** under BFCL's prompt it writes no
call to any entry of any category (the counts below: "no call" everywhere), and irrelevance is the one category
that rewards silence; a model that can call would have to be read on irrelevance and the call categories
together.""",
    ),
    (
        "code",
        """from IPython.display import display

from workbench.demo.tools import DEMO_TOOLS
from workbench.evals import bfcl

categories = ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"]
results = pd.concat([bfcl.run(engine, categories, limit=5, prompt=p, max_tokens=64) for p in ("official", "bfcl")],
                    ignore_index=True)
display(results[["prompt", "id", "calls", "valid", "error"]].head(8))


def what_it_wrote(row):
    if row["calls"]:  # BFCL's [{name: {argument: value}}]
        names = [name for call in row["calls"] for name in call]
        return "its own tools" if all(name in DEMO_TOOLS for name in names) else "another name"
    return "a call that does not parse" if "could not be parsed" in str(row["error"]) else "no call"


kinds = results.apply(what_it_wrote, axis=1).rename("the reply")
order = {"prompt": ["official", "bfcl"], "category": categories}
pd.crosstab([results[k].astype(pd.CategoricalDtype(v)) for k, v in order.items()], kinds)  # entries per kind""",
        IGNORE,
    ),
    (
        "code",
        """summary = bfcl.summarize(results)     # accuracy per category, as BFCL counts it
summary["accuracy (95% interval)"] = [rate_text(k, n) for k, n in zip(summary["correct"], summary["entries"])]
summary""",
        IGNORE,
    ),
    ("code", "bfcl.plot(summary)", IGNORE),
    (
        "md",
        """## Inspect: the `workbench` model provider

Installing workbench registers a `workbench` provider with [Inspect](https://inspect.aisi.org.uk), so
`inspect eval task.py --model workbench/<checkpoints.toml name or folder>` works from a shell; in a notebook
pass the loaded engine. Tools reach the model in its official format, and the samples Inspect runs
concurrently are gathered into engine batches (the plot: rows per engine call). The tool below returns what
the demo tool of the same name returns — a made-up value that a hash of the city picks, the kind of result
the model was trained to restate — and the scorer checks what a tool-using answer must get right: the call
went to the asked city, and the answer names that city and restates the tool's result.""",
    ),
    (
        "code",
        '''from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, accuracy, scorer
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import tool

from workbench.demo import tools as demo


@tool
def get_weather():
    async def execute(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: Name of the city.
        """
        return demo.get_weather(city)

    return execute


@scorer(metrics=[accuracy()])
def restates_tool_result():
    """Correct when the model called the tool for the target city and its answer names that city and contains
    the tool's result."""
    async def score(state, target):
        calls = [c for m in state.messages if m.role == "assistant" for c in (m.tool_calls or [])]
        results = [m.text for m in state.messages if m.role == "tool"]
        answer = state.output.completion
        right_city = any(c.arguments.get("city") == target.text for c in calls)
        names_city = target.text in answer
        restated = bool(results) and all(r in answer for r in results)
        return Score(value=CORRECT if right_city and names_city and restated else INCORRECT, answer=answer,
                     explanation=f"calls={[(c.function, c.arguments) for c in calls]} results={results}")

    return score


cities = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Rome", "Seoul"]
task = Task(dataset=[Sample(input=f"What is the weather in {c}?", target=c) for c in cities],
            solver=[use_tools(get_weather()), generate()], scorer=restates_tool_result())
model = get_model("workbench/default", engine=engine, memoize=False)
[log] = eval(task, model=model, display="log", log_dir=str(folder / "inspect-logs"), max_tokens=48)
correct = sum(next(iter(s.scores.values())).value == CORRECT for s in log.samples)
print("Inspect accuracy:", rate_text(correct, len(log.samples)))
pd.DataFrame({
    "input": [s.input for s in log.samples],
    "tool calls": [[(c.function, c.arguments) for c in (s.messages[1].tool_calls or [])] for s in log.samples],
    "answer": [s.output.completion for s in log.samples],
    "score": [next(iter(s.scores.values())).value for s in log.samples],
})''',
        IGNORE,
    ),
    (
        "md",
        """A sample the scorer marks incorrect (`I`) is one where the model wrote another city into the call — for
*Cairo*, a held-out value, as in the lm-eval task above — and then restated that city's weather. Inspect's
built-in `includes()` would look only for the target city's name in the answer, and so pass an answer that
names the city but garbles the weather; a check of the call and the result alone would pass a right call
whose answer names another city (`02_tool_experiments.ipynb`: "The weather in tiger is 0 C and windy." after
a correct call for Lima). This scorer asks for all three.""",
    ),
    (
        "code",
        """sizes = model.api.batcher.stats.sizes
fig = Figure(figsize=(4.6, 2.8))
ax = fig.subplots()
ax.bar(range(1, len(sizes) + 1), sizes)
ax.set_xlabel("engine call")
ax.set_ylabel("rows in the batch")
ax.set_xticks(range(1, len(sizes) + 1))
ax.set_title(f"{len(cities)} Inspect samples: rows per engine call")
fig.tight_layout()
fig""",
        IGNORE,
    ),
    (
        "md",
        """## Where to go next

- Your own checkpoint (README, "Your own checkpoint"): set `WORKBENCH_NOTEBOOK_CHECKPOINT` and run these
  cells again, with real task names (`tasks=["arc_easy"]`) and BFCL's full categories (`limit=None`).
- `python -m workbench.evals.lm_eval`, `python -m workbench.evals.bfcl` and `inspect eval ... --model
  workbench/...`: the same harnesses from a shell.
- `02_tool_experiments.ipynb`: workbench's own tool-calling cases, with the settings that move them.""",
    ),
]

BFCL_MULTI_TURN_CELLS = [
    (
        "md",
        """## BFCL multi-turn: dialogs on BFCL's own backends, scored by BFCL's own checker

`bfcl.run` with the multi-turn categories (`multi_turn_base`, `multi_turn_miss_func`, `multi_turn_miss_param`,
`multi_turn_long_context`, 200 entries each) runs every entry as one dialog of the tool loop, all entries in
flight together: BFCL's stateful backends (a file system, a messaging API, a trading bot...) are loaded from the
entry's `initial_config`, the user's turns come in order, the model is asked again after each round of calls
until it replies without one, and each call runs on the backends **by name, with parsed arguments — never
`eval` of model text**. BFCL's multi-turn checker then compares the backends' state and the call results with
the ground truth's, turn by turn. **The demo model scores near 0 here**: it knows only its 14 demo tools, not
BFCL's functions, so it ends its turns without a call BFCL's checker accepts. The prompts hold ~3,000 tokens of
function docs, so the engine is loaded again with a longer context.""",
    ),
    (
        "code",
        """engine = wb.load(CHECKPOINT, max_batch_size=16, max_seq_len=8192)  # BFCL's function docs are long
mt = bfcl.run(engine, ["multi_turn_base"], limit=2, max_tokens=24, run="nb06-multi-turn")
display(mt[["id", "valid", "error", "turns", "steps", "failed_turn", "force_terminated", "cached"]])
bfcl.summarize(mt)  # accuracy with a 95% interval; multi_turn_overall: BFCL's unweighted mean of the categories""",
        IGNORE,
    ),
    (
        "md",
        """Why the first entry failed, in BFCL's words (its error type) and ours: the turn where the checker stopped
and what it saw there — the backend attributes that differ from the ground truth's, or the expected results
the model never produced. `wb.runs.view("nb06-multi-turn")` shows the same text when the item is opened.""",
    ),
    (
        "code",
        """row = mt.iloc[0]
print(row["error"], "at turn", row["failed_turn"])
print(row["explanation"])""",
        IGNORE,
    ),
    (
        "md",
        """The same entry turn by turn: what the user asked, the calls the model made (as the call strings BFCL's
checker executed), and the backend state after the turn next to the ground truth's (`differs`: the
attributes BFCL's state check would flag).""",
    ),
    (
        "code",
        """turns = bfcl.turn_states(row)
display(pd.DataFrame([{k: t[k] for k in ("turn", "user", "calls", "differs")} for t in turns]))
first = turns[0]
{name: {k: repr(v)[:120] for k, v in attrs.items()} for name, attrs in first["expected_state"].items()}""",
        IGNORE,
    ),
    (
        "md",
        """On a real checkpoint, all four categories with BFCL's own Llama handler prompt (comparable with the public
leaderboard), from a shell — every step kept in the run store, so a killed run resumes, and two settings
compare item by item with `wb.runs.summary(["mt-bf16", "mt-int4"])`:

```
python -m workbench.evals.bfcl --checkpoint /ckpts/Llama3.2-3B-Instruct --model Llama3.2-3B-Instruct \\
    --categories multi_turn_base multi_turn_miss_func multi_turn_miss_param multi_turn_long_context \\
    --prompt bfcl --max-seq-len 16384 --run mt-bf16
```""",
    ),
]
