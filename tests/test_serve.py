"""workbench.serve: the official ``openai`` client against the served demo model, all on 127.0.0.1.

Every answer is compared with the same call made in-process on the same engine (greedy unless said), so
the tests hold the endpoint to "exactly what the engine gives", not just to a well-formed shape.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
import warnings

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.demo.tools import DEMO_TOOLS
from workbench.formats import coerce_tools
from workbench.serve import ServeError, Server, serve
from workbench.serve.shapes import ContentStreamer, safe_content_end

openai = pytest.importorskip("openai")

TOOLS = [
    d.to_openai() for d in coerce_tools([DEMO_TOOLS[k] for k in ("get_weather", "get_random_joke", "convert_currency")])
]
WEATHER = [{"role": "user", "content": "What's the weather in Paris?"}]
JOKE = [{"role": "user", "content": "Tell me a joke"}]
HELLO = [{"role": "user", "content": "Hello, who are you?"}]


@pytest.fixture(scope="module")
def engine():
    return wb.load()


@pytest.fixture(scope="module")
def srv(engine):
    server = serve(engine, port=0)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]


def _ref_calls(result) -> list[tuple[str, dict]]:
    return [(c.tool_name, c.arguments) for c in result.message.tool_calls]


def _accumulate(stream) -> dict:
    """The reply a client rebuilds from chunks: content, tool calls by index, finish reason, usage."""
    content, calls, finish, usage, roles = "", {}, None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            if delta.role:
                roles.append(delta.role)
            content += delta.content or ""
            for call in delta.tool_calls or ():
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                if call.function.name:
                    entry["name"] += call.function.name
                entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    tool_calls = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
    return {"content": content, "tool_calls": tool_calls, "finish": finish, "usage": usage, "roles": roles}


# --------------------------------------------------------------------------------------------- basics
def test_models_list_and_card(srv, client, engine):
    models = client.models.list()
    assert [m.id for m in models.data] == [srv.model]
    assert srv.model == "workbench-demo-llama4"  # the embedded default's short name, from its settings
    assert client.models.retrieve(srv.model).id == srv.model
    assert srv.url.startswith("http://127.0.0.1:") and srv.url.endswith("/v1")
    card = srv._repr_html_()
    assert srv.url in card and srv.model in card and "tokens/s" in card


def test_tool_call_equals_engine(srv, client, engine):
    reply = client.chat.completions.create(model=srv.model, messages=WEATHER, tools=TOOLS, max_tokens=40)
    ref = engine.chat_completion(WEATHER, tools=TOOLS, max_tokens=40)
    choice = reply.choices[0]
    assert ref.message.tool_calls, "the demo model calls get_weather for this dialog"
    assert choice.finish_reason == "tool_calls"
    assert isinstance(choice.message.tool_calls[0].function.arguments, str)  # a JSON string, as OpenAI sends
    assert _calls(choice.message) == _ref_calls(ref)
    assert reply.usage.prompt_tokens == ref.prompt_tokens
    assert reply.usage.completion_tokens == len(ref.tokens)


def test_multi_turn_tool_round_trip(srv, client, engine):
    first = client.chat.completions.create(model=srv.model, messages=WEATHER, tools=TOOLS, max_tokens=40)
    call = first.choices[0].message.tool_calls[0]
    result = DEMO_TOOLS[call.function.name](**json.loads(call.function.arguments))
    dialog = [
        *WEATHER,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    second = client.chat.completions.create(model=srv.model, messages=dialog, tools=TOOLS, max_tokens=40)
    ref = engine.chat_completion(dialog, tools=TOOLS, max_tokens=40)
    assert second.choices[0].message.content == ref.message.content
    assert second.choices[0].finish_reason == "stop" and not ref.message.tool_calls
    assert second.usage.completion_tokens == len(ref.tokens)


@pytest.mark.parametrize("dialog", [HELLO, JOKE, WEATHER], ids=["text", "call-no-args", "call"])
def test_stream_equals_non_streamed(srv, client, dialog):
    kwargs = {"model": srv.model, "messages": dialog, "tools": TOOLS, "max_tokens": 40}
    whole = client.chat.completions.create(**kwargs)
    got = _accumulate(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    message = whole.choices[0].message
    assert got["roles"] == ["assistant"]
    assert got["content"] == (message.content or "")
    assert got["tool_calls"] == _calls(message)
    assert got["finish"] == whole.choices[0].finish_reason
    assert got["usage"].completion_tokens == whole.usage.completion_tokens
    assert got["usage"].prompt_tokens == whole.usage.prompt_tokens


def test_a_server_with_a_run_stores_every_row_and_answers_from_the_store(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    store = wb.runs.store()
    with serve(engine, port=0, run="served") as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        kwargs = {"model": server.model, "messages": WEATHER, "tools": TOOLS, "max_tokens": 40}
        first = client.chat.completions.create(**kwargs)
        stored = list(store.rows("served"))
        assert len(stored) == 1 and stored[0].kind == "chat"
        assert engine.chat_completion(WEATHER, tools=TOOLS, max_tokens=40, run="served").cached  # what was served
        again = client.chat.completions.create(**kwargs)
        streamed = _accumulate(client.chat.completions.create(**kwargs, stream=True))
        text = client.completions.create(model=server.model, prompt="Once upon a time", max_tokens=6)
        assert "run served" in server._repr_html_()
    after = list(store.rows("served"))
    assert [(r.key, r.created_at) for r in after[:1]] == [(stored[0].key, stored[0].created_at)]  # not recomputed
    assert len(after) == 2 and after[1].kind == "completion"
    assert again.choices[0].message.content == first.choices[0].message.content
    assert _calls(again.choices[0].message) == _calls(first.choices[0].message) == streamed["tool_calls"]
    assert text.choices[0].text == engine.completion("Once upon a time", max_tokens=6, run="served").text


def test_sampling_n_seed_and_logprobs(srv, client, engine):
    reply = client.chat.completions.create(
        model=srv.model, messages=HELLO, max_tokens=12, temperature=0.9, seed=7, n=2, logprobs=True, top_logprobs=3
    )
    for i, choice in enumerate(reply.choices):  # choice i is the in-process call with seed + i
        ref = engine.chat_completion(HELLO, max_tokens=12, temperature=0.9, seed=7 + i, logprobs=3)
        assert choice.message.content == ref.message.content
        # tokens are exact; a logprob may differ in float32 rounding (a cached prefix is summed in another order)
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx(
            [lp.logprob for lp in ref.logprobs], abs=1e-4
        )
        assert all(len(t.top_logprobs) <= 3 for t in choice.logprobs.content)
    assert reply.usage.completion_tokens == sum(
        len(engine.chat_completion(HELLO, max_tokens=12, temperature=0.9, seed=7 + i).tokens) for i in range(2)
    )


def test_response_format_json_schema(srv, client):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=srv.model,
        messages=WEATHER,
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "forecast", "schema": schema}},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), schema)
    streamed = _accumulate(
        client.chat.completions.create(
            model=srv.model,
            messages=WEATHER,
            max_tokens=60,
            stream=True,
            response_format={"type": "json_schema", "json_schema": {"name": "forecast", "schema": schema}},
        )
    )
    assert streamed["content"] == choice.message.content


# --------------------------------------------------------------------------------------------- completions
def test_completions_equal_batch_completion(srv, client, engine):
    ids = engine.tokenizer.encode("The weather in Paris is", bos=True)
    for prompt in (["The capital of France is", "Hello"], "One two three", ids, [ids, ids[:3]]):
        reply = client.completions.create(model=srv.model, prompt=prompt, max_tokens=8, seed=1)
        rows = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt
        refs = engine.batch_completion(rows, max_tokens=8, seed=1)
        assert [c.text for c in reply.choices] == [r.text for r in refs]
        assert reply.usage.completion_tokens == sum(len(r.tokens) for r in refs)


def test_completions_echo_logprobs_score_the_prompt(srv, client, engine):
    """What lm-eval's local-completions sends for loglikelihood: token ids, echo, logprobs=1, max_tokens=1."""
    ids = engine.tokenizer.encode("The weather in Paris is sunny", bos=True)
    reply = client.completions.create(model=srv.model, prompt=[ids], max_tokens=1, echo=True, logprobs=1, temperature=0)
    lp = reply.choices[0].logprobs
    logp = engine.logits([ids])[0].log_softmax(-1)  # [len, vocab]
    expected = [None] + [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert lp.token_logprobs[: len(ids)] == expected
    greedy = engine.completion(ids, max_tokens=1, logprobs=1)
    assert lp.token_logprobs[len(ids)] == pytest.approx(greedy.logprobs[0].logprob, abs=1e-4)
    assert len(lp.tokens) == len(ids) + 1 and lp.top_logprobs[0] is None
    assert max(lp.top_logprobs[1].values()) == float(logp[0].max())
    assert reply.choices[0].text == engine.tokenizer.decode(ids) + greedy.text
    scored = client.completions.create(model=srv.model, prompt=[ids], max_tokens=0, echo=True, logprobs=0)
    assert scored.choices[0].logprobs.token_logprobs == expected


def test_completions_stream(srv, client, engine):
    chunks = list(
        client.completions.create(model=srv.model, prompt="The capital of France is", max_tokens=10, stream=True)
    )
    ref = engine.completion("The capital of France is", max_tokens=10)
    assert "".join(c.choices[0].text for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ("length" if ref.stop_reason == "out_of_tokens" else "stop")


# --------------------------------------------------------------------------------------------- many clients
def test_concurrent_requests_are_gathered_and_exact(srv, client, engine):
    dialogs = [WEATHER, JOKE, HELLO, [{"role": "user", "content": "Convert 100 USD to EUR"}]] * 2
    before = srv.stats.largest_batch
    srv.stats.largest_batch = 0
    out: dict[int, object] = {}

    def ask(i: int) -> None:
        out[i] = client.chat.completions.create(model=srv.model, messages=dialogs[i], tools=TOOLS, max_tokens=30)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(dialogs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refs = engine.batch_chat_completion(dialogs, tools=TOOLS, max_tokens=30)
    for i, ref in enumerate(refs):
        message = out[i].choices[0].message
        assert (message.content or "") == ref.message.content and _calls(message) == _ref_calls(ref)
    assert srv.stats.largest_batch > 1, "requests that arrived together shared the engine's running batch"
    srv.stats.largest_batch = max(before, srv.stats.largest_batch)


def test_mixed_temperature_requests_share_the_running_batch_and_are_exact(srv, client, engine):
    """Eight clients with eight temperatures and seeds: no two could share a gathered call before; now their rows
    are in the engine's running batch together, and each reply equals the in-process call with its sampling."""
    before = srv.stats.largest_batch
    srv.stats.largest_batch = 0
    settings = [dict(temperature=0.3 + 0.1 * i, seed=40 + i, max_tokens=24) for i in range(8)]
    out: dict[int, object] = {}

    def ask(i: int) -> None:
        out[i] = client.chat.completions.create(model=srv.model, messages=HELLO, **settings[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, kw in enumerate(settings):
        assert out[i].choices[0].message.content == engine.chat_completion(HELLO, **kw).message.content
    assert srv.stats.largest_batch > 1, "requests with different samplings were in flight together"
    srv.stats.largest_batch = max(before, srv.stats.largest_batch)


def test_repetition_penalty_reaches_the_engine(client, srv, engine):
    """vLLM's ``repetition_penalty`` field is the engine's keyword: the reply equals the in-process call with it."""
    body = dict(model=srv.model, prompt="One two three", max_tokens=16)
    got = client.completions.create(**body, extra_body={"repetition_penalty": 1.8}).choices[0].text
    assert got == engine.completion("One two three", max_tokens=16, repetition_penalty=1.8).text


def test_two_concurrent_streams_each_equal_alone(srv, client):
    kwargs = [{"messages": HELLO, "tools": TOOLS}, {"messages": WEATHER, "tools": TOOLS}]
    alone = [client.chat.completions.create(model=srv.model, max_tokens=30, **k) for k in kwargs]
    got: dict[int, dict] = {}

    def run(i: int) -> None:
        got[i] = _accumulate(client.chat.completions.create(model=srv.model, max_tokens=30, stream=True, **kwargs[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, whole in enumerate(alone):
        assert got[i]["content"] == (whole.choices[0].message.content or "")
        assert got[i]["tool_calls"] == _calls(whole.choices[0].message)


def test_notebook_call_while_serving_waits_its_turn(srv, client, engine):
    ref = engine.chat_completion(HELLO, max_tokens=30)
    got: dict = {}

    def stream() -> None:
        got["stream"] = _accumulate(
            client.chat.completions.create(model=srv.model, messages=HELLO, max_tokens=30, stream=True)
        )

    thread = threading.Thread(target=stream)
    thread.start()
    mine = [engine.chat_completion(HELLO, max_tokens=30) for _ in range(3)]  # the kernel's own calls meanwhile
    thread.join()
    assert all(m.message.content == ref.message.content for m in mine)
    assert got["stream"]["content"] == ref.message.content and got["stream"]["finish"] == "stop"


def test_disconnected_stream_is_cancelled(srv, client):
    cancelled = srv.stats.cancelled_streams
    long_story = {
        "type": "json_schema",
        "json_schema": {
            "name": "story",
            "schema": {  # no early end of turn
                "type": "object",
                "properties": {"story": {"type": "string", "minLength": 4000}},
                "required": ["story"],
            },
        },
    }
    body = {"messages": HELLO, "max_tokens": 1500, "stream": True, "response_format": long_story}
    with httpx.stream("POST", srv.url + "/chat/completions", timeout=60, json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.monotonic() + 30
    while srv.stats.cancelled_streams == cancelled and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.stats.cancelled_streams == cancelled + 1
    assert client.completions.create(model=srv.model, prompt="Hi", max_tokens=2).choices


# --------------------------------------------------------------------------------------------- bad input
BAD = [
    ({"messages": HELLO, "max_tokens": -1}, 400, "max_tokens"),
    ({"messages": HELLO, "temperature": -0.5}, 400, "temperature"),
    ({"messages": HELLO, "model": "gpt-4o"}, 404, "model"),
    ({"messages": [{"role": "user", "content": "word " * 3000}]}, 400, "messages"),
    (
        {
            "messages": HELLO,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}},
                },
            },
        },
        400,
        "response_format",
    ),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": HELLO, "tool_choice": "required"}, 400, "tool_choice"),
    ({"messages": HELLO, "top_logprobs": 3}, 400, "top_logprobs"),
    ({"messages": HELLO, "n": 0}, 400, "n"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD, ids=[b[2] for b in BAD])
def test_bad_input_is_a_4xx_naming_the_field(srv, client, body, status, param):
    response = httpx.post(srv.url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]
    assert client.models.list().data  # still serving


def test_malformed_json_oversize_and_prompt_errors(srv, client):
    response = httpx.post(
        srv.url + "/chat/completions", content=b"{not json", timeout=30, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]
    response = httpx.post(srv.url + "/completions", content=b"x" * (17 * 2**20), timeout=30)
    assert response.status_code == 413
    for body, param in (
        ({"prompt": [10**9]}, "prompt"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": [1.5]}, "prompt"),
        ({"prompt": "hi", "seed": "x"}, "seed"),
    ):
        response = httpx.post(srv.url + "/completions", json=body, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=srv.model, messages=HELLO, stream=True, max_tokens=-3)
    assert httpx.get(srv.url + "/nowhere", timeout=30).status_code == 404
    assert client.chat.completions.create(model=srv.model, messages=HELLO, max_tokens=3).choices


def _urllib_post(url: str, data, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json", **headers}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_an_early_answer_reaches_a_client_that_sends_its_whole_body_first(engine):
    """urllib.request (and http.client) send the whole body before reading the answer: a server that answers
    a 413, or a 401, without reading the body and closes resets that connection, and the client sees
    "connection reset" instead of the answer.  Bodies of several MB outlast the sockets' buffers."""
    with serve(engine, port=0, api_key="s3cret", max_body_bytes=2**20) as server:
        url, key = server.url + "/completions", {"authorization": "Bearer s3cret"}
        over = {
            "just over, declared": b"x" * (2**20 + 1),
            "8 MiB, declared": b"x" * (8 * 2**20),
            "8 MiB, chunked (no length)": (b"x" * 2**16 for _ in range(128)),
        }
        for what, data in over.items():
            status, body = _urllib_post(url, data, key)
            assert status == 413, what
            assert set(body["error"]) == {"message", "type", "param", "code"} and "1048576" in body["error"]["message"]
        status, body = _urllib_post(url, b"x" * (8 * 2**20), {})  # no key: refused before the body is read
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        # the connection that carried the refused body stays open and answers the next request
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        try:
            conn.request("POST", "/v1/completions", body=b"x" * (8 * 2**20), headers=key)
            refused = conn.getresponse()
            assert refused.status == 413 and json.loads(refused.read())["error"]["type"] == "invalid_request_error"
            assert not refused.will_close
            sock = conn.sock
            conn.request(
                "POST",
                "/v1/completions",
                headers={**key, "content-type": "application/json"},
                body=json.dumps({"model": server.model, "prompt": "hi", "max_tokens": 2}),
            )
            answered = conn.getresponse()
            assert answered.status == 200 and json.loads(answered.read())["choices"] and conn.sock is sock
        finally:
            conn.close()
        # a client that asks first (Expect: 100-continue) is answered at once, never invited to send the body
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as raw:
            raw.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer s3cret\r\n"
                b"Content-Type: application/json\r\nContent-Length: 8388608\r\nExpect: 100-continue\r\n\r\n"
            )
            assert raw.recv(65536).startswith(b"HTTP/1.1 413 ")


# --------------------------------------------------------------------------------------------- lifecycle, safety
def test_api_key_enforced(engine):
    with serve(engine, port=0, api_key="s3cret") as server:
        good = openai.OpenAI(base_url=server.url, api_key="s3cret", max_retries=0)
        bad = openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0)
        assert good.models.list().data[0].id == server.model
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=server.model, messages=HELLO, max_tokens=2)
        assert httpx.get(server.url + "/models", timeout=30).status_code == 401


def test_stop_frees_the_port(engine):
    server = serve(engine, port=0)
    port = server.port
    assert httpx.get(server.url + "/models", timeout=30).status_code == 200
    server.stop()
    assert not server.running
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    again = Server(engine, port=port)  # the same port binds again at once
    again.stop()


def test_busy_port_and_exposed_host(engine, srv):
    with pytest.raises(ServeError, match="port=0"):
        serve(engine, port=srv.port)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ServeError):
        warnings.simplefilter("always")
        serve(engine, host="192.0.2.1", port=0)  # TEST-NET-1: not this machine's, so nothing is exposed
    assert any("WITHOUT an api_key" in str(w.message) for w in caught)


# --------------------------------------------------------------------------------------------- streaming content
_PIECES = st.sampled_from(
    [
        "Sure",
        " ",
        "the",
        " weather",
        ".",
        "\n",
        "[",
        "get_weather(city='Paris')",
        "]",
        '{"name": "f", "parameters": {}}',
        'brave_search.call(query="x")',
        "<|python_start|>",
        "<|python_end|>",
        "print(1)",
        "f(",
        ")",
        "ok",
        "e.g.",
        ",",
        "<function=f>{}</function>",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=12))
def test_streamed_content_is_always_a_prefix_of_the_parsed_content(engine, pieces):
    text = "".join(pieces)
    content = engine.formatter.decode_assistant(text).content
    streamer = ContentStreamer()
    sent = "".join(streamer.push(p) for p in pieces)
    assert content.startswith(sent)
    assert sent + streamer.finish(content) == content
    for k in range(len(text) + 1):
        end = safe_content_end(text[:k])
        assert content.startswith(text[:end].lstrip())


# --------------------------------------------------------------------------------------------- more shapes, CLI
def test_streamed_choices_and_completion_rows(srv, client, engine):
    got = {0: "", 1: ""}
    for chunk in client.chat.completions.create(
        model=srv.model, messages=HELLO, max_tokens=10, temperature=0.8, seed=3, n=2, stream=True
    ):
        for choice in chunk.choices:
            got[choice.index] += choice.delta.content or ""
    for i in range(2):
        assert got[i] == engine.chat_completion(HELLO, max_tokens=10, temperature=0.8, seed=3 + i).message.content
    texts = {}
    for chunk in client.completions.create(model=srv.model, prompt=["One two", "The sea"], max_tokens=6, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert [texts[0], texts[1]] == [r.text for r in engine.batch_completion(["One two", "The sea"], max_tokens=6)]


def test_image_parts_are_translated_and_checked(srv):
    tiny_png = (
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
        "AAAABJRU5ErkJggg=="
    )
    parts = [{"type": "image_url", "image_url": {"url": tiny_png}}, {"type": "text", "text": "What is this?"}]
    response = httpx.post(
        srv.url + "/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": parts}], "max_tokens": 4},
    )
    if response.status_code == 200:  # a model with a vision encoder answers
        assert response.json()["choices"][0]["message"]["content"] is not None
    else:  # the demo model has none: the engine's ImageError, as a 400 naming the messages
        assert response.status_code == 400 and response.json()["error"]["param"] == "messages", response.text
    remote = [{"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]
    response = httpx.post(
        srv.url + "/chat/completions", timeout=60, json={"messages": [{"role": "user", "content": remote}]}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].content[0].image_url"


def test_command_line_serves_until_stopped(engine, capsys):
    from workbench.serve.__main__ import main

    ready, stop = threading.Event(), threading.Event()
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(main(["--port", "0"], ready=ready, stop=stop)))
    thread.start()
    assert ready.wait(120)
    url = capsys.readouterr().out.split(" at ")[1].split()[0]
    assert httpx.get(url + "/models", timeout=30).json()["data"][0]["id"]
    stop.set()
    thread.join(60)
    assert codes == [0]
    assert main(["--port", "70000"]) == 2 and "port must be an integer" in capsys.readouterr().err


def test_lm_eval_local_completions_scores_through_the_endpoint(srv, engine):
    """lm-eval's own ``local-completions`` model (tokens from the server's /tokenize, scores from echo+logprobs)
    gives the engine's teacher-forced log-likelihoods of the same tokens."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    lm = LocalCompletionsAPI(
        base_url=srv.url + "/completions",
        model=srv.model,
        tokenizer_backend="remote",
        num_concurrent=1,
        max_retries=1,
        batch_size=2,
    )
    pairs = [("The capital of France is", " Paris"), ("Once upon a time", " there was a llama."), ("Hi", " you")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)])
    for (context, continuation), (loglikelihood, greedy) in zip(pairs, got):
        whole = engine.tokenizer.encode(context + continuation)  # lm-eval encodes the pair whole, then splits
        start = len(engine.tokenizer.encode(context))
        logp = engine.logits([whole])[0].log_softmax(-1)  # [len, vocab]
        expected = sum(float(logp[i - 1, whole[i]]) for i in range(start, len(whole)))
        assert loglikelihood == pytest.approx(expected, abs=1e-4)
        assert greedy == all(int(logp[i - 1].argmax()) == whole[i] for i in range(start, len(whole)))


def test_tool_choice_spellings_and_json_object(srv, client, engine):
    named = {"type": "function", "function": {"name": "get_random_joke"}}
    for choice, engine_choice in (("none", "none"), ("required", "required"), (named, "get_random_joke")):
        reply = client.chat.completions.create(
            model=srv.model, messages=WEATHER, tools=TOOLS, tool_choice=choice, max_tokens=30
        )
        ref = engine.chat_completion(WEATHER, tools=TOOLS, tool_choice=engine_choice, max_tokens=30)
        assert (reply.choices[0].message.content or "") == ref.message.content
        assert _calls(reply.choices[0].message) == _ref_calls(ref)
    reply = client.chat.completions.create(
        model=srv.model, messages=WEATHER, max_tokens=40, response_format={"type": "json_object"}
    )
    ref = engine.chat_completion(WEATHER, max_tokens=40, response_format={"type": "json_object"})
    assert reply.choices[0].message.content == ref.message.content
    if ref.stop_reason != "out_of_tokens":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_gatherer_batches_streams_and_cancels_one_row(engine):
    """Two streams submitted together share one engine batch stream; cancelling one leaves the other exact."""
    from workbench.serve.gather import BatchedStreamJob, Gatherer

    gatherer = Gatherer(engine)
    try:
        events: dict[str, list] = {"a": [], "b": []}
        done = {"a": threading.Event(), "b": threading.Event()}
        jobs: dict[str, BatchedStreamJob] = {}

        def sink_for(name: str):
            def sink(event):
                events[name].append(event)
                if event[0] == "item" and len(events[name]) == 3 and name == "a":
                    jobs["a"].cancelled.set()  # client a goes away after its third chunk
                if event[0] != "item":
                    done[name].set()

            return sink

        kwargs = {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 30}
        for name, dialog in (("a", HELLO), ("b", WEATHER)):
            jobs[name] = BatchedStreamJob("chat", ("stream", "same"), [(dialog, None)], kwargs, sink_for(name))
        gatherer.submit(jobs["a"])
        gatherer.submit(jobs["b"])
        assert done["b"].wait(120)
        finals = [
            chunk.final
            for kind, (choice, chunk) in ((k, v) for k, v in events["b"] if k == "item")
            if chunk.final is not None
        ]
        ref = engine.chat_completion(WEATHER, tools=TOOLS, max_tokens=30)
        assert finals[0].tokens == ref.tokens
        assert gatherer.stats.largest_batch == 2 and gatherer.stats.cancelled_streams == 1
        assert not any(k == "item" and v[1].final is not None for k, v in events["a"])  # a's rows were dropped
    finally:
        gatherer.stop()
