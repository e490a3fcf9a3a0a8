"""The cells of 02_tool_experiments.ipynb: multi-turn tool dialogs, the playground, and an experiment on tool
calling: does the demo model get a dialog's second round of calls right as often as its first?"""

from __future__ import annotations

from cells.common import CHECK, IGNORE, LAB, LOAD

# The scorer of the "many dialogs" cell, exactly as the notebook shows it (tests/test_notebook_scorers.py runs it
# on hand-made transcripts).
CHECK_CELL = '''def check(question, expected, transcript):
    """What is wrong with a transcript, in words ("" when nothing is)."""
    calls = [c for m in transcript for c in m.tool_calls]
    if expected is None:
        return f"called {calls[0].tool_name} though no offered tool fits" if calls else ""
    if not calls:
        return f"answered without calling {expected}"
    if calls[0].tool_name != expected:
        return f"called {calls[0].tool_name}, not {expected}"
    values = [str(v) for c in calls for v in c.arguments.values() if isinstance(v, str)]
    miscopied = [v for v in values if v.lower() not in question.lower()]
    if miscopied:
        return f"wrote {miscopied} into the call: not in the question"
    answer = transcript[-1].content
    missing = [r.content for r in transcript if r.role == "tool" and r.content not in answer]
    missing += [v for v in values if v not in answer]
    return f"the answer leaves out {missing}" if missing else ""'''

TOOLS = """from workbench import tools
from workbench.demo.tools import convert_currency, get_capital, get_local_time, get_weather

# Plain Python functions: the demo model was trained to call these (see docs/demo-model.md),
# with one to four of its 14 tools offered at a time, as here.
demo_tools = [get_weather, get_local_time, convert_currency, get_capital]"""

TOOL_EXPERIMENTS = [
    LAB,
    (
        "md",
        """# Multi-turn tool experiments

Tools are plain Python functions: their schema comes from the signature, type hints and docstring.
`tools.run` lets the model call them until it answers, feeding each result back as a tool message.
With no checkpoint, `wb.load()` gives the project's **demo model**, a tiny Llama 4 trained on synthetic
tool dialogs in the official python-list format (model card: `docs/demo-model.md`): it knows the demo
tools in `workbench.demo.tools`, was offered one to four of them at a time, and answers by restating their
results. Those results are **made up**: a hash of the arguments picks them ("29 C and snowy" for Paris,
every run), so transcripts are reproducible and an answer can be checked against its tool's result, but the
values are not real. Where the model goes wrong, this notebook says so and why; its accuracy on questions it
never saw is measured at the end. Under a minute on a 2-core CPU.""",
    ),
    (
        "code",
        "%matplotlib inline\n"
        + LOAD
        + "\nengine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=1024)\n\n"
        + TOOLS
        + "\n\nengine",
        IGNORE,
    ),
    (
        "md",
        """## The playground

Type a question and press **Enter** (Shift+Enter for a new line). Tokens stream in; tool calls and
their results appear as linked cards; each reply has a *prompt* toggle with the exact prompt and its
token count. **Stop** ends generation within one decode step, **Clear** starts over, and the controls
choose the tools, `tool_choice` and sampling. The first question below was sent from code.""",
    ),
    (
        "code",
        """from workbench.widgets import ChatPlayground

playground = ChatPlayground(engine, demo_tools, max_tokens=200)
playground.send("What's the weather in Paris?")
playground""",
        IGNORE,
    ),
    ("md", "## The exact prompt\n\nThe tool definitions go into the prompt in the model's official wording:"),
    (
        "code",
        """dialog = [{"role": "user", "content": "What's the weather in Paris? Convert 20 EUR to USD."}]
wb.show_prompt(dialog, tools=demo_tools, engine=engine)""",
        IGNORE,
    ),
    ("md", "Replies are parsed into tool calls — several calls per reply, in every official call syntax:"),
    (
        "code",
        """for reply in [
    '[get_weather(city="Paris"), convert_currency(amount=20, from_currency="EUR", to_currency="USD")]',
    '{"type": "function", "name": "get_weather", "parameters": {"city": "Tokyo"}}',
    '<function=get_local_time>{"city": "Oslo"}</function>',
]:
    message = engine.formatter.decode_assistant(reply)
    print([(c.tool_name, c.arguments) for c in message.tool_calls])""",
        CHECK,
    ),
    (
        "md",
        """## One dialog through the tool loop

Each turn is one chat completion. The transcript displays as cards: every call is numbered and its
result says which call it answers.""",
    ),
    (
        "code",
        """transcript = tools.run(engine, dialog, tools=demo_tools, max_turns=3, max_tokens=64)
transcript""",
        IGNORE,
    ),
    ("md", "The same transcript as text (greedy decoding, so it is reproducible: CI compares it):"),
    (
        "code",
        """def show(transcript):
    for message in transcript:
        calls = [(c.tool_name, c.arguments) for c in message.tool_calls]
        print(f"{message.role:>9}: {message.content!r}" + (f" calls={calls}" if calls else ""))


show(transcript)""",
        CHECK,
    ),
    ("md", "A second question in the same dialog: the model sees the whole first exchange."),
    (
        "code",
        """follow_up = list(transcript) + [{"role": "user", "content": "What time is it in Paris?"}]
second = tools.run(engine, follow_up, tools=demo_tools, max_tokens=64)
show(second[len(transcript):])""",
        CHECK,
    ),
    ("md", "### Turn by turn: the prompt, its tokens and the parsed calls of every reply"),
    (
        "code",
        """from IPython.display import display

for i, message in enumerate(transcript):
    if message.role != "assistant":
        continue
    view = wb.show_prompt(transcript[:i], tools=demo_tools, engine=engine)
    calls = [(c.tool_name, c.arguments) for c in message.tool_calls]
    print(f"reply {i}: {len(view)} prompt tokens -> {message.content!r} calls={calls} ({message.stop_reason})")
    display(view)""",
        IGNORE,
    ),
    (
        "md",
        """## Many dialogs at once

Each turn is batched across the dialogs still running. Below, questions the model should answer with a
call (the tool it needs is offered), one whose tool is not offered, and one no tool answers. Each transcript
is checked against what a right answer needs: the expected tool, every argument value copied from the
question, and the answer restating the tool's result with those values.""",
    ),
    (
        "code",
        """asked = [  # (question, the tool a right answer calls; None: no offered tool fits, answer directly)
    ("What's the weather in Tokyo?", "get_weather"), ("What time is it in Berlin?", "get_local_time"),
    ("What is the capital of Norway?", "get_capital"), ("What's the weather in Lima?", "get_weather"),
    ("Convert 250 EUR to JPY.", "convert_currency"), ("What time is it in Pune?", "get_local_time"),
    ("How many people live in Peru?", None), ("Tell me a story about dragons.", None),
]
dialogs = [[{"role": "user", "content": q}] for q, _ in asked]
transcripts = tools.run_batch(engine, dialogs, tools=demo_tools, max_turns=3, max_tokens=64)
wb.to_frame(transcripts)[["dialog", "role", "content", "tool_calls", "dialog_ended"]]""",
        IGNORE,
    ),
    (
        "code",
        CHECK_CELL
        + """


for (question, expected), transcript in zip(asked, transcripts):
    problem = check(question, expected, transcript)
    print(f"{'✗' if problem else '✓'} {question:<34} {transcript[-1].content!r}" + (f"\\n    {problem}" if problem else ""))""",
        CHECK,
    ),
    (
        "md",
        """**Where it goes wrong, and why.** The failures are values the demo model never saw in training: *Lima*
and *JPY* are in its held-out value pools and *Pune* in none (`docs/demo-model.md`: every value pool is split
3:1 so that these questions test copying, not memory). An 82M-parameter model trained for minutes copies an
unseen value into a call, or from the call into its answer, only part of the time — so a call can be right
and the answer still name another city. It was also trained to decline when no offered tool fits, and does.
The rates below measure this on 25 held-out cases.""",
    ),
    (
        "md",
        """## When a call is malformed

A reply that cannot be parsed keeps its text and says why in `parse_error`; a call to an unknown tool or
with bad arguments becomes a tool message the model can read — the loop never crashes.""",
    ),
    (
        "code",
        """broken = engine.formatter.decode_assistant("[get_weather(city=Paris)]")  # a bare name, not a string
print("calls:", broken.tool_calls, "| parse_error:", broken.parse_error)
toolbox = tools.Toolbox.create([get_weather])
print(toolbox.execute(wb.ToolCall("get_wether", {"city": "Paris"})).content)
print(toolbox.execute(wb.ToolCall("get_weather", {"town": "Paris"})).content)""",
        CHECK,
    ),
    (
        "md",
        """## An experiment: does a second round cost the model?

**Hypothesis.** In a two-round dialog — a question, its call, the answer, then a follow-up that needs a call
of its own — the demo model gets the *second* round right less often than the first: its prompt is longer and
holds a finished exchange the model must neither repeat nor copy from. The test pairs the two rounds of each
two-round case (McNemar's exact test over the cases where one round is right and the other not).

**Cases.** `workbench.evals` runs cases from a documented JSONL format — the file below is the one to copy for
your own (one JSON object per line: `id`, `kind`, `tools`, and `turns`, each with the user's text and the
calls it expects) — here 30 held-out two-round cases (phrasings and values the model never saw) and 10 of each
other kind, batched through the engine, each dialog with its own one to four tools, as in training. Every case is
scored with the names `wb.runs` stores them under: `exact_match` (every call's name and arguments),
`name_match`, `arg_names_from_schema`, `answer_has_result` (the final answer restates each tool result) and,
for cases that need no tool, `direct_answer`. **Settings**: the baseline, a system prompt the model never saw,
int4, and temperature 0.7 — a sampled setting is one draw per case, so it runs with three seeds. About a
minute on a 2-core CPU. (Llama 4 takes custom tools in the python-list format only; on a Llama 3.1
checkpoint `{"tool_prompt_format": "json"}` and `"function_tag"` compare the call syntaxes the same way.)""",
    ),
    (
        "code",
        """import json
import tempfile
from pathlib import Path

import pandas as pd
from workbench import evals
from workbench.places import data_dir
from workbench.runs import stats

previous_store = os.environ.get("WORKBENCH_STORE")  # this notebook's own run store (put back below)
os.environ["WORKBENCH_STORE"] = str(data_dir() / "notebook-02.sqlite")
for name in wb.runs.store().run_names():
    wb.runs.delete(name)

drawn = (evals.synthetic_cases(30, split="heldout", seed=7, kinds=["two_round"])
         + evals.synthetic_cases(40, split="heldout", seed=8, kinds=["single", "double", "no_tool", "small_talk"]))
with tempfile.TemporaryDirectory() as folder:  # the JSONL format your own cases use: written, then read back
    path = evals.save_cases(drawn, Path(folder) / "cases.jsonl")
    print(path.read_text().splitlines()[0])
    cases = evals.load_cases(path)
print(len(cases), "cases:", pd.Series([c.kind for c in cases]).value_counts().to_dict())""",
        IGNORE,
    ),
    (
        "code",
        """settings = {"baseline": {}, "answer-briefly": {"system_prompt": ("answer briefly", "Answer briefly.")},
            "int4": {"quantization": "int4_mixed"}}
# each setting its own stored run (run=): the case ids are its items, the scores are stored on them
frames = [evals.compare(engine, cases, [setting], run=name).assign(run=name) for name, setting in settings.items()]
frames += [evals.compare(engine, cases, [{"temperature": 0.7}], seed=seed, run=f"temperature-0.7-seed-{seed}")
           .assign(run=f"temperature-0.7-seed-{seed}") for seed in (1, 2, 3)]
results = pd.concat(frames, ignore_index=True)
summary = evals.summarize(results, by=["run"])
evals.rate_table(summary, by="run", metrics=["exact_match", "name_match", "answer_has_result", "direct_answer"])""",
        IGNORE,
    ),
    (
        "md",
        """**Round by round.** A two-round case's `exact_match` needs both rounds right; the cell below scores each
round on its own (the calls it expected against the calls made in that round) and pairs the rounds of every
case:""",
    ),
    (
        "code",
        """def rounds_right(row):
    \"\"\"Per round of a case: were its calls exactly the expected ones (names and arguments, in any order)?\"\"\"
    expected, made = json.loads(row.expected_calls), json.loads(row.calls_made)
    made += [[]] * (len(expected) - len(made))  # a round never reached made no call
    return [sorted(e) == sorted(m) for e, m in zip(expected, made)]


for run, frame in results[results["kind"] == "two_round"].groupby("run", sort=False):
    pairs = [rounds_right(row) for row in frame.itertuples()]
    agree = sum(all(p) == bool(x) for p, x in zip(pairs, frame["exact_match"]))  # both rounds right = exact_match
    first, second = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    only_first, only_second = sum(p[0] and not p[1] for p in pairs), sum(p[1] and not p[0] for p in pairs)
    both = sum(p[0] and p[1] for p in pairs)
    diff, low, high = stats.paired_rate_difference(both, only_first, only_second, len(pairs) - both - only_first
                                                   - only_second)
    p_value = stats.mcnemar_exact(only_second, only_first)
    verdict = ("higher" if diff > 0 else "lower") if (low > 0 or high < 0) and p_value < 0.05 else "not shown to differ"
    print(f"{run:<22} round 1 {first}/{len(pairs)}, round 2 {second}/{len(pairs)}: round 2 - round 1 "
          f"{diff:+.2f} [{low:+.2f}, {high:+.2f}], p = {p_value:.2g}: {verdict} (rounds agree with exact_match on "
          f"{agree}/{len(pairs)} cases)")""",
        IGNORE,
    ),
    (
        "md",
        """**What the rounds show.** On the demo model the hypothesis does not hold: in every run the *second* round
is right at least as often as the first (16 of 30 against 11 of 30 in the baseline), and 30 cases do not show a
difference either way. The first-round misses in the table at the end (`calls_made` against `expected_calls`)
are a call not made at all, a value miscopied from the question, or a neighbouring tool (`convert_currency` for
`convert_units`).

**Per case kind** (the baseline): the rates of each kind with their own n, so the two-round cases' rate
stands beside the others' instead of pulling the pooled one down:""",
    ),
    (
        "code",
        """by_kind = evals.summarize(results[results["run"] == "baseline"], by=["kind"])
evals.rate_table(by_kind, by="kind", metrics=["exact_match", "name_match", "answer_has_result", "direct_answer"])""",
        IGNORE,
    ),
    (
        "code",
        """from matplotlib.figure import Figure

figure = Figure(figsize=(12, 4))  # every rate of every run, the ones that moved included
evals.plot_summary(summary, by="run", ax=figure.subplots(),
                   metrics=["exact_match", "name_match", "arg_names_from_schema", "answer_has_result", "direct_answer"])""",
        IGNORE,
    ),
    (
        "md",
        """**The settings against the baseline.** Every setting ran the same cases, so each compares with the
baseline case by case: `wb.runs.summary` gives the paired difference with its 95 % interval, McNemar's exact
p-value (only the cases that changed count) and how many cases improved and regressed. The three seeds of the
sampled setting are three runs: a difference that shows under one seed and not the others is the draw, not the
setting. With 5 settings × 5 scores, some 25 differences are tested, so one interval in twenty excluding 0 by
chance is expected; each line says what its own interval supports:""",
    ),
    (
        "code",
        """paired = wb.runs.summary(list(results["run"].unique()), baseline="baseline")  # every stored score
for row in paired[paired["run"] != "baseline"].itertuples():
    verdict = ("higher" if row.diff_low > 0 else "lower") if row.shown else "not shown to differ"
    print(f"{row.run:<24} {row.score:<21} {row.diff:+.2f} [{row.diff_low:+.2f}, {row.diff_high:+.2f}], "
          f"p = {row.p_value:.2g} ({row.improved:.0f} improved, {row.regressed:.0f} regressed): {verdict}")
if previous_store is None:
    os.environ.pop("WORKBENCH_STORE", None)
else:
    os.environ["WORKBENCH_STORE"] = previous_store""",
        IGNORE,
    ),
    (
        "md",
        """`answer_has_result` asks only that the answer restate each tool result: "The weather in tiger is 0 C and
windy." after a right call for Lima passes it. The `check` above (the call's values in the answer too) fails
it; with `wb.runs.score(run, fn)` any such stricter score can be stored on these runs and compared the same way
(`08_experiments.ipynb`). To tell settings apart, run more cases (`python -m workbench.evals --cases 200`): the
intervals narrow with the number of cases. The demo model's accuracy on its held-out split is in
`docs/demo-model.md`.

One row per case: what was expected and what the model did (the baseline).""",
    ),
    (
        "code",
        """columns = ["kind", "expected_calls", "calls_made", "exact_match", "answer_has_result", "direct_answer"]
results[results["run"] == "baseline"][columns].head(10)""",
        IGNORE,
    ),
    (
        "md",
        """## Where to go next

- `04_quantization.ipynb`: what each quantization mode does to memory, speed and these tool dialogs.
- `06_evaluations.ipynb`: lm-evaluation-harness, BFCL and Inspect on the same engine.
- `python -m workbench.evals --help`: the same measurements from a shell, with more cases and settings.""",
    ),
]
