"""The fleet: a pool's replica actors and their life cycle — start, liveness, death and replacement, cancel,
shutdown.

Each replica position (a :class:`Slot`) owns one placement group for the pool's lifetime and holds the actor
living in it now: a replica that dies (its process killed, its node lost) is replaced by a new actor in the same
group, loading the same engine.  The pool's jobs (:mod:`.jobs`) pick live slots with room through
:meth:`Fleet.slots_with_room` and report deaths through :meth:`Fleet.replica_died`; the pool façade
(:mod:`.pool`) changes no slot itself (it reads the first replica's text tools and info).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .placement import ReplicaResources, actor_options, release
from .replica import ReplicaSpec, remote_class

__all__ = ["Fleet", "Slot"]

LOAD_TIMEOUT_S = float(os.environ.get("WORKBENCH_CLUSTER_LOAD_TIMEOUT", 3600))
STOP_TIMEOUT_S = 30.0


@dataclass
class Slot:
    """One replica position: its placement group and the actor living in it now (replaced when it dies)."""

    index: int
    group: Any
    handle: Any = None
    state: str = "starting"  # starting | live | dead | failed | closed
    ready: Any = None  # the load() ref while starting
    info: dict[str, Any] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    inflight: int = 0
    starts: int = 0
    error: str | None = None


class Fleet:
    """The replicas of one pool: one :class:`Slot` per placement group in ``groups``, each running ``spec``."""

    def __init__(self, spec: ReplicaSpec, need: ReplicaResources, groups: list[Any]) -> None:
        self.spec = spec
        self.need = need
        self.slots = [Slot(i, g) for i, g in enumerate(groups)]
        self.deaths = 0
        self.replacements = 0
        self.closed = False
        self._lock = threading.RLock()
        self._actor = remote_class()

    # ----------------------------------------------------------------------------- start-up
    def _start(self, slot: Slot) -> None:
        slot.handle = self._actor.options(**actor_options(slot.group, self.need)).remote(self.spec)
        slot.ready = slot.handle.load.remote()
        slot.state, slot.inflight, slot.starts = "starting", 0, slot.starts + 1

    def start(self) -> None:
        """Start every replica and wait until each has loaded its engine (a replica's own load error is raised
        as it was, after every replica is ended)."""
        import ray

        for slot in self.slots:
            self._start(slot)
        refs = {slot.ready: slot for slot in self.slots}
        try:
            infos = ray.get(list(refs), timeout=LOAD_TIMEOUT_S)
        except Exception as exc:
            self.shutdown()
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):  # the replica's own error (a bad checkpoint path...): as it was
                raise cause from exc
            raise
        for slot, info in zip(self.slots, infos):
            self._went_live(slot, info)

    def _went_live(self, slot: Slot, info: dict[str, Any]) -> None:
        import ray

        slot.info, slot.state, slot.ready, slot.error = info, "live", None, None
        try:
            slot.pids = ray.get(slot.handle.pids.remote(), timeout=STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001  (it died at once: the next chunk finds out and replaces it)
            slot.pids = [info.get("pid")]

    @property
    def head(self) -> dict[str, Any]:
        """What the first replica that ever loaded said about its engine (sizes, settings, where)."""
        for slot in self.slots:
            if slot.info:
                return slot.info
        return {}

    @property
    def live(self) -> int:
        """Replicas ready to take rows now."""
        self.poll_starts()
        return sum(s.state == "live" for s in self.slots)

    def live_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.state == "live"]

    def set_quantization(self, mode: str | None) -> Any:
        """Re-load every live replica under ``mode`` (a replacement started later loads it too); the first one's
        new settings."""
        import ray

        live = self.live_slots()
        settings = ray.get([s.handle.set_quantization.remote(mode) for s in live])
        self.spec.load_kwargs["quantization"] = mode
        for slot, s in zip(live, settings):
            slot.info["settings"] = s
        return settings[0]

    def wait_ready(self, timeout_s: float = LOAD_TIMEOUT_S) -> int:
        """Wait until no replacement is still loading (or ``timeout_s``); returns the live replicas."""
        import ray

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            refs = self.starting_refs()
            if not refs:
                break
            ready, _ = ray.wait(refs, num_returns=1, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            for ref in ready:
                self.finish_start(ref)
        return self.live

    def poll_starts(self) -> None:
        """Take in replacements that finished loading while no job was running."""
        import ray

        refs = self.starting_refs()
        if refs:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                self.finish_start(ref)

    def describe(self) -> list[dict[str, Any]]:
        """Each replica: index, state, node, host, pid, GPUs, and how often it was started."""
        self.poll_starts()
        return [
            {
                "index": s.index,
                "state": s.state,
                "node_id": s.info.get("node_id"),
                "host": s.info.get("host"),
                "pid": s.info.get("pid"),
                "cuda_visible_devices": s.info.get("cuda_visible_devices"),
                "starts": s.starts,
                "error": s.error,
            }
            for s in self.slots
        ]

    # ----------------------------------------------------------------------------- what jobs use
    def slots_with_room(self, pipeline: int) -> list[Slot]:
        """Live slots with fewer than ``pipeline`` chunks queued, the least busy first."""
        with self._lock:
            live = [s for s in self.slots if s.state == "live" and s.inflight < pipeline]
        return sorted(live, key=lambda s: s.inflight)

    def starting_refs(self) -> list[Any]:
        """The load() refs of replacements still starting (a job waits on them with its chunks)."""
        with self._lock:
            return [s.ready for s in self.slots if s.state == "starting" and s.ready is not None]

    def finish_start(self, ref: Any) -> None:
        """A replacement's load() returned: it goes live, or is marked failed with its error."""
        import ray

        with self._lock:
            slot = next((s for s in self.slots if s.ready is ref), None)
            if slot is None or slot.state != "starting":
                return
            try:
                info = ray.get(ref)
            except Exception as exc:  # noqa: BLE001  (recorded; the job fails only when no replica is left)
                slot.state, slot.ready = "failed", None
                slot.error = f"{type(exc).__name__}: {str(exc)[:300]}"
                return
            self._went_live(slot, info)
            self.replacements += 1

    def replica_died(self, slot: Slot, handle: Any, exc: BaseException) -> None:
        """``handle`` (slot's actor) is gone: count it and start a replacement in the same placement group."""
        import ray

        with self._lock:
            if slot.handle is not handle or slot.state != "live" or self.closed:
                return  # already replaced (another job saw it first)
            slot.state, slot.error = "dead", f"{type(exc).__name__}"
            self.deaths += 1
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001  (already gone)
                pass
            self._start(slot)

    def cancel_job(self, job_id: int) -> None:
        """Ask every live replica to stop ``job_id`` (its chunks not started return at once)."""
        with self._lock:
            handles = [s.handle for s in self.slots if s.state == "live"]
        for handle in handles:
            try:
                handle.cancel.remote(job_id)
            except Exception:  # noqa: BLE001  (a dead replica has nothing to cancel)
                pass

    def failure_summary(self) -> str:
        parts = [f"replica {s.index}: {s.state}" + (f" ({s.error})" if s.error else "") for s in self.slots]
        return f"{self.deaths} died, {self.replacements} replaced; " + ", ".join(parts)

    # ----------------------------------------------------------------------------- shutdown
    def pids(self) -> list[int]:
        """Every process of every replica (actor processes and their model-parallel workers), as last seen."""
        return sorted({p for s in self.slots for p in s.pids if p})

    def _local_pids(self) -> list[int]:
        """The replicas' processes on this machine (pids of other hosts mean nothing here)."""
        here = socket.gethostname()
        return sorted({p for s in self.slots if s.info.get("host") == here for p in s.pids if p})

    def shutdown(self) -> None:
        """End every replica and its model-parallel workers and free their placement groups; waits until the
        replicas' processes on this machine have exited."""
        import ray

        if self.closed:
            return
        self.closed = True
        handles = [s.handle for s in self.slots if s.handle is not None]
        local = self._local_pids()
        closing = [h.close.remote() for h in handles]
        try:
            if closing:
                ray.wait(closing, num_returns=len(closing), timeout=STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001  (dead replicas answer with errors: they are gone already)
            pass
        for handle in handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        for slot in self.slots:
            slot.state = "closed"
        _wait_gone(local, STOP_TIMEOUT_S)
        release([s.group for s in self.slots])


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:
                break
            time.sleep(0.05)
