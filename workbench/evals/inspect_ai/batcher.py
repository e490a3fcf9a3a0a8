"""Gather concurrent generate calls into engine batches.

Inspect runs many samples at once, each awaiting its own ``generate``.  Run one by one they would leave the
engine's batch slots empty; here each call adds its prompt to a pending list and waits a short gathering
window, then the first waiter takes every pending prompt with the same sampling settings and runs them as one
``engine.batch_completion`` in a worker thread.  Calls that arrive while a batch runs gather for the next one
(the lock is held while the engine works), so the engine is never idle while prompts wait and never runs a
batch smaller than what has arrived.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from workbench.engine import Engine


@dataclass
class _Pending:
    prompt: Any  # token ids, or a workbench Prompt (ids + images)
    key: Hashable
    sampling: dict[str, Any]
    taken: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass
class BatchStats:
    """How the gathered calls were batched (for tests and the notebook): one size per engine call."""

    sizes: list[int] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(self.sizes)


class Batcher:
    """One gathering queue per engine; ``await submit(prompt, sampling)`` returns that prompt's Completion."""

    def __init__(self, engine: Engine, window: float = 0.05) -> None:
        self.engine = engine
        self.window = window
        self.stats = BatchStats()
        self._pending: list[_Pending] = []
        self._lock: anyio.Lock | None = None
        self._loop_token: Any = None

    def _loop_lock(self) -> anyio.Lock:
        """The lock of the running event loop (Inspect may run successive evals in fresh loops)."""
        token = anyio.lowlevel.current_token()
        if self._lock is None or token != self._loop_token:
            self._lock, self._loop_token = anyio.Lock(), token
        return self._lock

    async def submit(self, prompt: Any, sampling: dict[str, Any]) -> Any:
        key = _sampling_key(sampling)
        item = _Pending(prompt, key, sampling)
        self._pending.append(item)
        lock = self._loop_lock()
        await anyio.sleep(self.window)
        async with lock:
            if not item.taken:
                group = [p for p in self._pending if p.key == key]
                self._pending = [p for p in self._pending if p.key != key]
                for p in group:
                    p.taken = True
                await self._run(group)
        if item.error is not None:
            raise item.error
        return item.result

    async def _run(self, group: list[_Pending]) -> None:
        prompts = [p.prompt for p in group]
        sampling = group[0].sampling
        self.stats.sizes.append(len(group))

        def work() -> None:  # results are stored by the thread, so a cancelled leader loses no one's result
            try:
                results = self.engine.batch_completion(prompts, progress=False, **sampling)
            except Exception as exc:  # every caller of this batch sees the engine's error
                for p in group:
                    p.error = exc
                return
            for p, result in zip(group, results):
                p.result = result

        await anyio.to_thread.run_sync(work)


def _sampling_key(sampling: dict[str, Any]) -> Hashable:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in sampling.items()))
