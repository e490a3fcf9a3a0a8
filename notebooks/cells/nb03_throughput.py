"""The cells of 03_throughput.ipynb: speed against batch size, prompt length and quantization."""

from __future__ import annotations

from cells.common import CHECK, IGNORE, LAB, LOAD

THROUGHPUT = [
    LAB,
    (
        "md",
        """# Throughput: batch size, prompt length and quantization

`bench.throughput` times batched generation for every batch size, prompt length and quantization mode after
a warm-up, several times (medians, min–max spread). Every row generates exactly the same number of tokens
(stop tokens are kept as ordinary tokens, so no mode or batch "wins" by stopping early), and the speeds have
one definition here, in `04_quantization.ipynb` and in `bench/`: **prefill** = prompt tokens / time to first
token (a call that generates one token per row); **decode** = the tokens after each row's first / the rest of
the call's time. Three modes: `none` (the checkpoint's float32), `bf16`, and `int4_mixed` (int4 experts, the
rest in bfloat16 — so `bf16` is its baseline as much as `none`). Numbers depend on the machine and its load,
and on the thread count and CPU kernels printed below; `bench/` holds the scripted versions. About a minute on
a 2-core CPU.""",
    ),
    (
        "code",
        "%matplotlib inline\n"
        + LOAD
        + """
import pandas as pd
import torch

from workbench import bench, plots

engine = wb.load(CHECKPOINT, max_batch_size=8, max_seq_len=512)
print("torch threads:", torch.get_num_threads())
# the kernels the engine chose on the CPU running this notebook, per mode, and why (decided at load)
for mode in (None, "bf16", "int4_mixed"):
    print(f"{mode or 'none':>10}:", engine.settings.with_quantization(mode).kernels)
engine""",
        IGNORE,
    ),
    (
        "code",
        """table = bench.throughput(engine, batch_sizes=(1, 2, 4, 8), prompt_lens=(32, 256), max_tokens=12, repeats=3,
                         modes=[None, "bf16", "int4_mixed"])
table[["mode", "prompt_len", "batch_size", "generated_tokens", "tok_s", "tok_s_min", "tok_s_max", "prefill_tok_s",
       "decode_tok_s", "total_s", "speedup_vs_batch1"]].round(2)""",
        IGNORE,
    ),
    (
        "md",
        """**What to look at:** every cell generated the same 12 tokens per row (`generated_tokens` = batch size ×
12), so the rates compare equal work. `tok_s` is the median of 3 runs, `tok_s_min`–`tok_s_max` their spread,
`total_s` the median wall time of one call. Tokens/s should grow with the batch size (left) — the speed-up over
running the prompts one by one (right); longer prompts cost more prefill per call. Error bars show the spread
over the repeats; one line per quantization mode and prompt length.

`decode_tok_s` is the call's time minus a prefill measured in a separate call, so its noise is both calls'
noise: where it comes out *higher* after 256-token prompts than after 32 that is noise, not a speed-up. Per
step, decode here barely depends on the prompt length — each step's cost is the 202k-row output projection,
not attention over 32 or 256 keys.""",
    ),
    ("code", 'plots.throughput(table)  # save="throughput.png" writes a PNG too', IGNORE),
    ("code", "plots.latency(table)", IGNORE),
    (
        "md",
        """What the modes do to the rate here, **cell by cell** (the same work in every mode). A cell's verdict uses
its own repeats: faster only when the slowest run of the mode beats the fastest run of the baseline, slower only
when the reverse holds, otherwise not shown to differ. Cells that disagree are reported apart, never pooled into
one word:""",
    ),
    (
        "code",
        """cells = table.set_index(["mode", "prompt_len", "batch_size"])
verdicts = []
for mode, base in [("bf16", "none"), ("int4_mixed", "none"), ("int4_mixed", "bf16")]:
    for (prompt_len, batch), row in cells.loc[mode].iterrows():
        other = cells.loc[(base, prompt_len, batch)]
        low, high = row.tok_s_min / other.tok_s_max, row.tok_s_max / other.tok_s_min
        verdict = "faster" if low > 1 else "slower" if high < 1 else "not shown to differ"
        verdicts.append({"ratio": f"{mode} ÷ {base}", "prompt_len": prompt_len, "batch_size": batch,
                         "median": row.tok_s / other.tok_s, "low": low, "high": high, "verdict": verdict})
verdicts = pd.DataFrame(verdicts)
for name, group in verdicts.groupby("ratio", sort=False):
    parts = []
    for verdict, cell in group.groupby("verdict", sort=False):  # which cells, by prompt length and batch size
        where = " and ".join(f"prompt {n} x batch {', '.join(map(str, sorted(c.batch_size)))}"
                             for n, c in cell.groupby("prompt_len"))
        parts.append(f"{verdict} at {where} ({len(cell)} cell{'s' if len(cell) > 1 else ''}, medians from {cell['median'].min():.2f} to "
                     f"{cell['median'].max():.2f})")
    print(f"{name:<18}", "; ".join(parts))
verdicts.pivot_table(index=["prompt_len", "batch_size"], columns="ratio", values="median", sort=False).round(2)""",
        IGNORE,
    ),
    (
        "md",
        """A speed-up over batch 1 above the batch size (more than 8× from 8 rows) is no super-linear batching: it
means that mode's batch-1 call is slow. The cell below names each such cell and sets its batch-1 call beside
`none`'s:""",
    ),
    (
        "code",
        """batch1 = cells.xs(1, level="batch_size")["tok_s"]
above = table[table.speedup_vs_batch1 > table.batch_size]
for row in above.itertuples():
    own, plain = batch1[(row.mode, row.prompt_len)], batch1[("none", row.prompt_len)]
    print(f"{row.mode} prompt {row.prompt_len} batch {row.batch_size}: {row.speedup_vs_batch1:.2f}x its own batch-1 "
          f"call ({own:.1f} tok/s, against none's {plain:.1f}); over none's batch-1 call it is "
          f"{row.tok_s / plain:.2f}x")
if above.empty:
    print("no cell's speed-up over batch 1 exceeds its batch size")""",
        IGNORE,
    ),
    (
        "md",
        """What the modes change on a CPU: `none` runs
float32 products, with a packed copy of the output matrix for batched decode (`packed_bytes`,
`01_quickstart.ipynb`); `bf16` runs the same products in bfloat16 — half the bytes, no packed copy, and native
speed only on CPUs with AVX-512 BF16 or AMX instructions; `int4_mixed` is bf16 with the experts in int4 through
torch's int4 kernel. On the demo model those experts are a few MiB beside the 202k-row embedding and output
that both store alike, so `int4_mixed ÷ bf16` is the ratio that isolates int4: its printed line, cell by
cell, is all this run says about int4's speed.
What bf16 and int4 surely buy here is memory (`04_quantization.ipynb`).

Batching never changes results: every row equals the prompt run alone.""",
    ),
    (
        "code",
        """prompts = [f"Tell me about topic number {i}. " * (1 + i % 5) for i in range(8)]
batched = engine.batch_completion(prompts, max_tokens=12, progress=False)
alone = [engine.completion(p, max_tokens=12) for p in prompts]
print("rows identical to single runs:", [b.tokens for b in batched] == [a.tokens for a in alone])""",
        CHECK,
    ),
    (
        "md",
        """## Why this and not the others

The same prompts through workbench, Meta's reference generator (`llama-models`, the engine workbench
reproduces) and — when installed — transformers `generate`, on the same weights: a small Llama 3 with the
real 128k vocabulary and random weights, written in Meta's layout (and converted for transformers by
`bench/contenders.py`). Greedy, float32, stop tokens ignored so every contender generates exactly the
same tokens per prompt; the rows must agree. This replaces the demo engine in this kernel (one model at
a time). `bench/peers.py` runs the full comparison (more workloads, repeats, three models).""",
    ),
    (
        "code",
        """import importlib.util
import os
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(wb.__file__).resolve().parents[1] / "bench"))  # a source checkout: bench/
import contenders  # noqa: E402
import peers  # noqa: E402
from common import peer_model_dir  # noqa: E402

previous_clock = os.environ.get("BENCH_CLOCK")  # put back after the measurement
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
try:
    results = peers.measure(runs, max_tokens=16, repeats=1)
finally:
    if previous_clock is None:
        os.environ.pop("BENCH_CLOCK", None)
    else:
        os.environ["BENCH_CLOCK"] = previous_clock
{name: {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()} for name, r in results.items()}""",
        IGNORE,
    ),
    (
        "code",
        """print("rows equal:", {name: r["rows_equal_workbench"] for name, r in results.items()})
plots.peers(results, title=f"{len(prompts)} prompts × 16 generated tokens, the same weights, greedy, "
                          f"{torch.get_num_threads()} thread(s)")""",
        IGNORE,
    ),
    (
        "md",
        """## Where to go next

- `04_quantization.ipynb`: memory, speed and fidelity of every quantization mode.
- `05_scale_out.ipynb`: more throughput from engine replicas on Ray.
- `bench/peers.py`, `bench/roofline.py` and `docs/benchmarks.md`: the scripted measurements and their numbers.""",
    ),
]
