"""``python -m workbench.evals``: tool-call accuracy of a model on synthetic held-out cases or a JSONL file.

Prints one summary row per setting and a final JSON line, e.g.::

    python -m workbench.evals --cases 150 --quantization none bf16 fp8_mixed int4_mixed
    python -m workbench.evals --tools unseen      # generated tools the demo model never trained on
    python -m workbench.evals --run evals-demo    # remembered in the run store: a re-run answers from there
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import workbench as wb
from workbench import evals, runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.evals", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="checkpoint folder or checkpoints.toml entry (default: the embedded demo model)",
    )
    parser.add_argument("--model", default=None, help="model id (selects the prompt format)")
    parser.add_argument("--cases-file", default=None, help="JSONL cases (see workbench.evals.cases)")
    parser.add_argument("--cases", type=int, default=150, help="number of synthetic cases when no file is given")
    parser.add_argument("--split", default="heldout", choices=["train", "heldout"], help="synthetic split")
    parser.add_argument(
        "--values",
        default=None,
        choices=["train", "heldout"],
        help="split of the argument values (default: --split's; e.g. --split heldout --values "
        "train measures unseen phrasings alone)",
    )
    parser.add_argument(
        "--tools",
        default="demo",
        choices=["demo", "unseen"],
        help="synthetic cases over the 14 demo tools, or over generated held-out tools the demo "
        "model never saw (names, parameters, phrasings and values; workbench.evals.unseen)",
    )
    parser.add_argument("--seed", type=int, default=2024, help="seed of the synthetic cases")
    parser.add_argument(
        "--quantization", nargs="*", default=None, help="modes to compare: none bf16 fp8_mixed int4_mixed"
    )
    parser.add_argument("--tool-prompt-format", nargs="*", default=None, help="formats to compare")
    parser.add_argument("--temperature", nargs="*", type=float, default=None, help="temperatures to compare")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--run",
        default=None,
        help="remember every model step in the run store under this name (a re-run answers from there: see wb.runs)",
    )
    parser.add_argument("--refresh", action="store_true", help="with --run: recompute and replace the stored rows")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import pandas as pd

    tools = None  # the demo tools
    if args.cases_file:
        cases = evals.load_cases(args.cases_file)
    elif args.tools == "unseen":
        cases, tools = evals.unseen_cases(args.cases, split=args.split, seed=args.seed)
    else:
        cases = evals.synthetic_cases(args.cases, split=args.split, seed=args.seed, values=args.values)
    engine = wb.load(args.checkpoint, model=args.model, max_batch_size=32)
    settings: list[dict] = [{}]
    for key, values in (
        ("quantization", args.quantization),
        ("tool_prompt_format", args.tool_prompt_format),
        ("temperature", args.temperature),
    ):
        if values:
            values = [None if v in ("none", "None") else v for v in values]
            settings = [{**s, key: v} for s in settings for v in values]
    started = time.perf_counter()
    stored = runs.call_keywords(args.run, args.refresh)
    if settings == [{}]:
        results = evals.run_cases(engine, cases, tools=tools, progress=True, **stored)
        summary = evals.summarize(results)
    else:
        results = evals.compare(engine, cases, settings, tools=tools, progress=True, **stored)
        summary = evals.summarize(results, by=[k for k in evals.SETTING_KEYS if k in results.columns])
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(evals.rate_table(summary, metrics=list(evals.RATES)).to_string())  # rate [95% Wilson interval] n=cases
    print(
        json.dumps(
            {
                "cases": len(cases),
                "seconds": round(time.perf_counter() - started, 1),
                "summary": summary.to_dict(orient="records"),
            },
            default=str,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
