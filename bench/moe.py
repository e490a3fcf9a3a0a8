"""MoE layer time against the number of experts (4, 16, 64) at top-1: grouped experts vs a per-expert loop.

One Llama-4-style MoE layer (router, shared expert, routed experts; dim and expert width of the
``--dim``/``--hidden`` flags) with random weights, timed at decode-sized (1, 16 tokens) and
prefill-sized (512 tokens) inputs.  ``grouped`` is three grouped matmuls (work proportional to
routed tokens, no host sync); ``loop`` is one matmul chain per expert that got tokens (a host sync
for the counts); ``workbench`` is what the layer runs (on CPU the loop below
``CPU_GROUPED_MIN_ROWS`` routed rows, grouped above; grouped on GPUs).  Medians of interleaved
repeats; prints a table, the 64-vs-4-expert ratios and one JSON line.

Times are CPU seconds of the benchmark process (``common.clock``; ``BENCH_CLOCK=wall`` for wall time).

    python bench/moe.py [--dim 256] [--hidden 512] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from common import clock

from workbench.checkpoints.factory import TINY_LLAMA4
from workbench.models import feed_forward
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.feed_forward import MoE

# workbench: the layer as it runs (on CPU: the loop below CPU_GROUPED_MIN_ROWS routed rows, grouped above);
# grouped: always torch._grouped_mm; loop: always one matmul chain per used expert
PATHS = ("workbench", "grouped", "loop")


def build(num_experts: int, dim: int, hidden: int) -> MoE:
    params = {
        **TINY_LLAMA4,
        "dim": dim,
        "n_heads": 4,
        "head_dim": dim // 4,
        "moe_args": {**TINY_LLAMA4["moe_args"], "num_experts": num_experts, "top_k": 1, "auto_scale_F": False},
    }
    params.update(ffn_exp=1.5 * hidden / dim, ffn_dim_multiplier=1.0)  # expert width = 2/3 * ffn_exp * dim = hidden
    args = ModelArgs.from_dict(params, source="bench")
    moe = MoE(args, device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(num_experts)
    for p in moe.parameters():
        p.data = torch.randn(p.shape, generator=gen) / p.shape[-2] ** 0.5
    return moe


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    ensure_model_parallel(1)
    experts = (4, 16, 64)
    token_counts = (1, 16, 512)
    layers = {e: build(e, args.dim, args.hidden) for e in experts}
    inputs = {n: torch.randn(1, n, args.dim, generator=torch.Generator().manual_seed(n)) for n in token_counts}
    times: dict[tuple[str, int, int], list[float]] = {}
    default_min_rows = feed_forward.CPU_GROUPED_MIN_ROWS
    for _ in range(args.repeats):  # interleaved: machine noise hits every cell alike
        for e, layer in layers.items():
            for n, x in inputs.items():
                for path in PATHS:
                    if path == "loop":
                        layer.experts.grouped = lambda *_: None  # type: ignore[method-assign]
                    if path == "grouped":
                        feed_forward.CPU_GROUPED_MIN_ROWS = 0
                    start = clock()
                    layer(x)
                    times.setdefault((path, e, n), []).append(clock() - start)
                    if path == "loop":
                        del layer.experts.grouped
                    feed_forward.CPU_GROUPED_MIN_ROWS = default_min_rows
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"MoE layer (dim {args.dim}, expert width {args.hidden}, top-1), median ms of {args.repeats}")
    print(f"{'tokens':>7} {'path':>8} " + " ".join(f"{f'{e} experts':>11}" for e in experts) + f" {'64/4':>6}")
    ratios = {}
    for n in token_counts:
        for path in PATHS:
            row = [ms[(path, e, n)] for e in experts]
            ratios[f"{path}_{n}"] = row[-1] / row[0]
            print(f"{n:>7} {path:>8} " + " ".join(f"{v:11.3f}" for v in row) + f" {row[-1] / row[0]:6.2f}")
    print(
        json.dumps(
            {
                "bench": "moe",
                "dim": args.dim,
                "hidden": args.hidden,
                "top_k": 1,
                "ms": {f"{p}/{e}/{n}": round(v, 4) for (p, e, n), v in ms.items()},
                "ratio_64_vs_4": {k: round(v, 3) for k, v in ratios.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
