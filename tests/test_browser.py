"""The notebooks in a real browser: JupyterLab started here, headless Chromium (Debian's ``chromium`` and
``chromium-driver``, installed by ``.ci/run``) driven by selenium.

Opens notebook 02 and runs all cells; in the playground types a question and presses Enter (streamed text,
then the reply's cards appear), presses Stop during a long generation, presses Clear; opens notebook 03,
runs it and finds the plot image.  The notebooks are copies without stored outputs in a temporary folder,
so everything seen was produced by this run.  The test starts and stops its own server, kernels and
browser.  On a failure the screenshot, the page source, the browser console and the JupyterLab log land in
``$WORKBENCH_BROWSER_ARTIFACTS`` (default: the test's tmp folder); the assertion message names the folder.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import in_ci

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_02, NOTEBOOK_03 = "02_tool_experiments.ipynb", "03_throughput.ipynb"
QUESTION = "What time is it in Tokyo?"  # the demo model answers it with a get_local_time call
LONG_QUESTION = "Tell me a very long story about llamas and their wool."
STOP_ATTEMPTS = 5  # a sampled reply can end on its own before Stop lands: then the test asks again

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


BROWSER_MISSING = (
    "the real-browser test needs Debian's Chromium and its WebDriver on PATH (chromium, chromedriver): "
    "apt-get install chromium chromium-driver (.ci/run installs them)"
)


def browser_binaries(which=shutil.which, environ=os.environ) -> tuple[str, str]:  # noqa: ANN001
    """Chromium and its driver.  Missing on a developer's machine: the test skips and says how to install
    them; missing under CI (``CI`` set, as CI sets it): the test fails, so a broken install cannot hide."""
    chromium, driver = which("chromium"), which("chromedriver")
    if chromium is None or driver is None:
        if in_ci(environ):
            pytest.fail(BROWSER_MISSING)
        pytest.skip(BROWSER_MISSING)
    return chromium, driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _copy_without_outputs(source: Path, target: Path) -> None:
    """The notebook with no outputs, prompt numbers or saved widget state: all that shows is from this run."""
    notebook = json.loads(source.read_text())
    notebook["metadata"].pop("widgets", None)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    target.write_text(json.dumps(notebook, indent=1))


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _processes_using(marker: str) -> list[int]:
    """Ids of processes whose command line names ``marker`` (the kernels of this test's server)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


class Lab:
    """A running JupyterLab server: its address, token and a small REST client."""

    def __init__(self, base: str, token: str, log: Path) -> None:
        self.base, self.token, self.log = base, token, log

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(
            f"{self.base}/api/{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def url(self, name: str) -> str:
        return f"{self.base}/lab/tree/{name}?token={self.token}"


def _start_server(work: Path, env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen, Lab]:
    """Start JupyterLab on a free port; again on another port when the one picked was taken meanwhile."""
    for _ in range(3):
        port, token = _free_port(), secrets.token_hex(16)
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "jupyter",
                    "lab",
                    "--no-browser",
                    "--ServerApp.ip=127.0.0.1",
                    f"--ServerApp.port={port}",
                    "--ServerApp.port_retries=0",
                    f"--IdentityProvider.token={token}",
                    f"--ServerApp.root_dir={work}",
                    "--allow-root",  # CI containers run as root
                    "--KernelManager.transport=ipc",  # kernel channels on Unix sockets: no TCP port can be taken
                    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=work,
                start_new_session=True,
            )
        lab = Lab(f"http://127.0.0.1:{port}", token, log_path)
        deadline = time.monotonic() + 180
        while server.poll() is None and time.monotonic() < deadline:
            try:
                lab.api("status")
                return server, lab
            except OSError:
                time.sleep(0.5)
        _stop_server(server)
        if "already in use" not in log_path.read_text():
            break
    raise AssertionError(f"JupyterLab did not start (exit code {server.returncode}):\n{log_path.read_text()[-3000:]}")


def _stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on 127.0.0.1 (free port, random token) serving copies of notebooks 02 and 03."""
    work = tmp_path / "notebooks"
    work.mkdir()
    for name in (NOTEBOOK_02, NOTEBOOK_03):
        _copy_without_outputs(ROOT / "notebooks" / name, work / name)
    settings, data = tmp_path / "lab-settings", tmp_path / "jupyter-data"
    runtime = Path(tempfile.mkdtemp(prefix="wb-lab-"))  # short: Unix socket paths have a length limit
    _write(
        settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )
    # every cell stays in the DOM (JupyterLab 4 detaches cells scrolled out of view by default)
    _write(settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings", {"windowingMode": "none"})
    # the kernel is this interpreter, whatever kernels the machine has installed
    _write(
        data / "kernels" / "python3" / "kernel.json",
        {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3",
            "language": "python",
        },
    )
    # the rest of the environment is inherited: WORKBENCH_CACHE (where the expanded demo checkpoint is
    # cached) applies to the kernel as to the rest of the test run
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "WORKBENCH_PROGRESS": "0",
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"),
        "JUPYTER_DATA_DIR": str(data),
        "JUPYTER_RUNTIME_DIR": str(runtime),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
    }
    env.pop("WORKBENCH_NOTEBOOK_CHECKPOINT", None)  # the playground steps expect the embedded demo model
    # one compute thread unless set: the kernel shares the cores with Chromium and the server, and OpenMP
    # threads that wait for a descheduled sibling made Run All several times slower on a busy machine
    env.setdefault("OMP_NUM_THREADS", "1")
    server = None
    try:
        server, server_lab = _start_server(work, env, tmp_path / "lab.log")
        yield server_lab
    finally:
        if server is not None:
            try:  # shut the kernels down through the server first: they exit cleanly
                for kernel in server_lab.api("kernels"):
                    server_lab.api(f"kernels/{kernel['id']}", method="DELETE")
            except Exception:
                pass
            _stop_server(server)
        for pid in _processes_using(str(runtime)):  # a kernel the server could not stop
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium through chromedriver; quit in teardown whatever happened."""
    chromium, chromedriver = browser_binaries()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-background-timer-throttling",
        "--disable-renderer-backgrounding",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(chromedriver, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(180)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _save_artifacts(driver, lab: Lab, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for what, save in (
        ("screenshot", lambda p: driver.save_screenshot(str(p.with_suffix(".png")))),
        ("page", lambda p: p.with_suffix(".html").write_text(driver.page_source)),
        (
            "console",
            lambda p: p.with_suffix(".log").write_text(
                "\n".join(f"{e['level']} {e['message']}" for e in driver.get_log("browser"))
            ),
        ),
        ("lab", lambda p: shutil.copy(lab.log, p.with_suffix(".log"))),
    ):
        try:
            save(folder / f"{stamp}-{what}")
        except Exception as exc:  # one artifact failing must not hide the test's own failure
            (folder / f"{stamp}-{what}.error.txt").write_text(repr(exc))
    return folder


def _wait(what: str, condition, timeout: float = 300, every: float = 0.2):
    """Poll ``condition`` until it returns something truthy; AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = condition()
        except Exception as exc:  # stale elements while JupyterLab re-renders, a page still loading
            value, last = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}" + (f" (last error: {last!r})" if last else "")
            )
        time.sleep(every)


# One round trip reads the notebook's state: prompts of code cells and error outputs.
_NOTEBOOK_STATE = r"""
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
if (!panel) return null;
const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim());
const errors = [...panel.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
  .map(e => e.textContent).filter(t => /Traceback \(most recent call last\)|^\w*(Error|Exception)\b/m.test(t));
return {prompts, errors};
"""


def _menu(driver, menu: str, item: str) -> None:
    from selenium.webdriver.common.by import By

    _wait(
        f"the {menu} menu",
        lambda: driver.find_element(By.XPATH, f"//li[contains(@class,'lm-MenuBar-item')][.//div[text()='{menu}']]"),
    ).click()
    _wait(
        f"the menu item {item}",
        lambda: driver.find_element(By.XPATH, f"//li[contains(@class,'lm-Menu-item')][.//div[text()='{item}']]"),
    ).click()


def _kernel_state(lab: Lab, name: str) -> str | None:
    for session in lab.api("sessions"):
        if session["path"].endswith(name) and session.get("kernel"):
            return session["kernel"]["execution_state"]
    return None


def _open_and_run_all(driver, lab: Lab, name: str, timeout: float) -> float:
    """Open notebook ``name``, Run All Cells, wait until every code cell has run; seconds the run took."""
    driver.get(lab.url(name))
    _wait(f"{name} to open", lambda: (driver.execute_script(_NOTEBOOK_STATE) or {}).get("prompts"), timeout=180)
    _wait(f"the kernel of {name} to start", lambda: _kernel_state(lab, name) == "idle", timeout=180)
    start = time.monotonic()
    _menu(driver, "Run", "Run All Cells")
    numbered = re.compile(r"^\[\d+\]:$")

    def finished():  # an error shows, or nothing is queued ([*]) any more and the kernel is idle
        state = driver.execute_script(_NOTEBOOK_STATE)
        ran = any(numbered.match(p) for p in state["prompts"]) and "[*]:" not in state["prompts"]
        return state if state["errors"] or (ran and _kernel_state(lab, name) == "idle") else None

    state = _wait(f"all cells of {name} to run", finished, timeout=timeout, every=1.0)
    took = time.monotonic() - start
    assert not state["errors"], f"{name} raised while running all cells:\n" + "\n".join(state["errors"])
    assert all(numbered.match(p) for p in state["prompts"]), f"not every cell ran: {state['prompts']}"
    assert len(set(state["prompts"])) == len(state["prompts"]), f"a cell ran twice: {state['prompts']}"
    return took


# One round trip reads the playground: its message cards, status, buttons and the prompt box.
_PLAYGROUND_STATE = """
const pg = document.querySelector('.wb-playground');
if (!pg) return null;
const box = pg.querySelector('textarea.wb-prompt-box');
const button = (name) => pg.querySelector('button.' + name);
return {
  cards: [...pg.querySelectorAll('.wb-transcript .wb-msg')].map(c => ({
      role: [...c.classList].find(k => k.startsWith('wb-msg-')).slice(7), text: c.textContent,
      calls: c.querySelectorAll('.wb-call').length})),
  transcript: pg.querySelector('.wb-transcript').textContent,
  status: pg.querySelector('.wb-status').textContent,
  streamed: pg.__wbStreamed || 0, statuses: pg.__wbStatuses || [],
  box: box ? {value: box.value, disabled: box.disabled} : null,
  send: !button('wb-send').disabled, stop: !button('wb-stop').disabled,
};
"""

# From the Enter on: count the transcript frames that show a reply still streaming (the cursor), and keep
# every status the playground shows — however short the reply, no frame is missed between two polls.
_WATCH = """
const pg = document.querySelector('.wb-playground');
pg.__wbStreamed = 0;
pg.__wbStatuses = [];
if (!pg.__wbObserver) {
  const transcript = pg.querySelector('.wb-transcript'), status = pg.querySelector('.wb-status');
  pg.__wbObserver = new MutationObserver(() => {
    if (transcript.textContent.includes('\u258c')) pg.__wbStreamed += 1;
    const now = status.textContent;
    if (pg.__wbStatuses[pg.__wbStatuses.length - 1] !== now) pg.__wbStatuses.push(now);
  });
  for (const part of [transcript, status])
    pg.__wbObserver.observe(part, {childList: true, subtree: true, characterData: true});
}
"""


# Resolves at the first streamed frame or when the turn has ended, with no polling delay.
_FIRST_FRAME = """
const done = arguments[arguments.length - 1], pg = document.querySelector('.wb-playground');
const check = () => {
  const ended = pg.__wbStatuses.some(t => /done in|stopped after|error/.test(t));
  if (pg.__wbStreamed || ended) { clearInterval(timer); done(pg.__wbStreamed); }
};
const timer = setInterval(check, 5);
check();
"""


def _wait_first_frame(driver, timeout: float = 300) -> int:
    """Frames streamed so far, as soon as the first one shows (0: the turn ended without streaming)."""
    driver.set_script_timeout(timeout)
    try:
        return driver.execute_async_script(_FIRST_FRAME)
    finally:
        driver.set_script_timeout(60)


def _playground(driver) -> dict:
    state = driver.execute_script(_PLAYGROUND_STATE)
    assert state is not None, "the playground is not on the page"
    return state


def _type_and_enter(driver, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.CSS_SELECTOR, ".wb-playground textarea.wb-prompt-box")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
    box.click()
    box.send_keys(text)
    _wait("the typed text to reach the box", lambda: box.get_attribute("value") == text, timeout=30)
    driver.execute_script(_WATCH)
    box.send_keys(Keys.ENTER)


def _set_slider(driver, css: str, value: str) -> str:
    """Type ``value`` into a slider's editable readout (what a user does to set an exact number)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    readout = driver.find_element(By.CSS_SELECTOR, f".wb-playground {css} .widget-readout")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", readout)
    readout.click()
    readout.send_keys(Keys.CONTROL, "a")
    readout.send_keys(value, Keys.ENTER)
    return readout.text  # the widget rewrites it to the value it took


def _turn_ended(state: dict) -> bool:
    """The turn begun by the last Enter has ended and all its updates arrived (each is a message of its own):
    a final status was shown, Send and the box are back, Stop is off, the transcript has no cursor."""
    ended = any(m in t for t in state["statuses"] for m in ("done in", "stopped after", "error"))
    idle = state["send"] and not state["stop"] and state["box"] and not state["box"]["disabled"]
    return ended and idle and "\u258c" not in state["transcript"]


def _wait_turn(driver, what: str, timeout: float = 300) -> dict:
    def ended() -> dict | None:
        state = _playground(driver)
        return state if _turn_ended(state) else None

    return _wait(what, ended, timeout=timeout, every=0.1)


def test_playground_and_plot_in_a_real_browser(browser, lab, tmp_path):
    artifacts = Path(os.environ.get("WORKBENCH_BROWSER_ARTIFACTS") or tmp_path / "artifacts")
    try:
        _drive(browser, lab)
    except BaseException as exc:
        folder = _save_artifacts(browser, lab, artifacts)
        raise AssertionError(
            f"{type(exc).__name__}: {exc}\n(screenshot, page source, browser console and "
            f"JupyterLab log of the failure: {folder})"
        ) from exc


def _drive(driver, lab: Lab) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    took = _open_and_run_all(driver, lab, NOTEBOOK_02, timeout=1200)
    print(f"Run All Cells of {NOTEBOOK_02}: {took:.1f} s")

    # the playground, with the question its cell sent from code
    _wait("the playground to render", lambda: _playground(driver)["cards"], timeout=60)
    state = _playground(driver)
    assert [c["role"] for c in state["cards"]][:1] == ["user"] and "Paris" in state["cards"][0]["text"], state
    assert state["box"] == {"value": "", "disabled": False} and state["send"] and not state["stop"], state
    before = len(state["cards"])

    # type a question, press Enter: the reply streams in (Stop enabled meanwhile), then its cards stay
    _type_and_enter(driver, QUESTION)
    state = _wait_turn(driver, "the turn to finish")
    new = state["cards"][before:]
    assert "done in" in state["status"], state["statuses"]
    assert any("generating" in t for t in state["statuses"]), state["statuses"]
    assert state["streamed"] > 0, "no frame of the transcript showed the reply streaming in"
    assert new and new[0]["role"] == "user" and QUESTION in new[0]["text"], new
    assert any(c["calls"] for c in new), f"no tool-call card among the new cards: {new}"
    assert [c["role"] for c in new][-2:] == ["tool", "assistant"], new
    assert state["box"]["value"] == "", state["box"]  # sent, not handed back after an error

    # a long generation: sampled at the highest temperature with room for many tokens, tool_choice none (a
    # sampled reply that parses as a call runs no tool round); Stop while it streams
    _wait(
        "the controls",
        lambda: driver.find_element(By.CSS_SELECTOR, ".wb-playground .wb-controls .jupyter-widget-Collapse-header"),
    ).click()
    assert _set_slider(driver, ".wb-temperature", "2") == "2.00"
    assert _set_slider(driver, ".wb-max-tokens", "1000") == "1000"
    Select(driver.find_element(By.CSS_SELECTOR, ".wb-playground .wb-tool-choice select")).select_by_visible_text("none")
    attempts = []
    for _ in range(STOP_ATTEMPTS):
        before = len(_playground(driver)["cards"])
        _type_and_enter(driver, LONG_QUESTION)
        stop = driver.find_element(By.CSS_SELECTOR, ".wb-playground button.wb-stop")
        _wait_first_frame(driver)
        stop.click()
        state = _wait_turn(driver, "the turn to end after Stop", timeout=120)
        attempts.append(state["statuses"])
        print(f"Stop, attempt {len(attempts)}: {state['streamed']} streamed frames, statuses {state['statuses']}")
        if re.search(r"stopped after \d+ tokens", state["status"]):  # else it ended before Stop landed: again
            break
    stopped = re.search(r"stopped after (\d+) tokens", state["status"])
    assert stopped and int(stopped.group(1)) >= 1, f"Stop did not end a generation; statuses seen: {attempts}"
    assert state["streamed"] > 0 and "stopping…" in state["statuses"], state["statuses"]  # pressed mid-stream
    last = state["cards"][-1]
    assert len(state["cards"]) > before and last["role"] == "assistant" and "cancelled" in last["text"], last
    assert state["box"]["value"] == "", state["box"]

    # Clear: the dialog starts over
    driver.find_element(By.CSS_SELECTOR, ".wb-playground button.wb-clear").click()
    state = _wait(
        "the dialog to clear",
        lambda: (s := _playground(driver))["status"] == "cleared" and not s["cards"] and s,
        timeout=60,
    )
    assert "No messages yet" in state["transcript"], state["transcript"]

    # notebook 03: its plot is an image in the page
    took = _open_and_run_all(driver, lab, NOTEBOOK_03, timeout=600)
    print(f"Run All Cells of {NOTEBOOK_03}: {took:.1f} s")
    sizes = driver.execute_script("""return [...document.querySelectorAll(
        '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output img[src^="data:image/png"]')]
        .map(img => [img.complete, img.naturalWidth, img.naturalHeight]);""")
    assert sizes and all(done and w > 300 and h > 150 for done, w, h in sizes), f"plot images: {sizes}"


# ------------------------------------------------------------------------------------------ runs: viewer, report
VIEW_ITEMS = 2000  # items per run in the viewer test: many pages, a few hundred regressions
_GRID_STATE = """
const view = document.querySelector('.wb-runs-view');
if (!view) return null;
const rows = [...view.querySelectorAll('.wb-runs-grid table.dataTable tbody tr')];
return {rows: rows.map(r => [...r.querySelectorAll('td')].map(td => td.textContent)),
        info: (view.querySelector('.wb-runs-grid .dt-info, .wb-runs-grid .dataTables_info') || {}).textContent || '',
        summary: (view.querySelector('.wb-runs-summary') || {}).textContent || '',
        detail: view.querySelector('.wb-runs-detail').innerHTML,
        dels: view.querySelectorAll('.wb-runs-detail .wb-del').length,
        inss: view.querySelectorAll('.wb-runs-detail .wb-ins').length};
"""


def _viewer_notebook(path: Path, store: Path) -> None:
    cells = [
        "import workbench as wb",
        f"view = wb.runs.view('prompt-a', 'prompt-b', store={str(store)!r})\nview",
    ]
    notebook = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None} for s in cells
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook))


def test_runs_viewer_in_a_real_browser(browser, lab, tmp_path):
    """wb.runs.view in JupyterLab: the grid draws one page (not every item), a regression first; a click on it
    opens both transcripts side by side with the differing words marked; "regressed only" keeps regressions."""
    from _runs_experiment import expected_counts, write_runs

    store = write_runs(tmp_path / "store" / "runs.sqlite", VIEW_ITEMS)
    _viewer_notebook(tmp_path / "notebooks" / "runs_view.ipynb", store)
    artifacts = Path(os.environ.get("WORKBENCH_BROWSER_ARTIFACTS") or tmp_path / "artifacts")
    try:
        _drive_viewer(browser, lab, expected_counts(VIEW_ITEMS))
    except BaseException as exc:
        folder = _save_artifacts(browser, lab, artifacts)
        raise AssertionError(f"{type(exc).__name__}: {exc}\n(artifacts of the failure: {folder})") from exc


def _drive_viewer(driver, lab: Lab, counts: dict[str, int]) -> None:
    from selenium.webdriver.common.by import By

    took = _open_and_run_all(driver, lab, "runs_view.ipynb", timeout=600)
    start = time.monotonic()
    state = _wait(
        "the item grid to draw",
        lambda: (s := driver.execute_script(_GRID_STATE)) and s["rows"] and s,
        timeout=120,
        every=0.05,
    )
    print(f"viewer: cells ran in {took:.1f} s; grid drawn {time.monotonic() - start:.2f} s after (polling)")
    assert state["rows"][0][0] == "regressed", state["rows"][:3]
    assert 0 < len(state["rows"]) <= 15, f"{len(state['rows'])} rows in the DOM: the grid must page"
    assert str(VIEW_ITEMS).replace("000", ",000") in state["info"] or str(VIEW_ITEMS) in state["info"], state["info"]
    assert "p-value" in state["summary"] and "prompt-b" in state["summary"], state["summary"]

    first = driver.find_element(By.CSS_SELECTOR, ".wb-runs-grid table.dataTable tbody tr td")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", first)
    first.click()
    state = _wait(
        "both transcripts side by side", lambda: (s := driver.execute_script(_GRID_STATE))["dels"] and s, timeout=60
    )
    assert state["inss"] and "get_time" in state["detail"] and "get_weather" in state["detail"], state["detail"]
    assert "wb-side" in state["detail"]

    box = driver.find_element(By.CSS_SELECTOR, ".wb-runs-regressed-only input[type=checkbox]")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
    box.click()
    total = f"{counts['regressed']:,}"
    state = _wait(
        "the regressed-only filter",
        lambda: (
            (s := driver.execute_script(_GRID_STATE))
            and (total in s["info"] or str(counts["regressed"]) in s["info"])
            and s
        ),
        timeout=60,
    )
    assert {row[0] for row in state["rows"]} == {"regressed"}, state["rows"]


def test_report_opens_offline_in_a_real_browser(browser, tmp_path):
    """The report file, opened with the network switched off: everything draws (styles inline), the page
    fetched nothing, and its text holds no external reference."""
    from _runs_experiment import write_runs

    import workbench as wb

    store = write_runs(tmp_path / "store" / "runs.sqlite", 60)
    path = wb.runs.report(["prompt-a", "prompt-b"], tmp_path / "report.html", store=store)
    text = path.read_text()
    for needle in ("http://", "https://", "//cdn", "<link", "src=", "@import"):
        assert needle not in text, needle
    browser.set_network_conditions(offline=True, latency=0, download_throughput=0, upload_throughput=0)
    browser.get(path.as_uri())
    seen = browser.execute_script("""return {
        resources: performance.getEntriesByType('resource').map(e => e.name),
        summary: document.querySelectorAll('table.wb-summary tr.wb-summary-row').length,
        regressed: document.querySelector('.wb-item .wb-change-regressed') !== null,
        firstItem: (document.querySelector('.wb-item span') || {}).textContent,
        marked: getComputedStyle(document.querySelector('.wb-ins')).backgroundColor,
        font: getComputedStyle(document.querySelector('.wb-runs')).fontFamily};""")
    assert seen["resources"] == [], seen["resources"]
    assert seen["summary"] >= 2 and seen["regressed"] and seen["firstItem"] == "regressed", seen
    assert seen["marked"] not in ("", "rgba(0, 0, 0, 0)"), seen  # the inline style sheet applied
