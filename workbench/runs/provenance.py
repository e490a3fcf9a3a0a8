"""What a run records about where its rows came from: the engine (checkpoint identity and path, model,
load settings, device) and the environment (workbench, torch and Python versions, host, the git commit
of the working folder), so a number can be traced and reproduced a week later.

:class:`Provenance` holds what the caller knows (plain values; :meth:`Provenance.of` fills them from an
engine's resolved :class:`~workbench.runtime.settings.Settings`); :func:`environment` adds what every
process can find out for itself.  Nothing here raises for a missing piece: no git, no repository, an
unknown version are recorded as None.
"""

from __future__ import annotations

import getpass
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from workbench.errors import InputError
from workbench.runs.identity import CheckpointIdentity
from workbench.runs.keys import NUMERICS_VERSION, load_fields
from workbench.runtime.settings import Settings

GIT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Provenance:
    """The engine side of a run: the checkpoint ``identity`` its keys carry, the ``load`` settings that change
    numbers (:func:`~workbench.runs.keys.load_fields`), and what is only recorded (checkpoint path and file
    hashes, model, device, ``extra``: anything else the caller wants next to the rows, JSON data)."""

    identity: str
    load: Mapping[str, Any]
    checkpoint: str | None = None
    model: str | None = None
    device: str | None = None
    files: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.identity, str) or not self.identity:
            raise InputError(
                f"a run's provenance needs the checkpoint identity (a non-empty string), got "
                f"{self.identity!r}; compute it with Store.checkpoint_identity(folder)"
            )

    @classmethod
    def of(
        cls, settings: Settings, identity: CheckpointIdentity | str, *, model: str | None = None, **extra: Any
    ) -> Provenance:
        """The provenance of an engine loaded with ``settings`` whose checkpoint has ``identity``."""
        files = identity.files if isinstance(identity, CheckpointIdentity) else {}
        return cls(
            identity=str(identity),
            load=load_fields(settings),
            checkpoint=str(settings.checkpoint_dir),
            model=model or settings.model_id,
            device=settings.device,
            files=dict(files),
            extra=extra,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_identity": self.identity,
            "load": dict(self.load),
            "checkpoint_path": self.checkpoint,
            "model": self.model,
            "device": self.device,
            "checkpoint_files": dict(self.files),
            "extra": dict(self.extra),
        }


def package_version(package: str) -> str | None:
    """The installed version of ``package`` (None when it is not installed)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_state(folder: str | Path | None = None) -> dict[str, Any]:
    """The git commit of ``folder`` (default: the working directory: a notebook kernel's is the notebook's
    folder) and whether the work tree has uncommitted changes; Nones when git or a repository is absent."""
    folder = str(folder or os.getcwd())
    state: dict[str, Any] = {"git_commit": None, "git_dirty": None, "git_root": None}

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", folder, *args],
                capture_output=True,
                text=True,
                timeout=GIT_TIMEOUT_S,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit:
        state["git_commit"] = commit
        state["git_root"] = git("rev-parse", "--show-toplevel")
        status = git("status", "--porcelain", "--untracked-files=no")
        state["git_dirty"] = None if status is None else bool(status)
    return state


def environment(folder: str | Path | None = None) -> dict[str, Any]:
    """What this process can say about itself: versions, host, user, pid, working folder and its git commit,
    and the time (UTC, ISO 8601)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = None
    return {
        "workbench_version": package_version("workbench"),
        "torch_version": package_version("torch"),
        "python_version": platform.python_version(),
        "numerics_version": NUMERICS_VERSION,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "user": user,
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "argv0": sys.argv[0] if sys.argv else None,
        **git_state(folder),
        "started_at": now_iso(),
    }


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")
