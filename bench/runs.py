"""Run store micro-benchmark: what remembering a row costs, side by side, per row.

Contenders (one process, one Python thread, a fresh store file each):

* ``keys``: building the exact keys of a 48-row call (200-token prompts);
* ``put``: one finished row per transaction (what the engine's per-row hook does), ``synchronous=NORMAL``
  (survives a kill of the process) and ``FULL`` (an fsync per row: survives a power loss);
* ``put_many16``: groups of 16 rows per transaction;
* ``lookup_hit`` / ``lookup_miss``: answering a 48-row call from the store / finding nothing;
* ``rows_browse``: reading the run back as StoredRows (decode included);
* ``identity_first`` / ``identity_memo``: a checkpoint's content hash (MB/s) and the remembered answer.

``--part engine`` measures ``run=`` end to end on the demo model (``wb.load()``), side by side in one process,
each contender repeated (interleaved, medians) on a fresh store file so no call finds another's rows:

* ``none``: a 48-row ``batch_completion`` without a run store;
* ``store``: the same call with ``run=`` (48 keys, a lookup that finds nothing, 48 rows written as they finish);
* ``rerun``: the same call again on the store ``store`` filled (every row answered from the store).

``--part memory`` runs one 10,000-row ``batch_completion`` (a tiny checkpoint, ``max_tokens=2``) with ``run=`` and
without, sampling the process's RSS four times a second: what the store adds on top of the results themselves.

Clock: the engine part counts CPU seconds of the whole process (``time.process_time``: the store's timer thread
included), robust to a shared machine's preemption; the store part counts wall seconds (``time.perf_counter``: a
FULL-sync write waits for the disk, which CPU time would not see).  ``OMP_NUM_THREADS=1`` keeps torch on one
thread.

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/runs.py [--rows 960] [--logprobs 5]
    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/runs.py --part engine [--repeats 3]
    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/runs.py --part memory [--memory-rows 10000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from common import make_prompts, median

from workbench import runs
from workbench.runs.store import Store
from workbench.types import Completion, TokenLogprob

PROMPT_TOKENS = 200
GENERATED = 64
BATCH = 48


def output(i: int, logprobs: int) -> Completion:
    tokens = [(i * 31 + j) % 128000 for j in range(GENERATED)]
    lps = None
    if logprobs:
        lps = [
            TokenLogprob(
                t, f"tok{t}", -0.1 * (j % 7), {f"alt{k}": -1.0 - k for k in range(logprobs)}, list(range(logprobs))
            )
            for j, t in enumerate(tokens)
        ]
    return Completion(
        text=" ".join(f"tok{t}" for t in tokens),
        tokens=tokens,
        stop_reason="out_of_tokens",
        logprobs=lps,
        prompt_tokens=PROMPT_TOKENS,
    )


def requests(n: int, offset: int = 0) -> list[runs.RowRequest]:
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": GENERATED, "stop": [], "logprobs": 0}
    return [runs.RowRequest([(offset + i) * 7 + j for j in range(PROMPT_TOKENS)], sampling) for i in range(n)]


def per_row_us(seconds: float, rows: int) -> float:
    return round(seconds / rows * 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--part",
        choices=("micro", "engine", "memory"),
        default="micro",
        help="micro: the store alone; engine: run= on the demo model; memory: a 10,000-row call",
    )
    parser.add_argument("--rows", type=int, default=960, help="rows stored per put contender")
    parser.add_argument("--logprobs", type=int, default=0, help="top-k logprobs stored per token")
    parser.add_argument("--repeats", type=int, default=3, help="engine part: runs of each contender")
    parser.add_argument("--batch", type=int, default=BATCH, help="engine part: rows per call")
    parser.add_argument("--max-tokens", type=int, default=32, help="engine part: tokens per row")
    parser.add_argument("--memory-rows", type=int, default=10_000, help="memory part: rows of the call")
    parser.add_argument("--contender", choices=("none", "store"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part == "engine":
        return engine_part(args)
    if args.part == "memory":
        return memory_part(args)
    prov = runs.Provenance(
        identity="sha256:bench",
        load=runs.load_fields({"dtype": "bfloat16", "quantization": None, "model_parallel_size": 1, "device": "cpu"}),
        model="bench",
    )
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="wb-bench-runs-") as tmp:
        folder = Path(tmp)
        outputs = [output(i, args.logprobs) for i in range(args.rows)]
        rows = requests(args.rows)  # built before any clock starts: the contenders time the store, not the data
        batches = [rows[b : b + BATCH] for b in range(0, args.rows, BATCH)]

        start = time.perf_counter()
        for batch in batches:
            runs.request_keys(prov.identity, prov.load, batch)
        results["keys_us_per_row"] = per_row_us(time.perf_counter() - start, args.rows)

        stores = {}
        for name, sync, group in (("put", "NORMAL", 1), ("put_full_sync", "FULL", 1), ("put_many16", "NORMAL", 16)):
            store = Store(folder / f"{name}.sqlite", synchronous=sync)
            run = store.open_run("bench", prov)
            keys = run.keys(rows)
            start = time.perf_counter()
            for g in range(0, args.rows, group):
                run.put_many(
                    [
                        {
                            "key": keys[i],
                            "request": {"prompt": f"prompt {i}"},
                            "prompt_ids": rows[i].prompt_ids,
                            "output": outputs[i],
                            "timings": {"seconds": 0.1},
                        }
                        for i in range(g, min(g + group, args.rows))
                    ]
                )
            results[f"{name}_us_per_row"] = per_row_us(time.perf_counter() - start, args.rows)
            stores[name] = (store, run, keys)

        store, run, keys = stores["put"]
        start = time.perf_counter()
        for b in range(0, args.rows, BATCH):
            found = run.lookup(keys[b : b + BATCH])
            assert len(found) == len(keys[b : b + BATCH])
        results["lookup_hit_us_per_row"] = per_row_us(time.perf_counter() - start, args.rows)
        misses = run.keys(requests(args.rows, offset=10**6))
        start = time.perf_counter()
        for b in range(0, args.rows, BATCH):
            assert not run.lookup(misses[b : b + BATCH])
        results["lookup_miss_us_per_row"] = per_row_us(time.perf_counter() - start, args.rows)
        start = time.perf_counter()
        assert sum(1 for _ in store.rows("bench")) == args.rows
        results["rows_browse_us_per_row"] = per_row_us(time.perf_counter() - start, args.rows)
        results["store_bytes_per_row"] = round(store.size_bytes() / args.rows)

        ckpt = folder / "ckpt"
        ckpt.mkdir()
        (ckpt / "params.json").write_text("{}")
        block = os.urandom(1 << 20)
        with open(ckpt / "consolidated.00.pth", "wb") as f:
            for _ in range(256):
                f.write(block)
        start = time.perf_counter()
        Store(folder / "hash.sqlite").checkpoint_identity(ckpt, progress=False)
        first = time.perf_counter() - start
        start = time.perf_counter()
        Store(folder / "hash.sqlite").checkpoint_identity(ckpt, progress=False)
        results["identity_first_MB_per_s"] = round(256 / first, 1)
        results["identity_memo_ms"] = round((time.perf_counter() - start) * 1e3, 2)

    width = max(len(k) for k in results)
    for name, value in results.items():
        print(f"{name:<{width}}  {value}")
    print(
        f"put FULL / NORMAL: {results['put_full_sync_us_per_row'] / results['put_us_per_row']:.2f}x   "
        f"put_many16 / put: {results['put_many16_us_per_row'] / results['put_us_per_row']:.2f}x   "
        f"lookup_hit / put: {results['lookup_hit_us_per_row'] / results['put_us_per_row']:.2f}x"
    )
    print(
        json.dumps(
            {
                "bench": "runs",
                "threads": 1,
                "rows": args.rows,
                "prompt_tokens": PROMPT_TOKENS,
                "generated_tokens": GENERATED,
                "logprobs": args.logprobs,
                "results": results,
            }
        )
    )


# ------------------------------------------------------------------------------------------------ engine
def engine_part(args: argparse.Namespace) -> None:
    import workbench as wb

    engine = wb.load(max_batch_size=16)
    prompts = make_prompts(args.batch)
    kwargs = {"max_tokens": args.max_tokens, "progress": False}
    engine.batch_completion(prompts[:4], **kwargs)  # warm-up
    times: dict[str, list[float]] = {"none": [], "store": [], "rerun": []}
    with tempfile.TemporaryDirectory(prefix="wb-bench-runs-") as tmp:
        for repeat in range(args.repeats):
            os.environ["WORKBENCH_STORE"] = str(Path(tmp) / f"runs-{repeat}.sqlite")  # nothing found from before
            start = time.process_time()
            plain = engine.batch_completion(prompts, **kwargs)
            times["none"].append(time.process_time() - start)
            start = time.process_time()
            stored = engine.batch_completion(prompts, run="bench", **kwargs)
            times["store"].append(time.process_time() - start)
            start = time.process_time()
            again = engine.batch_completion(prompts, run="bench", **kwargs)
            times["rerun"].append(time.process_time() - start)
            assert plain == stored == again and not any(r.cached for r in stored) and all(r.cached for r in again)
    tokens = sum(len(r.tokens) for r in plain)
    med = {k: median(v) for k, v in times.items()}
    results = {f"{k}_s": round(v, 3) for k, v in med.items()}
    results.update(
        store_overhead_pct=round(100 * (med["store"] - med["none"]) / med["none"], 2),
        rerun_pct_of_compute=round(100 * med["rerun"] / med["none"], 2),
        spread_none_pct=round(100 * (max(times["none"]) - min(times["none"])) / med["none"], 1),
    )
    for name, value in results.items():
        print(f"{name:<22}  {value}")
    print(
        json.dumps(
            {
                "bench": "runs-engine",
                "threads": torch.get_num_threads(),
                "model": "demo",
                "rows": args.batch,
                "max_tokens": args.max_tokens,
                "generated_tokens": tokens,
                "repeats": args.repeats,
                "clock": "process_time",
                "results": results,
                "samples": times,
            }
        )
    )


# ------------------------------------------------------------------------------------------------ memory
def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class RssSampler:
    """The process's RSS every ``every_s`` seconds, on a thread, while a ``with`` block runs."""

    def __init__(self, every_s: float = 0.25) -> None:
        self.every_s, self.samples = every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(rss_mb())

    def __enter__(self) -> RssSampler:
        self.samples.append(rss_mb())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(rss_mb())


def memory_contender(args: argparse.Namespace) -> dict[str, object]:
    """One contender of the memory part, in this (fresh) process: the 10,000-row call with or without ``run=``."""
    import workbench as wb
    from workbench.checkpoints.factory import TINY_LLAMA3, write_checkpoint

    n = args.memory_rows
    prompts = [[128000, 1000 + i % 5000, 2000 + i // 5000, 3000 + i % 97] for i in range(n)]  # all distinct
    extra = {"run": "memory"} if args.contender == "store" else {}
    with tempfile.TemporaryDirectory(prefix="wb-bench-runs-") as tmp:
        ckpt = write_checkpoint(Path(tmp) / "ckpt", TINY_LLAMA3)
        engine = wb.load(ckpt, model="Llama3.2-3B-Instruct", max_batch_size=64, max_seq_len=64)
        os.environ["WORKBENCH_STORE"] = str(Path(tmp) / "runs.sqlite")
        engine.batch_completion(prompts[-64:], max_tokens=2, progress=False, run="warm-up")  # store and model warm
        gc.collect()
        start, began = rss_mb(), time.perf_counter()
        with RssSampler() as sampler:
            out = engine.batch_completion(prompts, max_tokens=2, progress=False, **extra)
        samples = sampler.samples
        result: dict[str, object] = {
            "seconds": round(time.perf_counter() - began, 1),
            "rss_start_MB": round(start, 1),
            "rss_quarters_MB": [round(samples[min(len(samples) - 1, k * len(samples) // 4)], 1) for k in range(1, 5)],
            "rss_growth_MB": round(max(samples) - start, 1),
            "rows": len(out),
        }
        if extra:
            result["rows_stored"] = sum(1 for _ in wb.runs.store().rows("memory"))
            result["store_file_MB"] = round(wb.runs.store().size_bytes() / 2**20, 1)
    return result


def memory_part(args: argparse.Namespace) -> None:
    if args.contender:
        print(json.dumps(memory_contender(args)))
        return
    results: dict[str, object] = {}
    for contender in ("none", "store"):  # each in its own process: neither inherits the other's heap
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--part",
                "memory",
                "--contender",
                contender,
                "--memory-rows",
                str(args.memory_rows),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        for name, value in json.loads(done.stdout.strip().splitlines()[-1]).items():
            results[f"{contender}_{name}"] = value
    results["store_minus_none_growth_MB"] = round(results["store_rss_growth_MB"] - results["none_rss_growth_MB"], 1)
    for name, value in results.items():
        print(f"{name:<28}  {value}")
    print(
        json.dumps(
            {
                "bench": "runs-memory",
                "threads": torch.get_num_threads(),
                "rows": args.memory_rows,
                "max_tokens": 2,
                "model": "tiny llama3 (dim 64)",
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
