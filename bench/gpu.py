"""GPU decode throughput against peak HBM bandwidth, Llama 3.1 8B shapes, randomly initialised.

Contenders side by side in one run, for each weight mode (bf16; fp8_mixed: feed-forward weights in fp8
through ``torch._scaled_mm``; int4_mixed: torch's CUDA int4 kernels) and each decode path — ``eager`` (one
Python-launched kernel per op), ``graphed`` (the step captured as CUDA graphs per batch bucket:
``workbench.generation.graphs``, what ``wb.load(cuda_graphs=True)`` runs) and, with ``--compiled``,
``compiled`` (``torch.compile`` of the step) — at batch 1, 8, 32 and 64: prefill 128-token prompts
(prefill tok/s), then time ``--steps`` decode steps of the workbench scheduler (stop tokens ignored).
Reports tokens/s, step time, the bytes each step must read (weights used + the KV cache it attends to:
up to each row's position eagerly, the whole span bucket when graphed), achieved bandwidth and its ratio
to the GPU's data-sheet HBM peak (table below, or ``--peak-gbps``) and to a measured device copy, and the
capture / compile seconds.  Ratios: graphed/eager and each mode against bf16 at the same path and batch.

Writes its JSON document after every measurement (``--out``, default ``$OUT/gpu.json`` when ``$OUT`` is
set), so a run cut short keeps what it measured; ``--max-minutes`` stops starting new measurements after
that much wall time.  Installs nothing; needs no checkpoint (16 GB of random bf16 weights built on the GPU).

    python bench/gpu.py [--max-minutes 5] [--batches 1,8,32,64] [--modes bf16,fp8_mixed,int4_mixed]
    python bench/gpu.py --device cpu --tiny     # a dry run of every code path on a CPU (a 2-layer model)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch

from workbench.generation import Request, Scheduler
from workbench.generation.sampling import SamplingParams
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.transformer import Transformer
from workbench.quantization import quantize_model
from workbench.runtime.memory import model_memory

SHAPES = {
    "llama3.1-8b": {
        "dim": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "vocab_size": 128256,
        "multiple_of": 1024,
        "ffn_dim_multiplier": 1.3,
        "norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "use_scaled_rope": True,
    },
    "tiny": {
        "dim": 256,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "vocab_size": 128256,
        "multiple_of": 256,
        "ffn_dim_multiplier": 1.3,
        "norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "use_scaled_rope": True,
    },
}

# Peak HBM bandwidth (GB/s) by device-name fragment, from the vendors' data sheets.
PEAK_GBPS = {
    "H200": 4800,
    "H100 SXM": 3350,
    "H100 NVL": 3900,
    "H100 PCIe": 2000,
    "H100": 3350,
    "A100-SXM4-80GB": 2039,
    "A100 80GB PCIe": 1935,
    "A100": 1555,
    "L40S": 864,
    "L4": 300,
    "A10G": 600,
    "RTX 4090": 1008,
}

PROMPT_LEN = 128


def peak_gbps(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_GBPS.items() if k in name), None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_gbps(device: torch.device, mib: int = 2048) -> float:
    """Measured device-to-device copy bandwidth (read + write bytes per second), the median of 5."""
    src = torch.ones(mib * 2**20 // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - start)
    del src, dst
    return 2 * mib * 2**20 / sorted(times)[2] / 1e9


@torch.no_grad()
def build(shape: str, mode: str, device: torch.device, max_seq_len: int) -> Transformer:
    """A random-weight model of ``shape`` in bf16 on ``device``, quantized as ``mode`` says."""
    ensure_model_parallel(1)
    args = ModelArgs.from_dict(dict(SHAPES[shape]), source=shape)
    model = Transformer(args, max_seq_len=max_seq_len, device=device, dtype=torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(0)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, p.shape[-1] ** -0.5, generator=gen)
    if mode in ("fp8_mixed", "int4_mixed"):
        model = quantize_model(model, mode)
    return model


def step_bytes(model: Transformer, scheduler: Scheduler, kv_positions: int, batch: int) -> float:
    """Bytes a decode step reads: every weight but the embedding table (one row per token) + the KV cache
    of ``kv_positions`` positions per row."""
    mem = model_memory(model, scheduler.cache.nbytes())
    embedding = mem["by_kind"].get("embedding", 0)
    weights = mem["weights_bytes"] - embedding + batch * embedding / model.args.vocab_size
    kv_per_position = scheduler.cache.nbytes() / (scheduler.cache.batch_size * scheduler.cache.seq_len)
    return weights + kv_per_position * kv_positions * batch


def enable_path(model: Transformer, scheduler: Scheduler, path: str, device: torch.device) -> float | None:
    """Switch ``scheduler`` to the decode ``path``; returns its setup seconds (capture, or compile on the
    first steps for ``compiled``: that one is timed by the warm-up instead)."""
    model.compile_decode(path == "compiled")
    if path == "graphed":
        static = scheduler.use_static_decode(True, capture=device.type == "cuda")
        return static.capture_s if static is not None else None
    scheduler.use_static_decode(False)
    return None


def measure(model: Transformer, scheduler: Scheduler, device: torch.device, batch: int, steps: int, path: str) -> dict:
    prompts = [[128000] + [(7919 * (r + 1) * (i + 1)) % 120000 for i in range(PROMPT_LEN - 1)] for r in range(batch)]

    def go(n: int) -> float:
        params = SamplingParams.create(max_tokens=n)
        scheduler.forget_prefixes()  # every prompt prefilled whole (the prompts share their first token only)
        sync(device)
        t0 = time.perf_counter()
        for _ in scheduler.generate([Request(i, p, params) for i, p in enumerate(prompts)]):
            pass
        sync(device)
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    go(4)  # warm-up (and, for the compiled path, compilation)
    warm_s = time.perf_counter() - t0
    prefill = min(go(1) for _ in range(2))
    total = min(go(steps + 1) for _ in range(2))
    if total <= prefill:  # only on a busy CPU with few steps: no decode time left to measure
        raise ValueError(f"timing noise: {steps} steps took {total:.3f}s, prefill alone {prefill:.3f}s; more --steps")
    step_s = (total - prefill) / steps
    position = PROMPT_LEN + steps // 2
    static = scheduler.static
    kv = static.bucket(batch, position)[1] if static is not None else position
    need = step_bytes(model, scheduler, kv, batch)
    return {
        "batch": batch,
        "tok_s": batch / step_s,
        "step_ms": step_s * 1e3,
        "prefill_tok_s": batch * PROMPT_LEN / prefill,
        "bytes_per_step": need,
        "achieved_GBps": need / step_s / 1e9,
        "warmup_s": warm_s,
    }


def ratios(results: list[dict]) -> list[dict]:
    """graphed (and compiled) / eager per mode and batch, and each mode / bf16 per path and batch."""
    key = {(r["mode"], r["path"], r["batch"]): r["tok_s"] for r in results if "tok_s" in r}
    out = []
    for (mode, path, batch), tok_s in key.items():
        eager = key.get((mode, "eager", batch))
        bf16 = key.get(("bf16", path, batch))
        out.append(
            {
                "mode": mode,
                "path": path,
                "batch": batch,
                "vs_eager": tok_s / eager if eager and path != "eager" else None,
                "vs_bf16": tok_s / bf16 if bf16 and mode != "bf16" else None,
            }
        )
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="llama3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--tiny", action="store_true", help="the tiny shape and few steps (a dry run)")
    parser.add_argument("--modes", default="bf16,fp8_mixed,int4_mixed")
    parser.add_argument("--paths", default="eager,graphed", help="decode paths: eager, graphed, compiled")
    parser.add_argument("--compiled", action="store_true", help="add the torch.compile path")
    parser.add_argument("--batches", default=None, help="batch sizes (default 1,8,32,64; --tiny: 1,8)")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--max-minutes", type=float, default=None, help="start no new measurement after this")
    parser.add_argument("--peak-gbps", type=float, default=None, help="peak HBM bandwidth when the table lacks the GPU")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (stated in the JSON)")
    parser.add_argument("--out", default=None, help="JSON path (default: $OUT/gpu.json, else gpu.json)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny:
        args.shape, args.steps, args.batches = "tiny", min(args.steps, 16), args.batches or "1,8"
    out = Path(args.out or (Path(os.environ["OUT"]) / "gpu.json" if os.environ.get("OUT") else "gpu.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU visible to torch; for a dry run on a CPU pass --device cpu --tiny")
    paths = args.paths.split(",") + (["compiled"] if args.compiled else [])
    batches = [int(b) for b in (args.batches or "1,8,32,64").split(",")]
    peak = peak_gbps(device, args.peak_gbps)
    copy = copy_gbps(device, 2048 if device.type == "cuda" else 256)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"{name}: peak {peak} GB/s (data sheet), copy {copy:.0f} GB/s (measured), torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU threads",
        flush=True,
    )
    results: list[dict] = []
    doc = {
        "bench": "gpu",
        "device": name,
        "shape": args.shape,
        "peak_GBps": peak,
        "copy_GBps": round(copy, 1),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "prompt_len": PROMPT_LEN,
        "steps": args.steps,
        "batches": batches,
        "paths": paths,
        "results": results,
        "ratios": [],
        "stopped": None,
    }

    def save() -> None:
        doc["ratios"] = ratios(results)
        doc["elapsed_s"] = round(time.perf_counter() - started, 1)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(out)

    def out_of_time() -> bool:
        if args.max_minutes is not None and time.perf_counter() - started > 60 * args.max_minutes:
            doc["stopped"] = f"--max-minutes {args.max_minutes} reached"
            return True
        return False

    for mode in args.modes.split(","):
        if out_of_time():
            break
        try:
            t0 = time.perf_counter()
            max_seq_len = PROMPT_LEN + args.steps + 8
            model = build(args.shape, mode, device, max_seq_len)
            sync(device)
            build_s = time.perf_counter() - t0
            scheduler = Scheduler(
                model,
                stop_tokens={},
                decode_text=lambda ids: "",
                max_batch_size=max(batches),
                max_seq_len=max_seq_len,
                share_prefixes=False,
            )
        except Exception as exc:  # one mode failing (e.g. no fp8 on this GPU) must not lose the others
            print(f"  {mode}: failed to build: {type(exc).__name__}: {exc}", flush=True)
            results.append({"mode": mode, "error": f"{type(exc).__name__}: {exc}"})
            save()
            continue
        kernels = model_memory(model, 0)["by_kernel"]
        for path in paths:
            if out_of_time():
                break
            try:
                setup_s = enable_path(model, scheduler, path, device)
            except Exception as exc:
                print(f"  {mode} {path}: setup failed: {type(exc).__name__}: {exc}", flush=True)
                results.append({"mode": mode, "path": path, "error": f"{type(exc).__name__}: {exc}"})
                save()
                continue
            for batch in batches:
                if out_of_time():
                    break
                try:
                    row = measure(model, scheduler, device, batch, args.steps, path)
                except Exception as exc:
                    print(f"  {mode} {path} batch {batch}: failed: {type(exc).__name__}: {exc}", flush=True)
                    error = f"{type(exc).__name__}: {exc}"
                    results.append({"mode": mode, "path": path, "batch": batch, "error": error})
                    save()
                    continue
                row = {
                    "mode": mode,
                    "path": path,
                    **row,
                    "capture_s": setup_s,
                    "build_s": build_s,
                    "kernels": kernels,
                    "of_peak": row["achieved_GBps"] / peak if peak else None,
                    "of_copy": row["achieved_GBps"] / copy,
                }
                if path == "graphed" and scheduler.static is not None:
                    row["graphs"] = scheduler.static.captured
                results.append(row)
                print(
                    f"  {mode:>10} {path:>8} batch {batch:>3}: {row['tok_s']:9.1f} tok/s, {row['step_ms']:7.2f} "
                    f"ms/step, {row['achieved_GBps']:7.1f} GB/s ({row['of_copy']:.0%} of copy), prefill "
                    f"{row['prefill_tok_s']:.0f} tok/s",
                    flush=True,
                )
                save()
        scheduler.use_static_decode(False)
        del model, scheduler
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    save()
    print(json.dumps({k: v for k, v in doc.items() if k != "results"}))
    return doc


if __name__ == "__main__":
    main()
