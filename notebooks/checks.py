"""What a reader of a stored notebook should never see, and how its outputs read as a reader sees them.

``build.py`` refuses to store a notebook these checks reject; ``tests/test_stored_notebooks.py`` runs them on
the stored notebooks."""

from __future__ import annotations

import json
import re

import nbformat

# A progress bar frozen part-way ("generating:  16%|█▌  | 1/6"), as text or as a widget's text fallback.
HALF_BAR = re.compile(r"(?<![0-9])(?:[0-9]|[1-9][0-9])%\|")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def output_texts(output: nbformat.NotebookNode) -> list[str]:
    texts = [output.get("text", "")] if output.get("output_type") == "stream" else []
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            texts.append(value if isinstance(value, str) else "".join(value))
    texts = [t if isinstance(t, str) else "".join(t) for t in texts]
    # what a reader sees: a carriage return redraws its line, so only the text after the last one shows
    return ["\n".join(line.rsplit("\r", 1)[-1] for line in t.split("\n")) for t in texts]


def coalesced(outputs: list) -> list:
    """Consecutive stream outputs of one name show as one text (a bar's redraws arrive as separate writes)."""
    merged: list = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (
            output.get("output_type") == "stream"
            and last is not None
            and last.get("output_type") == "stream"
            and last.get("name") == output.get("name")
        ):
            merged[-1] = {**last, "text": last["text"] + output["text"]}
        else:
            merged.append(dict(output))
    return merged


WIDGET_REFERENCE = re.compile(r"IPY_MODEL_([\w-]+)")


def shown_widget_models(nb: nbformat.NotebookNode) -> set[str]:
    """The widget models a stored output shows: those its views name, and every model their state refers to
    (a box's children, a widget's layout and style), transitively."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    todo = [
        o["data"][WIDGET_VIEW].get("model_id")
        for cell in nb.cells
        for o in cell.get("outputs", [])
        if WIDGET_VIEW in o.get("data", {})
    ]
    shown: set[str] = set()
    while todo:
        model = todo.pop()
        if model in shown or model not in state:
            continue
        shown.add(model)
        todo += WIDGET_REFERENCE.findall(json.dumps(state[model]))
    return shown


def stale_outputs(nb: nbformat.NotebookNode) -> list[str]:
    """What a reader of the stored notebook would see as broken: a half-finished progress bar, a widget
    output whose model is missing from the saved widget state (it renders as "model not found"), or saved
    widget state that no output shows (a closed progress bar's leftovers)."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    problems = []
    unshown = sorted(set(state) - shown_widget_models(nb))
    if unshown:
        kinds = sorted({state[m].get("model_name", "?") for m in unshown})
        problems.append(f"widget state saved for {len(unshown)} model(s) no output shows ({', '.join(kinds)})")
    for number, cell in enumerate(nb.cells):
        for output in coalesced(cell.get("outputs", [])):
            if any(HALF_BAR.search(text) for text in output_texts(output)):
                problems.append(f"cell {number}: a progress bar stopped part-way")
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is not None and view.get("model_id") not in state:
                problems.append(f"cell {number}: a widget view whose model {view.get('model_id')} is not saved")
    return problems


# Paths that name one machine (a user's home, a temp folder, a random temp name) have no place in a shared
# notebook; workbench displays its own paths from ~ or $WORKBENCH_CACHE (workbench.reports.short_path).
MACHINE_PATH = re.compile(
    r"/root/|/home/[^/\s\"']+/|/Users/[^/\s\"']+/|(?<![\w.~])/tmp/|/private/var/|/var/folders/"
    r"|[A-Za-z]:\\+Users|\btmp[a-z0-9_]{8}\b|pytest-of-"
)
UNNAMED_MODEL = re.compile(r"model_id\s+none|model=None\b")
WARNING = re.compile(r"warn|deprecat|traceback|error:", re.IGNORECASE)
# A tqdm bar, finished or not: "requests: 100%|██████████| 8/8 [00:00<00:00, ...]" or, without a total,
# "tokens: 24it [00:01, 20.1it/s]".  workbench's own bars end as one summary line and match neither.
TEXT_BAR = re.compile(r"(?<![0-9])[0-9]{1,3}%\||\[[0-9]{2}:[0-9]{2}(?::[0-9]{2})?(?:<|, |\])")


def output_problems(nb: nbformat.NotebookNode) -> list[str]:
    """What a reader of the stored notebook should never see, beyond :func:`stale_outputs`: machine paths,
    an unnamed model (``model_id none``), tqdm bars (finished ones too: a call's output is its result, and
    workbench's own bars leave one summary line), warnings or other log lines on stderr, error outputs,
    progress or output widgets without a readable fallback (third-party bars, an empty ``Output()``), empty
    outputs, and the same figure shown twice in a cell."""
    problems = []
    for number, cell in enumerate(nb.cells):
        images: list[str] = []
        for output in coalesced(cell.get("outputs", [])):
            kind = output.get("output_type")
            texts = output_texts(output)
            joined = "\n".join(texts)
            if MACHINE_PATH.search(joined):
                problems.append(f"cell {number}: a machine path ({MACHINE_PATH.search(joined).group(0)!r})")
            if UNNAMED_MODEL.search(joined):
                problems.append(f"cell {number}: an unnamed model ({UNNAMED_MODEL.search(joined).group(0)!r})")
            if kind == "error":
                problems.append(f"cell {number}: an error ({output.get('ename')})")
            if TEXT_BAR.search(joined):
                line = next(line for line in joined.splitlines() if TEXT_BAR.search(line))
                problems.append(f"cell {number}: a progress bar ({line.strip()[:80]!r})")
            if kind == "stream" and output.get("name") == "stderr":
                lines = [line for line in joined.splitlines() if line.strip() and not TEXT_BAR.search(line)]
                if lines:
                    label = "a warning" if WARNING.search("\n".join(lines)) else "log output"
                    problems.append(f"cell {number}: {label} on stderr ({lines[0].strip()[:80]!r})")
            data = output.get("data", {})
            if WIDGET_VIEW in data and "text/html" not in data:
                fallback = data.get("text/plain", "")
                problems.append(f"cell {number}: a stray widget ({fallback.strip()[:60]!r})")
            if (
                kind in ("stream", "display_data", "execute_result")
                and not any(t.strip() for t in texts)
                and not any(k.startswith("image/") for k in data)
                and WIDGET_VIEW not in data
            ):
                problems.append(f"cell {number}: an empty output")
            if "image/png" in data:
                png = data["image/png"] if isinstance(data["image/png"], str) else "".join(data["image/png"])
                if png in images:
                    problems.append(f"cell {number}: the same figure twice")
                images.append(png)
            elif any(t.lstrip().startswith("<Figure size") for t in texts):
                problems.append(f"cell {number}: a figure shown as text, not drawn")
    return problems


def structure_problems(nb: nbformat.NotebookNode) -> list[str]:
    """A notebook opens with the one cell that says (and checks) which extra it needs, and ends by saying
    where to go next."""
    problems = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    if (
        not nb.cells
        or nb.cells[0].cell_type != "code"
        or "pip install" not in nb.cells[0].source
        or "wb.require(" not in nb.cells[0].source
    ):
        problems.append(
            "the first cell must be code that names its extra (a pip install line) and checks it (wb.require)"
        )
    if code and code[0] is not nb.cells[0]:
        problems.append("the extra check must come before any other code")
    last = nb.cells[-1] if nb.cells else None
    if last is None or last.cell_type != "markdown" or "next" not in last.source.lower():
        problems.append("the last cell must be markdown saying where to go next")
    return problems


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """Everything :func:`build` refuses to store (and tests/test_stored_notebooks.py rejects)."""
    return stale_outputs(nb) + output_problems(nb) + structure_problems(nb)
