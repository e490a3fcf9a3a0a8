"""Data-parallel engine replicas on Ray: the Engine's batch APIs over many engines, GPUs and nodes.

    import workbench.cluster as wbc

    pool = wbc.load(checkpoint, replicas=4, model_parallel_size=2, device="cuda", address="auto")
    rows = pool.batch_chat_completion(dialogs, tools=[get_weather], max_tokens=64)   # as one engine gives
    job = pool.submit_batch_chat_completion(dialogs)        # a progress bar; job.result(), .cancel(), .partial()
    wb.tools.run_batch(pool, dialogs, tools=[...])          # the tool loop and workbench.evals run on a pool
    table = wbc.sweep([{"quantization": None}, {"quantization": "int4_mixed"}], dialogs, checkpoint=...)
    pool.shutdown()

Modules: :mod:`.pool` (the pool, ``load``), :mod:`.fleet` (the replicas' life cycle: start, death and
replacement, shutdown), :mod:`.replica` (the actor holding one engine),
:mod:`.placement` (placement groups; impossible requests fail at once), :mod:`.jobs` (chunks, progress,
cancel, re-runs after a replica dies), :mod:`.sweep` (a grid of load settings over the same dialogs),
:mod:`.connect` (joining or starting Ray).  Needs ``pip install 'workbench[cluster]'``.
"""

from .connect import connect, disconnect
from .jobs import Job
from .placement import PlacementError
from .pool import ReplicaPool, load
from .sweep import sweep

__all__ = ["Job", "PlacementError", "ReplicaPool", "connect", "disconnect", "load", "sweep"]
