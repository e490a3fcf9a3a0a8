"""``workbench.serve``: the kernel's engine as an OpenAI-compatible endpoint (``pip install 'workbench[serve]'``).

    srv = workbench.serve(engine, port=0)              # returns at once; srv.url ends in /v1
    client = openai.OpenAI(base_url=srv.url, api_key="none")
    srv.stop()                                         # or: with workbench.serve(engine) as srv: ...

Modules: :mod:`.translate` (request bodies → engine calls), :mod:`.gather` (concurrent requests → engine
batches), :mod:`.shapes` / :mod:`.streams` (results → OpenAI responses and SSE chunks), :mod:`.app` (routes),
:mod:`.server` (lifecycle), :mod:`.errors` (OpenAI-shaped 4xx).
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
