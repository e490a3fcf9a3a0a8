"""BFCL (the Berkeley Function Calling Leaderboard) on a workbench engine: batched, scored by BFCL's own checker.

::

    from workbench.evals import bfcl
    results = bfcl.run(engine, ["simple_python", "multiple", "irrelevance"], limit=20)   # one row per entry
    bfcl.summarize(results)                     # accuracy per category, as BFCL counts it
    both = pd.concat([results, bfcl.run(engine, limit=20, prompt="bfcl")])
    bfcl.plot(bfcl.summarize(both))             # the model's own format against BFCL's prompt

Needs the ``bfcl-eval`` package (``pip install --no-deps bfcl-eval==2026.3.23``); its data, ground truth and
checker are read from the installed package.  ``python -m workbench.evals.bfcl --help`` runs it from a shell.
"""

from .package import AST_CATEGORIES, RELEVANCE_CATEGORIES, SUPPORTED_CATEGORIES, BFCLError, to_openai_tool
from .runner import DEFAULT_CATEGORIES, PROMPTS, encode_entry, plot, run, summarize

__all__ = [
    "AST_CATEGORIES",
    "DEFAULT_CATEGORIES",
    "PROMPTS",
    "RELEVANCE_CATEGORIES",
    "SUPPORTED_CATEGORIES",
    "BFCLError",
    "encode_entry",
    "plot",
    "run",
    "summarize",
    "to_openai_tool",
]
