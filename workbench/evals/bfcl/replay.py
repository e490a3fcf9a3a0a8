"""A scripted model that answers BFCL multi-turn entries with their ground truth: the harness's own check.

``bfcl.run(GroundTruthEngine(categories, engine=demo), categories)`` must score every entry as BFCL's checker scores
the ground truth itself; edit ``script`` to see a wrong reply fail the way BFCL fails it.  Each turn's ground-truth
calls come as one reply (Llama 3.1's JSON format: one reply per call), then a text reply ends the turn.

The ground truth is BFCL's data (call strings such as ``"sort('final_report.pdf')"``); it is read with
``ast.literal_eval`` of each argument — never ``eval`` — and positional arguments are named by the backend
method's signature.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Sequence
from typing import Any

from workbench.formats import render_tool_call
from workbench.types import ChatCompletion, Completion, Message, ToolCall

from .backends import Backends
from .package import load_multi_turn_entries

#: The text reply that ends a turn (no call).
END_OF_TURN = "Done."


def parse_ground_truth(entry: dict[str, Any]) -> list[list[ToolCall]]:
    """An entry's ground truth as parsed calls, per turn (positional arguments named by the method's signature)."""
    methods = Backends.for_entry(entry).methods
    turns = []
    for turn in entry["ground_truth"]:
        calls = []
        for text in turn:
            node = ast.parse(text, mode="eval").body
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                raise ValueError(f"not a call of a name: {text!r}")
            names = list(inspect.signature(methods[node.func.id]).parameters)
            args = {names[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
            args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg})
            calls.append(ToolCall(tool_name=node.func.id, arguments=args))
        turns.append(calls)
    return turns


class GroundTruthEngine:
    """Replies with each entry's ground truth, step by step: a chat engine (``batch_chat_completion``, the
    official route) and, given a real ``engine`` for its tokenizer and formatter, a completion engine
    (``batch_completion``, ``prompt="bfcl"``).

    ``script[entry_id]`` is the list of replies still to come: each a list of calls (an empty list: a text
    reply, which ends the turn).  ``calls`` counts the engine calls, ``rows`` the replies of each.  ``parsed``:
    the ground truth already parsed (:func:`parse_ground_truth` by entry id), to build several engines cheaply."""

    model_id = "BFCL ground truth"

    def __init__(
        self,
        categories: Sequence[str],
        *,
        limit: int | None = None,
        engine: Any = None,
        one_call_per_reply: bool = False,
        parsed: dict[str, list[list[ToolCall]]] | None = None,
    ) -> None:
        self.order: list[str] = []
        self.script: dict[str, list[list[ToolCall]]] = {}
        for category in categories:
            for entry in load_multi_turn_entries(category, limit):
                self.order.append(entry["id"])
                steps: list[list[ToolCall]] = []
                turns = parsed[entry["id"]] if parsed is not None else parse_ground_truth(entry)
                for calls in turns:
                    steps += [[c] for c in calls] if one_call_per_reply else ([calls] if calls else [])
                    steps.append([])
                self.script[entry["id"]] = steps
        if engine is not None:
            self.formatter, self.tokenizer, self.max_seq_len = engine.formatter, engine.tokenizer, engine.max_seq_len
        self._by_first: dict[int, str] = {}
        self.rows: list[int] = []

    @property
    def calls(self) -> int:
        return len(self.rows)

    def _next(self, entry_id: str) -> list[ToolCall]:
        steps = self.script[entry_id]
        return steps.pop(0) if steps else []

    def batch_chat_completion(self, dialogs: Sequence[Any], tools: Any = None, **kw: Any) -> list[ChatCompletion]:
        """Dialogs are told apart by ``item`` (a run store passes it) or by their first message, matched to the
        entries in order on the first call (every entry starts at once)."""
        self.rows.append(len(dialogs))
        items = kw.get("item")
        if not self._by_first and items is None:
            self._by_first = {id(d[0]): entry_id for d, entry_id in zip(dialogs, self.order)}
        out = []
        for k, dialog in enumerate(dialogs):
            entry_id = items[k] if items is not None else self._by_first[id(dialog[0])]
            calls = [ToolCall(c.tool_name, dict(c.arguments), f"call_{i}") for i, c in enumerate(self._next(entry_id))]
            message = Message(role="assistant", content="" if calls else END_OF_TURN, tool_calls=calls)
            out.append(ChatCompletion(message=message, tokens=[1, 2], stop_reason="end_of_turn"))
        return out

    def batch_completion(self, prompts: Sequence[Any], *, item: Sequence[str], **kw: Any) -> list[Completion]:
        """The replies as the model would write them in the handler's syntax (the formatter's own)."""
        self.rows.append(len(prompts))
        fmt = self.formatter.default_tool_prompt_format
        out = []
        for entry_id in item:
            calls = self._next(entry_id)
            if not calls:
                text = END_OF_TURN
            elif fmt == "python_list":
                text = "[" + ", ".join(render_tool_call(c, "python_list")[1:-1] for c in calls) + "]"
            else:
                text = "".join(render_tool_call(c, fmt) for c in calls)
            out.append(Completion(text=text, tokens=[1, 2], stop_reason="end_of_turn"))
        return out
