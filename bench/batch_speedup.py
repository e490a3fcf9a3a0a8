"""Batching speed-up: tokens/s of ``batch_completion`` at batch sizes 1..32 vs sequential ``completion``.

Runs both contenders side by side in one process on the same engine and prompts, on the embedded
default model (tiny Llama 4) and on a ~50M-parameter tiny Llama 3, prints a table, the speed-up
ratios and one JSON line.  Greedy decoding, so every row's tokens must equal the sequential run's
(checked and reported as ``rows_identical``).

    python bench/batch_speedup.py [--prompts 32] [--max-tokens 32] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import time

from common import make_prompts, small_llama3_dir

import workbench as wb


def run(engine: wb.Engine, prompts: list[str], max_tokens: int, batch_sizes: list[int]) -> dict:
    engine.batch_completion(prompts[:2], max_tokens=4)  # warm-up
    start = time.perf_counter()
    sequential = [engine.completion(p, max_tokens=max_tokens) for p in prompts]
    seq_s = time.perf_counter() - start
    n_tokens = sum(len(r.tokens) for r in sequential)
    result = {"sequential_tok_s": n_tokens / seq_s, "batched": {}}
    for bs in batch_sizes:
        start = time.perf_counter()
        rows = []
        for i in range(0, len(prompts), bs):
            rows += engine.batch_completion(prompts[i : i + bs], max_tokens=max_tokens)
        elapsed = time.perf_counter() - start
        identical = all(a.tokens == b.tokens for a, b in zip(rows, sequential))
        result["batched"][bs] = {"tok_s": n_tokens / elapsed, "speedup": seq_s / elapsed, "rows_identical": identical}
    result["tokens"] = n_tokens
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    batch_sizes = [b for b in (1, 2, 4, 8, 16, 32) if b <= args.prompts]
    prompts = make_prompts(args.prompts)
    models = {"tiny-llama4 (default)": None, "small-llama3 (~50M)": small_llama3_dir()}
    summary = {}
    for name, ckpt in models.items():
        engine = wb.load(ckpt, device=args.device, max_batch_size=max(batch_sizes), max_seq_len=512)
        res = run(engine, prompts, args.max_tokens, batch_sizes)
        summary[name] = {"params_M": round(engine.info()["parameters"] / 1e6, 1), **res}
        print(f"\n{name}: {summary[name]['params_M']}M params, {args.prompts} prompts, {res['tokens']} tokens")
        print(f"  {'mode':>12} {'tok/s':>9} {'speed-up':>9} {'identical':>9}")
        print(f"  {'sequential':>12} {res['sequential_tok_s']:9.1f} {1.0:9.2f} {'-':>9}")
        for bs, row in res["batched"].items():
            label = f"batch {bs}"
            print(f"  {label:>12} {row['tok_s']:9.1f} {row['speedup']:9.2f} {str(row['rows_identical']):>9}")
    wb.unload()
    ratios = {name: round(s["batched"][max(batch_sizes)]["speedup"], 2) for name, s in summary.items()}
    print(f"\nspeed-up of batch {max(batch_sizes)} over sequential: {ratios}")
    print(
        json.dumps(
            rounded(
                {"bench": "batch_speedup", "max_tokens": args.max_tokens, "prompts": args.prompts, "results": summary}
            )
        )
    )


def rounded(value: object) -> object:
    """Floats to 2 decimals, recursively, for a readable JSON line."""
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    main()
