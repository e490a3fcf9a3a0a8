"""workbench.serve under load: 16 concurrent official-client threads vs the same dialogs in-process vs one by one;
with ``--batch-api``, a batch file through ``/v1/batches`` vs the same requests in-process.

On the embedded default (demo) model, one process: the engine's own ``batch_chat_completion`` of 16 tool
dialogs (the ceiling), the same 16 dialogs sent at once by 16 threads of the official ``openai`` client to a
``workbench.serve`` endpoint on 127.0.0.1 (gathered into engine batches), the same with ``stream=true`` (the
streams share engine batch streams), and the same 16 requests sent one after another.  Every contender
generates the same tokens (greedy; the counts are checked equal), so tokens/s compare directly.  Wall clock
(``time.perf_counter``): the server's work happens on other threads of this process.

    OMP_NUM_THREADS=1 python bench/serve.py [--clients 16] [--max-tokens 48] [--repeats 3]

``--batch-api`` (``--requests 512``): the requests as an OpenAI batch file uploaded with the official client
(``files.create``, ``batches.create``, polled with ``batches.retrieve``, output downloaded and parsed) against
one in-process ``batch_chat_completion`` of the same dialogs (the ceiling; the server runs them in chunks of
``batch_rows``, default 8 x max_batch_size).  Then the restart: the same file through a server *process*
(chunks of max_batch_size rows) that is SIGKILLed once half the lines are written, and started again;
counted from the batch record: the lines recovered from disk, the lines computed after the restart, and the
written lines computed twice (0 when nothing finished was recomputed; the chunk in flight at the kill is lost
work until the run store keeps its rows).

    OMP_NUM_THREADS=1 python bench/serve.py --batch-api [--requests 512] [--max-tokens 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

import workbench as wb
from workbench.demo.tools import DEMO_TOOLS
from workbench.formats import coerce_tools
from workbench.serve import serve

QUESTIONS = ["What's the weather in {}?", "Convert 100 USD to {}", "Tell me a joke", "What is the capital of {}?"]
PLACES = ["Paris", "Tokyo", "EUR", "Lima", "Oslo", "JPY", "Cairo", "Rome"]


def dialogs(n: int) -> list[list[dict]]:
    return [
        [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)].format(PLACES[i % len(PLACES)])}] for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-api", action="store_true", help="the Batch API bench (see the docstring)")
    parser.add_argument("--requests", type=int, default=512, help="requests in the batch file (--batch-api)")
    args = parser.parse_args()
    if args.batch_api:
        batch_api(args.requests, args.max_tokens if args.max_tokens != 48 else 16, args.repeats)
        return

    import openai

    engine = wb.load()  # max_batch_size 16: more clients run in waves
    names = ("get_weather", "convert_currency", "get_random_joke", "get_capital")
    tools = [d.to_openai() for d in coerce_tools([DEMO_TOOLS[k] for k in names])]
    rows = dialogs(args.clients)
    srv = serve(engine, port=0)
    client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)

    def ask(dialog: list[dict]) -> object:
        return client.chat.completions.create(model=srv.model, messages=dialog, tools=tools, max_tokens=args.max_tokens)

    def in_process() -> tuple[float, int, list]:
        start = time.perf_counter()
        out = engine.batch_chat_completion(rows, tools, max_tokens=args.max_tokens, progress=False)
        return time.perf_counter() - start, sum(len(r.tokens) for r in out), [r.tokens for r in out]

    def concurrent() -> tuple[float, int, list]:
        replies: dict[int, object] = {}
        threads = [threading.Thread(target=lambda i=i: replies.__setitem__(i, ask(rows[i]))) for i in range(len(rows))]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - start
        return seconds, sum(replies[i].usage.completion_tokens for i in replies), [replies[i] for i in sorted(replies)]

    def ask_stream(dialog: list[dict]) -> int:
        tokens = 0
        for chunk in client.chat.completions.create(
            model=srv.model,
            messages=dialog,
            tools=tools,
            stream=True,
            max_tokens=args.max_tokens,
            stream_options={"include_usage": True},
        ):
            tokens = chunk.usage.completion_tokens if chunk.usage else tokens
        return tokens

    def concurrent_streams() -> tuple[float, int, list]:
        counts: dict[int, int] = {}
        threads = [
            threading.Thread(target=lambda i=i: counts.__setitem__(i, ask_stream(rows[i]))) for i in range(len(rows))
        ]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start, sum(counts.values()), []

    def sequential() -> tuple[float, int, list]:
        start = time.perf_counter()
        out = [ask(d) for d in rows]
        return time.perf_counter() - start, sum(r.usage.completion_tokens for r in out), out

    ask(rows[0])  # warm-up: first-call costs (grammar-free path, HTTP connection pool)
    contenders = {
        "in_process_batch": in_process,
        "served_concurrent": concurrent,
        "served_concurrent_streams": concurrent_streams,
        "served_sequential": sequential,
    }
    best: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, run in contenders.items():
            seconds, count, _ = run()
            rate = count / seconds
            best[name] = max(best.get(name, 0.0), rate)
            tokens[name] = count
    largest = srv.stats.largest_batch
    srv.stop()
    assert len(set(tokens.values())) == 1, f"contenders generated different token counts: {tokens}"

    print(
        f"threads: torch {torch.get_num_threads()}, {args.clients} client threads; demo model, greedy, "
        f"max_tokens={args.max_tokens}, best of {args.repeats}; largest gathered engine batch {largest}"
    )
    for name, rate in best.items():
        print(f"  {name:26s} {rate:8.1f} tokens/s")
    vs_batch = best["served_concurrent"] / best["in_process_batch"]
    vs_seq = best["served_concurrent"] / best["served_sequential"]
    print(f"  served concurrent / in-process batch: {vs_batch:.2f}x (target >= 0.8x)")
    print(f"  served concurrent / served sequential: {vs_seq:.2f}x (target >= 4x)")
    print(
        json.dumps(
            {
                "bench": "serve",
                "clients": args.clients,
                "max_tokens": args.max_tokens,
                "torch_threads": torch.get_num_threads(),
                "tokens": tokens["in_process_batch"],
                **{f"{k}_tokens_per_s": round(v, 1) for k, v in best.items()},
                "concurrent_vs_batch": round(vs_batch, 3),
                "concurrent_vs_sequential": round(vs_seq, 3),
                "largest_batch": largest,
            }
        )
    )


def batch_file(rows: list[list[dict]], tools: list[dict], max_tokens: int) -> bytes:
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": dialog, "tools": tools, "max_tokens": max_tokens},
        }
        for i, dialog in enumerate(rows)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def run_batch(client: object, data: bytes, poll_s: float = 0.2) -> tuple[float, dict, list[dict]]:
    """Upload, create, poll until done (every 0.2 s: a client polling faster takes the GIL from the engine), download:
    (seconds, the final batch, the output lines)."""
    start = time.perf_counter()
    upload = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(poll_s)
        batch = client.batches.retrieve(batch.id)
    lines = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    return time.perf_counter() - start, batch, lines


def server_process(data_dir: str, batch_rows: int) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workbench.serve",
            "--port",
            "0",
            "--data-dir",
            data_dir,
            "--batch-rows",
            str(batch_rows),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, re.search(r"(http://\S+/v1)", proc.stdout.readline()).group(1)


def batch_api(n: int, max_tokens: int, repeats: int) -> None:
    import openai

    engine = wb.load()
    names = ("get_weather", "convert_currency", "get_random_joke", "get_capital")
    tools = [d.to_openai() for d in coerce_tools([DEMO_TOOLS[k] for k in names])]
    # every request distinct (a request number in each): a batch stores its rows, and later chunks would answer a
    # repeated request from the store, which the one in-process call cannot do
    rows = [[{**dialog[0], "content": f"{dialog[0]['content']} (request {i})"}] for i, dialog in enumerate(dialogs(n))]
    data = batch_file(rows, tools, max_tokens)
    with tempfile.TemporaryDirectory() as folder:  # one data folder each: each server runs its own batches
        srv = serve(engine, port=0, data_dir=Path(folder) / "a")  # chunks of 8 x max_batch_size rows (the default)
        whole = serve(engine, port=0, data_dir=Path(folder) / "b", batch_rows=n)  # the file as one engine call
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)
        whole_client = openai.OpenAI(base_url=whole.url, api_key="unused", max_retries=0, timeout=600)
        run_batch(client, batch_file(rows[:8], tools, max_tokens))  # warm-up: first-call costs of the path
        best = {"in_process_batch": float("inf"), "batch_api": float("inf"), "batch_api_one_chunk": float("inf")}
        tokens: dict[str, int] = {}
        timed: list[str] = []

        def in_process() -> None:
            start = time.perf_counter()
            out = engine.batch_chat_completion(rows, tools, max_tokens=max_tokens, progress=False)
            best["in_process_batch"] = min(best["in_process_batch"], time.perf_counter() - start)
            tokens["in_process_batch"] = sum(len(r.tokens) for r in out)

        def through(name: str, api: object) -> None:
            # a batch stores its rows (run="batch:<id>") and the store answers a request from any run that
            # holds it: each timed batch gets an empty store, so it computes every row as in-process does
            os.environ["WORKBENCH_STORE"] = str(Path(folder) / f"runs-{name}-{len(timed)}.sqlite")
            timed.append(name)
            seconds, batch, lines = run_batch(api, data)
            assert batch.request_counts.completed == n, batch
            best[name] = min(best[name], seconds)
            tokens[name] = sum(line["response"]["body"]["usage"]["completion_tokens"] for line in lines)

        contenders = [
            in_process,
            lambda: through("batch_api", client),
            lambda: through("batch_api_one_chunk", whole_client),
        ]
        for repeat in range(repeats):  # rotating which goes first: the machine's load drifts
            for k in range(len(contenders)):
                contenders[(k + repeat) % len(contenders)]()
        largest = srv.stats.largest_batch
        whole.stop()
        srv.stop()
    assert len(set(tokens.values())) == 1, f"different token counts: {tokens}"
    ratio = best["in_process_batch"] / best["batch_api"]
    one_chunk = best["in_process_batch"] / best["batch_api_one_chunk"]

    with tempfile.TemporaryDirectory() as folder:  # the restart: a server process killed mid-batch
        os.environ["WORKBENCH_STORE"] = str(Path(folder) / "runs.sqlite")  # an empty store (the child inherits it)
        proc, url = server_process(folder, engine.max_batch_size)
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
        upload = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
        while client.batches.retrieve(batch.id).request_counts.completed < n // 2:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, url = server_process(folder, engine.max_batch_size)
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
        while (batch := client.batches.retrieve(batch.id)).status != "completed":
            time.sleep(0.05)
        state = batch.model_extra["workbench"]
        proc.terminate()
        proc.wait()
    restart = {
        "lines": n,
        "recovered": state["recovered"],
        "computed_after_restart": n - state["recovered"],
        "written_lines_computed_twice": state["computed"] - n,
        "restarts": state["restarts"],
    }

    print(
        f"threads: torch {torch.get_num_threads()}; demo model, {n} chat requests with tools, greedy, "
        f"max_tokens={max_tokens}, best of {repeats}; largest engine batch {largest}"
    )
    print(
        f"  in-process batch_chat_completion  {best['in_process_batch']:7.2f} s "
        f"({tokens['in_process_batch'] / best['in_process_batch']:.1f} tokens/s)"
    )
    print(
        f"  /v1/batches (upload..download)    {best['batch_api']:7.2f} s "
        f"({tokens['batch_api'] / best['batch_api']:.1f} tokens/s): {ratio:.2f}x in-process (target >= 0.9x)"
    )
    print(
        f"  /v1/batches, --batch-rows {n:<6d}  {best['batch_api_one_chunk']:7.2f} s: {one_chunk:.2f}x in-process "
        "(one engine call: what chunking for interactive requests costs)"
    )
    print(
        f"  restart: killed at {restart['recovered']} of {n} lines written; {restart['computed_after_restart']} "
        f"computed after the restart; written lines computed twice: {restart['written_lines_computed_twice']}"
    )
    print(
        json.dumps(
            {
                "bench": "serve_batch_api",
                "requests": n,
                "max_tokens": max_tokens,
                "torch_threads": torch.get_num_threads(),
                "tokens": tokens["batch_api"],
                "in_process_s": round(best["in_process_batch"], 3),
                "batch_api_s": round(best["batch_api"], 3),
                "batch_api_one_chunk_s": round(best["batch_api_one_chunk"], 3),
                "batch_api_vs_in_process": round(ratio, 3),
                "one_chunk_vs_in_process": round(one_chunk, 3),
                "largest_batch": largest,
                "restart": restart,
            }
        )
    )


if __name__ == "__main__":
    main()
