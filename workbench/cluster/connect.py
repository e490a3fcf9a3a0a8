"""Joining or starting Ray, and remembering whether workbench started it (so it stops only its own).

``address=None`` joins the Ray this process is already connected to (``ray.is_initialized()``), else
starts a local one on 127.0.0.1; ``"auto"`` or ``"ray://host:port"`` joins a cluster.  A Ray started
here is stopped by :func:`disconnect` (or the pool that started it); one joined is never stopped:
``ray stop`` would end every Ray on the machine, other people's included.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError

__all__ = ["connect", "disconnect", "import_ray", "loopback", "started_here"]

LOCAL_START_ATTEMPTS = 3  # a local Ray that did not come up in time (a loaded machine) is started again
_STARTED = {"here": False}  # True while a Ray started by connect() runs in this process


def import_ray() -> Any:
    """``ray``, or a ConfigError naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "workbench.cluster needs Ray: pip install 'workbench[cluster]' (ray>=2.60,<2.64) on the driver and "
            "on every node of the cluster"
        ) from exc
    return ray


@contextlib.contextmanager
def loopback() -> Iterator[None]:
    """While Ray starts here, bind every one of its processes to 127.0.0.1 (Ray otherwise picks the machine's
    outward address, and a local Ray needs no network).

    Ray decides this from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``, read when ``ray`` is imported: the variable is
    set for the processes Ray starts (they import ray afresh) and the already imported constant for this one;
    both are restored afterwards, so a later connection to a real cluster resolves addresses normally."""
    from ray._private import ray_constants

    key = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    old_env, old_flag = os.environ.get(key), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[key], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_flag
        if old_env is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old_env


def connect(
    address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None, **ray_init: Any
) -> bool:
    """Join a Ray cluster, or start a local Ray; returns True when this call started Ray.

    address: None joins the running Ray when this process already has one, else starts a local one
        (on 127.0.0.1, no dashboard); ``"auto"`` joins the cluster this machine belongs to; ``"ray://host:10001"``
        joins a remote cluster through Ray Client.
    num_cpus, num_gpus: the resources of a local Ray (default: what the machine has).
    ray_init: more keywords for ``ray.init`` (e.g. ``runtime_env``).
    """
    ray = import_ray()
    if ray.is_initialized():  # already connected (an earlier ray.init or pool): join that one
        return False
    if address is not None and not isinstance(address, str):
        raise ConfigError(f"address must be None, 'auto' or 'ray://host:port', got {address!r}")
    if address is None:
        options: dict[str, Any] = {"include_dashboard": False, "num_cpus": num_cpus, "num_gpus": num_gpus}
        options.update(ray_init)
        for attempt in range(LOCAL_START_ATTEMPTS):
            try:
                with loopback():
                    ray.init(**options)
                break
            except Exception as exc:  # Ray gives its node 30 s to register; a busy machine can miss that
                with contextlib.suppress(Exception):
                    ray.shutdown()
                if "timed out during startup" not in str(exc) or attempt == LOCAL_START_ATTEMPTS - 1:
                    raise
        _STARTED["here"] = True
        return True
    if num_cpus is not None or num_gpus is not None:
        raise ConfigError("num_cpus/num_gpus describe a local Ray; a cluster's nodes declare their own resources")
    ray.init(address=address, **ray_init)
    return False


def started_here() -> bool:
    """True while the running Ray was started by :func:`connect` in this process."""
    ray = import_ray()
    return _STARTED["here"] and ray.is_initialized()


def disconnect() -> None:
    """Stop the Ray that :func:`connect` started (a joined cluster is left alone: only this process detaches)."""
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()
    _STARTED["here"] = False
