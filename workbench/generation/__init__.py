"""The generation layer: the scheduler (continuous batching over a static KV cache), the prefix cache (what each
cache slot holds and how new rows reuse it), sampling, structured-output token masks and scoring.  Layers above
import the request and event records from here, not from the modules."""

from workbench.generation.request import Event, Request, RowCancel
from workbench.generation.sampling import SamplingParams
from workbench.generation.scheduler import Scheduler

__all__ = ["Event", "Request", "RowCancel", "SamplingParams", "Scheduler"]
