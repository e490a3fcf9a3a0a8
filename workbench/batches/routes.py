"""The Batch API's HTTP routes (``/v1/files``, ``/v1/batches``), mounted by :mod:`workbench.serve`.

FastAPI is imported inside :func:`mount` (it is the ``serve`` extra): the rest of the package works without
it.  The server's own helpers (authentication, bounded JSON bodies) are passed in, so every route answers
like the OpenAI routes beside it, and :class:`~workbench.batches.errors.BatchAPIError` becomes its status
with OpenAI's error body.  Uploads are multipart (``file``, ``purpose``), as the official client sends them,
bounded by ``max_file_bytes`` while they stream to disk.
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations (Request) at runtime.
from collections.abc import Callable
from typing import Any

from .errors import BatchAPIError
from .service import BatchService

DEFAULT_MAX_FILE = 200 * 2**20  # OpenAI's limit for a batch input file


def _limit(request: Any, default: int, high: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= high:
        raise BatchAPIError(f"'limit' must be an integer in 1..{high}, got {raw!r:.20}", param="limit")
    return int(raw)


def _page(items: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": more,
    }


def mount(
    app: Any, service: BatchService, *, authorize: Callable, body_of: Callable, max_file_bytes: int = DEFAULT_MAX_FILE
) -> None:
    """Add the file and batch routes to ``app`` (``service`` holds the state and runs the batches)."""
    from fastapi import Request
    from fastapi.responses import FileResponse
    from starlette.concurrency import run_in_threadpool

    async def upload(request: Request) -> Any:
        """The multipart form, read through a receive that refuses more than ``max_file_bytes``."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_file_bytes + 2**16:
            raise BatchAPIError(
                f"the upload has {declared} bytes; this server accepts files up to {max_file_bytes}",
                status=413,
                code="file_too_large",
            )
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise BatchAPIError(
                "upload the file as multipart/form-data with the fields 'file' and 'purpose' (what "
                "client.files.create sends)",
                param="file",
            )
        seen = 0

        async def receive() -> Any:
            nonlocal seen
            message = await request.receive()
            seen += len(message.get("body", b""))
            if seen > max_file_bytes + 2**16:
                raise BatchAPIError(f"the upload exceeds {max_file_bytes} bytes", status=413, code="file_too_large")
            return message

        try:
            return await Request(request.scope, receive).form(max_files=1, max_fields=8)
        except BatchAPIError:
            raise
        except Exception as exc:  # noqa: BLE001 - a malformed form is the client's 400, never a 500
            raise BatchAPIError(f"the multipart body could not be read ({str(exc)[:200]})", param="file") from None

    @app.post("/v1/files")
    async def create_file(request: Request) -> dict[str, Any]:
        authorize(request)
        form = await upload(request)
        try:
            file, purpose = form.get("file"), form.get("purpose")
            if file is None or isinstance(file, str):
                raise BatchAPIError("the form has no file: send it in the field 'file'", param="file")
            if not isinstance(purpose, str):
                raise BatchAPIError("the form has no 'purpose' (use 'batch')", param="purpose")
            return await run_in_threadpool(
                service.files.create, file.file, filename=file.filename or "", purpose=purpose
            )
        finally:
            await form.close()

    @app.get("/v1/files")
    async def list_files(request: Request) -> dict[str, Any]:
        authorize(request)
        items, more = service.files.list(
            purpose=request.query_params.get("purpose"),
            limit=_limit(request, 10000, 10000),
            after=request.query_params.get("after"),
            order=request.query_params.get("order", "desc"),
        )
        return _page(items, more)

    @app.get("/v1/files/{file_id}")
    async def get_file(file_id: str, request: Request) -> dict[str, Any]:
        authorize(request)
        return service.files.get(file_id)

    @app.get("/v1/files/{file_id}/content")
    async def file_content(file_id: str, request: Request) -> Any:
        authorize(request)
        return FileResponse(service.files.path(file_id), media_type="application/jsonl")

    @app.delete("/v1/files/{file_id}")
    async def delete_file(file_id: str, request: Request) -> dict[str, Any]:
        authorize(request)
        return service.files.delete(file_id)

    @app.post("/v1/batches")
    async def create_batch(request: Request) -> dict[str, Any]:
        authorize(request)
        return service.create(await body_of(request))

    @app.get("/v1/batches")
    async def list_batches(request: Request) -> dict[str, Any]:
        authorize(request)
        items, more = service.list(after=request.query_params.get("after"), limit=_limit(request, 20, 100))
        return _page(items, more)

    @app.get("/v1/batches/{batch_id}")
    async def get_batch(batch_id: str, request: Request) -> dict[str, Any]:
        authorize(request)
        return service.get(batch_id)

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
        authorize(request)
        return service.cancel(batch_id)
