"""Gather concurrent generate calls into engine batches.

Inspect runs many samples at once, each awaiting its own ``generate``.  Run one by one they would leave the
engine's batch slots empty; here each call adds its dialog (with its own tools) to a pending list and waits a
short gathering window, then the first waiter takes every pending dialog with the same sampling settings and runs
them as one ``engine.batch_chat_completion`` (the one chat route: tools one per dialog) in a worker thread.  A
dialog the engine refuses (bad content, too long) must not fail the samples it was gathered with: a refused
batch is asked again dialog by dialog, so only the sample at fault sees the error.  Calls that arrive while a
batch runs gather for the next one (the lock is held while the engine works), so the engine is never idle while
dialogs wait and never runs a batch smaller than what has arrived.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from workbench.engine import Engine
from workbench.errors import WorkbenchError


@dataclass
class DialogRow:
    """One generate call's dialog: workbench messages, its tools (None: none) and tool choice."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None
    tool_choice: Any = "auto"


@dataclass
class _Pending:
    prompt: DialogRow
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
    """One gathering queue per engine; ``await submit(dialog, sampling)`` returns that dialog's ChatCompletion."""

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

    async def submit(self, prompt: DialogRow, sampling: dict[str, Any]) -> Any:
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
                results = self._replies(prompts, sampling)
            except WorkbenchError as exc:
                if len(group) == 1:
                    group[0].error = exc
                    return
                for p in group:  # one dialog was refused: ask again alone, so only its sample sees the error
                    try:
                        p.result = self._replies([p.prompt], sampling)[0]
                    except Exception as alone:
                        p.error = alone
                return
            except Exception as exc:  # every caller of this batch sees the engine's error
                for p in group:
                    p.error = exc
                return
            for p, result in zip(group, results):
                p.result = result

        await anyio.to_thread.run_sync(work)

    def _replies(self, dialogs: list[DialogRow], sampling: dict[str, Any]) -> list[Any]:
        """One engine call: every dialog with its own tools and tool choice."""
        return self.engine.batch_chat_completion(
            [d.messages for d in dialogs],
            tools=[d.tools for d in dialogs],
            tool_choice=[d.tool_choice for d in dialogs],
            progress=False,
            **sampling,
        )


def _sampling_key(sampling: dict[str, Any]) -> Hashable:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in sampling.items()))
