"""What the benchmark scripts share: prompts of varied lengths and the ~50M-parameter tiny Llama 3."""

from __future__ import annotations

from pathlib import Path

from workbench.factory import SMALL_LLAMA3, cache_root, write_checkpoint

TOPICS = ["llamas", "the French revolution", "prime numbers", "photosynthesis", "jazz", "the moon landing",
          "neural networks", "volcanoes"]  # fmt: skip


def make_prompts(n: int, max_repeats: int = 12) -> list[str]:
    """``n`` prompts of 1..max_repeats sentences (a few to ~100 tokens), deterministic."""
    return [f"Write about {TOPICS[i % len(TOPICS)]}. " * (1 + (i * 5) % max_repeats) for i in range(n)]


def small_llama3_dir() -> Path:
    """The ~50M-parameter tiny Llama 3 (written once into the workbench cache)."""
    folder = cache_root() / "bench-small-llama3-v1"
    if not (folder / "params.json").exists():
        write_checkpoint(folder, SMALL_LLAMA3, seed=7)
    return folder
