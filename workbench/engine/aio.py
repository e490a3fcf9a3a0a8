"""The awaitable form of the engine's calls: ``await engine.aio.chat_completion(...)``, ``asyncio.gather`` in a cell.

Why one mechanism and not a second copy of each method: every call already shares the engine's running batch
(:mod:`.loop`), so concurrent calls from threads decode together.  ``engine.aio.<method>`` is the engine's own
method (same signature, same result) run in a worker thread of the engine's own pool, awaited; ``asyncio.gather``
of N calls is N threads feeding one batch.  The pool is sized for many callers (the default executor's handful
of threads would let only a few calls in at a time).  Cancelling the awaiting task does not stop the call
(``engine.cancel()`` does); the event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# Methods with an awaitable form: the calls that generate or score (the rest return at once).
AWAITABLE = frozenset(
    {
        "completion",
        "batch_completion",
        "chat_completion",
        "batch_chat_completion",
        "generate_tokens",
        "logits",
        "score",
    }
)
# Threads of one engine's pool: concurrent awaited calls beyond this wait for a thread.
MAX_THREADS = 256


class AsyncEngine:
    """``engine.aio``: each of :data:`AWAITABLE` as a coroutine function taking the method's own arguments."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def __getattr__(self, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        if name not in AWAITABLE:
            raise AttributeError(f"engine.aio has no {name!r}; awaitable calls: {', '.join(sorted(AWAITABLE))}")
        method = getattr(self._engine, name)

        @functools.wraps(method)
        async def awaitable(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.get_running_loop().run_in_executor(
                self.executor(), functools.partial(method, *args, **kwargs)
            )

        return awaitable

    def executor(self) -> ThreadPoolExecutor:
        """The engine's thread pool for awaited calls (made at the first one)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="workbench-aio")
            return self._pool

    def close(self) -> None:
        """Let the pool's threads end (calls still running finish; the engine's close fails them)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
