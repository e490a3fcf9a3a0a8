"""Llama Stack's discovery routes: providers, model registration, health, version, the route list.

Why they exist: Llama Stack's clients and its own integration suite find a model's provider before they
send a request (``GET /v1/providers``; the suite's fixtures fail without it) and register the model id they
were given when the server does not list it (``POST /v1/models``).  One engine is served, so there is one
inference provider, ``workbench``, whose type says what runs behind it: a meta-reference engine
(``inline::meta-reference``, the provider Llama Stack 0.2 named for Meta's own reference code).

Registration accepts only names of the served model: its id, its Meta descriptor or Hugging Face name
(compared as the engine compares ``model_id``), or any alias whose ``provider_model_id`` is the served id.
Registered aliases are listed beside the served model and accepted wherever a model id is (in memory: a
restarted server serves its own id again).  Anything else is a 4xx that says which model is served.
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations (Request) at runtime.
from collections.abc import Callable
from importlib import metadata
from typing import Any

from workbench.engine.llama_stack import check_model_id as engine_check_model_id
from workbench.errors import InputError

from .errors import APIError

PROVIDER_ID = "workbench"
PROVIDER_TYPE = "inline::meta-reference"
LLAMA_STACK_API = "0.2.2"  # the Llama Stack release whose routes and shapes these are
# Llama Stack serves the OpenAI API under this prefix; the app answers the OpenAI routes under both paths.
OPENAI_PREFIX = "/v1/openai"
OPENAI_ROUTES = ("models", "chat", "completions", "files", "batches")  # the first path segment after /v1/


def workbench_version() -> str:
    try:
        return metadata.version("workbench")
    except metadata.PackageNotFoundError:  # a source checkout on PYTHONPATH
        return "0+unknown"


def served_ids(ctx: Any) -> tuple[str, ...]:
    """Every id a request may name: the served id first, then the registered aliases."""
    return (ctx.model, *sorted(ctx.aliases))


def provider(ctx: Any) -> dict[str, Any]:
    """The inference provider record (Llama Stack's ``ProviderInfo``; ``health`` is llama-stack-client's)."""
    engine = ctx.engine
    config = {
        "model": ctx.model,
        "engine": "workbench (pure-PyTorch Meta reference engine)",
        "max_seq_len": engine.max_seq_len,
        "max_batch_size": getattr(engine, "max_batch_size", None),
    }
    return {
        "api": "inference",
        "provider_id": PROVIDER_ID,
        "provider_type": PROVIDER_TYPE,
        "config": config,
        "health": {"status": "OK"},
    }


def register(ctx: Any, body: dict[str, Any]) -> str:
    """Check a ``POST /v1/models`` body and record its alias; returns the registered id."""
    model_id = body.get("model_id")
    if not isinstance(model_id, str) or not model_id.strip():
        raise APIError("'model_id' must be a non-empty string naming the served model", param="model_id")
    model_type = body.get("model_type")
    if model_type not in (None, "llm"):
        raise APIError(
            f"'model_type' {model_type!r:.40} is not served here: this server serves one llm, {ctx.model!r}",
            param="model_type",
        )
    provider_id = body.get("provider_id")
    if provider_id not in (None, PROVIDER_ID):
        raise APIError(
            f"no provider {provider_id!r:.60} here; the only provider is {PROVIDER_ID!r}",
            param="provider_id",
            status=404,
            code="provider_not_found",
        )
    target = body.get("provider_model_id")
    if target is not None and target not in served_ids(ctx) and not _names_engine(ctx, target):
        raise APIError(
            f"'provider_model_id' {target!r:.80} is not the served model; this server serves {ctx.model!r}",
            param="provider_model_id",
            status=400,
            code="model_not_found",
        )
    if target is None and model_id not in served_ids(ctx) and not _names_engine(ctx, model_id):
        raise APIError(
            f"cannot register {model_id!r:.80}: this server serves one model, {ctx.model!r}, and registers only "
            f"its names (or an alias with provider_model_id={ctx.model!r}); load that model with "
            "python -m workbench.serve --checkpoint ... to serve it",
            param="model_id",
            status=400,
            code="model_not_found",
        )
    if model_id != ctx.model:
        ctx.aliases[model_id] = ctx.model
    return model_id


def unregister(ctx: Any, model_id: str) -> None:
    if model_id == ctx.model:
        raise APIError(
            f"{model_id!r} is the served model itself and cannot be unregistered (stop the server)", param="model_id"
        )
    if ctx.aliases.pop(model_id, None) is None:
        raise APIError(
            f"no model {model_id!r:.80} is registered here; this server serves {ctx.model!r}",
            param="model_id",
            status=404,
            code="model_not_found",
        )


def _names_engine(ctx: Any, name: Any) -> bool:
    """Whether ``name`` is one of the loaded model's own names (as ``engine.completion(model_id=...)`` takes)."""
    try:
        engine_check_model_id(ctx.engine, name)
    except InputError:
        return False
    return True


def route_list(app: Any) -> list[dict[str, Any]]:
    """Llama Stack's ``RouteInfo`` of every ``/v1`` route (inference-like routes name the provider type)."""
    out = []
    for route in app.routes:
        path, methods = getattr(route, "path", ""), sorted(getattr(route, "methods", None) or ())
        if not path.startswith("/v1/"):
            continue
        inference = any(part in path for part in ("/inference/", "/models", "completions", "/batches"))
        paths = [path]
        if path.split("/")[2] in OPENAI_ROUTES:
            paths.append(OPENAI_PREFIX + path)
        for method in methods:
            if method != "HEAD":
                out += [
                    {"route": p, "method": method, "provider_types": [PROVIDER_TYPE] if inference else []}
                    for p in paths
                ]
    return out


def mount(app: Any, ctx: Any, *, authorize: Callable, body_of: Callable, card: Callable[[Any, str], dict]) -> None:
    """Add the discovery routes to ``app``; ``card(ctx, model_id)`` is the served model's card under that id."""
    from fastapi import Request

    @app.get("/v1/providers")
    async def providers(request: Request) -> dict[str, Any]:
        authorize(request)
        return {"data": [provider(ctx)]}

    @app.get("/v1/providers/{provider_id}")
    async def provider_info(provider_id: str, request: Request) -> dict[str, Any]:
        authorize(request)
        if provider_id != PROVIDER_ID:
            raise APIError(
                f"no provider {provider_id!r:.60} here; the only provider is {PROVIDER_ID!r}",
                param="provider_id",
                status=404,
                code="provider_not_found",
            )
        return provider(ctx)

    @app.get("/v1/health")
    async def health(request: Request) -> dict[str, str]:
        return {"status": "OK"}

    @app.get("/v1/version")
    async def version(request: Request) -> dict[str, str]:
        authorize(request)
        return {"version": workbench_version(), "llama_stack_api": LLAMA_STACK_API}

    @app.get("/v1/inspect/routes")
    async def routes(request: Request) -> dict[str, Any]:
        authorize(request)
        return {"data": route_list(app)}

    @app.post("/v1/models")
    async def register_model(request: Request) -> dict[str, Any]:
        authorize(request)
        return card(ctx, register(ctx, await body_of(request)))

    @app.delete("/v1/models/{model_id:path}")
    async def unregister_model(model_id: str, request: Request) -> None:
        authorize(request)
        unregister(ctx, model_id)
