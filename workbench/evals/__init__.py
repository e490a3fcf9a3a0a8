"""Tool-calling evaluation: cases (JSONL), a batched harness that scores every case, summaries, plots.

::

    from workbench import evals
    cases = evals.synthetic_cases(100)                 # or evals.load_cases("my_cases.jsonl")
    results = evals.run_cases(engine, cases)           # one row per case
    evals.summarize(results)                           # accuracy at a glance
    table = evals.compare(engine, cases, [{"tool_prompt_format": "python_list"},
                                          {"quantization": "int4_mixed"}])
    evals.plot_summary(evals.summarize(table, by=["quantization"]))
"""

from workbench.evals.cases import EvalCase, Turn, load_cases, save_cases, synthetic_cases
from workbench.evals.harness import (
    RATES,
    SETTING_KEYS,
    call_key,
    calls_match,
    compare,
    plot_summary,
    rate_table,
    run_cases,
    setting_labels,
    summarize,
)
from workbench.evals.unseen import unseen_cases

__all__ = [
    "RATES",
    "SETTING_KEYS",
    "EvalCase",
    "Turn",
    "call_key",
    "calls_match",
    "compare",
    "load_cases",
    "plot_summary",
    "rate_table",
    "run_cases",
    "save_cases",
    "setting_labels",
    "summarize",
    "synthetic_cases",
    "unseen_cases",
]
