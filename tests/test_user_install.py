"""The README's first command installs a user's environment: workbench, JupyterLab and a kernel — and none
of the test tools or oracles (pytest, llama-stack), which only the second command adds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _quick_start() -> list[str]:
    """The two commands of the README's quick start (the first fenced block)."""
    block = re.search(r"## Quick start\s+```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md has no '## Quick start' bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_two_commands_with_the_user_extras_first() -> None:
    first, second = _quick_start()
    assert '-e ".[lab]"' in first and "python -m workbench" in first and "dev" not in first
    assert "dev" in second and "pytest" in second
    assert second in (ROOT / ".ci" / "run").read_text(), ".ci/run must run the README test command verbatim"


def test_user_install_has_jupyterlab_and_no_test_tools(tmp_path: Path) -> None:
    venv = tmp_path / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The first command's install, as written in the README (torch pinned in the same command).  pip is told not
    # to byte-compile what it installs (PIP_NO_COMPILE=0 is pip's spelling of --no-compile): compiling torch's
    # 11,000 files was a third of the install's CPU time, and what this test checks (the install resolves and
    # brings JupyterLab and a kernel but no test tools) does not depend on .pyc files.
    install = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "torch==2.13.0",
            "-e",
            f"{ROOT}[lab]",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_NO_COMPILE": "0"},
    )
    assert install.returncode == 0, install.stderr[-3000:]
    probe = (
        "import importlib.util, json, workbench, jupyterlab, ipykernel; "
        "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in "
        "('pytest', 'llama_stack', 'selenium', 'ruff', 'nbval')}))"
    )
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        done.stdout.strip() == '{"pytest": false, "llama_stack": false, "selenium": false, "ruff": false, '
        '"nbval": false}'
    )
