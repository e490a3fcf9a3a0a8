"""Two runs item by item: :func:`compare` (both outputs, same or not, the first differing token, each score in
both runs and whether the item improved, regressed or stayed) and :func:`transcript` (one item's rows, turn by
turn, for reading side by side).

An item is what a row answers (:mod:`workbench.runs.items`): by default the row's input without the settings,
so two runs that differ in system prompt, tools, tool format, sampling, quantization or checkpoint line up.  A
tool-loop item is its whole transcript: every turn's calls and its final answer; its scores are those of its
last row that carries them.  ``by="request"`` pairs rows whose requests are identical instead (prompt ids and
sampling; :func:`workbench.runs.browse.compare_requests`), what comparing a quantization or a checkpoint needs
when items were named differently.

Higher is better for every score: a pass/fail score improves from False to True, a number when it grows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.errors import InputError
from workbench.runs.browse import compare_requests
from workbench.runs.outline import Outline, calls_text, gc_paused, outline, read_outline
from workbench.runs.settings import diff_settings
from workbench.runs.store import Store, open_store

BY = ("item", "request")
CHANGES = ("regressed", "improved", "same")
DIFF_CHARS = 60


def item_turns(records: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """A run's records grouped by item (in the order items first appear), each item's rows by turn; of two
    rows of one item and turn, the later stored one stands."""
    grouped: dict[str, dict[int, Mapping[str, Any]]] = {}
    for record in records:
        grouped.setdefault(record["item"], {})[record["turn"] or 0] = record
    return {item: [turns[t] for t in sorted(turns)] for item, turns in grouped.items()}


def item_text(turns: list[Mapping[str, Any]]) -> str:
    """An item's output as text: a one-row item's output; a tool-loop item's calls turn by turn, then its
    final answer."""
    if len(turns) == 1 and not turns[0]["calls"]:
        return turns[0]["output"]
    lines = [f"→ {calls_text(t['calls'])}" if t["calls"] else t["output"] for t in turns]
    return "\n".join(lines)


def _signature(turns: list[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """What two items must share to be the same answer: every turn's tokens, text, calls and stop reason."""
    return [(tuple(t["tokens"]), t["output"], t["tool_calls"], t["stop_reason"]) for t in turns]


def item_scores(turns: list[Mapping[str, Any]], found: Outline) -> dict[str, Any]:
    """An item's scores: each name's value on the last row (turn) that carries it."""
    if len(turns) == 1:
        return found.scores_of(turns[0])
    out: dict[str, Any] = {}
    for turn in turns:
        out.update(found.scores_of(turn))
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The index of the first token where two token lists part (None if equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _text_difference(a: str, b: str) -> tuple[str, str]:
    """Both texts from the first character where they part (at most :data:`DIFF_CHARS` characters)."""
    start = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[start : start + DIFF_CHARS], b[start : start + DIFF_CHARS]


def change_of(a: Any, b: Any) -> str | None:
    """``"improved"``, ``"regressed"`` or ``"same"`` from score ``a`` to ``b`` (higher is better); None when
    either is missing."""
    if a is None or b is None or a != a or b != b:
        return None
    if b > a:
        return "improved"
    return "regressed" if b < a else "same"


def no_common_items(a: str, b: str, n_a: int, n_b: int) -> InputError:
    return InputError(
        f"runs {a!r} and {b!r} answer no item in common ({n_a} and {n_b} items); their inputs differ, so no row "
        "of one lines up with a row of the other. Name the items yourself (item= on the calls, one id per row; "
        "the evals use case ids), or pair identical requests with by='request'"
    )


@gc_paused()  # tens of thousands of small records: see workbench.runs.outline.gc_paused
def compare(
    a: str,
    b: str,
    *,
    by: str = "item",
    score: str | None = None,
    differing_only: bool | None = None,
    store: str | Path | Store | None = None,
) -> pd.DataFrame:
    """Runs ``a`` and ``b`` item by item: one row per item both answered (see the module docstring).

    Columns: ``item``, ``output_a``, ``output_b`` (a tool-loop item: its calls turn by turn and final answer),
    ``same``, ``first_diff`` (the index of the first differing generated token; None when same), ``token_a`` /
    ``token_b`` (the ids there), ``diff_a`` / ``diff_b`` (both texts from where they part), ``stop_reason_a`` /
    ``_b``, ``tool_calls_a`` / ``_b``, ``turns_a`` / ``_b``, per score ``<score>_a``, ``<score>_b`` and
    ``<score>_change``, and ``change``: the change of ``score`` (default the first score name), ``"improved"``,
    ``"regressed"``, ``"same"`` or None.  Rows: regressions first, then improvements, other differences, the
    same.  ``differing_only=True`` keeps the items whose outputs differ.

    ``attrs``: ``counts`` (``both``, ``only_a``, ``only_b``, ``differ``, ``improved``, ``regressed``), the same
    counts at the top level, ``only_a_items`` / ``only_b_items``, ``scores``, ``score`` and ``settings``
    (:func:`~workbench.runs.settings.diff_settings`).  Runs with no item in common raise InputError naming
    the fix.  ``by="request"``: the exact-request pairing of earlier versions (its own columns)."""
    if by not in BY:
        raise InputError(f"by must be one of {', '.join(map(repr, BY))}, got {by!r}")
    st = open_store(store)
    if by == "request":
        return compare_requests(a, b, store=st, differing_only=True if differing_only is None else differing_only)
    found_a, found_b = outline(st, a), outline(st, b)
    left, right = item_turns(found_a.records), item_turns(found_b.records)
    both = [item for item in left if item in right]
    if not both:
        raise no_common_items(a, b, len(left), len(right))
    scores_a = {item: item_scores(left[item], found_a) for item in both}
    scores_b = {item: item_scores(right[item], found_b) for item in both}
    names = list(dict.fromkeys(n for side in (scores_a, scores_b) for item in both for n in side[item]))
    primary = score if score is not None else (names[0] if names else None)
    if primary is not None and primary not in names:
        raise InputError(
            f"no score named {primary!r} on the items of {a!r} and {b!r} (scores: "
            f"{', '.join(names) or 'none'}); score the runs with wb.runs.score(name, fn)"
        )
    records = []
    for item in both:
        x, y = left[item], right[item]
        same = _signature(x) == _signature(y)
        tokens_x = [t for turn in x for t in turn["tokens"]]
        tokens_y = [t for turn in y for t in turn["tokens"]]
        text_x, text_y = item_text(x), item_text(y)
        first = None if same else first_difference(tokens_x, tokens_y)
        diff_x, diff_y = ("", "") if same else _text_difference(text_x, text_y)
        record = {
            "item": item,
            "output_a": text_x,
            "output_b": text_y,
            "same": same,
            "first_diff": first,
            "token_a": tokens_x[first] if first is not None and first < len(tokens_x) else None,
            "token_b": tokens_y[first] if first is not None and first < len(tokens_y) else None,
            "diff_a": diff_x,
            "diff_b": diff_y,
            "stop_reason_a": x[-1]["stop_reason"],
            "stop_reason_b": y[-1]["stop_reason"],
            "tool_calls_a": "; ".join(t["tool_calls"] for t in x if t["tool_calls"]),
            "tool_calls_b": "; ".join(t["tool_calls"] for t in y if t["tool_calls"]),
            "turns_a": len(x),
            "turns_b": len(y),
        }
        sx, sy = scores_a[item], scores_b[item]
        for name in names:
            record[f"{name}_a"], record[f"{name}_b"] = sx.get(name), sy.get(name)
            record[f"{name}_change"] = change_of(sx.get(name), sy.get(name))
        record["change"] = record[f"{primary}_change"] if primary is not None else None
        records.append(record)
    columns = [
        "item",
        "output_a",
        "output_b",
        "same",
        "first_diff",
        "token_a",
        "token_b",
        "diff_a",
        "diff_b",
        "change",
        *[f"{n}_{s}" for n in names for s in ("a", "b", "change")],
        "stop_reason_a",
        "stop_reason_b",
        "tool_calls_a",
        "tool_calls_b",
        "turns_a",
        "turns_b",
    ]
    frame = pd.DataFrame.from_records(records, columns=columns)
    for name in names:  # None where an item lacks the score; pass/fail stays True/False (not numpy's bools)
        for side in ("a", "b"):
            frame[f"{name}_{side}"] = pd.Series([r[f"{name}_{side}"] for r in records], dtype=object)
    order = frame["change"].map({"regressed": 0, "improved": 1}).fillna(2) + frame["same"].astype(int)
    frame = frame.iloc[order.argsort(kind="stable")].reset_index(drop=True)
    for column in ("first_diff", "token_a", "token_b"):  # ints, None where the outputs are the same
        frame[column] = pd.Series([None if v is None or v != v else int(v) for v in frame[column]], dtype=object)
    counts = {
        "both": len(both),
        "only_a": sum(i not in right for i in left),
        "only_b": sum(i not in left for i in right),
        "differ": int((~frame["same"]).sum()),
        "improved": int((frame["change"] == "improved").sum()),
        "regressed": int((frame["change"] == "regressed").sum()),
    }
    if differing_only:
        frame = frame[~frame["same"]].reset_index(drop=True)
    frame.attrs.update(
        {
            "a": a,
            "b": b,
            "by": by,
            "counts": counts,
            **counts,
            "scores": names,
            "score": primary,
            "only_a_items": [i for i in left if i not in right],
            "only_b_items": [i for i in right if i not in left],
            "settings": diff_settings(a, b, store=st),
        }
    )
    return frame


def transcript(name: str, item: str, *, store: str | Path | Store | None = None) -> list[dict[str, Any]]:
    """Item ``item`` of run ``name`` turn by turn (what a viewer shows side by side): one dict per row in turn
    order with ``turn``, ``messages`` (the request's input: the dialog so far, or the prompt), ``output``
    (text), ``tool_calls`` (``[{"tool_name", "arguments"}]``), ``tool_results`` (the tool messages the next
    turn's input adds after this reply), ``stop_reason``, ``tokens``, ``scores``, ``kind`` and ``row_id``.
    An item the run does not hold raises InputError."""
    st = open_store(store)
    records = [r for r in read_outline(st, name) if r["item"] == item]
    if not records:
        known = list(dict.fromkeys(r["item"] for r in outline(st, name).records))[:10]
        raise InputError(
            f"run {name!r} has no item {item!r} (items: {', '.join(map(repr, known)) or 'none'}); "
            "wb.runs.rows(name)['item'] lists them"
        )
    turns = item_turns(records)[item]
    out = []
    for k, row in enumerate(turns):
        request = row["request"] if isinstance(row["request"], dict) else {"prompt": row["request"]}
        messages = request.get("messages")
        if messages is None:
            messages = [{"role": "user", "content": request.get("prompt", request.get("prompt_ids"))}]
        results: list[Any] = []
        if k + 1 < len(turns):  # the next turn's input: this dialog, this reply, then the tool results
            following = (turns[k + 1]["request"] or {}).get("messages") or []
            results = [m for m in following[len(messages) + 1 :] if isinstance(m, dict) and m.get("role") == "tool"]
        out.append(
            {
                "turn": row["turn"] if row["turn"] is not None else k,
                "messages": messages,
                "output": row["output"],
                "tool_calls": [{"tool_name": n, "arguments": a} for n, a in row["calls"]],
                "tool_results": results,
                "stop_reason": row["stop_reason"],
                "tokens": row["tokens"],
                "scores": row["scores"],
                "kind": row["kind"],
                "row_id": row["row_id"],
            }
        )
    return out
