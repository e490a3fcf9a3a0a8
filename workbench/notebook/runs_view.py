"""``wb.runs.view(*names)``: what changed between stored runs, in the notebook.

One widget: pick the runs and the baseline; the runs with their tags, notes and the settings that differ from
the baseline's; the score summary (means and paired differences with 95 % intervals, p-values, "not shown to
differ" where the interval covers 0); the item grid of one run against the baseline, regressions first, with
filters (changed only, regressed only, text search); a click on an item opens both transcripts side by side,
tool calls and results included, the differences highlighted word by word.

The grid is an itables ``ITable`` (DataTables in an anywidget: its script ships inside the package, so it
works offline): the browser holds the rows' short texts and draws one page of them, never all rows in the
DOM.  Full outputs stay in the kernel; the detail pane asks for both transcripts of the clicked item.  The
HTML parts are :mod:`workbench.runs.report_html`'s, so the viewer and the report file read the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd
from itables.widget import ITable

from workbench import runs
from workbench.errors import InputError
from workbench.runs.report_html import (
    STYLE,
    counts_html,
    esc,
    ordered_changes,
    runs_html,
    score_names,
    side_by_side_html,
    summary_html,
    transcript_text,
)
from workbench.runs.store import Store, open_store

PAGE_ROWS = 15  # grid rows per page
CELL_CHARS = 80  # characters of an output the grid shows (the detail pane shows all)


def _cut(value: Any, limit: int = CELL_CHARS) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def grid_frame(compared: pd.DataFrame) -> pd.DataFrame:
    """The grid's rows from an ordered compare frame: status, item, each score in both runs, both outputs cut
    to :data:`CELL_CHARS` (what the browser receives)."""
    scores = score_names(compared)
    columns: dict[str, list[Any]] = {
        "status": list(compared["status"]),
        "item": [_cut(v, 60) for v in compared["item"]],
    }
    for score in scores:
        pairs = zip(compared[f"{score}_a"], compared[f"{score}_b"])
        columns[score] = [f"{_cut(a, 8)} → {_cut(b, 8)}" for a, b in pairs]
    for side in ("a", "b"):  # a tool-loop item's output lists its calls turn by turn, then the answer
        columns[f"output {side}"] = [_cut(o) for o in compared[f"output_{side}"]]
    return pd.DataFrame(columns)


def filter_items(
    compared: pd.DataFrame, *, changed_only: bool = False, regressed_only: bool = False, search: str = ""
) -> pd.DataFrame:
    """The rows of an ordered compare frame the filters keep; the search is case-insensitive over the item and
    both full outputs and tool calls."""
    keep = pd.Series(True, index=compared.index)
    if changed_only:
        keep &= compared["status"] != "same"
    if regressed_only:
        keep &= compared["status"] == "regressed"
    needle = search.strip().lower()
    if needle:
        hay = compared["item"].astype(str)
        for column in ("output_a", "output_b", "tool_calls_a", "tool_calls_b"):
            if column in compared.columns:
                hay = hay + "\n" + compared[column].astype(str)
        keep &= hay.str.lower().str.contains(needle, regex=False)
    return compared[keep]


class RunsView:
    """The viewer (see the module docstring).  ``widget`` is the ipywidgets box; displaying the object shows
    it.  For scripted use and tests: :meth:`select` picks runs and the baseline, :meth:`set_filters` filters
    the grid, :meth:`open_item` opens an item's transcripts; ``items`` is the grid's compare frame in order."""

    def __init__(
        self,
        names: Sequence[str],
        *,
        baseline: str | None = None,
        store: str | Path | Store | None = None,
        page_rows: int = PAGE_ROWS,
    ) -> None:
        self.store = open_store(store)
        known = self.store.run_names()
        names = list(dict.fromkeys(names)) or known[-2:]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InputError(
                f"no run named {unknown[0]!r} in the run store {str(self.store.path)!r} "
                f"(runs: {', '.join(known) or 'none'}); wb.runs.table() lists them"
            )
        if not names:
            raise InputError(f"the run store {str(self.store.path)!r} holds no runs yet; store some with run=...")
        self.page_rows = page_rows
        self.updating = False
        self.names = names
        self.items = pd.DataFrame()
        self.shown = pd.DataFrame()
        self.pick = widgets.SelectMultiple(
            options=known, value=tuple(names), description="runs", rows=min(6, max(2, len(known)))
        )
        self.pick.add_class("wb-runs-pick")
        self.baseline = widgets.Dropdown(description="baseline")
        self.baseline.add_class("wb-runs-baseline")
        self.other = widgets.Dropdown(description="compare")
        self.other.add_class("wb-runs-other")
        self.runs_box = widgets.HTML().add_class("wb-runs-runs")
        self.summary_box = widgets.HTML().add_class("wb-runs-summary")
        self.counts = widgets.HTML().add_class("wb-runs-counts")
        self.changed_only = widgets.Checkbox(value=False, description="changed only", indent=False)
        self.changed_only.add_class("wb-runs-changed-only")
        self.regressed_only = widgets.Checkbox(value=False, description="regressed only", indent=False)
        self.regressed_only.add_class("wb-runs-regressed-only")
        self.search = widgets.Text(placeholder="search items, outputs, tool calls", continuous_update=False)
        self.search.add_class("wb-runs-search")
        self.grid = ITable(pd.DataFrame({"status": [], "item": []}), **self._grid_options())
        self.grid.add_class("wb-runs-grid")
        self.detail = widgets.HTML("<p class='wb-muted'>click an item to see both transcripts</p>")
        self.detail.add_class("wb-runs-detail")
        self.widget = (
            widgets.VBox(
                [
                    widgets.HTML(f"<style>{STYLE}</style>"),
                    widgets.HBox([self.pick, widgets.VBox([self.baseline, self.other])]),
                    self.runs_box,
                    self.summary_box,
                    widgets.HBox([self.changed_only, self.regressed_only, self.search]),
                    self.counts,
                    self.grid,
                    self.detail,
                ]
            )
            .add_class("wb-runs-view")
            .add_class("wb-runs")
        )
        self._choose(names, baseline or names[0])
        self.pick.observe(lambda change: self._choose(list(change["new"]), self.baseline.value), "value")
        self.baseline.observe(lambda change: self._choose(list(self.pick.value), change["new"]), "value")
        self.other.observe(lambda change: None if self.updating else self._compare(), "value")
        for control in (self.changed_only, self.regressed_only, self.search):
            control.observe(lambda change: self._filter(), "value")
        self.grid.observe(lambda change: self._open_selected(change["new"]), "selected_rows")

    def _grid_options(self) -> dict[str, Any]:
        return {
            "select": {"style": "single"},
            "pageLength": self.page_rows,
            "lengthMenu": [self.page_rows, 50, 100],
            "maxBytes": 0,
            "showIndex": False,
            "classes": "display compact",
            "order": [],
            "autoWidth": False,
            "style": "table-layout:auto;width:100%;margin:0",
        }

    # -------------------------------------------------------------------------------------------- state
    def _choose(self, names: list[str], baseline: str | None) -> None:
        """Runs picked (at least one), baseline among them: redraw the runs, the summary and the grid."""
        if self.updating:  # the controls set below call back here
            return
        names = names or [self.pick.options[0]]
        baseline = baseline if baseline in names else names[0]
        others = [n for n in names if n != baseline]
        previous = self.other.value
        self.updating = True
        try:
            self.baseline.options = names
            self.baseline.value = baseline
            self.other.options = others
            self.other.value = previous if previous in others else (others[0] if others else None)
        finally:
            self.updating = False
        self.names = names
        diffs = {n: runs.diff_settings(baseline, n, store=self.store) for n in others}
        self.runs_box.value = runs_html(names, baseline, runs.table(store=self.store), diffs)
        try:
            self.summary_box.value = summary_html(
                runs.summary(names, baseline=baseline, store=self.store, empty_ok=True)
            )
        except InputError as exc:  # e.g. scores of different kinds under one name: the message names the fix
            self.summary_box.value = f"<p class='wb-regressed-verdict'>{esc(exc)}</p>"
        self._compare()

    def _compare(self) -> None:
        baseline, other = self.baseline.value, self.other.value
        if other is None:
            self.items = pd.DataFrame(columns=["status", "item", "output_a", "output_b"])
            self.counts.value = "<p class='wb-muted'>pick a second run to compare items</p>"
        else:
            try:
                compared = runs.compare(baseline, other, store=self.store)
            except InputError as exc:  # no item in common: say so and why, keep the viewer usable
                self.items = pd.DataFrame(columns=["status", "item", "output_a", "output_b"])
                self.counts.value = f"<p class='wb-regressed-verdict'>{esc(exc)}</p>"
                self._filter()
                return
            self.items = ordered_changes(compared).reset_index(drop=True)
            self.items.attrs.update(compared.attrs)
            counts = counts_html(compared.attrs.get("counts", {}))
            self.counts.value = f"<p>{esc(other)} vs {esc(baseline)}: {counts}</p>"
        self._filter()

    def _filter(self) -> None:
        self.shown = filter_items(
            self.items,
            changed_only=self.changed_only.value,
            regressed_only=self.regressed_only.value,
            search=self.search.value,
        )
        self.grid.update(
            grid_frame(self.shown) if len(self.shown) else pd.DataFrame({"status": [], "item": []}),
            selected_rows=[],
            **self._grid_options(),
        )

    def _open_selected(self, selected: list[int]) -> None:
        if selected and selected[0] < len(self.shown):
            self.open_item(self.shown["item"].iloc[selected[0]])

    # -------------------------------------------------------------------------------------------- actions
    def select(
        self, names: Sequence[str] | None = None, *, baseline: str | None = None, other: str | None = None
    ) -> RunsView:
        """Pick the runs, the baseline and the run compared with it (as the controls do)."""
        if names is not None:
            self.pick.value = tuple(names)
        if baseline is not None:
            self.baseline.value = baseline
        if other is not None:
            self.other.value = other
        return self

    def set_filters(
        self, *, changed_only: bool | None = None, regressed_only: bool | None = None, search: str | None = None
    ) -> RunsView:
        if changed_only is not None:
            self.changed_only.value = changed_only
        if regressed_only is not None:
            self.regressed_only.value = regressed_only
        if search is not None:
            self.search.value = search
        return self

    def open_item(self, item: Any) -> str:
        """Show ``item``'s transcripts in the baseline and the compared run side by side (differences
        highlighted); returns the HTML shown."""
        baseline, other = self.baseline.value, self.other.value
        left = runs.transcript(baseline, item, store=self.store)
        right = runs.transcript(other, item, store=self.store) if other is not None else []
        row = self.items[self.items["item"] == item] if len(self.items) else self.items
        status = row["status"].iloc[0] if len(row) else ""
        why = [(n, runs.explanation(n, item, store=self.store)) for n in (baseline, other) if n is not None]
        notes = "".join(f"<p><b>{esc(n)}</b>: <pre>{esc(text)}</pre></p>" for n, text in why if text)
        self.detail.value = (
            f"<h3>{esc(item)} <span class='wb-change-{esc(status)}'>{esc(status)}</span></h3>"
            + notes
            + side_by_side_html(baseline, transcript_text(left), other or "", transcript_text(right))
        )
        return self.detail.value

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = f"runs view: {', '.join(self.names)} (baseline {self.baseline.value})"
        bundle["text/html"] = (
            f"<style>{STYLE}</style><div class='wb-runs'>{self.runs_box.value}"
            f"{self.summary_box.value}{self.counts.value}</div>"
        )
        return bundle


def view(*names: str, baseline: str | None = None, store: str | Path | Store | None = None) -> RunsView:
    """The viewer of runs ``names`` (default: the two latest) against ``baseline`` (default: the first): see
    :class:`RunsView`.  ``wb.runs.view("int4", "bf16")`` in a cell shows it."""
    if len(names) == 1 and not isinstance(names[0], str):
        names = tuple(names[0])  # a list of names
    return RunsView(names, baseline=baseline, store=store)
