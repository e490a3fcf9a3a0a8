"""Notebook-level measurements.  ``throughput``: tokens/s against batch size and prompt length;
``quantization``: what each quantization mode costs and gains.  :mod:`workbench.notebook.plots` draws both.

A researcher toggles quantization to make a model fit; before trusting the numbers that come out they
need to see, on their own prompts, how far each mode moves the model from the unquantized one and
what it buys in memory and speed.  :func:`quantization` measures all modes on one engine, one model
resident at a time (it toggles ``engine.set_quantization`` and restores the original mode).

Accuracy is measured against the unquantized model (mode None) on the same token sequences — each
prompt followed by the unquantized model's own greedy continuation, so positions the model generated
are scored too:

* ``top1_agreement``: fraction of positions whose most likely next token is the same;
* ``mean_kl``: mean over positions of KL(p_unquantized || p_mode) of the next-token distributions
  (nats);
* ``greedy_match``: fraction of the unquantized greedy tokens a greedy run reproduces before it first
  diverges (after a divergence the two continuations condition on different text, so later
  positions are not comparable).

Speed: ``prefill_tok_s`` (teacher-forced scoring of all sequences in one batch) and ``decode_tok_s``
(generated tokens per second of ``batch_completion`` over all prompts), after one warm-up call.
``load_s``: the ``engine.set_quantization(mode)`` call that switched to the mode (re-load from the
checkpoint and quantize; ~0 for mode None, which is already loaded as the reference).
Memory: ``weights_bytes`` from ``engine.memory()`` (all ranks; quantized buffers, scales and zeros
included) and its ratio to mode None; ``quantized_vs_bf16``: bytes of the quantized modules (scales
included) over what they take in bfloat16 — the part of the model quantization actually shrinks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from workbench.engine.engine import Engine
from workbench.errors import InputError
from workbench.progress import progress_bar
from workbench.session import build_engine

DEFAULT_MODES: tuple[str | None, ...] = (None, "bf16", "fp8_mixed", "int4_mixed")


THROUGHPUT_COLUMNS = (
    "mode", "prompt_len", "batch_size", "repeats", "generated_tokens", "total_s", "total_s_min", "total_s_max",
    "tok_s", "tok_s_min", "tok_s_max", "prefill_tok_s", "decode_tok_s", "ttft_s", "latency_p50_s",
    "latency_p90_s", "speedup_vs_batch1",
)


def synthetic_prompts(engine: Engine, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` distinct prompts of exactly ``length`` token ids (BOS + ordinary tokens, deterministic)."""
    gen = torch.Generator().manual_seed(seed)
    bos = engine.tokenizer.encode("", bos=True)
    low, high = 1000, min(engine.args.vocab_size, engine.tokenizer.encode("", bos=True)[0], 100_000)
    return [bos + torch.randint(low, high, (length - len(bos),), generator=gen).tolist() for _ in range(n)]


def throughput(engine: Engine, *, batch_sizes: Sequence[int] = (1, 2, 4, 8), prompt_lens: Sequence[int] = (32,),
               max_tokens: int = 32, repeats: int = 3, warmup: int = 1, modes: Sequence[str | None] | None = None,
               progress: bool | None = None) -> pd.DataFrame:
    """Tokens per second of ``batch_completion`` for every (mode, prompt length, batch size): one row each.

    Each cell is measured after ``warmup`` untimed calls, ``repeats`` times (medians, with min/max as the
    spread — on a shared machine a single timing can make batching look slower than it is):

    * ``tok_s``: generated tokens per second of the whole call (``tok_s_min``/``tok_s_max``: spread);
    * ``ttft_s`` / ``prefill_tok_s``: the same prompts with ``max_tokens=1`` (time to first token, prompt
      tokens per second);
    * ``decode_tok_s``: tokens after the first per second of the time beyond that prefill;
    * ``latency_p50_s`` / ``latency_p90_s``: percentiles of the call's wall time over the repeats;
    * ``speedup_vs_batch1``: ``tok_s`` over the batch-size-1 row of the same mode and prompt length (the
      gain over running the prompts one by one; needs 1 in ``batch_sizes``).

    Greedy decoding of ``max_tokens`` tokens per row (rows that hit a stop token end early; the counts
    use the tokens really generated).  ``modes``: quantization modes to measure (the engine is switched
    and restored afterwards; default: only the current mode).
    """
    import numpy as np

    if warmup < 0 or repeats < 1:

        raise InputError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    original = engine.settings.quantization
    modes = [original] if modes is None else list(modes)
    cells = [(m, p, b) for m in modes for p in prompt_lens for b in batch_sizes]
    rows = []

    try:
        with progress_bar(len(cells), desc="throughput", unit="cell", progress=progress) as bar:
            for mode, prompt_len, batch in cells:
                if engine.settings.quantization != mode:
                    engine.set_quantization(mode, progress=False)
                bar.set_postfix_str(f"{mode or 'none'} len={prompt_len} batch={batch}", refresh=False)
                prompts = synthetic_prompts(engine, batch, prompt_len, seed=prompt_len)
                run = lambda n, p=prompts: engine.batch_completion(p, max_tokens=n, temperature=0.0, progress=False)
                for _ in range(warmup):
                    run(max_tokens)
                firsts, totals, generated = [], [], []
                for _ in range(repeats):
                    start = time.perf_counter()
                    run(1)
                    firsts.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    results = run(max_tokens)
                    totals.append(time.perf_counter() - start)
                    generated.append(sum(len(r.tokens) for r in results))
                total, first, tokens = float(np.median(totals)), float(np.median(firsts)), int(np.median(generated))
                rates = [g / t for g, t in zip(generated, totals)]
                rows.append({
                    "mode": mode or "none", "prompt_len": prompt_len, "batch_size": batch, "repeats": repeats,
                    "generated_tokens": tokens, "total_s": total, "total_s_min": min(totals),
                    "total_s_max": max(totals), "tok_s": float(np.median(rates)), "tok_s_min": min(rates),
                    "tok_s_max": max(rates), "prefill_tok_s": batch * prompt_len / first, "ttft_s": first,
                    "decode_tok_s": max(tokens - batch, 0) / max(total - first, 1e-9),
                    "latency_p50_s": float(np.percentile(totals, 50)),
                    "latency_p90_s": float(np.percentile(totals, 90)),
                })
                bar.update(1)
    finally:
        if engine.settings.quantization != original:
            engine.set_quantization(original, progress=False)
    frame = pd.DataFrame(rows)
    base = frame[frame["batch_size"] == 1].set_index(["mode", "prompt_len"])["tok_s"]
    frame["speedup_vs_batch1"] = [base.get((m, p), float("nan")) for m, p in zip(frame["mode"], frame["prompt_len"])]
    frame["speedup_vs_batch1"] = frame["tok_s"] / frame["speedup_vs_batch1"]
    return frame[list(THROUGHPUT_COLUMNS)]


def quantization(engine_or_settings: Any, prompts: Sequence[str | Sequence[int]], *,
                 modes: Sequence[str | None] = DEFAULT_MODES, max_tokens: int = 32,
                 repeats: int = 1, progress: bool | None = None) -> pd.DataFrame:
    """One row per mode: memory, speed, and accuracy against the unquantized model (see module doc).

    ``engine_or_settings``: a loaded :class:`~workbench.engine.engine.Engine` (toggled through ``modes`` and
    restored to its mode afterwards) or a :class:`~workbench.config.Settings` (loaded here and freed
    afterwards).  ``prompts``: strings (encoded with BOS) or token-id lists.  ``repeats``: each
    timing is the best of this many runs (use 3+ on a shared machine).  ``progress``: a bar over the
    modes (None: shown once the call takes a couple of seconds).
    """

    if isinstance(engine_or_settings, Engine):
        engine, owned = engine_or_settings, False
    else:

        engine, owned = build_engine(engine_or_settings), True
    original = engine.settings.quantization
    try:
        return _measure(engine, prompts, list(modes), max_tokens, max(int(repeats), 1), progress)
    finally:
        if owned:
            engine.close()
        else:
            engine.set_quantization(original, progress=False)


def _measure(engine: Engine, prompts: Sequence[str | Sequence[int]], modes: list[str | None], max_tokens: int,
             repeats: int, progress: bool | None = None) -> pd.DataFrame:

    with progress_bar(len(modes), desc="quantization modes", unit="mode", progress=progress) as bar:
        return _measure_modes(engine, prompts, modes, max_tokens, repeats, bar)


def _measure_modes(engine: Engine, prompts: Sequence[str | Sequence[int]], modes: list[str | None], max_tokens: int,
                   repeats: int, bar: Any) -> pd.DataFrame:
    encoded = [engine.tokenizer.encode(p, bos=True) if isinstance(p, str) else list(p) for p in prompts]
    engine.set_quantization(None, progress=False)
    ref_runs = engine.batch_completion(encoded, max_tokens=max_tokens, temperature=0.0, progress=False)
    sequences = [p + r.tokens for p, r in zip(encoded, ref_runs)]
    ref_logprobs = [torch.log_softmax(lg, dim=-1) for lg in engine.logits(sequences)]  # [T, V] each
    baseline_bytes = engine.memory()["weights_bytes"]
    rows = []
    for mode in modes:
        bar.set_postfix_str(mode or "none", refresh=False)
        start = time.perf_counter()
        engine.set_quantization(mode, progress=False)
        load_s = time.perf_counter() - start
        memory = engine.memory()
        engine.batch_completion(encoded[:2], max_tokens=2, progress=False)  # warm-up (kernel selection, allocator)
        logits, prefill_s = _best_of(repeats, lambda: engine.logits(sequences))
        decode = lambda: engine.batch_completion(encoded, max_tokens=max_tokens, temperature=0.0, progress=False)
        runs, decode_s = _best_of(repeats, decode)
        agree = positions = 0
        kl_sum = 0.0
        for ref, lg in zip(ref_logprobs, logits):
            logq = torch.log_softmax(lg, dim=-1)  # [T, V]
            kl_sum += float((ref.exp() * (ref - logq)).sum())
            agree += int((ref.argmax(-1) == lg.argmax(-1)).sum())
            positions += ref.shape[0]
        matched = sum(_prefix_match(r.tokens, q.tokens) for r, q in zip(ref_runs, runs))
        generated = sum(len(q.tokens) for q in runs)
        rows.append({
            "mode": mode or "none",
            "weights_bytes": memory["weights_bytes"],
            "weights_ratio": memory["weights_bytes"] / baseline_bytes,
            "quantized_bytes": memory.get("quantized_bytes", 0),
            "scale_bytes": memory.get("scale_bytes", 0),
            "quantized_vs_bf16": ((memory.get("quantized_bytes", 0) + memory.get("scale_bytes", 0))
                                  / memory["quantized_bf16_bytes"]) if memory.get("quantized_bf16_bytes") else None,
            "kernels": ",".join(sorted(memory.get("by_kernel", {}))) or "-",
            "load_s": load_s,
            "prefill_tok_s": sum(len(s) for s in sequences) / prefill_s,
            "decode_tok_s": generated / decode_s,
            "top1_agreement": agree / positions,
            "mean_kl": kl_sum / positions,
            "greedy_match": matched / max(sum(len(r.tokens) for r in ref_runs), 1),
        })
        bar.update(1)
    return pd.DataFrame(rows).set_index("mode")


def _best_of(repeats: int, run: Any) -> tuple[Any, float]:
    """``run()``'s result and its shortest wall time over ``repeats`` calls."""
    best = float("inf")
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return result, best


def _prefix_match(reference: list[int], other: list[int]) -> int:
    """Number of leading tokens ``other`` shares with ``reference``."""
    n = 0
    for a, b in zip(reference, other):
        if a != b:
            break
        n += 1
    return n
