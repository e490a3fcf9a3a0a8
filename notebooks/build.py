"""Writes the notebooks from the cell lists below, runs them, and stores their outputs (with widget state).

    python notebooks/build.py            # write and execute all of them
    python notebooks/build.py 02 03      # only some

Cells are tagged for nbval (``nbval-check-output``: deterministic, compared in CI;
``nbval-ignore-output``: depends on the model or the machine), so the code a reader copies carries no
test comments.  Execution metadata (timings) is stripped; the state of the widgets a stored output shows is
saved so that they render from the stored notebook (closed progress bars' leftovers are dropped), and every
widget also carries a text/HTML fallback.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
CHECK, IGNORE = "nbval-check-output", "nbval-ignore-output"

def requires(extra: str, why: str) -> tuple:
    """The first cell of every notebook: which extra it needs (one pip line) and the check that ends a run
    without it at this cell, with that line (wb.require raises MissingExtraError, shown as one line)."""
    from workbench.notebook.extras import EXTRAS

    return ("code", f'''# {why}
#   {EXTRAS[extra][1]}
import workbench as wb

wb.require("{extra}")''')


LAB = requires("lab", "Needs the lab extra, which the README quick start's first command installs:")

LOAD = '''import os

# None -> the embedded default model; set WORKBENCH_NOTEBOOK_CHECKPOINT to a Meta checkpoint folder
# (or a checkpoints.toml name) to run these cells on a real model.
CHECKPOINT = os.environ.get("WORKBENCH_NOTEBOOK_CHECKPOINT")'''

QUICKSTART = [
    LAB,
    ("md", """# workbench quick start

Load a model once per kernel, then run the batch APIs. With no checkpoint, `wb.load()` uses the
**embedded default**: the project's demo model, a tiny Llama 4 (MoE, NoPE and chunked-attention layers,
the real 202k vocabulary) trained to **call tools** in the official python-list format and to answer from
their results (`docs/demo-model.md`). It is a tool-calling demo, not a language model: it shows every
code path of a real Llama working — prompts, calls, batching, scoring — on a laptop CPU. Point
`WORKBENCH_NOTEBOOK_CHECKPOINT` at a Meta checkpoint folder to run the same cells on a real model.
This notebook takes under half a minute on a 2-core CPU."""),
    ("code", LOAD + '''
engine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=1024)
engine''', IGNORE),
    ("md", "Re-running `wb.load` with the same arguments never loads twice: the engine is a kernel-resident "
           "singleton."),
    ("code", "print(wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=1024) is engine, wb.current() is engine)",
     CHECK),
    ("md", """## A chat turn with a tool

Tools are plain Python functions: the schema comes from the signature, type hints and docstring. The
reply is parsed into `tool_calls` (name + arguments); press Shift+Tab inside the parentheses to see
every option with its default. The demo model was trained with one to four tools offered at a time;
here it gets four. The demo tools return **made-up values**: a hash of the arguments picks them, so the
same call always gets the same result (Paris is always "29 C and snowy") — reproducible, and checkable
in the model's answer, but not real weather, times, rates or populations."""),
    ("code", '''from workbench import tools
from workbench.demo.tools import convert_currency, get_capital, get_local_time, get_weather

demo_tools = [get_weather, get_local_time, convert_currency, get_capital]
dialog = [{"role": "user", "content": "What's the weather in Paris?"}]
reply = engine.chat_completion(dialog, tools=demo_tools, max_tokens=64)
reply''', IGNORE),
    ("code", "print([(call.tool_name, call.arguments) for call in reply.message.tool_calls], reply.stop_reason)",
     CHECK),
    ("md", """## The exact prompt

`wb.show_prompt` shows the prompt the model sees, in its official format: the tool definitions in
Meta's wording, special tokens highlighted, tokens per message, and a token-by-token view. It works
without a loaded model too, given a model id (`model="Llama3.2-3B-Instruct"`)."""),
    ("code", "wb.show_prompt(dialog, tools=demo_tools, engine=engine)", IGNORE),
    ("md", """## The tool loop

`tools.run` runs every call the model makes, feeds the result back as a tool message and lets the
model go on until it answers. The transcript shows each call and the result that answers it, and why
the loop ended (`stop_reason`: `answered`, `max_turns`, `prompt_too_long`, `out_of_tokens`)."""),
    ("code", '''transcript = tools.run(engine, dialog, tools=demo_tools, max_tokens=64)
transcript''', IGNORE),
    ("code", 'print(transcript.stop_reason, "-", transcript[-1].content)', CHECK),
    ("md", """## A batch of dialogs

`tools.run_batch` runs many dialogs at once: each turn is one batched chat completion over the dialogs
still running, and every transcript is exactly what its dialog gives alone (greedy), so batching is
purely a speed choice. `wb.to_frame` turns transcripts (or results) into a DataFrame. Long batches show
a progress bar that leaves a one-line summary when the call is done."""),
    ("code", '''questions = ["What time is it in Tokyo?", "Convert 20 EUR to USD.", "What is the capital of Norway?",
             "What's the weather in Paris? Convert 20 EUR to USD."]
dialogs = [[{"role": "user", "content": q}] for q in questions]
transcripts = tools.run_batch(engine, dialogs, tools=demo_tools, max_tokens=64)
wb.to_frame(transcripts)[["dialog", "role", "content", "tool_calls", "dialog_ended"]]''', IGNORE),
    ("code", '''alone = [tools.run(engine, d, tools=demo_tools, max_tokens=64) for d in dialogs]
same = all([(m.role, m.content) for m in a] == [(m.role, m.content) for m in b] for a, b in zip(transcripts, alone))
print("batched transcripts identical to single runs:", same)''', CHECK),
    ("md", """## Scoring with `logits`

`engine.logits` returns teacher-forced float32 `[len, vocab]` logits per sequence, so any continuation
can be scored: here, how much the model prefers each candidate call for the question (the prompt is
the exact chat prompt `engine.formatter.encode_dialog` renders, tools included)."""),
    ("code", '''import torch

prompt = engine.formatter.encode_dialog(dialog, tools=demo_tools)


def continuation_logprob(text: str) -> float:
    """log P(text | prompt): the sum over the continuation's tokens."""
    ids = engine.tokenizer.encode(text, bos=False)
    logits = engine.logits([prompt + ids])[0]  # [len, vocab]
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # the positions that predict `ids`
    return float(logprobs.gather(1, torch.tensor(ids)[:, None]).sum())


for call in ['[get_weather(city="Paris")]', '[get_weather(city="Tokyo")]', '[get_local_time(city="Paris")]']:
    logprob = continuation_logprob(call)
    print(f"log P = {logprob:7.3f}  (P = {torch.tensor(logprob).exp():.2e})  {call}")''', IGNORE),
    ("md", """## Sampling and log-probabilities

With `logprobs=k` each token of a result is shaded by its probability (red = unlikely; hover a token
for its top-k alternatives), and `.to_pandas()` gives one row per token. A seed makes sampled rows
reproducible, alone or inside any batch."""),
    ("code", '''scored = engine.chat_completion(dialog, tools=demo_tools, max_tokens=24, logprobs=3)
scored''', IGNORE),
    ("code", "scored.to_pandas().head(6)", IGNORE),
    ("code", '''a = engine.chat_completion(dialog, tools=demo_tools, max_tokens=24, temperature=0.7, top_p=0.9, seed=42)
b = engine.chat_completion(dialog, tools=demo_tools, max_tokens=24, temperature=0.7, top_p=0.9, seed=42)
print("same seed, same tokens:", a.tokens == b.tokens)''', CHECK),
    ("md", """## Streaming and stopping

Chat replies stream as text and tool-call deltas. `engine.cancel()` stops the running call at its next
decode step — from a Stop button, a timer or another thread. The call raises `GenerationCancelled`
carrying what was generated so far, and the engine is unchanged: the next call gives exactly what it
would have."""),
    ("code", '''for item in engine.stream_chat_completion(dialog, tools=demo_tools, max_tokens=64):
    print(type(item).__name__, repr(getattr(item, "text", "")), getattr(item, "tool_call", None) or "")''',
     IGNORE),
    ("code", '''import threading

from workbench.errors import GenerationCancelled

stop = threading.Timer(0.5, engine.cancel)  # "press Stop" half a second in
stop.start()
try:
    engine.batch_completion(["Tell me a story"] * 4, max_tokens=500, progress=False)
    print("the call finished before Stop was pressed")
except GenerationCancelled as stopped:
    rows = [r.tokens for r in stopped.partial]
    shortest = min(len(t) for t in rows)
    print("stopped after", [len(t) for t in rows], "tokens per row;", {r.stop_reason for r in stopped.partial})
    print("the rows agree token for token up to the shortest:", all(t[:shortest] == rows[0][:shortest] for t in rows))
finally:
    stop.cancel()  # a Stop that comes too late must not hit the next call''', IGNORE),
    ("md", """The four rows are the same prompt, decoded greedily, so they are the same tokens; where one row is a token
longer, that is when the Stop landed: a decode step computes every row's next token, the call hands them
over row by row, and the cancel is seen after the first row's token of that step was taken — the others'
tokens of the same step are dropped with the call."""),
    ("code", '''first = engine.chat_completion(dialog, tools=demo_tools, max_tokens=24)
again = engine.chat_completion(dialog, tools=demo_tools, max_tokens=24)
print("same result after a cancel:", first.tokens == again.tokens)''', CHECK),
    ("md", """## Raw completion

`completion` / `batch_completion` continue raw text or token ids (a BOS token is added to strings). This
is where a real checkpoint shines; the demo model learned tool dialogs only, so on free text it writes
word salad — that is expected, not a bug."""),
    ("code", '''batch = engine.batch_completion(["The capital of France is", "def fib(n):"], max_tokens=12)
wb.to_frame(batch)''', IGNORE),
    ("md", "Errors name the problem and the fix, and leave the engine usable:"),
    ("code", '''try:
    engine.completion("hi", temperature=-1)
except wb.WorkbenchError as err:
    print(type(err).__name__, "-", err)
print(len(engine.completion("still works", max_tokens=3).tokens))''', CHECK),
    ("md", """## What is loaded

`info()` and `memory()` display human sizes (the raw numbers are the dict's values); `memory()` says per part
of the model what is stored in which type. The checkpoint is shown from `~`: the demo model is expanded into
`~/.cache/workbench` (or `$WORKBENCH_CACHE`) on first use.

`packed_bytes` is memory beside `weights_bytes`, not in it: on a CPU, an unquantized (float32) model keeps a
second, oneDNN-packed float32 copy of its output matrix, on which batched decode runs 1.2–2× faster
(`ColumnParallel.pack_for_cpu`, `docs/design/model.md`). So the weights here really occupy `weights_bytes` +
`packed_bytes`; bf16 and the quantized modes keep no such copy (`packed_bytes` 0), and
`04_quantization.ipynb` counts it when it compares their memory."""),
    ("code", "engine.info()", IGNORE),
    ("code", '''memory = engine.memory()
print(memory["weights_bytes"], "bytes of weights =", memory.readable()["weights_bytes"])
memory''', IGNORE),
    ("md", """## Images (Llama 4 and Llama 3.2 Vision)

User messages can hold images (PIL images, file paths, bytes) beside text. Llama 4 writes an image's tiles
into the prompt as `<|patch|>` tokens; Llama 3.2 Vision writes one `<|image|>` token per image and reads the
tiles through gated cross-attention layers. The demo model has no vision encoder, so these cells write a
*tiny random* Llama 3.2 Vision checkpoint in Meta's layout (into the workbench cache, once): its answers are
noise, but the shapes, the prompt format and every code path are the real ones. Loading it replaces the demo
engine in this kernel."""),
    ("code", '''from PIL import Image

from workbench.checkpoints.factory import cache_root, write_checkpoint
from workbench.checkpoints.vision32 import TINY_LLAMA32_VISION

folder = cache_root() / "tiny-llama32-vision"
if not (folder / "params.json").exists():
    write_checkpoint(folder, TINY_LLAMA32_VISION)
vision = wb.load(folder, max_seq_len=512)
picture = Image.new("RGB", (320, 180), "steelblue")
image_dialog = [{"role": "user", "content": [picture, "What is in this picture?"]}]
wb.show_prompt(image_dialog, engine=vision)''', IGNORE),
    ("code", '''reply = vision.chat_completion(image_dialog, max_tokens=8)
print(reply.stop_reason, len(reply.tokens), "tokens; vision encoder", vision.info()["vision"])''', IGNORE),
    ("md", """## Where to go next

- `02_tool_experiments.ipynb`: multi-turn tool dialogs, the playground, and measuring tool calling.
- `03_throughput.ipynb` and `04_quantization.ipynb`: speed against batch size, and what each quantization
  mode costs and saves.
- Your own checkpoint: the README's "Your own checkpoint" section (Meta's weights, `checkpoints.toml`, the
  GPU install); then set `WORKBENCH_NOTEBOOK_CHECKPOINT` and run these cells again."""),
]


TOOLS = '''from workbench import tools
from workbench.demo.tools import convert_currency, get_capital, get_local_time, get_weather

# Plain Python functions: the demo model was trained to call these (see docs/demo-model.md),
# with one to four of its 14 tools offered at a time, as here.
demo_tools = [get_weather, get_local_time, convert_currency, get_capital]'''

TOOL_EXPERIMENTS = [
    LAB,
    ("md", """# Multi-turn tool experiments

Tools are plain Python functions: their schema comes from the signature, type hints and docstring.
`tools.run` lets the model call them until it answers, feeding each result back as a tool message.
With no checkpoint, `wb.load()` gives the project's **demo model**, a tiny Llama 4 trained on synthetic
tool dialogs in the official python-list format (model card: `docs/demo-model.md`): it knows the demo
tools in `workbench.demo.tools`, was offered one to four of them at a time, and answers by restating their
results. Those results are **made up**: a hash of the arguments picks them ("29 C and snowy" for Paris,
every run), so transcripts are reproducible and an answer can be checked against its tool's result, but the
values are not real. Where the model goes wrong, this notebook says so and why; its accuracy on questions it
never saw is measured at the end. Under a minute on a 2-core CPU."""),
    ("code", "%matplotlib inline\n" + LOAD + "\nengine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=1024)\n\n"
     + TOOLS + "\n\nengine", IGNORE),
    ("md", """## The playground

Type a question and press **Enter** (Shift+Enter for a new line). Tokens stream in; tool calls and
their results appear as linked cards; each reply has a *prompt* toggle with the exact prompt and its
token count. **Stop** ends generation within one decode step, **Clear** starts over, and the controls
choose the tools, `tool_choice` and sampling. The first question below was sent from code."""),
    ("code", '''from workbench.widgets import ChatPlayground

playground = ChatPlayground(engine, demo_tools, max_tokens=200)
playground.send("What's the weather in Paris?")
playground''', IGNORE),
    ("md", "## The exact prompt\n\nThe tool definitions go into the prompt in the model's official wording:"),
    ("code", '''dialog = [{"role": "user", "content": "What's the weather in Paris? Convert 20 EUR to USD."}]
wb.show_prompt(dialog, tools=demo_tools, engine=engine)''', IGNORE),
    ("md", "Replies are parsed into tool calls — several calls per reply, in every official call syntax:"),
    ("code", '''for reply in [
    '[get_weather(city="Paris"), convert_currency(amount=20, from_currency="EUR", to_currency="USD")]',
    '{"type": "function", "name": "get_weather", "parameters": {"city": "Tokyo"}}',
    '<function=get_local_time>{"city": "Oslo"}</function>',
]:
    message = engine.formatter.decode_assistant(reply)
    print([(c.tool_name, c.arguments) for c in message.tool_calls])''', CHECK),
    ("md", """## One dialog through the tool loop

Each turn is one chat completion. The transcript displays as cards: every call is numbered and its
result says which call it answers."""),
    ("code", '''transcript = tools.run(engine, dialog, tools=demo_tools, max_turns=3, max_tokens=64)
transcript''', IGNORE),
    ("md", "The same transcript as text (greedy decoding, so it is reproducible: CI compares it):"),
    ("code", '''def show(transcript):
    for message in transcript:
        calls = [(c.tool_name, c.arguments) for c in message.tool_calls]
        print(f"{message.role:>9}: {message.content!r}" + (f" calls={calls}" if calls else ""))


show(transcript)''', CHECK),
    ("md", "A second question in the same dialog: the model sees the whole first exchange."),
    ("code", '''follow_up = list(transcript) + [{"role": "user", "content": "What time is it in Paris?"}]
second = tools.run(engine, follow_up, tools=demo_tools, max_tokens=64)
show(second[len(transcript):])''', CHECK),
    ("md", "### Turn by turn: the prompt, its tokens and the parsed calls of every reply"),
    ("code", '''from IPython.display import display

for i, message in enumerate(transcript):
    if message.role != "assistant":
        continue
    view = wb.show_prompt(transcript[:i], tools=demo_tools, engine=engine)
    calls = [(c.tool_name, c.arguments) for c in message.tool_calls]
    print(f"reply {i}: {len(view)} prompt tokens -> {message.content!r} calls={calls} ({message.stop_reason})")
    display(view)''', IGNORE),
    ("md", """## Many dialogs at once

Each turn is batched across the dialogs still running. Below, questions the model should answer with a
call (the tool it needs is offered), one whose tool is not offered, and one no tool answers. Each transcript
is checked against what a right answer needs: the expected tool, every argument value copied from the
question, and the answer restating the tool's result with those values."""),
    ("code", '''asked = [  # (question, the tool a right answer calls; None: no offered tool fits, answer directly)
    ("What's the weather in Tokyo?", "get_weather"), ("What time is it in Berlin?", "get_local_time"),
    ("What is the capital of Norway?", "get_capital"), ("What's the weather in Lima?", "get_weather"),
    ("Convert 250 EUR to JPY.", "convert_currency"), ("What time is it in Pune?", "get_local_time"),
    ("How many people live in Peru?", None), ("Tell me a story about dragons.", None),
]
dialogs = [[{"role": "user", "content": q}] for q, _ in asked]
transcripts = tools.run_batch(engine, dialogs, tools=demo_tools, max_turns=3, max_tokens=64)
wb.to_frame(transcripts)[["dialog", "role", "content", "tool_calls", "dialog_ended"]]''', IGNORE),
    ("code", '''def check(question, expected, transcript):
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
    return f"the answer leaves out {missing}" if missing else ""


for (question, expected), transcript in zip(asked, transcripts):
    problem = check(question, expected, transcript)
    print(f"{'✗' if problem else '✓'} {question:<34} {transcript[-1].content!r}" + (f"\\n    {problem}" if problem else ""))''',
     CHECK),
    ("md", """**Where it goes wrong, and why.** The failures are values the demo model never saw in training: *Lima*
and *JPY* are in its held-out value pools and *Pune* in none (`docs/demo-model.md`: every value pool is split
3:1 so that these questions test copying, not memory). An 82M-parameter model trained for minutes copies an
unseen value into a call, or from the call into its answer, only part of the time — so a call can be right
and the answer still name another city. It was also trained to decline when no offered tool fits, and does.
The rates below measure this on 25 held-out cases."""),
    ("md", """## When a call is malformed

A reply that cannot be parsed keeps its text and says why in `parse_error`; a call to an unknown tool or
with bad arguments becomes a tool message the model can read — the loop never crashes."""),
    ("code", '''broken = engine.formatter.decode_assistant("[get_weather(city=Paris)]")  # a bare name, not a string
print("calls:", broken.tool_calls, "| parse_error:", broken.parse_error)
toolbox = tools.Toolbox.create([get_weather])
print(toolbox.execute(wb.ToolCall("get_wether", {"city": "Paris"})).content)
print(toolbox.execute(wb.ToolCall("get_weather", {"town": "Paris"})).content)''', CHECK),
    ("md", """## Measuring tool calling

`workbench.evals` runs cases (a documented JSONL format, or synthetic held-out ones: question phrasings
and argument values the demo model never saw) batched through the engine, each dialog with its own one to
four tools (as in training), and scores every case: the calls made, exact match of names and arguments,
parse failures, and whether the final answer restates the tool result. Below, the same 25 cases under the
baseline (the first row), a system prompt the model never saw in training, a sampling temperature, and
int4 quantization. Every rate comes with the number of cases it counts and its 95% Wilson interval. (Llama 4
takes custom tools in the python-list format only; on a Llama 3.1 checkpoint `{"tool_prompt_format": "json"}`
and `"function_tag"` compare the call syntaxes the same way.)"""),
    ("code", '''from workbench import evals

cases = evals.synthetic_cases(25, split="heldout", seed=7)
settings = [{}, {"system_prompt": ("answer briefly", "Answer briefly.")}, {"temperature": 0.7},
            {"quantization": "int4_mixed"}]
results = evals.compare(engine, cases, settings)
summary = evals.summarize(results)
evals.rate_table(summary)''', IGNORE),
    ("code", "evals.plot_summary(summary)", IGNORE),
    ("md", """**Reading it.** Of the 25 cases, 15 expect a call and 10 a direct answer, so one case moves a rate by
0.07 or 0.10. Where a setting's interval overlaps the baseline's, the cases do not show that it differs:"""),
    ("code", '''base, labels = summary.iloc[0], evals.setting_labels(summary)
for label, (_, row) in zip(labels[1:], summary.iloc[1:].iterrows()):
    apart = row.tool_call_exact_low > base.tool_call_exact_high or row.tool_call_exact_high < base.tool_call_exact_low
    print(f"{label:<32} exact calls {row.tool_call_exact:.2f} vs {base.tool_call_exact:.2f}:",
          "a difference" if apart else "not shown to differ (the intervals overlap)")''', IGNORE),
    ("md", """To tell settings apart, run more cases (`python -m workbench.evals --cases 200`); the demo model's
accuracy on its held-out split is in `docs/demo-model.md`.

One row per case: what was expected and what the model did (the baseline)."""),
    ("code", '''columns = ["kind", "expected_calls", "calls_made", "exact_match", "answer_has_result", "direct_answer"]
results.head(len(cases))[columns].head(10)  # the baseline's rows come first''', IGNORE),
    ("md", """## Where to go next

- `04_quantization.ipynb`: what each quantization mode does to memory, speed and these tool dialogs.
- `06_evaluations.ipynb`: lm-evaluation-harness, BFCL and Inspect on the same engine.
- `python -m workbench.evals --help`: the same measurements from a shell, with more cases and settings."""),
]


THROUGHPUT = [
    LAB,
    ("md", """# Throughput: batch size, prompt length and quantization

`bench.throughput` times batched generation for every batch size, prompt length and quantization mode after
a warm-up, several times (medians, min–max spread). Every row generates exactly the same number of tokens
(stop tokens are kept as ordinary tokens, so no mode or batch "wins" by stopping early), and the speeds have
one definition here, in `04_quantization.ipynb` and in `bench/`: **prefill** = prompt tokens / time to first
token (a call that generates one token per row); **decode** = the tokens after each row's first / the rest of
the call's time. Three modes: `none` (the checkpoint's float32), `bf16`, and `int4_mixed` (int4 experts, the
rest in bfloat16 — so `bf16` is its baseline as much as `none`). Numbers depend on the machine and its load,
and on the thread count and CPU kernels printed below; `bench/` holds the scripted versions. About a minute on
a 2-core CPU."""),
    ("code", "%matplotlib inline\n" + LOAD + '''
import pandas as pd
import torch

from workbench import bench, plots

engine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=512)
print("torch threads:", torch.get_num_threads(), "| CPU kernels:", torch.backends.cpu.get_cpu_capability())
engine''', IGNORE),
    ("code", '''table = bench.throughput(engine, batch_sizes=(1, 2, 4, 8), prompt_lens=(32, 256), max_tokens=12, repeats=3,
                         modes=[None, "bf16", "int4_mixed"])
table[["mode", "prompt_len", "batch_size", "generated_tokens", "tok_s", "tok_s_min", "tok_s_max", "prefill_tok_s",
       "decode_tok_s", "total_s", "speedup_vs_batch1"]].round(2)''', IGNORE),
    ("md", """**What to look at:** every cell generated the same 12 tokens per row (`generated_tokens` = batch size ×
12), so the rates compare equal work. `tok_s` is the median of 3 runs, `tok_s_min`–`tok_s_max` their spread,
`total_s` the median wall time of one call. Tokens/s should grow with the batch size (left) — the speed-up over
running the prompts one by one (right); longer prompts cost more prefill per call. Error bars show the spread
over the repeats; one line per quantization mode and prompt length.

`decode_tok_s` is the call's time minus a prefill measured in a separate call, so its noise is both calls'
noise: where it comes out *higher* after 256-token prompts than after 32 that is noise, not a speed-up. Per
step, decode here barely depends on the prompt length — each step's cost is the 202k-row output projection,
not attention over 32 or 256 keys."""),
    ("code", 'plots.throughput(table)  # save="throughput.png" writes a PNG too', IGNORE),
    ("code", "plots.latency(table)", IGNORE),
    ("md", "What the modes do to the rate here, cell by cell (the same work in every mode):"),
    ("code", '''pivot = table.pivot_table(index=["prompt_len", "batch_size"], columns="mode", values="tok_s")
ratios = pd.DataFrame({"bf16 ÷ none": pivot["bf16"] / pivot["none"],
                       "int4_mixed ÷ none": pivot["int4_mixed"] / pivot["none"],
                       "int4_mixed ÷ bf16": pivot["int4_mixed"] / pivot["bf16"]})
spread = ((table.tok_s_max - table.tok_s_min) / table.tok_s_min).median()
print(f"the median min–max spread of one cell's repeats: {spread:.0%}")
for name, ratio in ratios.items():
    median = ratio.median()
    verdict = "not shown to differ" if abs(median - 1) <= spread else "faster" if median > 1 else "slower"
    print(f"{name:<18} median {median:.2f} (from {ratio.min():.2f} to {ratio.max():.2f} over {len(ratio)} cells): "
          f"{verdict}")
ratios.round(2)''', IGNORE),
    ("md", """Read each ratio against the spread: a median ratio within one cell's typical min–max spread of 1 is not
shown by this run to differ (the verdicts above apply that rule). What the modes change on a CPU: `none` runs
float32 products, with a packed copy of the output matrix for batched decode (`packed_bytes`,
`01_quickstart.ipynb`); `bf16` runs the same products in bfloat16 — half the bytes, no packed copy, and native
speed only on CPUs with AVX-512 BF16 or AMX instructions; `int4_mixed` is bf16 with the experts in int4 through
torch's int4 kernel. On the demo model those experts are a few MiB beside the 202k-row embedding and output
that both store alike, so `int4_mixed ÷ bf16` is the ratio that isolates int4, and int4 has little to win.
What bf16 and int4 surely buy here is memory (`04_quantization.ipynb`).

Batching never changes results: every row equals the prompt run alone."""),
    ("code", '''prompts = [f"Tell me about topic number {i}. " * (1 + i % 5) for i in range(8)]
batched = engine.batch_completion(prompts, max_tokens=12, progress=False)
alone = [engine.completion(p, max_tokens=12) for p in prompts]
print("rows identical to single runs:", [b.tokens for b in batched] == [a.tokens for a in alone])''', CHECK),
    ("md", """## Why this and not the others

The same prompts through workbench, Meta's reference generator (`llama-models`, the engine workbench
reproduces) and — when installed — transformers `generate`, on the same weights: a small Llama 3 with the
real 128k vocabulary and random weights, written in Meta's layout (and converted for transformers by
`bench/contenders.py`). Greedy, float32, stop tokens ignored so every contender generates exactly the
same tokens per prompt; the rows must agree. This replaces the demo engine in this kernel (one model at
a time). `bench/peers.py` runs the full comparison (more workloads, repeats, three models)."""),
    ("code", '''import importlib.util
import os
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(wb.__file__).resolve().parents[1] / "bench"))  # a source checkout: bench/
import contenders  # noqa: E402
import peers  # noqa: E402
from common import peer_model_dir  # noqa: E402

os.environ["BENCH_CLOCK"] = "wall"  # wall-clock seconds (the kernel may use several threads)
ckpt = peer_model_dir("llama3-d256")
peer_engine = wb.load(ckpt, max_batch_size=8, max_seq_len=256)
prompts = [[128000] + [1000 + 37 * i + j for j in range(6 * (i + 1))] for i in range(8)]  # 7..49 tokens
runs = {"workbench": (peers.workbench_runner(peer_engine), prompts),
        "reference": (peers.batched(partial(contenders.reference_generate,
                                            contenders.reference_model(ckpt, 8, 256)), 8), prompts)}
if importlib.util.find_spec("transformers") is not None:
    runs["transformers"] = (peers.batched(partial(contenders.hf_generate, contenders.hf_llama(ckpt, 256)), 8), prompts)
else:
    print('transformers is not installed: skipped (pip install -e ".[bench]" adds it as a third contender)')
for run, rows in runs.values():  # warm-up: first calls allocate and pick kernels
    run(rows[:2], 2)
results = peers.measure(runs, max_tokens=16, repeats=1)
{name: {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()} for name, r in results.items()}''',
     IGNORE),
    ("code", '''print("rows equal:", {name: r["rows_equal_workbench"] for name, r in results.items()})
plots.peers(results, title=f"{len(prompts)} prompts × 16 generated tokens, the same weights, greedy, "
                          f"{torch.get_num_threads()} thread(s)")''', IGNORE),
    ("md", """## Where to go next

- `04_quantization.ipynb`: memory, speed and fidelity of every quantization mode.
- `05_scale_out.ipynb`: more throughput from engine replicas on Ray.
- `bench/peers.py`, `bench/roofline.py` and `docs/benchmarks.md`: the scripted measurements and their numbers."""),
]

QUANTIZATION = [
    LAB,
    ("md", """# Quantization: memory, speed and fidelity

`engine.set_quantization(mode)` re-loads the weights under another mode (one model resident at a time).
The modes are Meta's meta-reference scheme: `bf16` stores every weight in bfloat16; `fp8_mixed` stores the
routed experts of the MoE layers in fp8 except those of the first and last layers (Llama 3: the feed-forwards
of every layer but the first and last), `int4_mixed` every expert (Llama 3: every feed-forward) in int4 — and,
as in Llama Stack, **every part a mode leaves unquantized
is stored in bfloat16** unless `wb.load(..., dtype=...)` asks for another type, so memory falls from bf16 to
fp8_mixed to int4_mixed on every device. `bench.quantization` measures every mode against the unquantized
model on the prompts you give it: here, tool dialogs as the demo model was trained on them (one or two tools
offered). Under a minute on a 2-core CPU."""),
    ("code", "%matplotlib inline\n" + LOAD + '''
from workbench import bench, plots
from workbench.demo.tools import convert_currency, get_capital, get_local_time, get_weather

engine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=1024)
dialogs = [("What's the weather in Paris?", [get_weather]), ("Convert 20 EUR to USD.", [convert_currency, get_weather]),
           ("What is the capital of Peru?", [get_capital, get_local_time]), ("Tell me a joke.", [get_capital])]
prompts = [engine.formatter.encode_dialog([{"role": "user", "content": q}], tools=t) for q, t in dialogs]''',
     IGNORE),
    ("code", '''import pandas as pd

table = bench.quantization(engine, prompts, max_tokens=16, repeats=5)


def mib(column):
    return (table[column] / 2**20).round(1)


def speed(column):  # the median of the runs, with their min–max
    return [f"{m:,.0f} ({lo:,.0f}–{hi:,.0f})" for m, lo, hi in
            zip(table[column], table[f"{column}_min"], table[f"{column}_max"])]


for column in ("prefill_tok_s", "decode_tok_s"):  # each mode against none: where the ranges overlap, no verdict
    low, high, base = table[f"{column}_min"], table[f"{column}_max"], table.loc["none", column]
    print(f"{column.split('_')[0]:>7} ÷ none:", ", ".join(
        f"{mode} {table.loc[mode, column] / base:.2f}"
        + (" (ranges overlap)" if low[mode] <= high["none"] and high[mode] >= low["none"] else "")
        for mode in table.index[1:]))
pd.DataFrame({"weights MiB": mib("weights_bytes"), "+ packed copy MiB": mib("packed_bytes"),
              "= resident MiB": mib("resident_bytes"), "resident ÷ none": table["resident_ratio"].round(3),
              "kernels": table["kernels"], "prefill tok/s (min–max)": speed("prefill_tok_s"),
              "decode tok/s (min–max)": speed("decode_tok_s")}, index=table.index)''', IGNORE),
    ("md", """**What to look at:** the memory the weights really occupy (`resident`): the weights, plus — for the
unquantized float32 model on a CPU — the packed float32 copy of the output matrix its batched-decode kernel
keeps (`packed_bytes`, see `01_quickstart.ipynb`; bf16 and the quantized modes keep none). Against the weights
alone bf16 looks like a halving; counted whole it is about a third. Then the speeds: the same definitions as
`03_throughput.ipynb`, on fresh prompts of the same lengths, every row generating the same 16 tokens, each the
median of 5 runs with their spread.

How closely each mode follows the unquantized model on the replies to these dialogs: `top1_agreement` and
`mean_kl` (nats) over the reply positions, `greedy_match` (reference tokens reproduced before the first
divergence) and `same_reply` — the share of dialogs whose whole reply (the call and its arguments) is
unchanged, with its 95% Wilson interval over the `rows` dialogs:"""),
    ("code", '''fidelity = table[["positions", "top1_agreement", "mean_kl", "greedy_match", "same_reply",
                  "same_reply_low", "same_reply_high", "rows"]].round(3)
fidelity["mean_kl"] = table["mean_kl"].map("{:.1e}".format)  # small numbers, shown whole
fidelity''', IGNORE),
    ("md", "What each part of the model is stored as, per mode (every type a part is stored in):"),
    ("code", "bench.memory_table(table)", IGNORE),
    ("md", """The demo model is 82M parameters, 77.6M of them its 202k-row embedding and output matrices, which no
mode quantizes: bf16 halves them (and drops the packed copy), and fp8/int4 then shrink only the few MiB of
experts. Under `fp8_mixed` the routed experts are stored in **two** types: fp8 for the MoE layers in the
middle, bfloat16 for the first and last layer's — here the demo model's six layers hold MoE at layers 1, 3 and
5, and layer 5, the last, keeps its experts in bfloat16, a third of them. That is Llama Stack's fp8_mixed
(`llama_models`' fp8 loader skips `layer_id == 0` and `n_layers - 1`; workbench's `quantization_plan` does
the same), which leaves the layers nearest the embedding and the output unquantized. `int4_mixed`
quantizes every MoE layer's routed and shared experts. On a real Llama the experts and feed-forwards are most
of the weights, and the same table shows where the memory goes.

On speed, read the spreads (where two modes' min–max ranges overlap, this run does not tell them apart) and
`kernels`; the lines printed above the first table compare each mode's median with `none`'s and say where
the ranges overlap. Every product a mode does not quantize runs in bfloat16 under bf16, fp8_mixed and
int4_mixed, and in float32 under `none`. **Prefill** (products over many prompt tokens at once) gains from
bfloat16 on a CPU with AVX-512 BF16 or AMX instructions, which computes it natively on half the bytes (a CPU
without them converts, and bf16 loses). **Decode** (a few rows per step) weighs two things: bfloat16 reads
half the bytes, but only float32 has the packed copy of the 202k-row output matrix, each step's largest
product; it is also where this machine's noise shows most, since decode is a call's time minus a separately
timed prefill. On top of that, a CPU has no fp8 matmul, so `fp8/dequant` widens the fp8 weights before every
product (on a CPU fp8_mixed checks numerics and saves memory; it is not built to save time), and `int4/cpu`
is torch's int4 kernel, on expert matrices too small here to gain much. On GPUs with fp8 tensor cores the
kernel is `fp8/scaled_mm`."""),
    ("code", 'plots.quantization(table)  # save="quantization.png" writes a PNG too', IGNORE),
    ("code", '''print("mode after the comparison:", engine.settings.quantization or "none")
print("memory falls bf16 > fp8_mixed > int4_mixed:",
      table.loc["bf16", "weights_bytes"] > table.loc["fp8_mixed", "weights_bytes"] > table.loc["int4_mixed", "weights_bytes"])
print("quantized layers at most 0.55x (fp8) / 0.30x (int4) of bf16:",
      table.loc["fp8_mixed", "quantized_vs_bf16"] <= 0.55 and table.loc["int4_mixed", "quantized_vs_bf16"] <= 0.30)''',
     CHECK),
    ("md", """## Toggle interactively

The dropdown re-loads the weights (it says "loading…", then the mode, weights size and time; an error
is shown here and the previous mode stays). The cells after it run on the chosen mode."""),
    ("code", '''from workbench.widgets import QuantizationToggle

QuantizationToggle(engine)''', IGNORE),
    ("code", "engine.memory()", IGNORE),
    ("md", """## Where to go next

- `02_tool_experiments.ipynb`: the tool-calling rates of the baseline and int4 on 25 held-out cases.
- `05_scale_out.ipynb`: a quantization sweep over engine replicas on Ray.
- On a GPU (README, "Your own checkpoint"): `wb.load(..., quantization="fp8_mixed")` uses fp8 matmuls
  (`torch._scaled_mm`) where the GPU has them, and the same cells measure a real checkpoint."""),
]


SCALE_OUT = [
    requires("cluster", "Needs the cluster extra (Ray), which the README quick start does not install:"),
    ("md", """# Scale out: engine replicas on Ray

`workbench.cluster.load(..., replicas=N)` starts N engines, each in its own Ray actor (on its own GPUs when
the cluster has them), behind the engine's batch APIs: `batch_completion`, `batch_chat_completion`, the tool
loop and `workbench.evals` run on a pool unchanged, and every row is what one engine gives.

These cells run a local Ray on this machine. To run the **same cells on a cluster of GPU nodes**, set
`WORKBENCH_RAY_ADDRESS=auto` (on a node of the cluster) or `ray://head:10001` (from outside), and
`WORKBENCH_NOTEBOOK_CHECKPOINT` to a checkpoint folder that every node can read. About a minute on a 2-core
CPU, most of it starting Ray and the replicas."""),
    ("code", '''import logging
import os

import workbench.cluster as wbc
from workbench.demo.tools import get_local_time, get_population, get_random_joke, get_weather

CHECKPOINT = os.environ.get("WORKBENCH_NOTEBOOK_CHECKPOINT")  # None: the embedded demo model
ADDRESS = os.environ.get("WORKBENCH_RAY_ADDRESS")  # None: a local Ray (127.0.0.1); "auto" / "ray://...": a cluster
TOOLS = [get_weather, get_local_time, get_population, get_random_joke]  # 1-4 tools, as the demo model was trained

# a local Ray with room for 3 one-CPU replicas; Ray's own start-up log lines stay out of the notebook
wbc.connect(ADDRESS, **({} if ADDRESS else {"num_cpus": 3, "logging_level": logging.ERROR}))
pool = wbc.load(CHECKPOINT, replicas=2, max_batch_size=8, max_seq_len=2048, threads=1)
pool''', IGNORE),
    ("md", """Each replica is a Ray actor in its own placement group: on GPUs it holds `model_parallel_size` GPUs of
one node. `pool.replicas` says where each one runs."""),
    ("code", '''import pandas as pd

pd.DataFrame(pool.replicas)[["index", "state", "host", "cuda_visible_devices"]]''', IGNORE),
    ("md", """## The same rows as one engine

A batch is cut into chunks that the replicas pull; rows come back in input order. Batching never changes a
row and a seeded row is seeded the same on every replica, so greedy and seeded rows equal single runs."""),
    ("code", '''prompts = ["The capital of France is", "def fib(n):", "Llamas are", "Tell me a story"] * 3
batch = pool.batch_completion(prompts, max_tokens=12, temperature=0.8, top_p=0.9, seed=1)
alone = [pool.completion(p, max_tokens=12, temperature=0.8, top_p=0.9, seed=1) for p in prompts]
print("rows identical to single runs:", [b.tokens for b in batch] == [a.tokens for a in alone])''', CHECK),
    ("md", """## The tool loop and evaluations on a pool

`wb.tools.run_batch(pool, ...)` and `workbench.evals.run_cases(pool, ...)` take the pool where they take an
engine. The dialogs below offer four tools, as the demo model was trained (one to four at a time)."""),
    ("code", '''asked = [("What's the weather in Paris?", "get_weather"), ("What time is it in Tokyo?", "get_local_time"),
         ("What is the population of Peru?", "get_population"), ("Tell me a joke.", "get_random_joke"),
         ("What's the weather in Rome?", "get_weather"), ("What time is it in Seoul?", "get_local_time"),
         ("How many people live in Brazil?", "get_population"), ("Tell me a story about dragons.", None)]
dialogs = [[{"role": "user", "content": q}] for q, _ in asked]
transcripts = wb.tools.run_batch(pool, dialogs, tools=TOOLS, max_tokens=48, max_turns=3)
transcripts[0]''', IGNORE),
    ("code", '''for (question, expected), transcript in zip(asked, transcripts):
    called = [c.tool_name for m in transcript for c in m.tool_calls]
    broken = [m.parse_error for m in transcript if getattr(m, "parse_error", None)]  # a call that does not parse
    mark = "✓" if called[:1] == ([expected] if expected else []) and not broken else "✗"
    print(f"{mark} {question:<34} calls={called} -> {transcript[-1].content!r}" + (f" ({broken[0]})" if broken else ""))''',
     CHECK),
    ("md", """The tool results are the demo tools' made-up values (a hash of the arguments picks them: Brazil's
"32.3 million" is not its population). Where a mark is ✗, the model did something it should not: for the
story no offered tool fits, and here the model called `get_capital` — a tool it was **not offered** — so the
loop answered with an error, which the model then garbled into the answer above. Declining in words is what
its training meant it to do when no offered tool fits; it does so in most such dialogs, not in all
(`02_tool_experiments.ipynb`, with another tool set, declines the same story, and measures direct answers on
held-out cases with n and an interval)."""),
    ("md", """## A sweep

`wbc.sweep(grid, dialogs, tools)` runs every grid point (load settings such as `quantization` or
`checkpoint`, call settings such as `tool_choice`, `tool_prompt_format` or `temperature`) over the same dialogs and
returns one DataFrame. A quantization change re-loads the replicas in place (and the pool's mode is restored
after). Each rate below is over the 8 dialogs, with its 95% Wilson interval; "right first reply" is the expected
tool (or, for the story, no call)."""),
    ("code", '''from workbench.reports import rate_text

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
rates[["called a tool", "right first reply", "replies that repeat a call", "generated tokens per reply (mean)"]]''',
     IGNORE),
    ("md", """`tool_choice="required"` adds Llama Stack's sentence *"You MUST use one of the provided functions/tools to
answer the user query."* to the system prompt. The demo model never saw that sentence in training, so what it
does with it is not something it was taught: compare the `required` rows with the `auto` ones — here the same
first calls, but most `required` replies write their call twice (the same name and arguments), hence more
generated tokens per reply (the `tokens` of each first reply, stop token excluded) — and the int4_mixed rows
with none's. To enforce a call whatever the model was trained on, `constrain_tools=True` masks every token
that would not continue a valid call of an offered tool (see the README, "Structured output")."""),
    ("md", """## Jobs: progress across replicas, cancel

`pool.submit_batch_chat_completion(...)` returns at once with a job: a progress bar of rows and tokens/s
over all replicas, `job.result()`, `job.cancel()` (stops within a decode step on every replica; finished
rows stay in `job.partial()`), `job.done` and per-replica statistics."""),
    ("code", '''job = pool.submit_batch_chat_completion(dialogs * 3, TOOLS, max_tokens=48, progress=True)
replies = job.result()
per_replica = pd.DataFrame(job.stats()["per_replica"]).T.sort_index().rename_axis("replica")
per_replica.astype({"rows": int, "tokens": int}).round({"seconds": 2, "tok_s": 1})''', IGNORE),
    ("md", """## Throughput against the replica count

The same seeded batch (32 prompts, up to 24 tokens each) on 1 and 2 replicas; each bar says how many tokens
it generated and in what time, so the two rates can be read as equal work or not. On a 2-core machine the two
one-thread replicas get a core each only when nothing else runs (Ray's own processes and any other load share
the same two cores), so **the gain is at most 2× here and moves with the machine's load** — the pool's overhead,
not its scaling, is what this machine can show (`bench/cluster.py` measures it). On a machine with a core group
or GPU per replica the rate grows with the replicas."""),
    ("code", '''%matplotlib inline
import time

from matplotlib.figure import Figure

work = [f"Tell me about topic {i}. " * (1 + i % 3) for i in range(32)]


def rate(p):
    p.batch_completion(work[:2], max_tokens=2, progress=False)  # warm-up
    start = time.perf_counter()
    rows = p.batch_completion(work, max_tokens=24, temperature=0.7, seed=0, progress=False)
    return sum(len(r.tokens) for r in rows), time.perf_counter() - start


runs = {2: rate(pool)}
with wbc.load(CHECKPOINT, replicas=1, max_batch_size=8, max_seq_len=2048, threads=1) as one:
    runs[1] = rate(one)
replicas = sorted(runs)
fig = Figure(figsize=(4.6, 3.4))
ax = fig.subplots()
bars = ax.bar([str(n) for n in replicas], [runs[n][0] / runs[n][1] for n in replicas], color="#388e3c")
ax.bar_label(bars, labels=[f"{runs[n][0]} tokens\\nin {runs[n][1]:.1f} s" for n in replicas], fontsize=8)
ax.set_ylim(0, 1.3 * max(runs[n][0] / runs[n][1] for n in replicas))
ax.set_xlabel("replicas (one CPU thread each)")
ax.set_ylabel("generated tokens / s")
ax.set_title(f"batch_completion: {len(work)} prompts on a local Ray")
fig.tight_layout()
fig''', IGNORE),
    ("md", "`pool.shutdown()` ends every replica and its worker processes; `wbc.disconnect()` stops the local Ray."),
    ("code", '''pool.shutdown()
wbc.disconnect()
print(pool)''', IGNORE),
    ("code", 'print("every replica ended:", all(r["state"] == "closed" for r in pool.replicas), "| died:", pool.deaths)',
     CHECK),
    ("md", """## Where to go next

- `06_evaluations.ipynb`: lm-evaluation-harness, BFCL and Inspect on an engine (each takes a pool's
  checkpoint the same way).
- The README's "Scale out on Ray": a cluster of GPU nodes (`ray start`, a shared checkpoint path,
  `address="auto"`).
- `bench/cluster.py` and `docs/benchmarks.md`: the pool's overhead, measured."""),
]


EVALUATIONS_INTRO = [
    requires("evals", "Needs lm-evaluation-harness, Inspect and BFCL, which the README quick start does not install:"),
    ("md", """# The evaluations researchers already run

lm-evaluation-harness, BFCL and Inspect on the kernel's engine: each harness's own tasks, data and scoring,
with workbench's batch APIs underneath (requests gathered into engine batches, the model's official prompt
formats). Everything here runs offline on the embedded demo model; set `WORKBENCH_NOTEBOOK_CHECKPOINT` to
run the same cells on a real checkpoint. Every score comes with the number of items it counts and its 95%
Wilson interval: these tasks are tiny. Under a minute on a 2-core CPU."""),
    ("code", "%matplotlib inline\n" + LOAD + '''
from workbench.demo.tools import convert_currency, get_local_time, get_weather
from workbench.reports import rate_text

engine = wb.load(CHECKPOINT, max_batch_size=16, max_seq_len=2048)
engine''', IGNORE),
]

LM_EVAL_CELLS = [
    ("md", """## lm-evaluation-harness: `WorkbenchLM`

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
prompt are the second run."""),
    ("code", '''import json
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
pd.DataFrame({label: {"calls_mc acc": rate_text(r["results"]["calls_mc"]["acc,none"] * len(docs), len(docs)),
                      "calls_gen exact_match": rate_text(r["results"]["calls_gen"]["exact_match,none"] * len(docs),
                                                         len(docs))}
              for label, r in runs.items()}).T.rename_axis("tools in the prompt")''', IGNORE),
    ("md", """With the tools in its prompt the model ranks the right call first and writes it; a miss in the generated
calls is a city it miscopies (Cairo, a held-out value it never saw in training). Without tools it
has nothing to call: it was trained to call only offered tools, never to answer these questions in words.
Each answer below is one `engine.score` row: the log-probability of its tokens after the question, in the
model's chat format with the tools offered."""),
    ("code", '''from matplotlib.figure import Figure

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
fig''', IGNORE),
]

BFCL_INSPECT_CELLS = [
    ("md", """## BFCL: the Berkeley Function Calling Leaderboard, batched

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
writes no call."""),
    ("code", '''from IPython.display import display

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
pd.crosstab([results[k].astype(pd.CategoricalDtype(v)) for k, v in order.items()], kinds)  # entries per kind''',
     IGNORE),
    ("code", '''summary = bfcl.summarize(results)     # accuracy per category, as BFCL counts it
summary["accuracy (95% interval)"] = [rate_text(k, n) for k, n in zip(summary["correct"], summary["entries"])]
summary''', IGNORE),
    ("code", "bfcl.plot(summary)", IGNORE),
    ("md", """## Inspect: the `workbench` model provider

Installing workbench registers a `workbench` provider with [Inspect](https://inspect.aisi.org.uk), so
`inspect eval task.py --model workbench/<checkpoints.toml name or folder>` works from a shell; in a notebook
pass the loaded engine. Tools reach the model in its official format, and the samples Inspect runs
concurrently are gathered into engine batches (the plot: rows per engine call). The tool below returns what
the demo tool of the same name returns — a made-up value that a hash of the city picks, the kind of result
the model was trained to restate — and the scorer checks what a tool-using answer must get right: the call
went to the asked city, and the answer names that city and restates the tool's result."""),
    ("code", '''from inspect_ai import Task, eval
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
})''', IGNORE),
    ("md", """A sample the scorer marks incorrect (`I`) is one where the model wrote another city into the call — for
*Cairo*, a held-out value, as in the lm-eval task above — and then restated that city's weather. Inspect's
built-in `includes()` would look only for the target city's name in the answer, and so pass an answer that
names the city but garbles the weather; a check of the call and the result alone would pass a right call
whose answer names another city (`02_tool_experiments.ipynb`: "The weather in tiger is 0 C and windy." after
a correct call for Lima). This scorer asks for all three."""),
    ("code", '''sizes = model.api.batcher.stats.sizes
fig = Figure(figsize=(4.6, 2.8))
ax = fig.subplots()
ax.bar(range(1, len(sizes) + 1), sizes)
ax.set_xlabel("engine call")
ax.set_ylabel("rows in the batch")
ax.set_xticks(range(1, len(sizes) + 1))
ax.set_title(f"{len(cities)} Inspect samples: rows per engine call")
fig.tight_layout()
fig''', IGNORE),
    ("md", """## Where to go next

- Your own checkpoint (README, "Your own checkpoint"): set `WORKBENCH_NOTEBOOK_CHECKPOINT` and run these
  cells again, with real task names (`tasks=["arc_easy"]`) and BFCL's full categories (`limit=None`).
- `python -m workbench.evals.lm_eval`, `python -m workbench.evals.bfcl` and `inspect eval ... --model
  workbench/...`: the same harnesses from a shell.
- `02_tool_experiments.ipynb`: workbench's own tool-calling cases, with the settings that move them."""),
]


RUN_STORE = [
    LAB,
    ("md", """# Remembering results: the run store

Give a call a run name (`run="sweep"`) and every row is written to disk the moment it finishes. Run the cell
again — after a restart, to add a plot, after the kernel died at 80 % — and the rows already stored come back
from disk; only the others are computed, and the result equals an uninterrupted run. Every row also records
where it came from: the checkpoint's content hash, the load settings, the seed, workbench's version. This
notebook runs a tool-calling sweep with `run=`, runs it again from the store, stops a call half-way and
resumes it, compares two quantization modes row by row, and browses and exports what was stored. About half
a minute on a 2-core CPU."""),
    ("code", LOAD + '''
import time
from workbench.demo.tools import get_local_time, get_population, get_weather

engine = wb.load(CHECKPOINT, max_batch_size=16, max_seq_len=1024)
engine  # the card's last line names the run store file''', IGNORE),
    ("md", """The store is one SQLite file: `$WORKBENCH_STORE`, else `runs.sqlite` in workbench's data folder
(`~/.local/share/workbench`, or `$WORKBENCH_DATA_DIR`); `wb.runs.path()` says which. A store answers a request
from any run that holds it, so a notebook that shows rows being *computed* needs a store of its own: this one
points `$WORKBENCH_STORE` at `notebook-07.sqlite` in the data folder and empties it first, so every run of it
computes its rows afresh, and none of your runs is touched. Your own work needs none of this."""),
    ("code", '''from workbench.places import data_dir
from workbench.reports import short_path

os.environ["WORKBENCH_STORE"] = str(data_dir() / "notebook-07.sqlite")
store = wb.runs.store()
for name in store.run_names():
    wb.runs.delete(name)
print("run store:", short_path(wb.runs.path()))''', IGNORE),
    ("md", """## A sweep with `run=`

Thirty-two tool dialogs (four cities, eight questions), one batch. `run="nb07-sweep"` is the only change to the
call:"""),
    ("code", '''CITIES = ["Paris", "Tokyo", "Lima", "Oslo"]
QUESTIONS = ["What's the weather in {}?", "What time is it in {}?", "How many people live in {}?",
             "Is it raining in {}?", "Local time in {}, please.", "Population of {}?", "Weather report for {}.",
             "What's the time in {} right now?"]
dialogs = [[{"role": "user", "content": q.format(c)}] for q in QUESTIONS for c in CITIES]
TOOLS = [get_weather, get_local_time, get_population]

start = time.perf_counter()
replies = engine.batch_chat_completion(dialogs, tools=TOOLS, max_tokens=48, run="nb07-sweep")
computed_s = time.perf_counter() - start
print(f"{len(replies)} replies in {computed_s:.1f} s; {sum(r.cached for r in replies)} came from the store")''',
     IGNORE),
    ("md", "The same cell again: every reply comes from the store."),
    ("code", '''start = time.perf_counter()
again = engine.batch_chat_completion(dialogs, tools=TOOLS, max_tokens=48, run="nb07-sweep")
stored_s = time.perf_counter() - start
print(f"{stored_s:.3f} s instead of {computed_s:.1f} s ({100 * stored_s / computed_s:.1f} %)")''', IGNORE),
    ("code", '''print(f"{sum(r.cached for r in again)} of {len(again)} replies from the store; equal to the first run: "
      f"{again == replies}")''', CHECK),
    ("md", """## A call stopped half-way

Rows are written as they finish, so a call that dies — Ctrl-C, an exception, a killed kernel — loses only
the rows still running. Here a watcher presses Stop (`engine.cancel()`) as soon as twelve rows of a longer
sweep (the same questions about more cities) are on disk; the re-run computes only what was missing:"""),
    ("code", '''import threading

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
     IGNORE),
    ("code", '''print("the resumed call equals one that was never stopped:",
      resumed == engine.batch_chat_completion(more, tools=TOOLS, max_tokens=48))''', CHECK),
    ("md", """## Two quantization modes, row by row

The key of a stored row holds the load settings that change numbers (dtype, quantization, model-parallel size,
device type) and the checkpoint's content, so the same requests under `int4_mixed` are computed, not taken
from the unquantized run. `wb.runs.compare` pairs the two runs' rows by request and shows where the outputs
differ (here, on calls this short, the demo model's int4 experts write the same calls as the unquantized
model; `first_differing_token` says where a reply parts when one does):"""),
    ("code", '''engine.set_quantization("int4_mixed")
int4 = engine.batch_chat_completion(dialogs, tools=TOOLS, max_tokens=48, run="nb07-sweep-int4")
engine.set_quantization(None)
print("computed under int4_mixed:", sum(not r.cached for r in int4), "of", len(int4))
pairs = wb.runs.compare("nb07-sweep", "nb07-sweep-int4", differing_only=False)  # the default shows only rows that differ
print(f"{pairs.attrs['both']} requests in both runs, {pairs.attrs['differ']} with different outputs")
pairs[["prompt", "same", "a_tool_calls", "b_tool_calls", "first_differing_token"]].head(8)''', IGNORE),
    ("md", """## Browsing what was stored

`wb.runs.table()`: one row per run, with the provenance of its latest session. `wb.runs.rows(name)`: one row
per stored result — the prompt, the output, tool calls flattened, the seed, whether it was computed by this run
— with columns that say where it came from (`checkpoint_identity`, `quantization`, `workbench_version`...)."""),
    ("code", '''wb.runs.table()[["run", "rows", "computed", "model", "quantization", "dtype", "workbench_version"]]''',
     IGNORE),
    ("code", '''rows = wb.runs.rows("nb07-sweep")
rows[["prompt", "tool_calls", "stop_reason", "generated_tokens", "seed", "computed", "quantization",
      "checkpoint_identity"]].head(6)''', IGNORE),
    ("md", """A sampled row without a seed runs with a seed drawn for it, and the row records it: running the cell
again answers the same samples from the store, and `seed=` replays any one of them exactly."""),
    ("code", '''samples = engine.batch_chat_completion(dialogs[:4], tools=TOOLS, max_tokens=48, temperature=1.0,
                                      run="nb07-sampled")
first = next(store.rows("nb07-sampled"))
replayed = engine.chat_completion(first.request["messages"], tools=TOOLS, max_tokens=48, temperature=1.0,
                                  seed=first.seed)
print("seed drawn and recorded:", first.seed_drawn, "| replayed from it:", replayed == first.output)''', CHECK),
    ("md", """## Exporting

`wb.runs.export(name, path)` writes every field of every row — the request as given, the prompt ids, the
sampling it ran with, the exact result, the provenance — as JSON Lines (`.jsonl`) or Parquet (`.parquet`,
with pyarrow); `wb.runs.decode` turns an exported `result` back into the object the call returned.
`wb.runs.to_inspect(name, "sweep.eval")` (the `evals` extra) writes an Inspect log that `inspect view` browses."""),
    ("code", '''import json
import tempfile
from pathlib import Path

with tempfile.TemporaryDirectory() as folder:
    path = wb.runs.export("nb07-sweep", Path(folder) / "sweep.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
print(len(lines), "lines (in the order the rows finished); each with", ", ".join(sorted(lines[0])[:6]), "...")
decoded = {line["prompt"]: wb.runs.decode(line["result"]) for line in lines}
print("the stored results decode to the replies the call returned:",
      [decoded[dialog[0]["content"]] for dialog in dialogs] == replies)''', CHECK),
    ("md", """## Where to go next

- Every integration takes `run=`: the tool loop (`wb.tools.run_batch(..., run=)`: each turn is stored, so a
  loop that died at turn 3 resumes at turn 3), `workbench.evals.run_cases`, `bfcl.run`, lm-eval's
  `--model_args ...,run=name`, a Ray pool's batch calls and `wb.serve(engine, run=)`.
- `docs/run-store.md`: what the key holds, the file's tables, what happens when the disk is full or two kernels
  write at once.
- `06_evaluations.ipynb`: the harnesses themselves; `04_quantization.ipynb`: the modes compared here."""),
]


NOTEBOOKS = {
    "01": ("01_quickstart.ipynb", QUICKSTART),
    "02": ("02_tool_experiments.ipynb", TOOL_EXPERIMENTS),
    "03": ("03_throughput.ipynb", THROUGHPUT),
    "04": ("04_quantization.ipynb", QUANTIZATION),
    "05": ("05_scale_out.ipynb", SCALE_OUT),
    "06": ("06_evaluations.ipynb", EVALUATIONS_INTRO + LM_EVAL_CELLS + BFCL_INSPECT_CELLS),
    "07": ("07_run_store.ipynb", RUN_STORE),
}


def make(cells: list[tuple]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for kind, source, *tags in cells:
        cell = nbformat.v4.new_markdown_cell(source) if kind == "md" else nbformat.v4.new_code_cell(source)
        if tags:
            cell.metadata["tags"] = list(tags)
        nb.cells.append(cell)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return nb


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Strip what differs between runs and says nothing to a reader: timings, cell ids' noise, the redraws
    of third-party text bars (stored as what a reader sees: each line after its last carriage return), and
    the saved state of widgets no stored output shows (closed progress bars leave their models behind)."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        outputs = cell.get("outputs", [])
        if any(o.get("output_type") == "stream" and "\r" in o.get("text", "") for o in outputs):
            cell.outputs = [nbformat.from_dict(o) for o in _coalesced(outputs)]
            for o in cell.outputs:
                if o.get("output_type") == "stream":
                    o.text = _output_texts(o)[0]
    nb.metadata["language_info"] = {"name": "python"}
    widgets = nb.metadata.get("widgets", {}).get(WIDGET_STATE)
    if widgets is not None:
        shown = _shown_widget_models(nb)
        widgets["state"] = {k: v for k, v in widgets.get("state", {}).items() if k in shown}
        if not widgets["state"]:
            del nb.metadata["widgets"]
    return nb


# A progress bar frozen part-way ("generating:  16%|█▌  | 1/6"), as text or as a widget's text fallback.
HALF_BAR = re.compile(r"(?<![0-9])(?:[0-9]|[1-9][0-9])%\|")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _output_texts(output: nbformat.NotebookNode) -> list[str]:
    texts = [output.get("text", "")] if output.get("output_type") == "stream" else []
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            texts.append(value if isinstance(value, str) else "".join(value))
    texts = [t if isinstance(t, str) else "".join(t) for t in texts]
    # what a reader sees: a carriage return redraws its line, so only the text after the last one shows
    return ["\n".join(line.rsplit("\r", 1)[-1] for line in t.split("\n")) for t in texts]


def _coalesced(outputs: list) -> list:
    """Consecutive stream outputs of one name show as one text (a bar's redraws arrive as separate writes)."""
    merged: list = []
    for output in outputs:
        last = merged[-1] if merged else None
        if output.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream" \
                and last.get("name") == output.get("name"):
            merged[-1] = {**last, "text": last["text"] + output["text"]}
        else:
            merged.append(dict(output))
    return merged


WIDGET_REFERENCE = re.compile(r"IPY_MODEL_([\w-]+)")


def _shown_widget_models(nb: nbformat.NotebookNode) -> set[str]:
    """The widget models a stored output shows: those its views name, and every model their state refers to
    (a box's children, a widget's layout and style), transitively."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    todo = [o["data"][WIDGET_VIEW].get("model_id") for cell in nb.cells for o in cell.get("outputs", [])
            if WIDGET_VIEW in o.get("data", {})]
    shown: set[str] = set()
    while todo:
        model = todo.pop()
        if model in shown or model not in state:
            continue
        shown.add(model)
        todo += WIDGET_REFERENCE.findall(json.dumps(state[model]))
    return shown


def stale_outputs(nb: nbformat.NotebookNode) -> list[str]:
    """What a reader of the stored notebook would see as broken: a half-finished progress bar, a widget
    output whose model is missing from the saved widget state (it renders as "model not found"), or saved
    widget state that no output shows (a closed progress bar's leftovers)."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    problems = []
    unshown = sorted(set(state) - _shown_widget_models(nb))
    if unshown:
        kinds = sorted({state[m].get("model_name", "?") for m in unshown})
        problems.append(f"widget state saved for {len(unshown)} model(s) no output shows ({', '.join(kinds)})")
    for number, cell in enumerate(nb.cells):
        for output in _coalesced(cell.get("outputs", [])):
            if any(HALF_BAR.search(text) for text in _output_texts(output)):
                problems.append(f"cell {number}: a progress bar stopped part-way")
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is not None and view.get("model_id") not in state:
                problems.append(f"cell {number}: a widget view whose model {view.get('model_id')} is not saved")
    return problems


# Paths that name one machine (a user's home, a temp folder, a random temp name) have no place in a shared
# notebook; workbench displays its own paths from ~ or $WORKBENCH_CACHE (workbench.reports.short_path).
MACHINE_PATH = re.compile(r"/root/|/home/[^/\s\"']+/|/Users/[^/\s\"']+/|(?<![\w.~])/tmp/|/private/var/|/var/folders/"
                          r"|[A-Za-z]:\\+Users|\btmp[a-z0-9_]{8}\b|pytest-of-")
UNNAMED_MODEL = re.compile(r"model_id\s+none|model=None\b")
WARNING = re.compile(r"warn|deprecat|traceback|error:", re.IGNORECASE)
# A tqdm bar, finished or not: "requests: 100%|██████████| 8/8 [00:00<00:00, ...]" or, without a total,
# "tokens: 24it [00:01, 20.1it/s]".  workbench's own bars end as one summary line and match neither.
TEXT_BAR = re.compile(r"(?<![0-9])[0-9]{1,3}%\||\[[0-9]{2}:[0-9]{2}(?::[0-9]{2})?(?:<|, |\])")


def output_problems(nb: nbformat.NotebookNode) -> list[str]:
    """What a reader of the stored notebook should never see, beyond :func:`stale_outputs`: machine paths,
    an unnamed model (``model_id none``), tqdm bars (finished ones too: a call's output is its result, and
    workbench's own bars leave one summary line), warnings or other log lines on stderr, error outputs,
    progress or output widgets without a readable fallback (third-party bars, an empty ``Output()``), empty
    outputs, and the same figure shown twice in a cell."""
    problems = []
    for number, cell in enumerate(nb.cells):
        images: list[str] = []
        for output in _coalesced(cell.get("outputs", [])):
            kind = output.get("output_type")
            texts = _output_texts(output)
            joined = "\n".join(texts)
            if MACHINE_PATH.search(joined):
                problems.append(f"cell {number}: a machine path ({MACHINE_PATH.search(joined).group(0)!r})")
            if UNNAMED_MODEL.search(joined):
                problems.append(f"cell {number}: an unnamed model ({UNNAMED_MODEL.search(joined).group(0)!r})")
            if kind == "error":
                problems.append(f"cell {number}: an error ({output.get('ename')})")
            if TEXT_BAR.search(joined):
                line = next(line for line in joined.splitlines() if TEXT_BAR.search(line))
                problems.append(f"cell {number}: a progress bar ({line.strip()[:80]!r})")
            if kind == "stream" and output.get("name") == "stderr":
                lines = [line for line in joined.splitlines() if line.strip() and not TEXT_BAR.search(line)]
                if lines:
                    label = "a warning" if WARNING.search("\n".join(lines)) else "log output"
                    problems.append(f"cell {number}: {label} on stderr ({lines[0].strip()[:80]!r})")
            data = output.get("data", {})
            if WIDGET_VIEW in data and "text/html" not in data:
                fallback = data.get("text/plain", "")
                problems.append(f"cell {number}: a stray widget ({fallback.strip()[:60]!r})")
            if kind in ("stream", "display_data", "execute_result") and not any(t.strip() for t in texts) \
                    and not any(k.startswith("image/") for k in data) and WIDGET_VIEW not in data:
                problems.append(f"cell {number}: an empty output")
            if "image/png" in data:
                png = data["image/png"] if isinstance(data["image/png"], str) else "".join(data["image/png"])
                if png in images:
                    problems.append(f"cell {number}: the same figure twice")
                images.append(png)
            elif any(t.lstrip().startswith("<Figure size") for t in texts):
                problems.append(f"cell {number}: a figure shown as text, not drawn")
    return problems


def structure_problems(nb: nbformat.NotebookNode) -> list[str]:
    """A notebook opens with the one cell that says (and checks) which extra it needs, and ends by saying
    where to go next."""
    problems = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not nb.cells or nb.cells[0].cell_type != "code" or "pip install" not in nb.cells[0].source \
            or "wb.require(" not in nb.cells[0].source:
        problems.append("the first cell must be code that names its extra (a pip install line) and checks it "
                        "(wb.require)")
    if code and code[0] is not nb.cells[0]:
        problems.append("the extra check must come before any other code")
    last = nb.cells[-1] if nb.cells else None
    if last is None or last.cell_type != "markdown" or "next" not in last.source.lower():
        problems.append("the last cell must be markdown saying where to go next")
    return problems


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """Everything :func:`build` refuses to store (and tests/test_stored_notebooks.py rejects)."""
    return stale_outputs(nb) + output_problems(nb) + structure_problems(nb)


def build(key: str, execute: bool = True) -> Path:
    name, cells = NOTEBOOKS[key]
    nb = make(cells)
    if execute:
        NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(HERE)}},
                       store_widget_state=True, record_timing=False).execute()
    clean(nb)
    if execute:
        found = problems(nb)
        if found:
            rejected = Path(tempfile.gettempdir()) / f"rejected-{name}"
            nbformat.write(nb, rejected)
            raise SystemExit(f"{name} would be stored with bad outputs ({rejected}): " + "; ".join(found))
    path = HERE / name
    nbformat.write(nb, path)
    return path


if __name__ == "__main__":
    keys = sys.argv[1:] or list(NOTEBOOKS)
    for key in keys:
        print("wrote", build(key))
