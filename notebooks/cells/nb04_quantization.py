"""The cells of 04_quantization.ipynb: memory, speed and fidelity of every quantization mode."""

from __future__ import annotations

from cells.common import CHECK, IGNORE, LAB, LOAD

QUANTIZATION = [
    LAB,
    (
        "md",
        """# Quantization: memory, speed and fidelity

`engine.set_quantization(mode)` re-loads the weights under another mode (one model resident at a time).
The modes are Meta's meta-reference scheme: `bf16` stores every weight in bfloat16; `fp8_mixed` stores the
routed experts of the MoE layers in fp8 except those of the first and last layers (Llama 3: the feed-forwards
of every layer but the first and last), `int4_mixed` every expert (Llama 3: every feed-forward) in int4 — and,
as in Llama Stack, **every part a mode leaves unquantized
is stored in bfloat16** unless `wb.load(..., dtype=...)` asks for another type, so memory falls from bf16 to
fp8_mixed to int4_mixed on every device. `bench.quantization` measures every mode against the unquantized
model on the prompts you give it: here, tool dialogs as the demo model was trained on them (one or two tools
offered). Under a minute on a 2-core CPU.""",
    ),
    (
        "code",
        "%matplotlib inline\n"
        + LOAD
        + """
from workbench import bench, plots
from workbench.demo.tools import convert_currency, get_capital, get_local_time, get_weather

engine = wb.load(CHECKPOINT, max_batch_size=16, max_seq_len=1024)
dialogs = [("What's the weather in Paris?", [get_weather]), ("Convert 20 EUR to USD.", [convert_currency, get_weather]),
           ("What is the capital of Peru?", [get_capital, get_local_time]), ("Tell me a joke.", [get_capital]),
           ("What time is it in Oslo?", [get_local_time, get_weather]), ("Is it raining in Lima?", [get_weather]),
           ("Convert 75 USD to JPY.", [convert_currency]), ("Capital of Norway?", [get_capital]),
           ("Local time in Tokyo, please.", [get_local_time]), ("Weather report for Cairo.", [get_weather, get_capital]),
           ("What is the capital of Japan?", [get_capital, get_weather]), ("Hello there!", [get_weather])]
prompts = [engine.formatter.encode_dialog([{"role": "user", "content": q}], tools=t) for q, t in dialogs]""",
        IGNORE,
    ),
    (
        "code",
        '''import pandas as pd

table = bench.quantization(engine, prompts, max_tokens=16, repeats=5)


def mib(column):
    return (table[column] / 2**20).round(1)


def speed(column):  # the median of the runs, with their min–max
    return [f"{m:,.0f} ({lo:,.0f}–{hi:,.0f})" for m, lo, hi in
            zip(table[column], table[f"{column}_min"], table[f"{column}_max"])]



def versus(column, mode, base):
    """The ratio of medians to the baseline's, with the range the runs allow (slowest vs fastest run of each),
    and the verdict that range supports: faster or slower only when it excludes 1."""
    low, high = table.loc[mode, f"{column}_min"], table.loc[mode, f"{column}_max"]
    ratio = table.loc[mode, column] / table.loc[base, column]
    ratio_low, ratio_high = low / table.loc[base, f"{column}_max"], high / table.loc[base, f"{column}_min"]
    verdict = "faster" if ratio_low > 1 else "slower" if ratio_high < 1 else "not shown to differ"
    return f"{column.split('_')[0]:>7} {mode} ÷ {base} {ratio:.2f}x [{ratio_low:.2f}, {ratio_high:.2f}]: {verdict}"


# each mode against float32, and the quantized modes against bf16 too: everything they do not quantize is bf16
for column in ("prefill_tok_s", "decode_tok_s"):
    for mode in table.index[1:]:
        print(versus(column, mode, "none"))
    for mode in ("fp8_mixed", "int4_mixed"):
        print(versus(column, mode, "bf16"))
pd.DataFrame({"weights MiB": mib("weights_bytes"), "+ packed copy MiB": mib("packed_bytes"),
              "= resident MiB": mib("resident_bytes"), "resident ÷ none": table["resident_ratio"].round(3),
              "kernels": table["kernels"], "prefill tok/s (min–max)": speed("prefill_tok_s"),
              "decode tok/s (min–max)": speed("decode_tok_s")}, index=table.index)''',
        IGNORE,
    ),
    (
        "md",
        """**What to look at:** the memory the weights really occupy (`resident`): the weights, plus — for the
unquantized float32 model on a CPU — the packed float32 copy of the output matrix its batched-decode kernel
keeps (`packed_bytes`, see `01_quickstart.ipynb`; bf16 and the quantized modes keep none). Against the weights
alone bf16 looks like a halving; counted whole it is about a third. Then the speeds: the same definitions as
`03_throughput.ipynb`, on fresh prompts of the same lengths, every row generating the same 16 tokens, each the
median of 5 runs with their spread.

How closely each mode follows the unquantized model on the replies to these dialogs: `top1_agreement` and
`mean_kl` (nats) over the reply positions, `greedy_match` (reference tokens reproduced before the first
divergence) and `same_reply` — the share of dialogs whose whole reply (the call and its arguments) is
unchanged, with its 95% Wilson interval over the `rows` dialogs. This is *fidelity to the unquantized model* on
these 12 dialogs, not accuracy on a task: a mode can match every reply and still be wrong wherever `none` is,
and 12 dialogs bound a rate loosely (12 of 12 leaves a 95% interval down to about 0.76):""",
    ),
    (
        "code",
        """fidelity = table[["positions", "top1_agreement", "mean_kl", "greedy_match", "same_reply",
                  "same_reply_low", "same_reply_high", "rows"]].round(3)
fidelity["mean_kl"] = table["mean_kl"].map("{:.1e}".format)  # small numbers, shown whole
fidelity""",
        IGNORE,
    ),
    ("md", "What each part of the model is stored as, per mode (every type a part is stored in):"),
    ("code", "bench.memory_table(table)", IGNORE),
    (
        "md",
        """The demo model is 82M parameters, 77.6M of them its 202k-row embedding and output matrices, which no
mode quantizes: bf16 halves them (and drops the packed copy), and fp8/int4 then shrink only the few MiB of
experts. Under `fp8_mixed` the routed experts are stored in **two** types: fp8 for the MoE layers in the
middle, bfloat16 for the first and last layer's — here the demo model's six layers hold MoE at layers 1, 3 and
5, and layer 5, the last, keeps its experts in bfloat16, a third of them. That is Llama Stack's fp8_mixed
(`llama_models`' fp8 loader skips `layer_id == 0` and `n_layers - 1`; workbench's `quantization_plan` does
the same), which leaves the layers nearest the embedding and the output unquantized. `int4_mixed`
quantizes every MoE layer's routed and shared experts. On a real Llama the experts and feed-forwards are most
of the weights, and the same table shows where the memory goes.

On speed, every claim is the lines printed above the first table: each mode's median against `none`'s — and
the quantized modes' against `bf16`'s, their real baseline, since everything they leave unquantized is bf16 —
as a ratio, with the range its runs allow (its slowest run against `none`'s fastest, and the other way round), and
the verdict that range supports — faster or slower only when the range excludes 1, else *not shown to differ*
(this run does not tell them apart; more `repeats` narrow the range). The sentences below say why a mode can
go either way, not which way it went here. Every product a mode does not quantize runs in bfloat16 under bf16, fp8_mixed and
int4_mixed, and in float32 under `none`. **Prefill** (products over many prompt tokens at once) gains from
bfloat16 on a CPU with AVX-512 BF16 or AMX instructions, which computes it natively on half the bytes (a CPU
without them converts first, which costs time; the measured ratio says which effect won here). **Decode** (a few rows per step) weighs two things: bfloat16 reads
half the bytes, but only float32 has the packed copy of the 202k-row output matrix, each step's largest
product; it is also where this machine's noise shows most, since decode is a call's time minus a separately
timed prefill. On top of that, a CPU has no fp8 matmul, so `fp8/dequant` widens the fp8 weights before every
product (on a CPU fp8_mixed checks numerics and saves memory; it is not built to save time), and `int4/cpu`
is torch's int4 kernel, which reads a quarter of bfloat16's bytes for the experts and runs everything else
in bfloat16: its ratio above, with its range, says whether that paid on this machine. On GPUs with fp8 tensor cores the
kernel is `fp8/scaled_mm`.""",
    ),
    ("code", 'plots.quantization(table)  # save="quantization.png" writes a PNG too', IGNORE),
    (
        "code",
        """print("mode after the comparison:", engine.settings.quantization or "none")
print("memory falls bf16 > fp8_mixed > int4_mixed:",
      table.loc["bf16", "weights_bytes"] > table.loc["fp8_mixed", "weights_bytes"] > table.loc["int4_mixed", "weights_bytes"])
print("quantized layers at most 0.55x (fp8) / 0.30x (int4) of bf16:",
      table.loc["fp8_mixed", "quantized_vs_bf16"] <= 0.55 and table.loc["int4_mixed", "quantized_vs_bf16"] <= 0.30)""",
        CHECK,
    ),
    (
        "md",
        """## Toggle interactively

The dropdown re-loads the weights (it says "loading…", then the mode, weights size and time; an error
is shown here and the previous mode stays). The cells after it run on the chosen mode.""",
    ),
    (
        "code",
        """from workbench.widgets import QuantizationToggle

QuantizationToggle(engine)""",
        IGNORE,
    ),
    ("code", "engine.memory()", IGNORE),
    (
        "md",
        """## Where to go next

- `02_tool_experiments.ipynb`: the tool-calling rates of the baseline and int4 on held-out cases.
- `05_scale_out.ipynb`: a quantization sweep over engine replicas on Ray.
- On a GPU (README, "Your own checkpoint"): `wb.load(..., quantization="fp8_mixed")` uses fp8 matmuls
  (`torch._scaled_mm`) where the GPU has them, and the same cells measure a real checkpoint.""",
    ),
]
