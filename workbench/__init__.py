"""workbench: a Jupyter-first research workbench for Meta's Llama 3.x and Llama 4 checkpoints.

The package face: what notebooks import (``import workbench as wb``); its eager names come from
:mod:`workbench.face`, which sits in the layers contract (so a module below that imports the package root
is reported as an import going up).  Importing it also imports the notebook face (:mod:`workbench.notebook`),
which registers the HTML cards and DataFrames that results display with.  What pulls heavy or optional
dependencies loads on first use (PEP 562): ``wb.bench`` and ``wb.plots`` (pandas, matplotlib), ``wb.serve``
(fastapi, uvicorn) and ``wb.cluster`` (Ray), and ``wb.runs``'s browsing functions (pandas, inspect_ai), so
``import workbench`` stays fast and works without the extras.
"""

import importlib
from typing import Any

from workbench import face
from workbench.face import *  # noqa: F403 (the eager names: workbench/face.py lists them)

# name -> (module, attribute or None for the module itself), imported on first access
_LAZY = {
    "serve": ("workbench.serve", "serve"),
    "cluster": ("workbench.cluster", None),
    "bench": ("workbench.notebook.bench", None),
    "plots": ("workbench.notebook.plots", None),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        loaded = importlib.import_module(module)
        return loaded if attribute is None else getattr(loaded, attribute)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


__all__ = ["bench", "plots"]  # noqa: F405 (loaded on first use: __getattr__ above)
__all__ += face.__all__
__version__ = "0.1.0"
