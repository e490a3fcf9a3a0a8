"""Dialogs over generated tools (:mod:`workbench.demo.toolgen`): the training source that teaches reading a schema.

A :class:`GeneratedDialogs` draws the same kinds of :class:`~workbench.demo.data.Dialog` as the demo-tool
generator (one call, two calls in one reply, two rounds, the needed tool not offered -> a direct answer),
but over the thousands of generated tools of one split, with a demo tool sometimes offered among them.
Questions name the task with the tool's subject words and mention every value they pass, next to the
words of its parameter ("with max depth 40", "in fast mode", "from kel to varn"), so the call is a
copy of the question's values under the offered schema's names.  Results (strings, numbers, JSON objects)
come from running the tool; the final answer restates them (every field of an object).

Held out: the ``heldout`` split draws other tools (disjoint by construction), other question frames and
other values; ``workbench.evals`` builds its ``--tools unseen`` cases from it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.demo.data import NO_TOOL_ANSWER, Dialog, encode
from workbench.demo.toolgen import SPLITS, GeneratedTool, GenParam, made_up, tool_bank
from workbench.demo.tools import DEMO_TOOLS
from workbench.formats import ToolDefinition, coerce_tool
from workbench.types import Message, ToolCall

GENERATED_MIX = {"single": 0.5, "double": 0.12, "two_round": 0.13, "no_tool": 0.25}

# question frames: {lead} ... ; the held-out ones are never used for training
_GET_LEADS = {
    "train": (
        "What is",
        "Tell me",
        "Get me",
        "Find",
        "Look up",
        "Check",
        "Can you get",
        "I need",
        "Please fetch",
        "Show me",
        "Give me",
        "Could you look up",
        "I'd like to know",
        "Fetch",
        "Can you tell me",
    ),
    "heldout": ("Would you retrieve", "I am after", "Please report", "Any chance you could find", "Kindly give me"),
}
_ACT_LEADS = {
    "train": ("Please {verb}", "Can you {verb}", "I want to {verb}", "{Verb}", "Could you {verb}", "I need to {verb}"),
    "heldout": ("Would you {verb}", "Go ahead and {verb}", "I would like you to {verb}"),
}
_CONVERT_LEADS = {
    "train": ("Convert", "Please convert", "Can you convert", "I need to convert", "How much is it to convert"),
    "heldout": ("Would you convert", "Go ahead and convert"),
}
_OPENERS = {
    "train": ("", "", "", "Hi. ", "Quick question: ", "OK, ", "Hello! ", "So, "),
    "heldout": ("", "", "Good day. ", "One thing: "),
}
_JOINS = {"train": (" with {x}", " using {x}", ", {x}", " and {x}"), "heldout": (" where {x}", " given {x}")}


@dataclass
class ToolDialog(Dialog):
    """A :class:`Dialog` whose offered tools are definitions (generated tools need no Python module)."""

    definitions: list[ToolDefinition] = field(default_factory=list)
    answer_values: list[list[str]] = field(default_factory=list)  # per answered round: what the answer restates

    def tool_functions(self) -> list[Any]:
        return list(self.definitions)


def result_text(result: Any) -> str:
    """A tool result as the tool message carries it (what the tool loop's ``format_result`` writes)."""
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


def restated_values(result: Any) -> list[str]:
    """What an answer must contain to restate ``result``: the text, or every field's value of an object."""
    if isinstance(result, dict):
        return [result_text(v) for v in result.values()]
    return [result_text(result)]


class GeneratedDialogs:
    """Dialogs over the generated tools of one split, deterministic in ``seed``.

    ``demo_share`` is the chance that a demo tool (as a distractor or as the needed tool) joins the offered
    set; ``max_tools`` bounds the offered set as in :class:`~workbench.demo.data.DialogGenerator`.
    """

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        *,
        max_tools: int = 4,
        demo_share: float = 0.15,
        mix: dict[str, float] | None = None,
        bank_size: int | None = None,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        self.split, self.rng = split, random.Random(seed)
        self.tools = tool_bank(split, bank_size)
        self.by_name = {t.name: t for t in self.tools}
        self.max_tools, self.demo_share = max_tools, demo_share
        self.mix = mix or GENERATED_MIX
        self._demo = {name: coerce_tool(fn) for name, fn in DEMO_TOOLS.items()}
        self._calls = 0

    def registry(self) -> dict[str, Any]:
        """Tool name -> definition (with implementation) for every tool these dialogs may offer."""
        return {**self._demo, **{t.name: t.definition() for t in self.tools}}

    # ------------------------------------------------------------------ values and questions
    def value(self, param: GenParam) -> Any:
        """A value for ``param``, from this split's ranges (held-out numbers and words are other ones)."""
        rng, held = self.rng, self.split == "heldout"
        if param.kind == "enum":
            return rng.choice(param.options)
        if param.kind == "boolean":
            return rng.random() < 0.5
        if param.kind == "integer":
            return rng.randint(1000, 4000) if held else rng.choice((rng.randint(1, 99), rng.randint(100, 999)))
        if param.kind in ("number", "amount"):
            return (
                round(rng.uniform(1000, 9000), 1)
                if held
                else rng.choice((rng.randint(1, 500), round(rng.uniform(1, 900), 2)))
            )
        if param.kind in ("from", "to"):
            word = made_up(rng, self.split)
            return word.upper()[:3] if rng.random() < 0.3 else word
        word = made_up(rng, self.split)
        roll = rng.random()
        if roll < 0.5:
            return word.capitalize()
        if roll < 0.7:
            return f"{word.capitalize()} {made_up(rng, self.split).capitalize()}"
        if roll < 0.85:
            return f"{word[:2].upper()}-{rng.randint(10, 999)}"
        return word

    def arguments(self, tool: GeneratedTool) -> dict[str, Any]:
        """Every required parameter and some optional ones (a question mentions exactly these)."""
        return {p.name: self.value(p) for p in tool.params if p.required or self.rng.random() < 0.5}

    def _mention(self, param: GenParam, value: Any) -> str:
        if param.kind == "boolean":
            return f"{'with' if value else 'without'} {param.words}"
        text = _literal(value)
        if param.kind == "enum":
            return self.rng.choice((f"{param.words} {text}", f"{text} {param.words}", f"{param.words} set to {text}"))
        return self.rng.choice(
            (
                f"{param.words} {text}",
                f"{param.words} {text}",
                f"{param.words} of {text}",
                f"{param.words} set to {text}",
            )
        )

    def question(self, tool: GeneratedTool, args: dict[str, Any]) -> str:
        """A question asking for ``tool`` with exactly ``args``: the subject words plus every value next to
        its parameter's words, in one of this split's frames."""
        rng, split = self.rng, self.split
        by_kind = {p.kind: p for p in tool.params}
        if tool.form == "convert":
            amount, source, target = (args[by_kind[k].name] for k in ("amount", "from", "to"))
            lead = rng.choice(_CONVERT_LEADS[split])
            body = f"{lead} {_literal(amount)} {tool.subject} from {source} to {target}"
            return _open(rng.choice(_OPENERS[split]), body + ("?" if lead.startswith(("Can", "Would", "How")) else "."))
        entity, *extras = tool.params
        value = _literal(args[entity.name])
        named = rng.choice((f"{entity.words} {value}", f"the {entity.words} {value}", f"{value}"))
        mentions = [self._mention(p, args[p.name]) for p in extras if p.name in args]
        rng.shuffle(mentions)
        tail = ""
        if mentions:
            listed = mentions[0] if len(mentions) == 1 else ", ".join(mentions[:-1]) + " and " + mentions[-1]
            tail = rng.choice(_JOINS[split]).format(x=listed)
        if tool.form == "act":
            lead = rng.choice(_ACT_LEADS[split]).format(verb=tool.verb, Verb=tool.verb.capitalize())
            body = f"{lead} a {tool.subject} for {named}{tail}"
            ask = lead.startswith(("Can", "Could", "Would"))
        else:
            lead = rng.choice(_GET_LEADS[split])
            body = f"{lead} the {tool.subject} {rng.choice(('of', 'for'))} {named}{tail}"
            ask = lead.startswith(("What", "Can", "Could", "Would", "Any"))
        return _open(rng.choice(_OPENERS[split]), body + ("?" if ask else "."))

    def answer(self, tool: GeneratedTool, args: dict[str, Any], result: Any) -> str:
        """A final answer that restates the result (every field of an object result)."""
        if tool.form == "convert":
            amount = next(args[p.name] for p in tool.params if p.kind == "amount")
            target = next(args[p.name] for p in tool.params if p.kind == "to")
            return f"{_literal(amount)} {tool.subject} is {result_text(result)} {target}."
        about = _literal(args[tool.params[0].name])
        if isinstance(result, dict):
            listed = ", ".join(f"{k.replace('_', ' ')} {result_text(v)}" for k, v in result.items())
            return f"The {tool.subject} for {about}: {listed}."
        if tool.form == "act":
            return f"Done: {result_text(result)}."
        return f"The {tool.subject} for {about} is {result_text(result)}."

    # ------------------------------------------------------------------ dialogs
    def offer(self, needed: Sequence[str] = (), exclude: Sequence[str] = ()) -> list[str]:
        """1..max_tools tool names containing ``needed``, none of ``exclude``, shuffled; a demo tool joins with
        ``demo_share`` per further tool (never alone: these dialogs are about generated tools)."""
        low = max(1, len(set(needed)))
        high = max(self.max_tools, low)
        n = self.rng.choices(range(low, high + 1), weights=[0.6**k for k in range(high - low + 1)])[0]
        offered = list(dict.fromkeys(needed))
        while len(offered) < n:
            if offered and self.rng.random() < self.demo_share:  # never only demo tools
                name = self.rng.choice(list(DEMO_TOOLS))
            else:
                name = self.rng.choice(self.tools).name
            if name not in offered and name not in exclude:
                offered.append(name)
        self.rng.shuffle(offered)
        return offered

    def _round(self, tools: Sequence[GeneratedTool]) -> tuple[list[Message], list[ToolCall], list[str]]:
        all_args = [self.arguments(t) for t in tools]
        question = " ".join(self.question(t, a) for t, a in zip(tools, all_args))
        calls, tool_messages, answers, restated = [], [], [], []
        for tool, args in zip(tools, all_args):
            self._calls += 1
            call = ToolCall(tool_name=tool.name, arguments=dict(args), call_id=f"call_{self._calls}")
            result = tool(**args)
            calls.append(call)
            tool_messages.append(Message(role="tool", content=result_text(result), call_id=call.call_id))
            answers.append(self.answer(tool, args, result))
            restated += restated_values(result)
        messages = [
            Message(role="user", content=question),
            Message(role="assistant", content="", tool_calls=calls, stop_reason="end_of_message"),
            *tool_messages,
            Message(role="assistant", content=" ".join(answers), stop_reason="end_of_turn"),
        ]
        return messages, calls, restated

    def dialog(self, kind: str | None = None, offered: Sequence[str] | None = None) -> ToolDialog:
        """One dialog of ``kind`` (drawn from the mix when None).  With ``offered`` (generated or demo tool
        names) every dialog offers exactly those; its questions then ask for the offered generated tools,
        except ``no_tool`` ones (a batch of such dialogs shares its whole system prompt)."""
        if kind is None:
            kind = self.rng.choices(list(self.mix), weights=list(self.mix.values()))[0]
        fixed = list(offered) if offered else None
        pool = [self.by_name[n] for n in fixed if n in self.by_name] if fixed else list(self.tools)
        if not pool and kind != "no_tool":
            kind = "no_tool"  # only demo tools offered: ask for a generated one they cannot answer
        if kind in ("double", "two_round") and len(pool) < 2 and fixed is not None:
            kind = "single"
        if kind == "no_tool":
            wanted = self.rng.choice([t for t in self.tools if not fixed or t.name not in fixed])
            question = self.question(wanted, self.arguments(wanted))
            names = fixed or self.offer(exclude=[wanted.name])
            messages = [
                Message(role="user", content=question),
                Message(role="assistant", content=NO_TOOL_ANSWER, stop_reason="end_of_turn"),
            ]
            return self._dialog(kind, names, messages, [], [wanted.name], [])
        if kind == "single":
            rounds = [[self.rng.choice(pool)]]
        elif kind == "double":
            rounds = [self.rng.sample(pool, 2)]
        elif kind == "two_round":
            rounds = [[self.rng.choice(pool)], [self.rng.choice(pool)]]
        else:
            raise ValueError(f"unknown generated dialog kind {kind!r}; one of {', '.join(GENERATED_MIX)}")
        messages, calls, restated = [], [], []
        for tools in rounds:
            m, c, r = self._round(tools)
            messages += m
            calls.append(c)
            restated.append(r)
        needed = [t.name for tools in rounds for t in tools]
        return self._dialog(kind, fixed or self.offer(needed), messages, calls, needed, restated)

    def _dialog(
        self,
        kind: str,
        names: list[str],
        messages: list[Message],
        calls: list[list[ToolCall]],
        needed: list[str],
        restated: list[list[str]],
    ) -> ToolDialog:
        definitions = [self._demo[n] if n in self._demo else self.by_name[n].definition() for n in names]
        return ToolDialog(kind, names, messages, calls, needed, definitions=definitions, answer_values=restated)


def _open(opener: str, body: str) -> str:
    """``opener`` before ``body``, lower-casing the body's first letter after a comma ("OK, can you...")."""
    if opener.endswith(", ") and not body.startswith("I "):
        body = body[0].lower() + body[1:]
    return opener + body


def _literal(value: Any) -> str:
    """How a value is written in a question (the model copies it into the call)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def generated_token_ids(formatter: Any, sample_dialogs: int = 1000, seed: int = 12345) -> set[int]:
    """Token ids the generated-tool dialogs use, for the compact training vocabulary: every tool definition
    of both banks as the prompt writes it, and ``sample_dialogs`` dialogs of each split (made-up values are
    drawn fresh every dialog, so the sample covers their pieces: about 99% of a fresh dialog's targets).

    Both splits, as the demo vocabulary holds held-out values: a word's row must exist for the model to
    write it, and the held-out tools are never shown as training targets."""
    encode_text = formatter.tokenizer.encode
    ids: set[int] = set()
    for split in SPLITS:
        for tool in tool_bank(split):
            ids.update(encode_text(json.dumps(tool.schema()["function"])))
            ids.update(encode_text(" ".join(p.name for p in tool.params)))
        gen = GeneratedDialogs(split, seed=seed)
        for _ in range(sample_dialogs):
            ids.update(encode(formatter, gen.dialog()).tokens)
    return ids
