"""Writes the notebooks from their cell lists (``cells/``, one module per notebook), runs them, and stores
their outputs (with widget state), refusing any that ``checks.py`` rejects.

    python notebooks/build.py            # write and execute all of them
    python notebooks/build.py 02 03      # only some

Cells are tagged for nbval (``nbval-check-output``: deterministic, compared in CI;
``nbval-ignore-output``: depends on the model or the machine), so the code a reader copies carries no
test comments.  The kernel runs with ``WORKBENCH_PROGRESS_DELAY=0``: every automatic progress bar shows, so
that a compared cell whose output a slow machine would change is refused here.  Execution metadata (timings) is
stripped; the state of the widgets a stored output shows is
saved so that they render from the stored notebook (closed progress bars' leftovers are dropped), and every
widget also carries a text/HTML fallback.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
# The cell lists and the checks live beside this script; a test loads it by path, so put its folder on the path.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from cells.nb01_quickstart import QUICKSTART  # noqa: E402
from cells.nb02_tool_experiments import TOOL_EXPERIMENTS  # noqa: E402
from cells.nb03_invariance import INVARIANCE  # noqa: E402
from cells.nb03_throughput import THROUGHPUT  # noqa: E402
from cells.nb04_quantization import QUANTIZATION  # noqa: E402
from cells.nb05_scale_out import SCALE_OUT  # noqa: E402
from cells.nb06_evaluations import (  # noqa: E402
    BFCL_INSPECT_CELLS,
    BFCL_MULTI_TURN_CELLS,
    EVALUATIONS_INTRO,
    LM_EVAL_CELLS,
)
from cells.nb07_run_store import RUN_STORE  # noqa: E402
from cells.nb08_experiments import EXPERIMENTS  # noqa: E402
from checks import (  # noqa: E402
    WIDGET_STATE,
    automatic_bar,
    coalesced,
    output_texts,
    problems,
    shown_widget_models,
    timing_problems,
)

DELAY_VARIABLE = "WORKBENCH_PROGRESS_DELAY"  # workbench.progress.DELAY_VARIABLE

NOTEBOOKS = {
    "01": ("01_quickstart.ipynb", QUICKSTART),
    "02": ("02_tool_experiments.ipynb", TOOL_EXPERIMENTS),
    "03": ("03_throughput.ipynb", THROUGHPUT[:-1] + INVARIANCE + THROUGHPUT[-1:]),
    "04": ("04_quantization.ipynb", QUANTIZATION),
    "05": ("05_scale_out.ipynb", SCALE_OUT),
    "06": (
        "06_evaluations.ipynb",
        EVALUATIONS_INTRO + LM_EVAL_CELLS + BFCL_INSPECT_CELLS[:-1] + BFCL_MULTI_TURN_CELLS + BFCL_INSPECT_CELLS[-1:],
    ),
    "07": ("07_run_store.ipynb", RUN_STORE),
    "08": ("08_experiments.ipynb", EXPERIMENTS),
}


def make(cells: list[tuple]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for kind, source, *tags in cells:
        cell = nbformat.v4.new_markdown_cell(source) if kind == "md" else nbformat.v4.new_code_cell(source)
        if tags:
            cell.metadata["tags"] = list(tags)
        nb.cells.append(cell)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return nb


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Strip what differs between runs and says nothing to a reader: timings, the closing lines of automatic
    progress bars (the build shows every one, see the module's docstring; a reader's run shows those of slow
    calls only), cell ids' noise, the redraws
    of third-party text bars (stored as what a reader sees: each line after its last carriage return), and
    the saved state of widgets no stored output shows (closed progress bars leave their models behind)."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.get("outputs"):  # an automatic bar's closing line: shown only because the build asked for all
            cell.outputs = [o for o in cell.outputs if not automatic_bar(o)]
        outputs = cell.get("outputs", [])
        if any(o.get("output_type") == "stream" and "\r" in o.get("text", "") for o in outputs):
            cell.outputs = [nbformat.from_dict(o) for o in coalesced(outputs)]
            for o in cell.outputs:
                if o.get("output_type") == "stream":
                    o.text = output_texts(o)[0]
    nb.metadata["language_info"] = {"name": "python"}
    widgets = nb.metadata.get("widgets", {}).get(WIDGET_STATE)
    if widgets is not None:
        shown = shown_widget_models(nb)
        widgets["state"] = {k: v for k, v in widgets.get("state", {}).items() if k in shown}
        if not widgets["state"]:
            del nb.metadata["widgets"]
    return nb


def build(key: str, execute: bool = True) -> Path:
    name, cells = NOTEBOOKS[key]
    nb = make(cells)
    if execute:
        # every automatic progress bar shows at once: a compared cell that would show one on a slow machine
        # shows it here, and checks.timing_problems refuses to store it
        previous = os.environ.get(DELAY_VARIABLE)
        os.environ[DELAY_VARIABLE] = "0"
        try:
            NotebookClient(
                nb,
                timeout=1800,
                kernel_name="python3",
                resources={"metadata": {"path": str(HERE)}},
                store_widget_state=True,
                record_timing=False,
            ).execute()
        finally:
            if previous is None:
                os.environ.pop(DELAY_VARIABLE, None)
            else:
                os.environ[DELAY_VARIABLE] = previous
    timing = timing_problems(nb) if execute else []  # before clean() drops the automatic bars' lines
    clean(nb)
    if execute:
        found = timing + problems(nb)
        if found:
            rejected = Path(tempfile.gettempdir()) / f"rejected-{name}"
            nbformat.write(nb, rejected)
            raise SystemExit(f"{name} would be stored with bad outputs ({rejected}): " + "; ".join(found))
    path = HERE / name
    nbformat.write(nb, path)
    return path


if __name__ == "__main__":
    keys = sys.argv[1:] or list(NOTEBOOKS)
    for key in keys:
        print("wrote", build(key))
