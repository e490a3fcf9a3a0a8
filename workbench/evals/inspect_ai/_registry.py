"""Registers the ``workbench`` model provider with Inspect (the ``inspect_ai`` entry point imports this module).

The provider class is imported only when a ``workbench/...`` model is created, as Inspect's own providers do.
"""

from __future__ import annotations

from typing import Any

from inspect_ai.model import modelapi


@modelapi(name="workbench")
def workbench() -> type[Any]:
    from .provider import WorkbenchAPI  # Inspect imports every entry point at start: load the engine code on use

    return WorkbenchAPI
