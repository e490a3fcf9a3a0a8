"""``python -m workbench batch -i requests.jsonl -o results.jsonl``: a batch file through the engine, no server.

    python -m workbench batch -i requests.jsonl -o results.jsonl
    python -m workbench batch -i requests.jsonl -o results.jsonl --checkpoint /ckpts/Llama3.2-3B-Instruct \\
        --model Llama3.2-3B-Instruct --device cuda

vLLM ``run-batch``'s formats (see :mod:`workbench.batches.cli`); a re-run skips the requests already in the
output file.  The requests go through the same translation as ``workbench.serve`` (a line's answer equals
that request sent to the endpoint) and run as engine batches of up to ``--batch-rows`` rows.  Prints a
progress bar and, last, one JSON summary line.  Exit status: 0 once every request has its line, 130 after
Ctrl-C (re-run to finish), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from workbench.batches.cli import run_file
from workbench.errors import WorkbenchError

from .app import Context
from .bulk import BULK_FACTOR, BulkBackend
from .gather import Gatherer
from .options import add_load_options, load_engine
from .server import served_model_id


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench batch", description=(
        "Run a batch file through the engine, no server: OpenAI batch lines in (custom_id, method, url, body), "
        "vLLM run-batch lines out; a re-run resumes, skipping the requests already in the output file."))
    p.add_argument("-i", "--input-file", required=True, help="requests, one JSON object per line (OpenAI batch "
                   "format: custom_id, method, url, body)")
    p.add_argument("-o", "--output-file", required=True, help="results, one line per request (vLLM run-batch "
                   "format); an existing file is resumed")
    p.add_argument("--model-id", help="the id request bodies may name as 'model' (default: the engine's)")
    p.add_argument("--batch-rows", type=int, help=f"most rows in one engine call (default {BULK_FACTOR} x "
                   "max_batch_size)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_load_options(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


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
        run = "batch:" + str(Path(args.output_file).resolve())  # the run-store name (phase 2)
        summary = run_file(backend, args.input_file, args.output_file, run=run,
                           progress=False if args.no_progress else None)
    finally:
        gatherer.stop()
    print(json.dumps(summary), flush=True)
    return 130 if summary["interrupted"] else 0
