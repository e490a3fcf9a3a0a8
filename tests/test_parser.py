"""Tool-call parser: every syntax the models write, several calls per reply, round trips, and garbage."""

from __future__ import annotations

import keyword

import pytest
from _chat_helpers import our_formatter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.formats import parse_assistant, parse_tool_calls, render_tool_calls
from workbench.types import Message, ToolCall


def _calls(msg: Message) -> list[tuple[str, dict]]:
    return [(c.tool_name, c.arguments) for c in msg.tool_calls]


CASES = [
    # python list
    ('[get_weather(city="Paris", days=3)]', [("get_weather", {"city": "Paris", "days": 3})], ""),
    (
        "[a(x=1, y=-2.5, z=True, n=None), b(s='single \\'quoted\\'', t=\"dq \\\"x\\\"\\n\", u='''tri\"ple''')]",
        [
            ("a", {"x": 1, "y": -2.5, "z": True, "n": None}),
            ("b", {"s": "single 'quoted'", "t": 'dq "x"\n', "u": 'tri"ple'}),
        ],
        "",
    ),
    (
        '[f(nested={"k": [1, {"d": [None, false, true, null]}], "e": {}}, l=[[1], (2, 3)])]',
        [("f", {"nested": {"k": [1, {"d": [None, False, True, None]}], "e": {}}, "l": [[1], [2, 3]]})],
        "",
    ),
    ("[f()]", [("f", {})], ""),
    ('[f(a=1)][g(b="2")]', [("f", {"a": 1}), ("g", {"b": "2"})], ""),
    (
        'Sure, checking. [get_weather(city="Paris")] One moment!',
        [("get_weather", {"city": "Paris"})],
        "Sure, checking.  One moment!",
    ),
    (
        '[get_weather(city="Paris"), get_time(tz="CET"',
        [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})],
        "",
    ),
    ('[get_weather(city="Paris")', [("get_weather", {"city": "Paris"})], ""),
    (
        '[get_weather(city="Paris") and then I will answer',
        [("get_weather", {"city": "Paris"})],
        "and then I will answer",
    ),
    ('get_weather(city="Paris"), get_time()', [("get_weather", {"city": "Paris"}), ("get_time", {})], ""),
    ('[weather.lookup(city="Oslo")]', [("weather.lookup", {"city": "Oslo"})], ""),
    # JSON
    ('{"type": "function", "name": "f", "parameters": {"a": 1}}', [("f", {"a": 1})], ""),
    ('{"name": "f", "parameters": {"a": [1, "x"]}}', [("f", {"a": [1, "x"]})], ""),
    ('{"name": "f", "arguments": "{\\"a\\": 1}"}', [("f", {"a": 1})], ""),
    ('{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}', [("f", {"a": 1})], ""),
    (
        '[{"name": "f", "parameters": {}}, {"name": "g", "parameters": {"b": true}}]',
        [("f", {}), ("g", {"b": True})],
        "",
    ),
    (
        '{"name": "f", "parameters": {"a": 1}}\n{"name": "g", "parameters": {"b": 2}}',
        [("f", {"a": 1}), ("g", {"b": 2})],
        "",
    ),
    ('I will call {"name": "f", "parameters": {"q": "x"}} now', [("f", {"q": "x"})], "I will call  now"),
    ('{"name": "f", "parameters": {"a": {"b": 1}}', [("f", {"a": {"b": 1}})], ""),  # missing closing brace
    ("{'name': 'f', 'parameters': {'a': True}}", [], "{'name': 'f', 'parameters': {'a': True}}"),  # not JSON-ish start
    ('{"name": "brave_search", "parameters": {"q": "news"}}', [("brave_search", {"query": "news"})], ""),
    # function tags
    ('<function=f>{"a": 1}</function>', [("f", {"a": 1})], ""),
    (
        '<function=f>{"a": 1}</function><function=g>{"b": "</function>"}</function>',
        [("f", {"a": 1}), ("g", {"b": "</function>"})],
        "",
    ),
    ('<function=f>{"a": 1}', [("f", {"a": 1})], ""),
    ("<function=f></function>", [("f", {})], ""),
    (
        'Calling: <function=spotify_trending_songs>{"n": "5"}</function>',
        [("spotify_trending_songs", {"n": "5"})],
        "Calling:",
    ),
    # built-ins
    (
        '<|python_tag|>brave_search.call(query="weather in Menlo Park")',
        [("brave_search", {"query": "weather in Menlo Park"})],
        "",
    ),
    ('brave_search.call(query="a \\"quoted\\" word")', [("brave_search", {"query": 'a "quoted" word'})], ""),
    (
        'brave_search.call(query="unescaped "quotes" from the reference")',
        [("brave_search", {"query": 'unescaped "quotes" from the reference'})],
        "",
    ),
    (
        '<|python_tag|>wolfram_alpha.call(query="solve x^2=4")<|eom_id|>',
        [("wolfram_alpha", {"query": "solve x^2=4"})],
        "",
    ),
    ('[brave_search.call(query="x")]', [("brave_search", {"query": "x"})], ""),
    # code
    ("<|python_tag|>import math\nprint(math.pi)", [("code_interpreter", {"code": "import math\nprint(math.pi)"})], ""),
    (
        "Let me compute.<|python_start|>print(2 ** 10)<|python_end|>",
        [("code_interpreter", {"code": "print(2 ** 10)"})],
        "Let me compute.",
    ),
    ("<|python_start|>x = [f(a=1)]\nprint(x)", [("code_interpreter", {"code": "x = [f(a=1)]\nprint(x)"})], ""),
    ('<|python_start|>{"name": "f", "parameters": {"a": 1}}<|python_end|>', [("f", {"a": 1})], ""),
    ("<|python_start|>[f(a=1), g(b=2)]<|python_end|><|eom|>", [("f", {"a": 1}), ("g", {"b": 2})], ""),
    ('<|python_tag|>{"type": "function", "name": "f", "parameters": {}}', [("f", {})], ""),
    ('<|python_start|>print(end="")<|python_end|>', [("code_interpreter", {"code": 'print(end="")'})], ""),
    ("<|python_tag|>[f(x) for f in fs]", [("code_interpreter", {"code": "[f(x) for f in fs]"})], ""),
    # plain text
    ("The answer is 42.", [], "The answer is 42."),
    ('Use JSON like {"name": "Bob", "age": 3}.', [], 'Use JSON like {"name": "Bob", "age": 3}.'),
    ("See [the docs](https://x.y) and call(me).", [], "See [the docs](https://x.y) and call(me)."),
    ("", [], ""),
]


@pytest.mark.parametrize(("text", "expected", "content"), CASES)
def test_parse_cases(text: str, expected: list, content: str) -> None:
    msg = parse_assistant(text)
    assert msg.role == "assistant"
    assert _calls(msg) == expected
    assert msg.content == content
    assert msg.parse_error is None
    assert all(c.call_id for c in msg.tool_calls)


def test_stop_reason_from_markers_and_argument() -> None:
    assert parse_assistant("hi<|eot_id|>").stop_reason == "end_of_turn"
    assert parse_assistant("hi<|eot|>").content == "hi"
    assert parse_assistant("[f(a=1)]<|eom|>").stop_reason == "end_of_message"
    assert parse_assistant("hi", "out_of_tokens").stop_reason == "out_of_tokens"
    assert parse_assistant("<|header_start|>assistant<|header_end|>\n\nhello").content == "hello"


@pytest.mark.parametrize(
    "text",
    [
        '<function=f>{"a": }</function>',
        '{"name": "f", "parameters": {"a": ]}',
        "[f(a=1, 2)]",
        "[f(a=undefined_name)]",
        '{"name": "f", "arguments": "not json"}',
        '<|python_start|>{"name": "f", "parameters": {"a": oops}}<|python_end|>',
        "[f(**kw)]",
        "brave_search.call(query=",
    ],
)
def test_malformed_calls_are_marked_not_raised(text: str) -> None:
    msg = parse_assistant(text)
    assert msg.tool_calls == []
    assert msg.parse_error and isinstance(msg.parse_error, str)
    assert msg.content == text.strip()


def test_call_ids_are_unique() -> None:
    msg = parse_assistant("[" + ", ".join(f"f(i={i})" for i in range(50)) + "]")
    ids = [c.call_id for c in msg.tool_calls]
    assert len(ids) == 50 and len(set(ids)) == 50
    again = parse_assistant("[f(i=0)]")
    assert again.tool_calls[0].call_id not in ids


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_decode_assistant_tokens(family: str) -> None:
    f = our_formatter(None, family)
    tok = f.tokenizer
    if family == "llama4":
        ids = tok.encode("Computing.") + [tok.special_tokens["<|python_start|>"]] + tok.encode("print(1)")
        ids += [tok.special_tokens["<|python_end|>"]]
    else:
        ids = [tok.special_tokens["<|python_tag|>"]] + tok.encode("print(1)")
    msg = f.decode_assistant_tokens(ids, "end_of_message")
    assert _calls(msg) == [("code_interpreter", {"code": "print(1)"})]
    assert msg.stop_reason == "end_of_message"
    with_stop = f.decode_assistant_tokens(tok.encode("[f(a=1)]") + [tok.eom_id], None)
    assert _calls(with_stop) == [("f", {"a": 1})] and with_stop.stop_reason == "end_of_message"
    assert f.decode_assistant("plain", "end_of_turn").content == "plain"


# --- round trips --------------------------------------------------------------------------------------------

_identifier = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s) and s not in ("brave_search", "wolfram_alpha", "photogen", "code_interpreter")
)
_json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_call = st.builds(
    lambda name, args: ToolCall(tool_name=name, arguments=args),
    _identifier,
    st.dictionaries(_identifier, _json_like, max_size=4),
)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(_call, min_size=1, max_size=4), fmt=st.sampled_from(["json", "function_tag", "python_list"]))
def test_round_trip_every_format(calls: list[ToolCall], fmt: str) -> None:
    text = render_tool_calls(calls, fmt)
    result = parse_tool_calls(text)
    assert result.error is None, (text, result.error)
    assert [(c.tool_name, c.arguments) for c in result.tool_calls] == [(c.tool_name, c.arguments) for c in calls]
    assert result.content == ""


@settings(max_examples=100, deadline=None, database=None)
@given(
    name=st.sampled_from(["brave_search", "wolfram_alpha", "photogen"]),
    # special-token text inside a value ("<|python_end|>") reads as the marker itself once decoded; the
    # tokenizer never writes a value's text as a special token, so such values cannot reach the parser
    query=st.text(max_size=40).filter(lambda q: "<|" not in q),
    fmt=st.sampled_from(["json", "function_tag", "python_list"]),
)
def test_round_trip_builtins(name: str, query: str, fmt: str) -> None:
    result = parse_tool_calls("<|python_tag|>" + render_tool_calls([ToolCall(name, {"query": query})], fmt))
    assert [(c.tool_name, c.arguments) for c in result.tool_calls] == [(name, {"query": query})]


@settings(max_examples=60, deadline=None, database=None)
@given(calls=st.lists(_call, min_size=1, max_size=3), fmt=st.sampled_from(["json", "function_tag", "python_list"]))
def test_round_trip_through_tokens(calls: list[ToolCall], fmt: str) -> None:
    """Rendered into an assistant turn, tokenized, decoded and parsed: the same calls come back."""
    f = our_formatter(None, "llama4")
    ids = f.tokenizer.encode(render_tool_calls(calls, fmt))
    msg = f.decode_assistant_tokens(ids, "end_of_message")
    assert [(c.tool_name, c.arguments) for c in msg.tool_calls] == [(c.tool_name, c.arguments) for c in calls]


def test_python_list_single_list_form_and_code_round_trip() -> None:
    assert _calls(parse_assistant('[f(a=1), g(b="x")]')) == [("f", {"a": 1}), ("g", {"b": "x"})]
    f = our_formatter(None, "llama3")
    code = "def sq(x):\n    return x * x\n\nprint(sq(12))"
    dialog = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"tool_name": "code_interpreter", "arguments": {"code": code}}],
        }
    ]
    turn = f.render(dialog).split("<|start_header_id|>assistant<|end_header_id|>\n\n")[1]
    assert _calls(parse_assistant(turn)) == [("code_interpreter", {"code": code})]


# --- garbage ------------------------------------------------------------------------------------------------

_fragments = st.sampled_from(
    [
        "[",
        "]",
        "(",
        ")",
        "{",
        "}",
        '"',
        "'",
        "\\",
        "=",
        ",",
        ":",
        " ",
        "\n",
        "f",
        "name",
        '"name":',
        '"parameters":',
        "<function=",
        "</function>",
        ">",
        "<|python_tag|>",
        "<|python_start|>",
        "<|python_end|>",
        ".call(",
        "query=",
        "true",
        "None",
        "1",
        "-",
        "e5",
        "'''",
        "<|eot|>",
        "<|eom_id|>",
    ]
)


@settings(max_examples=400, deadline=None, database=None)
@given(st.one_of(st.text(max_size=200), st.lists(_fragments, max_size=60).map("".join)))
def test_garbage_never_raises(text: str) -> None:
    msg = parse_assistant(text)
    assert isinstance(msg.content, str)
    assert all(isinstance(c.arguments, dict) and c.tool_name for c in msg.tool_calls)
    if msg.parse_error:
        assert msg.tool_calls == []


@pytest.mark.timeout(120)  # a hang guard against exponential backtracking, not a speed assertion
def test_pathological_inputs_do_not_blow_up() -> None:
    for text in ['{"name": "' * 3000, "[f(" * 3000, "[" * 5000, "(" * 20000 + ")", '{"a": [' * 2000]:
        msg = parse_assistant(text)
        assert isinstance(msg.content, str) and msg.tool_calls == []


def test_json_calls_separated_by_semicolons():
    """Llama 3.2 writes several JSON calls separated by ';': the separators are not content."""
    from workbench.formats.parser import parse_tool_calls

    first = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    second = '{"type": "function", "name": "get_time", "parameters": {}}'
    for text in (f"{first}; {second}", f"{first};{second};", f"{first}\n; {second}"):
        result = parse_tool_calls(text)
        assert [c.tool_name for c in result.tool_calls] == ["get_weather", "get_time"]
        assert result.content == "" and result.error is None
    result = parse_tool_calls(f"Checking; one moment. {first}; {second}")
    assert result.content == "Checking; one moment." and len(result.tool_calls) == 2
