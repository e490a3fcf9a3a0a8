"""``python -m workbench batch -i requests.jsonl -o results.jsonl``: a batch file through the engine, no server.

    python -m workbench batch -i requests.jsonl -o results.jsonl
    python -m workbench batch -i requests.jsonl -o results.jsonl --checkpoint /ckpts/Llama3.2-3B-Instruct \\
        --model Llama3.2-3B-Instruct --device cuda

vLLM ``run-batch``'s formats (see :mod:`workbench.batches.cli`); a re-run skips the requests already in the
output file.  The requests go through the same translation as ``workbench.serve`` (a line's answer equals
that request sent to the endpoint) and run as engine batches of up to ``--batch-rows`` rows.  Prints a
progress bar and, last, one JSON summary line.  Exit status: 0 once every request has its line, 130 after
Ctrl-C (re-run to finish), 2 for a usage error.  Every answered row is also remembered in the run store
(``wb.runs``, run ``batch:<output path>``), so a re-run after a kill gets back the rows of the engine batch that
was in flight, not only the lines already written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from workbench.batches.cli import run_file
from workbench.errors import WorkbenchError
from workbench.runs.store import RUN_NAME_MAX

from .app import Context
from .bulk import BULK_FACTOR, BulkBackend
from .gather import Gatherer
from .options import add_load_options, load_engine
from .server import served_model_id


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workbench batch",
        description=(
            "Run a batch file through the engine, no server: OpenAI batch lines in (custom_id, method, url, body), "
            "vLLM run-batch lines out; a re-run resumes, skipping the requests already in the output file."
        ),
    )
    p.add_argument(
        "-i",
        "--input-file",
        required=True,
        help="requests, one JSON object per line (OpenAI batch format: custom_id, method, url, body)",
    )
    p.add_argument(
        "-o",
        "--output-file",
        required=True,
        help="results, one line per request (vLLM run-batch format); an existing file is resumed",
    )
    p.add_argument("--model-id", help="the id request bodies may name as 'model' (default: the engine's)")
    p.add_argument(
        "--batch-rows", type=int, help=f"most rows in one engine call (default {BULK_FACTOR} x max_batch_size)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_load_options(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def batch_run_name(output_file: str | Path) -> str:
    """The run-store name of a batch file's rows: ``batch:`` and the output file's absolute path (a re-run with the
    same output file finds the rows its killed predecessor stored); a path too long for a run name keeps its end
    and a hash of the whole."""
    path = str(Path(output_file).resolve())
    name = "batch:" + path
    if len(name) <= RUN_NAME_MAX and name.isprintable():
        return name
    digest = hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    tail = "".join(c if c.isprintable() else "?" for c in path)[-(RUN_NAME_MAX - 32) :]
    return f"batch:{digest}:...{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not Path(args.input_file).is_file():
        print(f"error: the input file {args.input_file} does not exist", file=sys.stderr)
        return 2
    if args.batch_rows is not None and args.batch_rows < 1:
        print(f"error: --batch-rows must be at least 1, got {args.batch_rows}", file=sys.stderr)
        return 2
    try:
        engine = load_engine(args)
    except WorkbenchError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    gatherer = Gatherer(engine)
    try:
        ctx = Context(engine, gatherer, args.model_id or served_model_id(engine), None)
        backend = BulkBackend(ctx, bulk_rows=args.batch_rows, quiet_s=0.0)
        run = batch_run_name(args.output_file)
        summary = run_file(
            backend, args.input_file, args.output_file, run=run, progress=False if args.no_progress else None
        )
    finally:
        gatherer.stop()
    print(json.dumps(summary), flush=True)
    return 130 if summary["interrupted"] else 0
