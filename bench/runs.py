"""Run store micro-benchmark: what remembering a row costs, side by side, per row.

Contenders (one process, one Python thread, a fresh store file each):

* ``keys``: building the exact keys of a 48-row call (200-token prompts);
* ``put``: one finished row per transaction (what the engine's per-row hook does), ``synchronous=NORMAL``
  (survives a kill of the process) and ``FULL`` (an fsync per row: survives a power loss);
* ``put_many16``: groups of 16 rows per transaction;
* ``lookup_hit`` / ``lookup_miss``: answering a 48-row call from the store / finding nothing;
* ``rows_browse``: reading the run back as StoredRows (decode included);
* ``identity_first`` / ``identity_memo``: a checkpoint's content hash (MB/s) and the remembered answer.

The end-to-end numbers of the issue (a re-run under 5 % of computing, storing under 3 % of generation)
need the engine's ``run=`` and are measured with it.

    PYTHONPATH=. python bench/runs.py [--rows 960] [--logprobs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

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
        lps = [TokenLogprob(t, f"tok{t}", -0.1 * (j % 7), {f"alt{k}": -1.0 - k for k in range(logprobs)},
                            list(range(logprobs))) for j, t in enumerate(tokens)]
    return Completion(text=" ".join(f"tok{t}" for t in tokens), tokens=tokens, stop_reason="out_of_tokens",
                      logprobs=lps, prompt_tokens=PROMPT_TOKENS)


def requests(n: int, offset: int = 0) -> list[runs.RowRequest]:
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": GENERATED, "stop": [], "logprobs": 0}
    return [runs.RowRequest([(offset + i) * 7 + j for j in range(PROMPT_TOKENS)], sampling) for i in range(n)]


def per_row_us(seconds: float, rows: int) -> float:
    return round(seconds / rows * 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=960, help="rows stored per put contender")
    parser.add_argument("--logprobs", type=int, default=0, help="top-k logprobs stored per token")
    args = parser.parse_args()
    prov = runs.Provenance(identity="sha256:bench", load=runs.load_fields(
        {"dtype": "bfloat16", "quantization": None, "model_parallel_size": 1, "device": "cpu"}), model="bench")
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="wb-bench-runs-") as tmp:
        folder = Path(tmp)
        outputs = [output(i, args.logprobs) for i in range(args.rows)]

        start = time.perf_counter()
        for b in range(0, args.rows, BATCH):
            runs.request_keys(prov.identity, prov.load, requests(BATCH, b))
        results["keys_us_per_row"] = per_row_us(time.perf_counter() - start, args.rows)

        stores = {}
        for name, sync, group in (("put", "NORMAL", 1), ("put_full_sync", "FULL", 1), ("put_many16", "NORMAL", 16)):
            store = Store(folder / f"{name}.sqlite", synchronous=sync)
            run = store.open_run("bench", prov)
            keys = run.keys(requests(args.rows))
            start = time.perf_counter()
            for g in range(0, args.rows, group):
                run.put_many([{"key": keys[i], "request": {"prompt": f"prompt {i}"},
                               "prompt_ids": requests(1, i)[0].prompt_ids, "output": outputs[i],
                               "timings": {"seconds": 0.1}} for i in range(g, min(g + group, args.rows))])
            results[f"{name}_us_per_row"] = per_row_us(time.perf_counter() - start, args.rows)
            stores[name] = (store, run, keys)

        store, run, keys = stores["put"]
        start = time.perf_counter()
        for b in range(0, args.rows, BATCH):
            found = run.lookup(keys[b:b + BATCH])
            assert len(found) == len(keys[b:b + BATCH])
        results["lookup_hit_us_per_row"] = per_row_us(time.perf_counter() - start, args.rows)
        misses = run.keys(requests(args.rows, offset=10**6))
        start = time.perf_counter()
        for b in range(0, args.rows, BATCH):
            assert not run.lookup(misses[b:b + BATCH])
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
    print(f"put FULL / NORMAL: {results['put_full_sync_us_per_row'] / results['put_us_per_row']:.2f}x   "
          f"put_many16 / put: {results['put_many16_us_per_row'] / results['put_us_per_row']:.2f}x   "
          f"lookup_hit / put: {results['lookup_hit_us_per_row'] / results['put_us_per_row']:.2f}x")
    print(json.dumps({"bench": "runs", "threads": 1, "rows": args.rows, "prompt_tokens": PROMPT_TOKENS,
                      "generated_tokens": GENERATED, "logprobs": args.logprobs, "results": results}))


if __name__ == "__main__":
    main()
