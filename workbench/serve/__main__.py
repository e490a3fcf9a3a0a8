"""``python -m workbench.serve``: load a checkpoint and serve it as an OpenAI-compatible endpoint until Ctrl-C.

    python -m workbench.serve                                  # the embedded demo model on 127.0.0.1:8000
    python -m workbench.serve --checkpoint /ckpts/Llama3.2-3B-Instruct --model Llama3.2-3B-Instruct --port 8080
    python -m workbench.serve --host 0.0.0.0 --api-key "$KEY"  # reachable from other machines: use a key

Errors are one line (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence

from workbench.errors import WorkbenchError

from .options import add_load_options, load_engine
from .server import serve


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench.serve", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port; default 8000)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer <key>' on every request")
    p.add_argument("--model-id", help="the id clients send as 'model' (default: the engine's)")
    p.add_argument(
        "--data-dir",
        help="where the Batch API keeps files and batches (default: $WORKBENCH_DATA_DIR, "
        "else ~/.local/share/workbench)",
    )
    p.add_argument(
        "--batch-rows",
        type=int,
        help="most rows a batch puts in one engine call (default: 8 x "
        "max_batch_size; interactive requests wait at most one such call)",
    )
    p.add_argument(
        "--run",
        help="remember every served row in the run store under this name, and answer requests "
        "it holds from there (see wb.runs)",
    )
    add_load_options(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(
    argv: Sequence[str] | None = None, *, ready: threading.Event | None = None, stop: threading.Event | None = None
) -> int:
    """Serve until Ctrl-C (or ``stop`` is set: tests); ``ready`` is set once the endpoint answers."""
    args = parser().parse_args(argv)
    try:
        engine = load_engine(args)
        srv = serve(
            engine,
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            data_dir=args.data_dir,
            batch_rows=args.batch_rows,
            run=args.run,
            **({"model_id": args.model_id} if args.model_id else {}),
        )
    except WorkbenchError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"serving {srv.model} at {srv.url} (Ctrl-C stops)", flush=True)
    if ready is not None:
        ready.set()
    try:
        (stop or threading.Event()).wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    print(f"stopped after {srv.stats.requests} requests, {srv.stats.tokens} tokens", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
