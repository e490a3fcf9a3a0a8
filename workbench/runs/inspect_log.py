"""A run as an Inspect eval log, written through inspect_ai's public log API (``inspect_ai.log``), so
``inspect view`` browses its transcripts: one sample per stored row (its id the row's item, with the turn when
the item has several rows; its scores as Inspect scores), its input (the prompt or the dialog as
given), the messages (dialog plus reply, or the whole tool-loop transcript with its calls and results), the
model output with its stop reason and token counts, and the row's key, seed and sampling as metadata.

inspect_ai is an optional dependency (the ``inspect`` extra): imported here only, and this module only loads
when :func:`to_inspect` is first used.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from workbench.errors import InputError
from workbench.runs.browse import output_fields, prompt_text
from workbench.runs.store import Store, StoredRow, open_store
from workbench.types import ChatCompletion, Completion, Message, ToolCall, Transcript

_STOP = {"end_of_turn": "stop", "end_of_message": "stop", "out_of_tokens": "max_tokens", "cancelled": "unknown"}
LOG_SUFFIXES = (".eval", ".json")


def _inspect() -> Any:
    try:
        import inspect_ai.log as log
        import inspect_ai.model as model
        import inspect_ai.scorer as scorer
        import inspect_ai.tool as tool
    except ImportError as exc:
        raise InputError(f"to_inspect needs inspect_ai ({exc}); pip install 'workbench[inspect]'") from None
    return log, model, tool, scorer


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for item in content:
            if isinstance(item, str):
                parts.append(item)
            elif isinstance(item, dict) and item.get("type") == "text":
                parts.append(str(item.get("text", "")))
            else:
                parts.append("[image]")
        return "".join(parts)
    return "" if content is None else json.dumps(content, default=str)


def _calls(calls: list[Any], tool: Any) -> list[Any]:
    out = []
    for i, call in enumerate(calls):
        if isinstance(call, ToolCall):
            name, args, call_id = call.tool_name, call.arguments, call.call_id
        else:
            name, args, call_id = call.get("tool_name", ""), call.get("arguments", {}), call.get("call_id", "")
        out.append(
            tool.ToolCall(
                id=call_id or f"call_{i}",
                function=str(name),
                arguments=args if isinstance(args, dict) else {"value": args},
            )
        )
    return out


def _message(message: Any, model: Any, tool: Any) -> Any:
    """A workbench message (a Message, or the plain dict a request stores) as Inspect's ChatMessage."""
    if isinstance(message, Message):
        role, content, calls, call_id = message.role, message.content, message.tool_calls, message.call_id
    elif isinstance(message, dict):
        role, content = message.get("role"), message.get("content", "")
        calls, call_id = message.get("tool_calls") or [], message.get("call_id") or message.get("tool_call_id", "")
    else:
        role, content, calls, call_id = "user", str(message), [], ""
    text = _text(content)
    if role == "system":
        return model.ChatMessageSystem(content=text)
    if role == "assistant":
        return model.ChatMessageAssistant(content=text, tool_calls=_calls(calls, tool) or None)
    if role in ("tool", "ipython"):
        return model.ChatMessageTool(content=text, tool_call_id=call_id or None)
    return model.ChatMessageUser(content=text)


def _sample(
    index: int | str, row: StoredRow, model_name: str, log: Any, model: Any, tool: Any, scorer: Any = None
) -> Any:
    request = row.request if isinstance(row.request, dict) else {}
    given = request.get("messages") if isinstance(request.get("messages"), list) else None
    inputs = [_message(m, model, tool) for m in given] if given else None
    output = row.output
    if isinstance(output, Transcript):
        messages = [_message(m, model, tool) for m in output]
        last = next(
            (m for m in reversed(messages) if isinstance(m, model.ChatMessageAssistant)),
            model.ChatMessageAssistant(content=""),
        )
        stop = "tool_calls" if last.tool_calls else "stop"
        usage = model.ModelUsage(
            input_tokens=len(row.prompt_ids),
            output_tokens=output.generated_tokens,
            total_tokens=len(row.prompt_ids) + output.generated_tokens,
        )
        if inputs is None:
            inputs = [m for m in messages if not isinstance(m, model.ChatMessageAssistant)][:1]
    elif isinstance(output, (Completion, ChatCompletion)):
        if isinstance(output, ChatCompletion):
            last = _message(output.message, model, tool)
        else:
            last = model.ChatMessageAssistant(content=output.text)
        stop = "tool_calls" if last.tool_calls else _STOP.get(output.stop_reason, "unknown")
        messages = [*(inputs or [model.ChatMessageUser(content=prompt_text(request))]), last]
        usage = model.ModelUsage(
            input_tokens=len(row.prompt_ids),
            output_tokens=len(output.tokens),
            total_tokens=len(row.prompt_ids) + len(output.tokens),
        )
    else:
        last = model.ChatMessageAssistant(content=output_fields(output)["output"])
        stop, usage = "unknown", None
        messages = [*(inputs or [model.ChatMessageUser(content=prompt_text(request))]), last]
    choice = model.ChatCompletionChoice(message=last, stop_reason=stop)
    metadata = {
        "key": row.key,
        "match": row.match,
        "kind": row.kind,
        "seed": row.seed,
        "seed_drawn": row.seed_drawn,
        "sampling": row.sampling,
        "computed": row.computed,
        "timings": row.timings,
        "prompt_tokens": len(row.prompt_ids),
        "checkpoint_identity": row.provenance.get("checkpoint_identity"),
        "quantization": row.provenance.get("load", {}).get("quantization"),
        "item": row.item,
        "turn": row.turn,
    }
    scores = {name: scorer.Score(value=value) for name, value in row.scores.items()} if scorer is not None else {}
    return log.EvalSample(
        id=index,
        epoch=1,
        input=inputs if inputs else prompt_text(request),
        target="",
        messages=messages,
        output=model.ModelOutput(model=model_name, choices=[choice], completion=last.text, usage=usage),
        metadata=metadata,
        uuid=uuid.uuid4().hex,
        scores=scores or None,
        model_usage={model_name: usage} if usage is not None else {},
    )


def _mean(rows: list[StoredRow], name: str) -> float:
    values = [float(r.scores[name]) for r in rows if name in r.scores]
    return sum(values) / len(values) if values else float("nan")


def _iso(stamp: float | None) -> str:
    when = datetime.fromtimestamp(stamp, tz=timezone.utc) if stamp else datetime.now(timezone.utc)
    return when.isoformat()


def to_inspect(name: str, path: str | Path, *, store: str | Path | Store | None = None) -> Path:
    """Write run ``name`` as an Inspect eval log at ``path`` (``.eval``, Inspect's own format, or ``.json``);
    ``inspect view --log-dir <folder>`` browses it, ``inspect_ai.log.read_eval_log(path)`` reads it."""
    path = Path(path)
    if path.suffix not in LOG_SUFFIXES:
        raise InputError(f"an Inspect log file ends with .eval or .json, got {path.name!r}")
    log, model, tool, scorer = _inspect()
    st = open_store(store)
    sessions = st.sessions(name)
    latest = sessions[max(sessions)] if sessions else {}
    model_name = f"workbench/{latest.get('model') or 'unknown'}"
    samples, first, last = [], None, None
    rows = list(st.rows(name))
    per_item: dict[Any, int] = {}
    for row in rows:
        per_item[row.item] = per_item.get(row.item, 0) + 1
    seen: set[str] = set()
    for index, row in enumerate(rows, start=1):
        sample_id: int | str = (
            index
            if row.item is None
            else (
                row.item
                if per_item[row.item] == 1
                else f"{row.item} · turn {row.turn if row.turn is not None else index}"
            )
        )
        if sample_id in seen:  # two rows of one item and turn (a re-run with other sampling): keep ids unique
            sample_id = f"{sample_id} · row {index}"
        seen.add(str(sample_id))
        samples.append(_sample(sample_id, row, model_name, log, model, tool, scorer))
        first = row.created_at if first is None else min(first, row.created_at)
        last = row.created_at if last is None else max(last, row.created_at)
    started = min((s.get("session_started_at") or 0) for s in sessions.values()) if sessions else first
    names = sorted({n for row in rows for n in row.scores})
    results = log.EvalResults(
        total_samples=len(samples),
        completed_samples=len(samples),
        scores=[
            log.EvalScore(name=n, scorer=n, metrics={"mean": log.EvalMetric(name="mean", value=_mean(rows, n))})
            for n in names
        ],
    )
    spec = log.EvalSpec(
        created=_iso(started),
        task=name,
        dataset=log.EvalDataset(name=name, samples=len(samples), sample_ids=[s.id for s in samples]),
        model=model_name,
        config=log.EvalConfig(),
        metadata={"workbench_run": name, "provenance": latest, "store": str(st.path)},
    )
    eval_log = log.EvalLog(
        version=2,
        status="success",
        eval=spec,
        samples=samples,
        results=results,
        stats=log.EvalStats(started_at=_iso(started), completed_at=_iso(last)),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    log.write_eval_log(eval_log, str(path))
    return path
