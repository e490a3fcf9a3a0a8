"""What changed between runs, as HTML: the score summary, the differing settings, the changed items with both
outputs and their differences highlighted — and :func:`report`, one self-contained file of all of it.

The pieces are plain HTML strings with inline styles (no script, no external style, font or image), so the
same markup serves the report file (attached to a paper, a pull request or a message, opened offline), the
notebook viewer (:mod:`workbench.notebook.runs_view` puts them into widgets) and a stored notebook.
Differences are marked word by word with :mod:`difflib` (``wb-del``: only in the baseline, ``wb-ins``: only
in the other run).
"""

from __future__ import annotations

import difflib
import html
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import runs  # the package's browsing functions (pandas loads on first use)
from workbench.errors import InputError
from workbench.runs.store import Store, open_store

# the changed items a report shows per compared pair (regressions first); the rest are counted
REPORT_ITEMS = 200
# longer texts are diffed by their first characters only (difflib is quadratic in the worst case)
DIFF_CHARS = 20_000
NOT_SHOWN = "not shown to differ"
CHANGE_ORDER = {"regressed": 0, "improved": 1, "changed": 2, "same": 3}

STYLE = """
.wb-runs{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;color:#222;line-height:1.4}
.wb-runs h1{font-size:20px;margin:8px 0}.wb-runs h2{font-size:16px;margin:18px 0 6px}
.wb-runs h3{font-size:14px;margin:12px 0 4px}
.wb-runs table{border-collapse:collapse;margin:4px 0}
.wb-runs th,.wb-runs td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
.wb-runs th{background:#f4f4f4}.wb-runs td.num{text-align:right;font-variant-numeric:tabular-nums}
.wb-runs .wb-shown{color:#0a0;font-weight:600}.wb-runs .wb-regressed-verdict{color:#b00;font-weight:600}
.wb-runs .wb-not-shown{color:#777;font-style:italic}
.wb-runs .wb-tag{display:inline-block;background:#e8eefc;color:#234;border-radius:3px;padding:0 5px;margin:1px}
.wb-runs .wb-change-regressed{color:#b00;font-weight:600}.wb-runs .wb-change-improved{color:#0a0;font-weight:600}
.wb-runs .wb-change-changed{color:#a60}.wb-runs .wb-change-same{color:#777}
.wb-runs .wb-side{display:flex;gap:8px;align-items:flex-start}
.wb-runs .wb-side>div{flex:1 1 0;min-width:0;border:1px solid #ddd;border-radius:4px;padding:4px 6px}
.wb-runs .wb-text{white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,Menlo,Consolas,monospace;
font-size:12px}
.wb-runs .wb-del{background:#fdd;text-decoration:line-through}.wb-runs .wb-ins{background:#cfc}
.wb-runs .wb-item{border-top:1px solid #ccc;padding:6px 0}.wb-runs .wb-muted{color:#777}
"""

_WORD = re.compile(r"\s+|\w+|[^\w\s]")


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 and value != 0 else f"{value:.{digits}f}"
    return str(value)


def _missing(value: Any) -> bool:
    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


# ------------------------------------------------------------------------------------------ differences
def words(text: str) -> list[str]:
    """The text cut into words, runs of white space and single punctuation marks (joined: the text again)."""
    return _WORD.findall(text)


def diff_html(a: str, b: str) -> tuple[str, str]:
    """Both texts as HTML with what differs marked word by word: ``wb-del`` spans in ``a`` (only there),
    ``wb-ins`` spans in ``b``.  Texts beyond :data:`DIFF_CHARS` are compared by their start, the rest shown."""
    a, b = str(a or ""), str(b or "")
    wa, wb = words(a[:DIFF_CHARS]), words(b[:DIFF_CHARS])
    left, right = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, wa, wb, autojunk=False).get_opcodes():
        x, y = esc("".join(wa[i1:i2])), esc("".join(wb[j1:j2]))
        if op == "equal":
            left.append(x)
            right.append(y)
            continue
        if x:
            left.append(f'<span class="wb-del">{x}</span>')
        if y:
            right.append(f'<span class="wb-ins">{y}</span>')
    return "".join(left) + esc(a[DIFF_CHARS:]), "".join(right) + esc(b[DIFF_CHARS:])


def side_by_side_html(a_title: str, a_text: str, b_title: str, b_text: str) -> str:
    """Two texts in two columns, differences highlighted (the baseline on the left)."""
    left, right = diff_html(a_text, b_text)
    return (
        f'<div class="wb-side"><div><b>{esc(a_title)}</b><div class="wb-text">{left}</div></div>'
        f'<div><b>{esc(b_title)}</b><div class="wb-text">{right}</div></div></div>'
    )


def transcript_text(turns: Sequence[Mapping[str, Any]]) -> str:
    """A tool-loop item (or a one-turn item) as text: each turn's reply, its tool calls, the tools' results and
    how it stopped — what the viewer compares side by side."""
    lines: list[str] = []
    for number, turn in enumerate(turns, 1):
        if len(turns) > 1:
            lines.append(f"── turn {turn.get('turn', number)}")
        output = turn.get("output")
        if not _missing(output) and str(output):
            lines.append(f"assistant: {output}")
        for call in _as_list(turn.get("tool_calls")):
            lines.append(f"call: {_call_text(call)}")
        results = turn.get("tool_results", turn.get("results"))
        for result in _as_list(results):
            lines.append(f"result: {_result_text(result)}")
        stop = turn.get("stop_reason")
        if not _missing(stop) and stop:
            lines.append(f"stop: {stop}")
    return "\n".join(lines)


def _as_list(value: Any) -> list[Any]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split("; ") if part.strip()]
    if isinstance(value, Iterable) and not isinstance(value, Mapping):
        return list(value)
    return [value]


def _call_text(call: Any) -> str:
    if isinstance(call, Mapping):
        name = call.get("tool_name") or call.get("name") or call.get("function", {}).get("name", "")
        arguments = call.get("arguments", call.get("function", {}).get("arguments", {}))
        return f"{name}({arguments if isinstance(arguments, str) else _json(arguments)})"
    name, arguments = getattr(call, "tool_name", None), getattr(call, "arguments", None)
    return f"{name}({_json(arguments)})" if name is not None else str(call)


def _result_text(result: Any) -> str:
    if isinstance(result, Mapping):
        return str(result.get("content", result))
    return str(getattr(result, "content", result))


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def item_text(row: Mapping[str, Any], side: str) -> str:
    """One side (``"a"`` or ``"b"``) of a compare row as text: its output and tool calls."""
    lines = []
    output = row.get(f"output_{side}")
    if not _missing(output) and str(output):
        lines.append(str(output))
    for call in _as_list(row.get(f"tool_calls_{side}")):
        text = _call_text(call)
        if text not in "\n".join(lines):  # a tool-loop item's output lists its calls already
            lines.append(f"call: {text}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ compare rows
def score_names(frame: pd.DataFrame) -> list[str]:
    """The scores a compare frame carries (``<score>_a`` / ``<score>_b`` pairs)."""
    scores = frame.attrs.get("scores")
    if scores:
        return list(scores)
    reserved = {"output", "tool_calls", "stop_reason", "tokens"}
    return [
        c[:-2] for c in frame.columns if c.endswith("_a") and f"{c[:-2]}_b" in frame.columns and c[:-2] not in reserved
    ]


def change_of(row: Mapping[str, Any]) -> str:
    """``regressed`` / ``improved`` by the scores, else ``changed`` when the outputs differ, else ``same``."""
    change = row.get("change")
    if isinstance(change, str) and change in ("regressed", "improved"):
        return change
    return "same" if bool(row.get("same", True)) else "changed"


def ordered_changes(frame: pd.DataFrame) -> pd.DataFrame:
    """The compare frame with a ``status`` column (regressed, improved, changed, same), regressions first; the
    compare order is kept inside each group."""
    change = frame["change"] if "change" in frame.columns else pd.Series(None, index=frame.index, dtype=object)
    same = frame["same"].fillna(True).astype(bool) if "same" in frame.columns else True
    scored = change.isin(["regressed", "improved"])
    status = change.where(scored, pd.Series("same", index=frame.index).where(same, "changed"))
    out = frame.assign(status=status.astype(object))  # change_of, row by row, vectorized
    rank = out["status"].map(CHANGE_ORDER).fillna(len(CHANGE_ORDER))
    return out.iloc[rank.argsort(kind="stable")]


# ------------------------------------------------------------------------------------------ html parts
def runs_html(
    names: Sequence[str],
    baseline: str,
    runs_table: pd.DataFrame | None,
    settings_diffs: Mapping[str, Mapping[str, tuple[Any, Any]]],
) -> str:
    """The runs (baseline marked) with their rows, items, tags and notes, then per run what settings differ
    from the baseline's."""
    info = {}
    if runs_table is not None and len(runs_table):
        key = "run" if "run" in runs_table.columns else runs_table.columns[0]
        info = {r[key]: r for r in runs_table.to_dict("records")}
    head = "<tr><th>run</th><th>rows</th><th>items</th><th>tags</th><th>note</th></tr>"
    body = []
    for name in names:
        r = info.get(name, {})
        tags = r.get("tags") or []
        tags = tags.split(",") if isinstance(tags, str) else list(tags)
        tag_html = "".join(f'<span class="wb-tag">{esc(t.strip())}</span>' for t in tags if str(t).strip())
        mark = ' <span class="wb-muted">(baseline)</span>' if name == baseline else ""
        body.append(
            f"<tr><td><b>{esc(name)}</b>{mark}</td><td class='num'>{esc(_int(r.get('rows')))}</td>"
            f"<td class='num'>{esc(_int(r.get('items')))}</td><td>{tag_html}</td>"
            f"<td>{esc('' if _missing(r.get('note')) else r.get('note'))}</td></tr>"
        )
    parts = [f"<table class='wb-runs-table'>{head}{''.join(body)}</table>"]
    for name, diff in settings_diffs.items():
        parts.append(settings_html(baseline, name, diff))
    return "".join(parts)


def _int(value: Any) -> str:
    return "" if _missing(value) else str(int(value)) if isinstance(value, (int, float)) else str(value)


def settings_html(a: str, b: str, diff: Mapping[str, tuple[Any, Any]]) -> str:
    """The settings that differ between runs ``a`` and ``b`` (``wb.runs.diff_settings``)."""
    title = f"<h3>settings: {esc(b)} vs {esc(a)}</h3>"
    if not diff:
        return title + "<p class='wb-muted'>no setting differs</p>"
    rows = "".join(
        f"<tr><td>{esc(k)}</td><td class='wb-text'>{esc(_short(v[0]))}</td>"
        f"<td class='wb-text'>{esc(_short(v[1]))}</td></tr>"
        for k, v in diff.items()
    )
    return (
        f"{title}<table class='wb-settings'><tr><th>setting</th><th>{esc(a)}</th><th>{esc(b)}</th></tr>{rows}</table>"
    )


def _short(value: Any, limit: int = 400) -> str:
    text = value if isinstance(value, str) else _json(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


def verdict(row: Mapping[str, Any]) -> str:
    """How a summary row reads: the baseline itself, a difference shown (its interval excludes 0), or
    not shown to differ (the interval covers 0)."""
    if _missing(row.get("diff")):
        return "baseline" if not _missing(row.get("mean")) else ""
    shown = row.get("shown")
    if _missing(shown):
        low, high = row.get("diff_low"), row.get("diff_high")
        shown = not (_missing(low) or _missing(high)) and (low > 0 or high < 0)
    if not shown:
        return NOT_SHOWN
    return "higher" if row["diff"] > 0 else "lower"


def summary_html(frame: pd.DataFrame) -> str:
    """The score summary (``wb.runs.summary``): each run's mean with its 95 % interval, and against the
    baseline the paired difference with its interval, the p-value, the improved/regressed item counts and the
    verdict — "not shown to differ" wherever the interval covers 0."""
    if frame is None or not len(frame):
        return (
            "<p class='wb-muted'>no scores yet: the settings and the changed items need none; "
            "wb.runs.score(name, fn) adds scores, and with them the statistics</p>"
        )
    head = (
        "<tr><th>run</th><th>score</th><th>n</th><th>mean [95 % interval]</th>"
        "<th>difference vs baseline [95 % interval]</th><th>p-value</th><th>improved</th><th>regressed</th>"
        "<th>verdict</th></tr>"
    )
    body = []
    for r in frame.to_dict("records"):
        word = verdict(r)
        css = {"higher": "wb-shown", "lower": "wb-regressed-verdict", NOT_SHOWN: "wb-not-shown"}.get(word, "")
        mean = f"{_number(r.get('mean'))} [{_number(r.get('low'))}, {_number(r.get('high'))}]"
        diff = (
            ""
            if _missing(r.get("diff"))
            else f"{_number(r.get('diff'), 3)} [{_number(r.get('diff_low'))}, {_number(r.get('diff_high'))}]"
        )
        body.append(
            f"<tr class='wb-summary-row'><td>{esc(r.get('run'))}</td><td>{esc(r.get('score'))}</td>"
            f"<td class='num'>{esc(_int(r.get('n')))}</td><td class='num'>{mean}</td>"
            f"<td class='num'>{diff}</td><td class='num'>{_number(r.get('p_value'), 4)}</td>"
            f"<td class='num'>{esc(_int(r.get('improved')))}</td>"
            f"<td class='num'>{esc(_int(r.get('regressed')))}</td>"
            f"<td class='{css}'>{esc(word)}</td></tr>"
        )
    return f"<table class='wb-summary'>{head}{''.join(body)}</table>"


def counts_html(counts: Mapping[str, Any]) -> str:
    order = ("both", "only_a", "only_b", "differ", "improved", "regressed")
    return " · ".join(f"{esc(k.replace('_', ' '))}: <b>{esc(counts[k])}</b>" for k in order if k in counts)


def changes_html(a: str, b: str, frame: pd.DataFrame, limit: int = REPORT_ITEMS) -> str:
    """The items that changed between ``a`` (baseline) and ``b``, regressions first, at most ``limit`` of them,
    each with both outputs side by side and the differences highlighted; the rest are counted."""
    ordered = ordered_changes(frame)
    changed = ordered[ordered["status"] != "same"]
    scores = score_names(frame)
    parts = [f"<p>{counts_html(frame.attrs.get('counts', {}))}</p>"]
    if not len(changed):
        return parts[0] + "<p class='wb-muted'>no item changed</p>"
    for r in changed.head(limit).to_dict("records"):
        marks = " ".join(f"{esc(s)}: {esc(_number(r.get(f'{s}_a')))} → {esc(_number(r.get(f'{s}_b')))}" for s in scores)
        first = r.get("first_diff")
        where = "" if _missing(first) else f" · first differing token: {esc(_int(first))}"
        token = r.get("first_diff_text", r.get("first_diff_token"))
        where += "" if _missing(token) or token is None else f" ({esc(_short(token, 60))})"
        parts.append(
            f"<div class='wb-item'><span class='wb-change-{esc(r['status'])}'>{esc(r['status'])}</span> "
            f"<b>{esc(_short(r.get('item'), 200))}</b> <span class='wb-muted'>{marks}{where}</span>"
            f"{side_by_side_html(a, item_text(r, 'a'), b, item_text(r, 'b'))}</div>"
        )
    rest = len(changed) - min(limit, len(changed))
    if rest:
        parts.append(
            f"<p class='wb-muted'>… and {rest} more changed items (wb.runs.compare({a!r}, {b!r}) lists them all)</p>"
        )
    return "".join(parts)


# ------------------------------------------------------------------------------------------ the report
def report_html(
    names: Sequence[str],
    *,
    baseline: str | None = None,
    store: str | Path | Store | None = None,
    limit: int = REPORT_ITEMS,
    title: str | None = None,
) -> str:
    """The report as one HTML document (what :func:`report` writes)."""
    names = check_names(names)
    baseline = names[0] if baseline is None else baseline
    if baseline not in names:
        names = [baseline, *names]
    others = [n for n in names if n != baseline]
    st = open_store(store)
    table = runs.table(store=st)
    diffs = {n: runs.diff_settings(baseline, n, store=st) for n in others}
    summary = runs.summary(list(names), baseline=baseline, store=st, empty_ok=True)
    title = title or f"What changed: {', '.join(others)} vs {baseline}"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [
        f"<h1>{esc(title)}</h1><p class='wb-muted'>workbench run store report · {esc(stamp)} · "
        f"baseline: <b>{esc(baseline)}</b></p>",
        "<h2>Runs</h2>",
        runs_html(names, baseline, table, diffs),
        "<h2>Scores</h2>",
        summary_html(summary),
        "<p class='wb-muted'>95 % intervals; the difference is paired over the items both runs answered "
        "(McNemar's exact test for pass/fail scores, a paired test for numbers). "
        f"A difference whose interval covers 0 is {NOT_SHOWN}.</p>",
    ]
    for other in others:
        frame = runs.compare(baseline, other, store=st)
        body.append(f"<h2>Changed items: {esc(other)} vs {esc(baseline)}</h2>")
        body.append(changes_html(baseline, other, frame, limit))
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{esc(title)}</title>"
        f"<style>{STYLE}</style></head><body><div class='wb-runs'>{''.join(body)}</div></body></html>\n"
    )


def check_names(names: Any) -> list[str]:
    if isinstance(names, str):
        names = [names]
    names = list(dict.fromkeys(names))
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InputError(f"name the runs to report as a list of run names, e.g. ['bf16', 'int4'], got {names!r}")
    return names


def report(
    names: str | Sequence[str],
    path: str | Path,
    *,
    baseline: str | None = None,
    store: str | Path | Store | None = None,
    limit: int = REPORT_ITEMS,
) -> Path:
    """Write one self-contained HTML file comparing runs ``names`` against ``baseline`` (the first by default):
    the runs with tags and notes, the settings that differ, the score summary with intervals and p-values, and
    the changed items (regressions first, at most ``limit`` per run) with both outputs, differences
    highlighted.  No script, style sheet, font or image is fetched: the file opens offline, attached to a
    paper, a pull request or a message.  Returns the path written."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(
            f"{str(path)!r} is a folder; give the report a file name inside it, e.g. {str(path / 'report.html')!r}"
        )
    if path.suffix.lower() not in (".html", ".htm"):
        raise InputError(f"the report is an HTML file; end its name with .html (got {path.name!r})")
    document = report_html(names, baseline=baseline, store=store, limit=limit)  # before touching the disk
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(document, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise InputError(
            f"cannot write the report to {str(path)!r} ({exc.strerror or exc}); pick a path in a "
            f"folder you can write, e.g. report(..., 'report.html') in the working folder"
        ) from None
    return path
