"""The stored notebooks read well on their own: no progress bar frozen part-way, no widget output whose
model is missing from the saved widget state and no saved widget state that no output shows, no tqdm bar
(finished or not), no machine paths, unnamed models, warnings, errors, stray
widgets, empty outputs or figures shown twice; each opens with the check of the extra it needs and ends
saying where to go next (notebooks/build.py refuses to store a notebook with any of these).  Every check is
shown to fire on a bad sample."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

import workbench as wb
from workbench.errors import MissingExtraError

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _load(file: str, name: str):
    spec = importlib.util.spec_from_file_location(name, NOTEBOOKS / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load("build.py", "notebook_build")
checks = _load("checks.py", "notebook_checks")


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_stored_notebook_has_no_stale_outputs(path: Path) -> None:
    assert checks.stale_outputs(nbformat.read(path, as_version=4)) == []


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_stored_notebook_shows_nothing_a_reader_should_not_see(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert checks.output_problems(nb) == []
    assert checks.structure_problems(nb) == []
    assert checks.timing_problems(nb) == []


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_stored_notebook_says_only_what_its_numbers_show_and_restores_the_environment(path: Path) -> None:
    assert checks.claim_problems(nbformat.read(path, as_version=4)) == []


def test_every_built_notebook_is_stored() -> None:
    stored = {p.name for p in NOTEBOOKS.glob("*.ipynb")}
    assert {name for name, _ in build.NOTEBOOKS.values()} <= stored


def test_the_check_finds_a_half_bar_and_an_orphan_widget_view() -> None:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("run()")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="generating:  16%|█▌        | 1/6 [00:01<00:05]"),
        nbformat.v4.new_output(
            "display_data",
            data={checks.WIDGET_VIEW: {"model_id": "abc", "version_major": 2}, "text/plain": "HBox(children=...)"},
        ),
        nbformat.v4.new_output("stream", name="stderr", text="generating: 6 rows · 141 tokens · 6.2 s · 22.7 tok/s"),
        nbformat.v4.new_output("stream", name="stdout", text="generating: 100%|██████████| 6/6"),
        # a bar redrawn in place (carriage returns) shows only its last state: finished here
        nbformat.v4.new_output("stream", name="stderr", text="requests:  16%|█▌  | 1/6\rrequests: 100%|████| 6/6\n"),
    ]
    nb.cells.append(cell)
    assert checks.stale_outputs(nb) == [
        "cell 0: a progress bar stopped part-way",
        "cell 0: a widget view whose model abc is not saved",
    ]
    nb.metadata["widgets"] = {checks.WIDGET_STATE: {"state": {"abc": {}}}}
    assert checks.stale_outputs(nb) == ["cell 0: a progress bar stopped part-way"]


def test_widget_state_no_output_shows_is_stale_and_build_strips_it() -> None:
    """A closed progress bar leaves its models (IntProgress, Label, their layouts) in the saved widget state:
    nothing shows them, so the check names them and build.clean keeps only what a stored view reaches."""
    ref = "IPY_MODEL_{}".format
    state = {
        "box": {"model_name": "HBoxModel", "state": {"children": [ref("label")], "layout": ref("layout")}},
        "label": {"model_name": "LabelModel", "state": {"value": "chat", "layout": ref("layout")}},
        "layout": {"model_name": "LayoutModel", "state": {}},
        "bar": {"model_name": "IntProgressModel", "state": {"value": 3, "layout": ref("barlayout")}},
        "barlayout": {"model_name": "LayoutModel", "state": {}},
    }
    nb = _cell_with(
        nbformat.v4.new_output(
            "display_data",
            data={
                checks.WIDGET_VIEW: {"model_id": "box", "version_major": 2},
                "text/html": "<b>chat</b>",
                "text/plain": "chat",
            },
        )
    )
    nb.metadata["widgets"] = {checks.WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    assert checks.stale_outputs(nb) == [
        "widget state saved for 2 model(s) no output shows (IntProgressModel, LayoutModel)"
    ]
    cleaned = build.clean(nb)
    assert set(cleaned.metadata["widgets"][checks.WIDGET_STATE]["state"]) == {"box", "label", "layout"}
    assert checks.stale_outputs(cleaned) == []
    nb.cells[0].outputs = []  # no view left: no state kept at all
    assert "widgets" not in build.clean(nb).metadata


def _cell_with(*outputs) -> nbformat.NotebookNode:  # noqa: ANN002
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("run()")
    cell.outputs = list(outputs)
    nb.cells.append(cell)
    return nb


PNG = "iVBORw0KGgo="


@pytest.mark.parametrize(
    "output,problem",
    [
        (
            nbformat.v4.new_output("execute_result", data={"text/plain": "checkpoint /root/.cache/workbench/demo"}),
            "a machine path",
        ),
        (
            nbformat.v4.new_output("stream", name="stdout", text="wrote /tmp/lm-eval-tasks-x1/calls.jsonl\n"),
            "a machine path",
        ),
        (nbformat.v4.new_output("stream", name="stdout", text="folder /tmp/tmpk3j_9x2a\n"), "a machine path"),
        (
            nbformat.v4.new_output("display_data", data={"text/html": "<td>/home/alice/ckpts</td>", "text/plain": "x"}),
            "a machine path",
        ),
        (
            nbformat.v4.new_output("execute_result", data={"text/plain": "ReplicaPool(model=None, replicas=2)"}),
            "an unnamed model",
        ),
        (
            nbformat.v4.new_output("execute_result", data={"text/plain": "engine info:\n  model_id   none\n"}),
            "an unnamed model",
        ),
        (nbformat.v4.new_output("stream", name="stderr", text="/x.py:3: FutureWarning: use y\n"), "a warning"),
        # any tqdm bar, finished ones too (lm-eval's request bars), on stderr or stdout, with or without a total
        (
            nbformat.v4.new_output("stream", name="stderr", text="requests: 100%|██████████| 8/8 [00:00<00:00]\n"),
            "a progress bar",
        ),
        (
            nbformat.v4.new_output(
                "stream",
                name="stderr",
                text="100%|██████████| 8/8 [00:00<00:00, 301.99it/s]\n"
                "Tokenizing inputs: 100%|██████████| 24/24 [00:00<00:00, 19347.16it/s]\n",
            ),
            "a progress bar",
        ),
        (
            nbformat.v4.new_output("stream", name="stdout", text="Running loglikelihood requests: 100%|#####| 24/24\n"),
            "a progress bar",
        ),
        (nbformat.v4.new_output("stream", name="stderr", text="tokens: 24it [00:01, 20.1it/s]\n"), "a progress bar"),
        (
            nbformat.v4.new_output("stream", name="stderr", text="2026 WARNING worker.py:85 -- Token auth\n"),
            "a warning",
        ),
        (
            nbformat.v4.new_output("stream", name="stderr", text="[Task: mc] metric acc: using default aggregation\n"),
            "log output",
        ),
        (nbformat.v4.new_output("error", ename="KeyError", evalue="'x'", traceback=["KeyError: 'x'"]), "an error"),
        (
            nbformat.v4.new_output(
                "display_data",
                data={checks.WIDGET_VIEW: {"model_id": "m", "version_major": 2}, "text/plain": "Output()"},
            ),
            "a stray widget",
        ),
        (
            nbformat.v4.new_output(
                "display_data",
                data={
                    checks.WIDGET_VIEW: {"model_id": "m", "version_major": 2},
                    "text/plain": "Generating test split: 0 examples",
                },
            ),
            "a stray widget",
        ),
        (nbformat.v4.new_output("stream", name="stdout", text="\n"), "an empty output"),
        (nbformat.v4.new_output("execute_result", data={"text/plain": ""}), "an empty output"),
        (
            nbformat.v4.new_output("execute_result", data={"text/plain": "<Figure size 700x350 with 1 Axes>"}),
            "a figure shown as text",
        ),
    ],
)
def test_each_output_check_fires_on_a_bad_sample(output, problem) -> None:
    found = checks.output_problems(_cell_with(output))
    assert len(found) == 1 and found[0].startswith(f"cell 0: {problem}"), found


def test_the_same_figure_twice_and_clean_outputs() -> None:
    figure = nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure size 1x1>"})
    assert checks.output_problems(_cell_with(figure, figure)) == ["cell 0: the same figure twice"]
    fine = [
        figure,
        # workbench's own bars end as one summary line; a rate of 100% in words is no bar either
        nbformat.v4.new_output(
            "display_data", data={"text/plain": "generating: 25 rows · 555 tokens · 2.7 s · 207.2 tok/s"}
        ),
        nbformat.v4.new_output("stream", name="stdout", text="same reply: 100% of 4 | 4/4 rows [01:02 wall]\n"),
        nbformat.v4.new_output("execute_result", data={"text/plain": "checkpoint ~/.cache/workbench/demo-llama4"}),
        nbformat.v4.new_output(
            "display_data",
            data={
                checks.WIDGET_VIEW: {"model_id": "m", "version_major": 2},
                "text/html": "<b>playground</b>",
                "text/plain": "playground",
            },
        ),
    ]
    assert checks.output_problems(_cell_with(*fine)) == []


def test_the_structure_check_wants_the_extra_first_and_a_next_step_last() -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("import workbench as wb")]
    found = checks.structure_problems(nb)
    assert [p.split(" must")[0] for p in found] == ["the first cell", "the extra check", "the last cell"]
    nb.cells = [
        nbformat.v4.new_code_cell(
            '# needs: pip install -e ".[cluster]"\nimport workbench as wb\n\nwb.require("cluster")'
        ),
        nbformat.v4.new_markdown_cell("# Title"),
        nbformat.v4.new_markdown_cell("## Next\n\nnotebook 06"),
    ]
    assert checks.structure_problems(nb) == []


def test_every_notebook_opens_with_the_check_of_its_extra() -> None:
    extras = {key: build.make(cells).cells[0].source for key, (_, cells) in build.NOTEBOOKS.items()}
    assert 'wb.require("cluster")' in extras["05"] and 'wb.require("evals")' in extras["06"]
    assert all('wb.require("lab")' in extras[k] for k in ("01", "02", "03", "04"))


@pytest.mark.slow
@pytest.mark.parametrize("key,module", [("05", "ray"), ("06", "inspect_ai")])
def test_without_its_extra_a_notebook_stops_at_its_first_cell_with_one_line(key: str, module: str) -> None:
    """A user's install (.[lab]) has neither Ray nor the harnesses: the notebook must end at its first cell
    with the pip line, not with a traceback cells later."""
    cells = build.make(build.NOTEBOOKS[key][1]).cells
    hide = nbformat.v4.new_code_cell(f"import sys\n\nsys.modules[{module!r}] = None  # as if it were not installed")
    nb = nbformat.v4.new_notebook()
    nb.cells = [hide, *cells[:4]]
    with pytest.raises(CellExecutionError):
        NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    [error] = nb.cells[1].outputs
    assert error.output_type == "error" and error.ename == "MissingExtraError"
    assert len(error.traceback) == 1 and "pip install" in error.traceback[0] and module in error.traceback[0]
    assert all(not cell.get("outputs") for cell in nb.cells[2:] if cell.cell_type == "code")


def test_require_names_the_pip_line_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    wb.require("lab")  # installed here: nothing happens
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(MissingExtraError) as info:
        wb.require("cluster")
    assert 'pip install -e ".[cluster]"' in str(info.value) and "ray" in str(info.value)
    assert info.value._render_traceback_() == [f"MissingExtraError: {info.value}"]
    with pytest.raises(MissingExtraError, match="unknown extra"):
        wb.require("gpu")


BEFORE = json.loads((Path(__file__).parent / "data" / "notebooks_before_issue51.json").read_text())


def _before(name: str) -> nbformat.NotebookNode:
    return nbformat.reads(json.dumps(BEFORE[name]), as_version=4)


def test_the_claim_checks_reject_the_notebooks_as_they_were_stored_before() -> None:
    """Excerpts of 03, 07 and 08 as stored before issue 51: a pooled "faster" over cells of which two were
    slower, $BENCH_CLOCK and $WORKBENCH_STORE changed for good, and a summary whose two scores are 0.875 in all
    four runs, presented as the experiment's result."""
    found = checks.claim_problems(_before("03_throughput"))
    assert [p.split(" where ")[0] for p in found if "'faster'" in p] == ["cell 0: 'faster'", "cell 0: 'faster'"]
    assert any("0.68 to 1.61 includes 1" in p for p in found)
    assert any(p.startswith("cell 1: $BENCH_CLOCK is changed and never put back") for p in found)
    assert checks.claim_problems(_before("07_run_store")) == [
        "cell 0: $WORKBENCH_STORE is changed and never put back (read its old value first; later code restores it, "
        "os.environ.pop('WORKBENCH_STORE', None) when it was unset)"
    ]
    assert checks.claim_problems(_before("08_experiments")) == [
        f"cell 0: score {s!r} is 0.875 in every run compared (shown as a finding; say so, or measure what the "
        "settings change)"
        for s in ("right_tool", "restates")
    ]


def _printed(*lines: str, tags: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("report()")
    cell.metadata["tags"] = list(tags)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="\n".join(lines) + "\n")]
    nb.cells.append(cell)
    return nb


def test_the_verdict_check_holds_each_word_to_the_range_on_its_line() -> None:
    wrong = [
        "bf16 ÷ none median 1.38 (from 0.68 to 1.61 over 8 cells): faster",
        "int4 1.29x [0.91, 1.56] faster",
        "brief restates -0.100 [-0.200, -0.050]: higher",
        "int4 0.80x [0.70, 0.90] faster",
    ]
    assert len(checks.verdict_problems(_printed(*wrong))) == 4
    fine = [
        "bf16 ÷ none: faster at batch >= 2 (1.32 to 1.61), slower at batch 1 (0.68 to 0.70)",
        "int4 1.29x [1.08, 1.56] faster",
        "int4 1.02x [0.91, 1.12] not shown to differ",
        "brief restates +0.000 [-0.099, +0.099] vs plain, p = 1: not shown to differ",
        "brief answer length -5.1 [-6.0, -4.2] words: lower",
    ]
    assert checks.verdict_problems(_printed(*fine)) == []


def _code(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


def test_the_environment_check_wants_each_variable_read_first_and_put_back_later() -> None:
    changed = _code('os.environ["WORKBENCH_STORE"] = "x.sqlite"', "work()")
    assert [p.split(" is ")[0] for p in checks.environment_problems(changed)] == ["cell 0: $WORKBENCH_STORE"]
    unread = _code('os.environ["BENCH_CLOCK"] = "wall"', 'os.environ.pop("BENCH_CLOCK", None)')
    assert len(checks.environment_problems(unread)) == 1  # put back, but to what? its old value was never read
    restored = _code(
        'previous = os.environ.get("WORKBENCH_STORE")\nos.environ["WORKBENCH_STORE"] = "x.sqlite"',
        "work()",
        'if previous is None:\n    os.environ.pop("WORKBENCH_STORE", None)\nelse:\n'
        '    os.environ["WORKBENCH_STORE"] = previous',
    )
    assert checks.environment_problems(restored) == []
    one_cell = _code(
        'previous = os.environ.get("BENCH_CLOCK")\nos.environ["BENCH_CLOCK"] = "wall"\ntry:\n    measure()\n'
        'finally:\n    if previous is None:\n        os.environ.pop("BENCH_CLOCK", None)\n    else:\n'
        '        os.environ["BENCH_CLOCK"] = previous'
    )
    assert checks.environment_problems(one_cell) == []
    popped_first = _code(
        'os.environ.pop("BENCH_CLOCK", None)\nprevious = os.environ.get("BENCH_CLOCK")',
        'os.environ["BENCH_CLOCK"] = "x"',
    )
    assert len(checks.environment_problems(popped_first)) == 1  # put back *before* it was changed: not put back


def _summary_cell(means: dict[tuple[str, str], float], said: str = "") -> nbformat.NotebookNode:
    rows = "".join(
        f"<tr><th>{i}</th><td>{run}</td><td>{score}</td><td>{mean}</td></tr>"
        for i, ((run, score), mean) in enumerate(means.items())
    )
    html = (
        f"<table><thead><tr><th></th><th>run</th><th>score</th><th>mean</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("summary")
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/html": html, "text/plain": "..."})]
    if said:
        cell.outputs.insert(0, nbformat.v4.new_output("stream", name="stdout", text=said))
    nb.cells.append(cell)
    return nb


def test_the_equal_score_check_finds_a_score_that_no_run_moves_unless_the_notebook_says_so() -> None:
    same = {("a", "right_tool"): 0.875, ("b", "right_tool"): 0.875, ("a", "repeats"): 0.0, ("b", "repeats"): 0.22}
    assert checks.equal_score_problems(_summary_cell(same)) == [
        "cell 0: score 'right_tool' is 0.875 in every run compared (shown as a finding; say so, or measure what "
        "the settings change)"
    ]
    said = "right_tool: 0.875 in every run: these settings do not move it\n"
    assert checks.equal_score_problems(_summary_cell(same, said)) == []
    assert checks.equal_score_problems(_summary_cell({("a", "right_tool"): 0.875})) == []  # one run: no comparison


def test_the_timing_check_finds_a_progress_line_only_where_nbval_compares() -> None:
    line = "tool loop: 32 dialogs · 720 tokens · 3.0 s · 242.0 tok/s"
    compared = _printed(line, tags=("nbval-check-output",))
    assert checks.timing_problems(compared) == [
        "cell 0: a progress bar in a cell whose output nbval compares (it shows only when a call is slow: pass "
        "progress=False there)"
    ]
    assert checks.timing_problems(_printed(line, tags=("nbval-ignore-output",))) == []
    assert checks.timing_problems(_printed("32 replies; 0 from the store", tags=("nbval-check-output",))) == []


def test_build_drops_the_automatic_bars_lines_after_the_timing_check_saw_them() -> None:
    """build.py runs the kernel with every automatic bar shown: the timing check sees them in compared cells,
    then clean() drops their closing lines (a reader's fast run shows none); a bar asked for stays."""
    line = "generating: 32 rows · 232 tokens · 1.0 s · 222.9 tok/s"
    auto = nbformat.v4.new_output(
        "display_data", data={"text/plain": line}, metadata={"workbench": {"progress": "auto"}}
    )
    asked = nbformat.v4.new_output(
        "display_data", data={"text/plain": line}, metadata={"workbench": {"progress": "asked"}}
    )
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("a()"), nbformat.v4.new_code_cell("b()")]
    nb.cells[0].metadata["tags"] = ["nbval-check-output"]
    nb.cells[0].outputs = [auto, nbformat.v4.new_output("stream", name="stdout", text="True\n")]
    nb.cells[1].outputs = [auto, asked]
    assert [p.split(":")[0] for p in checks.timing_problems(nb)] == ["cell 0"]
    build.clean(nb)
    assert [o.get("text") for o in nb.cells[0].outputs] == ["True\n"]
    assert [o.metadata["workbench"]["progress"] for o in nb.cells[1].outputs] == ["asked"]
