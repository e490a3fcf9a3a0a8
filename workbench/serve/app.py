"""The FastAPI application: routes, authentication, bounded bodies, OpenAI-shaped errors.

Handlers parse and check the body on the event loop (cheap), hand engine rows to the
:class:`~workbench.serve.gather.Gatherer` and await them, so many clients share the engine's batches
while the loop stays free.  Every failure a client can cause is an :class:`APIError` → 4xx JSON body.
"""

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from workbench.batches import BatchAPIError
from workbench.batches import routes as batch_routes
from workbench.batches.routes import DEFAULT_MAX_FILE
from workbench.engine import Engine

from . import llama_stack, registry, shapes
from .errors import APIError, from_engine_error
from .gather import BatchedStreamJob, Gatherer, Row
from .room import check_room
from .streams import ChatStream, CompletionStream, sse
from .translate import ChatRequest, CompletionRequest, check_model, parse_chat, parse_completion

# No `from __future__ import annotations` here: FastAPI reads the route annotations (Request) at runtime.
DEFAULT_MAX_BODY = 16 * 2**20  # bytes; images arrive base64-encoded inside the JSON
# What the server reads and discards of a body it answers without reading (see DrainUnreadBody): a client that
# overshoots a limit gets the answer; one sending more, or trickling for longer, is cut off.
DRAIN_BYTES = 256 * 2**20
DRAIN_S = 10.0


@dataclass
class Context:
    engine: Engine
    gatherer: Gatherer
    model: str
    api_key: str | None
    max_body: int = DEFAULT_MAX_BODY
    created: int = 0
    aliases: dict[str, str] = field(default_factory=dict)  # model ids registered through POST /v1/models
    batches: Any = None  # the Batch API's BatchService (None: no /v1/files, /v1/batches routes)
    max_file_bytes: int = DEFAULT_MAX_FILE


def build_app(ctx: Context) -> Any:
    """The ASGI app serving ``ctx.engine`` (FastAPI is imported here: it is the ``serve`` extra)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="workbench", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(OpenAIPrefix)
    app.add_middleware(DrainUnreadBody)

    @app.exception_handler(APIError)
    @app.exception_handler(BatchAPIError)
    async def _api_error(request: Request, exc: APIError | BatchAPIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        error = APIError(
            f"{exc.detail}: {request.method} {request.url.path} (routes: GET /v1/models, POST "
            "/v1/chat/completions, POST /v1/completions; all of them: GET /v1/inspect/routes)",
            status=exc.status_code,
        )
        return JSONResponse(error.body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(APIError(str(exc)).body(), status_code=400)

    def authorize(request: Request) -> None:
        if ctx.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), ctx.api_key.encode()):
            raise APIError(
                "missing or wrong API key: send 'Authorization: Bearer <api_key>' (the key given to workbench.serve)",
                status=401,
                code="invalid_api_key",
            )

    async def body_of(request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > ctx.max_body:
            raise APIError(
                f"the request body has {declared} bytes; this server accepts at most {ctx.max_body}", status=413
            )
        chunks, size = [], 0
        async for piece in request.stream():
            size += len(piece)
            if size > ctx.max_body:
                raise APIError(f"the request body exceeds {ctx.max_body} bytes", status=413)
            chunks.append(piece)
        try:
            body = json.loads(b"".join(chunks) or b"null")
        except (ValueError, RecursionError) as exc:
            raise APIError(f"the request body is not valid JSON ({str(exc)[:200]})") from None
        if not isinstance(body, dict):
            raise APIError("the request body must be a JSON object")
        return body

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    # vLLM's tokenizer routes, which lm-eval's ``tokenizer_backend="remote"`` uses to split requests into the
    # engine's own tokens.  Special-token names are not offered as strings: typed, they encode as plain text.
    @app.get("/tokenizer_info")
    async def tokenizer_info(request: Request) -> dict[str, Any]:
        authorize(request)
        tok = ctx.engine.tokenizer
        return {
            "eos_token": None,
            "bos_token": None,
            "pad_token": None,
            "chat_template": None,
            "bos_token_id": tok.bos_id,
            "eos_token_id": tok.eot_id,
            "model_max_length": ctx.engine.max_seq_len,
        }

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        authorize(request)
        body = await body_of(request)
        text = body.get("prompt")
        if not isinstance(text, str):
            raise APIError("'prompt' must be a string", param="prompt")
        special = body.get("add_special_tokens", True)
        tokens = ctx.engine.tokenizer.encode(text, bos=bool(special))
        return {"tokens": tokens, "count": len(tokens), "max_model_len": ctx.engine.max_seq_len}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        authorize(request)
        body = await body_of(request)
        tokens = body.get("tokens")
        vocab = ctx.engine.args.vocab_size
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
        ):
            raise APIError(f"'tokens' must be a list of token ids in 0..{vocab - 1}", param="tokens")
        return {"prompt": ctx.engine.tokenizer.decode(tokens)}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        return {"object": "list", "data": [model_card(ctx, name) for name in registry.served_ids(ctx)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        authorize(request)
        check_model({"model": model_id}, registry.served_ids(ctx))
        return model_card(ctx, model_id)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        authorize(request)
        body = await body_of(request)
        check_model(body, registry.served_ids(ctx))
        req = parse_chat(body)
        check_room(ctx.engine, req)
        ctx.gatherer.stats.requests += 1
        if req.stream:
            return await chat_events(ctx, req)
        results = await await_rows(ctx, chat_rows(req))
        return shapes.chat_response(ctx.model, results, ctx.engine.tokenizer, req.logprobs, req.top_logprobs)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        authorize(request)
        body = await body_of(request)
        check_model(body, registry.served_ids(ctx))
        req = parse_completion(body)
        check_room(ctx.engine, req)
        ctx.gatherer.stats.requests += 1
        if req.stream:
            return await completion_events(ctx, req)
        return await completion_response(ctx, req)

    llama_stack.mount(
        app, ctx, authorize=authorize, body_of=body_of, await_rows=await_rows, start_stream=start_stream
    )  # Llama Stack's inference routes (POST /v1/inference/...)
    registry.mount(app, ctx, authorize=authorize, body_of=body_of, card=model_card)  # providers, health, ...
    if ctx.batches is not None:  # OpenAI's Batch API: /v1/files, /v1/batches
        batch_routes.mount(app, ctx.batches, authorize=authorize, body_of=body_of, max_file_bytes=ctx.max_file_bytes)
    return app


class OpenAIPrefix:
    """ASGI middleware: ``/v1/openai/v1/<route>`` is served by ``/v1/<route>`` for the OpenAI routes."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope.get("type") == "http" else ""
        if path.startswith(registry.OPENAI_PREFIX + "/v1/"):
            rest = path[len(registry.OPENAI_PREFIX) :]
            if rest.split("/")[2] in registry.OPENAI_ROUTES:
                scope = {**scope, "path": rest, "raw_path": rest.encode()}
        await self.app(scope, receive, send)


class DrainUnreadBody:
    """ASGI middleware: before a response starts, read and discard what is left of the request's body.

    Why: a route may answer without reading the body (a 413 for an oversize one, a 401 before reading), and
    a server that then closes the connection with bytes unread makes the kernel reset it.  A client that
    sends its whole body before reading the answer (the standard library's ``urllib.request``) then sees
    "connection reset" instead of the 413 JSON.  nginx lingers for the same reason.  Draining first lets the
    client finish sending, read the answer, and reuse the connection.  Bounded: a declared body over
    ``DRAIN_BYTES`` is not drained (that client is cut off, as before), nor more than ``DRAIN_BYTES`` of an
    undeclared one, nor for longer than ``DRAIN_S``; a client that sent ``Expect: 100-continue`` and was
    never asked for its body has sent nothing, so there is nothing to drain.
    """

    def __init__(self, app: Any, *, limit_bytes: int = DRAIN_BYTES, limit_s: float = DRAIN_S) -> None:
        self.app = app
        self.limit_bytes = limit_bytes
        self.limit_s = limit_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        declared = headers.get(b"content-length", b"").strip()
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        waits_to_send = b"100-continue" in headers.get(b"expect", b"").lower()
        state = {"read": 0, "ended": not chunked and declared in (b"", b"0"), "asked": False}

        async def counted_receive() -> dict:
            state["asked"] = True
            message = await receive()
            if message["type"] == "http.request":
                state["read"] += len(message.get("body", b""))
                state["ended"] = state["ended"] or not message.get("more_body", False)
            elif message["type"] == "http.disconnect":
                state["ended"] = True
            return message

        async def discard() -> None:
            while not state["ended"] and state["read"] <= self.limit_bytes:
                await counted_receive()

        async def answer(message: dict) -> None:
            if (
                message["type"] == "http.response.start"
                and not state["ended"]
                and not (waits_to_send and not state["asked"])
                and not (declared.isdigit() and int(declared) > self.limit_bytes)
            ):
                try:
                    await asyncio.wait_for(discard(), self.limit_s)
                except asyncio.TimeoutError:
                    pass  # a client trickling its body: answer now; the close may reset it
            await send(message)

        await self.app(scope, counted_receive, answer)


def model_card(ctx: Context, model_id: str | None = None) -> dict[str, Any]:
    """The served model's card (OpenAI's and Llama Stack's fields), under ``model_id`` when it is an alias."""
    card = {
        "id": model_id or ctx.model,
        "object": "model",
        "created": ctx.created,
        "owned_by": "workbench",
        "max_model_len": ctx.engine.max_seq_len,
        **llama_stack.model_fields(ctx),  # the same card parses as a llama-stack-client Model
    }
    if model_id is not None and model_id != ctx.model:
        card["identifier"] = model_id  # Llama Stack: the alias, served by the provider's own model
    return card


# ----------------------------------------------------------------------------------------------- rows
def chat_rows(req: ChatRequest) -> list[Row]:
    return [
        Row("chat", req.row_key(i), (req.messages, req.response_format), req.engine_kwargs(i)) for i in range(req.n)
    ]


async def await_rows(ctx: Context, rows: list[Row]) -> list[Any]:
    """Submit the rows and wait for all; a client that disconnects meanwhile withdraws its rows."""
    for row in rows:
        ctx.gatherer.submit(row)
    waiting = [asyncio.wrap_future(row.future) for row in rows]
    try:
        return list(await asyncio.gather(*waiting))
    except asyncio.CancelledError:
        for row in rows:
            row.cancelled.set()
        raise


def _encoded(ctx: Context, prompt: str | list[int]) -> list[int]:
    return ctx.engine.tokenizer.encode(prompt, bos=True) if isinstance(prompt, str) else list(prompt)


def completion_rows(ctx: Context, req: CompletionRequest) -> tuple[list[Row], list[Row]]:
    """The engine rows of a completions request: generated rows (one per prompt and choice), then the prompt
    scores that echo with logprobs needs (one per prompt)."""
    rows: list[Row] = []
    if req.generate:
        rows += [
            Row("completion", req.row_key(c), req.prompts[p], req.sampling.for_choice(c).kwargs(), "prompt")
            for p, c in req.rows
        ]
    scores: list[Row] = []
    if req.echo and req.logprobs is not None:
        k = req.logprobs
        scores = [Row("score", ("score",), _encoded(ctx, prompt), {"k": k}, "prompt") for prompt in req.prompts]
    return rows, scores


async def completion_response(ctx: Context, req: CompletionRequest) -> dict[str, Any]:
    rows, scores = completion_rows(ctx, req)
    results = await await_rows(ctx, rows + scores)
    return completion_body(ctx, req, results[: len(rows)], results[len(rows) :])


def completion_body(ctx: Context, req: CompletionRequest, generated: list[Any], scored: list[Any]) -> dict[str, Any]:
    """The ``text_completion`` response from the results of :func:`completion_rows` (in the same order)."""
    tokenizer = ctx.engine.tokenizer
    prompt_ids = [_encoded(ctx, p) for p in req.prompts]
    choices = []
    for i, (p, _choice) in enumerate(req.rows):
        result = generated[i] if req.generate else None
        text = result.text if result is not None else ""
        echo_text = req.prompts[p] if isinstance(req.prompts[p], str) else tokenizer.decode(req.prompts[p])
        logprobs = None
        if req.logprobs is not None:
            ids, values, tops = [], [], []
            if req.echo:
                score = scored[p]
                ids, values, tops = list(score.ids), list(score.logprobs), list(score.top)
            if result is not None:
                g_ids, g_values, g_tops = shapes.generated_logprobs(tokenizer, result, req.logprobs)
                ids, values, tops = ids + g_ids, values + g_values, tops + g_tops
                if req.echo and not result.tokens and result.stop_reason in ("end_of_turn", "end_of_message"):
                    stop_id, stop_lp, stop_top = scored[p].next_stop  # stopped at once: report the stop token
                    ids, values, tops = ids + [stop_id], values + [stop_lp], tops + [stop_top]
            logprobs = shapes.completion_logprobs(tokenizer, ids, values, tops)
        finish = shapes.finish_reason(result) if result is not None else "length"
        choices.append(shapes.completion_choice(i, (echo_text if req.echo else "") + text, finish, logprobs))
    prompt_tokens = sum(len(ids) for ids in prompt_ids)
    completion_tokens = sum(len(r.tokens) for r in generated)
    return {
        "id": shapes.new_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": ctx.model,
        "choices": choices,
        "usage": shapes.usage(prompt_tokens, completion_tokens),
    }


# ----------------------------------------------------------------------------------------------- streams
class _Started:
    """Stream jobs whose first event has arrived: an error before any item is still a plain 4xx response."""

    def __init__(self, jobs: list[Any], events: asyncio.Queue, first: tuple[str, Any]) -> None:
        self.jobs, self.events, self.first = jobs, events, first
        self.job = jobs[0]  # (one-job streams, e.g. the Llama Stack routes)


async def start_stream(ctx: Context, make_job: Any) -> _Started:
    """Submit the stream job(s) ``make_job(sink)`` builds (one, or a list) and wait for the first event; an
    error then is raised (→ its 4xx status)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    jobs: list[Any] = []

    def sink(event: tuple[str, Any]) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server stopped
            for job in jobs:
                job.cancelled.set()

    made = make_job(sink)
    jobs.extend(made if isinstance(made, list) else [made])
    for job in jobs:
        ctx.gatherer.submit(job)
    try:
        first = await events.get()
    except asyncio.CancelledError:
        for job in jobs:
            job.cancelled.set()
        raise
    if first[0] == "error":
        for job in jobs:
            job.cancelled.set()
        raise first[1]
    return _Started(jobs, events, first)


async def _drain(started: _Started, feed: Any) -> AsyncIterator[bytes]:
    """The stream's SSE bytes until every job has ended; when the client disconnects Starlette closes this
    generator, which cancels the jobs (the worker cancels their engine rows at the next step)."""
    event = started.first
    ends = 0
    try:
        while True:
            kind, value = event
            if kind == "item":
                for chunk in feed(*value):
                    yield sse(chunk)
            elif kind == "error":  # after the first item the status is sent: the error goes in the stream
                yield sse(value.body() if isinstance(value, APIError) else from_engine_error(value, "messages").body())
                return
            else:
                ends += 1
                if ends == len(started.jobs):
                    return
            event = await started.events.get()
    finally:
        for job in started.jobs:
            job.cancelled.set()  # a no-op after the end; after a disconnect it stops the engine's rows


def _stream_jobs(kind: str, req: Any, payload: Any, where: str, sink: Any) -> list[BatchedStreamJob]:
    """One batched stream job per engine call the request's choices need (choices of equal settings share one)."""
    by_key: dict[tuple, list[int]] = {}
    for choice in range(req.n if kind == "chat" else len(req.rows)):
        by_key.setdefault(req.row_key(choice if kind == "chat" else req.rows[choice][1]), []).append(choice)
    jobs = []
    for key, choices in by_key.items():
        if kind == "chat":
            kwargs = req.engine_kwargs(choices[0])
        else:
            kwargs = req.sampling.for_choice(req.rows[choices[0]][1]).kwargs()
        jobs.append(
            BatchedStreamJob(
                kind, ("stream", *key), [payload(c) for c in choices], kwargs, sink, where, choices=choices
            )
        )
    return jobs


async def chat_events(ctx: Context, req: ChatRequest) -> Any:
    """The StreamingResponse of a streamed chat request (or an APIError raised before anything is sent)."""
    from fastapi.responses import StreamingResponse

    stream = ChatStream(
        ctx.model,
        req.n,
        ctx.engine.tokenizer,
        raw=req.response_format is not None,
        logprobs=req.logprobs,
        top=req.top_logprobs,
        include_usage=req.include_usage,
    )
    started = await start_stream(
        ctx, lambda sink: _stream_jobs("chat", req, lambda c: (req.messages, req.response_format), "messages", sink)
    )

    async def body() -> AsyncIterator[bytes]:
        async for piece in _drain(started, stream.feed):
            yield piece
        if all(r is not None for r in stream.results):
            for chunk in stream.done():
                yield sse(chunk)
            yield sse("[DONE]")

    return StreamingResponse(body(), media_type="text/event-stream")


async def completion_events(ctx: Context, req: CompletionRequest) -> Any:
    from fastapi.responses import StreamingResponse

    stream = CompletionStream(
        ctx.model, len(req.rows), ctx.engine.tokenizer, logprobs=req.logprobs, include_usage=req.include_usage
    )
    started = await start_stream(
        ctx, lambda sink: _stream_jobs("completion", req, lambda i: req.prompts[req.rows[i][0]], "prompt", sink)
    )

    async def body() -> AsyncIterator[bytes]:
        async for piece in _drain(started, stream.feed):
            yield piece
        if all(r is not None for r in stream.results):
            for chunk in stream.done(sum(len(_encoded(ctx, p)) for p in req.prompts)):
                yield sse(chunk)
            yield sse("[DONE]")

    return StreamingResponse(body(), media_type="text/event-stream")
