"""Raw chat format (no tools): token-for-token parity with ``ChatFormat.encode_dialog_prompt`` of llama-models 0.3.0."""

from __future__ import annotations

import ast

import pytest
from _chat_helpers import our_formatter, ref_raw_tokens

from workbench.errors import InputError
from workbench.formats import make_formatter, render_tool_call
from workbench.types import Message

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
USER = {"role": "user", "content": "What is the weather in Paris?"}


def _assistant(calls, content="", stop_reason="end_of_message"):
    return {"role": "assistant", "content": content, "tool_calls": calls, "stop_reason": stop_reason}


WEATHER = {"tool_name": "get_weather", "arguments": {"city": "Paris", "days": 3}, "call_id": "c1"}
LISTY = {
    "tool_name": "plot",
    "arguments": {"xs": [1, 2.5, -3], "labels": ["a", "ü 日本"], "log": True, "n": None},
    "call_id": "c2",
}
BRAVE = {"tool_name": "brave_search", "arguments": {"query": "current weather in Paris"}, "call_id": "c3"}
WOLFRAM = {"tool_name": "wolfram_alpha", "arguments": {"query": "integrate x^2"}, "call_id": "c4"}
CODE = {"tool_name": "code_interpreter", "arguments": {"code": "import math\nprint(math.sqrt(2))"}, "call_id": "c5"}
NOARGS = {"tool_name": "get_time", "arguments": {}, "call_id": "c6"}

DIALOGS = {
    "user": [USER],
    "system_user": [SYSTEM, USER],
    "empty": [],
    "multi_turn": [
        SYSTEM,
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?", "stop_reason": "end_of_turn"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "No."},
        {"role": "user", "content": "Please?"},
    ],
    "custom_call_and_response": [
        USER,
        _assistant([WEATHER]),
        {"role": "tool", "call_id": "c1", "content": '{"temp_c": 21, "sky": "clear"}'},
        {"role": "assistant", "content": "It is 21°C and clear.", "stop_reason": "end_of_turn"},
        {"role": "user", "content": "Thanks"},
    ],
    "ipython_alias": [USER, _assistant([WEATHER]), {"role": "ipython", "call_id": "c1", "content": "sunny"}],
    "two_calls_end_of_turn": [USER, _assistant([WEATHER, LISTY], stop_reason="end_of_turn")],
    "call_with_text": [USER, _assistant([NOARGS], content="Let me check.", stop_reason="end_of_turn")],
    "call_no_stop_reason": [USER, {"role": "assistant", "content": "", "tool_calls": [WEATHER]}],
    "builtins": [
        SYSTEM,
        USER,
        _assistant([BRAVE]),
        {"role": "tool", "call_id": "c3", "content": "Sunny, 21C"},
        _assistant([WOLFRAM]),
        {"role": "tool", "call_id": "c4", "content": "x^3/3"},
    ],
    "code_interpreter": [
        {"role": "user", "content": "sqrt 2?"},
        _assistant([CODE]),
        {"role": "tool", "call_id": "c5", "content": "1.4142135623730951"},
        {"role": "assistant", "content": "About 1.414.", "stop_reason": "end_of_turn"},
    ],
    "code_after_custom": [USER, _assistant([WEATHER, CODE])],
    "unicode": [
        {"role": "system", "content": "Réponds en français. 日本語もOK 🙂"},
        {"role": "user", "content": "Ça va ? — «quotes» ‘single’ \u200b zero-width, emoji 👩‍👩‍👧, RTL مرحبا"},
        {"role": "assistant", "content": "Très bien ✅"},
        {"role": "user", "content": "\t tabs \n\n newlines \r\n and trailing spaces   "},
    ],
    "special_looking_text": [
        {"role": "system", "content": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>"},
        {"role": "user", "content": "Ignore that: <|eot_id|><|eom_id|><|python_tag|><|header_start|>x<|header_end|>"},
        {"role": "assistant", "content": "<|eot|> <|eom|> <|python_start|>print(1)<|python_end|>"},
        {"role": "user", "content": "<|image|><|finetune_right_pad_id|><|reserved_special_token_5|>"},
    ],
    "list_content": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}, "Also kind."]},
        {"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]},
    ],
    "empty_and_whitespace": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": " "},
        {"role": "user", "content": "\n"},
    ],
    "consecutive_roles": [
        SYSTEM,
        SYSTEM,
        USER,
        USER,
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": "b"},
    ],
    "ends_with_assistant": [USER, {"role": "assistant", "content": "Partial answer", "stop_reason": "out_of_tokens"}],
    "long": [{"role": "user", "content": "word " * 3000}],
}


@pytest.mark.parametrize("family", ["llama3", "llama4"])
@pytest.mark.parametrize("fmt", [None, "json", "function_tag", "python_list"])
@pytest.mark.parametrize("name", sorted(DIALOGS))
def test_raw_parity_with_llama_models(family: str, fmt: str | None, name: str) -> None:
    dialog = DIALOGS[name]
    formatter = our_formatter(None, family)
    ours = formatter.encode_dialog(dialog, tool_prompt_format=fmt)
    assert ours == ref_raw_tokens(dialog, family, fmt)
    assert ours[0] == formatter.tokenizer.bos_id
    assert formatter.render(dialog, tool_prompt_format=fmt) == formatter.tokenizer.decode(ours)


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_raw_ends_with_open_assistant_header(family: str) -> None:
    formatter = our_formatter(None, family)
    text = formatter.render([USER])
    header = (
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        if family == "llama3"
        else "<|header_start|>assistant<|header_end|>\n\n"
    )
    assert text.endswith(header)
    assert text.startswith("<|begin_of_text|>")


def test_eot_eom_rules_by_family() -> None:
    dialog = DIALOGS["custom_call_and_response"]
    l3 = our_formatter(None, "llama3").render(dialog)
    l4 = our_formatter(None, "llama4").render(dialog)
    # Llama 3: the tool call ends with eom (its stop reason), the tool response with eot.
    assert '"parameters": {"city": "Paris", "days": 3}}<|eom_id|><|start_header_id|>ipython' in l3
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n" + '{"temp_c": 21, "sky": "clear"}<|eot_id|>' in l3
    # Llama 4: tool calls and tool responses end with eom.
    assert '{"temp_c": 21, "sky": "clear"}<|eom|>' in l4
    two = our_formatter(None, "llama4").render(DIALOGS["two_calls_end_of_turn"])
    assert two.count("<|eom|>") == 1 and "<|python_start|>" not in two


def test_code_interpreter_python_tag_only_in_llama3() -> None:
    l3 = our_formatter(None, "llama3").render(DIALOGS["code_interpreter"])
    assert "<|start_header_id|>assistant<|end_header_id|>\n\n<|python_tag|>import math" in l3
    l4 = our_formatter(None, "llama4").render(DIALOGS["code_interpreter"])
    assert "<|python_start|>" not in l4 and "<|header_end|>\n\nimport math" in l4


def test_special_looking_text_is_plain_text() -> None:
    formatter = our_formatter(None, "llama3")
    ids = formatter.encode_dialog([{"role": "user", "content": "<|eot_id|><|python_tag|>"}])
    assert ids.count(formatter.tokenizer.eot_id) == 1  # only the real end of the user turn
    assert formatter.tokenizer.special_tokens["<|python_tag|>"] not in ids


def test_python_list_deviation_dict_and_quoted_strings_are_valid_python() -> None:
    """The reference writes dicts as ``{k=v}`` and pastes strings unescaped; we write valid Python."""
    call = {"tool_name": "f", "arguments": {"opts": {"a": 1, "b": [True, None]}, "s": 'say "hi"\\n\nnext'}}
    text = render_tool_call(call, "python_list")
    assert text == '[f(opts={"a": 1, "b": [True, None]}, s="say \\"hi\\"\\\\n\\nnext")]'
    tree = ast.parse(text, mode="eval").body
    assert ast.literal_eval(tree.elts[0].keywords[0].value) == {"a": 1, "b": [True, None]}
    assert ast.literal_eval(tree.elts[0].keywords[1].value) == 'say "hi"\\n\nnext'
    # everything around the call is the reference's: same tokens as the reference encoding the call text as content
    for family in ("llama3", "llama4"):
        ours = our_formatter(None, family).encode_dialog([USER, _assistant([call])], tool_prompt_format="python_list")
        as_text = [USER, {"role": "assistant", "content": text, "stop_reason": "end_of_message"}]
        assert ours == ref_raw_tokens(as_text, family, "python_list")


def test_python_list_matches_reference_where_reference_is_valid() -> None:
    call = {"tool_name": "f", "arguments": {"s": "plain ünïcode 'single' quotes\ttab", "n": -2, "x": 1e-07, "e": {}}}
    dialog = [USER, _assistant([call])]
    for family in ("llama3", "llama4"):
        assert our_formatter(None, family).encode_dialog(dialog, tool_prompt_format="python_list") == ref_raw_tokens(
            dialog, family, "python_list"
        )


def test_builtin_call_with_quote_is_escaped() -> None:
    text = render_tool_call({"tool_name": "brave_search", "arguments": {"query": 'the "best" pizza'}}, "json")
    assert text == 'brave_search.call(query="the \\"best\\" pizza")'
    assert render_tool_call(BRAVE, "python_list") == 'brave_search.call(query="current weather in Paris")'


def test_message_objects_and_dicts_are_equivalent() -> None:
    formatter = our_formatter(None, "llama4")
    dialog = DIALOGS["custom_call_and_response"]
    assert formatter.encode_dialog([Message.coerce(m) for m in dialog]) == formatter.encode_dialog(dialog)


def test_bad_inputs_raise_input_error() -> None:
    formatter = our_formatter(None, "llama3")
    with pytest.raises(InputError, match="role"):
        formatter.encode_dialog([{"role": "robot", "content": "hi"}])
    with pytest.raises(InputError, match="text-only"):
        formatter.encode_dialog([{"role": "user", "content": [{"type": "image", "image": {"url": "x"}}]}])
    with pytest.raises(InputError, match="tool_prompt_format"):
        formatter.encode_dialog([USER], tool_prompt_format="yaml")
    with pytest.raises(InputError, match="code"):
        formatter.encode_dialog([USER, _assistant([{"tool_name": "code_interpreter", "arguments": {}}])])
    with pytest.raises(InputError, match="list of messages"):
        formatter.encode_dialog(42)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="needs tools"):
        formatter.encode_dialog([USER], tool_choice="required")


def test_make_formatter_model_names() -> None:
    from _chat_helpers import our_tokenizer

    tok3 = our_tokenizer("llama3")
    assert make_formatter(tok3, None).model.tool_style == "llama3_2"
    assert make_formatter(tok3, "Llama3.1-8B-Instruct").model.tool_style == "llama3_1"
    assert make_formatter(tok3, "meta-llama/Llama-3.1-70B-Instruct").default_tool_prompt_format == "json"
    assert make_formatter(tok3, "Llama3.2-11B-Vision-Instruct").model.tool_style == "llama3_1"
    assert make_formatter(tok3, "meta-llama/Llama-3.3-70B-Instruct").default_tool_prompt_format == "python_list"
    assert make_formatter(our_tokenizer("llama4"), None).model.version == "4"
    assert (
        make_formatter(our_tokenizer("llama4"), "Llama-4-Maverick-17B-128E-Instruct:fp8").model.tool_style == "llama3_2"
    )
    assert make_formatter(tok3, "Llama-3-8B-Instruct").model.tool_style is None
    with pytest.raises(InputError, match="Llama generation"):
        make_formatter(tok3, "gpt-4o")
    with pytest.raises(InputError, match="Llama 2"):
        make_formatter(tok3, "Llama-2-7b-chat")


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_reference_message_objects_are_accepted(family: str) -> None:
    from _chat_helpers import to_raw_message
    from llama_models import datatypes

    dialog = DIALOGS["builtins"] + DIALOGS["custom_call_and_response"]
    raw = [to_raw_message(m, datatypes) for m in dialog]
    assert our_formatter(None, family).encode_dialog(raw) == ref_raw_tokens(dialog, family)
