"""Run BFCL's single-turn categories on an engine, batched, and score every reply with BFCL's own checker.

Each entry gets its own function set: its prompt is rendered row by row (``engine.formatter`` for the model's
official format, or BFCL's Llama handler prompt), and all rows of all categories go through one
``engine.batch_completion`` (the engine runs them in waves of ``max_batch_size``; shared prefixes such as
BFCL's system prompt are computed once).  Replies are parsed by workbench's own tool-call parser; BFCL's
checker only ever sees the parsed calls, never model text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import pandas as pd

from workbench import runs
from workbench.engine import Engine

from ...errors import WorkbenchError
from ...reports import wilson_interval
from .multi_turn import run_multi_turn
from .package import (
    MULTI_TURN_CATEGORIES,
    BFCLError,
    bfcl_messages,
    check_calls,
    check_categories,
    load_entries,
    to_openai_tool,
)

#: The categories run by default: BFCL's non-live Python AST categories and irrelevance.
DEFAULT_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
PROMPTS = ("official", "bfcl")
COLUMNS = ["id", "category", "calls", "valid", "error", "prompt", "reply", "prompt_tokens", "tokens", "cached"]

# BFCL's Llama handler writes each message as header, role, header end, "\n\n", stripped content, end of turn.
_CHAT_TOKENS = {
    "llama4": ("<|header_start|>", "<|header_end|>", "<|eot|>"),
    "llama3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
}


def run(
    engine: Engine,
    categories: Sequence[str] = DEFAULT_CATEGORIES,
    *,
    limit: int | None = None,
    prompt: Literal["official", "bfcl"] = "official",
    max_tokens: int = 512,
    temperature: float = 0.0,
    seed: int | None = None,
    progress: bool | None = None,
    run: str | None = None,
    refresh: bool = False,
) -> pd.DataFrame:
    """Answer BFCL entries with ``engine`` and score them; one row per entry, in BFCL's order per category.

    categories: BFCL category names (see ``SUPPORTED_CATEGORIES``): single-turn ones, and the four multi-turn ones
        (``MULTI_TURN_CATEGORIES``), where every entry is one dialog of the tool loop on BFCL's stateful backends,
        all entries in flight together (see :mod:`.multi_turn`).
    limit: the first ``limit`` entries of each category (None: all of them).
    prompt: ``"official"`` renders each entry in the model's own tool-calling format (what it was trained on);
        ``"bfcl"`` reproduces BFCL's Llama handler prompt (its system prompt, raw function docs, every message
        closed by the end-of-turn token), so accuracies compare with the public leaderboard.
    max_tokens, temperature, seed: sampling of every reply (greedy by default; BFCL runs at temperature 0.001).
    run: remember every reply in the run store under this name (``wb.runs``), so running the categories again —
        more of them, a larger ``limit``, after a crash — computes only the entries not stored (``cached``
        says which came from there); ``refresh=True`` recomputes.

    Columns: ``id``, ``category``, ``calls`` (BFCL's ``[{name: {arg: value}}]``), ``valid`` (BFCL's checker's
    verdict), ``error`` (why not, or None), ``prompt``, ``reply`` (the raw text), ``prompt_tokens``, ``tokens``,
    ``cached`` (the reply came from the run store).  Multi-turn entries' rows have ``id``, ``category``,
    ``valid``, ``error`` (BFCL's error type, e.g. ``multi_turn:instance_state_mismatch``), ``turns``, ``steps``,
    ``calls`` (per turn, per step with calls, the call strings BFCL's checker executed), ``force_terminated``,
    ``cached``, ``prompt``, ``failed_turn``, ``explanation`` (the state that differs attribute by attribute, or
    the expected results missing), ``tokens`` and ``log`` (per turn, per step: reply, calls, results).
    An entry that cannot be rendered (a function BFCL describes that workbench cannot offer) or does not fit
    ``engine.max_seq_len`` is not generated: it counts as wrong, with the reason in ``error``.
    """
    cats = check_categories(categories)
    if prompt not in PROMPTS:
        raise BFCLError(
            f"prompt must be 'official' (the model's own format) or 'bfcl' (BFCL's Llama handler "
            f"prompt), got {prompt!r}"
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise BFCLError(f"limit must be a positive number of entries per category (or None for all), got {limit!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BFCLError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    single = [c for c in cats if c not in MULTI_TURN_CATEGORIES]
    frames = []
    if single:
        frames.append(_run_single(engine, single, limit, prompt, max_tokens, temperature, seed, progress, run, refresh))
    multi = [c for c in cats if c in MULTI_TURN_CATEGORIES]
    if multi:
        frames.append(
            run_multi_turn(
                engine,
                multi,
                limit=limit,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                seed=seed,
                progress=progress,
                run=run,
                refresh=refresh,
            )
        )
    if len(frames) == 1:
        return frames[0]
    out = pd.concat(frames, ignore_index=True)  # the categories in the order asked
    order = {c: i for i, c in enumerate(cats)}
    return out.sort_values("category", key=lambda col: col.map(order), kind="stable").reset_index(drop=True)


def _run_single(
    engine: Engine,
    cats: list[str],
    limit: int | None,
    prompt: str,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    progress: bool | None,
    run: str | None,
    refresh: bool,
) -> pd.DataFrame:
    """The single-turn categories: every entry one row of one ``engine.batch_completion``."""
    rows: list[dict[str, Any]] = []
    work: list[tuple[dict[str, Any], dict[str, Any], list[int]]] = []
    for category in cats:
        for entry in load_entries(category, limit):
            row = {
                "id": entry["id"],
                "category": category,
                "calls": [],
                "valid": False,
                "error": None,
                "prompt": prompt,
                "reply": None,
                "prompt_tokens": 0,
                "tokens": 0,
                "cached": False,
            }
            rows.append(row)
            try:
                ids = encode_entry(engine, entry, prompt)
            except WorkbenchError as exc:
                row["error"] = f"not generated: the entry's prompt cannot be rendered: {exc}"
                continue
            row["prompt_tokens"] = len(ids)
            if len(ids) >= engine.max_seq_len:
                row["error"] = (
                    f"not generated: the prompt has {len(ids)} tokens but max_seq_len is "
                    f"{engine.max_seq_len}; load with a larger max_seq_len"
                )
                continue
            work.append((row, entry, ids))
    if work:
        stored = runs.call_keywords(run, refresh)
        completions = engine.batch_completion(
            [ids for _, _, ids in work],
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            progress=progress,
            **stored,
        )
        for (row, entry, _), completion in zip(work, completions):
            message = engine.formatter.decode_assistant(completion.text, completion.stop_reason)
            calls = [{call.tool_name: dict(call.arguments)} for call in message.tool_calls]
            row.update(reply=completion.text, tokens=len(completion.tokens), calls=calls, cached=completion.cached)
            valid, error = check_calls(entry, row["category"], calls)
            if not valid and message.parse_error and not calls:
                error = f"the reply's tool call could not be parsed: {message.parse_error}"
            row.update(valid=valid, error=error)
        if run is not None:  # each entry's id names its row, its verdict is the row's score
            runs.keep_scores(
                run,
                {row["id"]: {"valid": bool(row["valid"])} for row, _, _ in work},
                items=[(ids, row["id"]) for row, _, ids in work],
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def encode_entry(engine: Engine, entry: dict[str, Any], prompt: str) -> list[int]:
    """The prompt token ids of one BFCL entry under ``prompt`` (``"official"`` or ``"bfcl"``)."""
    messages = entry["question"][0]
    if prompt == "official":
        tools = [to_openai_tool(f) for f in entry["function"]]
        return list(engine.formatter.encode_dialog(messages, tools=tools))
    return encode_bfcl_prompt(engine.tokenizer, bfcl_messages(messages, entry["function"]))


def encode_bfcl_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """BFCL's ``LlamaHandler._format_prompt`` as token ids: BOS, then per message the header tokens around the
    role, ``"\\n\\n"`` and the stripped content, and the end-of-turn token; then an open assistant header.

    Special tokens are placed by id and the text between them is encoded on its own, as a tokenizer reading
    BFCL's prompt string with special tokens enabled does (text in messages never becomes a special token)."""
    family = getattr(tokenizer, "family", "llama3")
    start, end, eot = (tokenizer.special_tokens[t] for t in _CHAT_TOKENS.get(family, _CHAT_TOKENS["llama3"]))
    ids = [tokenizer.bos_id]
    for message in messages:
        ids += [start, *tokenizer.encode(message["role"]), end]
        ids += tokenizer.encode("\n\n" + str(message["content"]).strip()) + [eot]
    return ids + [start, *tokenizer.encode("assistant"), end, *tokenizer.encode("\n\n")]


def summarize(results: pd.DataFrame, by: Sequence[str] | None = None) -> pd.DataFrame:
    """Accuracy per category as BFCL counts it (entries the checker accepts / entries run, every entry
    counted), with ``correct``, ``entries`` and a 95 % Wilson interval (``low``, ``high``); grouped by ``prompt``
    too when the frame holds several.  When multi-turn categories are present, a ``multi_turn_overall`` row per
    group follows them: BFCL's multi-turn overall, the unweighted mean of the multi-turn categories present
    (BFCL's is over all four), its interval the mean of the categories' Wilson bounds."""
    if not isinstance(results, pd.DataFrame) or not {"category", "valid"} <= set(results.columns):
        raise BFCLError("summarize takes the DataFrame returned by bfcl.run (columns category and valid)")
    if by is None:
        by = ["prompt"] if "prompt" in results.columns and results["prompt"].nunique() > 1 else []
    keys = [*by, "category"]
    table = (
        results.assign(valid=results["valid"].astype(bool))
        .groupby(keys, sort=False)["valid"]
        .agg(entries="size", correct="sum")
        .reset_index()
    )
    table["accuracy"] = table["correct"] / table["entries"]
    bounds = [wilson_interval(int(k), int(n)) for k, n in zip(table["correct"], table["entries"])]
    table["low"], table["high"] = [b[0] for b in bounds], [b[1] for b in bounds]
    # rows in the order the results first show each key (the order of the runs and of BFCL's categories)
    orders = {k: {v: i for i, v in enumerate(dict.fromkeys(results[k]))} for k in keys}
    table = table.sort_values(by=keys, key=lambda col: col.map(orders[col.name]), kind="stable")
    table = table[[*keys, "accuracy", "low", "high", "correct", "entries"]].reset_index(drop=True)
    multi = table[table["category"].isin(MULTI_TURN_CATEGORIES)]
    if len(multi):
        overall = [
            _overall(part, dict(zip(by, key if isinstance(key, tuple) else (key,))))
            for key, part in (multi.groupby(list(by), sort=False) if by else [((), multi)])
        ]
        table = pd.concat([table, pd.DataFrame(overall)], ignore_index=True)
    return table


def _overall(part: pd.DataFrame, group: dict[str, Any]) -> dict[str, Any]:
    """BFCL's multi-turn overall of one group: the unweighted mean of its categories' accuracies."""
    return {
        **group,
        "category": "multi_turn_overall",
        "accuracy": float(part["accuracy"].astype(float).mean()),
        "low": float(part["low"].mean()),
        "high": float(part["high"].mean()),
        "correct": int(part["correct"].sum()),
        "entries": int(part["entries"].sum()),
    }


def plot(summary: pd.DataFrame, *, ax: Any = None, path: str | None = None) -> Any:
    """Bars of accuracy per category (one colour per prompt when the summary has a ``prompt`` column), with
    95% Wilson intervals and the entries each bar counts; returns the matplotlib Figure (saved to ``path``
    if given).  A ``Figure``, not pyplot's: returned as a cell's value it displays once."""
    from matplotlib.figure import Figure

    if "valid" in summary.columns:  # the results themselves
        summary = summarize(summary)
    cats = list(dict.fromkeys(summary["category"]))
    groups = list(dict.fromkeys(summary["prompt"])) if "prompt" in summary.columns else [None]
    if ax is None:
        fig = Figure(figsize=(2.8 + 1.1 * len(cats) * max(1, len(groups)) / 1.5, 3.6))
        ax = fig.subplots()
    else:
        fig = ax.figure
    width = 0.8 / len(groups)
    for j, group in enumerate(groups):
        part = summary if group is None else summary[summary["prompt"] == group]
        rows = {
            c: (a, k, n)
            for c, a, k, n in zip(part["category"], part["accuracy"].astype(float), part["correct"], part["entries"])
        }
        values = [rows[c][0] if c in rows else float("nan") for c in cats]
        given = dict(zip(part["category"], zip(part["low"], part["high"]))) if "low" in part.columns else {}
        bounds = [
            given.get(c) or (wilson_interval(rows[c][1], rows[c][2]) if c in rows else (float("nan"),) * 2)
            for c in cats
        ]
        errors = [
            [max(v - lo, 0) for v, (lo, _) in zip(values, bounds)],
            [max(hi - v, 0) for v, (_, hi) in zip(values, bounds)],
        ]
        label = "accuracy" if group is None else f"prompt={group}"
        bars = ax.bar([i + j * width for i in range(len(cats))], values, width, yerr=errors, capsize=3, label=label)
        ax.bar_label(
            bars,
            labels=[f"{v:.2f}\nn={rows[c][2]}" if c in rows else "" for v, c in zip(values, cats)],
            fontsize=8,
            padding=4,
        )
    ax.set_xticks([i + width * (len(groups) - 1) / 2 for i in range(len(cats))], cats, rotation=20, ha="right")
    ax.set_ylim(0, 1.3)  # room for the labels above a full bar
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("BFCL accuracy (95% Wilson interval)")
    ax.set_title("BFCL accuracy per category (BFCL's checkers)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the bars
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig
