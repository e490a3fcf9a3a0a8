"""Llama Stack's inference routes beside the OpenAI ones, so ``llama-stack-client`` drives the kernel's engine.

    client = LlamaStackClient(base_url=srv.url.removesuffix("/v1"))
    client.inference.batch_chat_completion(model_id=srv.model, messages_batch=[...], tools=[...])

Routes (Llama Stack 0.2's shapes): ``POST /v1/inference/completion`` and ``/v1/inference/chat-completion``
(``"stream": true`` sends Llama Stack's server-sent events: a ``start`` event, ``progress`` events whose
``delta`` is text or a tool call, ``complete`` with the stop reason), ``/v1/inference/batch-completion`` and
``/v1/inference/batch-chat-completion``.  ``GET /v1/models`` is shared with the OpenAI routes: its cards
carry both clients' fields (:func:`model_fields`), since both read the list from ``data``.

Why so little translation here: the engine itself accepts Llama Stack's spellings (``sampling_params``,
``tool_config``, ``logprobs={"top_k": k}``, its messages, content items and tool definitions) and its results
convert with ``to_llama_stack``; this module only checks the body's shape and the model id, gathers rows into
engine batches like the OpenAI routes do, and writes the stream events.
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations (Request) at runtime.
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from workbench.types import ChatCompletion, llama_stack_batch

from . import registry
from .errors import APIError, from_engine_error
from .gather import Row, StreamJob
from .streams import sse
from .translate import check_model

ROUTES = (
    "/v1/inference/completion",
    "/v1/inference/chat-completion",
    "/v1/inference/batch-completion",
    "/v1/inference/batch-chat-completion",
)
# Body fields handed to the engine as they are (it reads Llama Stack's spellings); the rest are checked here.
# ``seed`` is workbench's addition (Llama Stack has none): sampled rows are reproducible, as in-process.
_CHAT_FIELDS = ("sampling_params", "tool_config", "tool_choice", "tool_prompt_format", "logprobs", "seed")
_COMPLETION_FIELDS = ("sampling_params", "logprobs", "seed")


def model_fields(ctx: Any) -> dict[str, Any]:
    """The fields a Llama Stack ``Model`` has, added to the served model's OpenAI card (one card, both clients)."""
    engine = ctx.engine
    return {
        "identifier": ctx.model,
        "provider_resource_id": ctx.model,
        "provider_id": "workbench",
        "type": "model",
        "model_type": "llm",
        "metadata": {"family": str(getattr(engine, "family", "")), "max_seq_len": engine.max_seq_len},
    }


def mount(
    app: Any, ctx: Any, *, authorize: Callable, body_of: Callable, await_rows: Callable, start_stream: Callable
) -> None:
    """Add the Llama Stack routes to ``app`` (the server's helpers are passed in: this module sits beside
    the app module and must not import it)."""
    from fastapi import Request
    from fastapi.responses import StreamingResponse

    async def checked(request: Request) -> dict[str, Any]:
        authorize(request)
        body = await body_of(request)
        check_model(body, registry.served_ids(ctx), "model_id")
        ctx.gatherer.stats.requests += 1
        return body

    @app.post("/v1/inference/completion")
    async def completion(request: Request) -> Any:
        body = await checked(request)
        content, kwargs = completion_request(body, "content")
        if _flag(body, "stream"):
            job = _completion_stream(content, kwargs)
            started = await start_stream(ctx, lambda sink: StreamJob(job, sink, "content"))
            feed = _completion_events(logprobs=kwargs.get("logprobs") is not None)
            return StreamingResponse(_events(started, feed), media_type="text/event-stream")
        results = await await_rows(ctx, [_completion_row(content, kwargs)])
        return results[0].to_llama_stack(plain=True)

    @app.post("/v1/inference/batch-completion")
    async def batch_completion(request: Request) -> Any:
        body = await checked(request)
        contents = _list(body, "content_batch")
        _, kwargs = completion_request(body, None)
        results = await await_rows(ctx, [_completion_row(c, kwargs) for c in contents])
        return llama_stack_batch(results, plain=True)

    @app.post("/v1/inference/chat-completion")
    async def chat_completion(request: Request) -> Any:
        body = await checked(request)
        messages = check_dialog(_list(body, "messages"), "messages")
        tools, fmt, kwargs = chat_request(body)
        if _flag(body, "stream"):
            job = _chat_stream(messages, tools, fmt, kwargs)
            started = await start_stream(ctx, lambda sink: StreamJob(job, sink, "messages"))
            return StreamingResponse(_events(started, _ChatEvents()), media_type="text/event-stream")
        results = await await_rows(ctx, [_chat_row(messages, tools, fmt, kwargs)])
        return results[0].to_llama_stack(plain=True)

    @app.post("/v1/inference/batch-chat-completion")
    async def batch_chat_completion(request: Request) -> Any:
        body = await checked(request)
        dialogs = _list(body, "messages_batch")
        for i, dialog in enumerate(dialogs):
            if not isinstance(dialog, list) or not dialog:
                raise APIError(
                    f"messages_batch[{i}] must be a non-empty list of messages", param=f"messages_batch[{i}]"
                )
            check_dialog(dialog, f"messages_batch[{i}]")
        tools, fmt, kwargs = chat_request(body)
        results = await await_rows(ctx, [_chat_row(d, tools, fmt, kwargs) for d in dialogs])
        return llama_stack_batch(results, plain=True)


# ----------------------------------------------------------------------------------------------- bodies
def _list(body: dict[str, Any], name: str) -> list[Any]:
    value = body.get(name)
    if not isinstance(value, list) or not value:
        raise APIError(f"'{name}' must be a non-empty list", param=name)
    return value


def check_dialog(messages: list[Any], where: str) -> list[Any]:
    """Llama Stack's message shapes: a known role, and the ``content`` its message types require (an assistant
    message may carry only ``tool_calls``)."""
    for i, message in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(message, dict):
            raise APIError(f"{at} must be a message object with 'role' and 'content'", param=at)
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool", "ipython"):
            raise APIError(f"{at}.role is {role!r:.40}; use system, user, assistant or tool", param=f"{at}.role")
        if message.get("content") is None and not (role == "assistant" and message.get("tool_calls")):
            raise APIError(f"{at} ({role}) has no content: a {role} message needs its 'content'", param=f"{at}.content")
    return messages


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is not None and not isinstance(value, bool):
        raise APIError(f"'{name}' must be true or false, got {value!r:.60}", param=name)
    return bool(value)


def _known(body: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: body[name] for name in names if body.get(name) is not None}


def _object(body: dict[str, Any], name: str) -> Any:
    value = body.get(name)
    if value is not None and not isinstance(value, dict):
        raise APIError(f"'{name}' must be an object, got {value!r:.60}", param=name)
    return value


def completion_request(body: dict[str, Any], field: str | None) -> tuple[Any, dict[str, Any]]:
    """The prompt (``field``: ``content``; None for a batch) and the engine keywords of a completion body."""
    content = None
    if field is not None:
        content = body.get(field)
        if not isinstance(content, (str, list, dict)) or not content:
            raise APIError(f"'{field}' must be a string, a content item or a list of them", param=field)
    for name in ("sampling_params", "response_format"):
        _object(body, name)
    kwargs = _known(body, _COMPLETION_FIELDS)
    if body.get("response_format") is not None:
        kwargs["response_format"] = body["response_format"]
    return content, kwargs


def chat_request(body: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """The tools, response format and the other engine keywords of a chat body."""
    for name in ("sampling_params", "tool_config", "response_format"):
        _object(body, name)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise APIError("'tools' must be a list of tool definitions", param="tools")
    return tools or None, body.get("response_format"), _known(body, _CHAT_FIELDS)


def _key(kind: str, *parts: Any) -> tuple:
    """Rows whose tools, formats and keywords are equal share one engine call."""
    return (kind, json.dumps(parts, sort_keys=True, default=str))


def _completion_row(content: Any, kwargs: dict[str, Any]) -> Row:
    return Row("completion", _key("llama_stack_completion", kwargs), content, kwargs, "content")


def _chat_row(messages: Any, tools: Any, fmt: Any, kwargs: dict[str, Any]) -> Row:
    return Row("chat", _key("llama_stack_chat", tools, kwargs), (messages, fmt), {"tools": tools, **kwargs})


# ----------------------------------------------------------------------------------------------- streams
def _completion_stream(content: Any, kwargs: dict[str, Any]) -> Callable[[Any, dict[str, Any]], Any]:
    return lambda engine, keywords: engine.stream_completion(content, **{**keywords, **kwargs})


def _chat_stream(messages: Any, tools: Any, fmt: Any, kwargs: dict[str, Any]) -> Callable[[Any, dict[str, Any]], Any]:
    return lambda engine, keywords: engine.stream_chat_completion(
        messages, tools, response_format=fmt, **{**keywords, **kwargs}
    )


def _completion_events(logprobs: bool = False) -> Callable[[Any], list[dict[str, Any]]]:
    """Llama Stack's ``CompletionResponseStreamChunk`` per engine chunk (the last carries the stop reason).

    With ``logprobs`` every chunk carries the log-probabilities of its own tokens, as Llama Stack's
    meta-reference stream does.  The engine's stream chunks carry token ids only (the values arrive with the
    row's final result), so such a stream holds its chunks until the row ends and then sends them all."""
    held: list[Any] = []

    def feed(chunk: Any) -> list[dict[str, Any]]:
        if chunk.final is None:
            if logprobs:
                held.append(chunk)
                return []
            return [{"delta": chunk.text}] if chunk.text else []
        final = chunk.final.to_llama_stack(plain=True)
        if not logprobs:
            return [{"delta": chunk.text, "stop_reason": final["stop_reason"], "logprobs": final["logprobs"]}]
        return _with_logprobs(held, chunk, chunk.final.logprobs or [], final)

    return feed


def _with_logprobs(held: list[Any], last: Any, values: list[Any], final: dict[str, Any]) -> list[dict[str, Any]]:
    """The held chunks, each with the log-probabilities of the tokens up to its own (a token whose text was held
    back, half a UTF-8 character, goes with the next chunk that has text); the rest go on the last chunk."""
    out: list[dict[str, Any]] = []
    at, pending = 0, []
    for chunk in held:
        while at < len(values):
            pending.append(final["logprobs"][at])
            at += 1
            if values[at - 1].token == chunk.token:
                break
        if chunk.text:
            out.append({"delta": chunk.text, "logprobs": pending})
            pending = []
    rest = pending + list(final["logprobs"][at:])
    out.append({"delta": last.text, "stop_reason": final["stop_reason"], "logprobs": rest or None})
    return out


class _ChatEvents:
    """Llama Stack's chat stream events from the engine's stream items: ``start``, then ``progress`` deltas
    (text; tool-call text between python tags as ``in_progress`` after one ``started``; every parsed call as
    ``succeeded``, or one ``failed``), then ``complete`` with the stop reason (and the reply's logprobs)."""

    def __init__(self) -> None:
        self.started_tool = False

    def __call__(self, item: Any) -> list[dict[str, Any]]:
        if isinstance(item, ChatCompletion):
            reply = item.to_llama_stack(plain=True)
            stop = reply["completion_message"]["stop_reason"]
            return [_event("complete", {"type": "text", "text": ""}, stop, reply["logprobs"])]
        if getattr(item, "type", None) == "text":
            return [_event("progress", {"type": "text", "text": item.text})]
        events = []
        if item.parse_status == "in_progress" and not self.started_tool:
            self.started_tool = True
            events.append(_event("progress", {"type": "tool_call", "tool_call": "", "parse_status": "started"}))
        if item.tool_call is not None:
            call = item.tool_call
            payload: Any = {
                "call_id": call.call_id,
                "tool_name": call.tool_name,
                "arguments": call.arguments,
                "arguments_json": json.dumps(call.arguments, ensure_ascii=False),
            }
        else:
            payload = item.text
        delta = {"type": "tool_call", "tool_call": payload, "parse_status": item.parse_status}
        events.append(_event("progress", delta))
        return events


def _event(kind: str, delta: dict[str, Any], stop_reason: str | None = None, logprobs: Any = None) -> dict[str, Any]:
    event: dict[str, Any] = {"event_type": kind, "delta": delta}
    if stop_reason is not None:
        event["stop_reason"] = stop_reason
    if logprobs is not None:
        event["logprobs"] = logprobs
    return {"event": event}


async def _events(started: Any, feed: Callable[[Any], list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    """The SSE bytes of a started stream job (Llama Stack sends no ``[DONE]``: the stream just ends).  A client
    that disconnects closes this generator, which cancels the job (its engine rows stop)."""
    chat = isinstance(feed, _ChatEvents)
    if chat:
        yield sse(_event("start", {"type": "text", "text": ""}))
    event = started.first
    try:
        while True:
            kind, value = event
            if kind == "item":
                for chunk in feed(value):
                    yield sse(chunk)
            elif kind == "error":  # the status is already sent: the error goes into the stream
                error = value if isinstance(value, APIError) else from_engine_error(value, "messages")
                yield sse(error.body())
                return
            else:
                return
            event = await started.events.get()
    finally:
        started.job.cancelled.set()
