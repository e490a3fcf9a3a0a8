"""bench/gpu.py's dry run on a CPU: every path measured, the JSON written under $OUT as it goes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


def _gpu_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", Path(__file__).parents[1] / "bench" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_dry_run_measures_eager_and_graphed_decode_and_writes_json(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    doc = _gpu_bench().main(
        ["--device", "cpu", "--tiny", "--modes", "bf16,int4_mixed", "--batches", "2", "--steps", "16", "--threads", "1"]
    )
    written = json.loads((tmp_path / "gpu.json").read_text())
    assert written["results"] == doc["results"] and written["threads"] == 1
    rows = [r for r in written["results"] if "tok_s" in r]
    errors = [r for r in written["results"] if "error" in r]
    assert not [e for e in errors if "timing noise" not in e["error"]], errors  # a busy CPU may blur a timing
    assert {(r["mode"], r["path"]) for r in rows} | {(e["mode"], e["path"]) for e in errors} == {
        (m, p) for m in ("bf16", "int4_mixed") for p in ("eager", "graphed")
    }
    for row in rows:
        assert row["tok_s"] > 0 and row["bytes_per_step"] > 0 and row["prefill_tok_s"] > 0 and row["of_copy"] > 0
        assert row["of_peak"] is None  # a CPU has no data-sheet HBM peak
    graphed = [r for r in rows if r["path"] == "graphed"]
    assert all(r["graphs"] == 0 for r in graphed)  # on a CPU the fixed-shape steps run uncaptured
    ratio = {(r["mode"], r["path"], r["batch"]): r for r in written["ratios"]}
    assert all(
        ratio[(r["mode"], "graphed", r["batch"])]["vs_eager"] is not None
        for r in graphed
        if (r["mode"], "eager", r["batch"]) in {(x["mode"], x["path"], x["batch"]) for x in rows}
    )


def test_max_minutes_stops_before_new_measurements(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    doc = _gpu_bench().main(["--device", "cpu", "--tiny", "--max-minutes", "0", "--threads", "1"])
    assert doc["results"] == [] and "max-minutes" in doc["stopped"]
    assert json.loads((tmp_path / "gpu.json").read_text())["stopped"] == doc["stopped"]
