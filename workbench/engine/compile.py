"""Compiling the decode step (``wb.load(compile=True)`` / ``engine.compile_decode()``) and warming it up.

The warm-up runs real rows through the engine's own collection path, so the graphs that torch.compile
builds are the ones later calls use; a failure leaves the engine decoding eagerly (the same tokens).
"""

from __future__ import annotations

import time
from typing import Any

from workbench.errors import CompileError
from workbench.generation.sampling import SamplingParams


def compile_and_warm_up(engine: Any) -> float:
    start = time.perf_counter()
    try:
        engine._runner.compile_decode()
        warm_up_decode(engine)
    except Exception as exc:
        engine._runner.compile_decode(enabled=False)
        raise CompileError(
            f"torch.compile could not compile the decode step ({type(exc).__name__}: {str(exc)[:300]}); "
            "the engine keeps decoding eagerly (same tokens): carry on without compile=True"
        ) from exc
    return time.perf_counter() - start

def use_cuda_graphs(engine: Any) -> dict[str, Any]:
    """Decode through fixed-shape steps captured as CUDA graphs per (batch, span) bucket
    (:mod:`workbench.generation.graphs`); on a CPU the same fixed-shape steps run uncaptured.  Returns what
    ``info()["cuda_graphs"]`` shows (graph count, capture seconds, buckets).  A failed capture leaves eager
    decoding (the same tokens) and raises :class:`CompileError`."""
    runner = engine._runner
    if not hasattr(runner, "use_cuda_graphs"):
        raise CompileError("cuda_graphs=True needs the in-process runner (model_parallel_size=1); the engine "
                           "keeps decoding eagerly: load with model_parallel_size=1 or without cuda_graphs")
    try:
        return runner.use_cuda_graphs(True)
    except Exception as exc:
        runner.use_cuda_graphs(False)
        raise CompileError(
            f"CUDA graphs could not be captured ({type(exc).__name__}: {str(exc)[:300]}); the engine keeps "
            "decoding eagerly (same tokens): carry on without cuda_graphs=True"
        ) from exc


def warm_up_decode(engine: Any) -> None:
    bos = engine.tokenizer.bos_id
    params = SamplingParams.create(max_tokens=3)
    # Three rows at unequal positions (mask), then at one (no mask).  Not two rows: with 2 KV heads
    # torch.compile would tie the batch width to the head count and recompile for the first other width.
    for prompts in ([[bos, 1000, 1001], [bos, 1002], [bos, 1003]], [[bos, 1004], [bos, 1005], [bos, 1006]]):
        engine._collect(prompts, params, False, [None] * 3, [None] * 3, [None] * 3)
