"""What the run viewer and the report cost on two runs of 10,000 items each (issue 41's numbers).

Parts, one process, one Python thread, a fresh store file:

* ``view_python``: ``wb.runs.view(a, b)`` built in the kernel — settings, summary, compare, the ordered grid and
  the ITable's arguments (what the kernel does before the browser draws anything);
* ``grid_payload``: the bytes of the grid's data the browser receives (outputs cut to 80 characters);
* ``report``: ``wb.runs.report([a, b], file)`` — its seconds and the file's size (at most 200 changed items in
  full, the rest counted);
* ``first_draw`` (``--browser``): headless Chromium (Debian's, through selenium) opens a page holding the grid's
  DataTables bundle and data exactly as itables builds them (its offline bundle, then ``to_html_datatable``;
  the notebook widget runs the same DataTables on the same data) and the
  time from navigation start to the first page of rows drawn is read from the page (``performance.now()``
  when the first ``tbody tr`` exists); the DOM's row count shows paging (never all 10,000 rows).

The two runs: the same questions under two system prompts, chat rows with a tool call each, one pass/fail score;
1 in 7 items regresses, 1 in 13 improves, 1 in 11 is worded differently.  Timings are wall seconds on a shared
machine (noisy).

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/runs_view.py [--items 10000] [--browser]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import itables
from itables.javascript import generate_init_offline_itables_html

import workbench as wb
from workbench import runs
from workbench.notebook.runs_view import grid_frame
from workbench.types import ChatCompletion, Message, ToolCall

LOAD = runs.load_fields({"dtype": "bfloat16", "quantization": None, "model_parallel_size": 1, "device": "cpu"})
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 64, "stop": [], "logprobs": 0, "seed": None}
SYSTEMS = {"prompt-a": "You call tools.", "prompt-b": "You are terse and call tools."}


def write_runs(path: Path, n: int) -> None:
    store = runs.store(path)
    for name in SYSTEMS:
        run = store.open_run(
            name,
            runs.Provenance(identity="sha256:bench", load=LOAD, model="tiny", checkpoint="/ckpt/tiny", device="cpu"),
        )
        rows = []
        for i in range(n):
            regressed, improved = name == "prompt-b" and i % 7 == 3, name == "prompt-a" and i % 13 == 4
            tool = "get_time" if regressed or improved else "get_weather"
            text = f"Let me check the weather for city {i} for you; one moment while I call the tool."
            if name == "prompt-b" and i % 11 == 5:
                text = f"Checking city {i} now."
            out = ChatCompletion(
                Message("assistant", text, [ToolCall(tool, {"city": f"city {i}"}, f"c{i}")]),
                list(range(i % 40, i % 40 + 20)),
                "end_of_message",
                prompt_tokens=30,
            )
            messages = [
                {"role": "system", "content": SYSTEMS[name]},
                {"role": "user", "content": f"What's the weather in city {i}?"},
            ]
            ids = [1, 2 if name == "prompt-a" else 3, i]
            rows.append(
                {
                    "key": run.key(ids, GREEDY, kind="chat"),
                    "request": {"messages": messages},
                    "prompt_ids": ids,
                    "output": out,
                    "sampling": GREEDY,
                }
            )
        run.put_many(rows)
        runs.score(name, lambda row: {"right_tool": "get_weather" in str(row["tool_calls"])}, store=store)


def first_draw(grid_html: str, folder: Path) -> dict[str, Any]:
    """Chromium opens the grid page offline; seconds from navigation start to the first rows drawn."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    page = folder / "grid.html"
    probe = (
        "<script>(function(){const t0=performance.now();const tick=()=>{const r=document.querySelector("
        "'table.dataTable tbody tr');if(r){window.__drawn=performance.now();}else{requestAnimationFrame(tick);}};"
        "tick();})();</script>"
    )
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{probe}{grid_html}</body></html>")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={folder / 'profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.set_network_conditions(offline=True, latency=0, download_throughput=0, upload_throughput=0)
        draws = []
        for _ in range(3):
            driver.get(page.as_uri())
            deadline = time.monotonic() + 60
            while driver.execute_script("return window.__drawn || null") is None and time.monotonic() < deadline:
                time.sleep(0.02)
            draws.append(driver.execute_script("return window.__drawn") / 1000)
        in_dom = driver.execute_script("return document.querySelectorAll('table.dataTable tbody tr').length")
    finally:
        driver.quit()
    return {"first_draw_s": round(sorted(draws)[1], 3), "rows_in_dom": in_dom}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--browser", action="store_true", help="also time the grid's first draw in Chromium")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wb-bench-view-"))
    try:
        store = folder / "runs.sqlite"
        start = time.perf_counter()
        write_runs(store, args.items)
        print(f"wrote two runs of {args.items} items in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        view = wb.runs.view("prompt-a", "prompt-b", store=store)
        view_s = time.perf_counter() - start
        grid = grid_frame(view.shown)
        payload = len(json.dumps(grid.values.tolist()).encode())
        print(
            f"view_python: {view_s:.2f} s for {len(view.items)} items; grid payload {payload / 1e6:.2f} MB; "
            f"first rows: {list(view.items['status'][:3])}"
        )
        start = time.perf_counter()
        report = wb.runs.report(["prompt-a", "prompt-b"], folder / "report.html", store=store)
        report_s, report_mb = time.perf_counter() - start, report.stat().st_size / 1e6
        print(f"report: {report_s:.2f} s, {report_mb:.2f} MB")
        result: dict[str, Any] = {
            "bench": "runs_view",
            "threads": 1,
            "items": args.items,
            "view_python_s": round(view_s, 3),
            "grid_payload_mb": round(payload / 1e6, 2),
            "report_s": round(report_s, 3),
            "report_mb": round(report_mb, 3),
        }
        if args.browser:
            html = generate_init_offline_itables_html(itables.options.dt_bundle) + itables.to_html_datatable(
                grid,
                connected=False,
                maxBytes=0,
                pageLength=view.page_rows,
                showIndex=False,
                select={"style": "single"},
                order=[],
                display_logo_when_loading=False,
            )
            result.update(first_draw(html, folder))
            print(f"first_draw: {result['first_draw_s']:.3f} s, rows in the DOM: {result['rows_in_dom']}")
        print(json.dumps(result))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
