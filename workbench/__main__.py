"""``python -m workbench``: the main job on a checkpoint (the embedded default when none is given).

Loads the engine once, runs a batch of prompts through ``batch_completion`` and the same prompts one
at a time, checks that every row agrees, and prints the throughput of both plus a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import time

from . import load

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "The three laws of thermodynamics are",
    "Q: What is 17 * 23?\nA:",
    "Llamas are",
    "In 1969, the first humans",
    "The best way to learn a language is",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench", description=__doc__)
    parser.add_argument("checkpoint", nargs="?", default=None, help="checkpoint folder (default: embedded tiny model)")
    parser.add_argument("--model", default=None, help="model id, e.g. Llama3.2-3B-Instruct")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--device", default=None)
    parser.add_argument("--model-parallel-size", type=int, default=None)
    parser.add_argument("--quantization", default=None, choices=["bf16", "fp8_mixed", "int4_mixed"])
    args = parser.parse_args(argv)

    engine = load(args.checkpoint, model=args.model, device=args.device,
                  model_parallel_size=args.model_parallel_size, quantization=args.quantization)  # fmt: skip
    print(engine)
    start = time.perf_counter()
    batched = engine.batch_completion(PROMPTS, max_tokens=args.max_tokens, temperature=0.0)
    batch_s = time.perf_counter() - start
    start = time.perf_counter()
    single = [engine.completion(p, max_tokens=args.max_tokens, temperature=0.0) for p in PROMPTS]
    single_s = time.perf_counter() - start
    for prompt, result in zip(PROMPTS, batched):
        print(f"{prompt!r} -> {result.text!r} [{result.stop_reason}]")
    agree = all(a.tokens == b.tokens for a, b in zip(batched, single))
    n_tokens = sum(len(r.tokens) for r in batched)
    summary = {
        "model": engine.model_id or engine.family,
        "prompts": len(PROMPTS),
        "generated_tokens": n_tokens,
        "batched_tokens_per_s": round(n_tokens / batch_s, 1),
        "sequential_tokens_per_s": round(n_tokens / single_s, 1),
        "speedup": round(single_s / batch_s, 2),
        "batched_equals_sequential": agree,
    }
    print(json.dumps(summary))
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
