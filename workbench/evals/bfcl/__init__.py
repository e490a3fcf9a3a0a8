"""BFCL (the Berkeley Function Calling Leaderboard) on a workbench engine: batched, scored by BFCL's own checker.

::

    from workbench.evals import bfcl
    results = bfcl.run(engine, ["simple_python", "multiple", "irrelevance"], limit=20)   # one row per entry
    bfcl.summarize(results)                     # accuracy per category, as BFCL counts it
    both = pd.concat([results, bfcl.run(engine, limit=20, prompt="bfcl")])
    bfcl.plot(bfcl.summarize(both))             # the model's own format against BFCL's prompt
    mt = bfcl.run(engine, bfcl.MULTI_TURN_CATEGORIES, limit=20, run="mt-bf16")   # dialogs on BFCL's backends
    mt.loc[~mt["valid"], ["id", "error", "failed_turn", "explanation"]]          # why each failed

Needs the ``bfcl-eval`` package (``pip install --no-deps bfcl-eval==2026.3.23``); its data, ground truth and
checker are read from the installed package.  ``python -m workbench.evals.bfcl --help`` runs it from a shell.
"""

from .multi_turn import handler_style, turn_states
from .package import (
    AST_CATEGORIES,
    MULTI_TURN_CATEGORIES,
    RELEVANCE_CATEGORIES,
    SUPPORTED_CATEGORIES,
    BFCLError,
    to_openai_tool,
)
from .replay import GroundTruthEngine
from .runner import DEFAULT_CATEGORIES, PROMPTS, encode_entry, plot, run, summarize

__all__ = [
    "AST_CATEGORIES",
    "DEFAULT_CATEGORIES",
    "MULTI_TURN_CATEGORIES",
    "PROMPTS",
    "RELEVANCE_CATEGORIES",
    "SUPPORTED_CATEGORIES",
    "BFCLError",
    "GroundTruthEngine",
    "encode_entry",
    "handler_style",
    "plot",
    "run",
    "summarize",
    "to_openai_tool",
    "turn_states",
]
