"""Batch-1 decode against the memory-bandwidth limit, per model and quantization mode.

At batch 1 a decode step reads every weight it uses once (all dense weights, the top-k routed experts
of each MoE layer, one embedding row) plus the KV cache up to the current position, and does little
arithmetic per byte: its speed limit is the machine's memory bandwidth divided by those bytes.  This
script measures the bandwidth in the same run (a large tensor copy: bytes read + bytes written per
second, median of repeats), counts the bytes each step must read from the loaded engine's actual
tensors (quantized ones at their stored size), times decode (128 new tokens after a 32-token prompt,
minus the prefill measured alone, stop tokens ignored) and reports achieved / limit.

Times are CPU seconds of the benchmark process (``common.clock``; ``BENCH_CLOCK=wall`` for wall time).

    python bench/roofline.py [--models llama3-d256,llama3-d1024,llama4-moe16] [--modes none,bf16,fp8_mixed,int4_mixed]
"""

from __future__ import annotations

import argparse
import json

import torch
from common import PEER_MODELS, clock, median, peer_model_dir

import workbench as wb

PROMPT_LEN = 32
NEW_TOKENS = 128


def copy_bandwidth(mib: int = 512, repeats: int = 7) -> float:
    """Bytes moved per second (read + write) copying a ``mib`` MiB float32 tensor: the STREAM 'copy' figure."""
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start = clock()
        dst.copy_(src)
        times.append(clock() - start)
    return 2 * src.numel() * 4 / median(times)


def bytes_per_step(engine: wb.Engine, position: int) -> dict[str, float]:
    """Bytes one batch-1 decode step reads at ``position``: weights it touches + the KV cache so far."""
    mem = engine.memory()
    kinds = mem["by_kind"]
    args = engine.args
    weights = mem["weights_bytes"]
    embedding = kinds.get("embedding", 0)
    weights -= embedding - embedding / args.vocab_size  # one embedding row per token
    routed = kinds.get("routed_experts", 0)
    if args.moe_args is not None and routed:
        weights -= routed * (1 - args.moe_args.top_k / args.moe_args.num_experts)  # only the chosen experts
    cache_dtype_bytes = 2 if engine.info()["dtype"] == "bfloat16" else 4
    kv = 2 * args.n_layers * args.kv_heads * args.rope_head_dim * cache_dtype_bytes * position
    return {"weights": weights, "kv_cache": kv, "total": weights + kv}


def decode_seconds(engine: wb.Engine, prompt: list[int]) -> float:
    """Seconds per decode step at batch 1 (128-token run minus a prefill-only run, median of 3 pairs)."""
    scheduler = engine._runner.scheduler
    scheduler.stop_tokens = {}  # same work for every run: exactly NEW_TOKENS tokens
    scheduler.share_prefixes = False  # time the whole prompt every run
    engine.completion(prompt, max_tokens=4)  # warm-up
    steps = []
    for _ in range(3):
        start = clock()
        engine.completion(prompt, max_tokens=1)
        prefill = clock() - start
        start = clock()
        engine.completion(prompt, max_tokens=NEW_TOKENS)
        steps.append((clock() - start - prefill) / (NEW_TOKENS - 1))
    return median(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(PEER_MODELS))
    parser.add_argument("--modes", default="none,bf16,fp8_mixed,int4_mixed")
    args = parser.parse_args()
    modes = [None if m == "none" else m for m in args.modes.split(",")]
    bandwidths = [copy_bandwidth()]
    results = []
    print(f"threads: {torch.get_num_threads()}")
    for name in args.models.split(","):
        engine = wb.load(peer_model_dir(name), max_batch_size=1, max_seq_len=PROMPT_LEN + NEW_TOKENS + 8)
        prompt = [128000] + list(range(1000, 1000 + PROMPT_LEN - 1))
        for mode in modes:
            engine.set_quantization(mode)
            step_s = decode_seconds(engine, prompt)
            bandwidths.append(copy_bandwidth())  # re-measured between contenders: noise hits both alike
            need = bytes_per_step(engine, PROMPT_LEN + NEW_TOKENS // 2)
            results.append(
                {
                    "model": name,
                    "mode": mode or "none",
                    "tok_s": 1 / step_s,
                    "step_ms": step_s * 1e3,
                    "bytes_per_step": need["total"],
                    "weights_bytes": need["weights"],
                    "kv_bytes": need["kv_cache"],
                    "achieved_GBps": need["total"] / step_s / 1e9,
                }
            )
    wb.unload()
    bandwidth = median(bandwidths)
    print(f"copy bandwidth (read + write): {bandwidth / 1e9:.1f} GB/s (median of {len(bandwidths)} measurements)")
    print(f"{'model':>14} {'mode':>11} {'tok/s':>8} {'MB/step':>9} {'limit tok/s':>11} {'GB/s':>6} {'of limit':>8}")
    for r in results:
        r["limit_tok_s"] = bandwidth / r["bytes_per_step"]
        r["of_limit"] = r["tok_s"] / r["limit_tok_s"]
        print(
            f"{r['model']:>14} {r['mode']:>11} {r['tok_s']:8.1f} {r['bytes_per_step'] / 1e6:9.1f} "
            f"{r['limit_tok_s']:11.1f} {r['achieved_GBps']:6.1f} {r['of_limit']:8.0%}"
        )
    print(
        json.dumps(
            {
                "bench": "roofline",
                "copy_GBps": round(bandwidth / 1e9, 2),
                "threads": torch.get_num_threads(),
                "results": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in results],
            }
        )
    )


if __name__ == "__main__":
    main()
