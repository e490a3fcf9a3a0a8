"""What a reader of a stored notebook should never see, and how its outputs read as a reader sees them.

``build.py`` refuses to store a notebook these checks reject; ``tests/test_stored_notebooks.py`` runs them on
the stored notebooks."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

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


CHECK_TAG = "nbval-check-output"
# workbench's closing line of a bar: "tool loop: 32 dialogs · 720 tokens · 3.0 s · 242.0 tok/s"
PROGRESS_LINE = re.compile(r"^[^\n:]{1,80}: [0-9]+(?:/[0-9]+)? [a-z ]+?s? · (?:.* · )?[0-9]+\.[0-9] s\b", re.MULTILINE)


def automatic_bar(output: nbformat.NotebookNode) -> bool:
    """The closing line of a bar workbench showed on its own (``progress=None``), as it marks it."""
    return output.get("metadata", {}).get("workbench", {}).get("progress") == "auto"


def timing_problems(nb: nbformat.NotebookNode) -> list[str]:
    """A cell whose output nbval compares must not show what only a slow call shows: an automatic progress
    bar (or its closing line) appears once a call has run a couple of seconds, so on a loaded machine such a
    cell gains an output the stored notebook lacks.  ``build.py`` runs the notebooks with every automatic bar
    shown at once (``WORKBENCH_PROGRESS_DELAY=0``), so a compared cell that could ever show one is found here;
    its calls take ``progress=False``.  (``build.py`` checks before it drops the automatic bars' lines.)"""
    found = []
    for number, cell in enumerate(nb.cells):
        if CHECK_TAG not in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            marked = output.get("metadata", {}).get("workbench", {}).get("progress")
            if marked or WIDGET_VIEW in data or any(PROGRESS_LINE.search(t) for t in output_texts(output)):
                found.append(
                    f"cell {number}: a progress bar in a cell whose output nbval compares (it shows only when a "
                    "call is slow: pass progress=False there)"
                )
                break
    return found


# ----------------------------------------------------------------------------- what the outputs claim
# A verdict about a ratio ("faster"/"slower": against 1) or a difference ("higher"/"lower"/"better"/"worse":
# against 0), and the ranges the same line gives: "[0.68, 1.61]", "from 0.68 to 1.61".
RATIO_VERDICT = re.compile(r"\b(faster|slower)\b")
DIFF_VERDICT = re.compile(r"\b(higher|lower|better|worse)\b")
NUMBER = r"([-+]?[0-9]+(?:\.[0-9]+)?)x?"
RANGE = re.compile(rf"\[{NUMBER},\s*{NUMBER}\]|\bfrom {NUMBER} to {NUMBER}\b")
NEGATED = re.compile(r"\bnot (?:shown to be |shown |)(?:faster|slower|higher|lower|better|worse)\b|not shown to differ")


def _contradiction(word: str, low: float, high: float) -> str | None:
    ratio = word in ("faster", "slower")
    centre, up = (1.0, ("faster",)) if ratio else (0.0, ("higher", "better"))
    if low <= centre <= high:
        return f"its own range {low:g} to {high:g} includes {centre:g}"
    if (word in up) != (low > centre):
        return f"its own range {low:g} to {high:g} lies on the other side of {centre:g}"
    return None


def verdict_problems(nb: nbformat.NotebookNode) -> list[str]:
    """A line that says "faster" (or "slower", "higher", "lower", ...) while the range it quotes crosses the
    no-change point (1 for a ratio, 0 for a difference) or lies on the other side: a pooled verdict over cells
    that disagree ("median 1.38 (from 0.68 to 1.61 over 8 cells): faster") or a verdict the interval does not
    support.  Such a line must say where it holds ("faster at batch >= 2, slower at batch 1") or "not shown to
    differ"."""
    found = []
    for number, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            for text in output_texts(output):
                for line in text.splitlines():
                    if NEGATED.search(line):
                        line = NEGATED.sub("", line)
                    verdicts = RATIO_VERDICT.findall(line) + DIFF_VERDICT.findall(line)
                    ranges = [[float(x) for x in m.groups() if x is not None] for m in RANGE.finditer(line)]
                    if len(set(verdicts)) != 1 or len(ranges) != 1:
                        continue  # no verdict, several (a per-cell sentence), or no single range to hold it to
                    (low, high), word = sorted(ranges[0]), verdicts[0]
                    why = _contradiction(word, low, high)
                    if why:
                        found.append(f"cell {number}: {word!r} where {why} ({line.strip()[:90]!r})")
    return found


ENV_SET = re.compile(
    r"os\.environ\[\s*['\"]([A-Za-z_][A-Za-z0-9_]*)['\"]\s*\]\s*=(?!=)|%env\s+([A-Za-z_][A-Za-z0-9_]*)"
)


def environment_problems(nb: nbformat.NotebookNode) -> list[str]:
    """An environment variable a notebook sets must be put back before it ends: its old value read before the
    first change, and, after it (later in that cell or in a later one), code that removes it or sets the old
    value again (``os.environ.pop(NAME, None)`` when it was unset).  Otherwise later work in the same kernel (a
    run stored, a benchmark clock) silently follows the notebook's setting."""
    code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    found = []
    changed: dict[str, tuple[int, int]] = {}  # name -> (cell, offset) of its first change
    for number, source in code:
        for match in ENV_SET.finditer(source):
            changed.setdefault(match.group(1) or match.group(2), (number, match.start()))

    def where(pattern: str) -> list[tuple[int, int]]:
        return [(number, m.start()) for number, source in code for m in re.finditer(pattern, source)]

    for name, first in changed.items():
        key = rf"['\"]{name}['\"]"
        read = where(rf"os\.environ\.get\(\s*{key}|os\.getenv\(\s*{key}|os\.environ\.copy\(\)")
        put_back = where(rf"os\.environ\.pop\(\s*{key}|del os\.environ\[\s*{key}|os\.environ\.update\(")
        if not (any(at < first for at in read) and any(at > first for at in put_back)):
            found.append(
                f"cell {first[0]}: ${name} is changed and never put back (read its old value first; later code "
                f"restores it, os.environ.pop({name!r}, None) when it was unset)"
            )
    return found


class _Tables(HTMLParser):
    """The tables of an HTML output, as header lists and rows of cell texts (pandas' frames render so)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self.tables:
            self.tables[-1].append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def html_tables(html: str) -> list[list[list[str]]]:
    parser = _Tables()
    parser.feed(html)
    return [t for t in parser.tables if t]


def _said_equal(texts: list[str], score: str) -> bool:
    return any(score in line and "every run" in line for t in texts for line in t.splitlines())


def equal_score_problems(nb: nbformat.NotebookNode) -> list[str]:
    """A summary of runs (a table with ``run``, ``score`` and ``mean`` columns, as ``wb.runs.summary`` gives)
    in which one score has the same mean in every run compared shows no difference at all; presented as a
    result, it reads as a finding.  The cell (or the next one) must say so in words ("<score> ... in every
    run"), or the experiment must measure something its settings change."""
    found = []
    for number, cell in enumerate(nb.cells):
        texts = [t for o in cell.get("outputs", []) for t in output_texts(o)]
        later = next((c for c in nb.cells[number + 1 :] if c.cell_type == "code"), None)
        texts += [t for o in (later.get("outputs", []) if later is not None else []) for t in output_texts(o)]
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html")
            if not html:
                continue
            for table in html_tables(html if isinstance(html, str) else "".join(html)):
                header = table[0]
                if not {"run", "score", "mean"} <= set(header):
                    continue
                run, score, mean = (header.index(k) for k in ("run", "score", "mean"))
                means: dict[str, dict[str, str]] = {}
                for row in table[1:]:
                    if len(row) == len(header):
                        means.setdefault(row[score], {})[row[run]] = row[mean]
                for name, by_run in means.items():
                    if len(by_run) >= 2 and len(set(by_run.values())) == 1 and not _said_equal(texts, name):
                        found.append(
                            f"cell {number}: score {name!r} is {next(iter(by_run.values()))} in every run compared "
                            "(shown as a finding; say so, or measure what the settings change)"
                        )
    return found


def claim_problems(nb: nbformat.NotebookNode) -> list[str]:
    """What the notebook says beyond what its numbers show, and the kernel it leaves behind."""
    return verdict_problems(nb) + environment_problems(nb) + equal_score_problems(nb)


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """Everything :func:`build` refuses to store (and tests/test_stored_notebooks.py rejects)."""
    return stale_outputs(nb) + output_problems(nb) + structure_problems(nb) + timing_problems(nb) + claim_problems(nb)
