"""The engine's step loop: one running batch that every caller feeds (nano-vllm's ``add_request`` / ``step``).

Why: the runner's KV-cache slots and scheduler are one shared batch.  Rather than letting one call in at a time,
each engine owns one loop thread that steps the runner (:meth:`~workbench.engine.interfaces.Runner.step`):
any thread, stream, tool dialog or server request adds its requests (:meth:`EngineLoop.submit`) and reads its
own events (:class:`LoopCall`), so a short request that arrives while a long batch decodes joins it at the next
step, and requests with different sampling, tools, grammars and run stores share the same steps.  Each step the
loop hands the runner the requests that arrived and the rows to cancel, and routes the step's events to their
calls.

Each submitted request runs as its own copy (:meth:`~workbench.generation.Request.wire`, numbered across the
loop): the caller's request is touched only by the caller's thread, which records the events on it
(:class:`~workbench.engine.accumulator.RowAccumulator`), so callbacks, progress bars and run-store writes run
in the calling thread and never stall the loop.  A call that stops reading (a cancel, Ctrl-C, an abandoned or
closed stream) is *abandoned*: its rows are cancelled at the next step and nothing else is touched.  A step
that raises fails every call in flight with that exception (the scheduler drops its rows; the engine stays
usable, or the error says to reload).

Work that needs the runner to itself (teacher-forced logits, scoring, re-loads, compiling) runs between steps
in the calling thread (:meth:`EngineLoop.exclusive`): the loop parks, after letting its running rows finish
when the work uses the cache slots (``drain=True``).  The thread starts at the first request, ends after a few
idle seconds, and :meth:`EngineLoop.close` stops it for good, failing whatever still waits.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from workbench.engine.interfaces import Runner
from workbench.errors import WorkbenchError
from workbench.generation import Event, Request

# An idle loop thread ends after this many seconds (the next request starts a new one).
IDLE_EXIT_S = 5.0
# How often a waiting caller looks at its call's cancel flags (an event wakes it at once).
POLL_S = 0.05


class LoopCall:
    """One caller's requests in the loop; :meth:`next_event` gives their events (each ``index`` the request's
    place in ``requests``) as the loop's steps make them.  Read by the thread that submitted it."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.requests = list(requests)
        self.abandoned = False
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def next_event(self, timeout: float = POLL_S) -> Event | None:
        """The next event, or None after ``timeout`` seconds without one; raises what failed the call (a step's
        exception, the engine's closing)."""
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def deliver(self, item: Event | BaseException) -> None:
        self._inbox.put(item)


class EngineLoop:
    """The step loop of one engine (see the module docstring).  ``runner()`` returns the runner to step (read at
    every step: a re-load or a test may replace it)."""

    def __init__(self, runner: Callable[[], Runner]) -> None:
        self._runner = runner
        self._cond = threading.Condition()
        self._uids = itertools.count()
        self._incoming: list[tuple[LoopCall, list[Request]]] = []
        self._live: dict[int, tuple[LoopCall, int, Request]] = {}  # uid -> (call, place in the call, request)
        self._dropped: list[int] = []  # rows of calls a failed step ended: cancelled in the runner at the next step
        self._thread: threading.Thread | None = None
        self._closed: str | None = None
        self._exclusive = threading.RLock()  # one exclusive user of the runner at a time
        self._depth = 0  # nested exclusive() of the thread holding it
        self._pause_wanted = False
        self._drain = False
        self._paused = False

    # ----------------------------------------------------------------------------- callers
    @property
    def running(self) -> int:
        """Rows in flight (waiting, prefilling or decoding) in the runner now."""
        with self._cond:
            return len(self._live) + sum(len(rows) for _, rows in self._incoming)

    def submit(self, requests: Sequence[Request]) -> LoopCall:
        """Add ``requests`` to the running batch (they join at the next step); their events go to the returned
        call.  Any thread."""
        call = LoopCall(requests)
        with self._cond:
            if self._closed is not None:
                raise WorkbenchError(self._closed)
            copies = []
            for request in call.requests:
                copy = request.wire(request.image_tiles)
                copy.index = next(self._uids)
                copies.append(copy)
            self._incoming.append((call, copies))
            self._start()
            self._cond.notify_all()
        return call

    def abandon(self, call: LoopCall) -> None:
        """Stop ``call``'s rows at the next step (its unread events are dropped).  Any thread; idempotent."""
        with self._cond:
            call.abandoned = True
            self._cond.notify_all()

    @contextmanager
    def exclusive(self, *, drain: bool = False) -> Iterator[None]:
        """Use the runner directly in this thread while the loop is parked between steps.  ``drain``: first let
        the running rows finish (no new rows are admitted meanwhile), for work that uses the cache slots."""
        with self._exclusive:
            self._depth += 1
            try:
                if self._depth == 1:  # the outermost use parks the loop; a nested one (same thread) is inside it
                    self._park(drain)
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    with self._cond:
                        self._pause_wanted = False
                        self._cond.notify_all()

    def _park(self, drain: bool) -> None:
        with self._cond:
            if self._closed is not None:
                raise WorkbenchError(self._closed)
            self._pause_wanted, self._drain = True, drain
            self._cond.notify_all()
            while self._thread is not None and not self._paused:
                self._cond.wait()

    def close(self, reason: str = "this engine was unloaded; call workbench.load(...) again") -> None:
        """Stop the loop for good: every call still in flight or waiting fails with a WorkbenchError saying
        ``reason``; returns once the thread has ended (after the step it is running, if any)."""
        with self._cond:
            if self._closed is not None:
                return
            self._closed = reason
            calls = {call for call, _, _ in self._live.values()} | {call for call, _ in self._incoming}
            self._live.clear()
            self._incoming.clear()
            thread = self._thread
            self._cond.notify_all()
        for call in calls:
            call.deliver(WorkbenchError(reason))
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._exclusive:  # a re-load or scoring of another thread finishes before the caller frees the model
            pass

    # ----------------------------------------------------------------------------- the loop thread
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="workbench-engine-loop", daemon=True)
            self._thread.start()

    def _next_work(self) -> tuple[list[Request], list[int]] | None:
        """Wait (holding the condition) until there is a step to run: its new requests and rows to cancel; None
        when the thread should end (closed, or idle)."""
        while True:
            if self._closed is not None:
                self._thread = None
                self._cond.notify_all()
                return None
            if self._pause_wanted and (not self._drain or not (self._live or self._dropped)):
                self._paused = True
                self._cond.notify_all()
                while self._pause_wanted and self._closed is None:
                    self._cond.wait()
                self._paused = False
                continue
            self._incoming = [(call, rows) for call, rows in self._incoming if not call.abandoned]
            if self._live or self._dropped or (self._incoming and not self._pause_wanted):
                break
            if not self._cond.wait(IDLE_EXIT_S) and not (self._live or self._incoming or self._pause_wanted):
                self._thread = None
                self._cond.notify_all()
                return None
        add: list[Request] = []
        if not self._pause_wanted:
            for call, rows in self._incoming:
                for place, row in enumerate(rows):
                    self._live[row.index] = (call, place, call.requests[place])
                add.extend(rows)
            self._incoming = []
        cancel = [uid for uid, (call, _, request) in self._live.items() if call.abandoned or request.cancelled]
        cancel.extend(self._dropped)
        self._dropped = []
        return add, cancel

    def _run(self) -> None:
        while True:
            with self._cond:
                work = self._next_work()
            if work is None:
                return
            add, cancel = work
            try:
                events = self._runner().step(add, cancel)
            except BaseException as exc:  # the step failed: so does every call in flight; the loop goes on
                with self._cond:
                    calls = {call for call, _, _ in self._live.values()}
                    self._dropped = list(self._live)  # a runner whose step raised past its own reset drops them
                    self._live.clear()
                for call in calls:
                    call.deliver(exc)
                continue
            with self._cond:
                for event in events:
                    entry = self._live.get(event.index)
                    if entry is None:
                        continue  # a row of a closed engine's call
                    call, place, _ = entry
                    if event.stop_reason is not None:
                        del self._live[event.index]
                    if not call.abandoned:
                        event.index = place
                        call.deliver(event)


def call_events(loop: EngineLoop, calls: Any, requests: Sequence[Request]) -> Iterator[Event]:
    """The events of ``requests`` run in ``loop``, as they come, until every request has ended: the path every
    generation call and stream takes.  ``calls`` (:class:`~.calls.Calls`) numbers the call so that
    ``engine.cancel()`` ends it: its rows leave the batch at the next step and the events not read yet
    are dropped: the call keeps what it read before the cancel (the caller sees rows not ended).  Closing the
    iterator early (a ``KeyboardInterrupt``, a closed stream) abandons the rows that have not ended."""
    call = loop.submit(requests)
    number = calls.begin(lambda: loop.abandon(call))
    left = len(call.requests)
    try:
        while left:
            if calls.cancelled(number):
                return
            event = call.next_event()
            if event is None:
                continue
            if event.stop_reason is not None:
                left -= 1
            yield event
    finally:
        calls.end(number)
        if left:
            loop.abandon(call)
