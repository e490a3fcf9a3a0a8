"""Quantization modes side by side: weight memory, speed and accuracy against the unquantized model.

Runs every mode (none, bf16, fp8_mixed, int4_mixed) in one process on the same engine and prompts —
one model resident at a time, toggled with ``engine.set_quantization`` — on the embedded default
model (tiny Llama 4) and on a ~50M-parameter tiny Llama 3 (``SMALL_LLAMA3``), then prints each
table, the ratios to the unquantized model and one JSON line.  Columns are defined in
``workbench.notebook.bench`` (top-1 agreement and mean KL over teacher-forced positions of prompt + reference
greedy continuation; greedy_match = share of the reference greedy tokens reproduced before the
first divergence).

    python bench/quantization.py [--prompts 8] [--max-tokens 24] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import math

import pandas as pd
from common import make_prompts, small_llama3_dir

import workbench as wb
from workbench import bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3, help="timings are the best of this many runs")
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    prompts = make_prompts(args.prompts, max_repeats=7)
    models = {"tiny-llama4 (default)": None, "small-llama3 (~50M)": small_llama3_dir()}
    results = {}
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        for name, ckpt in models.items():
            engine = wb.load(ckpt, device=args.device, max_batch_size=args.prompts, max_seq_len=256)
            table = bench.quantization(engine, prompts, max_tokens=args.max_tokens, repeats=args.repeats)
            info = engine.info()
            print(
                f"\n{name}: {info['parameters'] / 1e6:.1f}M params, device={info['device']}, dtype={info['dtype']}, "
                f"{args.prompts} prompts x {args.max_tokens} tokens"
            )
            print(table.to_string())
            ratios = pd.DataFrame(
                {
                    "memory_x": table.weights_bytes / table.weights_bytes["none"],
                    "decode_speed_x": table.decode_tok_s / table.decode_tok_s["none"],
                    "prefill_speed_x": table.prefill_tok_s / table.prefill_tok_s["none"],
                }
            )
            print("ratios to mode none:")
            print(ratios.to_string())
            results[name] = {
                mode: {**{k: _plain(v) for k, v in row.items()}, **{k: _plain(v) for k, v in ratios.loc[mode].items()}}
                for mode, row in table.iterrows()
            }
    wb.unload()
    print(
        json.dumps(
            {"bench": "quantization", "prompts": args.prompts, "max_tokens": args.max_tokens, "results": results}
        )
    )


def _plain(value: object) -> object:
    """numpy scalars to Python numbers, floats to 4 significant digits (NaN to null), for a valid JSON line."""
    if hasattr(value, "item"):
        value = value.item()  # type: ignore[union-attr]
    if isinstance(value, float):
        return None if math.isnan(value) else float(f"{value:.4g}")
    return value


if __name__ == "__main__":
    main()
