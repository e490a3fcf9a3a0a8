"""Tool results as message text: what a tool returned, written into the tool (``ipython``) message the
model reads next.  Strings stay as they are; anything else becomes JSON; nothing here ever raises, since a
tool's broken ``__str__`` must become a message, not a crash of the tool loop.
"""

from __future__ import annotations

import json
from typing import Any


def safe_str(value: Any, limit: int = 2000) -> str:
    """``str(value)`` that never raises (falls back to ``repr``, then to the type name)."""
    for render in (str, repr):
        try:
            text = render(value)
            if isinstance(text, str):
                return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} chars cut)"
        except Exception:  # noqa: S112  (a broken __str__/__repr__ is exactly the case handled)
            continue
    return f"<{type(value).__name__} object that cannot be printed>"


def format_result(result: Any) -> str:
    """A tool's return value as message text: strings as they are, anything else as JSON (never raises)."""
    if type(result) is str:
        return result
    if isinstance(result, str):
        return safe_str(result, limit=10**9)
    try:
        return json.dumps(result, ensure_ascii=False, default=safe_str, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return safe_str(result, limit=10**9)
    except Exception:  # noqa: BLE001  (a broken __str__ inside the value, via default=)
        return safe_str(result, limit=10**9)
