"""Structured-output overhead: per-step token-mask cost at batch 16 vs an unconstrained decode step.

On the embedded default model, one process, same prompts: an unconstrained greedy batch of 16 rows and the
same batch with every row under a JSON schema (long enough that no row finishes early).  The mask work
(llguidance's batched mask computation, applying it to the logits, advancing each row's grammar) is timed
inside the run; the overhead is that time per step over the unconstrained step time.  Also reports the
cold compile time of a schema, the cached one, and the one-off build of llguidance's tokenizer info.

    python bench/structured.py [--batch 16] [--max-tokens 64] [--repeats 3] [--device cpu] [--temperature 0.7]
"""

from __future__ import annotations

import argparse
import json
import time

from common import make_prompts

import workbench as wb
from workbench.generation import constraints as rt
from workbench.structured.spec import json_schema_format

ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "qty": {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": ["name", "qty"],
}
SCHEMA = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": ITEM, "minItems": 40}},
    "required": ["items"],
}


class Timers:
    """Wraps the grammar hooks (mask computation + application, per-row grammar advance) with timers."""

    def __init__(self) -> None:
        self.mask_s = 0.0
        self.consume_s = 0.0
        self.steps = 0
        self._mask = rt.GrammarRuntime.mask_logits
        self._consume = rt.RowConstraint.consume

    def __enter__(self) -> Timers:
        timers = self

        def mask_logits(runtime, logits, rows, *rest):
            start = time.perf_counter()
            chosen = timers._mask(runtime, logits, rows, *rest)
            timers.mask_s += time.perf_counter() - start
            timers.steps += 1
            return chosen

        def consume(state, token):
            start = time.perf_counter()
            timers._consume(state, token)
            timers.consume_s += time.perf_counter() - start

        rt.GrammarRuntime.mask_logits = mask_logits
        rt.RowConstraint.consume = consume
        return self

    def __exit__(self, *exc: object) -> None:
        rt.GrammarRuntime.mask_logits = self._mask
        rt.RowConstraint.consume = self._consume


def timed(
    engine: wb.Engine, prompts: list[str], max_tokens: int, fmt: object, temperature: float
) -> tuple[float, list]:
    scheduler = engine._runner.scheduler
    stop_tokens = scheduler.stop_tokens
    if fmt is None:  # unconstrained rows ignore their stop tokens, so both runs do every step for every row
        scheduler.stop_tokens = {}
    try:
        start = time.perf_counter()
        rows = engine.batch_completion(
            prompts, max_tokens=max_tokens, response_format=fmt, temperature=temperature, seed=0
        )
        return time.perf_counter() - start, rows
    finally:
        scheduler.stop_tokens = stop_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None)
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: greedy rows (the mask only matters where it refuses the argmax); >0: sampled rows "
        "(every step rewrites the logits)",
    )
    args = parser.parse_args()
    engine = wb.load(device=args.device, max_batch_size=args.batch, max_seq_len=512)
    prompts = [p[:200] for p in make_prompts(args.batch)]

    rt._TOKENIZER_CACHE.clear()
    start = time.perf_counter()
    rt.build_lltokenizer(engine.tokenizer)
    tokenizer_s = time.perf_counter() - start
    start = time.perf_counter()
    fmt = json_schema_format(SCHEMA)
    engine._constraints([fmt])  # compile + check against the vocabulary (cold)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    engine._constraints([json_schema_format(SCHEMA)])
    cached_s = time.perf_counter() - start

    engine.batch_completion(prompts[:2], max_tokens=4)  # warm-up
    engine.batch_completion(prompts[:2], max_tokens=4, response_format=fmt)
    free_s, constrained_s, mask_s, consume_s, steps, free_tokens, tokens = [], [], [], [], 0, 0, 0
    for _ in range(args.repeats):  # interleaved, best of N: the machine is shared
        elapsed, rows = timed(engine, prompts, args.max_tokens, None, args.temperature)
        free_s.append(elapsed)
        free_tokens = sum(len(r.tokens) for r in rows)
        assert free_tokens == args.batch * args.max_tokens  # every row ran every step
        with Timers() as t:
            elapsed, rows = timed(engine, prompts, args.max_tokens, fmt, args.temperature)
        constrained_s.append(elapsed)
        mask_s.append(t.mask_s)
        consume_s.append(t.consume_s)
        steps, tokens = t.steps, sum(len(r.tokens) for r in rows)
        assert all(r.stop_reason == "out_of_tokens" for r in rows)  # every row ran every step
    best = min(range(args.repeats), key=lambda i: constrained_s[i])
    step_free_ms = 1e3 * min(free_s) / args.max_tokens
    step_constrained_ms = 1e3 * constrained_s[best] / args.max_tokens
    mask_ms = 1e3 * mask_s[best] / steps
    consume_ms = 1e3 * consume_s[best] / steps
    result = {
        "bench": "structured",
        "model": engine.model_id or "embedded default",
        "params_M": round(engine.info()["parameters"] / 1e6, 1),
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "tokens": {"unconstrained": free_tokens, "constrained": tokens},
        "step_ms_unconstrained": round(step_free_ms, 2),
        "step_ms_constrained": round(step_constrained_ms, 2),
        "mask_ms_per_step": round(mask_ms, 3),
        "grammar_advance_ms_per_step": round(consume_ms, 3),
        "mask_overhead_pct": round(100 * (mask_ms + consume_ms) / step_free_ms, 1),
        "end_to_end_slowdown_pct": round(100 * (step_constrained_ms / step_free_ms - 1), 1),
        "schema_compile_ms_cold": round(1e3 * compile_s, 1),
        "schema_compile_ms_cached": round(1e3 * cached_s, 3),
        "tokenizer_info_build_s": round(tokenizer_s, 2),
    }
    print(
        f"model: {result['model']} ({result['params_M']}M params), batch {args.batch}, {args.max_tokens} steps, "
        f"temperature {args.temperature}"
    )
    print(f"  unconstrained decode step        {step_free_ms:8.2f} ms")
    print(f"  constrained decode step          {step_constrained_ms:8.2f} ms")
    print(f"  mask compute + apply per step    {mask_ms:8.3f} ms")
    print(f"  grammar advance per step         {consume_ms:8.3f} ms")
    print(f"  mask overhead vs unconstrained   {result['mask_overhead_pct']:8.1f} %")
    print(f"  end-to-end slowdown              {result['end_to_end_slowdown_pct']:8.1f} %")
    print(f"  schema compile (cold / cached)   {1e3 * compile_s:8.1f} ms / {1e3 * cached_s:.3f} ms")
    print(f"  tokenizer info (once per vocab)  {tokenizer_s:8.2f} s")
    print(json.dumps(result))
    wb.unload()


if __name__ == "__main__":
    main()
