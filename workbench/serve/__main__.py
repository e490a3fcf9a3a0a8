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
from workbench.session import load

from .server import serve


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench.serve", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", help="checkpoint folder or checkpoints.toml entry (default: the embedded demo)")
    p.add_argument("--model", help="model descriptor (selects the prompt format), e.g. Llama3.2-3B-Instruct")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port; default 8000)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer <key>' on every request")
    p.add_argument("--model-id", help="the id clients send as 'model' (default: the engine's)")
    load_opts = p.add_argument_group("load options (as workbench.load)")
    load_opts.add_argument("--device")
    load_opts.add_argument("--dtype")
    load_opts.add_argument("--max-batch-size", type=int)
    load_opts.add_argument("--max-seq-len", type=int)
    load_opts.add_argument("--model-parallel-size", type=int)
    load_opts.add_argument("--quantization", choices=["bf16", "fp8_mixed", "int4_mixed"])
    load_opts.add_argument("--compile", action="store_true", help="compile the decode step (torch.compile)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(argv: Sequence[str] | None = None, *, ready: threading.Event | None = None,
         stop: threading.Event | None = None) -> int:
    """Serve until Ctrl-C (or ``stop`` is set: tests); ``ready`` is set once the endpoint answers."""
    args = parser().parse_args(argv)
    try:
        engine = load(args.checkpoint, model=args.model, device=args.device, dtype=args.dtype,
                      max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len,
                      model_parallel_size=args.model_parallel_size, quantization=args.quantization,
                      compile=args.compile)
        srv = serve(engine, host=args.host, port=args.port, api_key=args.api_key,
                    **({"model_id": args.model_id} if args.model_id else {}))
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
