"""workbench.serve under load: 16 concurrent official-client threads vs the same dialogs in-process vs one by one.

On the embedded default (demo) model, one process: the engine's own ``batch_chat_completion`` of 16 tool
dialogs (the ceiling), the same 16 dialogs sent at once by 16 threads of the official ``openai`` client to a
``workbench.serve`` endpoint on 127.0.0.1 (gathered into engine batches), the same with ``stream=true`` (the
streams share engine batch streams), and the same 16 requests sent one after another.  Every contender
generates the same tokens (greedy; the counts are checked equal), so tokens/s compare directly.  Wall clock
(``time.perf_counter``): the server's work happens on other threads of this process.

    OMP_NUM_THREADS=1 python bench/serve.py [--clients 16] [--max-tokens 48] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch

import workbench as wb
from workbench.demo.tools import DEMO_TOOLS
from workbench.formats import coerce_tools
from workbench.serve import serve

QUESTIONS = ["What's the weather in {}?", "Convert 100 USD to {}", "Tell me a joke", "What is the capital of {}?"]
PLACES = ["Paris", "Tokyo", "EUR", "Lima", "Oslo", "JPY", "Cairo", "Rome"]


def dialogs(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)].format(PLACES[i % len(PLACES)])}]
            for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

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
        for chunk in client.chat.completions.create(model=srv.model, messages=dialog, tools=tools, stream=True,
                                                    max_tokens=args.max_tokens, stream_options={"include_usage": True}):
            tokens = chunk.usage.completion_tokens if chunk.usage else tokens
        return tokens

    def concurrent_streams() -> tuple[float, int, list]:
        counts: dict[int, int] = {}
        threads = [threading.Thread(target=lambda i=i: counts.__setitem__(i, ask_stream(rows[i])))
                   for i in range(len(rows))]
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
    contenders = {"in_process_batch": in_process, "served_concurrent": concurrent,
                  "served_concurrent_streams": concurrent_streams, "served_sequential": sequential}
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

    print(f"threads: torch {torch.get_num_threads()}, {args.clients} client threads; demo model, greedy, "
          f"max_tokens={args.max_tokens}, best of {args.repeats}; largest gathered engine batch {largest}")
    for name, rate in best.items():
        print(f"  {name:26s} {rate:8.1f} tokens/s")
    vs_batch = best["served_concurrent"] / best["in_process_batch"]
    vs_seq = best["served_concurrent"] / best["served_sequential"]
    print(f"  served concurrent / in-process batch: {vs_batch:.2f}x (target >= 0.8x)")
    print(f"  served concurrent / served sequential: {vs_seq:.2f}x (target >= 4x)")
    print(json.dumps({"bench": "serve", "clients": args.clients, "max_tokens": args.max_tokens,
                      "torch_threads": torch.get_num_threads(), "tokens": tokens["in_process_batch"],
                      **{f"{k}_tokens_per_s": round(v, 1) for k, v in best.items()},
                      "concurrent_vs_batch": round(vs_batch, 3), "concurrent_vs_sequential": round(vs_seq, 3),
                      "largest_batch": largest}))


if __name__ == "__main__":
    main()
