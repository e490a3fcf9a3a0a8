"""Turning a row's generated tokens into its result: parsed structured output (or why it does not conform),
and the stop-string bookkeeping that streams need so that no part of a stop string ever leaks."""

from __future__ import annotations

import json
from typing import Any

from workbench.structured import OutputFormat


def close_events(events: Any) -> None:
    close = getattr(events, "close", None)
    if close is not None:
        close()


def parse_output(fmt: OutputFormat, text: str, stop_reason: str) -> tuple[Any, str | None]:
    """``(parsed, format_error)`` of a constrained row: the JSON value (or pydantic object) of a JSON format,
    and why the text does not conform when it does not (cut by max_tokens, a stop string or a cancel)."""
    if stop_reason == "out_of_tokens":
        return None, f"max_tokens (or max_seq_len) was reached before the output completed its {fmt.kind} format"
    if stop_reason == "cancelled":
        return None, f"the call was cancelled before the output completed its {fmt.kind} format"
    if fmt.kind != "json_schema":
        return None, None
    try:
        if fmt.model is not None:
            return fmt.model.model_validate_json(text), None
        return json.loads(text), None
    except ValueError as exc:  # json.JSONDecodeError and pydantic.ValidationError are ValueErrors
        return None, f"the output is not valid for its JSON schema (cut by a stop string?): {exc}"


def stop_prefix_overlap(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that could still grow into one of ``stops``."""
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])), default=0)
