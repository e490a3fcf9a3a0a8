"""``python -m workbench batch -i requests.jsonl -o results.jsonl``: a batch file through the engine, no server.

The input is OpenAI's batch format (``{"custom_id", "method": "POST", "url", "body"}`` per line, ``url``
``/v1/chat/completions`` or ``/v1/completions``), the output vLLM ``run-batch``'s: one line per request,
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``, a refused request with
``"body": null`` and the error message.  Lines are written as engine batches finish (requests of equal
settings run together, so a file of mixed settings comes out grouped; match lines by ``custom_id``).

Resumable: a re-run with the same output file skips every ``custom_id`` already in it and appends the rest,
so a run killed at 80 % loses only the engine batch in flight.  A progress bar counts requests; the last line
printed is one JSON summary.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.progress import progress_bar

from .lines import LineError, error_message, iter_lines, parse_line, read_appended, vllm_line
from .runner import Answer, Backend, Interrupted, Work, prepare, run_chunks


def done_ids(path: Path) -> tuple[set[str], set[str]]:
    """The ``custom_id`` of every line already in the output file, and the messages of its lines that had none;
    a torn last line (a killed write) is cut off so the file stays valid JSONL."""
    ids: set[str] = set()
    anonymous: set[str] = set()
    for line in read_appended(path):
        if isinstance(line, dict) and isinstance(line.get("custom_id"), str):
            ids.add(line["custom_id"])
        elif isinstance(line, dict):
            anonymous.add(str(line.get("error")))
    return ids, anonymous


def run_file(
    backend: Backend,
    input_path: str | Path,
    output_path: str | Path,
    *,
    run: str | None = None,
    progress: bool | None = None,
    tokens: Callable[[Answer], int] | None = None,
) -> dict[str, Any]:
    """Answer every request of ``input_path`` not yet in ``output_path`` (appending); returns the summary.

    tokens: how many tokens an answer generated (for the summary's tokens/s); default: the body's
    ``usage.completion_tokens``."""
    input_path, output_path = Path(input_path), Path(output_path)
    started = time.perf_counter()
    already, anonymous = done_ids(output_path)
    works: list[Work] = []
    refused: list[dict[str, Any]] = []
    seen: set[str] = set()
    total = skipped = 0
    for number, text in iter_lines(input_path):
        total += 1
        try:
            request = parse_line(text, number)
        except LineError as exc:
            line = vllm_line(exc.custom_id, 400, None, exc.message)
            if (exc.custom_id in already) or (exc.custom_id is None and exc.message in anonymous):
                skipped += 1
            else:
                refused.append(line)
            continue
        if request.custom_id in already:
            skipped += 1
            continue
        if request.custom_id in seen:
            refused.append(
                vllm_line(
                    request.custom_id,
                    400,
                    None,
                    f"line {number}: custom_id {request.custom_id!r:.80} was used by an earlier line",
                )
            )
            continue
        seen.add(request.custom_id)
        work = prepare(backend, request)
        if isinstance(work, Answer):
            refused.append(vllm_line(request.custom_id, work.status, None, error_message(work.body)))
        else:
            works.append(work)
    counts = {"succeeded": 0, "failed": len(refused), "tokens": 0}
    count_tokens = tokens or _completion_tokens
    output_path.parent.mkdir(parents=True, exist_ok=True)
    bar = progress_bar(len(refused) + len(works), desc="batch", unit="request", progress=progress)
    interrupted = False
    with open(output_path, "a", encoding="utf-8") as out:

        def write(lines: list[dict[str, Any]]) -> None:
            out.writelines(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
            out.flush()
            os.fsync(out.fileno())
            bar.update(len(lines))

        def emit(pairs: list[tuple[Work, Answer]]) -> None:
            lines = []
            for work, answer in pairs:
                if answer.ok:
                    counts["succeeded"] += 1
                    counts["tokens"] += count_tokens(answer)
                    lines.append(vllm_line(work.request.custom_id, answer.status, answer.body))
                else:
                    counts["failed"] += 1
                    lines.append(vllm_line(work.request.custom_id, answer.status, None, error_message(answer.body)))
            write(lines)

        try:
            write(refused)
            run_chunks(backend, works, run=run, emit=emit)
        except (KeyboardInterrupt, Interrupted):  # Ctrl-C, or the engine stopped: a re-run finishes the file
            interrupted = True
        finally:
            bar.close()
    seconds = time.perf_counter() - started
    return {
        "input": str(input_path),
        "output": str(output_path),
        "requests": total,
        "skipped_done": skipped,
        "succeeded": counts["succeeded"],
        "failed": counts["failed"],
        "remaining": total - skipped - counts["succeeded"] - counts["failed"],
        "generated_tokens": counts["tokens"],
        "seconds": round(seconds, 2),
        "requests_per_s": round((counts["succeeded"] + counts["failed"]) / seconds, 2) if seconds else 0.0,
        "interrupted": interrupted,
    }


def _completion_tokens(answer: Answer) -> int:
    usage = answer.body.get("usage") if isinstance(answer.body, dict) else None
    return int(usage.get("completion_tokens", 0)) if isinstance(usage, dict) else 0
