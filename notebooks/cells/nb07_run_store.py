"""The cells of 07_run_store.ipynb: remembering results with run=."""

from __future__ import annotations

from cells.common import CHECK, IGNORE, LAB, LOAD

RUN_STORE = [
    LAB,
    (
        "md",
        """# Remembering results: the run store

Give a call a run name (`run="sweep"`) and every row is written to disk the moment it finishes. Run the cell
again — after a restart, to add a plot, after the kernel died at 80 % — and the rows already stored come back
from disk; only the others are computed, and the result equals an uninterrupted run. Every row also records
where it came from: the checkpoint's content hash, the load settings, the seed, workbench's version. This
notebook runs a tool-calling sweep with `run=`, runs it again from the store, stops a call half-way and
resumes it, compares two quantization modes row by row, and browses and exports what was stored. About half
a minute on a 2-core CPU.""",
    ),
    (
        "code",
        LOAD
        + """
import time
from workbench.demo.tools import get_local_time, get_population, get_weather

engine = wb.load(CHECKPOINT, max_batch_size=16, max_seq_len=1024)
engine  # the card's last line names the run store file""",
        IGNORE,
    ),
    (
        "md",
        """The store is one SQLite file: `$WORKBENCH_STORE`, else `runs.sqlite` in workbench's data folder
(`~/.local/share/workbench`, or `$WORKBENCH_DATA_DIR`); `wb.runs.path()` says which. A store answers a request
from any run that holds it, so a notebook that shows rows being *computed* needs a store of its own: this one
points `$WORKBENCH_STORE` at `notebook-07.sqlite` in the data folder — a file only this notebook writes — and
empties it first, so every run of it computes its rows afresh, and none of your runs is touched; the last cell
puts the variable back as it was, so later work in this kernel goes to your own store. Your own work needs none
of this.""",
    ),
    (
        "code",
        """from workbench.places import data_dir
from workbench.reports import short_path

previous_store = os.environ.get("WORKBENCH_STORE")  # put back in the last cell
os.environ["WORKBENCH_STORE"] = str(data_dir() / "notebook-07.sqlite")
store = wb.runs.store()
for name in store.run_names():
    wb.runs.delete(name)
print("run store:", short_path(wb.runs.path()))""",
        IGNORE,
    ),
    (
        "md",
        """## A sweep with `run=`

Thirty-two tool dialogs (four cities, eight questions), one batch. `run="nb07-sweep"` is the only change to the
call:""",
    ),
    (
        "code",
        """CITIES = ["Paris", "Tokyo", "Lima", "Oslo"]
QUESTIONS = ["What's the weather in {}?", "What time is it in {}?", "How many people live in {}?",
             "Is it raining in {}?", "Local time in {}, please.", "Population of {}?", "Weather report for {}.",
             "What's the time in {} right now?"]
dialogs = [[{"role": "user", "content": q.format(c)}] for q in QUESTIONS for c in CITIES]
TOOLS = [get_weather, get_local_time, get_population]

start = time.perf_counter()
replies = engine.batch_chat_completion(dialogs, tools=TOOLS, max_tokens=48, run="nb07-sweep")
computed_s = time.perf_counter() - start
print(f"{len(replies)} replies in {computed_s:.1f} s; {sum(r.cached for r in replies)} came from the store")""",
        IGNORE,
    ),
    ("md", "The same cell again: every reply comes from the store."),
    (
        "code",
        """start = time.perf_counter()
again = engine.batch_chat_completion(dialogs, tools=TOOLS, max_tokens=48, run="nb07-sweep")
stored_s = time.perf_counter() - start
print(f"{stored_s:.3f} s instead of {computed_s:.1f} s ({100 * stored_s / computed_s:.1f} %)")""",
        IGNORE,
    ),
    (
        "code",
        """print(f"{sum(r.cached for r in again)} of {len(again)} replies from the store; equal to the first run: "
      f"{again == replies}")""",
        CHECK,
    ),
    (
        "md",
        """## A call stopped half-way

Rows are written as they finish, so a call that dies — Ctrl-C, an exception, a killed kernel — loses only
the rows still running. Here a watcher presses Stop (`engine.cancel()`) as soon as twelve rows of a longer
sweep (the same questions about more cities) are on disk; the re-run computes only what was missing:""",
    ),
    (
        "code",
        '''import threading

more = [[{"role": "user", "content": q.format(c)}] for q in QUESTIONS
        for c in ["Cairo", "Rome", "Quito", "Hanoi", "Berlin", "Madrid"]]


def stop_when_stored(run: str, rows: int) -> None:
    """Press Stop once ``rows`` rows of ``run`` are in the store (read from disk, as another process would)."""
    while run not in store.run_names() or sum(1 for _ in store.rows(run)) < rows:
        time.sleep(0.05)
    engine.cancel()


watcher = threading.Thread(target=stop_when_stored, args=("nb07-interrupted", 12), daemon=True)
watcher.start()
try:
    engine.batch_chat_completion(more, tools=TOOLS, max_tokens=48, run="nb07-interrupted")
except wb.errors.GenerationCancelled:
    print("stopped;", len(wb.runs.rows("nb07-interrupted")), "of", len(more), "rows were already stored")
watcher.join()
resumed = engine.batch_chat_completion(more, tools=TOOLS, max_tokens=48, run="nb07-interrupted")
print(f"re-run: {sum(r.cached for r in resumed)} rows from the store, "
      f"{sum(not r.cached for r in resumed)} computed")''',
        IGNORE,
    ),
    (
        "code",
        """print("the resumed call equals one that was never stopped:",
      resumed == engine.batch_chat_completion(more, tools=TOOLS, max_tokens=48, progress=False))""",
        CHECK,
    ),
    (
        "md",
        """## Two quantization modes, row by row

The key of a stored row holds the load settings that change numbers (dtype, quantization, model-parallel size,
device type) and the checkpoint's content, so the same requests under `int4_mixed` are computed, not taken
from the unquantized run. `wb.runs.compare(..., by="request")` pairs the two runs' rows by identical request
and shows where the outputs differ (`by="item"`, the default, pairs items across changed settings: notebook 08) (here, on calls this short, the demo model's int4 experts write the same calls as the unquantized
model; `first_differing_token` says where a reply parts when one does):""",
    ),
    (
        "code",
        """engine.set_quantization("int4_mixed")
int4 = engine.batch_chat_completion(dialogs, tools=TOOLS, max_tokens=48, run="nb07-sweep-int4")
engine.set_quantization(None)
print("computed under int4_mixed:", sum(not r.cached for r in int4), "of", len(int4))
# by request: the same prompt ids and sampling; differing_only=False keeps the rows whose outputs agree too
pairs = wb.runs.compare("nb07-sweep", "nb07-sweep-int4", by="request", differing_only=False)
print(f"{pairs.attrs['both']} requests in both runs, {pairs.attrs['differ']} with different outputs")
pairs[["prompt", "same", "a_tool_calls", "b_tool_calls", "first_differing_token"]].head(8)""",
        IGNORE,
    ),
    (
        "md",
        """## Browsing what was stored

`wb.runs.table()`: one row per run, with the provenance of its latest session. `wb.runs.rows(name)`: one row
per stored result — the prompt, the output, tool calls flattened, the seed, whether it was computed by this run
— with columns that say where it came from (`checkpoint_identity`, `quantization`, `workbench_version`...).""",
    ),
    (
        "code",
        """wb.runs.table()[["run", "rows", "computed", "model", "quantization", "dtype", "workbench_version"]]""",
        IGNORE,
    ),
    (
        "code",
        """rows = wb.runs.rows("nb07-sweep")
rows[["prompt", "tool_calls", "stop_reason", "generated_tokens", "seed", "computed", "quantization",
      "checkpoint_identity"]].head(6)""",
        IGNORE,
    ),
    (
        "md",
        """A sampled row without a seed runs with a seed drawn for it, and the row records it: running the cell
again answers the same samples from the store, and `seed=` replays any one of them exactly.""",
    ),
    (
        "code",
        """samples = engine.batch_chat_completion(dialogs[:4], tools=TOOLS, max_tokens=48, temperature=1.0,
                                      run="nb07-sampled", progress=False)
first = next(store.rows("nb07-sampled"))
replayed = engine.chat_completion(first.request["messages"], tools=TOOLS, max_tokens=48, temperature=1.0,
                                  seed=first.seed)
print("seed drawn and recorded:", first.seed_drawn, "| replayed from it:", replayed == first.output)""",
        CHECK,
    ),
    (
        "md",
        """## Exporting

`wb.runs.export(name, path)` writes every field of every row — the request as given, the prompt ids, the
sampling it ran with, the exact result, the provenance — as JSON Lines (`.jsonl`) or Parquet (`.parquet`,
with pyarrow); `wb.runs.decode` turns an exported `result` back into the object the call returned.
`wb.runs.to_inspect(name, "sweep.eval")` (the `evals` extra) writes an Inspect log that `inspect view` browses.""",
    ),
    (
        "code",
        """import json
import tempfile
from pathlib import Path

with tempfile.TemporaryDirectory() as folder:
    path = wb.runs.export("nb07-sweep", Path(folder) / "sweep.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
print(len(lines), "lines (in the order the rows finished); each with", ", ".join(sorted(lines[0])[:6]), "...")
decoded = {line["prompt"]: wb.runs.decode(line["result"]) for line in lines}
print("the stored results decode to the replies the call returned:",
      [decoded[dialog[0]["content"]] for dialog in dialogs] == replies)""",
        CHECK,
    ),
    ("md", "## Putting the environment back\n\nThe store variable as it was before this notebook:"),
    (
        "code",
        """if previous_store is None:
    os.environ.pop("WORKBENCH_STORE", None)
else:
    os.environ["WORKBENCH_STORE"] = previous_store
print("WORKBENCH_STORE restored:", os.environ.get("WORKBENCH_STORE") == previous_store)""",
        CHECK,
    ),
    (
        "md",
        """## Where to go next

- Every integration takes `run=`: the tool loop (`wb.tools.run_batch(..., run=)`: each turn is stored, so a
  loop that died at turn 3 resumes at turn 3), `workbench.evals.run_cases`, `bfcl.run`, lm-eval's
  `--model_args ...,run=name`, a Ray pool's batch calls and `wb.serve(engine, run=)`.
- `docs/run-store.md`: what the key holds, the file's tables, what happens when the disk is full or two kernels
  write at once.
- `06_evaluations.ipynb`: the harnesses themselves; `04_quantization.ipynb`: the modes compared here.""",
    ),
]
