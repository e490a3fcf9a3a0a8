"""Runs side by side with the statistics that say whether a difference is real: :func:`summary`, one row per
run and score — the mean with a 95 % interval and, against a baseline run, the paired difference over the items
both answered, its 95 % interval and a two-sided p-value, and how many items improved or regressed
(:mod:`workbench.runs.stats` holds the formulas).

Pass/fail scores: Wilson interval for a rate; McNemar's exact test and Newcombe's paired interval for the
difference.  Numeric scores: Student's t interval for a mean and for the mean paired difference; a paired
sign-flip permutation test (seeded: the same data give the same p-value).  ``shown`` is False when the
difference's interval covers 0 — or when the test's p-value is not below 0.05, since Newcombe's interval and
McNemar's exact test can disagree near the edge and a verdict must not rest on the kinder of the two: the runs
are then *not shown to differ* on that score (which is not the same as shown to be equal).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.errors import InputError
from workbench.runs import stats
from workbench.runs.outline import gc_paused, outline
from workbench.runs.pairing import item_scores, item_turns
from workbench.runs.store import Store, open_store

COLUMNS = [
    "run",
    "score",
    "kind",
    "n",
    "mean",
    "low",
    "high",
    "paired",
    "diff",
    "diff_low",
    "diff_high",
    "p_value",
    "improved",
    "regressed",
    "shown",
    "test",
]


def _run_scores(store: Store, name: str) -> dict[str, dict[str, Any]]:
    """``{score: {item: value}}`` of run ``name`` (an item's value: its last row's that carries the score)."""
    out: dict[str, dict[str, Any]] = {}
    found = outline(store, name)
    for item, turns in item_turns(found.records).items():
        for score, value in item_scores(turns, found).items():
            out.setdefault(score, {})[item] = value
    return out


def _kind(values: Sequence[Any]) -> str:
    return "bool" if all(isinstance(v, (bool, np.bool_)) for v in values) else "number"


def _against(kind: str, base: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """The paired comparison of one score of two runs over the items both scored."""
    common = [item for item in mine if item in base]
    if not common:
        return {
            "paired": 0,
            "diff": math.nan,
            "diff_low": math.nan,
            "diff_high": math.nan,
            "p_value": math.nan,
            "improved": 0,
            "regressed": 0,
            "test": None,
        }
    a = np.array([float(base[i]) for i in common])
    b = np.array([float(mine[i]) for i in common])
    improved, regressed = int(np.sum(b > a)), int(np.sum(b < a))
    if kind == "bool":
        both, neither = int(np.sum((a == 1) & (b == 1))), int(np.sum((a == 0) & (b == 0)))
        diff, low, high = stats.paired_rate_difference(both, regressed, improved, neither)
        p_value, test = stats.mcnemar_exact(improved, regressed), "mcnemar-exact"
    else:
        diff, low, high = stats.mean_interval(b - a)
        p_value, test = stats.sign_flip_p(b - a), "sign-flip"
    return {
        "paired": len(common),
        "diff": diff,
        "diff_low": low,
        "diff_high": high,
        "p_value": p_value,
        "improved": improved,
        "regressed": regressed,
        "test": test,
    }


@gc_paused()  # tens of thousands of small records: see workbench.runs.outline.gc_paused
def summary(
    names: str | Sequence[str],
    baseline: str | None = None,
    scores: Sequence[str] | None = None,
    *,
    store: str | Path | Store | None = None,
    empty_ok: bool = False,
) -> pd.DataFrame:
    """One row per run × score: ``n`` (items scored), ``mean`` with its 95 % interval (``low``, ``high``), and
    against ``baseline`` (default the first run) over the ``paired`` items both scored: ``diff`` (this run minus
    the baseline) with its 95 % interval (``diff_low``, ``diff_high``), the two-sided ``p_value`` (``test``:
    McNemar's exact test for pass/fail, a sign-flip permutation test for numbers), the ``improved`` /
    ``regressed`` item counts and ``shown`` (False: the interval covers 0, not shown to differ).  The
    baseline's own row has no difference.  ``scores``: the score names to show (default all).  Runs that hold no
    scores yet raise :class:`InputError` (naming how to score them), or with ``empty_ok=True`` give a frame with
    no rows — what the report and the viewer show for runs compared before any scoring."""
    runs = [names] if isinstance(names, str) else list(names)
    if not runs:
        raise InputError("summary needs at least one run name, e.g. wb.runs.summary(['base', 'new'])")
    st = open_store(store)
    base = baseline if baseline is not None else runs[0]
    if base not in runs:
        runs.insert(0, base)
    by_run = {name: _run_scores(st, name) for name in runs}
    found = list(dict.fromkeys(s for name in runs for s in by_run[name]))
    wanted = list(scores) if scores is not None else found
    unknown = [s for s in wanted if s not in found]
    if unknown:
        raise InputError(
            f"no score named {', '.join(map(repr, unknown))} on runs {', '.join(map(repr, runs))} "
            f"(scores: {', '.join(found) or 'none'}); score them with wb.runs.score(name, fn)"
        )
    if not wanted and empty_ok:
        frame = pd.DataFrame(columns=COLUMNS)
        frame.attrs.update({"baseline": base, "runs": runs, "scores": [], "level": stats.LEVEL})
        return frame
    if not wanted:
        raise InputError(
            f"runs {', '.join(map(repr, runs))} hold no scores yet; score them with "
            "wb.runs.score(name, fn) (fn(row) -> {'passed': bool, ...}) or run the evals with run="
        )
    records = []
    for score in wanted:
        kind = _kind([v for name in runs for v in by_run[name].get(score, {}).values()])
        for name in runs:
            values = by_run[name].get(score, {})
            data = np.array([float(v) for v in values.values()])
            if kind == "bool":
                mean = float(data.mean()) if data.size else math.nan
                low, high = stats.wilson(int(data.sum()), int(data.size))
            else:
                mean, low, high = stats.mean_interval(data)
            record = {
                "run": name,
                "score": score,
                "kind": kind,
                "n": int(data.size),
                "mean": mean,
                "low": low,
                "high": high,
            }
            if name == base:
                record.update(
                    paired=int(data.size),
                    diff=None,
                    diff_low=None,
                    diff_high=None,
                    p_value=None,
                    improved=None,
                    regressed=None,
                    shown=None,
                    test=None,
                )
            else:
                record.update(_against(kind, by_run[base].get(score, {}), values))
                low_d, high_d = record["diff_low"], record["diff_high"]
                excludes_zero = not (math.isnan(low_d) or math.isnan(high_d)) and (low_d > 0 or high_d < 0)
                p_value = record["p_value"]
                record["shown"] = bool(excludes_zero and p_value is not None and p_value < 1 - stats.LEVEL)
            records.append(record)
    frame = pd.DataFrame.from_records(records, columns=COLUMNS)
    frame.attrs.update({"baseline": base, "runs": runs, "scores": wanted, "level": stats.LEVEL})
    return frame
