"""Browsing the run store as DataFrames: the runs, one run's rows with where each came from, two runs row by
row, and exports (Parquet, JSONL) that keep every field.

Columns say what they hold: ``checkpoint_identity`` (the content hash the cache keys carry),
``quantization``, ``workbench_version``, ``seed`` (``seed_drawn``: drawn by workbench for an unseeded sampled
row), ``computed`` (False: taken from another run's identical key).  Tool calls are flattened into text
(``tool_calls``: ``name({"arg": ...}); ...``) with their count (``n_tool_calls``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.errors import InputError
from workbench.reports import human_bytes
from workbench.runs.codec import encode
from workbench.runs.outline import FRAME_COLUMNS, NOT_SCORES, gc_paused, read_outline
from workbench.runs.store import Store, StoredRow, open_store
from workbench.types import ChatCompletion, Completion, Message, ScoredRow, Transcript

EXPORT_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_PROMPT_CHARS = 200


def _when(stamp: float | None) -> Any:
    return pd.NaT if stamp is None else pd.Timestamp(datetime.fromtimestamp(stamp, tz=timezone.utc))


# ------------------------------------------------------------------------------------------------ table
def table(*, store: str | Path | Store | None = None) -> pd.DataFrame:
    """One row per run (first column ``run``): rows stored, items, how many rows were computed by the run
    itself, score names, tags, note, sessions, times (created, last row, last written), the bytes its rows
    hold, and the provenance of its latest session (model, checkpoint identity, load settings, versions)."""
    records = []
    for summary in open_store(store).summaries():
        prov = summary["provenance"]
        load = prov.get("load", {})
        records.append(
            {
                "run": summary["name"],
                "rows": summary["rows"],
                "items": summary["items"],
                "computed": summary["computed"],
                "scores": summary["scores"],
                "tags": summary["tags"],
                "note": summary["note"],
                "sessions": summary["sessions"],
                "created_at": _when(summary["created_at"]),
                "last_row_at": _when(summary["last_row_at"]),
                "updated_at": _when(summary["updated_at"]),
                "size": human_bytes(summary["bytes"]),
                "bytes": summary["bytes"],
                "model": prov.get("model"),
                "checkpoint_identity": prov.get("checkpoint_identity"),
                "checkpoint_path": prov.get("checkpoint_path"),
                "quantization": load.get("quantization"),
                "dtype": load.get("dtype"),
                "model_parallel_size": load.get("model_parallel_size"),
                "device": prov.get("device"),
                "workbench_version": prov.get("workbench_version"),
                "host": prov.get("host"),
                "git_commit": prov.get("git_commit"),
            }
        )
    columns = [
        "run",
        "rows",
        "items",
        "computed",
        "scores",
        "tags",
        "note",
        "sessions",
        "created_at",
        "last_row_at",
        "updated_at",
        "size",
        "bytes",
        "model",
        "checkpoint_identity",
        "checkpoint_path",
        "quantization",
        "dtype",
        "model_parallel_size",
        "device",
        "workbench_version",
        "host",
        "git_commit",
    ]
    return pd.DataFrame.from_records(records, columns=columns)


# ------------------------------------------------------------------------------------------------ rows
def _calls_text(calls: Iterable[Any]) -> list[str]:
    return [f"{c.tool_name}({json.dumps(c.arguments, ensure_ascii=False, default=str)})" for c in calls]


def _message_text(message: Any) -> str:
    if isinstance(message, Message):
        return message.content if isinstance(message.content, str) else str(message.content)
    if isinstance(message, dict):
        return str(message.get("content", ""))
    return str(message)


def output_fields(output: Any) -> dict[str, Any]:
    """The browsable fields of one stored result: text, stop reason, token counts, flattened tool calls."""
    calls: list[Any] = []
    if isinstance(output, Completion):
        text, stop, tokens = output.text, output.stop_reason, output.tokens
    elif isinstance(output, ChatCompletion):
        text, stop, tokens, calls = output.text, output.stop_reason, output.tokens, output.message.tool_calls
    elif isinstance(output, Transcript):
        replies = [m for m in output if isinstance(m, Message) and m.role == "assistant"]
        text = _message_text(output[-1]) if len(output) else ""
        stop, tokens = output.stop_reason, []
        calls = [c for m in replies for c in m.tool_calls]
        return {
            "output": text,
            "stop_reason": stop,
            "generated_tokens": output.generated_tokens,
            "tool_calls": "; ".join(_calls_text(calls)),
            "n_tool_calls": len(calls),
        }
    elif isinstance(output, ScoredRow):
        return {
            "output": f"logprob {output.logprob:.4f}",
            "stop_reason": None,
            "generated_tokens": len(output.logprobs),
            "tool_calls": "",
            "n_tool_calls": 0,
        }
    else:
        text, stop, tokens = str(output), None, []
    return {
        "output": text,
        "stop_reason": stop,
        "generated_tokens": len(tokens),
        "tool_calls": "; ".join(_calls_text(calls)),
        "n_tool_calls": len(calls),
    }


def prompt_text(request: Any) -> str:
    """A short text of the request as given: the prompt, or the last user message of a dialog."""
    if isinstance(request, dict):
        if isinstance(request.get("prompt"), str):
            return request["prompt"][:_PROMPT_CHARS]
        messages = request.get("messages")
        if isinstance(messages, list) and messages:
            users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"] or messages
            last = users[-1]
            content = last.get("content", "") if isinstance(last, dict) else last
            return (content if isinstance(content, str) else json.dumps(content, default=str))[:_PROMPT_CHARS]
        if "prompt" in request:
            return json.dumps(request["prompt"], default=str)[:_PROMPT_CHARS]
    return json.dumps(request, default=str)[:_PROMPT_CHARS]


def row_record(row: StoredRow) -> dict[str, Any]:
    """One stored row as a flat dict of named columns (what :func:`rows` shows)."""
    prov = row.provenance
    timings = row.timings
    return {
        "run": row.run,
        "item": row.item,
        "turn": row.turn,
        "kind": row.kind,
        "prompt": prompt_text(row.request),
        **output_fields(row.output),
        "prompt_tokens": len(row.prompt_ids),
        "seed": row.seed,
        "seed_drawn": row.seed_drawn,
        "temperature": row.sampling.get("temperature"),
        "top_p": row.sampling.get("top_p"),
        "top_k": row.sampling.get("top_k"),
        "max_tokens": row.sampling.get("max_tokens"),
        "computed": row.computed,
        "stored_at": _when(row.created_at),
        "seconds": timings.get("seconds"),
        **provenance_columns(prov),
        "key": row.key,
        "match": row.match,
        **row.scores,
    }


def provenance_columns(prov: dict[str, Any]) -> dict[str, Any]:
    """The provenance columns of a row written by a session with provenance ``prov`` (its load settings inside)."""
    load = prov.get("load", {})
    return {
        "model": prov.get("model"),
        "checkpoint_identity": prov.get("checkpoint_identity"),
        "checkpoint_path": prov.get("checkpoint_path"),
        "quantization": load.get("quantization"),
        "dtype": load.get("dtype"),
        "model_parallel_size": load.get("model_parallel_size"),
        "device": prov.get("device"),
        "workbench_version": prov.get("workbench_version"),
        "torch_version": prov.get("torch_version"),
        "numerics_version": prov.get("numerics_version"),
        "host": prov.get("host"),
        "git_commit": prov.get("git_commit"),
    }


@gc_paused()  # tens of thousands of small records: see workbench.runs.outline.gc_paused
def rows(name: str, *, store: str | Path | Store | None = None) -> pd.DataFrame:
    """One row per stored result of run ``name``, in the order they were stored: its ``item`` and ``turn``,
    the prompt, the output (text, stop reason, tool calls flattened), sampling, provenance columns, and one
    column per score (``attrs["scores"]`` lists their names; a row without that score holds None).  Read
    from the stored JSON directly (:mod:`workbench.runs.outline`): 10,000 rows take a fraction of a second."""
    st = open_store(store)
    sessions = st.sessions(name)
    records = []
    for r in read_outline(st, name):
        prov = sessions.get(r["session"], {})
        sampling = r["sampling"]
        records.append(
            {
                "run": name,
                "item": r["item"],
                "turn": r["turn"],
                "kind": r["kind"],
                "prompt": prompt_text(r["request"]),
                "output": r["output"],
                "stop_reason": r["stop_reason"],
                "generated_tokens": r["generated_tokens"],
                "tool_calls": r["tool_calls"],
                "n_tool_calls": r["n_tool_calls"],
                "prompt_tokens": r["prompt_tokens"],
                "seed": sampling.get("seed"),
                "seed_drawn": r["seed_drawn"],
                "temperature": sampling.get("temperature"),
                "top_p": sampling.get("top_p"),
                "top_k": sampling.get("top_k"),
                "max_tokens": sampling.get("max_tokens"),
                "computed": r["computed"],
                "stored_at": _when(r["created_at"]),
                "seconds": r["timings"].get("seconds"),
                **provenance_columns(prov),
                "key": r["key"],
                "match": r["match"],
                "tokens": r["tokens"],
                "row_id": r["row_id"],
                **r["scores"],
            }
        )
    return frame_of(name, records)


_INT_COLUMNS = ("turn", "top_k", "max_tokens", "model_parallel_size", "numerics_version")


def frame_of(name: str, records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The rows DataFrame of ``records`` (:func:`row_record` dicts).  Seeds span 64 bits, which a float column
    would round, so ``seed`` holds Python ints (None where absent); counts are nullable integers."""
    records = list(records)
    extra = list(dict.fromkeys(k for r in records for k in r if k not in FRAME_COLUMNS))
    frame = pd.DataFrame.from_records(records, columns=[*FRAME_COLUMNS, *extra])
    scores = [k for k in extra if k not in NOT_SCORES]
    for column in scores:  # a row without the score holds None (pass/fail columns stay True/False, not 1.0/0.0)
        frame[column] = pd.Series([r.get(column) for r in records], index=frame.index, dtype=object)
    frame["seed"] = pd.Series([r["seed"] for r in records], index=frame.index, dtype=object)
    for column in _INT_COLUMNS:
        frame[column] = frame[column].astype("Int64")
    frame.attrs["run"] = name
    frame.attrs["scores"] = scores
    return frame


# ------------------------------------------------------------------------------------------------ compare
def _latest_by_match(store: Store, name: str) -> dict[str, StoredRow]:
    found: dict[str, StoredRow] = {}
    for row in store.rows(name):  # stored order: a later row of the same request replaces an earlier one
        found[row.match] = row
    return found


def _comparable(output: Any) -> Any:
    """What two outputs must share to be the same answer: tokens, text, stop reason and tool calls."""
    if isinstance(output, Transcript):
        return [encode(m) if isinstance(m, Message) else m for m in output], output.stop_reason
    data = encode(output)
    if isinstance(data, dict):
        data.pop("cached", None)
        data.pop("prompt_tokens", None)
    return data


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_requests(
    a: str, b: str, *, store: str | Path | Store | None = None, differing_only: bool = True
) -> pd.DataFrame:
    """The requests both runs answered (matched by the request itself: prompt ids, images, sampling, kind —
    not the checkpoint or load settings), one row each where the outputs differ (all of them with
    ``differing_only=False``): both outputs, stop reasons, tool calls, and the first differing token.
    ``frame.attrs`` holds the counts (``both``, ``differ``, ``only_a``, ``only_b``)."""
    st = open_store(store)
    left, right = _latest_by_match(st, a), _latest_by_match(st, b)
    both = [m for m in left if m in right]
    records = []
    n_differ = 0
    for match in both:
        x, y = left[match], right[match]
        same = _comparable(x.output) == _comparable(y.output)
        n_differ += not same
        if same and differing_only:
            continue
        fx, fy = output_fields(x.output), output_fields(y.output)
        tokens_x = getattr(x.output, "tokens", [])
        tokens_y = getattr(y.output, "tokens", [])
        records.append(
            {
                "prompt": prompt_text(x.request),
                "same": same,
                "a_output": fx["output"],
                "b_output": fy["output"],
                "a_stop_reason": fx["stop_reason"],
                "b_stop_reason": fy["stop_reason"],
                "a_tool_calls": fx["tool_calls"],
                "b_tool_calls": fy["tool_calls"],
                "first_differing_token": _first_difference(list(tokens_x), list(tokens_y)),
                "a_checkpoint_identity": x.provenance.get("checkpoint_identity"),
                "b_checkpoint_identity": y.provenance.get("checkpoint_identity"),
                "a_quantization": x.provenance.get("load", {}).get("quantization"),
                "b_quantization": y.provenance.get("load", {}).get("quantization"),
                "seed": x.seed,
                "match": match,
            }
        )
    columns = [
        "prompt",
        "same",
        "a_output",
        "b_output",
        "a_stop_reason",
        "b_stop_reason",
        "a_tool_calls",
        "b_tool_calls",
        "first_differing_token",
        "a_checkpoint_identity",
        "b_checkpoint_identity",
        "a_quantization",
        "b_quantization",
        "seed",
        "match",
    ]
    frame = pd.DataFrame.from_records(records, columns=columns)
    frame.attrs.update(
        {
            "a": a,
            "b": b,
            "both": len(both),
            "differ": n_differ,
            "only_a": sum(m not in right for m in left),
            "only_b": sum(m not in left for m in right),
        }
    )
    return frame


# ------------------------------------------------------------------------------------------------ export
def export_records(name: str, store: Store) -> Iterable[dict[str, Any]]:
    """Every row of run ``name`` with all its fields: the browsable columns plus the request, prompt ids,
    sampling, timings, provenance and the exact output (``workbench.runs.decode`` rebuilds the result)."""
    for row in store.rows(name):
        yield {
            **row_record(row),
            "request": row.request,
            "prompt_ids": row.prompt_ids,
            "sampling": row.sampling,
            "timings": row.timings,
            "provenance": row.provenance,
            "result": encode(row.output),
        }


def export(name: str, path: str | Path, *, store: str | Path | Store | None = None) -> Path:
    """Write run ``name`` to ``path``: Parquet (``.parquet``) or JSON Lines (``.jsonl``) by the suffix.  Nested
    fields (request, sampling, timings, provenance, result) are JSON text in Parquet and objects in JSONL."""
    path = Path(path)
    kind = EXPORT_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise InputError(
            f"cannot tell the export format from {path.name!r}; end the file name with {', '.join(EXPORT_SUFFIXES)}"
        )
    st = open_store(store)
    records = export_records(name, st)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for record in records:
                record = {k: (v.isoformat() if isinstance(v, pd.Timestamp) else v) for k, v in record.items()}
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        tmp.replace(path)
        return path
    nested = ("request", "sampling", "timings", "provenance", "result")
    frame = frame_of(
        name,
        (
            {k: (json.dumps(v, ensure_ascii=False, default=str) if k in nested else v) for k, v in r.items()}
            for r in records
        ),
    )
    if not all(s is None or -(2**63) <= s < 2**63 for s in frame["seed"]):
        frame["seed"] = [None if s is None else str(s) for s in frame["seed"]]  # a 64-bit unsigned seed: as text
    try:
        frame.to_parquet(path, index=False)
    except ImportError as exc:
        raise InputError(f"Parquet export needs pyarrow ({exc}); pip install pyarrow, or export to .jsonl") from None
    return path
