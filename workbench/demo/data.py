"""Synthetic tool dialogs, rendered by the project's own formatter (training sees the inference tokens).

A :class:`Dialog` is a full transcript: the offered tools, user questions, the assistant's calls
(one or two per reply), the tool results (computed by really running the demo tools) and final
answers that restate the results; or a direct answer when no offered tool fits.  ``encode`` turns it
into token ids plus a mask of the assistant tokens (the training targets), using exactly the prompt
that :meth:`Engine.chat_completion` would build.

Kinds of dialog: ``single`` (one call), ``double`` (two calls in one reply), ``two_round`` (two
questions in a row, each answered through a tool), ``no_tool`` (the needed tool is not offered: the
model must answer directly) and ``small_talk``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.demo.phrasing import train_question
from workbench.demo.pools import ValuePools
from workbench.demo.templates import (
    NO_TOOL_ANSWER,
    QUOTE_TEMPLATES,
    REPEAT_HELDOUT,
    REPEAT_TRAIN,
    SMALL_TALK,
    SPECS,
    UNQUOTE_TEMPLATES,
    ToolSpec,
)
from workbench.demo.tools import DEMO_TOOLS
from workbench.formats.results import format_result
from workbench.types import Message, ToolCall

KINDS = ("single", "double", "two_round", "no_tool", "small_talk")
TRAIN_MIX = {"single": 0.40, "double": 0.15, "two_round": 0.17, "no_tool": 0.18, "small_talk": 0.10}
# with the copy exercise (``repeat``): what the training command draws from
COPY_MIX = {**{k: v * 0.85 for k, v in TRAIN_MIX.items()}, "repeat": 0.15}


def spelling_mix(share: float, copy_exercise: bool = False) -> dict[str, float]:
    """The training mix with ``share`` of spelling exercises (``spell``), the rest as before."""
    base = COPY_MIX if copy_exercise else TRAIN_MIX
    return {**{k: v * (1.0 - share) for k, v in base.items()}, "spell": share}


@dataclass
class Dialog:
    """One synthetic dialog: ``messages`` is the whole transcript, ``tools`` the offered tool names."""

    kind: str
    tools: list[str]
    messages: list[Message]
    expected_calls: list[list[ToolCall]] = field(default_factory=list)  # per assistant reply that calls
    needed: list[str] = field(default_factory=list)  # tools the questions ask for (not offered for no_tool)

    def tool_functions(self) -> list[Any]:
        return [DEMO_TOOLS[name] for name in self.tools]


def _question(spec: ToolSpec, args: dict[str, Any], rng: random.Random, split: str, composed: float = 0.0) -> str:
    if split == "train" and composed and rng.random() < composed:
        return train_question(spec.name, args, rng)
    return rng.choice(spec.questions(split)).format(**args)


def _answer(spec: ToolSpec, args: dict[str, Any], result: str) -> str:
    return spec.answer.format(result=result, **args)


class DialogGenerator:
    """Draws dialogs of one split ("train" or "heldout"), deterministic in ``seed``.

    ``values`` draws the argument values from another split than the questions' templates (default:
    the same), so an evaluation can tell unseen phrasings from unseen values apart.
    """

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        *,
        synthetic: float | None = None,
        max_tools: int = 4,
        mix: dict[str, float] | None = None,
        composed: float = 0.0,
        spelling_words: Sequence[str] = (),
        values: str | None = None,
    ) -> None:
        values = values or split
        for name, given in (("split", split), ("values", values)):
            if given not in ("train", "heldout"):
                raise ValueError(f"{name} must be 'train' or 'heldout', got {given!r}")
        self.split = split
        self.rng = random.Random(seed)
        made_up = 0.35 if split == values == "train" else 0.0  # made-up words only among training values
        self.pools = ValuePools(values, self.rng, synthetic=made_up if synthetic is None else synthetic)
        self.max_tools = max_tools
        self.composed = composed  # train split: share of questions composed by ``phrasing`` (the rest: templates)
        self.mix = mix or TRAIN_MIX
        self.spelling_words = list(spelling_words)  # for ``spell`` dialogs (workbench.training.vocab.spelling_words)
        self._call_counter = 0

    # ------------------------------------------------------------------ pieces
    def offer(self) -> list[str]:
        """A tool set to offer a whole batch (1..max_tools tools, fewer more often)."""
        return self._offer([])

    def _offer(self, needed: Sequence[str], exclude: Sequence[str] = ()) -> list[str]:
        """1..max_tools tool names containing ``needed`` (and none of ``exclude``), shuffled."""
        low, high = max(1, len(needed)), max(self.max_tools, len(needed))
        n = self.rng.choices(range(low, high + 1), weights=[0.6**k for k in range(high - low + 1)])[0]
        others = [t for t in SPECS if t not in needed and t not in exclude]
        offered = list(dict.fromkeys(needed)) + self.rng.sample(others, max(0, n - len(set(needed))))
        self.rng.shuffle(offered)
        return offered

    def _call(self, spec: ToolSpec, args: dict[str, Any]) -> tuple[ToolCall, Message, str]:
        self._call_counter += 1
        call = ToolCall(tool_name=spec.name, arguments=dict(args), call_id=f"call_{self._call_counter}")
        result = format_result(DEMO_TOOLS[spec.name](**args))
        return call, Message(role="tool", content=result, call_id=call.call_id), result

    def _round(self, names: Sequence[str]) -> tuple[list[Message], list[ToolCall]]:
        """User question needing ``names`` (1 or 2 tools), the calls, results and final answer."""
        specs = [SPECS[n] for n in names]
        all_args = [s.sample(self.pools) for s in specs]
        if len(specs) == 2 and specs[0].name == specs[1].name and specs[0].name == "get_weather":
            question = self.rng.choice(
                ("What's the weather in {a} and in {b}?", "Weather in {a} and {b}, please.")
                if self.split == "train"
                else ("Compare the weather in {a} with {b}.",)
            )
            question = question.format(a=all_args[0]["city"], b=all_args[1]["city"])
        else:
            question = " ".join(_question(s, a, self.rng, self.split, self.composed) for s, a in zip(specs, all_args))
        calls, results, tool_msgs = [], [], []
        for spec, args in zip(specs, all_args):
            call, msg, result = self._call(spec, args)
            calls.append(call)
            tool_msgs.append(msg)
            results.append(result)
        answer = " ".join(_answer(s, a, r) for s, a, r in zip(specs, all_args, results))
        messages = [
            Message(role="user", content=question),
            Message(role="assistant", content="", tool_calls=calls, stop_reason="end_of_message"),
            *tool_msgs,
            Message(role="assistant", content=answer, stop_reason="end_of_turn"),
        ]
        return messages, calls

    # ------------------------------------------------------------------ dialogs
    def dialog(self, kind: str | None = None, offered: Sequence[str] | None = None) -> Dialog:
        """One dialog of ``kind`` (drawn from the mix when None).  With ``offered`` every dialog offers
        exactly those tools, in that order (the questions then ask for offered tools, except
        ``no_tool`` ones), so a batch of such dialogs shares its whole system prompt."""
        if kind is None:
            kind = self.rng.choices(list(self.mix), weights=list(self.mix.values()))[0]
        names = list(offered) if offered else list(SPECS)
        fixed = list(offered) if offered else None
        if kind in ("double", "two_round") and fixed is not None and len(fixed) < 2 and self.rng.random() < 0.5:
            kind = "single"
        if kind == "single":
            tool = self.rng.choice(names)
            messages, calls = self._round([tool])
            return Dialog(kind, fixed or self._offer([tool]), messages, [calls], [tool])
        if kind == "double":
            first = self.rng.choice(names)
            second = first if self.rng.random() < 0.3 and first == "get_weather" else self.rng.choice(names)
            messages, calls = self._round([first, second])
            return Dialog(kind, fixed or self._offer([first, second]), messages, [calls], [first, second])
        if kind == "two_round":
            first, second = self.rng.choice(names), self.rng.choice(names)
            m1, c1 = self._round([first])
            m2, c2 = self._round([second])
            return Dialog(kind, fixed or self._offer([first, second]), m1 + m2, [c1, c2], [first, second])
        if kind == "no_tool" and fixed is not None:
            wanted = self.rng.choice([t for t in SPECS if t not in fixed])
            spec = SPECS[wanted]
            question = _question(spec, spec.sample(self.pools), self.rng, self.split, self.composed)
            messages = [
                Message(role="user", content=question),
                Message(role="assistant", content=NO_TOOL_ANSWER, stop_reason="end_of_turn"),
            ]
            return Dialog(kind, fixed, messages, [], [wanted])
        if kind == "no_tool":
            wanted = self.rng.choice(names)
            spec = SPECS[wanted]
            question = _question(spec, spec.sample(self.pools), self.rng, self.split, self.composed)
            offered = self._offer([], exclude=[wanted])[: self.rng.randint(1, self.max_tools)]
            messages = [
                Message(role="user", content=question),
                Message(role="assistant", content=NO_TOOL_ANSWER, stop_reason="end_of_turn"),
            ]
            return Dialog(kind, offered, messages, [], [wanted])
        if kind == "small_talk":
            train_q, heldout_q, answer = SMALL_TALK[self.rng.choice(list(SMALL_TALK))]
            question = self.rng.choice(train_q if self.split == "train" else heldout_q)
            messages = [
                Message(role="user", content=question),
                Message(role="assistant", content=answer, stop_reason="end_of_turn"),
            ]
            return Dialog(kind, fixed or self._offer([]), messages, [])
        if kind == "repeat":
            words = " ".join(
                self.pools.made_up(self.rng.random() < 0.5) if self.rng.random() < 0.6 else self.pools.word()
                for _ in range(self.rng.randint(2, 8))
            )
            template = self.rng.choice(REPEAT_TRAIN if self.split == "train" else REPEAT_HELDOUT)
            messages = [
                Message(role="user", content=template.format(words=words)),
                Message(role="assistant", content=words, stop_reason="end_of_turn"),
            ]
            return Dialog(kind, fixed or self._offer([]), messages, [])
        if kind == "spell":
            return self._spell(fixed)
        raise ValueError(f"unknown dialog kind {kind!r}; one of {', '.join(KINDS)}, repeat or spell")

    def _spell(self, fixed: list[str] | None) -> Dialog:
        """A spelling exercise: vocabulary words after spaces (one token each) written in quotes, or back.

        Inside quotes a word is other tokens than after a space (' Oslo' against 'Os', 'lo'), so copying
        a value from a question into a call's quotes means knowing how each word is spelled; a model
        trained from scratch learns that only for words it wrote.  Not a tool call: the words are
        vocabulary, and the tool-call data never shows held-out values as arguments.
        """
        if not self.spelling_words:
            raise ValueError("spell dialogs need spelling_words (workbench.training.vocab.spelling_words)")
        words = self.rng.sample(self.spelling_words, min(len(self.spelling_words), self.rng.randint(8, 24)))
        quoted = ", ".join(f'"{w}"' for w in words)
        if self.rng.random() < 0.7:
            question, answer = self.rng.choice(QUOTE_TEMPLATES).format(words=" ".join(words)), quoted
        else:
            question, answer = self.rng.choice(UNQUOTE_TEMPLATES).format(words=quoted), " ".join(words)
        messages = [
            Message(role="user", content=question),
            Message(role="assistant", content=answer, stop_reason="end_of_turn"),
        ]
        return Dialog("spell", fixed or self._offer([]), messages, [])

    def __iter__(self) -> Iterator[Dialog]:
        while True:
            yield self.dialog()


@dataclass
class EncodedDialog:
    tokens: list[int]  # the whole transcript, as the engine renders it
    targets: list[bool]  # True where the token is written by the assistant (content and end marker)


def encode(formatter: Any, dialog: Dialog, tool_prompt_format: str | None = None) -> EncodedDialog:
    """Token ids of the whole dialog and the assistant-token mask, from the engine's own formatter.

    Each assistant message's tokens are found as the difference between the prompt that ends just
    before it (what the engine sends) and the prompt that includes it, so the targets are exactly
    what the model must produce after the prompt the engine builds.
    """
    tools = dialog.tool_functions()
    tokens: list[int] = []
    targets: list[bool] = []
    for i, message in enumerate(dialog.messages):
        if message.role != "assistant":
            continue
        prompt = formatter.encode_dialog(dialog.messages[:i], tools, tool_prompt_format=tool_prompt_format)
        with_reply = formatter.encode_dialog(dialog.messages[: i + 1], tools, tool_prompt_format=tool_prompt_format)
        if with_reply[: len(prompt)] != prompt or prompt[: len(tokens)] != tokens:
            raise AssertionError("the formatter's rendering is not prefix-stable; cannot derive training targets")
        header = _assistant_header_length(formatter)
        reply = with_reply[len(prompt) : len(with_reply) - header]
        targets += [False] * (len(prompt) - len(tokens)) + [True] * len(reply)
        tokens = prompt + reply
    return EncodedDialog(tokens, targets)


def _assistant_header_length(formatter: Any) -> int:
    """Tokens of the open assistant header that every prompt ends with."""
    empty = formatter.encode_dialog([{"role": "user", "content": ""}])
    bare = formatter.chat.encode_message(Message(role="user", content=""), "json")
    return len(empty) - len(bare) - 1  # minus the begin-of-text token
