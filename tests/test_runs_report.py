"""What changed between runs, shown: the self-contained report file (``wb.runs.report``) and the notebook
viewer's kernel side (``wb.runs.view``: runs, summary, the item grid with regressions first, filters, both
transcripts side by side).  The browser draws both in tests/test_browser.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pytest
from _runs_experiment import expected_counts, tool_of, write_runs

import workbench as wb
from workbench.errors import InputError
from workbench.notebook.runs_view import RunsView, grid_frame
from workbench.runs.report_html import NOT_SHOWN, diff_html, summary_html, verdict

N_ITEMS = 40
EXTERNAL = re.compile(r"https?://|//cdn|<link\b|\bsrc\s*=|@import|url\(", re.IGNORECASE)


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    return write_runs(tmp_path / "store" / "runs.sqlite", N_ITEMS)


def test_diff_marks_only_the_words_that_differ():
    left, right = diff_html("call get_weather(Paris) <now>", "call get_time(Paris) <now>")
    assert left == 'call <span class="wb-del">get_weather</span>(Paris) &lt;now&gt;'
    assert right == 'call <span class="wb-ins">get_time</span>(Paris) &lt;now&gt;'


def test_verdict_says_not_shown_to_differ_when_the_interval_covers_zero():
    assert verdict({"mean": 0.5, "diff": 0.1, "diff_low": -0.05, "diff_high": 0.25}) == NOT_SHOWN
    assert verdict({"mean": 0.5, "diff": -0.2, "diff_low": -0.3, "diff_high": -0.1}) == "lower"
    assert verdict({"mean": 0.5, "diff": -0.2, "diff_low": -0.3, "diff_high": -0.1, "shown": False}) == NOT_SHOWN
    assert verdict({"mean": 0.9, "diff": None}) == "baseline"


def test_report_is_one_self_contained_file_with_summary_settings_and_changes(experiment, tmp_path):
    path = wb.runs.report(["prompt-a", "prompt-b"], tmp_path / "out" / "report.html", store=experiment)
    text = path.read_text(encoding="utf-8")
    assert not EXTERNAL.search(text), EXTERNAL.search(text)
    assert "<script" not in text.lower()
    summary = wb.runs.summary(["prompt-a", "prompt-b"], store=experiment)
    row = summary[summary["run"] == "prompt-b"].iloc[0]
    assert f"{row['p_value']:.4f}" in text  # the p-value of the paired difference, as the summary has it
    assert "system" in text and "You are terse and call tools." in text  # the differing setting, both values
    counts = expected_counts(N_ITEMS)
    items = re.findall(r"<span class='wb-change-(\w+)'>", text)
    assert items[: counts["regressed"]] == ["regressed"] * counts["regressed"]  # regressions first
    assert items.count("improved") == counts["improved"] and "changed" in items
    assert '<span class="wb-del">get_weather</span>' in text and '<span class="wb-ins">get_time</span>' in text


def test_report_of_unscored_runs_shows_the_settings_and_the_changed_items(tmp_path):
    """Two runs just stored, before any score (the first thing one wants after trying a second system prompt):
    the report holds the differing setting and the changed items, and says there are no scores yet."""
    store = write_runs(tmp_path / "runs.sqlite", N_ITEMS, scored=False)
    path = wb.runs.report(["prompt-a", "prompt-b"], tmp_path / "unscored.html", store=store)
    text = path.read_text()
    assert "no scores yet" in text and "wb.runs.score(name, fn)" in text
    assert "system_prompt" in text and "You are terse and call tools." in text  # the setting that differs
    changed = sum(tool_of("prompt-a", i) != tool_of("prompt-b", i) or i % 11 == 5 for i in range(N_ITEMS))
    assert text.count("class='wb-item'") == changed  # every changed item, both outputs side by side
    assert "get_time" in text and "wb-summary-row" not in text
    with pytest.raises(InputError, match="hold no scores yet"):  # the summary itself still says what to do
        wb.runs.summary(["prompt-a", "prompt-b"], store=store)
    assert len(wb.runs.summary(["prompt-a", "prompt-b"], store=store, empty_ok=True)) == 0
    view = wb.runs.view("prompt-a", "prompt-b", store=store)  # the viewer too: no scores yet, not an error
    assert "no scores yet" in view.summary_box.value and "wb-regressed-verdict" not in view.summary_box.value


def test_report_caps_the_items_and_counts_the_rest(experiment, tmp_path):
    path = wb.runs.report(["prompt-a", "prompt-b"], tmp_path / "r.html", store=experiment, limit=2)
    text = path.read_text()
    assert len(re.findall(r"<div class='wb-item'>", text)) == 2
    assert re.search(r"and \d+ more changed items", text)


def test_a_report_path_that_cannot_be_written_is_a_clear_error_and_the_store_keeps_everything(experiment, tmp_path):
    before = len(wb.runs.rows("prompt-a", store=experiment))
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: a path under a file stands in
            target = experiment / "report.html"
        else:
            target = locked / "report.html"
        with pytest.raises(InputError, match="cannot write the report .* pick a path"):
            wb.runs.report(["prompt-a", "prompt-b"], target, store=experiment)
    finally:
        os.chmod(locked, 0o700)
    with pytest.raises(InputError, match="is a folder"):
        wb.runs.report(["prompt-a", "prompt-b"], tmp_path, store=experiment)
    with pytest.raises(InputError, match="no run named 'nope'"):
        wb.runs.report(["prompt-a", "nope"], tmp_path / "x.html", store=experiment)
    assert not (tmp_path / "x.html").exists()
    assert len(wb.runs.rows("prompt-a", store=experiment)) == before


def test_viewer_grid_puts_regressions_first_filters_and_opens_both_transcripts(experiment):
    view = wb.runs.view("prompt-a", "prompt-b", store=experiment)
    assert isinstance(view, RunsView) and view.baseline.value == "prompt-a" and view.other.value == "prompt-b"
    counts = expected_counts(N_ITEMS)
    statuses = list(view.items["status"])
    assert statuses[: counts["regressed"]] == ["regressed"] * counts["regressed"]
    assert statuses.count("improved") == counts["improved"] and len(statuses) == N_ITEMS
    assert "prompt-b" in view.summary_box.value and "p-value" in view.summary_box.value
    assert "You are terse and call tools." in view.runs_box.value
    grid = grid_frame(view.shown)
    assert list(grid.columns[:2]) == ["status", "item"] and len(grid) == N_ITEMS
    assert list(view.grid.df["status"])[:1] == ["regressed"]

    view.set_filters(regressed_only=True)
    assert len(view.shown) == counts["regressed"] and set(view.shown["status"]) == {"regressed"}
    view.set_filters(regressed_only=False, changed_only=True)
    assert "same" not in set(view.shown["status"]) and len(view.shown) > counts["regressed"]
    view.set_filters(changed_only=False, search="QUESTION 10")
    assert list(view.shown["item"].astype(str).str.contains("question 10")) == [True] * len(view.shown)
    view.set_filters(search="")

    regressed = view.items["item"].iloc[0]
    html = view.open_item(regressed)
    assert '<span class="wb-del">get_weather</span>' in html and '<span class="wb-ins">get_time</span>' in html
    assert "call:" in html
    view.grid.selected_rows = [0]  # a click in the grid opens the same item
    assert view.detail.value == html

    view.select(baseline="prompt-b")  # the baseline flips: the regressions become improvements
    assert view.other.value == "prompt-a" and list(view.items["status"]).count("improved") == counts["regressed"]
    bundle = view._repr_mimebundle_()
    assert "runs view" in bundle["text/plain"] and "prompt-a" in bundle["text/html"]


def test_viewer_refuses_unknown_runs_and_says_when_runs_share_no_item(experiment):
    with pytest.raises(InputError, match="no run named 'nope'.*wb.runs.table"):
        wb.runs.view("prompt-a", "nope", store=experiment)
    write_runs(experiment, 5, names=("prompt-a",), first=100)  # another run's items: none in common
    view = wb.runs.view("prompt-a", "prompt-b", store=experiment)
    assert len(view.items) == N_ITEMS
    view.select(["prompt-b", "other-items"], baseline="prompt-b")
    assert "no item" in view.counts.value and len(view.shown) == 0 and view.other.value == "other-items"


def test_summary_html_without_scores_says_how_to_add_them():
    assert "wb.runs.score" in summary_html(pd.DataFrame())
