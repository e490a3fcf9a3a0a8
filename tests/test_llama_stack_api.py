"""Llama Stack's inference spellings on every method, its result shapes, and the system-message "replace"
behaviour through chat_completion (against llama-stack 0.2.2's own prompt and pydantic models).

Every Llama Stack spelling is compared with its native twin on the demo model: the same tokens, the same
results (call ids aside: they are fresh per reply), and logprobs equal up to float noise (a prefix reused
from the KV cache computes the same numbers in another order).
"""

from __future__ import annotations

import pytest
from _chat_helpers import ref_stack_tokens

import workbench as wb
from workbench.demo.artifact import DEFAULT_MODEL_NAME
from workbench.demo.tools import DEMO_TOOLS
from workbench.engine.llama_stack import ModelMismatchError, SpellingConflictError, loaded_model_ids
from workbench.errors import InputError, SamplingError
from workbench.runtime.settings import default_model_name
from workbench.session import build_engine, resolve_settings
from workbench.types import ChatCompletion, Completion, llama_stack_batch

inference = pytest.importorskip("llama_stack.apis.inference")
content_types = pytest.importorskip("llama_stack.apis.common.content_types")

TOOLS = [DEMO_TOOLS[k] for k in ("get_weather", "convert_currency", "get_random_joke")]
WEATHER = [{"role": "user", "content": "What's the weather in Paris?"}]
JOKE = [{"role": "user", "content": "Tell me a joke"}]
TOP_P = {"strategy": {"type": "top_p", "temperature": 0.8, "top_p": 0.9}, "max_tokens": 6}


@pytest.fixture(scope="module")
def engine():
    return wb.load()


def _row(result):
    """What must be equal between a spelling and its twin: tokens, text, stop reason, calls without ids."""
    if isinstance(result, Completion):
        return result.tokens, result.text, result.stop_reason
    calls = [(c.tool_name, c.arguments) for c in result.message.tool_calls]
    return result.tokens, result.message.content, result.stop_reason, calls


def _same_logprobs(a, b) -> None:
    assert (a is None) == (b is None)
    for x, y in zip(a or [], b or []):
        assert (x.token, x.top_tokens) == (y.token, y.top_tokens)
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4)


def _same(a, b) -> None:
    assert _row(a) == _row(b)
    _same_logprobs(a.logprobs, b.logprobs)


# ------------------------------------------------------------------------------------------- completions
def test_completion_spellings_equal_native(engine):
    native = engine.completion("The capital of France is", max_tokens=6, temperature=0.8, top_p=0.9, seed=5, logprobs=2)
    as_dict = engine.completion(
        content="The capital of France is",
        sampling_params=TOP_P,
        seed=5,
        logprobs={"top_k": 2},
        model_id=loaded_model_ids(engine)[0],
    )
    params = inference.SamplingParams(strategy=inference.TopPSamplingStrategy(temperature=0.8, top_p=0.9), max_tokens=6)
    as_pydantic = engine.completion(
        "The capital of France is", sampling_params=params, seed=5, logprobs=inference.LogProbConfig(top_k=2)
    )
    _same(native, as_dict)
    _same(native, as_pydantic)
    # Llama Stack's content items are its prompt's text
    items = engine.completion(
        [content_types.TextContentItem(text="The capital of France is")],
        sampling_params=TOP_P,
        seed=5,
        logprobs={"top_k": 2},
    )
    _same(native, items)


def test_batch_completion_content_batch_and_strategies(engine):
    prompts = ["Once upon a time", "The weather today"]
    top_k = {"strategy": {"type": "top_k", "top_k": 3}, "max_tokens": 5}
    native = engine.batch_completion(prompts, top_k=3, temperature=1.0, max_tokens=5, seed=2)
    spelled = engine.batch_completion(content_batch=prompts, sampling_params=top_k, seed=2)
    assert [_row(r) for r in spelled] == [_row(r) for r in native]
    # greedy, stop strings and "max_tokens": 0 (no limit: bounded here by the stop string or the stop token)
    greedy = {"strategy": {"type": "greedy"}, "max_tokens": 4, "stop": [" a"]}
    assert [_row(r) for r in engine.batch_completion(content_batch=prompts, sampling_params=greedy)] == [
        _row(r) for r in engine.batch_completion(prompts, max_tokens=4, stop=[" a"])
    ]
    # the same native value beside its spelling is no conflict
    same = engine.batch_completion(
        prompts, content_batch=prompts, sampling_params=top_k, temperature=1.0, top_k=3, seed=2
    )
    assert [_row(r) for r in same] == [_row(r) for r in native]


def test_stream_completion_spellings(engine):
    native = list(engine.stream_completion("Hello there", max_tokens=5, temperature=0.8, top_p=0.9, seed=1))
    spelled = list(engine.stream_completion(content="Hello there", sampling_params={**TOP_P, "max_tokens": 5}, seed=1))
    assert [c.text for c in spelled] == [c.text for c in native]
    _same(native[-1].final, spelled[-1].final)


def _finals(stream) -> list:
    finals: dict = {}
    for row, chunk in stream:
        if chunk.final is not None:
            finals[row] = chunk.final
    return [finals[i] for i in sorted(finals)]


def test_stream_batch_spellings(engine):
    prompts = ["Once upon a time", "The weather today"]
    native = _finals(engine.stream_batch_completion(prompts, max_tokens=4, temperature=0.8, top_p=0.9, seed=4))
    spelled = _finals(
        engine.stream_batch_completion(content_batch=prompts, sampling_params={**TOP_P, "max_tokens": 4}, seed=4)
    )
    assert [_row(r) for r in spelled] == [_row(r) for r in native]
    native = _finals(engine.stream_batch_chat_completion([WEATHER, JOKE], TOOLS, tool_choice="required", max_tokens=24))
    spelled = _finals(
        engine.stream_batch_chat_completion(
            messages_batch=[WEATHER, JOKE],
            tools=TOOLS,
            tool_config={"tool_choice": "required"},
            sampling_params={"max_tokens": 24},
        )
    )
    assert [_row(r) for r in spelled] == [_row(r) for r in native]


# ------------------------------------------------------------------------------------------- chat
def test_chat_spellings_equal_native(engine):
    config = inference.ToolConfig(tool_choice="required", tool_prompt_format="python_list")
    stack_messages = [inference.UserMessage(content="What's the weather in Paris?")]
    native = engine.chat_completion(
        WEATHER, TOOLS, tool_choice="required", tool_prompt_format="python_list", max_tokens=24, logprobs=1
    )
    spelled = engine.chat_completion(
        messages=stack_messages,
        tools=TOOLS,
        tool_config=config,
        logprobs={},
        sampling_params={"strategy": {"type": "greedy"}, "max_tokens": 24},
    )
    _same(native, spelled)
    assert native.message.tool_calls, "the demo model answers this with a call"
    as_dict = engine.chat_completion(
        WEATHER,
        TOOLS,
        tool_config={"tool_choice": "required"},
        sampling_params=inference.SamplingParams(max_tokens=24),
        logprobs={"top_k": 1},
    )
    _same(native, as_dict)


def test_batch_and_stream_chat_spellings(engine):
    dialogs = [WEATHER, JOKE]
    native = engine.batch_chat_completion(dialogs, TOOLS, max_tokens=24, temperature=0.8, seed=3)
    spelled = engine.batch_chat_completion(
        messages_batch=dialogs,
        tools=TOOLS,
        tool_config={"tool_choice": "auto"},
        sampling_params={"strategy": {"type": "top_p", "temperature": 0.8, "top_p": None}, "max_tokens": 24},
        seed=3,
    )
    assert [_row(r) for r in spelled] == [_row(r) for r in native]

    def items(stream):
        return [
            (type(i).__name__, getattr(i, "text", None), getattr(getattr(i, "tool_call", None), "arguments", None))
            for i in stream
        ]

    native_stream = list(engine.stream_chat_completion(WEATHER, TOOLS, tool_choice="required", max_tokens=24))
    spelled_stream = list(
        engine.stream_chat_completion(
            WEATHER, TOOLS, tool_config={"tool_choice": "required"}, sampling_params={"max_tokens": 24}
        )
    )
    assert items(spelled_stream[:-1]) == items(native_stream[:-1])
    _same(native_stream[-1], spelled_stream[-1])


def test_tool_loop_spellings(engine):
    native = wb.tools.run(engine, WEATHER, TOOLS, tool_choice="required", max_tokens=24, max_turns=2)
    spelled = wb.tools.run(
        engine,
        WEATHER,
        TOOLS,
        tool_config={"tool_choice": "required"},
        max_turns=2,
        sampling_params={"strategy": {"type": "greedy"}, "max_tokens": 24},
        model_id=loaded_model_ids(engine)[0],
    )

    def plain(transcript):
        return [(m.role, m.content, [(c.tool_name, c.arguments) for c in m.tool_calls]) for m in transcript]

    assert plain(spelled) == plain(native) and len(native) >= 3  # the call, its result, the next reply
    batch = wb.tools.run_batch(
        engine, messages_batch=[WEATHER, JOKE], tools=TOOLS, max_turns=1, sampling_params={"max_tokens": 16}
    )
    assert [plain(t) for t in batch] == [
        plain(t) for t in wb.tools.run_batch(engine, [WEATHER, JOKE], TOOLS, max_turns=1, max_tokens=16)
    ]


def test_disagreeing_spellings_and_bad_values_raise(engine):
    with pytest.raises(SpellingConflictError, match="temperature=0.5 disagrees with sampling_params"):
        engine.completion("x", temperature=0.5, sampling_params={"strategy": {"type": "greedy"}})
    with pytest.raises(SpellingConflictError, match="max_tokens=3"):
        engine.completion("x", max_tokens=3, sampling_params={"max_tokens": 4})
    with pytest.raises(SpellingConflictError, match="tool_choice='none' disagrees with tool_config"):
        engine.chat_completion(WEATHER, TOOLS, tool_choice="none", tool_config={"tool_choice": "required"})
    with pytest.raises(SpellingConflictError, match="contents"):
        engine.batch_completion(["a"], content_batch=["b"])
    with pytest.raises(SpellingConflictError, match="dialogs"):
        engine.batch_chat_completion([WEATHER], messages_batch=[JOKE])
    with pytest.raises(ModelMismatchError, match="is not the loaded model"):
        engine.chat_completion(WEATHER, model_id="meta-llama/Llama-3.2-3B-Instruct")
    with pytest.raises(SamplingError, match="repetition_penalty must be a finite number > 0"):
        engine.completion("x", sampling_params={"repetition_penalty": 0})
    with pytest.raises(SpellingConflictError, match="repetition_penalty=1.1"):
        engine.completion("x", repetition_penalty=1.1, sampling_params={"repetition_penalty": 1.2})
    with pytest.raises(SamplingError, match="strategy.type must be one of greedy, top_p, top_k"):
        engine.completion("x", sampling_params={"strategy": {"type": "beam"}})
    with pytest.raises(SamplingError, match="top_k must be an integer >= 1"):
        engine.completion("x", sampling_params={"strategy": {"type": "top_k"}})
    with pytest.raises(InputError, match="sampling_params has no field 'temperature'"):
        engine.completion("x", sampling_params={"temperature": 0.7})
    with pytest.raises(InputError, match="system_message_behavior must be 'append' or 'replace'"):
        engine.chat_completion(WEATHER, TOOLS, tool_config={"system_message_behavior": "merge"})
    with pytest.raises(TypeError):  # a misspelt keyword is still Python's error, not silently dropped
        engine.completion("x", temprature=0.5)
    # accepted: repetition_penalty 1.0, the served id (org/name), an explicitly equal native value
    engine.completion("x", max_tokens=1, sampling_params={"repetition_penalty": 1.0, "max_tokens": 1})
    # repetition_penalty is the native keyword: Llama Stack's spelling gives the same tokens
    assert (
        engine.completion("x", max_tokens=6, sampling_params={"repetition_penalty": 1.5}).tokens
        == engine.completion("x", max_tokens=6, repetition_penalty=1.5).tokens
    )
    engine.completion("x", model_id=f"workbench/{loaded_model_ids(engine)[0]}", max_tokens=1)


def test_the_embedded_default_answers_to_its_name_from_the_settings(engine, llama3_dir):
    """The engine imports nothing from the demo package: settings resolution (the config layer) names the
    embedded default in the checkpoint's source, and Llama Stack's model_id routes by that name."""
    assert default_model_name(engine.settings) == DEFAULT_MODEL_NAME
    assert DEFAULT_MODEL_NAME in loaded_model_ids(engine)
    assert engine.completion("x", model_id=DEFAULT_MODEL_NAME, max_tokens=1).tokens
    with pytest.raises(ModelMismatchError, match="is not the loaded model"):
        engine.completion("x", model_id="Llama3.2-3B-Instruct", max_tokens=1)
    assert default_model_name(resolve_settings(llama3_dir)) is None  # a checkpoint of one's own has no such name


# ------------------------------------------------------------------------------------------- system message
def _prompt_through_chat(engine, dialog, tools, **kwargs) -> list[int]:
    """The prompt Engine.chat_completion hands to the engine (captured on its way to generate_tokens)."""
    captured = []
    original = engine.generate_tokens

    def spy(requests, *args, **options):
        captured.extend(r.prompt for r in requests)
        return original(requests, *args, **options)

    engine.generate_tokens = spy
    try:
        engine.chat_completion(dialog, tools, max_tokens=1, **kwargs)
    finally:
        del engine.generate_tokens
    return list(captured[0])


REPLACE_SYSTEMS = {
    "placeholder": "You are a travel desk.\n{{function_description}}\nCall one tool at most.",
    "no_placeholder": "You are a travel desk. Call one tool at most.",
}
STACK_TOOLS = [  # the same tools as Llama Stack definitions (the reference takes these)
    {
        "tool_name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"city": {"param_type": "string", "description": "Name of the city.", "required": True}},
    },
    "brave_search",
]


def _check_replace(engine, model: str) -> None:
    for name, system in REPLACE_SYSTEMS.items():
        dialog = [{"role": "system", "content": system}, *WEATHER]
        for tools in (STACK_TOOLS[:1], STACK_TOOLS):
            ref = ref_stack_tokens(dialog, tools, "auto", None, model, system_message_behavior="replace")
            ours = _prompt_through_chat(engine, dialog, tools, tool_config={"system_message_behavior": "replace"})
            assert ours == ref, (model, name, len(tools))
            native = _prompt_through_chat(engine, dialog, tools, system_message_behavior="replace")
            assert native == ref
            append = ref_stack_tokens(dialog, tools, "auto", None, model)
            assert append != ref and _prompt_through_chat(engine, dialog, tools) == append


def test_system_message_replace_llama4(engine):
    _check_replace(engine, "Llama-4-Scout-17B-16E-Instruct")


def test_system_message_replace_llama3(llama3_dir):
    engine = build_engine(
        resolve_settings(llama3_dir, model="Llama3.2-3B-Instruct", max_batch_size=2, max_seq_len=1024)
    )
    try:
        _check_replace(engine, "Llama3.2-3B-Instruct")
    finally:
        engine.close()


# ------------------------------------------------------------------------------------------- result shapes
def test_results_in_llama_stack_shapes(engine):
    reply = engine.chat_completion(WEATHER, TOOLS, tool_choice="required", max_tokens=24, logprobs=2)
    response = reply.to_llama_stack()
    assert isinstance(response, inference.ChatCompletionResponse)
    message = response.completion_message
    assert message.stop_reason.value == reply.stop_reason and message.content == reply.text
    assert [(c.call_id, c.tool_name, c.arguments) for c in message.tool_calls] == [
        (c.call_id, c.tool_name, c.arguments) for c in reply.message.tool_calls
    ]
    assert len(response.logprobs) == len(reply.tokens)
    for lp, ours in zip(response.logprobs, reply.logprobs):
        assert lp.logprobs_by_token[ours.text] == ours.logprob
        assert set(ours.top_logprobs) <= set(lp.logprobs_by_token)
    plain = reply.to_llama_stack(plain=True)
    assert inference.ChatCompletionResponse.model_validate(plain) == response

    completions = engine.batch_completion(["Hello", "The sky is"], max_tokens=3, logprobs=1)
    batch = llama_stack_batch(completions)
    assert isinstance(batch, inference.BatchCompletionResponse)
    assert [(r.content, r.stop_reason.value) for r in batch.batch] == [(c.text, c.stop_reason) for c in completions]
    assert inference.BatchCompletionResponse.model_validate(llama_stack_batch(completions, plain=True)) == batch
    assert engine.completion("Hi", max_tokens=2).to_llama_stack().logprobs is None

    replies = engine.batch_chat_completion([WEATHER, JOKE], TOOLS, max_tokens=16)
    chat_batch = llama_stack_batch(replies)
    assert isinstance(chat_batch, inference.BatchChatCompletionResponse)
    assert inference.BatchChatCompletionResponse.model_validate(llama_stack_batch(replies, plain=True)) == chat_batch
    with pytest.raises(InputError, match="all Completion or all ChatCompletion"):
        llama_stack_batch([completions[0], replies[0]])


def test_plain_dicts_without_llama_stack(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_llama_stack(name, *args, **kwargs):
        if name.startswith("llama_stack"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llama_stack)
    call = wb.ToolCall(tool_name="get_weather", arguments={"city": "Paris"}, call_id="c1")
    reply = ChatCompletion(
        message=wb.Message(role="assistant", tool_calls=[call]), tokens=[1, 2], stop_reason="end_of_message"
    )
    assert reply.to_llama_stack() == {
        "completion_message": {
            "role": "assistant",
            "content": "",
            "stop_reason": "end_of_message",
            "tool_calls": [
                {
                    "call_id": "c1",
                    "tool_name": "get_weather",
                    "arguments": {"city": "Paris"},
                    "arguments_json": '{"city": "Paris"}',
                }
            ],
        },
        "logprobs": None,
    }
    done = Completion(text="hi", tokens=[5], stop_reason="cancelled")
    assert llama_stack_batch([done]) == {"batch": [{"content": "hi", "stop_reason": "out_of_tokens", "logprobs": None}]}


# ------------------------------------------------------------------------------------------- the endpoint
@pytest.fixture(scope="module")
def stack_client(engine):
    client_module = pytest.importorskip("llama_stack_client")
    pytest.importorskip("fastapi")
    server = wb.serve(engine, port=0)
    yield server, client_module.LlamaStackClient(base_url=server.url.removesuffix("/v1"), max_retries=0, timeout=120)
    server.stop()


def test_llama_stack_client_models_and_batch_completion(stack_client, engine):
    server, client = stack_client
    (model,) = client.models.list()
    assert (model.identifier, model.api_model_type, model.provider_id) == (server.model, "llm", "workbench")
    assert client.models.retrieve(server.model).identifier == server.model
    prompts = ["Once upon a time", "The weather today"]
    params = {"strategy": {"type": "top_p", "temperature": 0.8, "top_p": 0.9}, "max_tokens": 5}
    got = client.inference.batch_completion(
        model_id=server.model,
        content_batch=prompts,
        sampling_params=params,
        logprobs={"top_k": 2},
        extra_body={"seed": 5},
    )
    ref = engine.batch_completion(prompts, max_tokens=5, temperature=0.8, top_p=0.9, logprobs=2, seed=5)
    assert [(r.content, r.stop_reason) for r in got.batch] == [(c.text, c.stop_reason) for c in ref]
    for response, completion in zip(got.batch, ref):
        assert [list(lp.logprobs_by_token) for lp in response.logprobs] == [
            list(lp.logprobs_by_token) for lp in completion.to_llama_stack().logprobs
        ]
    single = client.inference.completion(
        model_id=server.model, content="Hello there", sampling_params={"max_tokens": 4, "stop": ["e"]}
    )
    assert single.content == engine.completion("Hello there", max_tokens=4, stop=["e"]).text
    with pytest.raises(client_error(), match="not served here"):
        client.inference.completion(model_id="meta-llama/Llama-3.2-3B-Instruct", content="Hello")


def client_error():
    from llama_stack_client import APIStatusError

    return APIStatusError


def test_llama_stack_client_batch_chat_with_tools(stack_client, engine):
    server, client = stack_client
    dialogs = [WEATHER, JOKE, [{"role": "user", "content": "Hello, who are you?"}]]
    got = client.inference.batch_chat_completion(
        model_id=server.model,
        messages_batch=dialogs,
        tools=STACK_TOOLS[:1],
        tool_config={"tool_choice": "auto"},
        sampling_params={"max_tokens": 24},
    )
    ref = engine.batch_chat_completion(dialogs, STACK_TOOLS[:1], max_tokens=24)
    assert any(r.message.tool_calls for r in ref)
    for response, reply in zip(got.batch, ref):
        message = response.completion_message
        assert (message.content, message.stop_reason) == (reply.text, reply.stop_reason)
        assert [(c.tool_name, c.arguments) for c in message.tool_calls] == [
            (c.tool_name, c.arguments) for c in reply.message.tool_calls
        ]
    # the next turn: the client's own message objects go back in as they came
    call = got.batch[0].completion_message
    follow = [
        *WEATHER,
        call.model_dump(exclude_none=True),
        {"role": "tool", "call_id": call.tool_calls[0].call_id, "content": "18 C, sunny"},
    ]
    second = client.inference.chat_completion(
        model_id=server.model, messages=follow, tools=STACK_TOOLS[:1], sampling_params={"max_tokens": 24}
    )
    assert second.completion_message.content == engine.chat_completion(follow, STACK_TOOLS[:1], max_tokens=24).text


def test_llama_stack_client_streaming_chat(stack_client, engine):
    server, client = stack_client
    for dialog in (WEATHER, JOKE):
        events = [
            chunk.event
            for chunk in client.inference.chat_completion(
                model_id=server.model,
                messages=dialog,
                tools=STACK_TOOLS[:1],
                stream=True,
                sampling_params={"max_tokens": 24},
            )
        ]
        ref = engine.chat_completion(dialog, STACK_TOOLS[:1], max_tokens=24)
        assert events[0].event_type == "start" and events[-1].event_type == "complete"
        assert events[-1].stop_reason == ref.stop_reason
        texts = [e.delta.text for e in events if e.delta.type == "text" and e.event_type == "progress"]
        calls = [e.delta.tool_call for e in events if getattr(e.delta, "parse_status", None) == "succeeded"]
        assert [(c.tool_name, c.arguments) for c in calls] == [
            (c.tool_name, c.arguments) for c in ref.message.tool_calls
        ]
        native = engine.stream_chat_completion(dialog, STACK_TOOLS[:1], max_tokens=24)
        assert texts == [i.text for i in native if getattr(i, "type", None) == "text"]  # the same pieces, in order


# ------------------------------------------------------------------------------------------- what the suite touches
def test_llama_stack_client_discovery_routes(stack_client):
    """Llama Stack's integration suite finds the model's provider first (GET /v1/providers)."""
    server, client = stack_client
    (provider,) = [p for p in client.providers.list() if p.api == "inference"]
    assert (provider.provider_id, provider.provider_type) == ("workbench", "inline::meta-reference")
    assert client.providers.retrieve("workbench").config["model"] == server.model
    with pytest.raises(client_error(), match="only provider is 'workbench'"):
        client.providers.retrieve("remote::ollama")
    assert client.inspect.health().status == "OK"
    assert client.inspect.version().version
    routes = {(r.route, r.method) for r in client.routes.list()}
    assert {
        ("/v1/providers", "GET"),
        ("/v1/inference/chat-completion", "POST"),
        ("/v1/models", "POST"),
        ("/v1/chat/completions", "POST"),
        ("/v1/openai/v1/chat/completions", "POST"),
        ("/v1/openai/v1/batches", "POST"),
    } <= routes


def test_llama_stack_model_registration(stack_client, engine):
    server, client = stack_client
    assert client.models.register(model_id=server.model).identifier == server.model  # its own id: accepted
    alias = client.models.register(model_id="my-demo", provider_model_id=server.model, provider_id="workbench")
    assert (alias.identifier, alias.provider_resource_id, alias.provider_id) == ("my-demo", server.model, "workbench")
    try:
        assert {m.identifier for m in client.models.list()} == {server.model, "my-demo"}
        reply = client.inference.completion(model_id="my-demo", content="Hello", sampling_params={"max_tokens": 3})
        assert reply.content == engine.completion("Hello", max_tokens=3).text
        import openai

        chat = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0).chat.completions.create(
            model="my-demo", messages=JOKE, max_tokens=3
        )
        assert chat.choices[0].message.content == engine.chat_completion(JOKE, max_tokens=3).message.content
    finally:
        client.models.unregister("my-demo")
    assert [m.identifier for m in client.models.list()] == [server.model]
    for kwargs, status in (
        ({"model_id": "meta-llama/Llama-3.1-8B-Instruct"}, 400),
        ({"model_id": "x", "provider_model_id": "gpt-4"}, 400),
        ({"model_id": server.model, "model_type": "embedding"}, 400),
        ({"model_id": server.model, "provider_id": "ollama"}, 404),
    ):
        with pytest.raises(client_error()) as refused:
            client.models.register(**kwargs)
        assert refused.value.status_code == status
    with pytest.raises(client_error(), match="serves one model"):
        client.models.register(model_id="meta-llama/Llama-3.1-8B-Instruct")
    with pytest.raises(client_error()):
        client.models.unregister(server.model)


def test_registration_of_the_models_own_names(llama3_dir):
    """A Llama 3.2 engine registers its Hugging Face name (the suite's --text-model) and answers under it."""
    from llama_stack_client import LlamaStackClient

    engine = build_engine(resolve_settings(llama3_dir, model="Llama3.2-3B-Instruct", max_batch_size=2, max_seq_len=256))
    try:
        with wb.serve(engine, port=0) as server:
            client = LlamaStackClient(base_url=server.url.removesuffix("/v1"), max_retries=0, timeout=120)
            model = client.models.register(model_id="meta-llama/Llama-3.2-3B-Instruct", provider_id="workbench")
            assert model.provider_resource_id == server.model
            reply = client.inference.completion(
                model_id="meta-llama/Llama-3.2-3B-Instruct", content="Hi", sampling_params={"max_tokens": 2}
            )
            assert reply.content == engine.completion("Hi", max_tokens=2).text
            with pytest.raises(client_error()):
                client.models.register(model_id="meta-llama/Llama-3.1-8B-Instruct")
    finally:
        engine.close()


def test_llama_stack_routes_honour_response_format_logprobs_and_stop(stack_client, engine):
    import json

    server, client = stack_client
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": schema}
    got = client.inference.chat_completion(
        model_id=server.model, messages=WEATHER, response_format=fmt, sampling_params={"max_tokens": 40}
    )
    ref = engine.chat_completion(WEATHER, response_format=fmt, max_tokens=40)
    assert got.completion_message.content == ref.message.content and ref.message.content.startswith('{"city": ')
    if ref.stop_reason != "out_of_tokens":
        assert set(json.loads(ref.message.content)) == {"city"}
    grammar = {"type": "grammar", "bnf": {"root": '"yes" | "no"'}}
    answer = client.inference.completion(
        model_id=server.model, content="Is Paris in France?", response_format=grammar, sampling_params={"max_tokens": 4}
    )
    assert answer.content in ("yes", "no")
    assert answer.content == engine.completion("Is Paris in France?", response_format=grammar, max_tokens=4).text
    batch = client.inference.batch_chat_completion(
        model_id=server.model, messages_batch=[WEATHER, JOKE], response_format=fmt, sampling_params={"max_tokens": 40}
    )
    assert [r.completion_message.content for r in batch.batch] == [
        r.message.content for r in engine.batch_chat_completion([WEATHER, JOKE], response_format=fmt, max_tokens=40)
    ]
    # logprobs: one entry per generated token with top_k alternatives, also per streamed chunk
    ref = engine.completion("Once upon a time", max_tokens=6, logprobs=2)
    whole = client.inference.completion(
        model_id=server.model, content="Once upon a time", logprobs={"top_k": 2}, sampling_params={"max_tokens": 6}
    )
    assert whole.content == ref.text and len(whole.logprobs) == len(ref.tokens)
    for got_lp, ref_lp in zip(whole.logprobs, ref.to_llama_stack().logprobs):
        assert got_lp.logprobs_by_token == pytest.approx(ref_lp.logprobs_by_token, abs=1e-4)  # a reused prefix: noise
    chunks = list(
        client.inference.completion(
            model_id=server.model,
            content="Once upon a time",
            stream=True,
            logprobs={"top_k": 1},
            sampling_params={"max_tokens": 6},
        )
    )
    assert "".join(c.delta for c in chunks) == ref.text
    for chunk in chunks:
        if chunk.delta:
            assert chunk.logprobs and all(len(lp.logprobs_by_token) == 1 for lp in chunk.logprobs)
    assert sum(len(c.logprobs or ()) for c in chunks) == len(ref.tokens)
    # stop strings, streamed and not
    stop = engine.completion("Once upon a time", max_tokens=12, stop=["a"])
    streamed = client.inference.completion(
        model_id=server.model,
        content="Once upon a time",
        stream=True,
        sampling_params={"max_tokens": 12, "stop": ["a"]},
    )
    assert "".join(c.delta for c in streamed) == stop.text and "a" not in stop.text


def test_openai_prefix_serves_the_openai_routes(stack_client, engine):
    """Llama Stack's OpenAI-compatible routes live under /v1/openai/v1 (its suite's openai_client)."""
    import openai

    server, _ = stack_client
    client = openai.OpenAI(base_url=server.url + "/openai/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [server.model]
    reply = client.chat.completions.create(model=server.model, messages=WEATHER, max_tokens=8)
    assert reply.choices[0].message.content == engine.chat_completion(WEATHER, max_tokens=8).message.content
    text = client.completions.create(model=server.model, prompt="Once upon a time", max_tokens=5)
    assert text.choices[0].text == engine.completion("Once upon a time", max_tokens=5).text
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=server.model, prompt="Once upon a time", max_tokens=5, stream=True)
        if c.choices
    )
    assert streamed == text.choices[0].text
