"""The runtime: who owns the model and runs the scheduler.  :class:`LocalRunner` runs it in this process
(model_parallel_size 1); :class:`ParallelRunner` runs one worker process per model-parallel rank (see
:mod:`.wire` for the protocol).  Both have the same interface (``generate``, ``logits``, ``memory``,
``reload``, ``close``), so the Engine works unchanged at any model-parallel size.  Also here: the
resolved :class:`~.settings.Settings` record they are built from and the per-rank model loading
(:mod:`.loading`).
"""

from workbench.runtime.local import LocalRunner
from workbench.runtime.pool import ParallelRunner, logical_parameter_count
from workbench.runtime.worker import RanksDivergedError, WorkerSpec, worker_main

__all__ = [
    "LocalRunner",
    "ParallelRunner",
    "RanksDivergedError",
    "WorkerSpec",
    "logical_parameter_count",
    "worker_main",
]
