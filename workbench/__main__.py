"""``python -m workbench``: the main job on a checkpoint (the embedded default when none is given).

Loads the engine once, runs a batch of prompts through ``batch_completion`` and the same prompts one
at a time, checks that every row agrees, and prints the throughput of both plus a JSON summary.
User errors (a bad folder, ``--max-tokens 0``) print one line and exit with status 2 (``--debug``
shows the traceback); Ctrl-C stops generation at the next decode step and prints what was generated.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from typing import Any

from workbench import load
from workbench.engine import model_label
from workbench.errors import GenerationCancelled, WorkbenchError

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "The three laws of thermodynamics are",
    "Q: What is 17 * 23?\nA:",
    "Llamas are",
    "In 1969, the first humans",
    "The best way to learn a language is",
]

DESCRIPTION = (
    "Run a batch of prompts through a Llama checkpoint with workbench's engine, then the same prompts one at "
    "a time; check that every row agrees and print the throughput of both and a JSON summary. Without a "
    "checkpoint folder it runs the embedded default model."
)
EXIT_USAGE, EXIT_INTERRUPTED = 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + error
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m workbench", description=DESCRIPTION)
    parser.add_argument("checkpoint", nargs="?", default=None,
                        help="checkpoint folder (params.json, consolidated.NN.pth, tokenizer.model) or the name of a "
                             "checkpoints.toml entry; default: the embedded default model")  # fmt: skip
    parser.add_argument("--model", default=None,
                        help="model id that selects the prompt format, e.g. Llama3.2-3B-Instruct or "
                             "Llama-4-Scout-17B-16E-Instruct (default: inferred from params.json)")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
    parser.add_argument("--device", default=None, help="cpu or cuda / cuda:N (default: cpu)")
    parser.add_argument("--model-parallel-size", type=int, default=None,
                        help="ranks to shard the model over (one worker process each; 0 = one per checkpoint "
                             "shard; default 1)")  # fmt: skip
    parser.add_argument("--quantization", default=None, choices=["bf16", "fp8_mixed", "int4_mixed"],
                        help="load the weights quantized (default: unquantized)")  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for errors")
    return parser


def _fail(message: str, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    one_line = " ".join(str(message).split())
    print(f"python -m workbench: error: {one_line}", file=sys.stderr)
    return EXIT_USAGE


def _print_rows(rows: list[Any]) -> None:
    for prompt, result in zip(PROMPTS, rows):
        print(f"{prompt!r} -> {result.text!r} [{result.stop_reason}]")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    if args.max_tokens < 1:
        return _fail(f"--max-tokens must be at least 1, got {args.max_tokens}", args.debug)
    try:

        engine = load(args.checkpoint, model=args.model, device=args.device,
                      model_parallel_size=args.model_parallel_size, quantization=args.quantization)  # fmt: skip
    except WorkbenchError as exc:
        return _fail(str(exc), args.debug)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C) while loading", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"model: {model_label(engine)}")
    print(engine)
    previous = signal.signal(signal.SIGINT, lambda signum, frame: engine.cancel())
    batched: list[Any] = []
    try:
        start = time.perf_counter()
        batched = engine.batch_completion(PROMPTS, max_tokens=args.max_tokens, temperature=0.0)
        batch_s = time.perf_counter() - start
        _print_rows(batched)
        start = time.perf_counter()
        single = [engine.completion(p, max_tokens=args.max_tokens, temperature=0.0) for p in PROMPTS]
        single_s = time.perf_counter() - start
    except GenerationCancelled as exc:
        if batched:  # already printed: Ctrl-C came during the one-at-a-time run
            print("interrupted (Ctrl-C) during the one-at-a-time run; the batched results are above", file=sys.stderr)
        else:
            print("interrupted (Ctrl-C); generated so far:", file=sys.stderr)
            _print_rows(exc.partial)
        return EXIT_INTERRUPTED
    except WorkbenchError as exc:
        return _fail(str(exc), args.debug)
    finally:
        signal.signal(signal.SIGINT, previous)
    agree = all(a.tokens == b.tokens for a, b in zip(batched, single))
    n_tokens = sum(len(r.tokens) for r in batched)
    summary = {
        "model": engine.model_id or model_label(engine),
        "prompts": len(PROMPTS),
        "generated_tokens": n_tokens,
        "batched_tokens_per_s": round(n_tokens / batch_s, 1),
        "sequential_tokens_per_s": round(n_tokens / single_s, 1),
        "speedup": round(single_s / batch_s, 2),
        "batched_equals_sequential": agree,
    }
    print(json.dumps(summary))
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
