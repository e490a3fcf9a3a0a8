"""Shared fixtures: tiny random-weight checkpoints in Meta's layout, written once per test session."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workbench.checkpoints.factory import TINY_LLAMA3, TINY_LLAMA4, write_checkpoint
from workbench.config import ENV_VARS

CheckpointMaker = Callable[..., Path]


@pytest.fixture(scope="session", autouse=True)
def no_host_settings():
    """Llama Stack variables or a checkpoints.toml pointer from the host must not leak into any test."""
    with pytest.MonkeyPatch.context() as mp:
        for var in (*ENV_VARS.values(), "WORKBENCH_CHECKPOINTS"):
            mp.delenv(var, raising=False)
        yield


@pytest.fixture(scope="session", autouse=True)
def batch_data_dir(tmp_path_factory: pytest.TempPathFactory):
    """Servers started by tests keep Batch API files and records in a temporary folder, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORKBENCH_DATA_DIR", str(tmp_path_factory.mktemp("workbench-data")))
        yield


@pytest.fixture(scope="session", autouse=True)
def run_store(tmp_path_factory: pytest.TempPathFactory):
    """Rows stored by tests (``run=``) go to a temporary run store, never the user's; a test that counts rows
    points ``WORKBENCH_STORE`` at its own file."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORKBENCH_STORE", str(tmp_path_factory.mktemp("workbench-store") / "runs.sqlite"))
        yield


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> CheckpointMaker:
    """``make_checkpoint(params, n_shards=1, layout="modules", seed=0)`` -> folder (cached per arguments)."""
    made: dict[str, Path] = {}

    def make(params: dict[str, Any], *, n_shards: int = 1, layout: str = "modules", seed: int = 0) -> Path:
        key = json.dumps([params, n_shards, layout, seed], sort_keys=True)
        if key not in made:
            folder = tmp_path_factory.mktemp("ckpt")
            made[key] = write_checkpoint(folder, params, n_shards=n_shards, layout=layout, seed=seed)
        return made[key]

    return make


@pytest.fixture(scope="session")
def llama3_dir(make_checkpoint: CheckpointMaker) -> Path:
    return make_checkpoint(TINY_LLAMA3)


@pytest.fixture(scope="session")
def llama4_dir(make_checkpoint: CheckpointMaker) -> Path:
    return make_checkpoint(TINY_LLAMA4)
