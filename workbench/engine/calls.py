"""One call at a time on an engine, and cancelling the one that runs.

The runner's KV-cache rows and scheduler are shared by every call, so two interleaved calls would corrupt
each other's rows: :class:`CallGate` lets one call in at a time (other threads wait their turn) and knows
which thread and which stream hold it.  :class:`Calls` numbers the calls so that ``cancel()`` hits the
running one and never a later one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from workbench.errors import EngineBusyError


class Calls:
    """Numbers the engine's generation calls so that ``cancel()`` hits the running one and no later one.

    ``cancel`` only marks calls that have already started, so a Stop pressed between two calls never
    cancels the next one; it is safe from any thread (a widget callback, a timer, a signal handler).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = 0
        self._running: set[int] = set()
        self._cancel_upto = 0

    def begin(self) -> int:
        with self._lock:
            self._started += 1
            self._running.add(self._started)
            return self._started

    def end(self, call: int) -> None:
        with self._lock:
            self._running.discard(call)

    def cancel(self) -> bool:
        with self._lock:
            if not self._running:
                return False
            self._cancel_upto = max(self._running)
            return True

    def cancelled(self, call: int) -> bool:
        return call <= self._cancel_upto  # an int read: no lock needed on the hot path


# Another thread's stream that stays suspended this long without being resumed counts as abandoned.
PREEMPT_AFTER_S = 1.0


class CallGate:
    """The engine's lock, with the thread and the stream holding it (a suspended stream is preempted)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: int | None = None  # thread id holding the lock
        self.holder: Any = None  # the stream generator holding the lock (None: a plain call)
        self.progress = 0  # bumped each time the holding stream is resumed (see exclusive)

    def held_by_this_thread(self) -> bool:
        return self.owner == threading.get_ident()

    @contextmanager
    def exclusive(self, what: str, stream: Any = None) -> Iterator[None]:
        """Run one call at a time on this engine; other threads wait their turn.

        A stream that is suspended (abandoned half-way, or kept alive by a traceback) does not block later
        calls: the new call closes it first, and the old stream simply ends — at once for a stream of the
        calling thread, after ``PREEMPT_AFTER_S`` without being read for another thread's (so a stream that is
        being read elsewhere, e.g. by a server's client, is waited for and never cut).  A call re-entering from inside
        a running call of the same thread (a callback) is refused with :class:`EngineBusyError`.
        """
        me = threading.get_ident()
        if self.owner == me:  # this thread's own suspended stream gives way at once
            self._preempt_suspended_stream()
        if self.owner == me:  # still held by this thread: a call running below us (from a callback)
            raise EngineBusyError(
                f"{what}() was called from inside another call on this engine in the same thread (a callback?); "
                "finish that call first"
            )
        self._acquire()
        self.owner, self.holder = me, stream
        try:
            yield
        finally:
            self.owner, self.holder = None, None
            self.lock.release()

    def _acquire(self) -> None:
        """Wait for the lock.  Another thread's stream is closed only once it has stayed suspended for
        ``PREEMPT_AFTER_S`` without being resumed: a stream its thread is still reading (a notebook loop, a
        server's client) is waited for, not cut between two items."""
        seen = self.progress
        while not self.lock.acquire(timeout=PREEMPT_AFTER_S):
            if self.progress == seen:
                self._preempt_suspended_stream()
            seen = self.progress

    def _preempt_suspended_stream(self) -> None:
        holder = self.holder
        if holder is None or getattr(holder, "gi_running", True) or getattr(holder, "gi_frame", None) is None:
            return
        try:
            holder.close()  # runs the stream's cleanup, which releases the lock
        except (ValueError, RuntimeError):  # resumed meanwhile by its own thread: wait for it instead
            pass
