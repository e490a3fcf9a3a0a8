"""The ``--tools unseen`` split: cases over generated tools the demo model never trained on.

The demo-tool cases (:func:`~workbench.evals.cases.synthetic_cases`) ask about the 14 tools the model was
trained on, so they cannot tell "knows these tools" from "reads the offered schema".  These cases offer
held-out generated tools (:mod:`workbench.demo.toolgen`: names, subjects and parameter words disjoint from
the training tools by construction), with held-out question frames and values, and score the same way,
plus whether the argument names of every call come from the offered schema (``arg_names_from_schema``).

::

    cases, tools = unseen_cases(150)
    results = run_cases(engine, cases, tools=tools)
"""

from __future__ import annotations

from typing import Any

from workbench.demo.generated import GeneratedDialogs
from workbench.demo.templates import SMALL_TALK
from workbench.evals.cases import EvalCase, Turn

# the kinds rotate, so every kind is represented (small talk: a direct answer though tools are offered)
UNSEEN_KINDS = ("single", "double", "two_round", "no_tool", "small_talk")


def unseen_cases(n: int = 150, *, seed: int = 2024, split: str = "heldout") -> tuple[list[EvalCase], dict[str, Any]]:
    """``n`` cases over the generated tools of ``split`` (``heldout``: never trained on; ``train`` measures
    the training distribution) and the registry of tool name -> definition the harness runs them with."""
    gen = GeneratedDialogs(split, seed=seed, demo_share=0.0)
    cases = []
    for i in range(n):
        kind = UNSEEN_KINDS[i % len(UNSEEN_KINDS)]
        if kind == "small_talk":
            train_q, heldout_q, _ = SMALL_TALK[gen.rng.choice(sorted(SMALL_TALK))]
            question = gen.rng.choice(heldout_q if split == "heldout" else train_q)
            cases.append(EvalCase(f"unseen-{split}-{seed}-{i}", gen.offer(), [Turn(question, [])], kind))
            continue
        dialog = gen.dialog(kind)
        calls = iter(dialog.expected_calls)
        turns = []
        for message in dialog.messages:
            if message.role == "user":
                expected = next(calls) if kind != "no_tool" else []
                turns.append(
                    Turn(message.content, [dict(tool_name=c.tool_name, arguments=dict(c.arguments)) for c in expected])
                )
        cases.append(EvalCase(f"unseen-{split}-{seed}-{i}", list(dialog.tools), turns, kind))
    return cases, gen.registry()
