"""Run tool-calling cases through an engine, batched, and score every case.

The loop is the tool loop's (:func:`workbench.tools.complete_turn`): each model step is one batch over every
case still running, each case's dialog rendered with its own offered tools, so cases with different tools share
a batch; calls are answered by the case's :class:`workbench.tools.Toolbox` (or with the case's fixed
``tool_results``), and a reply without calls ends the turn (the next question, if the case has one, follows).
Scoring compares the calls of each turn with the expected ones, order-insensitive, and checks that the final
answer restates what the tools returned.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from workbench import runs
from workbench.demo.tools import DEMO_TOOLS
from workbench.engine.interfaces import ChatEngine
from workbench.errors import InputError
from workbench.evals.cases import EvalCase
from workbench.progress import progress_bar
from workbench.reports import rate_text, wilson_interval
from workbench.tools import Dialog, Toolbox, complete_turn
from workbench.types import Message, ToolCall, Transcript


class EvalEngine(ChatEngine, Protocol):
    """An engine :func:`compare` can switch between quantization modes (an Engine, a replica pool)."""

    settings: Any

    def set_quantization(self, mode: str | None, *, progress: bool | None = None) -> None: ...


def _canonical(value: Any) -> Any:
    """Arguments compared as values: 5 == 5.0, dicts by content, lists in order."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else str(value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(v) for v in value)
    return str(value)


def call_key(call: ToolCall | Mapping[str, Any]) -> tuple[str, Any]:
    """A hashable (name, arguments) pair for order-insensitive comparison of calls."""
    if isinstance(call, ToolCall):
        return call.tool_name, _canonical(call.arguments)
    return str(call["tool_name"]), _canonical(call.get("arguments") or {})


def calls_match(made: Sequence[Any], expected: Sequence[Any], *, names_only: bool = False) -> bool:
    """Same calls as multisets (order-insensitive; arguments by value unless ``names_only``)."""
    key = (lambda c: call_key(c)[0]) if names_only else call_key
    return Counter(key(c) for c in made) == Counter(key(c) for c in expected)


# How a case's dialog can end here (a subset of workbench.types.TRANSCRIPT_STOP_REASONS: the harness runs its
# own turns, never with tool_choice="none" calls run, and a cancel raises instead of ending a case).
CASE_STOP_REASONS = ("answered", "max_turns", "prompt_too_long", "out_of_tokens")


@dataclass
class _Run:
    case: EvalCase
    dialog: Dialog
    turn: int = 0
    replies_in_turn: int = 0
    done: bool = False
    turn_calls: list[list[ToolCall]] = field(default_factory=list)
    turn_results: list[list[str]] = field(default_factory=list)
    turn_answers: list[str | None] = field(default_factory=list)
    parse_failures: int = 0
    replies: int = 0
    tokens: int = 0
    stop_reason: str = "answered"  # why the case's dialog ended (the first turn that did not end in an answer)

    def ended(self, reason: str) -> None:
        if self.stop_reason == "answered":
            self.stop_reason = reason


def _start_turn(run: _Run, tool_choice: str) -> None:
    run.dialog.transcript.append(Message(role="user", content=run.case.turns[run.turn].user))
    run.dialog.tool_choice = tool_choice  # the first reply of a turn; the replies after tool results: "auto"
    run.turn_calls.append([])
    run.turn_results.append([])
    run.turn_answers.append(None)
    run.replies_in_turn = 0


def run_cases(
    engine: ChatEngine,
    cases: Sequence[EvalCase],
    *,
    tools: Mapping[str, Callable[..., Any]] | None = None,
    tool_prompt_format: str | None = None,
    tool_choice: str = "auto",
    system_prompt: str | None = None,
    max_replies_per_turn: int = 3,
    max_tokens: int = 96,
    temperature: float = 0.0,
    seed: int = 0,
    progress: bool = False,
    run: str | None = None,
    refresh: bool = False,
) -> pd.DataFrame:
    """Run ``cases`` and return one scored row per case (see :func:`score_columns`).

    ``run="name"``: every model step is remembered in the run store (``wb.runs``), keyed by its prompt, so
    running the cases again — after a crash, or to score them another way — answers each step from there
    instead of the model (the tools run again; ``refresh=True`` recomputes)."""

    stored = runs.call_keywords(run, refresh)
    registry = dict(DEMO_TOOLS if tools is None else tools)
    case_runs = []
    for case in cases:
        unknown = [n for n in case.tools if n not in registry]
        if unknown:
            raise InputError(
                f"case {case.id!r} offers unknown tool(s) {', '.join(unknown)}; "
                "pass tools={name: function} to the harness"
            )
        system = case.system if case.system is not None else system_prompt
        messages = [Message(role="system", content=system)] if system else []
        case_run = _Run(
            case, Dialog(Transcript(messages), Toolbox.create([registry[n] for n in case.tools]), item=case.id)
        )  # the case id names the rows of its turns in a run store
        _start_turn(case_run, tool_choice)
        case_runs.append(case_run)
    sampling = {"max_tokens": max_tokens, "temperature": temperature, "seed": seed, "progress": False, **stored}
    bar = _progress(progress, len(case_runs))
    while True:
        active = [r for r in case_runs if not r.done]
        if not active:
            break
        replies = dict(
            (id(d), reply)
            for d, reply in complete_turn(
                engine, [r.dialog for r in active], tool_prompt_format=tool_prompt_format, sampling=sampling
            )
        )
        for case_run in active:
            reply = replies.get(id(case_run.dialog))
            if reply is None:  # a tool result made the dialog longer than max_seq_len: the case ends here
                case_run.ended("prompt_too_long")
                case_run.done = True
                bar.update(1)
                continue
            message = case_run.dialog.add(reply)
            case_run.replies += 1
            case_run.replies_in_turn += 1
            case_run.tokens += len(reply.tokens)
            case_run.parse_failures += message.parse_error is not None
            if message.tool_calls and case_run.replies_in_turn <= max_replies_per_turn:
                answers = case_run.dialog.answer(message.tool_calls, case_run.case.turns[case_run.turn].tool_results)
                case_run.turn_calls[-1].extend(message.tool_calls)
                case_run.turn_results[-1].extend(str(m.content) for m in answers)
                case_run.dialog.tool_choice = "auto"
                continue
            if message.tool_calls:  # still calling after max_replies_per_turn replies
                case_run.ended("max_turns")
            elif reply.stop_reason == "out_of_tokens":
                case_run.ended("out_of_tokens")
            case_run.turn_answers[-1] = message.content if not message.tool_calls else None
            case_run.turn += 1
            if case_run.turn < len(case_run.case.turns):
                _start_turn(case_run, tool_choice)
            else:
                case_run.done = True
                bar.update(1)
    bar.close()
    scored = [_score(r) for r in case_runs]
    if run is not None:  # each case's scores on its last stored row, for wb.runs.compare / summary
        runs.keep_scores(run, {row["id"]: {k: row[k] for k in STORED_SCORES if row[k] is not None} for row in scored})
    return pd.DataFrame(scored)


# The pass/fail columns of a scored case that a run store keeps as the case's scores.
STORED_SCORES = ("name_match", "exact_match", "arg_names_from_schema", "answer_has_result", "direct_answer")


def _progress(enabled: bool, total: int) -> Any:
    """One bar over the cases (the engine's own per-call bars stay off), which leaves one summary line."""
    return progress_bar(total, desc="evaluating", unit="case", progress=enabled)


def _needles(result: str) -> list[str]:
    """What an answer must contain to restate a tool result: the text, or each field of a JSON object."""
    try:
        value = json.loads(result)
    except ValueError:
        return [result]
    if isinstance(value, dict) and value:
        return [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in value.values()]
    return [result]


def _names_from_schema(calls: Sequence[ToolCall], schemas: Mapping[str, tuple[set[str], set[str]]]) -> bool:
    """Every call names an offered tool and uses only its parameter names, all its required ones included."""
    for call in calls:
        if call.tool_name not in schemas:
            return False
        names, required = schemas[call.tool_name]
        if not set(call.arguments) <= names or not required <= set(call.arguments):
            return False
    return bool(calls)


def _score(run: _Run) -> dict[str, Any]:
    case = run.case
    name_ok, exact_ok, answer_ok, direct_ok, schema_ok = [], [], [], [], []
    schemas = {
        d.tool_name: (set(d.params), {n for n, p in d.params.items() if p.required})
        for d in run.dialog.toolbox.definitions
    }
    for i, turn in enumerate(case.turns):
        made = run.turn_calls[i] if i < len(run.turn_calls) else []
        answer = run.turn_answers[i] if i < len(run.turn_answers) else None
        if turn.expected_calls:
            name_ok.append(calls_match(made, turn.expected_calls, names_only=True))
            exact_ok.append(calls_match(made, turn.expected_calls))
            schema_ok.append(_names_from_schema(made, schemas))
            if turn.answer_contains is not None:
                needles = turn.answer_contains
            else:  # the results the tools gave; no call means there is no result to restate
                results = run.turn_results[i] if i < len(run.turn_results) else []
                needles = [n for r in results for n in _needles(r)] if results else [None]
            answer_ok.append(answer is not None and all(n is not None and n in answer for n in needles))
        else:
            direct_ok.append(not made and answer is not None)
    tool_case = bool(name_ok)
    return {
        "id": case.id,
        "kind": case.kind,
        "tools_offered": len(case.tools),
        "expected_calls": json.dumps([[_show(c) for c in t.expected_calls] for t in case.turns]),
        "calls_made": json.dumps([[_show(c) for c in calls] for calls in run.turn_calls]),
        "name_match": all(name_ok) if tool_case else None,
        "exact_match": all(exact_ok) if tool_case else None,
        "arg_names_from_schema": all(schema_ok) if tool_case else None,
        "answer_has_result": all(answer_ok) if tool_case else None,
        "direct_answer": all(direct_ok) if direct_ok else None,
        "parse_failures": run.parse_failures,
        "turns": len(case.turns),
        "replies": run.replies,
        "tokens": run.tokens,
        "final_answer": run.turn_answers[-1] if run.turn_answers else None,
        "stop_reason": run.stop_reason,
    }


def _show(call: ToolCall | Mapping[str, Any]) -> str:
    name, _ = call_key(call)
    args = call.arguments if isinstance(call, ToolCall) else call.get("arguments") or {}
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


SETTING_KEYS = ("tool_prompt_format", "system_prompt", "tool_choice", "quantization", "temperature")


# rate column -> (the per-case column it averages, the cases it is a rate of); a rate carries the name of the
# per-case score it averages, the name wb.runs stores that score under (run=), so one name reads the same everywhere
RATES: dict[str, tuple[str, str]] = {
    "exact_match": ("exact_match", "tool_cases"),
    "name_match": ("name_match", "tool_cases"),
    "arg_names_from_schema": ("arg_names_from_schema", "tool_cases"),
    "answer_has_result": ("answer_has_result", "tool_cases"),
    "direct_answer": ("direct_answer", "direct_cases"),
    "parse_failure_rate": ("parse_failures", "cases"),
}


def summarize(results: pd.DataFrame, by: Iterable[str] | None = None) -> pd.DataFrame:
    """Accuracy per setting: exact-match calls, name match, argument names from the offered schema, answers
    restating results (every field of a JSON object result), direct answers.

    Every rate comes with the number of cases it counts (``tool_cases``: cases that expect a call;
    ``direct_cases``: cases that expect a direct answer; ``cases``) and its 95% Wilson interval
    (``<rate>_low``, ``<rate>_high``): on a few dozen cases one case moves a rate by several points, and a
    reader needs to see that.  Settings keep the order in which they first appear (``compare``'s order, so
    the baseline given first stays first).
    """
    by = [c for c in (by if by is not None else SETTING_KEYS) if c in results.columns]

    def rates(df: pd.DataFrame) -> pd.Series:
        tool = df[df["exact_match"].notna()]
        direct = df[df["direct_answer"].notna()]
        groups = {"tool_cases": tool, "direct_cases": direct, "cases": df}
        row: dict[str, Any] = {"cases": len(df), "tool_cases": len(tool), "direct_cases": len(direct)}
        for rate, (column, over) in RATES.items():
            frame = groups[over]
            if column not in frame or not len(frame):
                hits, n = 0.0, 0  # no cases: the rate and its interval are nan
            elif column == "parse_failures":
                hits, n = float((frame[column] > 0).sum()), len(frame)
            else:
                hits, n = float(frame[column].astype(float).sum()), len(frame)
            row[rate] = hits / n if n else float("nan")
            row[f"{rate}_low"], row[f"{rate}_high"] = wilson_interval(hits, n)
        row["tokens_per_case"] = float(df["tokens"].mean())
        if "stop_reason" in df:
            row.update({f"ended_{reason}": int((df["stop_reason"] == reason).sum()) for reason in CASE_STOP_REASONS})
        return pd.Series(row)

    if not by:
        return rates(results).to_frame().T
    return results.groupby(by, dropna=False, sort=False).apply(rates, include_groups=False).reset_index()


def setting_labels(summary: pd.DataFrame) -> list[str]:
    """One label per summary row from its setting columns (``"quantization=int4_mixed"``; settings a row
    does not set are left out, and a row that sets none is ``"baseline"``)."""
    keys = [k for k in SETTING_KEYS if k in summary.columns]
    labels = []
    for _, row in summary[keys].iterrows():
        parts = [f"{k}={v}" for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))]
        labels.append(", ".join(parts) or "baseline")
    return labels


def rate_table(
    summary: pd.DataFrame,
    *,
    by: str | None = None,
    metrics: Sequence[str] = ("exact_match", "name_match", "answer_has_result", "direct_answer"),
) -> pd.DataFrame:
    """The summary's rates as text a reader can weigh: ``"0.27 [0.11, 0.52] n=15"`` (rate, 95% Wilson
    interval, cases), one row per setting, labelled by the column ``by`` (default: :func:`setting_labels`)."""
    frame = summary.set_index(by) if by else summary.set_axis(setting_labels(summary), axis=0)
    out = pd.DataFrame(index=frame.index)
    for metric in metrics:
        n = frame[RATES[metric][1]].astype(int)
        out[metric] = [rate_text(rate * k, k) for rate, k in zip(frame[metric].astype(float), n)]
    return out


def compare(
    engine: EvalEngine, cases: Sequence[EvalCase], settings: Sequence[Mapping[str, Any]], **kwargs: Any
) -> pd.DataFrame:
    """Run ``cases`` under each setting (keys of :data:`SETTING_KEYS`; ``system_prompt`` may be a
    ``(label, text)`` pair) and return every scored row with the setting's columns.  A
    ``quantization`` setting re-loads the engine in that mode; the original mode is restored after."""
    frames = []
    switches = any("quantization" in s for s in settings)
    original = engine.settings.quantization if switches else None
    try:
        for setting in settings:
            unknown = set(setting) - set(SETTING_KEYS)
            if unknown:
                raise InputError(f"unknown setting(s) {', '.join(sorted(unknown))}; use {', '.join(SETTING_KEYS)}")
            run_kwargs = dict(kwargs)
            label = {}
            for key, value in setting.items():
                if key == "quantization":
                    engine.set_quantization(value)
                    label[key] = value or "none"
                elif key == "system_prompt" and isinstance(value, tuple):
                    label[key], run_kwargs[key] = value
                else:
                    run_kwargs[key] = value
                    label[key] = value if value is not None else "default"
            frame = run_cases(engine, cases, **run_kwargs)
            for key, value in label.items():
                frame.insert(0, key, value)
            frames.append(frame)
    finally:
        if switches and engine.settings.quantization != original:
            engine.set_quantization(original)
    return pd.concat(frames, ignore_index=True)


def plot_summary(
    summary: pd.DataFrame,
    *,
    by: str | None = None,
    metrics: Sequence[str] = ("exact_match", "answer_has_result", "direct_answer"),
    ax: Any = None,
    path: str | None = None,
) -> Any:
    """Grouped bars of accuracy per setting with their 95% Wilson intervals; returns the matplotlib Figure
    (saved to ``path`` if given).  A ``Figure``, not pyplot's: returned as a cell's value it displays once."""
    from matplotlib.figure import Figure

    if by is None and any(c in summary.columns for c in SETTING_KEYS):
        labels = setting_labels(summary)
    else:
        labels = summary[by].astype(str).tolist() if by else ["all"]
    if ax is None:
        fig = Figure(figsize=(2.4 + 1.4 * len(labels) * len(metrics) / 2, 3.6))
        ax = fig.subplots()
    else:
        fig = ax.figure
    width = 0.8 / len(metrics)
    for j, metric in enumerate(metrics):
        values = summary[metric].astype(float)
        xs = [i + j * width for i in range(len(labels))]
        errors = None
        if f"{metric}_low" in summary:
            low, high = summary[f"{metric}_low"].astype(float), summary[f"{metric}_high"].astype(float)
            errors = [(values - low).clip(lower=0).tolist(), (high - values).clip(lower=0).tolist()]
        counts = (
            summary[RATES[metric][1]].astype(int).tolist() if metric in RATES and RATES[metric][1] in summary else None
        )
        label = metric.replace("_", " ") + (f" (n={counts[0]})" if counts and len(set(counts)) == 1 else "")
        bars = ax.bar(xs, values.tolist(), width, yerr=errors, capsize=3, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=8, padding=5)  # above the interval's cap, clear of it
    ax.set_xticks([i + width * (len(metrics) - 1) / 2 for i in range(len(labels))], labels, rotation=15, ha="right")
    ax.set_ylim(0, 1.25)  # room for the labels above a full bar
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("rate (95% Wilson interval)")
    ax.set_xlabel(by or "setting")
    ax.set_title("tool calling per setting")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the bars
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig
