"""``python -m workbench``: the main job on a checkpoint (the embedded default when none is given).

Loads the engine once and runs a small batch of tool dialogs through the tool loop
(:func:`workbench.tools.run_batch`) with the demo tools: each reply is one batched chat completion in the
model's official prompt format, every call the model makes is run and answered, and the loop goes on until
it answers.  It prints the calls, their results and the final answers, then runs the same dialogs one at a
time and batched once more, checks that every transcript agrees, and prints the throughput of both and a JSON
summary line.  The speed-up compares warm runs taken one after the other: the first batched run after loading
runs cold (first allocations, the shared tool prompt not yet in the prefix cache) and used to be the one timed,
against a warm one-at-a-time run.  bench/main_job.py shows why even warm batching is not 6x here: the tool loop
moves the dialogs in rounds, and a round takes as many decode steps as its longest reply (docs/benchmarks.md).
User errors (a bad folder, ``--max-tokens 0``) print one line and exit with status 2 (``--debug`` shows the
traceback); Ctrl-C stops generation at the next decode step.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from typing import Any

from workbench import load, tools
from workbench.demo.tools import convert_currency, get_capital, get_local_time, get_weather
from workbench.engine import model_label
from workbench.errors import GenerationCancelled, WorkbenchError
from workbench.types import Message, Transcript

QUESTIONS = [
    "What's the weather in Paris?",
    "What time is it in Tokyo?",
    "Convert 20 EUR to USD.",
    "What is the capital of Norway?",
    "What's the weather in Paris? Convert 20 EUR to USD.",
    "What's the weather in Oslo?",
]
DEMO_TOOLS = [get_weather, get_local_time, convert_currency, get_capital]

DESCRIPTION = (
    "Run a small batch of tool-calling dialogs through a Llama checkpoint with workbench's engine: the model "
    "calls Python functions (weather, local time, currency, capitals) in its official tool-calling format, "
    "the tool loop runs them and feeds the results back until the model answers. Prints the calls, results "
    "and answers, then runs the same dialogs one at a time, checks that every transcript agrees, and prints "
    "the throughput of both and a JSON summary (tool_calls, answers_with_result, tokens/s, "
    "batched_equals_sequential). Without a checkpoint it runs the embedded default: a tiny Llama 4 demo "
    "model trained to call these tools (not a general language model). For a real model: python -m workbench "
    "/ckpts/Llama3.1-8B-Instruct --model Llama3.1-8B-Instruct --device cuda (or a checkpoints.toml entry name). "
    "'python -m workbench serve [--checkpoint ...] [--port ...]' serves the model as an OpenAI-compatible endpoint; "
    "'python -m workbench batch -i requests.jsonl -o results.jsonl' runs a batch file (OpenAI batch lines in, "
    "vLLM run-batch lines out, resumable); 'python -m workbench runs ls | show | diff | summary | report | tag | "
    "note | rename | rm | export | vacuum' lists, compares and manages the run store (see 'runs --help')."
)
EXIT_USAGE, EXIT_INTERRUPTED = 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + error
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m workbench", description=DESCRIPTION)
    parser.add_argument(
        "checkpoint",
        nargs="?",
        default=None,
        help="checkpoint folder (params.json, consolidated.NN.pth, tokenizer.model) or the name of a "
        "checkpoints.toml entry; default: the embedded default model",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="model id that selects the prompt format, e.g. Llama3.2-3B-Instruct or "
        "Llama-4-Scout-17B-16E-Instruct (default: inferred from params.json)",
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate per reply (default 64)")
    parser.add_argument("--max-turns", type=int, default=3, help="replies per dialog at most (default 3)")
    parser.add_argument("--device", default=None, help="cpu or cuda / cuda:N (default: cpu)")
    parser.add_argument(
        "--model-parallel-size",
        type=int,
        default=None,
        help="ranks to shard the model over (one worker process each; 0 = one per checkpoint shard; default 1)",
    )
    parser.add_argument(
        "--quantization",
        default=None,
        choices=["bf16", "fp8_mixed", "int4_mixed"],
        help="load the weights quantized (default: unquantized)",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for errors")
    return parser


def _serve(argv: list[str]) -> int:
    """``python -m workbench serve``: the same as ``python -m workbench.serve`` (needs the ``serve`` extra)."""
    try:
        from workbench.serve import __main__ as serve_cli  # only this subcommand needs fastapi and uvicorn
    except ImportError as exc:
        return _fail(f"serving needs the serve extra ({exc}); pip install -e '.[serve]'", False)
    return serve_cli.main(argv)


def _batch(argv: list[str]) -> int:
    """``python -m workbench batch -i in.jsonl -o out.jsonl``: a batch file through the engine (vLLM run-batch's
    formats; needs the ``serve`` extra for the request translation)."""
    try:
        from workbench.serve import batch_main  # only this subcommand needs the serve extra
    except ImportError as exc:
        return _fail(f"batch files need the serve extra ({exc}); pip install -e '.[serve]'", False)
    return batch_main.main(argv)


def _runs(argv: list[str]) -> int:
    """``python -m workbench runs ls | show | diff | summary | report | ...``: the run store in plain text."""
    from workbench.runs import cli as runs_cli  # pandas loads only for this subcommand

    return runs_cli.main(argv)


def _fail(message: str, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    one_line = " ".join(str(message).split())
    print(f"python -m workbench: error: {one_line}", file=sys.stderr)
    return EXIT_USAGE


def _print_transcripts(transcripts: list[Transcript]) -> None:
    for number, transcript in enumerate(transcripts, 1):
        question = next((m.content for m in transcript if Message.coerce(m).role == "user"), "")
        print(f"\n[{number}] {question}")
        for message in transcript:
            message = Message.coerce(message)
            if message.role == "assistant":
                for call in message.tool_calls:
                    print(f"    call    {call.tool_name}({', '.join(f'{k}={v!r}' for k, v in call.arguments.items())})")
                if not message.tool_calls:
                    print(f"    answer  {message.content!r}")
            elif message.role == "tool":
                print(f"    result  {message.content!r}")
        print(f"    ended   {transcript.stop_reason}")


def _same(a: list[Any], b: list[Any]) -> bool:
    """Transcripts agree when every message does (call ids are fresh per run, so they are not compared)."""

    def key(m: Any) -> tuple[Any, ...]:
        m = Message.coerce(m)
        return m.role, m.content, [(c.tool_name, c.arguments) for c in m.tool_calls]

    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b))


def tool_calls_run(transcript: list[Any]) -> int:
    """Calls the model made that the loop ran (each answered by a tool message)."""
    return sum(1 for m in transcript if Message.coerce(m).role == "tool")


def answers_with_result(transcript: Transcript) -> bool:
    """The dialog ended in an answer that restates every result its tools returned."""
    results = [str(Message.coerce(m).content) for m in transcript if Message.coerce(m).role == "tool"]
    if transcript.stop_reason != "answered" or not results:
        return False
    answer = str(Message.coerce(transcript[-1]).content)
    return all(result in answer for result in results)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # python -m workbench serve [...]: the OpenAI-compatible endpoint
        return _serve(argv[1:])
    if argv[:1] == ["batch"]:  # python -m workbench batch -i in.jsonl -o out.jsonl: a batch file, no server
        return _batch(argv[1:])
    if argv[:1] == ["runs"]:  # python -m workbench runs ls | show NAME | diff A B | ...: the run store
        return _runs(argv[1:])
    args = build_parser().parse_args(argv)

    if args.max_tokens < 1:
        return _fail(f"--max-tokens must be at least 1, got {args.max_tokens}", args.debug)
    if args.max_turns < 1:
        return _fail(f"--max-turns must be at least 1, got {args.max_turns}", args.debug)
    try:
        engine = load(
            args.checkpoint,
            model=args.model,
            device=args.device,
            model_parallel_size=args.model_parallel_size,
            quantization=args.quantization,
        )
    except WorkbenchError as exc:
        return _fail(str(exc), args.debug)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C) while loading", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"model: {model_label(engine)}")
    print(engine)
    dialogs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    settings = dict(max_turns=args.max_turns, max_tokens=args.max_tokens, temperature=0.0)
    previous = signal.signal(signal.SIGINT, lambda signum, frame: engine.cancel())
    batched: list[Transcript] = []
    try:
        start = time.perf_counter()
        batched = tools.run_batch(engine, dialogs, DEMO_TOOLS, **settings)
        first_s = time.perf_counter() - start  # cold: the first calls after loading
        _print_transcripts(batched)
        start = time.perf_counter()
        single = [tools.run(engine, d, DEMO_TOOLS, **settings) for d in dialogs]
        single_s = time.perf_counter() - start
        start = time.perf_counter()
        again = tools.run_batch(engine, dialogs, DEMO_TOOLS, **settings)  # warm, as the one-at-a-time run was
        batch_s = time.perf_counter() - start
    except GenerationCancelled as exc:
        if batched:  # already printed: Ctrl-C came during the timed runs after it
            print("interrupted (Ctrl-C) during the timing runs; the batched transcripts are above", file=sys.stderr)
        else:
            print("interrupted (Ctrl-C); the transcripts so far:", file=sys.stderr)
            _print_transcripts(exc.transcripts)
        return EXIT_INTERRUPTED
    except WorkbenchError as exc:
        return _fail(str(exc), args.debug)
    finally:
        signal.signal(signal.SIGINT, previous)
    agree = all(_same(a, b) and _same(a, c) for a, b, c in zip(batched, single, again))
    n_tokens = sum(t.generated_tokens for t in batched)
    print(
        f"\nbatched: {n_tokens} tokens in {batch_s:.2f} s ({n_tokens / batch_s:.1f} tok/s; the first, cold run "
        f"{first_s:.2f} s); one dialog at a time: {single_s:.2f} s ({n_tokens / single_s:.1f} tok/s); "
        f"transcripts agree: {agree}"
    )
    summary = {
        "model": engine.model_id or model_label(engine),
        "prompts": len(dialogs),
        "tool_calls": sum(tool_calls_run(t) for t in batched),
        "answers_with_result": sum(answers_with_result(t) for t in batched),
        "generated_tokens": n_tokens,
        "batched_tokens_per_s": round(n_tokens / batch_s, 1),
        "sequential_tokens_per_s": round(n_tokens / single_s, 1),
        "speedup": round(single_s / batch_s, 2),
        "batched_first_s": round(first_s, 2),
        "batched_equals_sequential": agree,
    }
    print(json.dumps(summary))
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
