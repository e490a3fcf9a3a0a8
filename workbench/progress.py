"""Progress bars for long calls: ``tqdm.auto`` (a widget in Jupyter, text in a terminal).

Every long-running public call takes ``progress=``: ``None`` (auto, the default) shows a bar only once
the call has run for :data:`AUTO_DELAY_S` seconds, so quick calls print nothing; ``True`` shows it at
once; ``False`` never.  ``WORKBENCH_PROGRESS=0`` turns the automatic bars off for a whole session
(e.g. in CI logs); an explicit ``progress=True`` still shows one.
"""

from __future__ import annotations

import os
import time
from typing import Any

from workbench.errors import InputError

AUTO_DELAY_S = 2.0


class _NoBar:
    """Stands in for a bar when progress is off: the same calls, no output."""

    n = 0
    total = None

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def set_description_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_progress(progress: Any) -> bool | None:
    """Validate a ``progress=`` value (None, True or False)."""

    if progress is not None and not isinstance(progress, bool):
        raise InputError(f"progress must be True, False or None (automatic), got {progress!r}")
    return progress


def progress_bar(total: int | None, *, desc: str, unit: str, progress: bool | None = None) -> Any:
    """A ``tqdm.auto`` bar (or a silent stand-in) for ``total`` steps of ``unit``."""
    progress = check_progress(progress)
    if progress is False or (progress is None and os.environ.get("WORKBENCH_PROGRESS", "1") == "0"):
        return _NoBar()
    from tqdm.auto import tqdm

    delay = 0.0 if progress else AUTO_DELAY_S
    return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=progress is True, dynamic_ncols=True)


class TokenRate:
    """Tokens generated per second since construction, for a bar's postfix."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.tokens = 0

    def add(self, n: int = 1) -> None:
        self.tokens += n

    def __str__(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return f"{self.tokens} tok, {self.tokens / elapsed:.1f} tok/s"
