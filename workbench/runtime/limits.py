"""Time limits of the worker protocol (seconds); the first two can be set from the environment."""

from __future__ import annotations

import os


def _seconds_from_env(name: str, default: float) -> float:
    """A positive number of seconds from the environment, else ``default`` (a typo must not break import)."""
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


START_TIMEOUT_S = _seconds_from_env("WORKBENCH_WORKER_START_TIMEOUT", 180.0)  # spawn + import + rendezvous
LOAD_TIMEOUT_S = _seconds_from_env("WORKBENCH_LOAD_TIMEOUT", 4 * 3600.0)  # loading the slices (big models: long)
SYNC_TIMEOUT_S = 60.0  # how long ranks may take to finish a cancelled/failed request
COLLECTIVE_TIMEOUT_S = 600.0  # a collective waiting longer than this on a peer fails instead of hanging
STOP_TIMEOUT_S = 10.0  # graceful exit before workers are terminated
POLL_S = 1.0
