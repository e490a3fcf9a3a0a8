"""The generation layer: the scheduler (continuous batching over a static KV cache), sampling, structured-output
token masks and scoring.  Layers above import the request and event records from here, not from the modules."""

from workbench.generation.generator import Event, Request, RowCancel
from workbench.generation.sampling import SamplingParams

__all__ = ["Event", "Request", "RowCancel", "SamplingParams"]
