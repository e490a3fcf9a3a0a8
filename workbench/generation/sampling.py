"""Sampling parameters (validated once, up front) and per-row token selection."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from ..errors import SamplingError

MAX_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens.  ``temperature == 0`` is greedy; ``top_k == 0`` and ``top_p == 1`` disable them.

    ``seed`` makes sampling reproducible *per row*: every row gets its own generator seeded with
    ``seed``, so a prompt gives the same tokens alone or inside any batch.
    """

    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: int = 0
    stop: tuple[str, ...] = ()

    @classmethod
    def create(cls, max_tokens: int | None = None, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               seed: int | None = None, logprobs: int | bool | None = 0,
               stop: str | list[str] | tuple[str, ...] | None = None) -> SamplingParams:  # fmt: skip
        """Validate user keywords; each error names the keyword, the value and the allowed range."""
        if max_tokens is not None and (_not_int(max_tokens) or max_tokens < 1):
            raise SamplingError(f"max_tokens must be a positive integer or None (up to max_seq_len), got {max_tokens}")
        if _not_number(temperature) or not math.isfinite(temperature) or temperature < 0:
            raise SamplingError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
        if _not_number(top_p) or not 0.0 < top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
        if _not_int(top_k) or top_k < 0:
            raise SamplingError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
        if seed is not None and _not_int(seed):
            raise SamplingError(f"seed must be an integer or None, got {seed!r}")
        if logprobs is None or logprobs is False:
            logprobs = 0
        elif logprobs is True:
            logprobs = 1
        if _not_int(logprobs) or not 0 <= logprobs <= MAX_LOGPROBS:
            raise SamplingError(f"logprobs must be an integer in 0..{MAX_LOGPROBS} (top-k per token), got {logprobs!r}")
        if stop is None:
            stops: tuple[str, ...] = ()
        elif isinstance(stop, str):
            stops = (stop,)
        elif isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
            stops = tuple(stop)
        else:
            raise SamplingError(f"stop must be a string or a list of strings, got {stop!r}")
        if any(s == "" for s in stops):
            raise SamplingError("stop strings must be non-empty")
        return cls(max_tokens, float(temperature), float(top_p), int(top_k), seed, int(logprobs), stops)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def make_generator(self) -> torch.Generator | None:
        """A CPU generator for one row (None for greedy rows, which need no randomness)."""
        if self.greedy:
            return None
        seed = self.seed if self.seed is not None else random.SystemRandom().randrange(2**63)
        return torch.Generator().manual_seed(seed)


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def _not_number(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, (int, float))


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick one token from one row's float32 logits ``[V]``."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1).cpu()  # [V]
    if params.top_k and params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        sorted_probs[(cumulative - sorted_probs) > params.top_p * cumulative[-1]] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))
