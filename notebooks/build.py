"""Writes the notebooks from the cell lists below, runs them, and stores their outputs (with widget state).

    python notebooks/build.py            # write and execute all of them
    python notebooks/build.py 02 03      # only some

Cells are tagged for nbval (``nbval-check-output``: deterministic, compared in CI;
``nbval-ignore-output``: depends on the model or the machine), so the code a reader copies carries no
test comments.  Execution metadata (timings) is stripped; widget state is saved so that the widgets
render from the stored notebook, and every widget also carries a text/HTML fallback.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
CHECK, IGNORE = "nbval-check-output", "nbval-ignore-output"

LOAD = '''import os

import workbench as wb

# None -> the embedded default model; set WORKBENCH_NOTEBOOK_CHECKPOINT to a Meta checkpoint folder
# (or a checkpoints.toml name) to run these cells on a real model.
CHECKPOINT = os.environ.get("WORKBENCH_NOTEBOOK_CHECKPOINT")'''

QUICKSTART = [
    ("md", """# workbench quick start

Load a model once per kernel, then run the batch APIs. With no checkpoint, `wb.load()` uses the
**embedded default**: the project's demo model, a tiny Llama 4 (MoE, NoPE and chunked-attention layers,
the real 202k vocabulary) trained to **call tools** in the official python-list format and to answer from
their results (`docs/demo-model.md`). It is a tool-calling demo, not a language model: it shows every
code path of a real Llama working — prompts, calls, batching, scoring — on a laptop CPU. Point
`WORKBENCH_NOTEBOOK_CHECKPOINT` at a Meta checkpoint folder to run the same cells on a real model."""),
    ("code", LOAD + '''
engine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=1024)
engine''', IGNORE),
    ("md", "Re-running `wb.load` with the same arguments never loads twice: the engine is a kernel-resident singleton."),
    ("code", "print(wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=1024) is engine, wb.current() is engine)", CHECK),
    ("md", """## A chat turn with a tool

Tools are plain Python functions: the schema comes from the signature, type hints and docstring. The
reply is parsed into `tool_calls` (name + arguments); press Shift+Tab inside the parentheses to see
every option with its default."""),
    ("code", '''from workbench import tools
from workbench.demo.tools import convert_currency, get_capital, get_local_time, get_weather

demo_tools = [get_weather, get_local_time, convert_currency, get_capital]
dialog = [{"role": "user", "content": "What's the weather in Paris?"}]
reply = engine.chat_completion(dialog, tools=demo_tools, max_tokens=64)
reply''', IGNORE),
    ("code", "print([(call.tool_name, call.arguments) for call in reply.message.tool_calls], reply.stop_reason)", CHECK),
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
the exact chat prompt `engine.formatter.encode_dialog` renders)."""),
    ("code", '''import torch

prompt = engine.formatter.encode_dialog(dialog, tools=demo_tools)


def continuation_logprob(text: str) -> float:
    """log P(text | prompt): the sum over the continuation's tokens."""
    ids = engine.tokenizer.encode(text, bos=False)
    logits = engine.logits([prompt + ids])[0]  # [len, vocab]
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # the positions that predict `ids`
    return float(logprobs.gather(1, torch.tensor(ids)[:, None]).sum())


for call in ['[get_weather(city="Paris")]', '[get_weather(city="Tokyo")]', '[get_local_time(city="Paris")]']:
    print(f"{continuation_logprob(call):8.2f}  {call}")''', IGNORE),
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
    print("stopped after", [len(r.tokens) for r in stopped.partial], "tokens per row;",
          {r.stop_reason for r in stopped.partial})
finally:
    stop.cancel()  # a Stop that comes too late must not hit the next call''', IGNORE),
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
    ("md", "## What is loaded\n\n`info()` and `memory()` display human sizes; the raw numbers are the dict's values."),
    ("code", "engine.info()", IGNORE),
    ("code", 'memory = engine.memory()\nprint(memory["weights_bytes"], "bytes of weights =", memory.readable()["weights_bytes"])',
     IGNORE),
    ("md", """## Images (Llama 4 and Llama 3.2 Vision)

User messages can hold images (PIL images, file paths, bytes) beside text. Llama 4 writes an image's tiles
into the prompt as `<|patch|>` tokens; Llama 3.2 Vision writes one `<|image|>` token per image and reads the
tiles through gated cross-attention layers. The demo model has no vision encoder, so these cells write a
*tiny random* Llama 3.2 Vision checkpoint in Meta's layout: its answers are noise, but the shapes, the prompt
format and every code path are the real ones. Loading it replaces the demo engine in this kernel."""),
    ("code", '''import tempfile

from PIL import Image

from workbench.checkpoints.factory import write_checkpoint
from workbench.checkpoints.vision32 import TINY_LLAMA32_VISION

folder = write_checkpoint(tempfile.mkdtemp(prefix="tiny-llama32-vision-"), TINY_LLAMA32_VISION)
vision = wb.load(folder, max_seq_len=512)
picture = Image.new("RGB", (320, 180), "steelblue")
image_dialog = [{"role": "user", "content": [picture, "What is in this picture?"]}]
wb.show_prompt(image_dialog, engine=vision)''', IGNORE),
    ("code", '''reply = vision.chat_completion(image_dialog, max_tokens=8)
print(reply.stop_reason, len(reply.tokens), "tokens; vision encoder", vision.info()["vision"])''', IGNORE),
]

TOOLS = '''from workbench import tools
from workbench.demo.tools import convert_currency, get_capital, get_local_time, get_weather

# Plain Python functions: the demo model was trained to call these (see docs/demo-model.md).
demo_tools = [get_weather, get_local_time, convert_currency, get_capital]'''

TOOL_EXPERIMENTS = [
    ("md", """# Multi-turn tool experiments

Tools are plain Python functions: their schema comes from the signature, type hints and docstring.
`tools.run` lets the model call them until it answers, feeding each result back as a tool message.
With no checkpoint, `wb.load()` gives the project's **demo model**, a tiny Llama 4 trained on synthetic
tool dialogs in the official python-list format (model card: `docs/demo-model.md`): it knows the demo
tools in `workbench.demo.tools` and answers by restating their results. Its accuracy on questions it
never saw is measured at the end of this notebook."""),
    ("code", LOAD + "\nengine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=1024)\n\n" + TOOLS + "\n\nengine",
     IGNORE),
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
    ("md", "## Many dialogs at once\n\nEach turn is batched across the dialogs still running:"),
    ("code", '''questions = ["What's the weather in Lima?", "Convert 250 EUR to JPY.", "What is the capital of Norway?",
             "What time is it in Pune?", "Tell me a story about dragons."]
dialogs = [[{"role": "user", "content": q}] for q in questions]
transcripts = tools.run_batch(engine, dialogs, tools=demo_tools, max_turns=3, max_tokens=64)
wb.to_frame(transcripts)''', IGNORE),
    ("code", '''for t in transcripts:
    show(t)
    print()''', CHECK),
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
and argument values the demo model never saw) batched through the engine, each dialog with its own
tools, and scores every case: the calls made, exact match of names and arguments, parse failures, and
whether the final answer restates the tool result. Below, the same cases under a system prompt the
model never saw in training, a sampling temperature, and the quantization modes. (Llama 4 takes custom
tools in the python-list format only; on a Llama 3.1 checkpoint `{"tool_prompt_format": "json"}` and
`"function_tag"` compare the call syntaxes the same way.) Read the numbers with the model card in
mind: the demo model is small and its training short."""),
    ("code", '''from workbench import evals

cases = evals.synthetic_cases(25, split="heldout", seed=7)
settings = [{"quantization": None}, {"system_prompt": ("answer briefly", "Answer briefly.")},
            {"temperature": 0.7}, {"quantization": "bf16"}, {"quantization": "fp8_mixed"},
            {"quantization": "int4_mixed"}]
results = evals.compare(engine, cases, settings)
summary = evals.summarize(results)
summary''', IGNORE),
    ("code", '''setting_columns = [c for c in evals.SETTING_KEYS if c in summary.columns]
summary["setting"] = [", ".join(f"{c}={v}" for c, v in zip(setting_columns, row) if v == v)  # NaN != NaN
                      for row in summary[setting_columns].itertuples(index=False)]
evals.plot_summary(summary, by="setting");''', IGNORE),
    ("md", "One row per case: what was expected and what the model did."),
    ("code", '''columns = ["kind", "expected_calls", "calls_made", "exact_match", "answer_has_result", "direct_answer"]
results[results["quantization"] == "none"][columns].head(10)''', IGNORE),
]

THROUGHPUT = [
    ("md", """# Throughput: batch size, prompt length and quantization

`bench.throughput` times `batch_completion` for every batch size and prompt length after a warm-up,
several times (medians, min–max spread), with prefill and decode rates and latency percentiles;
`workbench.notebook.plots` draws the table. Numbers depend on the machine and its load; `bench/` holds the
scripted versions."""),
    ("code", "%matplotlib inline\n" + LOAD + '''
from workbench import bench, plots

engine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=512)
engine''', IGNORE),
    ("code", '''table = bench.throughput(engine, batch_sizes=(1, 2, 4, 8), prompt_lens=(32,), max_tokens=12, repeats=3,
                         modes=[None, "int4_mixed"])
table[["mode", "batch_size", "tok_s", "tok_s_min", "tok_s_max", "prefill_tok_s", "decode_tok_s", "latency_p90_s",
       "speedup_vs_batch1"]].round(2)''', IGNORE),
    ("md", """**What to look at:** tokens/s should grow with the batch size (left) — the speed-up over running the
prompts one by one (right). Error bars show the spread over the repeats; one line per quantization mode."""),
    ("code", 'plots.throughput(table)  # save="throughput.png" writes a PNG too', IGNORE),
    ("code", "plots.latency(table)", IGNORE),
    ("md", "Batching never changes results: every row equals the prompt run alone."),
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
for run, rows in runs.values():  # warm-up: first calls allocate and pick kernels
    run(rows[:2], 2)
results = peers.measure(runs, max_tokens=16, repeats=1)
{name: {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()} for name, r in results.items()}''',
     IGNORE),
    ("code", '''print("rows equal:", {name: r["rows_equal_workbench"] for name, r in results.items()})
plots.peers(results)''', IGNORE),
]

QUANTIZATION = [
    ("md", """# Quantization: memory, speed and accuracy

`engine.set_quantization(mode)` re-loads the weights under another mode (one model resident at a
time). `bench.quantization` measures every mode on your prompts against the unquantized model."""),
    ("code", "%matplotlib inline\n" + LOAD + '''
from workbench import bench, plots

engine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=512)
prompts = ["The capital of France is", "def fibonacci(n):", "Llamas are", "Q: What is 17 * 23?\\nA:"]''', IGNORE),
    ("code", '''table = bench.quantization(engine, prompts, max_tokens=12, repeats=2)
table[["weights_bytes", "weights_ratio", "quantized_vs_bf16", "prefill_tok_s", "decode_tok_s", "top1_agreement",
       "mean_kl", "greedy_match"]].round(3)''', IGNORE),
    ("md", """**What to look at:** `weights_ratio` (memory against unquantized), the speeds, and how closely each
mode follows the unquantized model (`top1_agreement`, `mean_kl`, `greedy_match`)."""),
    ("code", 'plots.quantization(table)  # save="quantization.png" writes a PNG too', IGNORE),
    ("code", '''print("mode after the comparison:", engine.settings.quantization)
print("quantized layers at most 0.55x (fp8) / 0.30x (int4) of bf16:",
      table.loc["fp8_mixed", "quantized_vs_bf16"] <= 0.55 and table.loc["int4_mixed", "quantized_vs_bf16"] <= 0.30)''',
     CHECK),
    ("md", """## Toggle interactively

The dropdown re-loads the weights (it says "loading…", then the mode, weights size and time; an error
is shown here and the previous mode stays). The cells after it run on the chosen mode."""),
    ("code", '''from workbench.widgets import QuantizationToggle

QuantizationToggle(engine)''', IGNORE),
    ("code", "engine.memory()", IGNORE),
]

EVALUATIONS_INTRO = [
    ("md", """# The evaluations researchers already run

lm-evaluation-harness, BFCL and Inspect on the kernel's engine: each harness's own tasks, data and scoring,
with workbench's batch APIs underneath (requests gathered into engine batches, the model's official prompt
formats). Everything here runs offline on the embedded demo model; set `WORKBENCH_NOTEBOOK_CHECKPOINT` to
run the same cells on a real checkpoint."""),
    ("code", LOAD + '''
engine = wb.load(CHECKPOINT, max_batch_size=16, max_seq_len=2048)
engine''', IGNORE),
]

BFCL_INSPECT_CELLS = [
    ("md", """## BFCL: the Berkeley Function Calling Leaderboard, batched

`bfcl.run` answers BFCL's own questions (read from the installed `bfcl-eval` package) with the engine — every
entry with its own function set, all of them in one batch — and scores each reply with **BFCL's own AST
checker**. `prompt="official"` renders each entry in the model's own tool-calling format (what it was
trained on); `prompt="bfcl"` reproduces BFCL's Llama handler prompt, so numbers compare with the public
leaderboard. Side by side they show what the prompt format is worth, which no leaderboard shows."""),
    ("code", '''import pandas as pd

from workbench.evals import bfcl

categories = ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"]
results = pd.concat([bfcl.run(engine, categories, limit=5, prompt=p, max_tokens=64) for p in ("official", "bfcl")])
results[["prompt", "id", "calls", "valid", "error"]].head(8)''', IGNORE),
    ("code", '''summary = bfcl.summarize(results)     # accuracy per category, as BFCL counts it
summary''', IGNORE),
    ("code", "bfcl.plot(summary);", IGNORE),
    ("md", """## Inspect: the `workbench` model provider

Installing workbench registers a `workbench` provider with [Inspect](https://inspect.aisi.org.uk), so
`inspect eval task.py --model workbench/<checkpoints.toml name or folder>` works from a shell; in a notebook
pass the loaded engine. Tools reach the model in its official format, and the samples Inspect runs
concurrently are gathered into engine batches (the last column: rows per engine call)."""),
    ("code", '''import tempfile

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import tool


@tool
def get_weather():
    async def execute(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city name.
        """
        return f"It is sunny in {city}."

    return execute


cities = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito"]
task = Task(dataset=[Sample(input=f"What is the weather in {c}?", target=c) for c in cities],
            solver=[use_tools(get_weather()), generate()], scorer=includes())
model = get_model("workbench/default", engine=engine, memoize=False)
[log] = eval(task, model=model, display="none", log_dir=tempfile.mkdtemp(prefix="inspect-logs-"), max_tokens=48)
pd.DataFrame({
    "input": [s.input for s in log.samples],
    "tool calls": [[(c.function, c.arguments) for c in (s.messages[1].tool_calls or [])] for s in log.samples],
    "answer": [s.output.completion for s in log.samples],
    "score": [next(iter(s.scores.values())).value for s in log.samples],
})''', IGNORE),
    ("code", '''import matplotlib.pyplot as plt

sizes = model.api.batcher.stats.sizes
fig, ax = plt.subplots(figsize=(4, 2.4))
ax.bar(range(1, len(sizes) + 1), sizes)
ax.set_xlabel("engine call"), ax.set_ylabel("rows in the batch")
ax.set_title(f"{len(cities)} Inspect samples, accuracy {log.results.scores[0].metrics['accuracy'].value:.2f}")
fig.tight_layout()''', IGNORE),
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
does it write that call?"""),
    ("code", '''import json
import tempfile
from pathlib import Path

import lm_eval
import pandas as pd
from lm_eval.tasks import TaskManager

from workbench.evals.lm_eval import WorkbenchLM

folder = Path(tempfile.mkdtemp(prefix="lm-eval-tasks-"))
cities = ["Paris", "Tokyo", "Oslo", "Lima", "Cairo", "Quito", "Rome", "Seoul"]
docs = [{"q": f"What's the weather in {c}?", "choices": [f'[get_weather(city="{c}")]', f'[get_local_time(city="{c}")]',
                                                          f'[convert_currency(amount=1, from_currency="{c}")]'],
         "label": 0} for c in cities]
(folder / "calls.jsonl").write_text("".join(json.dumps(d) + "\\n" for d in docs))
mc = {"task": "calls_mc", "dataset_path": "json", "test_split": "test",
      "dataset_kwargs": {"data_files": {"test": str(folder / "calls.jsonl")}},
      "output_type": "multiple_choice", "doc_to_text": "{{q}}", "doc_to_choice": "{{choices}}",
      "doc_to_target": "{{label}}", "metric_list": [{"metric": "acc"}]}
gen = {**{k: v for k, v in mc.items() if k != "doc_to_choice"}, "task": "calls_gen", "output_type": "generate_until",
       "doc_to_target": "{{choices[0]}}", "generation_kwargs": {"until": ["\\n"], "max_gen_toks": 24},
       "metric_list": [{"metric": "exact_match"}]}
results = lm_eval.simple_evaluate(model=WorkbenchLM(engine), tasks=[mc, gen], apply_chat_template=True,
                                  log_samples=True, bootstrap_iters=0, task_manager=TaskManager(include_defaults=False))
pd.DataFrame(results["results"]).T[["acc,none", "exact_match,none"]]''', IGNORE),
    ("md", "Each answer is one `engine.score` row: the log-probability of its tokens after the question, in the model's chat format."),
    ("code", '''samples = results["samples"]["calls_mc"]
table = pd.DataFrame([[r[0][0] for r in s["resps"]] for s in samples], index=[s["doc"]["q"] for s in samples],
                     columns=["get_weather", "get_local_time", "convert_currency"])
table.plot.barh(figsize=(7, 3.5), xlabel="log-likelihood of the call").figure''', IGNORE),
]

SCALE_OUT = [
    ("md", """# Scale out: engine replicas on Ray

`workbench.cluster.load(..., replicas=N)` starts N engines, each in its own Ray actor (on its own GPUs when
the cluster has them), behind the engine's batch APIs: `batch_completion`, `batch_chat_completion`, the tool
loop and `workbench.evals` run on a pool unchanged, and every row is what one engine gives.

These cells run a local Ray on this machine. To run the **same cells on a cluster of GPU nodes**, set
`WORKBENCH_RAY_ADDRESS=auto` (on a node of the cluster) or `ray://head:10001` (from outside), and
`WORKBENCH_NOTEBOOK_CHECKPOINT` to a checkpoint folder that every node can read."""),
    ("code", '''import os

import workbench as wb
import workbench.cluster as wbc
from workbench.demo.tools import DEMO_TOOLS

CHECKPOINT = os.environ.get("WORKBENCH_NOTEBOOK_CHECKPOINT")  # None: the embedded demo model
ADDRESS = os.environ.get("WORKBENCH_RAY_ADDRESS")  # None: a local Ray (127.0.0.1); "auto" / "ray://...": a cluster
TOOLS = list(DEMO_TOOLS.values())

wbc.connect(ADDRESS, **({} if ADDRESS else {"num_cpus": 3}))  # a local Ray: room for 3 one-CPU replicas
pool = wbc.load(CHECKPOINT, replicas=2, max_batch_size=8, max_seq_len=2048, threads=1)
pool''', IGNORE),
    ("md", """Each replica is a Ray actor in its own placement group: on GPUs it holds `model_parallel_size` GPUs of
one node. `pool.replicas` says where each one runs."""),
    ("code", '''import pandas as pd

pd.DataFrame(pool.replicas)[["index", "state", "host", "pid", "cuda_visible_devices"]]''', IGNORE),
    ("md", """## The same rows as one engine

A batch is cut into chunks that the replicas pull; rows come back in input order. Batching never changes a
row and a seeded row is seeded the same on every replica, so greedy and seeded rows equal single runs."""),
    ("code", '''prompts = ["The capital of France is", "def fib(n):", "Llamas are", "Tell me a story"] * 3
batch = pool.batch_completion(prompts, max_tokens=12, temperature=0.8, top_p=0.9, seed=1)
alone = [pool.completion(p, max_tokens=12, temperature=0.8, top_p=0.9, seed=1) for p in prompts]
print("rows identical to single runs:", [b.tokens for b in batch] == [a.tokens for a in alone])''', CHECK),
    ("md", """## The tool loop and evaluations on a pool

`wb.tools.run_batch(pool, ...)` and `workbench.evals.run_cases(pool, ...)` take the pool where they take an
engine."""),
    ("code", '''dialogs = [[{"role": "user", "content": q}] for q in
           ["What's the weather in Paris?", "Convert 3 km to miles", "What time is it in Tokyo?",
            "How many people live in Lima?"]]
transcripts = wb.tools.run_batch(pool, dialogs, tools=TOOLS, max_tokens=48, max_turns=3)
transcripts[0]''', IGNORE),
    ("md", """## A sweep

`wbc.sweep(grid, dialogs, tools)` runs every grid point (load settings such as `quantization` or
`checkpoint`, call settings such as `tool_choice`, `tool_prompt_format` or `temperature`) over the same dialogs and returns
one DataFrame. A quantization change re-loads the replicas in place (and the pool's mode is restored after)."""),
    ("code", '''table = wbc.sweep({"quantization": [None, "int4_mixed"], "tool_choice": ["auto", "required"]},
                  dialogs, TOOLS, pool=pool, max_tokens=48)
table["called_a_tool"] = table["tool_calls"].map(bool)
table.groupby(["quantization", "tool_choice"], dropna=False)[["called_a_tool", "tokens"]].mean()''',
     IGNORE),
    ("md", """## Jobs: progress across replicas, cancel

`pool.submit_batch_chat_completion(...)` returns at once with a job: a progress bar of rows and tokens/s
over all replicas, `job.result()`, `job.cancel()` (stops within a decode step on every replica; finished
rows stay in `job.partial()`), `job.done` and per-replica statistics."""),
    ("code", '''job = pool.submit_batch_chat_completion(dialogs * 6, TOOLS, max_tokens=48, progress=True)
replies = job.result()
pd.DataFrame(job.stats()["per_replica"]).T''', IGNORE),
    ("md", """## Throughput against the replica count

The same batch on 1 and 2 replicas. On this 2-core machine two replicas share two cores (with Ray's own
processes), so **no gain is expected here**; on a machine with a core group or GPU per replica the rate grows
with the replicas."""),
    ("code", '''%matplotlib inline
import time

from matplotlib.figure import Figure

work = [f"Tell me about topic {i}. " * (1 + i % 3) for i in range(32)]


def rate(p):
    p.batch_completion(work[:2], max_tokens=2, progress=False)  # warm-up
    start = time.perf_counter()
    rows = p.batch_completion(work, max_tokens=24, temperature=0.7, seed=0, progress=False)
    return sum(len(r.tokens) for r in rows) / (time.perf_counter() - start)


rates = {2: rate(pool)}
with wbc.load(CHECKPOINT, replicas=1, max_batch_size=8, max_seq_len=2048, threads=1) as one:
    rates[1] = rate(one)
fig = Figure(figsize=(4, 3))
ax = fig.subplots()
ax.plot(sorted(rates), [rates[n] for n in sorted(rates)], marker="o")
ax.set_xlabel("replicas")
ax.set_ylabel("tokens/s")
ax.set_xticks(sorted(rates))
ax.set_title("batch_completion throughput")
fig''', IGNORE),
    ("md", "`pool.shutdown()` ends every replica and its worker processes; `wbc.disconnect()` stops the local Ray."),
    ("code", '''pool.shutdown()
wbc.disconnect()
print(pool)''', IGNORE),
    ("code", 'print("every replica ended:", all(r["state"] == "closed" for r in pool.replicas), "| died:", pool.deaths)',
     CHECK),
]

NOTEBOOKS = {
    "01": ("01_quickstart.ipynb", QUICKSTART),
    "02": ("02_tool_experiments.ipynb", TOOL_EXPERIMENTS),
    "03": ("03_throughput.ipynb", THROUGHPUT),
    "04": ("04_quantization.ipynb", QUANTIZATION),
    "05": ("05_scale_out.ipynb", SCALE_OUT),
    "06": ("06_evaluations.ipynb", EVALUATIONS_INTRO + LM_EVAL_CELLS + BFCL_INSPECT_CELLS),
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
    """Strip what differs between runs and says nothing to a reader: timings, cell ids' noise, and the redraws
    of third-party text bars (stored as what a reader sees: each line after its last carriage return)."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        outputs = cell.get("outputs", [])
        if any(o.get("output_type") == "stream" and "\r" in o.get("text", "") for o in outputs):
            cell.outputs = [nbformat.from_dict(o) for o in _coalesced(outputs)]
            for o in cell.outputs:
                if o.get("output_type") == "stream":
                    o.text = _output_texts(o)[0]
    nb.metadata["language_info"] = {"name": "python"}
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


def stale_outputs(nb: nbformat.NotebookNode) -> list[str]:
    """What a reader of the stored notebook would see as broken: a half-finished progress bar, or a widget
    output whose model is missing from the saved widget state (it renders as "model not found")."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    problems = []
    for number, cell in enumerate(nb.cells):
        for output in _coalesced(cell.get("outputs", [])):
            if any(HALF_BAR.search(text) for text in _output_texts(output)):
                problems.append(f"cell {number}: a progress bar stopped part-way")
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is not None and view.get("model_id") not in state:
                problems.append(f"cell {number}: a widget view whose model {view.get('model_id')} is not saved")
    return problems


def build(key: str, execute: bool = True) -> Path:
    name, cells = NOTEBOOKS[key]
    nb = make(cells)
    if execute:
        NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(HERE)}},
                       store_widget_state=True, record_timing=False).execute()
        problems = stale_outputs(nb)
        if problems:
            rejected = Path(tempfile.gettempdir()) / f"rejected-{name}"
            nbformat.write(clean(nb), rejected)
            raise SystemExit(f"{name} would be stored with stale outputs ({rejected}): " + "; ".join(problems))
    path = HERE / name
    nbformat.write(clean(nb), path)
    return path


if __name__ == "__main__":
    keys = sys.argv[1:] or list(NOTEBOOKS)
    for key in keys:
        print("wrote", build(key))
