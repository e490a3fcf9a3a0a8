"""What every notebook's cells share: the nbval tags, the first cell (the extra a notebook needs, checked), and
the lines that pick the checkpoint."""

from __future__ import annotations

CHECK, IGNORE = "nbval-check-output", "nbval-ignore-output"


def requires(extra: str, why: str) -> tuple:
    """The first cell of every notebook: which extra it needs (one pip line) and the check that ends a run
    without it at this cell, with that line (wb.require raises MissingExtraError, shown as one line)."""
    from workbench.notebook.extras import EXTRAS

    return (
        "code",
        f'''# {why}
#   {EXTRAS[extra][1]}
import workbench as wb

wb.require("{extra}")''',
    )


LAB = requires("lab", "Needs the lab extra, which the README quick start's first command installs:")

LOAD = """import os

# None -> the embedded default model; set WORKBENCH_NOTEBOOK_CHECKPOINT to a Meta checkpoint folder
# (or a checkpoints.toml name) to run these cells on a real model.
CHECKPOINT = os.environ.get("WORKBENCH_NOTEBOOK_CHECKPOINT")"""
