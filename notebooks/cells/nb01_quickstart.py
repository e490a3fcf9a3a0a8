"""The cells of 01_quickstart.ipynb: load the embedded default model and run the batch APIs."""

from __future__ import annotations

from cells.common import CHECK, IGNORE, LAB, LOAD

QUICKSTART = [
    LAB,
    (
        "md",
        """# workbench quick start

Load a model once per kernel, then run the batch APIs. With no checkpoint, `wb.load()` uses the
**embedded default**: the project's demo model, a tiny Llama 4 (MoE, NoPE and chunked-attention layers,
the real 202k vocabulary) trained to **call tools** in the official python-list format and to answer from
their results (`docs/demo-model.md`). It is a tool-calling demo, not a language model: it shows every
code path of a real Llama working — prompts, calls, batching, scoring — on a laptop CPU. Point
`WORKBENCH_NOTEBOOK_CHECKPOINT` at a Meta checkpoint folder to run the same cells on a real model.
This notebook takes under half a minute on a 2-core CPU.""",
    ),
    (
        "code",
        LOAD
        + """
engine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=1024)
engine""",
        IGNORE,
    ),
    (
        "md",
        "Re-running `wb.load` with the same arguments never loads twice: the engine is a kernel-resident singleton.",
    ),
    ("code", "print(wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=1024) is engine, wb.current() is engine)", CHECK),
    (
        "md",
        """## A chat turn with a tool

Tools are plain Python functions: the schema comes from the signature, type hints and docstring. The
reply is parsed into `tool_calls` (name + arguments); press Shift+Tab inside the parentheses to see
every option with its default. The demo model was trained with one to four tools offered at a time;
here it gets four. The demo tools return **made-up values**: a hash of the arguments picks them, so the
same call always gets the same result (Paris is always "29 C and snowy") — reproducible, and checkable
in the model's answer, but not real weather, times, rates or populations.""",
    ),
    (
        "code",
        """from workbench import tools
from workbench.demo.tools import convert_currency, get_capital, get_local_time, get_weather

demo_tools = [get_weather, get_local_time, convert_currency, get_capital]
dialog = [{"role": "user", "content": "What's the weather in Paris?"}]
reply = engine.chat_completion(dialog, tools=demo_tools, max_tokens=64)
reply""",
        IGNORE,
    ),
    (
        "code",
        "print([(call.tool_name, call.arguments) for call in reply.message.tool_calls], reply.stop_reason)",
        CHECK,
    ),
    (
        "md",
        """## The exact prompt

`wb.show_prompt` shows the prompt the model sees, in its official format: the tool definitions in
Meta's wording, special tokens highlighted, tokens per message, and a token-by-token view. It works
without a loaded model too, given a model id (`model="Llama3.2-3B-Instruct"`).""",
    ),
    ("code", "wb.show_prompt(dialog, tools=demo_tools, engine=engine)", IGNORE),
    (
        "md",
        """## The tool loop

`tools.run` runs every call the model makes, feeds the result back as a tool message and lets the
model go on until it answers. The transcript shows each call and the result that answers it, and why
the loop ended (`stop_reason`: `answered`, `max_turns`, `prompt_too_long`, `out_of_tokens`).""",
    ),
    (
        "code",
        """transcript = tools.run(engine, dialog, tools=demo_tools, max_tokens=64)
transcript""",
        IGNORE,
    ),
    ("code", 'print(transcript.stop_reason, "-", transcript[-1].content)', CHECK),
    (
        "md",
        """## A batch of dialogs

`tools.run_batch` runs many dialogs at once: each turn is one batched chat completion over the dialogs
still running, and every transcript is exactly what its dialog gives alone (greedy), so batching is
purely a speed choice. `wb.to_frame` turns transcripts (or results) into a DataFrame. Long batches show
a progress bar that leaves a one-line summary when the call is done.""",
    ),
    (
        "code",
        """questions = ["What time is it in Tokyo?", "Convert 20 EUR to USD.", "What is the capital of Norway?",
             "What's the weather in Paris? Convert 20 EUR to USD."]
dialogs = [[{"role": "user", "content": q}] for q in questions]
transcripts = tools.run_batch(engine, dialogs, tools=demo_tools, max_tokens=64)
wb.to_frame(transcripts)[["dialog", "role", "content", "tool_calls", "dialog_ended"]]""",
        IGNORE,
    ),
    (
        "code",
        """alone = [tools.run(engine, d, tools=demo_tools, max_tokens=64) for d in dialogs]
same = all([(m.role, m.content) for m in a] == [(m.role, m.content) for m in b] for a, b in zip(transcripts, alone))
print("batched transcripts identical to single runs:", same)""",
        CHECK,
    ),
    (
        "md",
        """## Scoring with `logits`

`engine.logits` returns teacher-forced float32 `[len, vocab]` logits per sequence, so any continuation
can be scored: here, how much the model prefers each candidate call for the question (the prompt is
the exact chat prompt `engine.formatter.encode_dialog` renders, tools included).""",
    ),
    (
        "code",
        '''import torch

prompt = engine.formatter.encode_dialog(dialog, tools=demo_tools)


def continuation_logprob(text: str) -> float:
    """log P(text | prompt): the sum over the continuation's tokens."""
    ids = engine.tokenizer.encode(text, bos=False)
    logits = engine.logits([prompt + ids])[0]  # [len, vocab]
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # the positions that predict `ids`
    return float(logprobs.gather(1, torch.tensor(ids)[:, None]).sum())


for call in ['[get_weather(city="Paris")]', '[get_weather(city="Tokyo")]', '[get_local_time(city="Paris")]']:
    logprob = continuation_logprob(call)
    print(f"log P = {logprob:7.3f}  (P = {torch.tensor(logprob).exp():.2e})  {call}")''',
        IGNORE,
    ),
    (
        "md",
        """## Sampling and log-probabilities

With `logprobs=k` each token of a result is shaded by its probability (red = unlikely; hover a token
for its top-k alternatives), and `.to_pandas()` gives one row per token. A seed makes sampled rows
reproducible, alone or inside any batch.""",
    ),
    (
        "code",
        """scored = engine.chat_completion(dialog, tools=demo_tools, max_tokens=24, logprobs=3)
scored""",
        IGNORE,
    ),
    ("code", "scored.to_pandas().head(6)", IGNORE),
    (
        "code",
        """a = engine.chat_completion(dialog, tools=demo_tools, max_tokens=24, temperature=0.7, top_p=0.9, seed=42)
b = engine.chat_completion(dialog, tools=demo_tools, max_tokens=24, temperature=0.7, top_p=0.9, seed=42)
print("same seed, same tokens:", a.tokens == b.tokens)""",
        CHECK,
    ),
    (
        "md",
        """## Streaming and stopping

Chat replies stream as text and tool-call deltas. `engine.cancel()` stops the running call at its next
decode step — from a Stop button, a timer or another thread. The call raises `GenerationCancelled`
carrying what was generated so far, and the engine is unchanged: the next call gives exactly what it
would have.""",
    ),
    (
        "code",
        """for item in engine.stream_chat_completion(dialog, tools=demo_tools, max_tokens=64):
    print(type(item).__name__, repr(getattr(item, "text", "")), getattr(item, "tool_call", None) or "")""",
        IGNORE,
    ),
    (
        "code",
        """import threading

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
    stop.cancel()  # a Stop that comes too late must not hit the next call""",
        IGNORE,
    ),
    (
        "md",
        """The four rows are the same prompt, decoded greedily, so they are the same tokens; where one row is a token
longer, that is when the Stop landed: a decode step computes every row's next token, the call hands them
over row by row, and the cancel is seen after the first row's token of that step was taken — the others'
tokens of the same step are dropped with the call.""",
    ),
    (
        "code",
        """first = engine.chat_completion(dialog, tools=demo_tools, max_tokens=24)
again = engine.chat_completion(dialog, tools=demo_tools, max_tokens=24)
print("same result after a cancel:", first.tokens == again.tokens)""",
        CHECK,
    ),
    (
        "md",
        """## Raw completion

`completion` / `batch_completion` continue raw text or token ids (a BOS token is added to strings). This
is where a real checkpoint shines; the demo model learned tool dialogs only, so on free text it writes
word salad — that is expected, not a bug.""",
    ),
    (
        "code",
        """batch = engine.batch_completion(["The capital of France is", "def fib(n):"], max_tokens=12)
wb.to_frame(batch)""",
        IGNORE,
    ),
    ("md", "Errors name the problem and the fix, and leave the engine usable:"),
    (
        "code",
        """try:
    engine.completion("hi", temperature=-1)
except wb.WorkbenchError as err:
    print(type(err).__name__, "-", err)
print(len(engine.completion("still works", max_tokens=3).tokens))""",
        CHECK,
    ),
    (
        "md",
        """## What is loaded

`info()` and `memory()` display human sizes (the raw numbers are the dict's values); `memory()` says per part
of the model what is stored in which type. The checkpoint is shown from `~`: the demo model is expanded into
`~/.cache/workbench` (or `$WORKBENCH_CACHE`) on first use.

`packed_bytes` is memory beside `weights_bytes`, not in it: on a CPU, an unquantized (float32) model keeps a
second, oneDNN-packed float32 copy of its output matrix, on which batched decode runs 1.2–2× faster
(`ColumnParallel.pack_for_cpu`, `docs/design/model.md`). So the weights here really occupy `weights_bytes` +
`packed_bytes`; bf16 and the quantized modes keep no such copy (`packed_bytes` 0), and
`04_quantization.ipynb` counts it when it compares their memory.""",
    ),
    ("code", "engine.info()", IGNORE),
    (
        "code",
        """memory = engine.memory()
print(memory["weights_bytes"], "bytes of weights =", memory.readable()["weights_bytes"])
memory""",
        IGNORE,
    ),
    (
        "md",
        """## Images (Llama 4 and Llama 3.2 Vision)

User messages can hold images (PIL images, file paths, bytes) beside text. Llama 4 writes an image's tiles
into the prompt as `<|patch|>` tokens; Llama 3.2 Vision writes one `<|image|>` token per image and reads the
tiles through gated cross-attention layers. The demo model has no vision encoder, so these cells write a
*tiny random* Llama 3.2 Vision checkpoint in Meta's layout (into the workbench cache, once): its answers are
noise, but the shapes, the prompt format and every code path are the real ones. Loading it replaces the demo
engine in this kernel.""",
    ),
    (
        "code",
        """from PIL import Image

from workbench.checkpoints.factory import cache_root, write_checkpoint
from workbench.checkpoints.vision32 import TINY_LLAMA32_VISION

folder = cache_root() / "tiny-llama32-vision"
if not (folder / "params.json").exists():
    write_checkpoint(folder, TINY_LLAMA32_VISION)
vision = wb.load(folder, max_seq_len=512)
picture = Image.new("RGB", (320, 180), "steelblue")
image_dialog = [{"role": "user", "content": [picture, "What is in this picture?"]}]
wb.show_prompt(image_dialog, engine=vision)""",
        IGNORE,
    ),
    (
        "code",
        """reply = vision.chat_completion(image_dialog, max_tokens=8)
print(reply.stop_reason, len(reply.tokens), "tokens; vision encoder", vision.info()["vision"])""",
        IGNORE,
    ),
    (
        "md",
        """## Where to go next

- `02_tool_experiments.ipynb`: multi-turn tool dialogs, the playground, and measuring tool calling.
- `03_throughput.ipynb` and `04_quantization.ipynb`: speed against batch size, and what each quantization
  mode costs and saves.
- Your own checkpoint: the README's "Your own checkpoint" section (Meta's weights, `checkpoints.toml`, the
  GPU install); then set `WORKBENCH_NOTEBOOK_CHECKPOINT` and run these cells again.""",
    ),
]
