"""The cells of 08_experiments.ipynb: one experiment over stored runs — two system prompts × two quantization
modes on the same tool dialogs, scored, summarized with paired statistics, viewed, reported, killed and
resumed."""

from __future__ import annotations

from cells.common import CHECK, IGNORE, LAB, LOAD

EXPERIMENTS = [
    LAB,
    (
        "md",
        """# An experiment: what changed, on which cases, and is it real?

One change at a time — the system prompt, the quantization — over the same 32 tool dialogs, each run stored
with `run=`. Then the questions research asks next: which settings differ between two runs, which cases
improved or regressed, and whether a difference in a score is more than the cases' noise (a paired 95 %
interval and a p-value per score). The runs are seen in the notebook (`wb.runs.view`) and written to one
self-contained HTML file (`wb.runs.report`). On the way, the first run is computed by a child process that is
**killed** half-way (SIGKILL), and resumed from the store here. About two minutes on a 2-core CPU.""",
    ),
    (
        "code",
        LOAD
        + """
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workbench import tools
from workbench.demo.tools import get_local_time, get_population, get_weather
from workbench.places import data_dir
from workbench.reports import short_path

engine = wb.load(CHECKPOINT, max_batch_size=16, max_seq_len=1024)
engine""",
        IGNORE,
    ),
    (
        "md",
        """A store answers a request from any run that holds it, so a notebook that shows rows being *computed*
needs a store of its own: this one points `$WORKBENCH_STORE` at `notebook-08.sqlite` in the data folder and
empties it (the last cell puts the variable back).""",
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
        """## The cases and the settings

Eight questions about four cities, each with the tool a right answer calls. The two system prompts: the
baseline's neutral one, and one that asks for brevity (the demo model never saw either in training). Each
dialog is one **item**: a dialog's turns are the item's rows, and the item is the dialog *without* the system
message, so the same question under both prompts lines up.""",
    ),
    (
        "code",
        """CITIES = ["Paris", "Tokyo", "Lima", "Oslo"]
QUESTIONS = [("What's the weather in {}?", get_weather), ("What time is it in {}?", get_local_time),
             ("How many people live in {}?", get_population), ("Is it raining in {}?", get_weather),
             ("Local time in {}, please.", get_local_time), ("Population of {}?", get_population),
             ("Weather report for {}.", get_weather), ("What's the time in {} right now?", get_local_time)]
CASES = [(question.format(city), tool, city) for question, tool in QUESTIONS for city in CITIES]
TOOLS = [get_weather, get_local_time, get_population]
SYSTEMS = {"plain": "You are a helpful assistant.",
           "brief": "Answer in as few words as possible."}
SETTINGS = dict(max_turns=3, max_tokens=48, temperature=0.0)


def dialogs(system):
    return [[{"role": "system", "content": SYSTEMS[system]}, {"role": "user", "content": q}] for q, _, _ in CASES]


print(len(CASES), "cases;", len(SYSTEMS), "system prompts x 2 quantization modes = 4 runs")""",
        CHECK,
    ),
    (
        "md",
        """## A run killed half-way, resumed from the store

The baseline run (plain prompt, unquantized) starts in a **child process**, which is killed with SIGKILL — no
clean-up, no chance to save anything — as soon as a few turns are on disk. Rows are written the moment they
finish, so the kill loses only the rows still running; the same call here computes only the rest.""",
    ),
    (
        "code",
        '''CHILD = """
import json, os, sys
import workbench as wb
from workbench import tools
from workbench.demo.tools import get_local_time, get_population, get_weather
engine = wb.load(os.environ.get("WORKBENCH_NOTEBOOK_CHECKPOINT"), max_batch_size=16, max_seq_len=1024)
dialogs, settings = json.load(open(sys.argv[1]))
tools.run_batch(engine, dialogs, [get_weather, get_local_time, get_population], run="plain-none", **settings)
"""
with tempfile.TemporaryDirectory() as folder:
    script, arguments = Path(folder) / "child.py", Path(folder) / "dialogs.json"
    script.write_text(CHILD)
    arguments.write_text(json.dumps([dialogs("plain"), SETTINGS]))
    child = subprocess.Popen([sys.executable, str(script), str(arguments)], env=dict(os.environ),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = wb.runs.store()
    while child.poll() is None and ("plain-none" not in store.run_names() or len(wb.runs.rows("plain-none")) < 8):
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
stored_by_child = len(wb.runs.rows("plain-none"))
print(f"child killed by signal {-child.returncode}; {stored_by_child} turns were already stored")''',
        IGNORE,
    ),
    (
        "code",
        """start = time.perf_counter()
baseline = tools.run_batch(engine, dialogs("plain"), TOOLS, run="plain-none", **SETTINGS)
rows = wb.runs.rows("plain-none")
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

The brief prompt unquantized, then both prompts with the experts in int4 (`int4_mixed`). The quantization is
put back to none at once, and checked at the end.""",
    ),
    (
        "code",
        """transcripts = {"plain-none": baseline}
transcripts["brief-none"] = tools.run_batch(engine, dialogs("brief"), TOOLS, run="brief-none", **SETTINGS)
engine.set_quantization("int4_mixed")
try:
    for system in SYSTEMS:
        transcripts[f"{system}-int4"] = tools.run_batch(engine, dialogs(system), TOOLS, run=f"{system}-int4",
                                                        **SETTINGS)
finally:
    engine.set_quantization(None)
RUNS = list(transcripts)
wb.runs.table()[["run", "rows", "items"]]""",
        IGNORE,
    ),
    (
        "md",
        """## What differs between two runs

`wb.runs.settings(name)` holds a run's load settings, checkpoint identity and call settings (system prompt,
tools by name and schema hash, tool format, sampling); `wb.runs.diff_settings(a, b)` keeps what differs:""",
    ),
    (
        "code",
        """for other in RUNS[1:]:
    print(other, "vs plain-none:", {k: v for k, v in wb.runs.diff_settings("plain-none", other).items()})""",
        IGNORE,
    ),
    (
        "md",
        """## Scores

A score is a function of a stored row (`item`, `turn`, `output`, `tool_calls`, `stop_reason`, ...):
`wb.runs.score(run, fn)` applies it to every row and stores the result, generating nothing again. Two here,
per item: **right_tool** — the first turn calls the tool the question needs; **restates** — the final answer
contains the value that tool returns for the city (the demo tools' made-up values are fixed by their
arguments, so the right value is known).""",
    ),
    (
        "code",
        """EXPECTED = {question: (tool, city) for question, tool, city in CASES}


def expected_of(row):
    return next(value for question, value in EXPECTED.items() if question in str(row["item"]))


def score(row):
    tool, city = expected_of(row)
    if row["tool_calls"]:  # a turn that calls: did the first call name the right tool?
        return {"right_tool": str(row["tool_calls"]).startswith(tool.__name__ + "(")} if row["turn"] == 0 else {}
    return {"restates": tool(city) in str(row["output"])}  # the final answer: the right value in it


for name in RUNS:
    wb.runs.score(name, score)
wb.runs.rows("brief-int4")[["item", "turn", "tool_calls", "output", "right_tool", "restates"]].head(6)""",
        IGNORE,
    ),
    (
        "md",
        """## Is the difference real?

`wb.runs.summary(runs, baseline=)`: per run and score, the mean with its 95 % interval; against the baseline,
the difference over the items both runs answered with its paired 95 % interval, the p-value (McNemar's exact
test: only the items that changed count), and how many items improved and regressed. Where the interval covers
0, the cases do not show a difference.""",
    ),
    (
        "code",
        """summary = wb.runs.summary(RUNS, baseline="plain-none")
summary.round(3)""",
        IGNORE,
    ),
    ("md", "Every difference, in words — each sentence quotes its interval and says only what the interval supports:"),
    (
        "code",
        """for row in summary[summary["run"] != "plain-none"].itertuples():
    verdict = ("higher" if row.diff_low > 0 else "lower") if row.shown else "not shown to differ"
    print(f"{row.run:<11} {row.score:<10} {row.diff:+.3f} [{row.diff_low:+.3f}, {row.diff_high:+.3f}] vs plain-none, "
          f"p = {row.p_value:.3g} ({row.improved:.0f} improved, {row.regressed:.0f} regressed): {verdict}")""",
        IGNORE,
    ),
    (
        "md",
        """With 32 items, a difference of a few items is rarely shown: the interval says how large a change these
cases could still hide. More cases narrow it.

## Item by item

`wb.runs.compare(a, b)` pairs the items (both transcripts, same or not, the first differing token and both texts
from where they part, each score in both runs and whether the item improved, regressed or stayed), regressions
first:""",
    ),
    (
        "code",
        """pairs = wb.runs.compare("plain-none", "brief-none")
print(pairs.attrs["counts"])
pairs[["item", "same", "first_diff", "diff_a", "diff_b", "right_tool_change", "restates_change"]].head(6)""",
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
        """wb.runs.tag("plain-none", "baseline")
wb.runs.note("brief-none", "system prompt asks for brevity")
wb.runs.view(*RUNS, baseline="plain-none")""",
        IGNORE,
    ),
    (
        "md",
        """## A report to attach

`wb.runs.report(runs, "report.html")` writes the same summary, the differing settings and the changed items
(both outputs, differences marked) into one HTML file with everything inline — no script, style sheet or font
to fetch, so it opens offline, attached to a paper, a pull request or a message. Here it goes to the data
folder; the command line writes the same file (`python -m workbench runs report plain-none brief-none -o
report.html`).""",
    ),
    (
        "code",
        """report = wb.runs.report(RUNS, data_dir() / "notebook-08-report.html", baseline="plain-none")
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
        """before = wb.runs.rows("brief-none")
again = tools.run_batch(engine, dialogs("brief"), TOOLS, run="brief-none", refresh=True, progress=False, **SETTINGS)
after = wb.runs.rows("brief-none")
print("recomputed every turn:", bool(after["stored_at"].min() > before["stored_at"].max()),
      "| the same transcripts:", messages(again) == messages(transcripts["brief-none"]))""",
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

- The same from a shell: `python -m workbench runs ls`, `runs diff plain-none brief-none`, `runs summary
  plain-none brief-none plain-int4`, `runs report ... -o report.html` (`--store` names the file).
- `docs/run-store.md`: items, settings, scores, the statistics, the viewer and the report.
- `02_tool_experiments.ipynb`: the tool-calling evals that store their scores with `run=`;
  `04_quantization.ipynb`: what int4 does to memory and speed.""",
    ),
]
