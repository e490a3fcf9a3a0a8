"""How the suite is laid out (tests/conftest.py, docs/test-suite.md): which group a test runs in, and which
nbval runs leave a session because the real-browser test makes their check."""

from __future__ import annotations

from pathlib import Path

import test_browser
from conftest import RUN_IN_BROWSER, browser_will_run, group_of, repeated_in_browser

ROOT = Path(__file__).resolve().parents[1]
BROWSER_TEST, BROWSER_NOTEBOOKS = RUN_IN_BROWSER
NBVAL_02 = [f"notebooks/{test_browser.NOTEBOOK_02}::Cell {i}" for i in range(3)]
NBVAL_03 = [f"notebooks/{test_browser.NOTEBOOK_03}::Cell {i}" for i in range(2)]
OTHERS = ["notebooks/01_quickstart.ipynb::Cell 0", "tests/test_engine.py::test_x"]


def test_groups_are_files_unless_serial_or_their_own() -> None:
    assert group_of("tests/test_engine.py::test_x[a]") == "tests/test_engine.py"
    assert group_of("tests/test_cluster.py::test_x") == group_of("notebooks/05_scale_out.ipynb::Cell 3") == "ray"
    own = "tests/test_throughput.py::test_compiled_decode_gives_the_eager_tokens[llama3]"
    assert group_of(own) == own


def test_the_browser_test_runs_the_notebooks_nbval_leaves_out() -> None:
    """The table names the real test and the notebooks it opens, and those notebooks exist."""
    assert BROWSER_TEST.split("::")[1] == test_browser.test_playground_and_plot_in_a_real_browser.__name__
    assert BROWSER_NOTEBOOKS == (f"notebooks/{test_browser.NOTEBOOK_02}", f"notebooks/{test_browser.NOTEBOOK_03}")
    assert all((ROOT / name).is_file() for name in BROWSER_NOTEBOOKS)


def test_nbval_runs_leave_only_a_session_where_the_browser_test_runs() -> None:
    session = [BROWSER_TEST, *NBVAL_02, *NBVAL_03, *OTHERS]
    assert repeated_in_browser(session, browser_runs=True) == NBVAL_02 + NBVAL_03
    assert repeated_in_browser(session, browser_runs=False) == []  # skipped for want of Chromium: nbval runs them
    assert repeated_in_browser(session[1:], browser_runs=True) == []  # deselected (-m "not slow", -k): nbval too


def test_the_browser_runs_in_ci_or_where_chromium_is() -> None:
    def nothing(name: str) -> None:
        return None

    def both(name: str) -> str:
        return f"/usr/bin/{name}"

    assert browser_will_run({"CI": "true"}, which=nothing)  # in CI the browser test fails rather than skips
    assert not browser_will_run({"CI": "false"}, which=nothing) and not browser_will_run({}, which=nothing)
    assert browser_will_run({}, which=both)
    assert not browser_will_run({}, which=lambda name: both(name) if name == "chromium" else None)
