"""Decode steps with fixed shapes, captured as CUDA graphs per (batch, span) bucket.

An eager decode step of an 8B model on a GPU is bound by launching ~10 kernels per layer from Python,
not by reading the weights (docs/benchmarks.md: 13% of HBM peak at batch 1).  A CUDA graph replays the
whole step as one launch, but needs fixed shapes and fixed addresses, and the eager step has neither: its
batch width is the live rows' and it attends to keys ``0..highest position``, one more every step.

So a static step (:class:`StaticDecode`) pads the batch to a bucket width (1, 2, 4, 8, ... up to the
cache's slots) and the attended span to a bucket length (powers of two from 256 up to the cache length),
and masks keys past each row's own position, exactly as the eager step masks rows at different positions.
Tokens and positions go through preallocated device buffers; the step writes its keys/values into the
static cache at those positions (rows of padding write position ``seq_len - 1``, which no row ever feeds:
a row stops before its position reaches the end); the logits and the greedy tokens (argmax on the device) land
in preallocated outputs.  On CUDA each bucket is captured once (:meth:`StaticDecode.capture`, timed) and
replayed; on other devices the same static step runs eagerly (no capture), which is what the CPU tests
compare with the eager path.  Masked keys add zeros to the attention sums, so the tokens match the eager
step's (bit-for-bit on CPU in the tests; on a GPU up to the reduction order of a longer softmax).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

MIN_SPAN = 256


def buckets(limit: int, start: int = 1) -> list[int]:
    """Powers of two from ``start`` below ``limit``, then ``limit`` itself: the bucket sizes."""
    out, n = [], start
    while n < limit:
        out.append(n)
        n *= 2
    return [*out, limit]


@dataclass
class _Bucket:
    width: int
    span: int
    logits: torch.Tensor | None = None  # [width, V] float32 output of the last run
    greedy: torch.Tensor | None = None  # [width] argmax tokens (sampled on the device for greedy rows)
    graph: Any = None  # torch.cuda.CUDAGraph once captured


@dataclass
class StaticDecode:
    """Fixed-shape decode steps over ``cache`` (see the module docstring); ``capture()`` makes them graphs.

    ``model`` is a :class:`~workbench.models.transformer.Transformer` (its ``forward_decode_static`` is the
    step); ``cache`` its static KV cache.
    """

    model: Any
    cache: Any
    widths: list[int] = field(default_factory=list)
    spans: list[int] = field(default_factory=list)
    capture_s: float | None = None  # wall time of capture(), None before (or without CUDA)
    captured: int = 0
    replays: int = 0

    def __post_init__(self) -> None:
        slots, seq_len = self.cache.batch_size, self.cache.seq_len
        self.widths = self.widths or buckets(slots)
        self.spans = self.spans or buckets(seq_len, min(MIN_SPAN, seq_len))
        device = self.model.device
        self.tokens = torch.zeros(slots, dtype=torch.long, device=device)  # [slots]
        self.positions = torch.full((slots,), seq_len - 1, dtype=torch.long, device=device)  # [slots]
        self._buckets: dict[tuple[int, int], _Bucket] = {}

    @property
    def graphed(self) -> bool:
        return self.captured > 0

    def bucket(self, width: int, high: int) -> tuple[int, int]:
        """The smallest (width, span) bucket holding ``width`` rows whose highest position is ``high``."""
        if width > self.widths[-1] or high >= self.spans[-1]:
            raise ValueError(
                f"{width} rows up to position {high} exceed the cache "
                f"({self.widths[-1]} slots, {self.spans[-1]} positions)"
            )
        return next(w for w in self.widths if w >= width), next(s for s in self.spans if s > high)

    def _step(self, b: _Bucket) -> None:
        """The static step of one bucket: reads the input buffers, writes the cache and the outputs."""
        tokens, positions = self.tokens[: b.width], self.positions[: b.width, None]  # [W], [W, 1]
        logits = self.model.forward_decode_static(tokens, positions, self.cache, b.span)  # [W, V]
        greedy = logits.argmax(dim=-1)  # [W]
        if b.logits is None or b.greedy is None:
            b.logits, b.greedy = logits, greedy
        else:  # the outputs keep their addresses (a graph's outputs are its static tensors)
            b.logits.copy_(logits)
            b.greedy.copy_(greedy)

    def capture(self) -> float:
        """Capture every bucket as a CUDA graph (largest first, one shared memory pool); returns seconds.

        Needs a CUDA model; a capture that fails (an operation a graph cannot hold) raises, and the caller
        falls back to eager steps.  The warm-up runs write keys/values only at position ``seq_len - 1``.
        """
        if self.model.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device; on this device the static step runs eagerly")
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        self.positions.fill_(self.cache.seq_len - 1)
        self.tokens.zero_()
        with torch.inference_mode():
            for width in reversed(self.widths):
                for span in reversed(self.spans):
                    b = self._buckets.setdefault((width, span), _Bucket(width, span))
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):  # warm-up off the capture: lazy inits, autotuning
                        for _ in range(2):
                            self._step(b)
                    torch.cuda.current_stream().wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        self._step(b)
                    b.graph = graph
                    self.captured += 1
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - start
        return self.capture_s

    @torch.inference_mode()
    def __call__(self, tokens: Sequence[int], positions: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step for rows 0..n-1: ``(logits [n, V], greedy tokens [n])``, views of the bucket's
        static outputs (valid until the next step)."""
        n = len(tokens)
        width, span = self.bucket(n, max(positions))
        b = self._buckets.setdefault((width, span), _Bucket(width, span))
        self.tokens[:n].copy_(torch.tensor(tokens, dtype=torch.long), non_blocking=True)
        self.positions[:n].copy_(torch.tensor(positions, dtype=torch.long), non_blocking=True)
        if width > n:  # padding rows: token 0 at the never-fed last position
            self.tokens[n:width].zero_()
            self.positions[n:width].fill_(self.cache.seq_len - 1)
        if b.graph is not None:
            b.graph.replay()
            self.replays += 1
        else:
            self._step(b)
        assert b.logits is not None and b.greedy is not None
        return b.logits[:n], b.greedy[:n]

    def info(self) -> dict[str, Any]:
        """What ``Engine.info()`` reports about graphed decoding."""
        return {
            "graphs": self.captured,
            "capture_s": None if self.capture_s is None else round(self.capture_s, 3),
            "widths": list(self.widths),
            "spans": list(self.spans),
            "replays": self.replays,
        }
