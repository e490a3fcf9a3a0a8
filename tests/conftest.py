"""Shared fixtures and how the suite runs on both cores (docs/test-suite.md has the whole story).

How a run is laid out
  ``python -m pytest -q`` runs on pytest-xdist workers (``-n auto --dist loadfile``, from pyproject's addopts;
  ``-n 0`` runs in one process, for ``--pdb`` or ``-s``).  Every test runs in a group (:func:`group_of`, used by
  the scheduler made in :func:`pytest_xdist_make_scheduler`): by default its file, so a file's tests run in
  order on one worker and its module fixtures load once; files that use one machine-wide resource share a
  group (``SERIAL``) and never overlap; a long test named in ``OWN_GROUP`` runs beside the rest of its file.
  Groups are handed out longest first (``LONGEST_FIRST``), so a long file never starts last.
  Each worker runs torch on one thread (two workers on two cores; children inherit ``OMP_NUM_THREADS=1``).

Fixtures for new tests (use these before loading anything yourself)
  ``make_checkpoint(params, n_shards=1, layout="modules", seed=0)`` -> folder: a tiny random-weight checkpoint
      in Meta's layout, written once per run (one writer across workers, a file lock), read-only for tests
      (copy it to edit: ``shutil.copytree(llama3_dir, tmp_path / "ckpt")``).
  ``llama3_dir``, ``llama4_dir``: the two tiny checkpoints most tests use (``TINY_LLAMA3``, ``TINY_LLAMA4``).
  ``tiny_llama3_engine``, ``tiny_llama4_engine``: engines on them (``max_batch_size=4, max_seq_len=256``),
      loaded once per worker and shared by every file that asks; a test that changes one (quantization,
      compile, its runner, close) builds its own with ``build_engine(resolve_settings(...))`` instead.
  ``demo_engine``: the embedded demo model as ``wb.load()`` returns it, the kernel singleton: one load shared
      by every module of a worker, unless a test unloads it (tests/test_session.py does, around each test):
      module-scoped, so the next module gets it loaded again rather than a closed engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from filelock import FileLock
from xdist.scheduler import LoadFileScheduling

import workbench as wb
from workbench.checkpoints.factory import TINY_LLAMA3, TINY_LLAMA4, write_checkpoint
from workbench.config import ENV_VARS
from workbench.session import build_engine, resolve_settings

CheckpointMaker = Callable[..., Path]

# Files that share one machine-wide resource run one after another on one worker: each starts its own local
# Ray (the module's pool, a two-node cluster, the notebook's pool), and two Rays starting together on two
# cores miss Ray's 30 s node-registration window.
SERIAL = {
    "tests/test_cluster.py": "ray",
    "notebooks/05_scale_out.ipynb": "ray",
}

# Long tests that use no module fixture worth sharing: each is a group of its own (its node id), so it runs
# beside the rest of its file instead of after it.
OWN_GROUP = (
    "tests/test_throughput.py::test_compiled_decode_gives_the_eager_tokens",
    "tests/test_quantization.py::test_model_parallel_2_matches_1",
)

# Groups in the order workers take them: the longest first (measured, docs/test-suite.md), so the run ends on
# short files.  A group not listed goes after these, in collection order.
LONGEST_FIRST = (
    "ray",
    "tests/test_parallel.py",
    "tests/test_throughput.py::test_compiled_decode_gives_the_eager_tokens[llama3]",
    "tests/test_user_install.py",
    "tests/test_quantization.py",
    "tests/test_engine.py",
    "tests/test_browser.py",
    "tests/test_throughput.py::test_compiled_decode_gives_the_eager_tokens[llama4]",
    "tests/test_session.py",
    "tests/test_structured.py",
    "tests/test_runs_engine.py",
    "tests/test_throughput.py",
    "tests/test_quantization.py::test_model_parallel_2_matches_1[llama4-modes1]",
    "notebooks/03_throughput.ipynb",
    "tests/test_lm_eval.py",
    "notebooks/02_tool_experiments.ipynb",
    "tests/test_vision_engine.py",
    "tests/test_quantization.py::test_model_parallel_2_matches_1[llama3-modes0]",
    "tests/test_demo_model.py",
    "tests/test_demo_train.py",
    "tests/test_vision32_engine.py",
    "tests/test_runs_store.py",
    "tests/test_cli.py",
    "notebooks/04_quantization.ipynb",
    "tests/test_serve.py",
    "tests/test_engine_score.py",
    "tests/test_parity.py",
    "tests/test_llama_stack_api.py",
    "notebooks/06_evaluations.ipynb",
    "tests/test_inspect.py",
    "tests/test_batches.py",
    "notebooks/01_quickstart.ipynb",
    "tests/test_batch_stream.py",
    "tests/test_stored_notebooks.py",
)

# Notebooks that the real-browser test runs whole (Run All Cells in JupyterLab; it fails on an error output or a
# cell that did not run, as nbval does): nbval's own run of them would make the same check a second time, so it
# is left out of a session that runs that test.  Where the browser test does not run (deselected, as with
# ``-m "not slow"``, or skipped for want of Chromium outside CI), nbval runs them as usual.
RUN_IN_BROWSER = (
    "tests/test_browser.py::test_playground_and_plot_in_a_real_browser",
    ("notebooks/02_tool_experiments.ipynb", "notebooks/03_throughput.ipynb"),
)

MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824"

_HOST_ENV = pytest.MonkeyPatch()


def pytest_configure(config: pytest.Config) -> None:
    """The process's environment for every test, and every child a test starts (notebook kernels included,
    which nbval starts before any fixture runs, hence here and not in a fixture):

    * no Llama Stack variables or checkpoints.toml pointer from the host;
    * Batch API files and records of the servers tests start, and rows stored by tests (``run=``), in this
      process's own temporary folders, never the user's (a test that counts rows points ``WORKBENCH_STORE``
      at its own file);
    * a worker of a parallel run takes one core: torch on one thread, here and in its children;
    * the processes started from here keep freed heap memory for reuse (``MALLOC_TUNABLES``).
    """
    for var in (*ENV_VARS.values(), "WORKBENCH_CHECKPOINTS"):
        _HOST_ENV.delenv(var, raising=False)
    scratch = Path(tempfile.mkdtemp(prefix="workbench-tests-"))
    _HOST_ENV.setattr(config, "workbench_scratch", scratch, raising=False)
    for name in ("workbench-data", "workbench-store"):
        (scratch / name).mkdir()
    _HOST_ENV.setenv("WORKBENCH_DATA_DIR", str(scratch / "workbench-data"))
    _HOST_ENV.setenv("WORKBENCH_STORE", str(scratch / "workbench-store" / "runs.sqlite"))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _HOST_ENV.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # glibc returns freed memory to the OS as soon as the top of the heap is 2x its largest recent block free,
    # so a decode step's vocabulary-wide buffers ([B, 202k] logits, sort indices) page-fault afresh at every
    # step (page faults: most of the suite's system CPU time).  Processes started from here on (xdist's workers,
    # notebook kernels, rank workers, command lines) keep up to 1 GiB of freed heap for reuse instead.
    # (glibc reads this at process start; other C libraries ignore it.)
    if "GLIBC_TUNABLES" not in os.environ:
        _HOST_ENV.setenv("GLIBC_TUNABLES", MALLOC_TUNABLES)
    # torch.compile's on-disk cache (/tmp/torchinductor_$USER by default) is not keyed on the CPU kernels forced
    # with ATEN_CPU_CAPABILITY: a kernel compiled under the AVX2 path and reused under AVX-512 (or the reverse)
    # aborts the process ("free(): invalid pointer").  The suite compiles into its own folder.
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        _HOST_ENV.setenv("TORCHINDUCTOR_CACHE_DIR", str(scratch / "torchinductor"))


def pytest_unconfigure(config: pytest.Config) -> None:
    scratch = getattr(config, "workbench_scratch", None)
    _HOST_ENV.undo()
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def group_of(nodeid: str) -> str:
    """The group a test runs in: its file, unless ``SERIAL`` or ``OWN_GROUP`` says otherwise."""
    if nodeid.startswith(OWN_GROUP):
        return nodeid
    file = nodeid.split("::", 1)[0]
    return SERIAL.get(file, file)


class GroupScheduling(LoadFileScheduling):
    """``--dist loadfile`` with :func:`group_of`'s groups instead of bare files.  (xdist's own ``--dist loadgroup``
    cannot be used: its ``xdist_group`` marks do not reach the node ids under pytest 9.)"""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> GroupScheduling | None:
    """A group's tests run in order on one worker (``--dist loadfile``, the mode in pyproject's addopts)."""
    return GroupScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """True under CI (``CI`` set to anything but empty, 0 or false, as CI services set it)."""
    return environ.get("CI", "").lower() not in ("", "0", "false")


def browser_will_run(
    environ: Mapping[str, str] = os.environ, which: Callable[[str], str | None] = shutil.which
) -> bool:
    """Whether the real-browser test runs rather than skips: Chromium and its driver are on PATH, or this is CI
    (where their absence fails the test instead of skipping it: tests/test_browser.py ``browser_binaries``)."""
    return in_ci(environ) or (which("chromium") is not None and which("chromedriver") is not None)


def repeated_in_browser(nodeids: list[str], browser_runs: bool) -> list[str]:
    """The nbval items of this session whose check the browser test makes too (``RUN_IN_BROWSER``)."""
    test, notebooks = RUN_IN_BROWSER
    if not browser_runs or test not in nodeids:
        return []
    return [nodeid for nodeid in nodeids if nodeid.split("::", 1)[0] in notebooks]


@pytest.hookimpl(trylast=True)  # after -m, -k and --deselect have chosen the session's tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The session's tests, less nbval's runs of the notebooks the browser test runs (``RUN_IN_BROWSER``).  On
    xdist's workers, groups in the order ``LONGEST_FIRST``: the scheduler hands groups out in the order the workers
    collected them (``--no-loadscope-reorder``).  In one process, files keep their order."""
    repeated = set(repeated_in_browser([item.nodeid for item in items], browser_will_run()))
    if repeated:
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in repeated])
        items[:] = [item for item in items if item.nodeid not in repeated]
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    order: dict[str, int] = {}
    for item in items:
        order.setdefault(group_of(item.nodeid), rank.get(group_of(item.nodeid), len(rank) + len(order)))
    items.sort(key=lambda item: order[group_of(item.nodeid)])  # stable: a group keeps its tests' order


def _run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's temporary folder, the same for every worker (xdist gives each worker a folder inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> CheckpointMaker:
    """``make_checkpoint(params, n_shards=1, layout="modules", seed=0)`` -> folder, written once per run: the
    first worker to ask writes it under a file lock, the others wait and read it."""
    shared = _run_folder(tmp_path_factory) / "checkpoints"
    shared.mkdir(exist_ok=True)

    def make(params: dict[str, Any], *, n_shards: int = 1, layout: str = "modules", seed: int = 0) -> Path:
        key = json.dumps([params, n_shards, layout, seed], sort_keys=True)
        folder = shared / f"ckpt-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        with FileLock(f"{folder}.lock"):
            if not folder.exists():  # written aside and renamed: a crashed writer leaves no half checkpoint
                partial = shared / f".partial-{folder.name}"
                write_checkpoint(partial, params, n_shards=n_shards, layout=layout, seed=seed)
                os.replace(partial, folder)
        return folder

    return make


@pytest.fixture(scope="session")
def llama3_dir(make_checkpoint: CheckpointMaker) -> Path:
    return make_checkpoint(TINY_LLAMA3)


@pytest.fixture(scope="session")
def llama4_dir(make_checkpoint: CheckpointMaker) -> Path:
    return make_checkpoint(TINY_LLAMA4)


@pytest.fixture(scope="session")
def tiny_llama3_engine(llama3_dir: Path) -> Iterator[wb.Engine]:
    """The tiny Llama 3 checkpoint's engine, shared by every test that asks (do not change or close it)."""
    engine = build_engine(resolve_settings(llama3_dir, max_batch_size=4, max_seq_len=256))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tiny_llama4_engine(llama4_dir: Path) -> Iterator[wb.Engine]:
    """The tiny Llama 4 checkpoint's engine, shared by every test that asks (do not change or close it)."""
    engine = build_engine(resolve_settings(llama4_dir, max_batch_size=4, max_seq_len=256))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def demo_engine() -> wb.Engine:
    """The demo model as ``wb.load()`` gives it: the kernel singleton, loaded once and the same object for every
    module until a test unloads it (the next module then loads it again)."""
    return wb.load()
