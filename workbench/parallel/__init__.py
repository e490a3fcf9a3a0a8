"""Model-parallel workers: one process per rank, driven from the kernel by request-numbered messages.

Why processes: fairscale's layers run one rank per process over torch.distributed, and a notebook
kernel must stay a plain Python process that survives re-run cells, errors and Ctrl-C.  So the
kernel keeps the tokenizer and the Engine, and :class:`ParallelRunner` — the Engine's runner — starts
``model_parallel_size`` workers with the ``spawn`` method (never ``fork``: the kernel holds torch
threads) and talks to them over one pipe per rank.

Protocol
--------
* **Start-up.**  The kernel hosts a ``TCPStore`` on a port the OS picks (bind to port 0: no port
  race) and starts the workers.  Each worker ignores SIGINT (Ctrl-C belongs to the kernel, and
  Jupyter and terminals signal the whole process group), joins the process group (NCCL on CUDA,
  gloo on CPU) plus a gloo *control* group, says ``joined``, loads only its slices
  (``loading.load_model_for_rank``) and says ``ready`` with its memory use, or ``failed`` with its
  exception.  Every wait has a deadline and watches the processes, so a worker that crashes or
  hangs is reported by rank instead of hanging the kernel.
* **Requests.**  Every command carries a request id ``rid`` (1, 2, 3, ...) and goes to every rank,
  the same pickled bytes, in the same order, while SIGINT is deferred — so all ranks see the same
  command sequence.  All ranks run the same :class:`~workbench.generation.generator.Generator` over
  the same requests; rows that sample get a concrete per-row seed in the kernel first, and the
  logits every rank samples from are the all-gathered (identical) vocabulary-parallel outputs, so
  every rank takes the same decisions and runs the same forwards.  Rank 0 streams its events back
  as ``("event", rid, event)``; every rank ends each request with ``("end", rid, rank, status,
  payload)``.
* **Cancellation.**  The kernel never waits on a request it has given up on.  When the consumer
  stops early (Ctrl-C, an exception in a callback, an abandoned stream), the kernel stores ``rid``
  in a shared "cancel every request up to" counter.  Before every forward pass, each rank reads the
  counter and the ranks all-reduce (MAX) the verdict over the control group, so they all stop at the
  *same* forward — no rank is left alone inside a collective.  The next call first *settles*: it
  waits (with a deadline) until every rank has ended every earlier request, discarding their stale
  events, and only then sends the new command.  A request interrupted at any point (even a second
  Ctrl-C during settling) therefore leaves the workers in step, and the next call returns exactly
  what a fresh engine would.
* **Failures.**  An exception raised on every rank (e.g. the same bad input) ends the request on
  every rank and is re-raised in the kernel with its type and the worker's traceback; the engine
  stays usable.  A worker that dies (its pipe closes or its process sentinel fires), or ranks that do
  not finish within ``sync_timeout_s`` after a failure or a cancel, stop the whole pool and raise
  :class:`~workbench.errors.WorkerError` naming the rank and the fix (reload).  Workers exit on
  their own when the kernel goes away (pipe EOF, or their parent pid changes), so a killed kernel
  leaves no orphans.

Time limits: ``WORKBENCH_WORKER_START_TIMEOUT`` (seconds for every rank to spawn, import and join,
default 180) and ``WORKBENCH_LOAD_TIMEOUT`` (seconds to load the slices, default 4 hours); the
liveness of every worker is watched throughout, so a crash is reported at once, not at the limit.
"""

from .pool import ParallelRunner, logical_parameter_count
from .worker import RanksDivergedError, WorkerSpec, worker_main

__all__ = ["ParallelRunner", "RanksDivergedError", "WorkerSpec", "logical_parameter_count", "worker_main"]
