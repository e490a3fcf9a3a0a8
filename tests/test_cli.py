"""``python -m workbench``: one-line errors with a non-zero exit, help text, Ctrl-C prints partial output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.__main__ import QUESTIONS

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WORKBENCH_PROGRESS": "0"}
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
    )


@pytest.mark.timeout(300)
def test_bad_checkpoint_folder_is_one_line(tmp_path):
    result = _run(str(tmp_path / "nowhere"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m workbench: error:") and "nowhere" in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.timeout(300)
def test_debug_shows_the_traceback(tmp_path):
    result = _run(str(tmp_path / "nowhere"), "--debug")
    assert result.returncode == 2 and "Traceback" in result.stderr


@pytest.mark.timeout(300)
def test_max_tokens_zero_is_one_line():
    result = _run("--max-tokens", "0")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["python -m workbench: error: --max-tokens must be at least 1, got 0"]


@pytest.mark.timeout(300)
def test_bad_option_value_is_one_line():
    result = _run("--max-tokens", "many")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "invalid int value: 'many'" in result.stderr


def test_help_describes_every_option():
    from workbench.__main__ import build_parser

    parser = build_parser()
    for action in parser._actions:
        assert action.help, action.dest
    text = parser.format_help()
    assert "``" not in text and "embedded default" in text


@pytest.mark.timeout(600)
def test_says_which_model_and_ctrl_c_prints_partial_output(llama3_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WORKBENCH_PROGRESS": "0"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workbench",
            str(llama3_dir),
            "--model",
            "Llama3.2-1B-Instruct",
            "--max-tokens",
            "100000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    first = proc.stdout.readline()
    assert first == "model: Llama3.2-1B-Instruct\n"
    while "Engine(" not in proc.stdout.readline():
        pass
    time.sleep(1.0)  # generation is running (the prompts need thousands of steps)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130
    assert "interrupted (Ctrl-C); the transcripts so far:" in err and "Traceback" not in err
    ended = [line.split() for line in out.splitlines() if line.strip().startswith("ended")]
    assert len(ended) == len(QUESTIONS) and all(words == ["ended", "cancelled"] for words in ended)


@pytest.mark.timeout(900)
def test_main_job_runs_tool_dialogs_on_the_demo_model():
    result = _run()
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    calls = [line for line in result.stdout.splitlines() if line.startswith("    call ")]
    results = [line for line in result.stdout.splitlines() if line.startswith("    result ")]
    answers = [line for line in result.stdout.splitlines() if line.startswith("    answer ")]
    assert summary["prompts"] == len(QUESTIONS) and summary["batched_equals_sequential"] is True
    # every call the model made was run and answered; the shipped demo model calls a tool for each question
    assert summary["tool_calls"] == len(calls) == len(results) >= len(QUESTIONS)
    # answers that restate their tool results: the demo model gets (at least) most of these easy ones
    assert len(QUESTIONS) // 2 < summary["answers_with_result"] <= len(answers) == len(QUESTIONS)
    assert summary["generated_tokens"] > 0 and summary["batched_tokens_per_s"] > 0
    assert {"sequential_tokens_per_s", "speedup", "model"} <= set(summary)


def test_serve_subcommand_is_the_endpoint_command_line():
    result = _run("serve", "--help", timeout=120)
    assert result.returncode == 0 and "--port" in result.stdout and "--api-key" in result.stdout
