"""The cells of 08_experiments.ipynb: one experiment over stored runs — does a system prompt that asks for
brevity make the demo model's tool answers shorter, and do int4 weights or three more tools on offer change
anything? — scored with scorers that check the call's argument and the answer's place, summarized with paired and
template-clustered intervals, corrected for the number of comparisons, viewed, reported, killed and resumed.

``CASES_CELL`` and ``SCORER_CELL`` are the exact code of two cells: tests/test_notebook_scorers.py runs them on
hand-made rows."""

from __future__ import annotations

from cells.common import CHECK, IGNORE, LAB, LOAD

CASES_CELL = """CITIES = ["Paris", "Tokyo", "Lima", "Oslo"]
COUNTRIES = ["France", "Japan", "Peru", "Norway"]  # get_population takes a country, so these questions do too
TEMPLATES = {  # template -> (question, the tool a right answer calls, the places it is asked about)
    "weather": ("What's the weather in {}?", get_weather, CITIES),
    "raining": ("Is it raining in {}?", get_weather, CITIES),
    "weather-report": ("Weather report for {}.", get_weather, CITIES),
    "time": ("What time is it in {}?", get_local_time, CITIES),
    "time-please": ("Local time in {}, please.", get_local_time, CITIES),
    "time-now": ("What's the time in {} right now?", get_local_time, CITIES),
    "population": ("How many people live in {}?", get_population, COUNTRIES),
    "population-short": ("Population of {}?", get_population, COUNTRIES),
}
# one item per (template, place): its id names both, and is passed to the runs as item=
CASES = {f"{name}/{place}": (question.format(place), tool, place)
         for name, (question, tool, places) in TEMPLATES.items() for place in places}
ITEMS = list(CASES)
TOOLS = [get_weather, get_local_time, get_population]
MORE_TOOLS = TOOLS + [get_capital, convert_currency, get_random_joke]  # three tools no question needs
SYSTEMS = {"plain": "You are a helpful assistant.", "brief": "Answer in as few words as possible."}
SETTINGS = dict(max_turns=3, max_tokens=48, temperature=0.0)


def dialogs(system):
    return [[{"role": "system", "content": SYSTEMS[system]}, {"role": "user", "content": question}]
            for question, _, _ in CASES.values()]


print(len(CASES), "items:", len(TEMPLATES), "templates x 4 places; 4 runs")"""

SCORER_CELL = """def dialog_calls(row):
    \"\"\"Every call of the item's dialog up to this row: the earlier turns' (in the request) and this turn's.\"\"\"
    earlier = [(c["tool_name"], c["arguments"]) for m in row["request"]["messages"] if m["role"] == "assistant"
               for c in m.get("tool_calls") or []]
    return earlier + [(name, arguments) for name, arguments in row["calls"]]


def score(row):
    question, tool, place = CASES[row["item"]]  # the item id given with item=: no guessing from the text
    parameter = next(iter(inspect.signature(tool).parameters))  # "city" or "country"
    calls = dialog_calls(row)
    answer = "" if row["calls"] else row["output"]  # a turn that calls is no answer (yet)
    seen = [json.dumps(call, sort_keys=True) for call in calls]
    return {
        "right_call": bool(calls) and calls[0] == (tool.__name__, {parameter: place}),
        "restates": bool(answer) and tool(place) in answer and place in answer,
        "repeats_call": len(seen) != len(set(seen)),
        "answer_words": len(answer.split()),
    }"""

EXPERIMENTS = [
    LAB,
    (
        "md",
        """# An experiment: what changed, on which cases, and is it real?

**The question.** A system prompt that asks for brevity ("Answer in as few words as possible.") — does it make
the demo model's tool-using answers shorter, and does it cost correctness? Beside it, two changes that should
*not* matter: the experts' weights in int4, and three more tools on offer that no question needs. One change at a
time against a baseline, over the same 32 tool questions, each run stored with `run=`.

**What is measured**, per item (one question's dialog): the first call is the right tool *with the right
argument*; the final answer restates that tool's value *for that place*; the dialog repeats a call; the
answer's length in words. Then the questions research asks next: which settings differ, which items changed,
and whether a difference is more than the items' noise — a paired 95 % interval, one that treats the 8 question
templates as the independent units, and a correction for the 12 comparisons made. On the way the baseline run
is computed by a child process that is **killed** half-way (SIGKILL), and resumed from the store here. About two
minutes on a 2-core CPU.""",
    ),
    (
        "code",
        LOAD
        + """
import inspect
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from workbench import tools
from workbench.demo.tools import (convert_currency, get_capital, get_local_time, get_population, get_random_joke,
                                  get_weather)
from workbench.places import data_dir
from workbench.reports import short_path
from workbench.runs import stats

engine = wb.load(CHECKPOINT, max_batch_size=16, max_seq_len=1024)
engine""",
        IGNORE,
    ),
    (
        "md",
        """A store answers a request from any run that holds it, so a notebook that shows rows being *computed*
needs a store of its own: this one points `$WORKBENCH_STORE` at `notebook-08.sqlite` in the data folder — a
file only this notebook writes — and empties it (the last cell puts the variable back).""",
    ),
    (
        "code",
        """previous_store = os.environ.get("WORKBENCH_STORE")
os.environ["WORKBENCH_STORE"] = str(data_dir() / "notebook-08.sqlite")
for name in wb.runs.store().run_names():
    wb.runs.delete(name)
print("run store:", short_path(wb.runs.path()))""",
        IGNORE,
    ),
    (
        "md",
        """## The items and the settings

Eight question templates, each asked about four places: weather and time about cities, population about
countries (the tool takes a country). The item id names the template and the place (`weather/Paris`) and goes
to every run as `item=`, so the scorers look the expected call up by id, and the same question under two system
prompts lines up. Items of one template tend to pass or fail together, which the intervals below account
for.""",
    ),
    ("code", CASES_CELL, CHECK),
    (
        "md",
        """## A run killed half-way, resumed from the store

The baseline run (plain prompt, three tools, unquantized) starts in a **child process**, which is killed with
SIGKILL — no clean-up, no chance to save anything — as soon as a few turns are on disk. Rows are written the
moment they finish, so the kill loses only the rows still running; the same call here computes only the rest.""",
    ),
    (
        "code",
        '''CHILD = """
import json, os, sys
import workbench as wb
from workbench import tools
from workbench.demo.tools import get_local_time, get_population, get_weather
engine = wb.load(os.environ.get("WORKBENCH_NOTEBOOK_CHECKPOINT"), max_batch_size=16, max_seq_len=1024)
dialogs, items, settings = json.load(open(sys.argv[1]))
tools.run_batch(engine, dialogs, [get_weather, get_local_time, get_population], run="plain", item=items,
                progress=False, **settings)
"""
with tempfile.TemporaryDirectory() as folder:
    script, arguments = Path(folder) / "child.py", Path(folder) / "dialogs.json"
    script.write_text(CHILD)
    arguments.write_text(json.dumps([dialogs("plain"), ITEMS, SETTINGS]))
    child = subprocess.Popen([sys.executable, str(script), str(arguments)], env=dict(os.environ),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = wb.runs.store()
    while child.poll() is None and ("plain" not in store.run_names() or len(wb.runs.rows("plain")) < 8):
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
stored_by_child = len(wb.runs.rows("plain"))
print(f"child killed by signal {-child.returncode}; {stored_by_child} turns were already stored")''',
        IGNORE,
    ),
    (
        "code",
        """start = time.perf_counter()
baseline = tools.run_batch(engine, dialogs("plain"), TOOLS, run="plain", item=ITEMS, **SETTINGS)
rows = wb.runs.rows("plain")
print(f"resumed in {time.perf_counter() - start:.1f} s: {len(rows)} turns stored, {stored_by_child} of them "
      f"by the killed child")""",
        IGNORE,
    ),
    (
        "code",
        """def messages(transcripts):
    return [[(m.role, m.content) for m in t] for t in transcripts]


uninterrupted = tools.run_batch(engine, dialogs("plain"), TOOLS, progress=False, **SETTINGS)  # no run=: all computed
print("the resumed run equals one never interrupted:", messages(baseline) == messages(uninterrupted))""",
        CHECK,
    ),
    (
        "md",
        """## The other three runs

Each changes one setting of the baseline: the brief system prompt; the experts in int4 (`int4_mixed`, put back
to none at once); three more tools offered.""",
    ),
    (
        "code",
        """transcripts = {"plain": baseline}
transcripts["brief"] = tools.run_batch(engine, dialogs("brief"), TOOLS, run="brief", item=ITEMS, **SETTINGS)
engine.set_quantization("int4_mixed")
try:
    transcripts["plain-int4"] = tools.run_batch(engine, dialogs("plain"), TOOLS, run="plain-int4", item=ITEMS,
                                                **SETTINGS)
finally:
    engine.set_quantization(None)
transcripts["plain-6-tools"] = tools.run_batch(engine, dialogs("plain"), MORE_TOOLS, run="plain-6-tools",
                                               item=ITEMS, **SETTINGS)
RUNS = list(transcripts)
wb.runs.table()[["run", "rows", "items"]]""",
        IGNORE,
    ),
    (
        "md",
        """## What differs between two runs

`wb.runs.settings(name)` holds a run's load settings, checkpoint identity and call settings (system prompt,
tools by name and schema hash, tool format, sampling); `wb.runs.diff_settings(a, b)` keeps what differs — each
run here differs from the baseline in the one setting it changes:""",
    ),
    (
        "code",
        """for other in RUNS[1:]:
    print(other, "vs plain:", wb.runs.diff_settings("plain", other))""",
        IGNORE,
    ),
    (
        "md",
        """## Scores

A score is a function of a stored row (`item`, `turn`, `output`, `calls`, `request`, ...): `wb.runs.score(run,
fn)` applies it to every row and stores the result, generating nothing again; an item's score is its last
row's. Each row here is scored on its dialog so far (the request holds the earlier turns), so the last row
scores the whole dialog — an item that never answered fails `restates` rather than dropping out of n:

- **right_call** — the first call is the tool the question needs, with the place as its one argument
  (`get_population({"country": "Paris"})` for a population question about Peru fails);
- **restates** — the final answer holds that tool's value *for that place* and names the place ("The population
  of MH is 27.8 million." for Peru fails);
- **repeats_call** — the dialog makes the same call (name and arguments) twice;
- **answer_words** — the final answer's length in words (0 when there is none).""",
    ),
    ("code", SCORER_CELL, CHECK),
    (
        "code",
        """for name in RUNS:
    wb.runs.score(name, score)
wb.runs.rows("brief")[["item", "turn", "tool_calls", "output", "right_call", "restates", "repeats_call",
                       "answer_words"]].head(6)""",
        IGNORE,
    ),
    (
        "md",
        """## Is the difference real?

`wb.runs.summary(runs, baseline=)`: per run and score, the mean with its 95 % interval; against the baseline,
the difference over the items both runs answered with its paired 95 % interval, the p-value (McNemar's exact
test for pass/fail, a sign-flip test for numbers), and how many items improved and regressed.""",
    ),
    (
        "code",
        """summary = wb.runs.summary(RUNS, baseline="plain")
means = summary.pivot(index="score", columns="run", values="mean")[RUNS]
for name, row in means.iterrows():  # a score no run moves is no finding: said, not left to the table
    if row.nunique() == 1:
        print(f"{name}: {row.iloc[0]:.3g} in every run: none of these settings moves it")
summary[["run", "score", "n", "mean", "low", "high", "diff", "diff_low", "diff_high", "p_value", "improved",
         "regressed"]].round(3)""",
        IGNORE,
    ),
    (
        "md",
        """Those intervals treat the 32 items as independent, but the four places of one template share its
wording, and pass or fail together. The interval below treats the **8 templates** as the units: the mean
difference per template, then Student's t over the 8 (wider, and honest about clustering). And with 3 runs × 4
scores, 12 differences are tested: at 95 % each, one in two such experiments would show a difference by chance
somewhere, so a p-value is held to **Holm's correction** for 12 comparisons. A difference is called only when
the clustered interval excludes 0 and the corrected p-value is below 0.05:""",
    ),
    (
        "code",
        """def clustered(other, name):
    pairs = wb.runs.compare("plain", other)
    per_item = pairs[f"{name}_b"].astype(float) - pairs[f"{name}_a"].astype(float)
    per_template = per_item.groupby(pairs["item"].str.split("/").str[0]).mean()
    return stats.mean_interval(per_template.to_numpy())


tests = summary[summary["run"] != "plain"].reset_index(drop=True)
order = np.argsort(tests["p_value"].to_numpy())
holm, running = np.empty(len(tests)), 0.0
for rank, i in enumerate(order):  # Holm: the k-th smallest p-value times (m - k), kept increasing
    running = max(running, min(1.0, (len(tests) - rank) * tests["p_value"][i]))
    holm[i] = running
called = []
for row, p_holm in zip(tests.itertuples(), holm):
    diff, low, high = clustered(row.run, row.score)
    shown = (low > 0 or high < 0) and p_holm < 0.05
    verdict = ("higher" if diff > 0 else "lower") if shown else "not shown to differ"
    called += [f"{row.score} {verdict} under {row.run}"] if shown else []
    print(f"{row.run:<13} {row.score:<12} {diff:+.3f} [{low:+.3f}, {high:+.3f}] by template, "
          f"Holm p = {p_holm:.2g}: {verdict}")""",
        IGNORE,
    ),
    (
        "md",
        """## What changed

The conclusion, from the numbers above: how many items each setting changed at all, what the brief prompt did
to repeated calls and to the answers' length, and which differences survive the clustered interval and the
correction. (What a reader of these numbers learns about the demo model: asking it for brevity does not make
its answers shorter; where the prompt changes anything, the model calls the same tool twice and then says the
answer twice. Whether that is more than its templates' noise takes more templates than eight.)""",
    ),
    (
        "code",
        """changed = {other: int((~wb.runs.compare("plain", other)["same"]).sum()) for other in RUNS[1:]}
print("items whose transcript differs from the baseline's:", changed)
pairs = wb.runs.compare("plain", "brief")
start, stop = (pairs[f"repeats_call_{x}"].astype(float) > pairs[f"repeats_call_{y}"].astype(float) for x, y in
               [("b", "a"), ("a", "b")])
templates = pairs.loc[start, "item"].str.split("/").str[0].nunique()
plain_words, brief_words = means.loc["answer_words", "plain"], means.loc["answer_words", "brief"]
p_item = summary.set_index(["run", "score"]).loc[("brief", "repeats_call"), "p_value"]
print(f"brief vs plain: {start.sum()} of {len(pairs)} items start repeating a call (from {templates} of "
      f"{len(TEMPLATES)} templates; item-level p = {p_item:.2g}) and {stop.sum()} stop; the answers average "
      f"{brief_words:.1f} words against {plain_words:.1f}: "
      + ("longer, not briefer" if brief_words > plain_words else "briefer" if brief_words < plain_words
         else "the same length"))
print("shown with the templates as units and Holm's correction:", "; ".join(called) or
      "nothing: every difference above could be the templates' noise or one of 12 chances")""",
        IGNORE,
    ),
    (
        "md",
        """## Item by item

`wb.runs.compare(a, b)` pairs the items (both transcripts, same or not, the first differing token and both texts
from where they part, each score in both runs and whether the item improved, regressed or stayed), regressions
first:""",
    ),
    (
        "code",
        """pairs = wb.runs.compare("plain", "brief")
print(pairs.attrs["counts"])
pairs[["item", "same", "first_diff", "diff_a", "diff_b", "repeats_call_change", "restates_change"]].head(6)""",
        IGNORE,
    ),
    (
        "md",
        """## The viewer

`wb.runs.view(*runs)`: pick the runs and the baseline; the runs with their tags, notes and differing
settings; the summary; the item grid of one run against the baseline, **regressions first**, with filters
(changed only, regressed only, a text search); click an item to see both transcripts side by side, tool calls
and results included, the differing words marked. The grid draws one page at a time (itables), so ten
thousand items open as fast as ten.""",
    ),
    (
        "code",
        """wb.runs.tag("plain", "baseline")
wb.runs.note("brief", "system prompt asks for brevity")
wb.runs.view(*RUNS, baseline="plain")""",
        IGNORE,
    ),
    (
        "md",
        """## A report to attach

`wb.runs.report(runs, "report.html")` writes the same summary, the differing settings and the changed items
(both outputs, differences marked) into one HTML file with everything inline — no script, style sheet or font
to fetch, so it opens offline, attached to a paper, a pull request or a message. Here it goes to the data
folder; the command line writes the same file (`python -m workbench runs report plain brief -o report.html`),
and both work before any scoring too (settings and changed items, "no scores yet").""",
    ),
    (
        "code",
        """report = wb.runs.report(RUNS, data_dir() / "notebook-08-report.html", baseline="plain")
text = report.read_text()
print(f"{report.name}: {len(text.encode()) / 1e3:.0f} kB, external references: "
      f"{sum(text.count(s) for s in ('http://', 'https://', '<link', 'src='))}")""",
        IGNORE,
    ),
    (
        "md",
        """## Recomputing on purpose: `refresh=True`

A stored run answers again from the store; `refresh=True` computes every turn afresh and replaces the stored
rows (greedy decoding: the same answers).""",
    ),
    (
        "code",
        """before = wb.runs.rows("brief")
again = tools.run_batch(engine, dialogs("brief"), TOOLS, run="brief", item=ITEMS, refresh=True, progress=False,
                        **SETTINGS)
after = wb.runs.rows("brief")
print("recomputed every turn:", bool(after["stored_at"].min() > before["stored_at"].max()),
      "| the same transcripts:", messages(again) == messages(transcripts["brief"]))""",
        CHECK,
    ),
    ("md", "## Putting the environment back\n\nThe store variable as it was, the engine unquantized:"),
    (
        "code",
        """if previous_store is None:
    os.environ.pop("WORKBENCH_STORE", None)
else:
    os.environ["WORKBENCH_STORE"] = previous_store
print("quantization:", engine.settings.quantization or "none", "| WORKBENCH_STORE restored:",
      os.environ.get("WORKBENCH_STORE") == previous_store)""",
        CHECK,
    ),
    (
        "md",
        """## Where to go next

- The same from a shell: `python -m workbench runs ls`, `runs diff plain brief`, `runs summary plain brief
  plain-int4`, `runs report ... -o report.html` (`--store` names the file).
- `docs/run-store.md`: items, settings, scores, the statistics, the viewer and the report.
- `02_tool_experiments.ipynb`: the tool-calling evals that store their scores with `run=`;
  `04_quantization.ipynb`: what int4 does to memory and speed.""",
    ),
]
