"""Errors of the endpoint, in the shape the official OpenAI client parses (``{"error": {...}}``).

Why a module of its own: every route, the request translation and the gatherer raise :class:`APIError`, and
one handler turns it (and the engine's own :mod:`workbench.errors`) into a 4xx body that names the field.
Nothing a client sends may become a 500 or kill the server; only an engine bug is a 500.
"""

from __future__ import annotations

import re
from typing import Any

from workbench.engine import SamplingParams
from workbench.errors import (
    EngineBusyError,
    FormatError,
    GenerationCancelled,
    ImageError,
    InputError,
    PromptTooLongError,
    SamplingError,
    ToolCallParseError,
    ToolError,
    WorkbenchError,
)

_SAMPLING_FIELDS = tuple(f.name for f in SamplingParams.keywords())  # a SamplingError names one of them


class APIError(InputError):
    """A request the endpoint refuses: HTTP ``status``, the OpenAI ``type``, and the request field at fault.

    An :class:`~workbench.errors.InputError`, so code that calls the translation functions directly (tests,
    notebooks) can catch it like any other bad input."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}`` as OpenAI sends it."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def from_engine_error(exc: BaseException, where: str) -> APIError:
    """The 4xx (or 500, for an engine bug) for an exception raised while serving a request.

    ``where`` is the request's main input field (``messages`` or ``prompt``), named when the error is about it.
    """
    if isinstance(exc, APIError):
        return exc
    message = str(exc) or type(exc).__name__
    if isinstance(exc, SamplingError):
        named = re.match(r"\w+", message)
        param = named.group(0) if named and named.group(0) in _SAMPLING_FIELDS else None
        return APIError(message, param=param)
    if isinstance(exc, PromptTooLongError):
        return APIError(message, param=where, code="context_length_exceeded")
    if isinstance(exc, FormatError):
        return APIError(message, param="response_format")
    if isinstance(exc, ToolError):
        return APIError(message, param="tools")
    if isinstance(exc, (ImageError, InputError, ToolCallParseError)):
        return APIError(message, param=where)
    if isinstance(exc, GenerationCancelled):
        return APIError(f"the request was cancelled: {message}", status=499, type="cancelled")
    if isinstance(exc, EngineBusyError):
        return APIError(message, status=503, type="server_error")
    if isinstance(exc, WorkbenchError):  # an unloaded engine, a dead worker: the server's state, not the request
        return APIError(message, status=503, type="server_error")
    return APIError(
        f"internal error while serving the request ({type(exc).__name__}: {message[:300]}); the server keeps serving",
        status=500,
        type="server_error",
    )
