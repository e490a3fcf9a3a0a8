"""What the benchmark scripts share: prompts of varied lengths and the ~50M-parameter tiny Llama 3."""

from __future__ import annotations

import os
import time
from pathlib import Path

from workbench.checkpoints.factory import SMALL_LLAMA3, TINY_LLAMA3, TINY_LLAMA4, cache_root, write_checkpoint

TOPICS = [
    "llamas",
    "the French revolution",
    "prime numbers",
    "photosynthesis",
    "jazz",
    "the moon landing",
    "neural networks",
    "volcanoes",
]


def make_prompts(n: int, max_repeats: int = 12) -> list[str]:
    """``n`` prompts of 1..max_repeats sentences (a few to ~100 tokens), deterministic."""
    return [f"Write about {TOPICS[i % len(TOPICS)]}. " * (1 + (i * 5) % max_repeats) for i in range(n)]


def small_llama3_dir() -> Path:
    """The ~50M-parameter tiny Llama 3 (written once into the workbench cache)."""
    folder = cache_root() / "bench-small-llama3-v1"
    if not (folder / "params.json").exists():
        write_checkpoint(folder, SMALL_LLAMA3, seed=7)
    return folder


# The models of bench/peers.py and bench/roofline.py (written once into the workbench cache).
PEER_MODELS: dict[str, dict] = {
    # the real 128k vocabulary on a small transformer: the output matrix dominates
    "llama3-d256": {**TINY_LLAMA3, "dim": 256, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2},
    # wider layers, where the transformer (not the output matrix) dominates: ~370M parameters
    "llama3-d1024": {**TINY_LLAMA3, "dim": 1024, "n_layers": 8, "n_heads": 8, "n_kv_heads": 2, "multiple_of": 256},
    # Llama 4 with MoE (16 experts, top-1, every other layer), NoPE, chunked attention
    "llama4-moe16": {
        **TINY_LLAMA4,
        "dim": 256,
        "n_heads": 4,
        "head_dim": 64,
        "moe_args": {**TINY_LLAMA4["moe_args"], "num_experts": 16},
    },
}


def peer_model_dir(name: str) -> Path:
    """Checkpoint folder of one of :data:`PEER_MODELS` (written on first use)."""
    folder = cache_root() / f"bench-peers-{name}-v1"
    if not (folder / "params.json").exists():
        write_checkpoint(folder, PEER_MODELS[name], seed=3)
    return folder


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def clock() -> float:
    """CPU seconds of the whole process (``time.process_time``): the benchmarks' clock.

    With ``OMP_NUM_THREADS=1`` every contender computes on one thread at a time (workbench's on its engine's
    loop thread while the calling thread waits), so the process's CPU time equals the wall time on an idle
    machine — and, unlike wall time, stays meaningful on a shared machine where the benchmark is preempted for
    long stretches (it still includes cache and memory contention from the other jobs).  ``BENCH_CLOCK=wall``
    switches to ``time.perf_counter``.
    """
    return time.process_time() if os.environ.get("BENCH_CLOCK", "cpu") == "cpu" else time.perf_counter()
