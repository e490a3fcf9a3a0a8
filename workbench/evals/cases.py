"""Tool-calling evaluation cases and their JSONL format.

One case per line::

    {"id": "weather-1", "kind": "single", "tools": ["get_weather", "get_capital"],
     "system": null,
     "turns": [{"user": "What's the weather in Oslo?",
                "expected_calls": [{"tool_name": "get_weather", "arguments": {"city": "Oslo"}}],
                "tool_results": null, "answer_contains": null}]}

* ``tools``: names looked up in the tool registry given to the harness (the demo tools by default).
* ``turns``: user questions asked one after another in the same dialog.  ``expected_calls`` are the
  calls the first reply of the turn must make (order-insensitive; ``[]`` means the model must answer
  directly).  ``tool_results`` (optional) are fed back instead of running the tools, one string per
  expected call; ``answer_contains`` (optional) lists strings the final answer must contain
  (default: the tool results the model was given).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.demo.data import KINDS, DialogGenerator
from workbench.errors import InputError


@dataclass
class Turn:
    user: str
    expected_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[str] | None = None
    answer_contains: list[str] | None = None


@dataclass
class EvalCase:
    id: str
    tools: list[str]
    turns: list[Turn]
    kind: str = ""
    system: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "case") -> EvalCase:
        if not isinstance(data, dict):
            raise InputError(f"{where}: a case must be a JSON object, got {type(data).__name__}")
        missing = [k for k in ("id", "tools", "turns") if k not in data]
        if missing:
            raise InputError(
                f"{where}: missing field(s) {', '.join(missing)}; see workbench.evals.cases for the format"
            )
        turns = data["turns"]
        if not isinstance(turns, list) or not turns:
            raise InputError(f"{where}: 'turns' must be a non-empty list of {{'user': ..., 'expected_calls': [...]}}")
        parsed = []
        for i, t in enumerate(turns):
            if not isinstance(t, dict) or not isinstance(t.get("user"), str):
                raise InputError(f"{where}: turns[{i}] needs a 'user' string")
            calls = t.get("expected_calls") or []
            for c in calls:
                if not isinstance(c, dict) or not isinstance(c.get("tool_name"), str):
                    raise InputError(f"{where}: turns[{i}].expected_calls entries need a 'tool_name' string")
            results = t.get("tool_results")
            if results is not None and len(results) != len(calls):
                raise InputError(
                    f"{where}: turns[{i}] gives {len(results)} tool_results for {len(calls)} expected calls"
                )
            parsed.append(
                Turn(
                    t["user"],
                    [dict(tool_name=c["tool_name"], arguments=dict(c.get("arguments") or {})) for c in calls],
                    results,
                    t.get("answer_contains"),
                )
            )
        if not isinstance(data["tools"], list) or not all(isinstance(n, str) for n in data["tools"]):
            raise InputError(f"{where}: 'tools' must be a list of tool names")
        return cls(str(data["id"]), list(data["tools"]), parsed, str(data.get("kind", "")), data.get("system"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_cases(path: str | Path) -> list[EvalCase]:
    """Cases from a JSONL file (blank lines and lines starting with ``#`` are skipped)."""
    path = Path(path)
    cases = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{n}: not valid JSON ({exc.msg}); each line must be one case object") from None
        cases.append(EvalCase.from_dict(data, f"{path}:{n}"))
    return cases


def save_cases(cases: Iterable[EvalCase], path: str | Path) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(c.to_dict()) + "\n" for c in cases), encoding="utf-8")
    return path


def synthetic_cases(
    n: int = 200,
    *,
    split: str = "heldout",
    seed: int = 2024,
    kinds: Iterable[str] | None = None,
    values: str | None = None,
) -> list[EvalCase]:
    """Cases drawn from the demo-model dialog generator (held-out templates and values by default).

    The kinds rotate (single, double, two_round, no_tool, small_talk) so every kind is represented.
    ``values`` ("train" or "heldout", default: ``split``) takes the argument values from another split
    than the question templates: held-out templates with training values measure phrasing alone,
    training templates with held-out values measure copying unseen values alone.
    """

    gen = DialogGenerator(split, seed=seed, values=values)
    kinds = list(kinds or KINDS)
    cases = []
    for i in range(n):
        dialog = gen.dialog(kinds[i % len(kinds)])
        turns: list[Turn] = []
        calls = iter(dialog.expected_calls)
        for message in dialog.messages:
            if message.role == "user":
                expected = next(calls) if dialog.kind in ("single", "double", "two_round") else []
                turns.append(
                    Turn(message.content, [dict(tool_name=c.tool_name, arguments=dict(c.arguments)) for c in expected])
                )
        cases.append(EvalCase(f"{split}-{seed}-{i}", list(dialog.tools), turns, dialog.kind))
    return cases
