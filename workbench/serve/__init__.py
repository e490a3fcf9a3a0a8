"""``workbench.serve``: the kernel's engine as an OpenAI-compatible endpoint (``pip install 'workbench[serve]'``).

    srv = workbench.serve(engine, port=0)              # returns at once; srv.url ends in /v1
    client = openai.OpenAI(base_url=srv.url, api_key="none")
    srv.stop()                                         # or: with workbench.serve(engine) as srv: ...

Modules: :mod:`.translate` (request bodies → engine calls), :mod:`.room` (``max_tokens`` against the context),
:mod:`.gather` (concurrent requests → engine batches), :mod:`.shapes` / :mod:`.streams` (results → OpenAI
responses and SSE chunks), :mod:`.app` (routes), :mod:`.llama_stack` and :mod:`.registry` (Llama Stack's
inference and discovery routes), :mod:`.bulk` (the Batch API's backend: :mod:`workbench.batches` holds the
rest), :mod:`.server` (lifecycle), :mod:`.errors` (OpenAI-shaped 4xx), :mod:`.options` and
:mod:`.batch_main` (the command lines).
"""

import sys
import types
from typing import Any

from .errors import APIError
from .server import ServeError, Server, serve

__all__ = ["APIError", "ServeError", "Server", "serve"]


class _CallableModule(types.ModuleType):
    """``wb.serve(engine)`` must work even after ``import workbench.serve``: importing a submodule makes it the
    package attribute ``workbench.serve`` (replacing the package face's lazy function), so the module itself is
    callable and calls :func:`serve`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Server:
        return serve(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
