"""The protocol between the kernel and the model-parallel workers, and how values cross their pipes.

The kernel side is :class:`~workbench.runtime.pool.ParallelRunner`, the worker side
:mod:`~workbench.runtime.worker`; both follow this:

* **Start-up.**  The kernel hosts a ``TCPStore`` on a port the OS picks (bind to port 0: no port
  race) and starts the workers.  Each worker ignores SIGINT (Ctrl-C belongs to the kernel, and
  Jupyter and terminals signal the whole process group), joins the process group (NCCL on CUDA,
  gloo on CPU) plus a gloo *control* group, says ``joined``, loads only its slices
  (``loading.load_model_for_rank``) and says ``ready`` with its memory use, or ``failed`` with its
  exception.  Every wait has a deadline and watches the processes, so a worker that crashes or
  hangs is reported by rank instead of hanging the kernel.
* **Requests.**  Every command carries a request id ``rid`` (1, 2, 3, ...) and goes to every rank,
  the same pickled bytes, in the same order, while SIGINT is deferred — so all ranks see the same
  command sequence.  All ranks run the same :class:`~workbench.generation.scheduler.Scheduler` over
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

What crosses a pipe is pickled; the helpers here give the values that would not travel as they are a form
both sides agree on: a row's images (numpy arrays, pickled by value) and a worker's exception (plain data).
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any

import torch

from workbench.models.cross_attention import ImageSet


def images_to_wire(images: Any) -> Any:
    """A row's images for the workers, as numpy arrays: pickled by value.  torch tensors would travel as
    shared-memory handles, which only one receiver can open, and the same bytes go to every rank."""
    return images.to_numpy() if isinstance(images, ImageSet) else images.cpu().numpy()


def images_from_wire(images: Any) -> Any:
    """The inverse of :func:`images_to_wire`, on a worker."""
    return images.to_torch() if isinstance(images, ImageSet) else torch.from_numpy(images)


def exception_to_wire(exc: BaseException) -> dict[str, Any]:
    """A worker's exception as plain data (plus the pickled exception when it survives a round trip): the
    payload of ``("failed", rank, info)`` and of an ``("end", ...)`` with status ``"error"``."""
    try:
        blob: bytes | None = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "pickled": blob,
    }


class RemoteTraceback(Exception):
    """Carries a worker's traceback text as the ``__cause__`` of the error raised in the kernel."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text
