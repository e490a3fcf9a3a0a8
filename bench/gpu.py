"""GPU decode throughput against peak HBM bandwidth, Llama 3.1 8B shapes, randomly initialised.

For each mode — bf16 eager, bf16 compiled (``torch.compile`` of the decode step), fp8_mixed (feed-forward
weights in fp8 through ``torch._scaled_mm``), int4_mixed (through torch's CUDA int4 kernels) — and
batch 1, 8 and 32: prefill 128-token prompts, then time ``--steps`` decode steps of the workbench
generator (stop tokens ignored).  Reports tokens/s, step time, bytes each step must read (weights used
+ KV cache), achieved bandwidth, and its ratio to the GPU's peak HBM bandwidth (table below, or
``--peak-gbps``) and to a measured device copy bandwidth.  Compile time is reported for the compiled
mode.  Writes one JSON document (``--out``) and prints it as one line.

Needs no checkpoint: the model is built on the GPU and filled with random weights (16 GB in bf16).

    python bench/gpu.py [--out gpu.json] [--batches 1,8,32] [--steps 64]
                        [--modes bf16,bf16_compiled,fp8_mixed,int4_mixed]
    python bench/gpu.py --device cpu --shape tiny   # a dry run of every code path on a CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch

from workbench.generation.generator import Generator, Request
from workbench.generation.sampling import SamplingParams
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.transformer import Transformer
from workbench.quantization import quantize_model
from workbench.runtime.memory import model_memory

SHAPES = {
    "llama3.1-8b": {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256,
                    "multiple_of": 1024, "ffn_dim_multiplier": 1.3, "norm_eps": 1e-5, "rope_theta": 500000.0,
                    "use_scaled_rope": True},
    "tiny": {"dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 128256, "multiple_of": 256,
             "ffn_dim_multiplier": 1.3, "norm_eps": 1e-5, "rope_theta": 500000.0, "use_scaled_rope": True},
}  # fmt: skip

# Peak HBM bandwidth (GB/s) by device-name fragment, from the vendors' data sheets.
PEAK_GBPS = {"H200": 4800, "H100 SXM": 3350, "H100 NVL": 3900, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
             "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864, "L4": 300, "A10G": 600, "RTX 4090": 1008}  # fmt: skip

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
def build(shape: str, mode: str, device: torch.device, max_batch: int, max_seq_len: int) -> Transformer:
    """A random-weight model of ``shape`` in bf16 on ``device``, quantized / compiled as ``mode`` says."""
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
    if mode == "bf16_compiled":
        model.compile_decode()
    return model


def step_bytes(model: Transformer, generator: Generator, position: int, batch: int) -> float:
    """Bytes a decode step reads: every weight but the embedding table (one row per token) + the KV cache."""
    mem = model_memory(model, generator.cache.nbytes())
    embedding = mem["by_kind"].get("embedding", 0)
    weights = mem["weights_bytes"] - embedding + batch * embedding / model.args.vocab_size
    kv_per_position = generator.cache.nbytes() / (generator.cache.batch_size * generator.cache.seq_len)
    return weights + kv_per_position * position * batch


def run_mode(shape: str, mode: str, device: torch.device, batches: list[int], steps: int) -> list[dict]:
    max_batch, max_seq_len = max(batches), PROMPT_LEN + steps + 8
    start = time.perf_counter()
    model = build(shape, mode, device, max_batch, max_seq_len)
    sync(device)
    build_s = time.perf_counter() - start
    generator = Generator(model, stop_tokens={}, decode_text=lambda ids: "", max_batch_size=max_batch,
                          max_seq_len=max_seq_len, share_prefixes=False)  # fmt: skip
    rows = []
    for batch in batches:
        prompts = [[128000] + [(7919 * (r + 1) * (i + 1)) % 120000 for i in range(PROMPT_LEN - 1)]
                   for r in range(batch)]  # fmt: skip

        def go(n: int, prompts: list[list[int]] = prompts, generator: Generator = generator) -> float:
            params = SamplingParams.create(max_tokens=n)
            sync(device)
            t0 = time.perf_counter()
            for _ in generator.generate([Request(i, p, params) for i, p in enumerate(prompts)]):
                pass
            sync(device)
            return time.perf_counter() - t0

        t0 = time.perf_counter()
        go(4)  # warm-up (and, for the compiled mode, compilation)
        warm_s = time.perf_counter() - t0
        prefill = min(go(1) for _ in range(2))
        total = min(go(steps + 1) for _ in range(2))
        step_s = (total - prefill) / steps
        need = step_bytes(model, generator, PROMPT_LEN + steps // 2, batch)
        rows.append({"mode": mode, "batch": batch, "tok_s": batch / step_s, "step_ms": step_s * 1e3,
                     "bytes_per_step": need, "achieved_GBps": need / step_s / 1e9, "warmup_s": warm_s,
                     "build_s": build_s, "kernels": model_memory(model, 0)["by_kernel"]})  # fmt: skip
        print(f"  {mode:>14} batch {batch:>3}: {batch / step_s:9.1f} tok/s, {step_s * 1e3:7.2f} ms/step, "
              f"{need / step_s / 1e9:7.1f} GB/s (warm-up {warm_s:.1f}s)", flush=True)  # fmt: skip
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="llama3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--modes", default="bf16,bf16_compiled,fp8_mixed,int4_mixed")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--peak-gbps", type=float, default=None, help="peak HBM bandwidth when the table lacks the GPU")
    parser.add_argument("--out", default="gpu.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU visible to torch; for a dry run on a CPU pass --device cpu --shape tiny")
    peak = peak_gbps(device, args.peak_gbps)
    copy = copy_gbps(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}: peak {peak} GB/s (data sheet), copy {copy:.0f} GB/s (measured), torch {torch.__version__}")
    results: list[dict] = []
    doc = {"bench": "gpu", "device": name, "shape": args.shape, "peak_GBps": peak, "copy_GBps": round(copy, 1),
           "torch": torch.__version__, "prompt_len": PROMPT_LEN, "steps": args.steps, "results": results}  # fmt: skip
    for mode in args.modes.split(","):
        try:
            rows = run_mode(args.shape, mode, device, [int(b) for b in args.batches.split(",")], args.steps)
        except Exception as exc:  # one mode failing (e.g. no fp8 on this GPU) must not lose the others
            print(f"  {mode}: failed: {type(exc).__name__}: {exc}")
            rows = [{"mode": mode, "error": f"{type(exc).__name__}: {exc}"}]
        for r in rows:
            if "achieved_GBps" in r:
                r["of_peak"] = r["achieved_GBps"] / peak if peak else None
                r["of_copy"] = r["achieved_GBps"] / copy
        results += rows
        with open(args.out, "w") as f:  # after every mode, so a run cut short by a time limit keeps what it measured
            json.dump(doc, f, indent=1)
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
