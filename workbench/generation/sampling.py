"""Sampling parameters (defined once, validated up front) and per-row token selection.

:class:`SamplingParams` is the one definition of every sampling and output setting: each field carries its
default, its check (the error text names the value, the allowed range and the fix), its one-line description
(the engine's docstrings and signatures are built from it) and how the run store's key holds it.  Adding an
option is adding a field here (plus its kernel, if it changes logits): the engine's keywords, Shift+Tab, the
Ray pool, the served engine and the run store's key follow from the field.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.errors import SamplingError

MAX_LOGPROBS = 20
# torch.Generator.manual_seed takes a 64-bit seed: unsigned, or signed (negative seeds wrap around 2**64).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def _not_number(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, (int, float))


# ---------------------------------------------------------------------------------------------- checks
def _check_max_tokens(value: Any) -> int | None:
    if value is not None and (_not_int(value) or value < 1):
        raise SamplingError(f"max_tokens must be a positive integer or None (up to max_seq_len), got {value}")
    return value


def _check_temperature(value: Any) -> float:
    if _not_number(value) or not math.isfinite(value) or value < 0:
        raise SamplingError(f"temperature must be a finite number >= 0 (0 = greedy), got {value!r}")
    return float(value)


def _check_top_p(value: Any) -> float:
    if _not_number(value) or not 0.0 < value <= 1.0:
        raise SamplingError(f"top_p must be in (0, 1] (1 = off), got {value!r}")
    return float(value)


def _check_top_k(value: Any) -> int:
    if _not_int(value) or value < 0:
        raise SamplingError(f"top_k must be an integer >= 0 (0 = off), got {value!r}")
    return int(value)


def check_seed(value: Any) -> int | None:
    """One seed: None or a 64-bit integer."""
    if value is not None and (_not_int(value) or not SEED_MIN <= value <= SEED_MAX):
        raise SamplingError(
            f"seed must be an integer in {SEED_MIN}..{SEED_MAX} (a 64-bit seed) or None, got {value!r}; "
            "reduce it, e.g. seed % 2**64"
        )
    return value


def _check_seeds(value: Any) -> int | tuple[int | None, ...] | None:
    """One seed for every row, or (batch methods) a list with one seed (or None) per row."""
    if isinstance(value, (list, tuple)):
        return tuple(check_seed(s) for s in value)
    return check_seed(value)


def _check_logprobs(value: Any) -> int:
    if value is None or value is False:
        value = 0
    elif value is True:
        value = 1
    if _not_int(value) or not 0 <= value <= MAX_LOGPROBS:
        raise SamplingError(f"logprobs must be an integer in 0..{MAX_LOGPROBS} (top-k per token), got {value!r}")
    return int(value)


def _check_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        stops: tuple[str, ...] = ()
    elif isinstance(value, str):
        stops = (value,)
    elif isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
        stops = tuple(value)
    else:
        raise SamplingError(f"stop must be a string or a list of strings, got {value!r}")
    if any(s == "" for s in stops):
        raise SamplingError("stop strings must be non-empty")
    return stops


def _check_repetition_penalty(value: Any) -> float:
    if _not_number(value) or not math.isfinite(value) or value <= 0:
        raise SamplingError(
            f"repetition_penalty must be a finite number > 0 (1.0 = off, > 1 discourages "
            f"repeating a token of the prompt or the reply), got {value!r}"
        )
    return float(value)


def _check_flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise SamplingError(f"ignore_stop_tokens must be True or False, got {value!r}")
    return value


def _option(
    default: Any,
    check: Callable[[Any], Any],
    doc: str,
    *,
    keyword: Any = dataclasses.MISSING,
    annotation: str | None = None,
    batch_annotation: str | None = None,
    key: str = "always",
    user: bool = True,
) -> Any:
    """One setting of :class:`SamplingParams`.

    doc: its description (the engine's docstrings list it); keyword / annotation: the default and type the
    engine's keyword shows when they differ from the field's (``stop=None`` for an empty tuple);
    batch_annotation: a batch method's (one value per row); key: ``"always"`` (the run store's key holds it) or
    ``"unless_default"`` (held only when set: a field added later leaves existing keys byte-identical); user:
    False for a setting that is no engine keyword (benchmarks only)."""
    return field(
        default=default,
        metadata={
            "check": check,
            "doc": doc,
            "keyword": default if keyword is dataclasses.MISSING else keyword,
            "annotation": annotation,
            "batch_annotation": batch_annotation,
            "key": key,
            "user": user,
        },
    )


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and what to report: every sampling and output setting, defined once.

    ``SamplingParams(temperature=0.7, seed=1)`` checks every value now (:class:`~workbench.errors.SamplingError`
    names the field, the value and the allowed range) and normalises it (``stop="x"`` -> ``("x",)``,
    ``logprobs=True`` -> 1).  Pass it as ``sampling=`` to any completion or chat method; the same names are also
    keywords of those methods, and a keyword given beside ``sampling=`` overrides that field.

    ``seed`` makes sampling reproducible *per row*: every row gets its own random stream seeded with
    ``seed``, so a prompt gives the same tokens alone or inside any batch.  Batch methods also take one seed per
    row (a list).  ``ignore_stop_tokens`` (benchmarks only, not a user keyword; vLLM's ``ignore_eos``): a stop
    token is kept as an ordinary token and the row runs to ``max_tokens``, so every row and every mode measured
    does the same work.
    """

    max_tokens: int | None = _option(
        None, _check_max_tokens, "most tokens to generate per row; None runs until a stop token or max_seq_len."
    )
    temperature: float = _option(
        0.0,
        _check_temperature,
        "0 (default) always picks the most likely token (greedy, deterministic);\nhigher values sample more freely.",
    )
    top_p: float = _option(
        1.0,
        _check_top_p,
        "nucleus sampling, only from the smallest set of tokens whose probability reaches\ntop_p (1.0 = off).",
    )
    top_k: int = _option(0, _check_top_k, "sample only among the k most likely tokens (0 = off).")
    seed: int | tuple[int | None, ...] | None = _option(
        None,
        _check_seeds,
        "makes sampled rows reproducible; every row gets its own generator seeded with it,\n"
        "so a prompt gives the same tokens alone or inside any batch (batch methods: one seed or a list with\n"
        "one per row).",
        annotation="int | None",
        batch_annotation="int | Sequence[int | None] | None",
    )
    logprobs: int = _option(
        0,
        _check_logprobs,
        "k > 0 records each generated token's log-probability and its k most likely\n"
        f"alternatives (``result.logprobs``); up to {MAX_LOGPROBS}.",
    )
    stop: tuple[str, ...] = _option(
        (),
        _check_stop,
        "a string or list of strings that end generation; the text is cut before it.",
        keyword=None,
        annotation="str | Sequence[str] | None",
    )
    repetition_penalty: float = _option(
        1.0,
        _check_repetition_penalty,
        "> 1 makes every token already in the prompt or the reply less likely\n"
        "(its logit divided by the penalty if positive, multiplied if negative: transformers' definition);\n"
        "1.0 = off.",
        key="unless_default",
    )
    ignore_stop_tokens: bool = _option(
        False, _check_flag, "benchmarks only: run every row to max_tokens.", key="unless_default", user=False
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, f.metadata["check"](getattr(self, f.name)))

    @classmethod
    def create(cls, **settings: Any) -> SamplingParams:
        """``SamplingParams(**settings)``: kept for callers of the earlier spelling."""
        return cls(**settings)

    @classmethod
    def resolve(cls, sampling: SamplingParams | None = None, **keywords: Any) -> SamplingParams:
        """The one rule for a call's sampling: ``sampling`` (default: every field at its default) with each
        keyword given beside it overriding that field.  A ``sampling`` that is no SamplingParams (a dict of
        fields is taken too) raises SamplingError with the fix."""
        if sampling is None:
            return cls(**keywords)
        if isinstance(sampling, dict):
            sampling = cls(**sampling)
        if not isinstance(sampling, cls):
            raise SamplingError(
                f"sampling= takes a workbench SamplingParams (wb.SamplingParams(temperature=0.7, "
                f"...)) or a dict of its fields, got {type(sampling).__name__}"
            )
        return dataclasses.replace(sampling, **keywords) if keywords else sampling

    @classmethod
    def keywords(cls) -> list[dataclasses.Field]:
        """The fields that are engine keywords, in order (the engine's signatures and docstrings list them)."""
        return [f for f in dataclasses.fields(cls) if f.metadata["user"]]

    def key_fields(self) -> dict[str, Any]:
        """The settings as the run store's key holds them: every ``"always"`` field, the others only when set
        (so a field added later keeps the keys stored before it byte-identical at its default)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["key"] == "always" or value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def split_seeds(self, rows: int) -> tuple[SamplingParams, list[int | None] | None]:
        """A batch call's seeds: ``(self, None)`` for one seed for every row, or ``(self with seed None, seeds)``
        for a list with one per row (checked against the ``rows`` count)."""
        if not isinstance(self.seed, tuple):
            return self, None
        if len(self.seed) != rows:
            raise SamplingError(
                f"seed has {len(self.seed)} entries for {rows} prompts; give one seed for all rows "
                "or one entry (None for none) per row"
            )
        return dataclasses.replace(self, seed=None), list(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """The row's logits are rewritten by a repetition penalty before a token is picked."""
        return self.repetition_penalty != 1.0

    def make_rng(self) -> torch.Generator | None:
        """A CPU random stream for one row (None for greedy rows, which need no randomness)."""
        if self.greedy:
            return None
        seed = self.seed if self.seed is not None else random.SystemRandom().randrange(2**63)
        if isinstance(seed, tuple):
            raise SamplingError("a row runs with one seed; split a batch's seeds first (SamplingParams.split_seeds)")
        return torch.Generator().manual_seed(seed)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """transformers' repetition penalty on the device, for several rows at once: the rows' new logits [n, V].

    logits: [n, V] float; seen: [n, V] bool, the tokens already in each row's prompt or reply; penalty: [n, 1]
    float.  A seen token's logit is divided by the penalty when positive and multiplied by it otherwise (so a
    penalty > 1 always makes it less likely).  No value is read back to the host."""
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)  # [n, V]
    return torch.where(seen, penalized, logits)


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
