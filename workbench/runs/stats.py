"""The statistics of :func:`workbench.runs.summary`, written out (numpy and the standard library; no scipy):
intervals for one run's mean score and tests for a paired difference between two runs over the same items.

* pass/fail scores: the **Wilson score interval** for a rate; for two runs over the same items, **McNemar's
  exact test** (a two-sided binomial test on the discordant pairs: an item that passed in one run and failed in
  the other) and **Newcombe's hybrid score interval** for the paired difference of rates (Newcombe 1998,
  method 10, from the two Wilson intervals and the correlation of the pairs);
* numeric scores: **Student's t interval** for a mean and for the mean paired difference, and a **paired
  sign-flip permutation test** (exact over every sign pattern up to :data:`EXACT_FLIPS_MAX` items, else
  :data:`PERMUTATIONS` random patterns from a fixed seed: the same data give the same p-value).

Every interval is two-sided at 95 % unless ``level`` says otherwise.  Inputs are plain numbers; the caller
pairs items.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
EXACT_FLIPS_MAX = 16  # items up to which the sign-flip test enumerates all 2**n sign patterns
PERMUTATIONS = 2_000  # random sign patterns beyond that (p-values resolve to 1/2001)
SEED = 20_240_601  # the sign-flip test's fixed seed


def z_value(level: float = LEVEL) -> float:
    """The two-sided standard-normal quantile of ``level`` (1.959964 for 95 %)."""
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The Wilson score interval of a rate ``successes / n`` (``(nan, nan)`` for n = 0)."""
    if n <= 0:
        return math.nan, math.nan
    z = z_value(level)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(improved: int, regressed: int) -> float:
    """Two-sided exact McNemar p-value: the chance, if either direction were equally likely, of discordant
    pairs at least this lopsided — ``min(1, 2 * P(X <= min(b, c)))`` for ``X ~ Binomial(b + c, 1/2)``.  No
    discordant pair: 1.0."""
    n = improved + regressed
    if n == 0:
        return 1.0
    low = min(improved, regressed)
    tail = sum(math.comb(n, i) for i in range(low + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_rate_difference(
    both: int, only_a: int, only_b: int, neither: int, level: float = LEVEL
) -> tuple[float, float, float]:
    """``(diff, low, high)``: the difference of pass rates ``rate_b - rate_a`` over paired items and Newcombe's
    hybrid score interval (method 10).  ``both``: items passed in both runs, ``only_a`` passed in a only (b
    regressed), ``only_b`` passed in b only (improved), ``neither`` failed in both."""
    n = both + only_a + only_b + neither
    if n == 0:
        return math.nan, math.nan, math.nan
    p_a, p_b = (both + only_a) / n, (both + only_b) / n
    l_a, u_a = wilson(both + only_a, n, level)
    l_b, u_b = wilson(both + only_b, n, level)
    product = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    if product == 0:
        phi = 0.0
    else:  # the correlation of the pairs, with Newcombe's continuity correction when it is positive
        cross = both * neither - only_a * only_b
        phi = (max(cross - n / 2, 0.0) if cross > 0 else cross) / math.sqrt(product)
    diff = p_b - p_a
    low = diff - math.sqrt(max(0.0, (p_b - l_b) ** 2 - 2 * phi * (p_b - l_b) * (u_a - p_a) + (u_a - p_a) ** 2))
    high = diff + math.sqrt(max(0.0, (u_b - p_b) ** 2 - 2 * phi * (u_b - p_b) * (p_a - l_a) + (p_a - l_a) ** 2))
    return diff, max(-1.0, low), min(1.0, high)


# ---------------------------------------------------------------------------------------------- Student's t
def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function with ``df`` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile's probability must be between 0 and 1, got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def mean_interval(values: Sequence[float] | np.ndarray, level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean with Student's t interval (one value: no interval, nan bounds; all values
    equal: the interval is the value)."""
    data = np.asarray(values, dtype=float)
    n = data.size
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = float(data.mean())
    if n == 1:
        return mean, math.nan, math.nan
    half = t_quantile(0.5 + level / 2, n - 1) * float(data.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def sign_flip_p(
    differences: Sequence[float] | np.ndarray, *, permutations: int = PERMUTATIONS, seed: int = SEED
) -> float:
    """Two-sided paired permutation p-value of the mean difference being 0: the share of sign patterns
    (each pair's difference kept or negated) whose mean is at least as far from 0 as the observed one.  Exact
    up to :data:`EXACT_FLIPS_MAX` non-zero differences; beyond, ``permutations`` random patterns from ``seed``
    with the observed pattern counted (``(1 + hits) / (1 + permutations)``)."""
    d = np.asarray(differences, dtype=float)
    d = d[d != 0].astype(np.float32) if d.size > EXACT_FLIPS_MAX else d[d != 0]
    n = d.size
    if n == 0:
        return 1.0
    observed = abs(d.sum()) * (1 - 1e-12)
    if n <= EXACT_FLIPS_MAX:
        patterns = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2 - 1  # [2**n, n] of +-1
        return float(np.mean(np.abs(patterns @ d) >= observed))
    rng = np.random.default_rng(seed)
    hits, done, chunk = 0, 0, max(1, min(permutations, 4_000_000 // n))
    while done < permutations:
        size = min(chunk, permutations - done)
        signs = (rng.integers(0, 2, size=(size, n), dtype=np.int8) * 2 - 1).astype(np.float32)  # [size, n]
        hits += int(np.count_nonzero(np.abs(signs @ d) >= observed))
        done += size
    return (1 + hits) / (1 + permutations)
