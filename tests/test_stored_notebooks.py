"""The stored notebooks read well on their own: no progress bar frozen part-way, no widget output whose
model is missing from the saved widget state (notebooks/build.py refuses to store either)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _build_module():
    spec = importlib.util.spec_from_file_location("notebook_build", NOTEBOOKS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _build_module()


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_stored_notebook_has_no_stale_outputs(path: Path) -> None:
    assert build.stale_outputs(nbformat.read(path, as_version=4)) == []


def test_every_built_notebook_is_stored() -> None:
    stored = {p.name for p in NOTEBOOKS.glob("*.ipynb")}
    assert {name for name, _ in build.NOTEBOOKS.values()} <= stored


def test_the_check_finds_a_half_bar_and_an_orphan_widget_view() -> None:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("run()")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="generating:  16%|█▌        | 1/6 [00:01<00:05]"),
        nbformat.v4.new_output("display_data", data={build.WIDGET_VIEW: {"model_id": "abc", "version_major": 2},
                                                     "text/plain": "HBox(children=...)"}),
        nbformat.v4.new_output("stream", name="stderr", text="generating: 6 rows · 141 tokens · 6.2 s · 22.7 tok/s"),
        nbformat.v4.new_output("stream", name="stdout", text="generating: 100%|██████████| 6/6"),
        # a bar redrawn in place (carriage returns) shows only its last state: finished here
        nbformat.v4.new_output("stream", name="stderr", text="requests:  16%|█▌  | 1/6\rrequests: 100%|████| 6/6\n"),
    ]
    nb.cells.append(cell)
    assert build.stale_outputs(nb) == ["cell 0: a progress bar stopped part-way",
                                       "cell 0: a widget view whose model abc is not saved"]
    nb.metadata["widgets"] = {build.WIDGET_STATE: {"state": {"abc": {}}}}
    assert build.stale_outputs(nb) == ["cell 0: a progress bar stopped part-way"]
