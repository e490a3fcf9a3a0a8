"""Progress bars for long calls that leave nothing stale behind.

Every long-running public call takes ``progress=``: ``None`` (auto, the default) shows a bar only once
the call has run for :data:`AUTO_DELAY_S` seconds, so quick calls print nothing; ``True`` shows it at
once; ``False`` never.  ``WORKBENCH_PROGRESS=0`` turns the automatic bars off for a whole session
(e.g. in CI logs); an explicit ``progress=True`` still shows one.  ``WORKBENCH_PROGRESS_DELAY`` (seconds)
moves the automatic threshold: ``0`` shows every automatic bar at once, whatever the machine's speed — which is
how ``notebooks/build.py`` runs the notebooks, so that an output which would change with load (a bar that shows
only when a call is slow) is found when the notebook is built, not on a reader's busy machine.

A bar that was shown is replaced, when the call ends, by one line that says what the call did
(``generating: 8 rows · 141 tokens · 6.2 s · 22.7 tok/s``).  In Jupyter the bar is a widget displayed
under a display id and the summary *replaces* it in the cell's output, so a saved notebook holds the text
and no widget (no frozen half bar, no view of a closed widget that reads "model not found" later); in a
terminal the ``tqdm`` bar is erased and the line printed in its place.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

from workbench.errors import InputError

AUTO_DELAY_S = 2.0
DELAY_VARIABLE = "WORKBENCH_PROGRESS_DELAY"


def auto_delay() -> float:
    """Seconds a call runs before its automatic bar shows: ``$WORKBENCH_PROGRESS_DELAY`` or :data:`AUTO_DELAY_S`."""
    text = os.environ.get(DELAY_VARIABLE, "").strip()
    if not text:
        return AUTO_DELAY_S
    try:
        delay = float(text)
    except ValueError:
        delay = -1.0
    if not delay >= 0 or delay == float("inf"):
        raise InputError(
            f"{DELAY_VARIABLE}={text!r} is not a number of seconds; set it to e.g. 2 (the default) or 0 "
            "(every automatic bar at once), or unset it"
        )
    return delay


def _bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (a bar's count of bytes; workbench.reports, a sibling, has its own)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


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


def progress_bar(
    total: int | None,
    *,
    desc: str,
    unit: str,
    progress: bool | None = None,
    rate: TokenRate | None = None,
    auto: bool = False,
) -> Any:
    """A bar (or a silent stand-in) for ``total`` steps of ``unit``; ``rate`` adds tokens to its summary line.
    ``auto``: a bar the caller decided to show by its own automatic rule (a replica pool's job), marked as
    automatic like those of ``progress=None``."""
    progress = check_progress(progress)
    if progress is False or (progress is None and os.environ.get("WORKBENCH_PROGRESS", "1") == "0"):
        return _NoBar()
    delay = 0.0 if progress else auto_delay()
    kind = _NotebookBar if _in_notebook() else _TerminalBar
    return kind(total, desc=desc, unit=unit, delay=delay, rate=rate, auto=auto or progress is None)


def _in_notebook() -> bool:
    """True inside a Jupyter kernel with ipywidgets (where a widget bar can be shown)."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ipython = shell.get_ipython()
    if ipython is None or "IPKernelApp" not in getattr(ipython, "config", {}):
        return False
    try:
        import ipywidgets  # noqa: F401  (optional heavy dependency, only to know a widget can be drawn)
    except ImportError:
        return False
    return True


class _Bar:
    """What both bars share: counting, the delay before showing, and the closing summary line."""

    def __init__(
        self, total: int | None, *, desc: str, unit: str, delay: float, rate: TokenRate | None, auto: bool
    ) -> None:
        self.total, self.desc, self.unit, self.delay, self.rate, self.auto = total, desc, unit, delay, rate, auto
        self.n = 0
        self.postfix = ""
        self.start = time.perf_counter()
        self.shown = False
        self.closed = False
        self._maybe_show()

    def summary(self) -> str:
        elapsed = time.perf_counter() - self.start
        if self.unit == "B":  # bytes read: "15.8 MiB", not "16612435 Bs"
            parts = [_bytes(self.n) + (f" of {_bytes(self.total)}" if self.total not in (None, self.n) else "")]
        else:
            done = f"{self.n}/{self.total}" if self.total is not None and self.n != self.total else f"{self.n}"
            parts = [f"{done} {self.unit}{'s' if self.n != 1 else ''}"]
        if self.rate is not None:
            parts += [f"{self.rate.tokens} tokens"]
        parts += [f"{elapsed:.1f} s"]
        if self.rate is not None and elapsed > 0:
            parts += [f"{self.rate.tokens / elapsed:.1f} tok/s"]
        return f"{self.desc}: " + " · ".join(parts)

    def _maybe_show(self) -> None:
        if not self.shown and time.perf_counter() - self.start >= self.delay:
            self.shown = True
            self._show()

    def update(self, n: int = 1) -> None:
        self.n += n
        self._maybe_show()
        if self.shown:
            self._refresh()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s
        if self.shown and refresh:
            self._refresh()

    def set_description_str(self, s: str = "", refresh: bool = True) -> None:
        self.desc = s
        if self.shown and refresh:
            self._refresh()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.shown:
            self._finish(self.summary())

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _show(self) -> None: ...

    def _refresh(self) -> None: ...

    def _finish(self, line: str) -> None: ...


class _TerminalBar(_Bar):
    """A ``tqdm`` text bar that is erased at the end and replaced by the summary line (on stderr)."""

    def _show(self) -> None:
        self._bar = tqdm(
            total=self.total,
            desc=self.desc,
            unit=self.unit,
            initial=self.n,
            leave=False,
            dynamic_ncols=True,
            file=sys.stderr,
        )

    def _refresh(self) -> None:
        self._bar.n = self.n
        self._bar.set_description_str(self.desc, refresh=False)
        self._bar.set_postfix_str(self.postfix, refresh=True)

    def _finish(self, line: str) -> None:
        self._bar.close()
        print(line, file=sys.stderr, flush=True)


class _NotebookBar(_Bar):
    """An ipywidgets bar shown under a display id; at the end the summary text replaces it in the output."""

    def _show(self) -> None:
        import ipywidgets as widgets  # optional heavy dependency
        from IPython.display import display

        self._progress = widgets.IntProgress(min=0, max=self.total or 1, value=self.n, bar_style="info")
        self._label = widgets.Label()
        self._box = widgets.HBox([widgets.Label(self.desc), self._progress, self._label])
        self._handle = display(self._box, display_id=True)
        self._refresh()

    def _refresh(self) -> None:
        if self.total is not None:
            self._progress.value = min(self.n, self.total)
        elapsed = time.perf_counter() - self.start
        self._label.value = (
            f"{self.n}/{self.total if self.total is not None else '?'} {self.unit}s · "
            f"{elapsed:.1f} s" + (f" · {self.postfix}" if self.postfix else "")
        )

    def _finish(self, line: str) -> None:
        from IPython.display import Pretty

        # the output now holds the text only, not a view of the widget; the mark (an automatic bar's or an asked
        # one's) lets notebooks/checks.py find it
        self._handle.update(Pretty(line), metadata={"workbench": {"progress": "auto" if self.auto else "asked"}})
        self._box.close()


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


@contextmanager
def tqdm_bars_off() -> Iterator[None]:
    """Inside the block every ``tqdm`` bar stays off, whoever draws it.

    Why: third-party code draws bars that none of its options turns off (lm-evaluation-harness draws one per
    task while building requests, and more while tokenizing and running them), and tqdm reads
    ``TQDM_DISABLE`` only when it is first imported — too late in a running kernel.  The block switches
    tqdm's default to ``disable=True`` (an explicit ``disable=False`` included) and restores it on exit;
    the switch holds for the whole process while the block runs, so do not start bars meant to show from
    other threads meanwhile.  workbench's own bars are widgets in a notebook (untouched) and tqdm bars in a
    terminal (off in the block too; their summary line still prints).
    """
    original = tqdm.__dict__["__init__"]  # tqdm wraps it (its environment defaults): restored as it was
    init = tqdm.__init__

    def off(self: tqdm, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    tqdm.__init__ = off
    try:
        yield
    finally:
        tqdm.__init__ = original
