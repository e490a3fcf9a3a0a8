"""The synthetic tool dialogs of the demo model: rendered by our formatter, and they parse back to their calls."""

from __future__ import annotations

import inspect

import pytest

from workbench.demo import pools
from workbench.demo.data import KINDS, DialogGenerator, encode
from workbench.demo.templates import SPECS
from workbench.demo.tools import DEMO_TOOLS
from workbench.evals.harness import calls_match
from workbench.formats import make_formatter
from workbench.formats.tokenizer import Tokenizer, bundled_tokenizer_path
from workbench.tools import Toolbox


@pytest.fixture(scope="module")
def formatter():
    return make_formatter(Tokenizer(bundled_tokenizer_path("llama4")), None)


def test_demo_tools_are_plain_functions_with_typed_parameters():
    assert len(DEMO_TOOLS) >= 12
    counts = set()
    for name, fn in DEMO_TOOLS.items():
        params = inspect.signature(fn).parameters
        assert 0 <= len(params) <= 3, name
        assert all(p.annotation is not inspect.Parameter.empty for p in params.values()), name
        counts.add(len(params))
        assert name in SPECS, f"{name} has no question templates"
    assert {0, 1, 2, 3} <= counts
    # they turn into tool definitions through the same path as any user tool
    assert len(Toolbox.create(list(DEMO_TOOLS.values())).definitions) == len(DEMO_TOOLS)


def test_train_and_heldout_templates_and_values_are_disjoint():
    for spec in SPECS.values():
        assert spec.train and spec.heldout and not set(spec.train) & set(spec.heldout), spec.name
    for pool in ("CITIES", "COUNTRIES", "FIRST_NAMES", "CURRENCIES", "WORDS", "LANGUAGES", "REMINDERS"):
        items = getattr(pools, pool)
        train, heldout = pools._split(items, "train"), pools._split(items, "heldout")
        assert train and heldout and not set(train) & set(heldout), pool


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_every_rendered_dialog_parses_back_to_its_calls(formatter, split):
    gen = DialogGenerator(split, seed=7, composed=0.7)  # composed phrasings: training questions only
    seen_kinds, offered_counts, double_calls = set(), set(), 0
    for _ in range(150):
        dialog = gen.dialog()
        seen_kinds.add(dialog.kind)
        offered_counts.add(len(dialog.tools))
        encoded = encode(formatter, dialog)
        assert len(encoded.tokens) == len(encoded.targets)
        # cut the target spans (assistant replies) out of the token stream and parse each one back
        spans, current = [], []
        for token, is_target in zip(encoded.tokens, encoded.targets):
            if is_target:
                current.append(token)
            elif current:
                spans.append(current)
                current = []
        if current:
            spans.append(current)
        replies = [m for m in dialog.messages if m.role == "assistant"]
        assert len(spans) == len(replies)
        expected = iter(dialog.expected_calls)
        for span, reply in zip(spans, replies):
            parsed = formatter.decode_assistant_tokens(span)
            assert parsed.parse_error is None
            if reply.tool_calls:
                calls = next(expected)
                assert calls_match(parsed.tool_calls, calls), (formatter.tokenizer.decode(span), calls)
                double_calls += len(calls) == 2
                assert formatter.tokenizer.decode(span[-1:]) == "<|eom|>"
            else:
                assert not parsed.tool_calls and parsed.content == reply.content
                assert formatter.tokenizer.decode(span[-1:]) == "<|eot|>"
        # the final answer restates every tool result of its round
        tool_results = [m.content for m in dialog.messages if m.role == "tool"]
        answers = " ".join(m.content for m in replies if not m.tool_calls)
        assert all(r in answers for r in tool_results)
    assert seen_kinds == set(KINDS)
    assert offered_counts <= {1, 2, 3, 4} and len(offered_counts) >= 3
    assert double_calls > 0


def test_heldout_questions_use_heldout_phrasings(formatter):
    import re

    def pattern(template: str) -> re.Pattern:
        return re.compile(".+".join(re.escape(part) for part in re.split(r"\{\w+\}", template)) + "$")

    train_patterns = [pattern(t) for s in SPECS.values() for t in s.train]
    gen = DialogGenerator("heldout", seed=3)
    for _ in range(60):
        question = gen.dialog("single").messages[0].content
        assert not any(p.match(question) for p in train_patterns), question
    # and the training questions do match a training template (the check can fail)
    train_question = DialogGenerator("train", seed=3).dialog("single").messages[0].content
    assert any(p.match(train_question) for p in train_patterns)


def test_offered_tools_contain_what_the_question_needs_except_in_no_tool_dialogs():
    gen = DialogGenerator("train", seed=11)
    for kind in KINDS:
        for _ in range(30):
            dialog = gen.dialog(kind)
            assert 1 <= len(dialog.tools) <= 4 and len(set(dialog.tools)) == len(dialog.tools)
            if kind == "no_tool":
                assert dialog.needed and dialog.needed[0] not in dialog.tools and not dialog.expected_calls
            elif kind != "small_talk":
                assert set(dialog.needed) <= set(dialog.tools)
                assert [c.tool_name for calls in dialog.expected_calls for c in calls] == dialog.needed


def test_generation_is_deterministic(formatter):
    a = [encode(formatter, d).tokens for d, _ in zip(DialogGenerator("train", seed=5), range(10))]
    b = [encode(formatter, d).tokens for d, _ in zip(DialogGenerator("train", seed=5), range(10))]
    c = [encode(formatter, d).tokens for d, _ in zip(DialogGenerator("train", seed=6), range(10))]
    assert a == b and a != c


def test_composed_training_questions_vary_and_never_hit_a_heldout_phrasing():
    """``--composed``: thousands of distinct phrasings per tool, every field of the tool filled, and
    no composed sentence equal to a held-out template (held-out phrasings stay unseen)."""
    import random
    import re

    from workbench.demo.phrasing import _HELDOUT, _norm, compose

    rng = random.Random(0)
    for name in SPECS:
        drawn = [compose(name, rng) for _ in range(3000)]
        fields = set(inspect.signature(DEMO_TOOLS[name]).parameters)
        assert all(set(re.findall(r"{(\w+)}", t)) == fields for t in drawn), name
        assert not any(_norm(t) in _HELDOUT for t in drawn), name
        assert len(set(drawn)) > 500, (name, len(set(drawn)))
    gen = DialogGenerator("train", seed=1, composed=1.0)
    held = DialogGenerator("heldout", seed=1, composed=1.0)  # composing applies to training only
    assert any(
        d.messages[0].content not in {t for s in SPECS.values() for t in s.train}
        for d in (gen.dialog("single") for _ in range(20))
    )
    heldout_forms = {_norm(t) for s in SPECS.values() for t in s.heldout}
    for _ in range(30):
        d = held.dialog("single")
        spec = SPECS[d.needed[0]]
        args = d.expected_calls[0][0].arguments
        assert any(_norm(t.format(**args)) == _norm(d.messages[0].content) for t in spec.heldout)
    assert heldout_forms


def test_spelling_exercise_writes_vocabulary_words_in_quotes_as_other_tokens(formatter):
    """The spell kind teaches the space form -> quoted form mapping that copying a value into a call needs."""
    from workbench.demo.data import spelling_mix
    from workbench.training.vocab import build_compact_vocab, spelling_words

    tokenizer = formatter.tokenizer
    vocab = build_compact_vocab(tokenizer, sample_dialogs=50)
    words = spelling_words(tokenizer, vocab)
    assert len(words) > 1000 and "Oslo" in words and "the" in words
    allowed = set(vocab)
    for word in words[:200]:
        assert tokenizer.encode(" " + word) == tokenizer.encode(" " + word)[:1]  # one token after a space
        assert all(t in allowed for t in tokenizer.encode(f'"{word}"'))
    gen = DialogGenerator("train", seed=3, spelling_words=words, mix=spelling_mix(1.0))
    seen_forms = set()
    for _ in range(30):
        dialog = gen.dialog()
        assert dialog.kind == "spell" and dialog.expected_calls == []
        question, answer = dialog.messages[0].content, dialog.messages[1].content
        quoted = [w.strip('"') for w in (answer if answer.startswith('"') else question.split(": ", 1)[1]).split(", ")]
        plain = (question.split(": ", 1)[1] if answer.startswith('"') else answer).split(" ")
        assert quoted == plain and all(w in words for w in plain)
        seen_forms.add(answer.startswith('"'))
        encoded = encode(formatter, dialog)
        assert any(encoded.targets)
    assert seen_forms == {True, False}  # both directions
    with pytest.raises(ValueError, match="spelling_words"):
        DialogGenerator("train", seed=3).dialog("spell")


def test_cases_can_take_values_from_the_other_split_than_their_phrasings():
    from workbench.evals import synthetic_cases

    city_pools = {s: set(pools._split(pools.CITIES, s)) for s in ("train", "heldout")}

    def cities(cases):
        return {
            c["arguments"]["city"]
            for case in cases
            for t in case.turns
            for c in t.expected_calls
            if "city" in c["arguments"]
        }

    phrasing_only = synthetic_cases(60, split="heldout", values="train", seed=5, kinds=["single"])
    copying_only = synthetic_cases(60, split="train", values="heldout", seed=5, kinds=["single"])
    assert cities(phrasing_only) and cities(phrasing_only) <= city_pools["train"]
    assert cities(copying_only) and cities(copying_only) <= city_pools["heldout"]  # no made-up words either
    # the phrasings still come from their own split: only held-out questions are held-out templates
    gen_h = DialogGenerator("heldout", seed=5, values="train")
    weather_h = {q for q in (gen_h.dialog("single", offered=["get_weather"]).messages[0].content for _ in range(40))}
    assert any(
        q.startswith("Give me the weather report for")
        or q.startswith("Could you look up the weather")
        or q.startswith("I'm heading to")
        for q in weather_h
    ), weather_h
    # the default stays one split for both
    assert synthetic_cases(5, seed=5)[0].turns[0].user == synthetic_cases(5, seed=5, values="heldout")[0].turns[0].user
    with pytest.raises(ValueError, match="values must be"):
        DialogGenerator("train", values="test")
