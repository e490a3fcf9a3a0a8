"""``python -m workbench runs ...``: every subcommand, its output fitting a terminal, exit status 0, and its bad
input (an unknown run, a file that is not a store) exiting 2 with one line.  Each subcommand runs through the
CLI's ``main`` (argv in, exit status, stdout and stderr out); the entry point itself runs as a user runs it, a
subprocess, for a success and each kind of failure (each subprocess imports torch: seconds apiece)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _runs_experiment import N_DEFAULT, expected_counts, write_runs

from workbench import runs
from workbench.runs import cli as runs_cli

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 100


class Done:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def subprocess_cli(*args: str | Path) -> Done:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "runs", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return Done(done.returncode, done.stdout, done.stderr)


def main_cli(*args: str | Path) -> Done:
    """The CLI's main in this process, its stdout and stderr captured (argparse's own exits included)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = runs_cli.main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code
    return Done(code, out.getvalue(), err.getvalue())


def ok(*args: str | Path, cli=main_cli) -> str:  # noqa: ANN001
    done = cli(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert lines and max(map(len, lines)) <= WIDTH, done.stdout
    return done.stdout


def bad(*args: str | Path, cli=main_cli) -> str:  # noqa: ANN001
    done = cli(*args)
    assert done.returncode == 2, (args, done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return write_runs(tmp_path_factory.mktemp("cli") / "runs.sqlite", N_DEFAULT)


def test_reading_commands(store, tmp_path):
    listed = ok("ls", "--store", store)
    assert listed.splitlines()[0].split()[:3] == ["run", "rows", "items"]
    assert any(line.startswith("prompt-a ") for line in listed.splitlines())

    shown = ok("show", "prompt-b", "--store", store)
    assert "You are terse and call tools." in shown and "right_tool" in shown

    diff = ok("diff", "prompt-a", "prompt-b", "--store", store)
    assert "settings that differ:" in diff and "You are terse" in diff
    statuses = [line.split()[0] for line in diff.splitlines() if line.split()[:1] in (["regressed"], ["improved"])]
    counts = expected_counts(N_DEFAULT)
    assert statuses[: counts["regressed"]] == ["regressed"] * counts["regressed"]  # regressions first

    summary = ok("summary", "prompt-a", "prompt-b", "--store", store)
    frame = runs.summary(["prompt-a", "prompt-b"], store=store)
    p = frame[frame["run"] == "prompt-b"]["p_value"].iloc[0]
    assert "right_tool" in summary and f"{p:.4g}"[:5] in summary

    out = tmp_path / "report.html"
    assert "wrote" in ok("report", "prompt-a", "prompt-b", "-o", out, "--store", store) and out.stat().st_size > 0
    jsonl = tmp_path / "a.jsonl"
    ok("export", "prompt-a", jsonl, "--store", store)
    assert len(jsonl.read_text().splitlines()) == N_DEFAULT and json.loads(jsonl.read_text().splitlines()[0])


def test_report_and_diff_of_unscored_runs(tmp_path):
    """Runs stored before any score: ``report`` writes the settings and the changed items (no "hold no scores"
    refusal), ``diff`` lists the changes; ``summary`` alone, which is only statistics, says how to score."""
    unscored = write_runs(tmp_path / "unscored.sqlite", N_DEFAULT, scored=False)
    out = tmp_path / "unscored.html"
    assert "wrote" in ok("report", "prompt-a", "prompt-b", "-o", out, "--store", unscored)
    text = out.read_text()
    assert "no scores yet" in text and "You are terse and call tools." in text and "get_time" in text
    assert "You are terse" in ok("diff", "prompt-a", "prompt-b", "--store", unscored)
    assert "hold no scores yet" in bad("summary", "prompt-a", "prompt-b", "--store", unscored)


def test_managing_commands(tmp_path):
    store = write_runs(tmp_path / "runs.sqlite", 12)
    ok("tag", "prompt-a", "baseline", "v1", "--store", store)
    ok("note", "prompt-a", "the first system prompt", "--store", store)
    listed = ok("ls", "--store", store)
    assert "baseline" in listed and "the first system" in listed
    ok("rename", "prompt-a", "sys-a", "--store", store)
    assert "sys-a" in ok("ls", "--store", store)
    assert "deleted sys-a (12 rows)" in ok("rm", "sys-a", "--store", store)
    assert "vacuumed" in ok("vacuum", "--store", store)
    assert list(runs.table(store=store)["run"]) == ["prompt-b"]


def test_bad_input_exits_2_with_one_line(store, tmp_path):
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a database\n" * 50)
    for command in (
        ("show", "nope"),
        ("diff", "prompt-a", "nope"),
        ("summary", "nope"),
        ("tag", "nope", "x"),
        ("note", "nope", "x"),
        ("rename", "nope", "x"),
        ("rm", "nope"),
        ("export", "nope", tmp_path / "n.jsonl"),
        ("report", "prompt-a", "nope", "-o", tmp_path / "n.html"),
    ):
        assert "nope" in bad(*command, "--store", store), command
    assert "not a" in bad("ls", "--store", text_file) or "notes.txt" in bad("ls", "--store", text_file)
    assert "no run store" in bad("ls", "--store", tmp_path / "missing.sqlite")
    assert "export format" in bad("export", "prompt-a", tmp_path / "a.csv", "--store", store)
    assert bad("frobnicate")  # an unknown subcommand
    assert bad("diff", "prompt-a")  # a missing argument
    assert not (tmp_path / "n.html").exists()
    assert len(runs.rows("prompt-a", store=store)) == N_DEFAULT  # nothing lost


def test_the_entry_point_as_a_user_runs_it(store, tmp_path):
    """``python -m workbench runs`` in a subprocess: a success, an unknown run, a text file as the store, a
    usage error — exit 0 or 2, one line on stderr."""
    assert "prompt-b" in ok("ls", "--store", store, cli=subprocess_cli)
    assert "no run named 'nope'" in bad("show", "nope", "--store", store, cli=subprocess_cli)
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a database\n" * 50)
    assert "notes.txt" in bad("diff", "prompt-a", "prompt-b", "--store", text_file, cli=subprocess_cli)
    assert "invalid choice" in bad("frobnicate", cli=subprocess_cli)
