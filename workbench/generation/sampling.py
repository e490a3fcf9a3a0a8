"""Sampling parameters (validated once, up front) and per-row token selection."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from workbench.errors import SamplingError

MAX_LOGPROBS = 20
# torch.Generator.manual_seed takes a 64-bit seed: unsigned, or signed (negative seeds wrap around 2**64).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens.  ``temperature == 0`` is greedy; ``top_k == 0`` and ``top_p == 1`` disable them.

    ``seed`` makes sampling reproducible *per row*: every row gets its own random stream seeded with
    ``seed``, so a prompt gives the same tokens alone or inside any batch.

    ``ignore_stop_tokens`` (benchmarks only, not a user keyword; vLLM's ``ignore_eos``): a stop token is
    kept as an ordinary token and the row runs to ``max_tokens``, so every row and every mode measured
    does the same work.
    """

    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: int = 0
    stop: tuple[str, ...] = ()
    ignore_stop_tokens: bool = False

    @classmethod
    def create(cls, max_tokens: int | None = None, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               seed: int | None = None, logprobs: int | bool | None = 0,
               stop: str | list[str] | tuple[str, ...] | None = None) -> SamplingParams:
        """Validate user keywords; each error names the keyword, the value and the allowed range."""
        if max_tokens is not None and (_not_int(max_tokens) or max_tokens < 1):
            raise SamplingError(f"max_tokens must be a positive integer or None (up to max_seq_len), got {max_tokens}")
        if _not_number(temperature) or not math.isfinite(temperature) or temperature < 0:
            raise SamplingError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
        if _not_number(top_p) or not 0.0 < top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
        if _not_int(top_k) or top_k < 0:
            raise SamplingError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
        if seed is not None and (_not_int(seed) or not SEED_MIN <= seed <= SEED_MAX):
            raise SamplingError(
                f"seed must be an integer in {SEED_MIN}..{SEED_MAX} (a 64-bit seed) or None, got {seed!r}; "
                "reduce it, e.g. seed % 2**64"
            )
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

    def make_rng(self) -> torch.Generator | None:
        """A CPU random stream for one row (None for greedy rows, which need no randomness)."""
        if self.greedy:
            return None
        seed = self.seed if self.seed is not None else random.SystemRandom().randrange(2**63)
        return torch.Generator().manual_seed(seed)


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def _not_number(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, (int, float))


def tempered_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(logits / temperature)`` on the CPU in float32, stable for any positive temperature.

    The max logit is subtracted *before* dividing: with a tiny temperature ``logits / t`` overflows to
    inf (and the softmax to NaN), while ``(logits - max) / t`` is 0 at the maximum and at most -inf
    elsewhere, so the result tends to greedy (ties shared) instead of failing.
    """
    # float64 only for tiny temperatures: 1e-300 would be 0 as a float32 scalar (and float64 costs 4x)
    logits = logits.cpu().float() if temperature >= 1e-6 else logits.double().cpu()  # [V]
    finite = torch.nan_to_num(logits, nan=-torch.inf, posinf=torch.finfo(torch.float32).max)
    shifted = (finite - finite.max()) / temperature  # [V], <= 0 (or -inf)
    return torch.softmax(shifted, dim=-1).float()


_ARGMAX_BLOCK = 64


def fast_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` for ``[n, V]`` logits, several times faster on CPU, with the same result.

    torch's CPU argmax over a 202k-token row is not vectorised (about 4 ms for 16 rows, a sixth of a whole
    decode step of the embedded default); ``amax`` is.  So: the maximum of each block of 64 logits,
    the first block holding the row's maximum, then the first maximum inside that block - the first
    occurrence overall, exactly as ``argmax`` picks it (NaN counts as the maximum in both).  Other
    devices use ``argmax`` itself.
    """
    n, vocab = logits.shape
    if logits.device.type != "cpu" or vocab < 4 * _ARGMAX_BLOCK:
        return logits.argmax(dim=-1)
    whole = vocab - vocab % _ARGMAX_BLOCK
    blocks = logits[:, :whole].reshape(n, -1, _ARGMAX_BLOCK)  # [n, V/64, 64]
    block_max = blocks.amax(dim=-1)  # [n, V/64]
    if whole < vocab:  # the ragged tail is one more block
        block_max = torch.cat([block_max, logits[:, whole:].amax(dim=-1, keepdim=True)], dim=-1)
    best_block = block_max.argmax(dim=-1)  # [n]
    starts = best_block * _ARGMAX_BLOCK  # [n]
    window = torch.arange(_ARGMAX_BLOCK, device=logits.device)  # [64]
    columns = (starts[:, None] + window).clamp_(max=vocab - 1)  # [n, 64]; the tail block repeats its last id
    return starts + logits.gather(1, columns).argmax(dim=-1)


def sample_token(logits: torch.Tensor, params: SamplingParams, rng: torch.Generator | None) -> int:
    """Pick one token from one row's float32 logits ``[V]``."""
    if params.greedy:
        return int(fast_argmax(logits[None])[0])
    probs = tempered_probs(logits, params.temperature)  # [V]
    if params.top_k and params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        sorted_probs[(cumulative - sorted_probs) > params.top_p * cumulative[-1]] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return _draw(probs, rng)


def _draw(probs: torch.Tensor, rng: torch.Generator | None) -> int:
    """One token drawn from unnormalised ``probs`` [V] by inverting the cumulative distribution.

    One uniform number from the row's own random stream; a token of zero probability is never drawn (the
    search lands on the first token whose cumulative mass exceeds the draw).  ``torch.multinomial`` does
    the same job about 25x slower on a 200k-token CPU row.
    """
    cumulative = torch.cumsum(probs.double(), dim=0)  # [V]
    target = torch.rand(1, generator=rng, dtype=torch.float64) * cumulative[-1]  # [1]
    index = int(torch.searchsorted(cumulative, target, right=True))
    if index >= probs.numel():  # the draw rounded up to the total: the last token with any mass
        index = int(torch.nonzero(probs > 0)[-1])
    return index
