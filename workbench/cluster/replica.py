"""The replica: a Ray actor that holds one engine and runs chunks of a pool's batches on it.

The actor is *threaded* (``max_concurrency`` > 1) so that a cancel, a liveness probe or the next chunk
reach it while a chunk runs; chunks themselves run one at a time (the engine has one KV cache), in the
order they arrive, behind the actor's own lock — which is also how ``cancel(job)`` knows whether the
chunk running now belongs to that job.  The engine's ``cancel()`` is thread-safe and stops the running
call at its next decode step.

Construction does not load the model (``load()`` does), so placement can be inspected — which node, which
``CUDA_VISIBLE_DEVICES`` — without building an engine.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import workbench as wb
from workbench.engine import model_label
from workbench.errors import GenerationCancelled, WorkbenchError

__all__ = ["ReplicaSpec", "Replica", "descendants"]

MAX_CONCURRENCY = 8  # chunks waiting their turn + cancel + probes


@dataclass
class ReplicaSpec:
    """What a replica loads (``workbench.load(checkpoint, **load_kwargs)``) and how many threads it may use."""

    checkpoint: Any
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    threads: int = 1


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return sorted(out)


class Replica:
    """One engine in one Ray actor process (see the module docstring)."""

    def __init__(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        self.engine: wb.Engine | None = None
        self._lock = threading.Lock()  # one chunk at a time, and we know whose
        self._state = threading.Lock()
        self._current: int | None = None  # job id of the chunk inside the engine now
        self._cancelled: set[int] = set()
        self._delay_s = 0.0  # test hook (set_delay): seconds to wait inside every chunk before generating
        os.environ.setdefault("WORKBENCH_PROGRESS", "0")  # replicas never draw bars: the pool draws one

    # ----------------------------------------------------------------------------- placement
    def where(self) -> dict[str, Any]:
        """Node id, host, pid and the GPUs Ray gave this replica (``CUDA_VISIBLE_DEVICES``)."""
        import ray

        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }

    def pids(self) -> list[int]:
        """This actor's process and every process it started (model-parallel workers)."""
        return [os.getpid(), *descendants(os.getpid())]

    # ----------------------------------------------------------------------------- engine
    def load(self) -> dict[str, Any]:
        """Load the engine; returns what the pool shows about it (sizes, settings, where)."""
        import torch

        torch.set_num_threads(max(1, int(self.spec.threads)))
        start = time.perf_counter()
        self.engine = wb.load(self.spec.checkpoint, **self.spec.load_kwargs)
        e = self.engine
        return {
            "model_id": e.model_id,
            "model": model_label(e),
            "family": e.family,
            "max_seq_len": e.max_seq_len,
            "max_batch_size": e.max_batch_size,
            "settings": e.settings,
            "args": e.args,
            "load_seconds": time.perf_counter() - start,
            **self.where(),
        }

    def text_tools(self) -> tuple[Any, Any]:
        """The engine's tokenizer and formatter (the pool renders prompts and parses replies with them)."""
        return self.engine.tokenizer, self.engine.formatter

    def run(self, job: int, method: str, rows: list[Any], kwargs: dict[str, Any]) -> tuple[str, Any, float]:
        """Run ``engine.<method>(rows, **kwargs)``: ``("ok", results, seconds)``, ``("cancelled", partial, s)``
        (finished rows kept, the others None) or ``("error", (exception, traceback text), s)``."""
        with self._lock:
            start = time.perf_counter()
            with self._state:
                if job in self._cancelled:
                    return "cancelled", [None] * len(rows), 0.0
                self._current = job
            try:
                if self._delay_s:
                    time.sleep(self._delay_s)
                    with self._state:
                        if job in self._cancelled:
                            return "cancelled", [None] * len(rows), time.perf_counter() - start
                results = getattr(self.engine, method)(rows, progress=False, **kwargs)
                return "ok", results, time.perf_counter() - start
            except GenerationCancelled as stopped:
                kept = [r if getattr(r, "stop_reason", "cancelled") != "cancelled" else None for r in stopped.partial]
                return "cancelled", kept + [None] * (len(rows) - len(kept)), time.perf_counter() - start
            except Exception as exc:  # noqa: BLE001  (sent back whole: the pool re-raises it as it was)
                return "error", (_picklable(exc), traceback.format_exc()), time.perf_counter() - start
            finally:
                with self._state:
                    self._current = None

    def cancel(self, job: int, timeout_s: float = 30.0) -> bool:
        """Stop ``job`` here: chunks not started return at once, the running one within a decode step."""
        with self._state:
            self._cancelled.add(job)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._state:
                if self._current != job:
                    return True
                if self.engine is not None and self.engine.cancel():
                    return True
            time.sleep(0.005)  # the chunk is between taking the lock and starting its call: try again
        return False

    def set_delay(self, seconds: float) -> None:
        """Test hook: every later chunk waits ``seconds`` inside the call before it generates (so a test can
        kill the replica mid-call)."""
        self._delay_s = float(seconds)

    def set_quantization(self, mode: str | None) -> Any:
        with self._lock:
            self.engine.set_quantization(mode, progress=False)
            return self.engine.settings

    def info(self) -> dict[str, Any]:
        return dict(self.engine.info())

    def memory(self) -> dict[str, Any]:
        return dict(self.engine.memory())

    def close(self) -> list[int]:
        """Unload the engine (its model-parallel workers stop); returns the processes still below this one."""
        self.engine = None
        wb.unload()
        return descendants(os.getpid())


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (to travel back to the pool), else a WorkbenchError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001  (an exception holding an unpicklable value)
        return WorkbenchError(f"{type(exc).__name__}: {exc}")


def remote_class() -> Any:
    """The Ray actor class of :class:`Replica` (threaded; never restarted by Ray: the pool replaces it)."""
    import ray

    return ray.remote(max_concurrency=MAX_CONCURRENCY, max_restarts=0)(Replica)
