"""Generated tools (workbench.demo.toolgen) and their dialogs (workbench.demo.generated): valid schemas that
render in every official format, values a question really contains, held-out tools disjoint from training."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

import workbench as wb
from workbench.demo import generated, toolgen
from workbench.demo.data import encode
from workbench.demo.generated import GeneratedDialogs, result_text
from workbench.demo.tools import DEMO_TOOLS
from workbench.evals import calls_match
from workbench.formats import TOOL_PROMPT_FORMATS, make_formatter
from workbench.tools import Toolbox


@pytest.fixture(scope="module")
def banks():
    return toolgen.tool_bank("train"), toolgen.tool_bank("heldout")


@pytest.fixture(scope="module")
def formatter():
    return wb.load().formatter  # the demo model's: the formatter training renders with


def test_banks_hold_thousands_of_distinct_tools_of_every_shape(banks):
    train, heldout = banks
    assert len(train) >= 3000 and len(heldout) >= 300
    for bank in banks:
        assert len({t.name for t in bank}) == len(bank)
        assert not {t.name for t in bank} & set(DEMO_TOOLS)
    kinds = {p.kind for t in train for p in t.params}
    assert kinds == {"entity", "string", "integer", "number", "boolean", "enum", "amount", "from", "to"}
    assert {t.form for t in train} == {"get", "act", "convert"}
    assert {t.result for t in train} == {"string", "number", "object"}
    assert {len(t.params) for t in train} >= {1, 2, 3, 4}
    assert any(not p.required for t in train for p in t.params)


def test_heldout_tools_are_disjoint_from_training_tools(banks):
    train, heldout = banks
    toolgen.check_disjoint(train, heldout)  # names and subjects
    assert not {t.name for t in train} & {t.name for t in heldout}
    assert not {t.subject.split()[0] for t in train} & {t.subject.split()[0] for t in heldout}
    # the check really fails on an overlap
    with pytest.raises(AssertionError, match="overlap"):
        toolgen.check_disjoint(train, (*heldout, train[0]))
    # the generator is deterministic: the same banks every time (so "held out" means the same tools)
    rng_a, rng_b = random.Random("x"), random.Random("x")
    assert toolgen.draw_tool(rng_a, "heldout") == toolgen.draw_tool(rng_b, "heldout")


def test_every_generated_schema_is_valid_json_schema(banks):
    meta = jsonschema.Draft202012Validator
    for bank in banks:
        for tool in bank:
            schema = tool.schema()
            assert schema["type"] == "function" and schema["function"]["name"] == tool.name
            parameters = schema["function"]["parameters"]
            meta.check_schema(parameters)  # raises SchemaError on an invalid schema
            assert set(parameters["required"]) <= set(parameters["properties"])
            for prop in parameters["properties"].values():
                assert prop["type"] in ("string", "integer", "number", "boolean") and prop["description"]
                if "enum" in prop:
                    assert prop["type"] == "string" and len(set(prop["enum"])) == len(prop["enum"]) >= 2
            # the definition the formatter takes keeps the schema (types, enum, required)
            assert tool.definition().to_openai()["function"]["parameters"] == parameters


# the official formats: Llama 3.1 takes custom tools as json or function_tag, Llama 3.2/3.3/4 as python_list
@pytest.mark.parametrize(
    ("model_id", "formats"),
    [
        ("Llama3.1-8B-Instruct", ("json", "function_tag")),
        ("Llama3.2-3B-Instruct", ("python_list",)),
        (None, ("python_list",)),
    ],
)
def test_generated_tools_render_in_every_official_prompt_format(formatter, banks, model_id, formats):
    train, heldout = banks
    fmt_maker = make_formatter(formatter.tokenizer, model_id)
    sample = list(heldout[:60]) + random.Random(0).sample(list(train), 60)
    assert set(formats) <= set(TOOL_PROMPT_FORMATS)
    for fmt in formats:
        for i in range(0, len(sample), 4):
            tools = sample[i : i + 4]
            sent, used = fmt_maker.prepare_dialog(
                [{"role": "user", "content": "hi"}], [t.definition() for t in tools], tool_prompt_format=fmt
            )
            text = "\n".join(str(m.content) for m in sent)
            for tool in tools:
                assert tool.name in text and tool.description.split(".")[0] in text, (fmt, tool.name)
                assert all(p.name in text for p in tool.params), (fmt, tool.name)
            assert used == fmt


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_dialogs_copy_values_from_the_question_and_restate_results(formatter, split):
    gen = GeneratedDialogs(split, seed=11)
    registry = gen.registry()
    kinds = set()
    for _ in range(120):
        dialog = gen.dialog()
        kinds.add(dialog.kind)
        assert set(dialog.needed) <= set(registry)
        if dialog.kind == "no_tool":
            assert not set(dialog.needed) & set(dialog.tools)
        else:
            assert set(dialog.needed) <= set(dialog.tools)
        users = [m for m in dialog.messages if m.role == "user"]
        for question, calls in zip(users, dialog.expected_calls):
            for call in calls:
                tool = gen.by_name[call.tool_name]
                params = tool.schema()["function"]["parameters"]
                jsonschema.validate(call.arguments, params)  # the call fits the offered schema
                for name, value in call.arguments.items():
                    if not isinstance(value, bool):  # booleans are said as "with/without ..."
                        assert str(value) in question.content, (name, value, question.content)
        # tool messages are what the tool loop gives for the same call, and the answer restates them
        toolbox = Toolbox.create(dialog.definitions)
        calls = iter(c for cs in dialog.expected_calls for c in cs)
        for message in dialog.messages:
            if message.role == "tool":
                assert toolbox.execute(next(calls)).content == message.content
        answers = [m.content for m in dialog.messages if m.role == "assistant" and m.content]
        for answer, values in zip(answers, dialog.answer_values):
            assert values and all(v in answer for v in values), (answer, values)
        encoded = encode(formatter, dialog)  # renders through the engine's formatter, prefix-stable
        spans, current = [], []  # the assistant replies, cut out of the token stream, parse back to the calls
        for token, is_target in zip(encoded.tokens, encoded.targets):
            if is_target:
                current.append(token)
            elif current:
                spans, current = [*spans, current], []
        spans += [current] if current else []
        replies = [m for m in dialog.messages if m.role == "assistant"]
        assert len(spans) == len(replies)
        expected = iter(dialog.expected_calls)
        for span, reply in zip(spans, replies):
            parsed = formatter.decode_assistant_tokens(span)
            assert parsed.parse_error is None
            if reply.tool_calls:
                calls = next(expected)
                assert calls_match(parsed.tool_calls, calls), (formatter.tokenizer.decode(span), calls)
            else:
                assert not parsed.tool_calls and parsed.content == reply.content
    assert kinds == set(generated.GENERATED_MIX)


def test_object_results_are_json_objects_and_rendered_as_json():
    tool = next(t for t in toolgen.tool_bank("train") if t.result == "object")
    args = {p.name: 3 for p in tool.params}
    result = tool(**args)
    assert isinstance(result, dict) and list(result) == list(tool.result_fields)
    assert json.loads(result_text(result)) == result
    assert tool(**args) == result  # deterministic


def test_heldout_frames_never_appear_in_training_questions():
    gen = GeneratedDialogs("train", seed=3)
    questions = [m.content for _ in range(400) for m in gen.dialog("single").messages if m.role == "user"]
    heldout_leads = (*generated._GET_LEADS["heldout"], *generated._CONVERT_LEADS["heldout"], " where ", " given ")
    assert not [q for q in questions if any(lead in q for lead in heldout_leads)]


def test_shared_tool_sets_and_bad_split(formatter):
    gen = GeneratedDialogs("train", seed=5)
    offered = gen.offer()
    for _ in range(20):
        dialog = gen.dialog(offered=offered)
        assert dialog.tools == offered
    with pytest.raises(ValueError, match="split must be one of"):
        GeneratedDialogs("test")
