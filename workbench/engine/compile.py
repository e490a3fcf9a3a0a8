"""Compiling the decode step (``wb.load(compile=True)`` / ``engine.compile_decode()``) and warming it up, and
CUDA graphs (``engine.use_cuda_graphs()``).

The warm-up runs real rows through the runner, so the graphs that torch.compile builds are the ones later calls
use; a failure leaves the engine decoding eagerly (the same tokens).  The engine holds its gate around both.
"""

from __future__ import annotations

import time
from typing import Any

from workbench.engine.interfaces import Runner
from workbench.errors import CompileError
from workbench.generation import Request, SamplingParams


def compile_and_warm_up(runner: Runner, bos_id: int) -> float:
    """Compile ``runner``'s decode step and warm it up; the seconds it took."""
    start = time.perf_counter()
    try:
        runner.compile_decode()
        warm_up_decode(runner, bos_id)
    except Exception as exc:
        runner.compile_decode(enabled=False)
        raise CompileError(
            f"torch.compile could not compile the decode step ({type(exc).__name__}: {str(exc)[:300]}); "
            "the engine keeps decoding eagerly (same tokens): carry on without compile=True"
        ) from exc
    return time.perf_counter() - start


def use_cuda_graphs(runner: Runner) -> dict[str, Any]:
    """Decode through fixed-shape steps captured as CUDA graphs per (batch, span) bucket
    (:mod:`workbench.generation.graphs`); on a CPU the same fixed-shape steps run uncaptured.  Returns what
    ``info()["cuda_graphs"]`` shows (graph count, capture seconds, buckets).  A failed capture leaves eager
    decoding (the same tokens) and raises :class:`CompileError`."""
    capture = getattr(runner, "use_cuda_graphs", None)  # the in-process runner has it, the worker pool not
    if capture is None:
        raise CompileError(
            "cuda_graphs=True needs the in-process runner (model_parallel_size=1); the engine "
            "keeps decoding eagerly: load with model_parallel_size=1 or without cuda_graphs"
        )
    try:
        return capture(True)
    except Exception as exc:
        capture(False)
        raise CompileError(
            f"CUDA graphs could not be captured ({type(exc).__name__}: {str(exc)[:300]}); the engine keeps "
            "decoding eagerly (same tokens): carry on without cuda_graphs=True"
        ) from exc


def warm_up_decode(runner: Runner, bos_id: int) -> None:
    """Run the warm-up rows to their end (their tokens are not needed)."""
    params = SamplingParams.create(max_tokens=3)
    # Three rows at unequal positions (mask), then at one (no mask).  Not two rows: with 2 KV heads
    # torch.compile would tie the batch width to the head count and recompile for the first other width.
    for prompts in (
        [[bos_id, 1000, 1001], [bos_id, 1002], [bos_id, 1003]],
        [[bos_id, 1004], [bos_id, 1005], [bos_id, 1006]],
    ):
        for _event in runner.generate([Request(i, p, params) for i, p in enumerate(prompts)]):
            pass
