"""Quantization modes on both CPU kernel paths, before and after kernels were chosen per CPU: one run, one JSON line.

For each ISA path (this machine's default, and AVX2 forced with ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2``, each in its own subprocess: torch reads them at import) and each kernel choice
(``legacy`` = before, ``auto`` = chosen by the CPU; ``$WORKBENCH_CPU_KERNELS``), it measures:

* the demo model (``wb.load(max_batch_size=8, quantization=q)``, q in none/bf16/int4_mixed): the median wall
  time of a prefill (``max_tokens=1``) and of a call generating ``--max-tokens`` tokens, at batch 1 and 8
  (prompts of ``--prompt-len`` random tokens, fresh each call); decode = the tokens after each row's first
  over the time beyond the prefill;
* where the time goes (``--profile``): the top ops by self CPU time of one prefill and one whole call per cell;
* 3B shapes (Llama 3.2 3B: dim 3072, hidden 8192, 24 query / 8 KV heads of 128, vocab 128256): each linear of a
  layer and the output projection at 1, 8 and 128 rows in float32, bf16 (the plan's kernel) and int4 (the
  feed-forward), summed into a decode step / prefill estimate of the 28-layer model (attention's own work,
  small at these lengths, left out).

    python bench/cpu_kernels.py [--threads 1] [--repeats 3] [--max-tokens 12] [--prompt-len 32] [--profile]

Ratios (mode over none, after over before) are measured side by side in one process; absolute numbers move
with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import workbench as wb
from workbench.models.layers import linear, linear_one_row_as_two
from workbench.notebook.bench import fixed_length_run, synthetic_prompts
from workbench.quantization import int4
from workbench.quantization.kernels import choose_kernels

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
MODES = (None, "bf16", "int4_mixed")
CHOICES = ("legacy", "auto")
SHAPES_3B = {"wqkv": (5120, 3072), "wo": (3072, 3072), "w13": (16384, 3072), "w2": (3072, 8192)}
OUTPUT_3B = (128256, 3072)
LAYERS_3B = 28


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--skip-3b", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    results = {}
    for name, env in (("default", {}), ("avx2", AVX2)):
        argv = [sys.executable, __file__, "--worker", *sys.argv[1:]]
        full = {**os.environ, **env, "OMP_NUM_THREADS": str(args.threads)}
        full.pop("WORKBENCH_CPU_KERNELS", None)
        proc = subprocess.run(argv, capture_output=True, text=True, env=full, check=False)
        if proc.returncode:
            sys.exit(f"{name} worker failed:\n{proc.stderr[-4000:]}")
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        report(name, results[name])
    print(json.dumps({"bench": "cpu_kernels", "threads": args.threads, "results": results}))


# ---------------------------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    out: dict = {"isa": torch.backends.cpu.get_cpu_capability(), "demo": {}, "profile": {}, "kernels": {}}
    seed = iter(range(10_000))
    for mode in MODES:
        for choice in CHOICES:
            os.environ["WORKBENCH_CPU_KERNELS"] = choice
            wb.unload()
            engine = wb.load(max_batch_size=8, max_seq_len=256, quantization=mode)
            key = f"{mode or 'none'}/{choice}"
            out["kernels"][key] = str(engine.settings.kernels)
            for batch in (1, 8):
                fixed_length_run(engine, synthetic_prompts(engine, batch, args.prompt_len, next(seed)), 2)  # warm
                prefill, total = [], []
                for _ in range(args.repeats):
                    prefill.append(_timed(engine, synthetic_prompts(engine, batch, args.prompt_len, next(seed)), 1))
                    prompts = synthetic_prompts(engine, batch, args.prompt_len, next(seed))
                    total.append(_timed(engine, prompts, args.max_tokens))
                p, t = _median(prefill), _median(total)
                out["demo"][f"{key}/b{batch}"] = {
                    "prefill_s": round(p, 4),
                    "call_s": round(t, 4),
                    "decode_tok_s": round(batch * (args.max_tokens - 1) / max(t - p, 1e-9), 2),
                    "prefill_tok_s": round(batch * args.prompt_len / p, 1),
                }
                if args.profile:
                    out["profile"][f"{key}/b{batch}"] = {
                        "prefill": _top_ops(engine, synthetic_prompts(engine, batch, args.prompt_len, next(seed)), 1),
                        "call": _top_ops(
                            engine, synthetic_prompts(engine, batch, args.prompt_len, next(seed)), args.max_tokens
                        ),
                    }
    wb.unload()
    os.environ.pop("WORKBENCH_CPU_KERNELS", None)
    if not args.skip_3b:
        out["shapes_3b"] = shapes_3b(args.repeats)
    return out


def _timed(engine: object, prompts: list[list[int]], max_tokens: int) -> float:
    start = time.perf_counter()
    fixed_length_run(engine, prompts, max_tokens)
    return time.perf_counter() - start


def _top_ops(engine: object, prompts: list[list[int]], max_tokens: int, top: int = 6) -> list[list]:
    """(op, self CPU ms, share of the total) of the ``top`` ops by self CPU time of one call."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fixed_length_run(engine, prompts, max_tokens)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [
        [e.key, round(e.self_cpu_time_total / 1e3, 2), round(e.self_cpu_time_total / total, 3)] for e in events[:top]
    ]


def shapes_3b(repeats: int) -> dict:
    """Milliseconds per product at 3B shapes: float32, bf16 before (legacy) and after (the plan), int4."""
    plan = choose_kernels("cpu", "bf16", torch.bfloat16, choice="auto")
    gen = torch.Generator().manual_seed(0)
    table: dict = {"plan": str(plan)}
    for name, (n, k) in {**SHAPES_3B, "output": OUTPUT_3B}.items():
        w32 = torch.randn(n, k, generator=gen) * 0.02
        tall = n >= 2 * k  # use_fast_layouts: tall float weights column-major
        f32 = w32.t().contiguous().t() if tall else w32
        wb16 = w32.bfloat16()
        legacy = wb16.t().contiguous().t() if tall else wb16
        after = legacy if plan.column_major_bf16 else wb16
        packed = None
        if name in ("w13", "w2"):
            layout = int4.plan_layout(n, k)
            codes, sz = int4.quantize_groupwise(w32, layout)
            packed = (int4.pack(codes, layout, "cpu"), sz, layout)
        del w32
        for rows in (1, 8, 128):
            if name == "output" and rows == 128:
                continue  # prefill projects only each row's last token
            fns = _products(torch.randn(rows, k, generator=gen), f32, legacy, after, packed, plan.float32_arithmetic)
            cell = {}
            for _ in range(repeats):  # contenders alternate
                for label, fn in fns.items():
                    fn()
                    start = time.perf_counter()
                    fn()
                    cell.setdefault(label, []).append((time.perf_counter() - start) * 1e3)
            table[f"{name}/{rows}"] = {label: round(_median(v), 3) for label, v in cell.items()}
    for rows in (1, 8, 128):  # the 28-layer model: layers + the output projection of each row's last token
        est = {}
        for label in ("float32", "bf16_before", "bf16_after", "int4"):
            layer = 0.0
            for name in SHAPES_3B:
                cell = table[f"{name}/{rows}"]
                layer += cell.get(label, cell["bf16_after"]) if label == "int4" else cell[label]
            out_rows = min(rows, 8)
            head = table[f"output/{out_rows}"]
            head_ms = head["bf16_after"] if label == "int4" else head[label]
            est[label] = round(LAYERS_3B * layer + head_ms, 1)
        table[f"model_step_ms/{rows}"] = est
    return table


def _products(x: torch.Tensor, f32, legacy, after, packed, wide: bool) -> dict:  # noqa: ANN001
    """The contenders on one input: float32, bf16 before and after, int4 (feed-forward weights only)."""
    xb = x.bfloat16()
    fns = {"float32": lambda: F.linear(x, f32), "bf16_before": lambda: F.linear(xb, legacy).float()}
    if wide:
        fns["bf16_after"] = lambda: linear(x, after)
    else:
        fns["bf16_after"] = lambda: linear_one_row_as_two(xb, after).float()
    if packed is not None:
        fns["int4"] = lambda: int4.linear(x, *packed, "cpu")
    return fns


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2]


# ---------------------------------------------------------------------------------------------- report
def report(name: str, res: dict) -> None:
    print(f"\n== {name} path: torch CPU capability {res['isa']}")
    for key, line in res["kernels"].items():
        print(f"  kernels {key}: {line}")
    print("  demo model (s; decode tok/s):")
    for key, cell in res["demo"].items():
        mode, choice, batch = key.split("/")
        base = res["demo"][f"none/{choice}/{batch}"]
        print(
            f"    {key:22s} prefill {cell['prefill_s']:.3f}s ({cell['prefill_s'] / base['prefill_s']:.2f}x none)"
            f"  call {cell['call_s']:.3f}s  decode {cell['decode_tok_s']:.1f} tok/s "
            f"({cell['decode_tok_s'] / base['decode_tok_s']:.2f}x none)"
        )
    for key, ops in res.get("profile", {}).items():
        print(f"  profile {key}: prefill {ops['prefill'][:4]}\n{'':20s}call {ops['call'][:4]}")
    if "shapes_3b" in res:
        print(f"  3B shapes, ms per product ({res['shapes_3b']['plan']}):")
        for key, cell in res["shapes_3b"].items():
            if key != "plan":
                print(f"    {key:20s} {cell}")


if __name__ == "__main__":
    main()
