"""Inspect (``inspect-ai``) on a workbench engine: the ``workbench`` model provider.

::

    inspect eval task.py --model workbench/default                  # the embedded demo model
    inspect eval task.py --model workbench/scout -M max_batch_size=32   # a checkpoints.toml entry (or a folder)

    from inspect_ai import eval
    from inspect_ai.model import get_model
    model = get_model("workbench/default", engine=engine, memoize=False)   # the notebook's engine
    eval(task, model=model)

Messages, tools (in the model's official tool-calling format), ``tool_choice``, ``GenerateConfig``
(temperature, top_p, top_k, max_tokens, stop_seqs, seed, logprobs) and usage all map; concurrent samples are
gathered into engine batches.  Installing workbench (``pip install -e ".[inspect]"``) registers the provider
through the ``inspect_ai`` entry point; importing this module registers it too.
"""

from . import _registry  # noqa: F401  (registers the provider)
from .batcher import Batcher, BatchStats
from .provider import UNSUPPORTED_CONFIG, InspectInputError, WorkbenchAPI, sampling_kwargs, to_messages, to_tool

__all__ = [
    "UNSUPPORTED_CONFIG",
    "BatchStats",
    "Batcher",
    "InspectInputError",
    "WorkbenchAPI",
    "sampling_kwargs",
    "to_messages",
    "to_tool",
]
