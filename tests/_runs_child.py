"""Child processes of tests/test_runs_store.py: writers that share one run store with the test process.

python tests/_runs_child.py writer STORE TAG N      # N rows of its own + the shared requests; prints its keys
python tests/_runs_child.py endless STORE GROUP     # groups of GROUP rows forever; prints each committed count
python tests/_runs_child.py full STORE              # rows until the file-size limit bites; prints a summary
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import warnings

from workbench import runs
from workbench.errors import StoreWarning
from workbench.types import Completion

SHARED = 10  # requests every writer makes (identical keys from every process)


def provenance() -> runs.Provenance:
    load = runs.load_fields({"dtype": "bfloat16", "quantization": None, "model_parallel_size": 1, "device": "cpu"})
    return runs.Provenance(identity="sha256:test-checkpoint", load=load, model="tiny")


def request(prompt_ids: list[int]) -> runs.RowRequest:
    return runs.RowRequest(prompt_ids, {"temperature": 0.0, "max_tokens": 8})


def answer(prompt_ids: list[int], pad: int = 0) -> Completion:
    """The output a writer stores for ``prompt_ids`` (a function of the prompt: every process agrees)."""
    return Completion(
        text=f"answer {prompt_ids}" + "." * pad,
        tokens=[sum(prompt_ids) % 1000, len(prompt_ids)],
        stop_reason="end_of_turn",
        prompt_tokens=len(prompt_ids),
    )


def put(run: runs.Run, key: runs.RowKey, ids: list[int], pad: int = 0) -> bool:
    return run.put(
        key,
        request={"prompt": f"p{ids}"},
        prompt_ids=ids,
        output=answer(ids, pad),
        sampling={"temperature": 0.0, "max_tokens": 8},
        timings={"seconds": 0.001},
    )


def writer(path: str, tag: int, n: int) -> None:
    run = runs.store(path).open_run("shared", provenance())
    shared = [[7, 7, i] for i in range(SHARED)]
    own = [[tag, 1000 + i] for i in range(n)]
    keys = run.keys([request(ids) for ids in shared + own])
    for ids, key in zip(shared + own, keys):
        assert put(run, key, ids), "a put failed"
    print(
        json.dumps(
            {
                "shared": [k.key for k in keys[:SHARED]],
                "own": [k.key for k in keys[SHARED:]],
                "pandas_imported": "pandas" in sys.modules,
            }
        ),
        flush=True,
    )


def endless(path: str, group: int) -> None:
    run = runs.store(path).open_run("killed", provenance())
    i = 0
    while True:
        batch = [[5, i + j] for j in range(group)]
        keys = run.keys([request(ids) for ids in batch])
        rows = [
            {"key": k, "request": {"prompt": str(ids)}, "prompt_ids": ids, "output": answer(ids, pad=3000)}
            for ids, k in zip(batch, keys)
        ]
        assert run.put_many(rows), "a put failed"
        i += group
        print(i, flush=True)


def full(path: str) -> None:
    run = runs.store(path).open_run("full", provenance())
    put(run, run.key([1], {"temperature": 0.0, "max_tokens": 8}), [1])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead of killing us
    sizes = [os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p)]
    resource.setrlimit(resource.RLIMIT_FSIZE, (max(sizes) + 128 * 1024, resource.RLIM_INFINITY))
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(2, 300):
            ids = [i] * 50
            results.append(put(run, run.key(ids, {"temperature": 0.0, "max_tokens": 8}), ids, pad=2000))
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    stored_after = put(run, run.key([9999], {"temperature": 0.0, "max_tokens": 8}), [9999])
    print(
        json.dumps(
            {
                "results": results,
                "warnings": [str(w.message) for w in caught if issubclass(w.category, StoreWarning)],
                "stored_after": stored_after,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    mode, store_file, *rest = sys.argv[1:]
    if mode == "writer":
        writer(store_file, int(rest[0]), int(rest[1]))
    elif mode == "endless":
        endless(store_file, int(rest[0]))
    elif mode == "full":
        full(store_file)
