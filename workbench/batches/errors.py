"""The Batch API's refusals, in the shape the official OpenAI client parses (``{"error": {...}}``).

A :class:`~workbench.errors.InputError`, so code that drives the file store or the batch service directly
(tests, a notebook) catches it like any other bad input; the server turns it into its HTTP status.
"""

from __future__ import annotations

from typing import Any

from workbench.errors import InputError


class BatchAPIError(InputError):
    """A Batch API request refused: HTTP ``status``, the request field at fault (``param``) and a ``code``."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": self.code}
        }


def not_found(kind: str, ident: str) -> BatchAPIError:
    route = {"file": "files", "batch": "batches"}.get(kind, kind + "s")
    return BatchAPIError(
        f"no {kind} with id {ident!r:.80} here (list them with GET /v1/{route})",
        status=404,
        param=f"{kind}_id",
        code=f"{kind}_not_found",
    )
