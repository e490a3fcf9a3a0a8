"""Where replicas run: one placement group per replica, holding one bundle with all of its resources.

Why one bundle: a replica with ``model_parallel_size=N`` runs N rank processes that rendezvous over
127.0.0.1 and (on GPUs) NCCL, so all its GPUs must be on one node; a bundle is never split across
nodes.  Why one group per replica: a replica that dies frees exactly its bundle, and its replacement is
scheduled into the same group (on the same node while it lives; Ray re-places the group when a node is
lost).

Requests are checked against the cluster's nodes before anything is reserved: a replica no node can
hold, or more replicas than the cluster can hold, fail at once with the numbers instead of waiting
forever for resources that will never appear.  Resources that exist but are busy are waited for up to
``timeout_s``, then reported the same way.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .connect import import_ray

__all__ = ["PlacementError", "ReplicaResources", "check_fits", "release", "reserve"]


class PlacementError(ConfigError):
    """The cluster cannot hold the requested replicas (the message gives what is needed and what there is)."""


@dataclass(frozen=True)
class ReplicaResources:
    """What one replica asks Ray for: ``gpus`` (one per model-parallel rank on CUDA) and ``cpus``."""

    cpus: float
    gpus: int
    model_parallel_size: int

    @classmethod
    def create(cls, device: str, model_parallel_size: int, cpus_per_replica: float | None = None) -> ReplicaResources:
        """CUDA replicas: one GPU per rank and one CPU; CPU replicas: one CPU per rank (unless ``cpus_per_replica``)."""
        mp = model_parallel_size
        if isinstance(mp, bool) or not isinstance(mp, int) or mp < 1:
            raise ConfigError(f"model_parallel_size must be a positive integer for a replica pool, got {mp!r}")
        cuda = str(device).startswith("cuda")
        if cpus_per_replica is None:
            cpus = 1.0 if cuda else float(mp)
        elif (
            isinstance(cpus_per_replica, bool)
            or not isinstance(cpus_per_replica, (int, float))
            or not math.isfinite(cpus_per_replica)
            or cpus_per_replica <= 0
        ):
            raise ConfigError(f"cpus_per_replica must be a positive number, got {cpus_per_replica!r}")
        else:
            cpus = float(cpus_per_replica)
        return cls(cpus=cpus, gpus=mp if cuda else 0, model_parallel_size=mp)

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus, "GPU": float(self.gpus)} if self.gpus else {"CPU": self.cpus}

    def describe(self) -> str:
        gpus = f"{self.gpus} GPU(s) and " if self.gpus else ""
        return f"{gpus}{self.cpus:g} CPU(s) on one node (model_parallel_size={self.model_parallel_size})"


def _alive_nodes() -> list[dict[str, Any]]:
    ray = import_ray()
    return [n for n in ray.nodes() if n.get("Alive")]


def _fits_on(resources: dict[str, float], need: ReplicaResources) -> int:
    """How many replicas ``resources`` (one node's) can hold."""
    count = math.floor(resources.get("CPU", 0.0) / need.cpus + 1e-9)
    if need.gpus:
        count = min(count, math.floor(resources.get("GPU", 0.0) / need.gpus + 1e-9))
    return max(0, count)


def _node_line(nodes: list[dict[str, Any]], key: str = "Resources") -> str:
    parts = [
        f"{n.get('NodeManagerAddress', '?')}: {n[key].get('GPU', 0):g} GPU, {n[key].get('CPU', 0):g} CPU" for n in nodes
    ]
    return "; ".join(parts) or "no live nodes"


def check_fits(replicas: int, need: ReplicaResources) -> None:
    """Raise PlacementError at once when the cluster's nodes (their total resources) cannot hold the replicas."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(f"replicas must be a positive integer, got {replicas!r}")
    nodes = _alive_nodes()
    per_node = [_fits_on(n.get("Resources", {}), need) for n in nodes]
    gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in nodes)
    cpus = sum(n.get("Resources", {}).get("CPU", 0) for n in nodes)
    if not any(per_node):
        fix = (
            "lower model_parallel_size, use device='cpu', or add a node with enough GPUs"
            if need.gpus
            else "lower model_parallel_size or cpus_per_replica, or add a bigger node"
        )
        raise PlacementError(
            f"no node can hold one replica: it needs {need.describe()}, and the cluster has {len(nodes)} node(s) "
            f"with {gpus:g} GPU(s) and {cpus:g} CPU(s) in all ({_node_line(nodes)}); {fix}"
        )
    if sum(per_node) < replicas:
        raise PlacementError(
            f"{replicas} replicas need {need.describe()} each, but the cluster's {len(nodes)} node(s) can hold only "
            f"{sum(per_node)} ({_node_line(nodes)}); ask for replicas={sum(per_node)} or add nodes"
        )


def reserve(replicas: int, need: ReplicaResources, *, timeout_s: float = 120.0) -> list[Any]:
    """One ready placement group per replica (checked with :func:`check_fits` first).

    Groups whose resources are busy are waited for up to ``timeout_s`` seconds; then every group made here
    is removed and PlacementError says what is free now."""
    ray = import_ray()
    from ray.util.placement_group import placement_group

    check_fits(replicas, need)
    groups = [placement_group([need.bundle()], strategy="STRICT_PACK") for _ in range(replicas)]
    deadline = time.monotonic() + timeout_s
    pending = {g.ready(): g for g in groups}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=max(0.0, deadline - time.monotonic()))
        for ref in ready:
            pending.pop(ref)
        if pending and time.monotonic() >= deadline:
            release(groups)
            free = ray.available_resources()
            raise PlacementError(
                f"{len(pending)} of {replicas} replicas could not be placed within {timeout_s:g} s: each needs "
                f"{need.describe()}; the cluster has them ({_node_line(_alive_nodes())}) but only "
                f"{free.get('GPU', 0):g} GPU(s) and {free.get('CPU', 0):g} CPU(s) are free now (other work holds the "
                "rest); wait for it, raise placement_timeout_s, or ask for fewer replicas"
            )
    return groups


def release(groups: list[Any]) -> None:
    """Remove placement groups (their resources go back to the cluster); already removed ones are skipped."""
    from ray.util.placement_group import remove_placement_group

    for group in groups:
        try:
            remove_placement_group(group)
        except Exception:  # noqa: BLE001  (removed already, or the cluster is gone: nothing left to free)
            pass


def actor_options(group: Any, need: ReplicaResources) -> dict[str, Any]:
    """``Actor.options(...)`` that run one replica inside its group's bundle (its children too)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
    )
    return {"num_cpus": need.cpus, "num_gpus": need.gpus, "scheduling_strategy": strategy}
