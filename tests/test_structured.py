"""Structured output on real tiny random-weight models: every constrained row conforms to its format.

Random weights pick tokens almost uniformly among what the grammar allows, so the schemas bound every
open-ended value (string lengths, array sizes, integer ranges) — otherwise a row could wander until
max_tokens — and each test asserts that rows *completed* (stop reason) and validate.
"""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import pydantic
import pytest

from workbench import tools as wb_tools
from workbench.checkpoints.factory import TINY_LLAMA3
from workbench.errors import FormatError, WorkbenchError
from workbench.formats import coerce_tools
from workbench.session import build_engine, resolve_settings

pytestmark = pytest.mark.timeout(600)

NAME = {"type": "string", "maxLength": 12}
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"name": NAME, "id": {"type": "integer", "minimum": 0, "maximum": 999}},
                "required": ["name", "id"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
        "additionalProperties": False,
    },
    "array_enum": {
        "type": "object",
        "properties": {
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["colors", "size"],
        "additionalProperties": False,
    },
    "bounded_numbers": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 65},
            "score": {"type": "integer", "exclusiveMinimum": -5, "maximum": 5},
        },
        "required": ["age", "score"],
        "additionalProperties": False,
    },
    "optional_fields": {
        "type": "object",
        "properties": {"title": NAME, "note": NAME, "count": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["title"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, NAME, {"type": "null"}]},
            "pair": {"type": "array", "prefixItems": [{"type": "boolean"}, {"enum": [1, 2, 3]}], "items": False},
        },
        "required": ["value", "pair"],
        "additionalProperties": False,
    },
    "top_level_array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 5},
}
PROMPTS = ["Describe the user:", "Hello", "Give me JSON.", "Once upon a time", "1, 2, 3"]


def engine_for(folder, **kwargs):
    return build_engine(resolve_settings(folder, max_batch_size=6, max_seq_len=768, **kwargs))


@pytest.fixture(scope="module")
def llama3_engine(llama3_dir):
    return engine_for(llama3_dir)


@pytest.fixture(scope="module")
def llama4_engine(llama4_dir):
    return engine_for(llama4_dir)


def json_format(schema):
    return {"type": "json_schema", "json_schema": schema}


def assert_valid_json(row, schema):
    assert row.stop_reason == "end_of_turn", (row.stop_reason, row.text)
    value = json.loads(row.text)
    jsonschema.validate(value, schema)
    assert row.parsed == value and row.format_error is None


# --------------------------------------------------------------------------------------------- JSON schema
@pytest.mark.parametrize("which", ["llama3_engine", "llama4_engine"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "top_k": 500}], ids=["greedy", "sampled"])
def test_every_row_validates_against_its_own_schema(which, sampling, request):
    engine = request.getfixturevalue(which)
    prompts, formats = [], []
    for i, name in enumerate(SCHEMAS):  # every schema, with an unconstrained row after every third
        prompts.append(PROMPTS[i % len(PROMPTS)])
        formats.append(json_format(SCHEMAS[name]))
        if i % 3 == 0:
            prompts.append(PROMPTS[(i + 1) % len(PROMPTS)])
            formats.append(None)
    rows = engine.batch_completion(prompts, response_format=formats, max_tokens=90, **sampling)
    assert len(rows) == len(prompts) > engine.max_batch_size  # more rows than slots: constrained rows in waves
    for fmt, row in zip(formats, rows):
        if fmt is None:
            assert row.parsed is None and row.format_error is None
        else:
            assert_valid_json(row, fmt["json_schema"])
    if not sampling:  # unconstrained rows are untouched by their neighbours' masks
        plain = [(p, r) for p, f, r in zip(prompts, formats, rows) if f is None]
        alone = engine.batch_completion([p for p, _ in plain], max_tokens=90)
        assert [r.tokens for _, r in plain] == [a.tokens for a in alone]


def test_sampled_rows_with_seeds_are_reproducible_and_logprobs_are_masked(llama3_engine):
    schema = SCHEMAS["array_enum"]
    kwargs = dict(response_format=json_format(schema), max_tokens=60, temperature=0.8, top_p=0.9, seed=7, logprobs=3)
    first = llama3_engine.completion("Colors:", **kwargs)
    again = llama3_engine.batch_completion(["Colors:", "Other"], **kwargs)[0]
    assert first.tokens == again.tokens
    assert_valid_json(first, schema)
    # every value of this schema starts with `{`: after masking, only tokens starting with it are alternatives
    lp = first.logprobs[0]
    assert lp.text.startswith("{") and lp.logprob > float("-inf")
    assert lp.top_logprobs and all(text.startswith("{") for text in lp.top_logprobs)
    for step in first.logprobs:
        assert all(v > float("-inf") for v in step.top_logprobs.values())


def test_pydantic_model_result_carries_the_parsed_object(llama4_engine):
    class Pet(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")  # else the schema allows (random) extra keys
        kind: Literal["cat", "dog", "llama"]
        age: int = pydantic.Field(ge=0, le=30)
        name: str = pydantic.Field(max_length=10)

    rows = llama4_engine.batch_completion(["My pet:", "Another pet:"], response_format=Pet, max_tokens=80)
    for row in rows:
        assert row.stop_reason == "end_of_turn"
        assert isinstance(row.parsed, Pet) and row.parsed == Pet.model_validate_json(row.text)
    wrapped = llama4_engine.completion(
        "My pet:", response_format={"type": "json_schema", "json_schema": Pet}, max_tokens=80
    )
    assert wrapped.tokens == rows[0].tokens and isinstance(wrapped.parsed, Pet)


def test_llama_stack_request_objects_are_accepted(llama3_engine):
    from llama_stack.apis.inference import JsonSchemaResponseFormat

    schema = SCHEMAS["bounded_numbers"]
    row = llama3_engine.completion("Ages:", response_format=JsonSchemaResponseFormat(json_schema=schema), max_tokens=60)
    assert_valid_json(row, schema)
    openai_style = {"type": "json_schema", "json_schema": {"name": "ages", "schema": schema, "strict": True}}
    assert llama3_engine.completion("Ages:", response_format=openai_style, max_tokens=60).tokens == row.tokens


# --------------------------------------------------------------------------------------------- grammar, regex
def test_grammar_and_regex_rows_match(llama4_engine):
    gbnf = 'root ::= answer " " num\nanswer ::= "yes" | "no" | "maybe"\nnum ::= [0-9] [0-9]?'
    lark = 'start: ab ab? ab? "!"\nab: "A" | "B"\n'
    formats = [
        {"type": "grammar", "bnf": gbnf},
        {"type": "regex", "regex": r"[a-z]{3,6}-\d{2}"},
        re.compile(r"(cat|dog)s? [0-9]{1,3}"),
        None,
        # Llama Stack types bnf as a dict: rule name -> body
        {"type": "grammar", "bnf": {"root": '"(" item ("," item)? ("," item)? ")"', "item": "[xyz]"}},
        {"type": "grammar", "bnf": lark},
    ]
    checks = [
        r"(yes|no|maybe) [0-9][0-9]?",
        r"[a-z]{3,6}-\d{2}",
        r"(cat|dog)s? [0-9]{1,3}",
        None,
        r"\([xyz](,[xyz]){0,2}\)",
        r"[AB]{1,3}!",
    ]
    for sampling in ({}, {"temperature": 1.2, "seed": 3}):
        rows = llama4_engine.batch_completion(
            ["Q:", "Code:", "Pets:", "Free text", "Tuple:", "Letters:"],
            response_format=formats,
            max_tokens=60,
            **sampling,
        )
        for pattern, row in zip(checks, rows):
            if pattern is None:
                continue
            assert row.stop_reason == "end_of_turn", (pattern, row.text)
            assert re.fullmatch(pattern, row.text), (pattern, row.text)
            assert row.parsed is None and row.format_error is None


def test_greedy_rows_whose_argmax_satisfies_the_constraint_are_token_identical(llama3_engine, llama4_engine):
    for engine in (llama3_engine, llama4_engine):
        free = engine.batch_completion(PROMPTS, max_tokens=24)
        # Random weights may write invalid UTF-8 (decoded as U+FFFD) or special tokens, which no text grammar
        # accepts: skip such rows.
        rows = [
            (p, r)
            for p, r in zip(PROMPTS, free)
            if "\ufffd" not in r.text and not any(engine.tokenizer.is_special(t) for t in r.tokens)
        ]
        assert len(rows) >= 2
        prompts, free = [p for p, _ in rows], [r for _, r in rows]
        # A regex that accepts the unconstrained text, each character or a BEL: the argmax is always allowed.
        # (Not the bare text: where a grammar forces exact bytes, llguidance allows only their canonical BPE
        # split, and a random model's argmax may split them differently.)
        formats = [{"type": "regex", "regex": "".join(f"[\\x{{{ord(c):x}}}\\x07]" for c in r.text)} for r in free]
        exact = engine.batch_completion(prompts, response_format=formats, max_tokens=24)
        assert [r.tokens for r in exact] == [r.tokens for r in free]
        assert all(r.stop_reason == "end_of_turn" for r in exact)  # the grammar completes: the turn ends
        # Logprobs are renormalized over allowed tokens (the logits are masked), but the choices stay the same.
        with_lp = engine.batch_completion(prompts, response_format=formats, max_tokens=24, logprobs=2)
        assert [r.tokens for r in with_lp] == [r.tokens for r in free]
        # A permissive grammar (any text) never changes a greedy row.
        anything = engine.batch_completion(
            prompts, response_format={"type": "regex", "regex": r"(?s:.*)"}, max_tokens=24
        )
        assert [r.tokens for r in anything] == [r.tokens for r in free]


# --------------------------------------------------------------------------------------------- stopping
def test_max_tokens_before_completion_says_so(llama3_engine):
    schema = {"type": "object", "properties": {"text": {"type": "string", "minLength": 50}}, "required": ["text"]}
    row = llama3_engine.completion("Write:", response_format=json_format(schema), max_tokens=8)
    assert row.stop_reason == "out_of_tokens" and len(row.tokens) == 8
    assert row.parsed is None and "max_tokens" in row.format_error
    # a complete document at exactly max_tokens ends the turn
    done = llama3_engine.completion("Q:", response_format={"type": "regex", "regex": "yes|no"}, max_tokens=8)
    assert done.stop_reason == "end_of_turn" and done.text in ("yes", "no")


def test_stop_strings_apply_to_constrained_rows(llama4_engine):
    fmt = {"type": "regex", "regex": r"[a-c]{4} STOP [a-c]{4}"}
    row = llama4_engine.completion("Letters:", response_format=fmt, stop=[" STOP"], max_tokens=40)
    assert row.stop_reason == "end_of_turn" and re.fullmatch(r"[a-c]{4}", row.text), row.text
    schema = SCHEMAS["array_enum"]
    cut = llama4_engine.completion("JSON:", response_format=json_format(schema), stop=['"size"'], max_tokens=80)
    assert cut.stop_reason == "end_of_turn" and cut.parsed is None and "not valid" in cut.format_error


def test_streaming_completion_and_chat_follow_the_format(llama3_engine):
    schema = SCHEMAS["nested"]
    chunks = list(llama3_engine.stream_completion("User:", response_format=json_format(schema), max_tokens=120))
    final = chunks[-1].final
    assert "".join(c.text for c in chunks) == final.text
    assert_valid_json(final, schema)
    assert final.tokens == llama3_engine.completion("User:", response_format=json_format(schema), max_tokens=120).tokens
    items = list(
        llama3_engine.chat_completion(
            [{"role": "user", "content": "A user?"}], stream=True, response_format=json_format(schema), max_tokens=120
        )
    )
    reply = items[-1]
    jsonschema.validate(json.loads(reply.message.content), schema)
    assert reply.parsed == json.loads(reply.message.content)


# --------------------------------------------------------------------------------------------- chat
def test_chat_json_replies_use_llama_stacks_instruction_and_stay_content(llama4_engine):
    # A schema whose values look like a JSON tool call: the reply must stay content, not become a call.
    schema = {
        "type": "object",
        "properties": {
            "name": {"enum": ["get_weather"]},
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }
    dialogs = [[{"role": "user", "content": "Call it"}], "Say hi"]
    replies = llama4_engine.batch_chat_completion(dialogs, response_format=[json_format(schema), None], max_tokens=60)
    assert replies[0].message.tool_calls == [] and json.loads(replies[0].message.content) == replies[0].parsed
    jsonschema.validate(replies[0].parsed, schema)
    instruction = f"Please respond in JSON format with the schema: {json.dumps(schema)}"
    expected = llama4_engine.formatter.encode_dialog([*dialogs[0], {"role": "user", "content": instruction}])
    assert replies[0].prompt_tokens == len(expected)
    assert replies[1].prompt_tokens == len(llama4_engine.formatter.encode_dialog(dialogs[1]))
    assert replies[1].parsed is None
    single = llama4_engine.chat_completion(dialogs[0], response_format=json_format(schema), max_tokens=60)
    assert single.tokens == replies[0].tokens


# --------------------------------------------------------------------------------------------- tool calls
def get_weather(
    city: Literal["Paris", "Oslo", "Lima"], unit: Literal["celsius", "fahrenheit"] = "celsius", days: int = 1
) -> str:
    """Weather forecast for a city.

    Args:
        city: the city
        unit: temperature unit
        days: number of days
    """
    return f"sunny in {city}"


LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look items up.",
        "parameters": {
            "type": "object",
            "properties": {
                "ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3},
                "exact": {"type": "boolean"},
                "tag": {"type": "string", "maxLength": 6},
            },
            "required": ["ids"],
        },
    },
}
# get_weather's `days` is an unbounded integer: bound it for random weights, as the other values are
TOOLS = [get_weather, LOOKUP]


@pytest.fixture(scope="module")
def tool_defs():
    defs = {d.tool_name: d for d in coerce_tools(TOOLS)}
    schema = defs["get_weather"].params["days"].schema
    schema.update(minimum=1, maximum=7)
    return defs


@pytest.fixture(scope="module")
def llama31_engine(llama3_dir):
    return engine_for(llama3_dir, model="Llama3.1-8B-Instruct")


@pytest.mark.parametrize(
    "which,syntax",
    [
        ("llama31_engine", "json"),
        ("llama31_engine", "function_tag"),
        ("llama3_engine", "python_list"),
        ("llama4_engine", "python_list"),
    ],
)
def test_constrained_tool_calls_parse_into_offered_tools_with_valid_arguments(which, syntax, tool_defs, request):
    engine = request.getfixturevalue(which)
    defs = list(tool_defs.values())
    dialogs = [[{"role": "user", "content": q}] for q in ("Weather in Paris?", "Find item 3", "Hi", "Lookup 7")]
    for sampling in ({}, {"temperature": 1.0, "top_k": 100}):
        replies = engine.batch_chat_completion(
            dialogs,
            tools=defs,
            tool_choice="required",
            tool_prompt_format=syntax,
            constrain_tools=True,
            max_tokens=120,
            **sampling,
        )
        for reply in replies:
            message = reply.message
            assert message.parse_error is None and message.tool_calls, engine.tokenizer.decode(reply.tokens)
            for call in message.tool_calls:
                assert call.tool_name in tool_defs
                jsonschema.validate(call.arguments, tool_defs[call.tool_name].json_schema())
            expected = "end_of_message" if engine.family == "llama4" else "end_of_turn"
            assert reply.stop_reason == expected
            if syntax != "python_list":
                assert len(message.tool_calls) == 1
    named = engine.chat_completion(
        dialogs[2],
        tools=defs,
        tool_choice="lookup",
        tool_prompt_format=syntax,
        constrain_tools=True,
        max_tokens=120,
        temperature=1.0,
    )
    assert {c.tool_name for c in named.message.tool_calls} == {"lookup"}


def test_tool_loop_with_constrained_first_call(llama4_engine, tool_defs):
    calls = []

    def lookup(ids: list[int], exact: bool = False, tag: str = "") -> str:
        calls.append(ids)
        return f"found {len(ids)}"

    defs = [tool_defs["get_weather"], coerce_tools([LOOKUP])[0]]
    defs[1].function = lookup
    transcript = wb_tools.run(
        llama4_engine,
        [{"role": "user", "content": "Find things"}],
        tools=defs,
        tool_choice="lookup",
        constrain_tools=True,
        max_turns=2,
        max_tokens=40,
    )
    assert transcript[1].role == "assistant" and transcript[1].tool_calls
    assert all(c.tool_name == "lookup" for c in transcript[1].tool_calls)
    assert transcript[2].role == "tool" and transcript[2].content.startswith("found ")
    assert len(calls) == len(transcript[1].tool_calls)


# --------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "fmt,match",
    [
        ({"type": "json_schema", "json_schema": {"type": "nonsense"}}, "invalid JSON schema"),
        ({"type": "json_schema", "json_schema": {"$ref": "#/$defs/missing"}}, "invalid JSON schema"),
        ({"type": "json_schema", "json_schema": "not a schema"}, "json_schema"),
        ({"type": "regex", "regex": "(unclosed"}, "invalid regex"),
        ({"type": "grammar", "bnf": "root ::= missing_rule"}, "grammar"),
        ({"type": "grammar", "bnf": ""}, "needs 'bnf'"),
        ({"type": "xml"}, "not supported"),
        ("\\d+", "bare string"),
        (42, "must be a dict"),
    ],
)
def test_invalid_formats_fail_before_generation(llama3_engine, fmt, match):
    calls = []
    runner = llama3_engine._runner
    original = runner.step
    runner.step = lambda add, cancel: calls.append(add) or original(add, cancel)
    try:
        with pytest.raises(FormatError, match=match) as info:
            llama3_engine.batch_completion(["a", "b"], response_format=[None, fmt], max_tokens=4)
        assert isinstance(info.value, WorkbenchError) and isinstance(info.value, ValueError)
    finally:
        runner.step = original
    assert calls == []
    assert len(llama3_engine.completion("still works", max_tokens=3).tokens) == 3


def test_request_shape_errors(llama3_engine, tool_defs):
    with pytest.raises(FormatError, match="2 entries for 3 prompts"):
        llama3_engine.batch_completion(["a", "b", "c"], response_format=[None, None], max_tokens=2)
    defs = list(tool_defs.values())
    with pytest.raises(FormatError, match="tool_choice='auto'"):
        llama3_engine.chat_completion("hi", tools=defs, constrain_tools=True, max_tokens=2)
    with pytest.raises(FormatError, match="needs tools"):
        llama3_engine.chat_completion("hi", tool_choice="auto", constrain_tools=True, max_tokens=2)
    with pytest.raises(FormatError, match="code_interpreter"):
        llama3_engine.chat_completion("hi", tools=["code_interpreter"], tool_choice="required", constrain_tools=True)
    with pytest.raises(FormatError, match="not both"):
        llama3_engine.chat_completion(
            "hi", tools=defs, tool_choice="required", constrain_tools=True, response_format={"type": "json_object"}
        )


def test_unsatisfiable_schema_ends_the_row_instead_of_hanging(make_checkpoint):
    engine = engine_for(make_checkpoint(TINY_LLAMA3))
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "minLength": 5, "maxLength": 2}},
        "required": ["s"],
    }
    try:
        row = engine.completion("x", response_format=json_format(schema), max_tokens=30)
    except FormatError:  # rejected up front: just as good
        return
    assert row.stop_reason == "out_of_tokens" and row.parsed is None and row.format_error


# --------------------------------------------------------------------------------------------- model parallel
def test_model_parallel_ranks_apply_the_same_masks(llama3_dir, llama3_engine):
    """Every rank computes the masks itself; the rows equal the in-process engine's (greedy and seeded)."""
    mp2 = engine_for(llama3_dir, model_parallel_size=2)
    try:
        formats = [json_format(SCHEMAS["array_enum"]), {"type": "regex", "regex": r"[a-z]{2,5}!"}, None]
        prompts = ["Colors:", "Word:", "Free"]
        for sampling in ({}, {"temperature": 1.0, "seed": 5, "logprobs": 1}):
            one = llama3_engine.batch_completion(prompts, response_format=formats, max_tokens=40, **sampling)
            two = mp2.batch_completion(prompts, response_format=formats, max_tokens=40, **sampling)
            assert [r.tokens for r in two] == [r.tokens for r in one]
            assert [r.stop_reason for r in two] == [r.stop_reason for r in one]
            assert_valid_json(two[0], SCHEMAS["array_enum"])
            assert re.fullmatch(r"[a-z]{2,5}!", two[1].text)
        unseeded = mp2.batch_completion(prompts[:2], response_format=formats[:2], max_tokens=40, temperature=1.0)
        assert_valid_json(unseeded[0], SCHEMAS["array_enum"])  # rows get a seed in the kernel, and keep their format
        assert re.fullmatch(r"[a-z]{2,5}!", unseeded[1].text)
        with pytest.raises(FormatError):  # checked in the kernel, before any rank starts
            mp2.completion("x", response_format={"type": "regex", "regex": "("})
        assert len(mp2.completion("x", max_tokens=2).tokens) == 2
    finally:
        mp2.close()


@pytest.mark.parametrize("density", [0.0, 2e-5, 1e-3, 0.05, 0.5, 1.0])
def test_fast_mask_paths_match_the_full_unpack(density):
    """The sparse and top-candidate shortcuts pick exactly what a full masked argmax / mask would."""
    import numpy as np
    import torch

    from workbench.generation import constraints as rt

    n_vocab = 202_048
    rng = np.random.default_rng(int(density * 1e6))
    gen = torch.Generator().manual_seed(7)
    for trial in range(6):
        bits = rng.random(n_vocab) < density
        if trial == 0 and density > 0:  # the argmax itself allowed, and just one token allowed elsewhere
            bits[:] = False
            bits[rng.integers(n_vocab)] = True
        words = np.packbits(np.concatenate([bits, np.zeros(-n_vocab % 32, bool)]), bitorder="little").view(np.int32)
        logits = torch.randn(n_vocab, generator=gen)  # [V]
        forbidden = rt._unpack_forbidden(words[None], n_vocab, torch.device("cpu"))[0]  # [V]
        assert torch.equal(~forbidden, torch.from_numpy(bits))
        allowed = rt._allowed_ids(words, n_vocab)
        if allowed is not None:
            assert allowed.tolist() == np.flatnonzero(bits).tolist()
        else:
            assert len(np.flatnonzero(words)) > rt._SPARSE_WORDS
        best = rt._best_allowed(logits, words)
        if not bits.any():
            assert best is None
        elif best is not None:
            assert best == int(logits.masked_fill(forbidden, float("-inf")).argmax())
        else:  # only a dense mask whose allowed tokens all sit below the top candidates falls through
            assert allowed is None and not bits[logits.topk(rt._TOP_CANDIDATES).indices.numpy()].any()


def test_prefetched_masks_are_used_only_for_unchanged_rows(llama3_engine):
    """A mask computed ahead (while the forward runs) is the fresh mask, and is dropped for a row that moved."""
    import numpy as np

    from workbench.generation.constraints import GrammarRuntime
    from workbench.structured.spec import regex_format

    tokenizer = llama3_engine.tokenizer
    runtime = GrammarRuntime(tokenizer)
    eot = tokenizer.eot_id
    states = [runtime.start(regex_format(p).constraint((eot,))) for p in (r"[0-9]{3}", r"(yes|no)", r"[a-z]+!")]
    fresh = [runtime.fill([s]).copy() for s in states]
    runtime.prefetch(states)
    assert all(np.array_equal(m, f[0]) for m, f in zip(runtime.fill(states), fresh))
    runtime.prefetch(states)
    states[0].consume(tokenizer.encode("7", bos=False, eos=False)[0])  # the row moved after the prefetch
    moved = runtime.fill(states)
    again = GrammarRuntime(tokenizer).fill(states)
    assert np.array_equal(moved, again) and not np.array_equal(moved[0], fresh[0][0])
    runtime.prefetch(states[:2])  # another set of rows than the one asked for next: recomputed too
    assert np.array_equal(runtime.fill(states), again)


@pytest.mark.parametrize("density", [2e-5, 1e-3, 0.5, 0.97, 0.99999])
def test_sampled_rows_get_exactly_the_forbidden_tokens_masked(density):
    """However a mask is applied (allowed ids, forbidden ids, full unpack), a sampled row's logits end up
    -inf exactly where the grammar forbids a token, and unchanged elsewhere."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from workbench.generation import constraints as rt

    n_vocab, padded = 202_048, 202_048 + 64
    rng = np.random.default_rng(int(density * 1e5))
    bits = rng.random((3, n_vocab)) < density  # [rows, V]
    bits[:, 0] = True  # every row allows something
    words = np.packbits(np.pad(bits, ((0, 0), (0, -n_vocab % 32))), axis=1, bitorder="little").view(np.int32)
    runtime = rt.GrammarRuntime(SimpleNamespace(n_words=n_vocab))
    runtime.fill = lambda states: words
    logits = torch.randn(4, padded)  # [n, V + padding]; row 3 has no format
    before = logits.clone()
    rows = [rt.MaskRow(i, SimpleNamespace(dead=False), argmax_only=False) for i in range(3)]
    assert runtime.mask_logits(logits, rows) == {}
    expected = before.clone()
    expected[:3, :n_vocab][~torch.from_numpy(bits)] = float("-inf")
    expected[:3, n_vocab:] = float("-inf")
    assert torch.equal(logits, expected)
