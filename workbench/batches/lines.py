"""The line formats of batch files: OpenAI's input lines, OpenAI's output and error lines, vLLM ``run-batch``'s.

Input (both)::

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions", "body": {...a request body...}}

Output, one line per answered request (OpenAI's output file; vLLM's output file holds these and its errors)::

    {"id": "batch_req_...", "custom_id": "q1",
     "response": {"status_code": 200, "request_id": "...", "body": {...the response body...}}, "error": null}

A request the server refused (a 4xx) is the same line with its status and OpenAI's error body; OpenAI puts it
in the batch's error file.  A line that is not a request at all (not JSON, no ``custom_id``, another endpoint)
has ``"response": null`` and ``"error": {"code", "message"}``; vLLM's format writes every refusal as
``"response": {"status_code": 400, "request_id", "body": null}, "error": "<message>"``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")


@dataclass
class Request:
    """One input line: its number in the file (1-based), ``custom_id``, endpoint and request body."""

    line: int
    custom_id: str
    url: str
    body: dict[str, Any]


class LineError(Exception):
    """A line that is not a request this batch can run: OpenAI's error ``code`` and a message naming the line."""

    def __init__(self, code: str, message: str, line: int, custom_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.line, self.custom_id = code, message, line, custom_id


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-blank line of a JSONL file, read one line at a time."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if raw.strip():
                yield number, raw.decode("utf-8", errors="replace")


def parse_line(text: str, line: int, endpoint: str | None = None) -> Request:
    """The request on one line; :class:`LineError` says what is wrong with it.

    endpoint: the batch's endpoint (every line must name it); None accepts any of :data:`ENDPOINTS`."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise LineError("invalid_json", f"line {line} is not valid JSON ({str(exc)[:120]})", line) from None
    if not isinstance(value, dict):
        raise LineError(
            "invalid_request", f"line {line} must be a JSON object with custom_id, method, url and body", line
        )
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("missing_custom_id", f"line {line} has no custom_id (a non-empty string)", line)
    method = value.get("method", "POST")
    if not isinstance(method, str) or method.upper() != "POST":
        raise LineError("invalid_method", f"line {line}: method must be POST, got {method!r:.20}", line, custom_id)
    url = value.get("url")
    allowed = (endpoint,) if endpoint else ENDPOINTS
    if url not in allowed:
        raise LineError(
            "invalid_url", f"line {line}: url is {url!r:.60}; this batch runs {' or '.join(allowed)}", line, custom_id
        )
    body = value.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_body", f"line {line}: body must be a JSON object (the request)", line, custom_id)
    if body.get("stream"):
        raise LineError(
            "invalid_body", f'line {line}: "stream": true has no meaning in a batch; leave it out', line, custom_id
        )
    return Request(line, custom_id, url, body)


def _ids() -> tuple[str, str]:
    return f"batch_req_{uuid.uuid4().hex[:24]}", f"req_{uuid.uuid4().hex[:24]}"


def output_line(custom_id: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """An answered request (2xx, or a 4xx with OpenAI's error body)."""
    line_id, request_id = _ids()
    return {
        "id": line_id,
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


def error_line(custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    """A line that never became a request (OpenAI's error-file shape for it)."""
    return {"id": _ids()[0], "custom_id": custom_id, "response": None, "error": {"code": code, "message": message}}


def vllm_line(
    custom_id: str | None, status: int, body: dict[str, Any] | None, error: str | None = None
) -> dict[str, Any]:
    """vLLM ``run-batch``'s output line: a response body, or ``body: null`` and the error message."""
    line_id, request_id = _ids()
    return {
        "id": line_id,
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": error,
    }


def error_message(body: dict[str, Any]) -> str:
    """The message of an OpenAI error body (for vLLM's one-string ``error``)."""
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("message")) if isinstance(error, dict) else json.dumps(body)[:500]


def read_appended(path: Path) -> list[Any]:
    """The JSON lines of a file this package appends to as work finishes (a batch's answered lines, the CLI's
    output); a torn last line, left by a killed write, is cut off the file so later appends stay valid JSONL."""
    entries: list[Any] = []
    if not path.exists():
        return entries
    good = 0
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                entries.append(json.loads(raw))
            except ValueError:
                break
            good += len(raw)
    if good != path.stat().st_size:
        with open(path, "r+b") as f:
            f.truncate(good)
    return entries
