"""``python -m workbench runs ...``: the run store outside the kernel, in plain text that fits a terminal.

::

    python -m workbench runs ls                       # the runs: rows, items, scores, tags, note, size
    python -m workbench runs show NAME                # its settings and its first rows
    python -m workbench runs diff A B                 # differing settings, counts, changed items (regressions first)
    python -m workbench runs summary A B [C ...]      # scores: means, paired differences vs A, intervals, p-values
    python -m workbench runs report A B -o FILE       # the self-contained HTML report
    python -m workbench runs tag NAME TAG ...  |  note NAME TEXT  |  rename OLD NEW  |  rm NAME
    python -m workbench runs export NAME FILE         # .parquet or .jsonl
    python -m workbench runs vacuum                   # reclaim the space of deleted rows

Every subcommand takes ``--store PATH`` (default: ``$WORKBENCH_STORE``, else the data folder's ``runs.sqlite``).
Exit status 0 on success; 2 with one line on stderr for bad input (an unknown run, a file that is not a run
store, a path that cannot be written).  Lines are at most :data:`WIDTH` characters: long cells are cut with
``…``.  The same functions are ``wb.runs.*`` in a notebook.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import runs
from workbench.errors import WorkbenchError
from workbench.reports import human_bytes
from workbench.runs.report_html import NOT_SHOWN, ordered_changes, report, score_names, verdict
from workbench.runs.store import open_store

WIDTH = 100
EXIT_OK, EXIT_USAGE = 0, 2
PROG = "python -m workbench runs"
SHOW_ROWS = 20  # rows `show` prints
DIFF_ITEMS = 30  # changed items `diff` prints


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + error
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


# ------------------------------------------------------------------------------------------ text tables
def cut(value: Any, width: int) -> str:
    """``value`` as one line of at most ``width`` characters (``…`` marks a cut)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        text = ""
    elif isinstance(value, bool):
        text = "1" if value else "0"
    elif isinstance(value, float):
        text = f"{value:.3f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"
    elif isinstance(value, (list, tuple, set)):
        text = ",".join(map(str, value))
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def text_table(records: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, int]]) -> str:
    """Rows as aligned columns: ``columns`` is ``(key, header, max width)``; the widths fit :data:`WIDTH`."""
    widths = [min(w, max([len(h), *(len(cut(r.get(k), w)) for r in records)])) for k, h, w in columns]
    spare = WIDTH - (sum(widths) + 2 * (len(widths) - 1))
    if spare < 0:  # shrink the widest column until the line fits
        widest = widths.index(max(widths))
        widths[widest] = max(4, widths[widest] + spare)
    lines = ["  ".join(cut(h, w).ljust(w) for (_, h, _), w in zip(columns, widths)).rstrip()]
    for r in records:
        lines.append("  ".join(cut(r.get(k), w).ljust(w) for (k, _, _), w in zip(columns, widths)).rstrip())
    return "\n".join(line[:WIDTH] for line in lines)


def _size(n: Any) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return ""
    return n if isinstance(n, str) else human_bytes(int(n))


def _when(value: Any) -> str:
    if value is None or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return ""
    try:
        return pd.Timestamp(value).strftime("%Y-%m-%d %H:%M")
    except (TypeError, ValueError):
        return str(value)


def _column(frame: pd.DataFrame, *names: str) -> str | None:
    return next((n for n in names if n in frame.columns), None)


# ------------------------------------------------------------------------------------------ subcommands
def cmd_ls(args: argparse.Namespace) -> int:
    frame = runs.table(store=args.store)
    if not len(frame):
        print(f"no runs in {_place(open_store(args.store).path, WIDTH - 12)}")
        return EXIT_OK
    created, last = _column(frame, "created", "created_at"), _column(frame, "last_written", "last_row_at")
    records = [
        {
            **r,
            "created": _when(r.get(created)),
            "last": _when(r.get(last)),
            "size": _size(r.get("size", r.get("size_bytes"))),
        }
        for r in frame.to_dict("records")
    ]
    print(
        text_table(
            records,
            [
                ("run", "run", 24),
                ("rows", "rows", 7),
                ("items", "items", 7),
                ("scores", "scores", 16),
                ("tags", "tags", 14),
                ("note", "note", 20),
                ("last", "last written", 16),
                ("size", "size", 8),
            ],
        )
    )
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    settings = runs.settings(args.name, store=args.store)
    frame = runs.rows(args.name, store=args.store)
    info = runs.table(store=args.store)
    mine = info[info["run"] == args.name].to_dict("records") if "run" in info.columns else []
    print(f"run {args.name}: {len(frame)} rows")
    if mine:
        r = mine[0]
        for key in ("items", "tags", "note"):
            value = r.get(key)
            if value is not None and not (isinstance(value, float) and math.isnan(value)) and value not in ([], ""):
                print("  " + cut(f"{key}: {value}", WIDTH - 2))
    print("settings:")
    for key, value in settings.items():
        print("  " + cut(f"{key}: {value}", WIDTH - 2))
    scores = list(frame.attrs.get("scores", []))
    columns = [("item", "item", 30), ("turn", "turn", 4), ("output", "output", 40), ("tool_calls", "tool calls", 24)]
    columns += [(s, s, 10) for s in scores]
    records = frame.head(SHOW_ROWS).to_dict("records")
    print(f"rows (first {min(SHOW_ROWS, len(frame))} of {len(frame)}):")
    print(text_table(records, [c for c in columns if c[0] in frame.columns]))
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    frame = runs.compare(args.a, args.b, store=args.store)
    diff = frame.attrs.get("settings")
    if diff is None:
        diff = runs.diff_settings(args.a, args.b, store=args.store)
    print(f"{args.b} vs {args.a} (baseline)")
    print("settings that differ:" if diff else "settings that differ: none")
    for key, (va, vb) in diff.items():
        print("  " + cut(f"{key}: {va!r} -> {vb!r}", WIDTH - 2))
    counts = frame.attrs.get("counts", {})
    print("items: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items()))
    ordered = ordered_changes(frame)
    changed = ordered[ordered["status"] != "same"]
    if not len(changed):
        print("no item changed")
        return EXIT_OK
    scores = score_names(frame)
    records = []
    for r in changed.head(DIFF_ITEMS).to_dict("records"):
        marks = " ".join(f"{cut(r.get(f'{s}_a'), 6)}->{cut(r.get(f'{s}_b'), 6)}" for s in scores)
        records.append({**r, "marks": marks})
    print(f"scores a->b: {', '.join(scores)}" if scores else "no scores")
    print(
        text_table(
            records,
            [
                ("status", "status", 9),
                ("item", "item", 24),
                ("marks", "scores", 12),
                ("output_a", args.a, 25),
                ("output_b", args.b, 25),
            ],
        )
    )
    if len(changed) > DIFF_ITEMS:
        print(f"... and {len(changed) - DIFF_ITEMS} more changed items")
    return EXIT_OK


def cmd_summary(args: argparse.Namespace) -> int:
    names = list(args.names)
    frame = runs.summary(names, baseline=args.baseline, store=args.store)
    if not len(frame):
        print("no scores stored on these runs; wb.runs.score(name, fn) adds them")
        return EXIT_OK
    records = []
    for r in frame.to_dict("records"):
        has_diff = r.get("diff") is not None and not pd.isna(r.get("diff"))
        records.append(
            {
                **r,
                "mean_ci": f"{cut(r.get('mean'), 7)} [{cut(r.get('low'), 7)}, {cut(r.get('high'), 7)}]",
                "diff_ci": (
                    f"{cut(r.get('diff'), 7)} [{cut(r.get('diff_low'), 7)}, {cut(r.get('diff_high'), 7)}]"
                    if has_diff
                    else ""
                ),
                "p": cut(r.get("p_value"), 7),
                "verdict": verdict(r),
            }
        )
    print(
        text_table(
            records,
            [
                ("run", "run", 16),
                ("score", "score", 14),
                ("n", "n", 5),
                ("mean_ci", "mean [95% CI]", 22),
                ("diff_ci", "diff [95% CI]", 24),
                ("p", "p", 7),
                ("verdict", "verdict", 19),
            ],
        )
    )
    if any(r["verdict"] == NOT_SHOWN for r in records):
        print(f"{NOT_SHOWN}: the 95% interval of the paired difference covers 0")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    path = report(list(args.names), args.output, baseline=args.baseline, store=args.store)
    print(f"wrote {_place(path, WIDTH - 20)} ({_size(path.stat().st_size)})")
    return EXIT_OK


def cmd_tag(args: argparse.Namespace) -> int:
    runs.tag(args.name, *args.tags, store=args.store)
    print(f"tagged {args.name}: {', '.join(args.tags)}")
    return EXIT_OK


def cmd_note(args: argparse.Namespace) -> int:
    runs.note(args.name, args.text, store=args.store)
    print(f"noted {args.name}")
    return EXIT_OK


def cmd_rename(args: argparse.Namespace) -> int:
    runs.rename(args.old, args.new, store=args.store)
    print(f"renamed {args.old} -> {args.new}")
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    removed = runs.delete(args.name, store=args.store)
    print(f"deleted {args.name} ({removed} rows)")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    path = runs.export(args.name, args.file, store=args.store)
    print(f"wrote {_place(path, WIDTH - 20)} ({_size(Path(path).stat().st_size)})")
    return EXIT_OK


def cmd_vacuum(args: argparse.Namespace) -> int:
    sizes = runs.vacuum(store=args.store)
    where = _place(open_store(args.store).path, WIDTH - 40)
    print(f"vacuumed {where}: {_size(sizes['before'])} -> {_size(sizes['after'])}")
    return EXIT_OK


def _place(path: Any, width: int) -> str:
    """A file's path in at most ``width`` characters, its end kept (the file name says the most)."""
    text = str(path)
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="The run store in plain text: list, inspect, compare, summarize, "
        "report and manage stored runs (the same functions as wb.runs).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, run: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--store",
            default=None,
            metavar="PATH",
            help="the run store file (default: $WORKBENCH_STORE, else runs.sqlite in the data folder)",
        )
        p.set_defaults(run=run)
        return p

    command("ls", cmd_ls, "the runs: rows, items, scores, tags, note, last written, size")
    command("show", cmd_show, "one run: its settings and first rows").add_argument("name")
    p = command("diff", cmd_diff, "what differs between runs A (baseline) and B: settings, counts, changed items")
    p.add_argument("a")
    p.add_argument("b")
    p = command(
        "summary",
        cmd_summary,
        "scores of runs A B [C ...]: means and paired differences vs the baseline with 95%% intervals and p-values",
    )
    p.add_argument("names", nargs="+")
    p.add_argument("--baseline", default=None, help="the run the others are compared with (default: the first)")
    p = command("report", cmd_report, "write a self-contained HTML report comparing runs A B [C ...]")
    p.add_argument("names", nargs="+")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    p.add_argument("--baseline", default=None, help="the run the others are compared with (default: the first)")
    p = command("tag", cmd_tag, "add tags to a run")
    p.add_argument("name")
    p.add_argument("tags", nargs="+")
    p = command("note", cmd_note, "set a run's note")
    p.add_argument("name")
    p.add_argument("text")
    p = command("rename", cmd_rename, "rename a run")
    p.add_argument("old")
    p.add_argument("new")
    command("rm", cmd_rm, "delete a run and its rows").add_argument("name")
    p = command("export", cmd_export, "write a run's rows to FILE (.parquet or .jsonl)")
    p.add_argument("name")
    p.add_argument("file")
    command("vacuum", cmd_vacuum, "reclaim the space of deleted rows (size before and after)")
    return parser


def fail(message: str) -> int:
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``runs`` subcommand; 0 on success, 2 (one line on stderr) on bad input."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.store is not None and not Path(args.store).expanduser().exists():
        return fail(
            f"no run store at {args.store!r}; give --store the path of an existing runs.sqlite "
            f"(python -m workbench runs ls --store PATH), or leave it out for the default store"
        )
    try:
        return args.run(args)
    except WorkbenchError as exc:
        return fail(str(exc))
    except OSError as exc:  # a file that cannot be written or read (export, report)
        return fail(f"{exc}; check the path and its folder's permissions")
    except BrokenPipeError:  # `... | head` closed the pipe: not an error of ours
        return EXIT_OK
