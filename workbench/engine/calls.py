"""Cancelling the engine's running calls: :class:`Calls` numbers them so that ``cancel()`` hits the calls running
now and never a later one.

Calls no longer wait for each other (they share the engine's running batch, :mod:`.loop`), so a cancel ends each
call running at that moment: each stops reading, its rows leave the batch at the next step and it raises
:class:`~workbench.errors.GenerationCancelled` with its partial results.  A call of another thread that starts
afterwards is not affected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Calls:
    """Numbers the engine's generation calls so that ``cancel()`` hits the running ones and no later one.

    ``cancel`` only marks calls that have already started, so a Stop pressed between two calls never cancels the
    next one; it is safe from any thread (a widget callback, a timer, a signal handler).  Each call registers
    what stops its rows (``on_cancel``: abandon its requests in the loop), run by ``cancel`` so that no step
    starts for them after it returns.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = 0
        self._running: dict[int, Callable[[], None] | None] = {}
        self._cancelled: set[int] = set()

    def begin(self, on_cancel: Callable[[], None] | None = None) -> int:
        with self._lock:
            self._started += 1
            self._running[self._started] = on_cancel
            return self._started

    def end(self, call: int) -> None:
        with self._lock:
            self._running.pop(call, None)
            self._cancelled.discard(call)

    def cancel(self) -> bool:
        """Cancel every call running now; True when there was one."""
        with self._lock:
            running = dict(self._running)
            self._cancelled.update(running)
        for stop in running.values():
            if stop is not None:
                stop()
        return bool(running)

    def cancelled(self, call: int) -> bool:
        return call in self._cancelled
