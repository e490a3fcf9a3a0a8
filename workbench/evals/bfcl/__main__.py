"""``python -m workbench.evals.bfcl``: BFCL accuracy of a model per category, in its official prompt and BFCL's.

Prints one row per (prompt, category) and a final JSON line, e.g.::

    python -m workbench.evals.bfcl --limit 20                       # the demo model, both prompts
    python -m workbench.evals.bfcl --checkpoint /ckpts/Llama3.2-3B-Instruct --model Llama3.2-3B-Instruct \\
        --categories simple_python multiple parallel parallel_multiple irrelevance live_simple --prompt bfcl
    python -m workbench.evals.bfcl --checkpoint /ckpts/Llama3.2-3B-Instruct --model Llama3.2-3B-Instruct \\
        --categories multi_turn_base multi_turn_miss_func multi_turn_miss_param multi_turn_long_context \\
        --prompt bfcl --max-seq-len 16384 --run mt-bf16
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import pandas as pd

from ...errors import WorkbenchError
from ...session import load
from .package import SUPPORTED_CATEGORIES, check_categories
from .runner import DEFAULT_CATEGORIES, PROMPTS, plot, run, summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.evals.bfcl", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="checkpoint folder or checkpoints.toml entry (default: the embedded demo model)",
    )
    parser.add_argument("--model", default=None, help="model id (selects the official prompt format)")
    parser.add_argument("--max-batch-size", type=int, default=None, help="engine batch rows")
    parser.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="engine context in tokens (multi-turn prompts hold ~3,000 tokens of function docs and grow each step)",
    )
    parser.add_argument(
        "--categories",
        nargs="+",
        default=list(DEFAULT_CATEGORIES),
        help=f"BFCL categories (supported: {', '.join(SUPPORTED_CATEGORIES)})",
    )
    parser.add_argument("--limit", type=int, default=None, help="first N entries of each category (default: all)")
    parser.add_argument(
        "--prompt",
        nargs="+",
        default=list(PROMPTS),
        choices=PROMPTS,
        help="official (the model's own format), bfcl (BFCL's Llama handler prompt), or both",
    )
    parser.add_argument("--max-tokens", type=int, default=512, help="tokens per reply")
    parser.add_argument("--results", default=None, help="write every scored row to this JSONL file")
    parser.add_argument(
        "--run",
        default=None,
        help="remember every reply in the run store under this name (a "
        "re-run computes only the entries not stored: see wb.runs)",
    )
    parser.add_argument("--plot", default=None, help="save the accuracy bars to this image file")
    args = parser.parse_args(argv)
    try:
        check_categories(args.categories)  # before the model loads
        engine = load(
            args.checkpoint, model=args.model, max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len
        )
        started = time.perf_counter()
        frames = [
            run(
                engine,
                args.categories,
                limit=args.limit,
                prompt=p,
                max_tokens=args.max_tokens,
                progress=True,
                run=args.run,
            )
            for p in args.prompt
        ]
    except WorkbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = pd.concat(frames, ignore_index=True)
    summary = summarize(results, by=["prompt"])
    if args.results:
        results.to_json(args.results, orient="records", lines=True, default_handler=str)
    if args.plot:
        plot(summary, path=args.plot)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.to_string(index=False))
    name = engine.model_id or args.checkpoint or "embedded default"
    print(
        json.dumps(
            {
                "model": name,
                "entries": len(results),
                "limit": args.limit,
                "seconds": round(time.perf_counter() - started, 1),
                "summary": summary.to_dict(orient="records"),
            },
            default=str,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
