"""A run's rows read fast, as flat records: what scoring, comparing, summarizing and ``rows()`` need (item, turn,
the output's text, tokens, tool calls and stop reason, scores), taken straight from the stored JSON without
rebuilding result objects — 10,000 rows in a few tens of milliseconds, where decoding every result exactly
(:func:`workbench.runs.codec.loads`) takes more than half a second.

The fields follow :func:`workbench.runs.browse.output_fields` (the exact decoder's view): ``output`` the text
(a chat reply's content, a completion's text, a transcript's last message, a scored span's log-probability),
``tool_calls`` as ``name({"arg": ...}); ...``, ``n_tool_calls``, ``stop_reason``, ``generated_tokens``, and
``tokens`` (the generated ids).
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from workbench.runs.codec import TAG
from workbench.runs.database import Database

# The columns of wb.runs.rows() in order (scores follow, one column each), and the record fields that are
# neither columns nor scores: score names must be none of these (workbench.runs.scores).
FRAME_COLUMNS = [
    "run",
    "item",
    "turn",
    "kind",
    "prompt",
    "output",
    "stop_reason",
    "generated_tokens",
    "tool_calls",
    "n_tool_calls",
    "prompt_tokens",
    "seed",
    "seed_drawn",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "computed",
    "stored_at",
    "seconds",
    "model",
    "checkpoint_identity",
    "checkpoint_path",
    "quantization",
    "dtype",
    "model_parallel_size",
    "device",
    "workbench_version",
    "torch_version",
    "numerics_version",
    "host",
    "git_commit",
    "key",
    "match",
]
NOT_SCORES = {"tokens", "row_id", "request", "prompt_ids", "sampling", "timings", "provenance", "result"}

# what a fast read selects (one query per page; the output and request stay JSON text until parsed here)
_SELECT = (
    "SELECT r.id, r.item, r.turn, r.kind, r.output, r.request, r.sampling, r.seed_drawn, r.timings, "
    "r.computed, r.created_at, r.session_id, r.key, r.match, length(r.prompt_ids), substr(r.prompt_ids, 1, 1) "
    "FROM rows r WHERE r.run_id = ? AND r.id > ? ORDER BY r.id LIMIT ?"
)
PAGE_ROWS = 5000


def _plain_value(value: Any) -> Any:
    """A tagged codec value as something JSON can show (tuples as lists, other tags by their repr)."""
    if isinstance(value, Mapping):
        tag = value.get(TAG)
        if tag == "tuple":
            return [_plain_value(v) for v in value["items"]]
        if tag == "dict":
            return {str(_plain_value(k)): _plain_value(v) for k, v in value["items"]}
        if tag is not None:
            return value.get("repr", f"<{tag}>")
        return {k: _plain_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_value(v) for v in value]
    return value


def calls_of(message: Mapping[str, Any], tagged: bool = True) -> list[tuple[str, Any]]:
    """An encoded message's tool calls as ``(name, arguments)`` (``tagged=False``: the output holds no codec
    tag, so arguments are plain JSON already)."""
    calls = message.get("tool_calls") or []
    if not tagged:
        return [(c.get("tool_name"), c.get("arguments")) for c in calls]
    return [(c.get("tool_name"), _plain_value(c.get("arguments"))) for c in calls]


def calls_text(calls: list[tuple[str, Any]]) -> str:
    return "; ".join(f"{name}({json.dumps(args, ensure_ascii=False, default=str)})" for name, args in calls)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return str(_plain_value(content))


def output_outline(data: Mapping[str, Any], tagged: bool = True) -> dict[str, Any]:
    """The browsable fields of one encoded result (see the module docstring); ``tagged=False`` when its JSON
    holds no codec tag (the common case: a faster path)."""
    kind = data.get("type")
    calls: list[tuple[str, Any]] = []
    tokens: list[int] = []
    if kind == "Completion":
        text, stop, tokens = data.get("text") or "", data.get("stop_reason"), data.get("tokens") or []
    elif kind == "ChatCompletion":
        message = data.get("message") or {}
        text, stop, tokens = _text(message.get("content")), data.get("stop_reason"), data.get("tokens") or []
        calls = calls_of(message, tagged)
    elif kind == "Transcript":
        messages = [m for m in data.get("messages") or [] if isinstance(m, Mapping)]
        text = _text(messages[-1].get("content")) if messages else ""
        calls = [c for m in messages if m.get("role") == "assistant" for c in calls_of(m)]
        return {
            "output": text,
            "stop_reason": data.get("stop_reason"),
            "tokens": [],
            "generated_tokens": data.get("generated_tokens") or 0,
            "tool_calls": calls_text(calls),
            "n_tool_calls": len(calls),
            "calls": calls,
        }
    elif kind == "ScoredRow":
        values = data.get("logprobs") or []
        total = sum(v if isinstance(v, (int, float)) else float(v.get("repr", "nan")) for v in values)
        logprob = float(total) if not math.isnan(total) else total
        return {
            "output": f"logprob {logprob:.4f}",
            "stop_reason": None,
            "tokens": [],
            "generated_tokens": len(values),
            "tool_calls": "",
            "n_tool_calls": 0,
            "calls": [],
        }
    else:
        text, stop = str(_plain_value(data)), None
    return {
        "output": text,
        "stop_reason": stop,
        "tokens": tokens,
        "generated_tokens": len(tokens),
        "tool_calls": calls_text(calls),
        "n_tool_calls": len(calls),
        "calls": calls,
    }


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while tens of thousands of small dicts are made (none of them
    cyclic): without it, collections that walk every live record take a third of a 10,000-row read.  The
    collector's state is restored after, exceptions included."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# The last few runs read, by store file and run: (signature, records without scores).  A run's rows are read
# once while they do not change, so score, compare and summary of the same runs read each run once.
_CACHE: dict[tuple[str, int], tuple[tuple, list[dict[str, Any]]]] = {}
CACHED_RUNS = 4


def _signature(store: Database, run_id: int) -> tuple:
    """What changes when any row of the run is added, replaced or renamed (one aggregate query)."""
    return tuple(
        store.query(
            "SELECT count(*), max(id), max(created_at), total(length(item)), total(turn) FROM rows WHERE run_id = ?",
            (run_id,),
        )[0]
    )


def _read(store: Database, run_id: int) -> list[dict[str, Any]]:
    records = []
    last = -1
    while True:
        page = store.query(_SELECT, (run_id, last, PAGE_ROWS))
        if not page:
            return records
        for (
            row_id,
            item,
            turn,
            kind,
            output,
            request,
            sampling,
            seed_drawn,
            timings,
            computed,
            created,
            session,
            key,
            match,
            id_bytes,
            first_byte,
        ) in page:
            records.append(
                {
                    "row_id": row_id,
                    "item": item,
                    "turn": turn,
                    "kind": kind,
                    **output_outline(json.loads(output), TAG in output),
                    "request": json.loads(request),
                    "sampling": json.loads(sampling),
                    "seed_drawn": bool(seed_drawn),
                    "timings": json.loads(timings),
                    "computed": bool(computed),
                    "created_at": created,
                    "session": session,
                    "key": key,
                    "match": match,
                    "prompt_tokens": (id_bytes - 1) // 8 if first_byte == b"q" and id_bytes % 8 == 1 else id_bytes // 4,
                }
            )
        last = page[-1][0]


@dataclass(frozen=True)
class Outline:
    """A run's rows as flat records (read-only: they may be shared with later reads) and its scores by row id."""

    records: list[dict[str, Any]]
    scores: dict[int, dict[str, Any]]

    def scores_of(self, record: Mapping[str, Any]) -> dict[str, Any]:
        return self.scores.get(record["row_id"], {})


def outline(store: Database, name: str) -> Outline:
    """Every row of run ``name`` in stored order as a flat record — ``row_id, item, turn, kind, output,
    tool_calls, n_tool_calls, calls, stop_reason, tokens, generated_tokens, request`` (parsed), ``sampling``,
    ``seed_drawn``, ``timings``, ``computed``, ``created_at``, ``session``, ``key``, ``match``,
    ``prompt_tokens`` — and the run's scores.  The records of an unchanged run come from a small in-process
    cache (so score, compare and summary of the same runs read each once).  Unknown run: InputError listing
    the runs."""
    run_id = store.run_id(name)
    slot = (str(store.path.absolute()), run_id)
    signature = _signature(store, run_id)
    held = _CACHE.get(slot)
    if held is None or held[0] != signature:
        with gc_paused():
            held = _CACHE[slot] = (signature, _read(store, run_id))
        while len(_CACHE) > CACHED_RUNS:
            del _CACHE[next(iter(_CACHE))]
    return Outline(held[1], store.scores_of(run_id))


def read_outline(store: Database, name: str) -> Iterator[dict[str, Any]]:
    """:func:`outline`'s records, each a fresh dict with its ``scores`` (name -> value)."""
    found = outline(store, name)
    for record in found.records:
        yield {**record, "scores": found.scores_of(record)}
