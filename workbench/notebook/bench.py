"""Notebook-level measurements.  ``throughput``: tokens/s against batch size and prompt length;
``quantization``: what each quantization mode costs and gains.  :mod:`workbench.notebook.plots` draws both.

A researcher toggles quantization to make a model fit; before trusting the numbers that come out they
need to see, on their own prompts, how far each mode moves the model from the unquantized one and
what it buys in memory and speed.  :func:`quantization` measures all modes on one engine, one model
resident at a time (it toggles ``engine.set_quantization`` and restores the original mode).

One definition of each speed, in both functions (and in ``bench/``):

* **prefill** (``prefill_tok_s``): prompt tokens / the wall time of a call that generates one token per
  row (``ttft_s``, time to first token: the prompts' forward pass plus one sampling step);
* **decode** (``decode_tok_s``): the tokens after the first of each row / the time the full call takes
  beyond that prefill;
* **equal work**: timed calls ignore stop tokens (a stop token is kept as an ordinary token), so every row
  generates exactly ``max_tokens`` tokens in every mode and at every batch size — a mode that happens to
  stop early is not "faster".  ``generated_tokens`` shows the count.

Accuracy is measured against the unquantized model (mode None) on the reply each prompt gets: the
positions that predict the unquantized model's greedy continuation (and the token after it), so a
prompt may be a whole tool dialog (``engine.formatter.encode_dialog(...)``) without its system prompt
counting:

* ``top1_agreement``: fraction of those positions whose most likely next token is the same (``positions``
  of them; the interval treats positions as independent, which they are not: read it as a lower bound
  on the uncertainty);
* ``mean_kl``: mean over those positions of KL(p_unquantized || p_mode) of the next-token distributions
  (nats);
* ``greedy_match``: fraction of the unquantized greedy tokens a greedy run reproduces before it first
  diverges (after a divergence the two continuations condition on different text, so later
  positions are not comparable);
* ``same_reply``: fraction of prompts whose whole greedy reply equals the unquantized one (``rows`` of
  them, with a 95% Wilson interval) — for tool dialogs: the same calls with the same arguments.

``load_s``: the ``engine.set_quantization(mode)`` call that switched to the mode (re-load from the
checkpoint and quantize; ~0 for mode None, which is already loaded as the reference).
Memory: ``weights_bytes`` from ``engine.memory()`` (all ranks; quantized buffers, scales and zeros
included) and its ratio to mode None; ``packed_bytes``: the extra copy a CPU kernel keeps of a float32
weight (the output projection's oneDNN-packed copy, ``ColumnParallel.pack_for_cpu``; 0 in the bfloat16 and
quantized modes), so ``resident_bytes`` = weights + packed copies is what the weights really occupy, and
``resident_ratio`` its ratio to mode None's; ``quantized_vs_bf16``: bytes of the quantized modules (scales
included) over what they take in bfloat16 — the part of the model quantization actually shrinks;
``by_part``: per module kind, what is stored in which type (:func:`memory_table` lays it out).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from workbench.engine.engine import Engine
from workbench.errors import InputError
from workbench.generation import SamplingParams
from workbench.progress import progress_bar
from workbench.reports import human_bytes, stored_types, wilson_interval
from workbench.session import build_engine

DEFAULT_MODES: tuple[str | None, ...] = (None, "bf16", "fp8_mixed", "int4_mixed")


THROUGHPUT_COLUMNS = (
    "mode",
    "prompt_len",
    "batch_size",
    "repeats",
    "generated_tokens",
    "total_s",
    "total_s_min",
    "total_s_max",
    "tok_s",
    "tok_s_min",
    "tok_s_max",
    "prefill_tok_s",
    "decode_tok_s",
    "ttft_s",
    "latency_p50_s",
    "latency_p90_s",
    "speedup_vs_batch1",
)


def synthetic_prompts(engine: Engine, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` distinct prompts of exactly ``length`` token ids (BOS + ordinary tokens, deterministic)."""
    return _random_prompts(engine, [length] * n, seed)


def _random_prompts(engine: Any, lengths: Sequence[int], seed: int) -> list[list[int]]:
    """Prompts of the given lengths (BOS + random ordinary tokens).  Prompts from different seeds share
    nothing but BOS, so no call reuses the keys/values an earlier call left resident: every timed call
    prefills its prompts whole (the engine reuses shared prefixes across calls, which would time a cache)."""
    gen = torch.Generator().manual_seed(seed)
    bos = engine.tokenizer.encode("", bos=True)
    low, high = 1000, min(engine.args.vocab_size, bos[0], 100_000)
    return [bos + torch.randint(low, high, (length - len(bos),), generator=gen).tolist() for length in lengths]


def fixed_length_run(engine: Any, prompts: list[list[int]], max_tokens: int) -> list[Any]:
    """Greedy generation of exactly ``max_tokens`` tokens for every prompt (stop tokens are kept as ordinary
    tokens): the same work whatever the model writes — what a timing must compare."""
    params = dataclasses.replace(SamplingParams.create(max_tokens=max_tokens, temperature=0.0), ignore_stop_tokens=True)
    return engine.generate_tokens(prompts, params, progress=False)


def throughput(
    engine: Engine,
    *,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    prompt_lens: Sequence[int] = (32,),
    max_tokens: int = 32,
    repeats: int = 3,
    warmup: int = 1,
    modes: Sequence[str | None] | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Tokens per second of batched generation for every (mode, prompt length, batch size): one row each.

    Each cell is measured after ``warmup`` untimed calls, ``repeats`` times (medians, with min/max as the
    spread — on a shared machine a single timing can make batching look slower than it is).  Every row
    generates exactly ``max_tokens`` tokens (stop tokens ignored: equal work in every cell and mode;
    ``generated_tokens`` = batch size x ``max_tokens``); the speeds are defined in the module doc:

    * ``tok_s``: generated tokens per second of the whole call (``tok_s_min``/``tok_s_max``: spread);
    * ``ttft_s`` / ``prefill_tok_s``: the same prompts with ``max_tokens=1`` (time to first token, prompt
      tokens per second);
    * ``decode_tok_s``: tokens after the first per second of the time beyond that prefill;
    * ``latency_p50_s`` / ``latency_p90_s``: percentiles of the call's wall time over the repeats (interpolated:
      with a few repeats p90 is close to their max, so ``total_s_min``/``total_s_max`` say more);
    * ``speedup_vs_batch1``: ``tok_s`` over the batch-size-1 row of the same mode and prompt length (the
      gain over running the prompts one by one; needs 1 in ``batch_sizes``).

    ``modes``: quantization modes to measure (the engine is switched and restored afterwards; default:
    only the current mode).
    """
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
                fresh = _seeds(prompt_len, batch)  # new prompts for every call: nothing resident is reused
                for _ in range(warmup):
                    fixed_length_run(engine, _random_prompts(engine, [prompt_len] * batch, next(fresh)), max_tokens)
                firsts, totals, generated = [], [], []
                for _ in range(repeats):
                    seconds, _ = _timed(engine, _random_prompts(engine, [prompt_len] * batch, next(fresh)), 1)
                    firsts.append(seconds)
                    seconds, tokens = _timed(
                        engine, _random_prompts(engine, [prompt_len] * batch, next(fresh)), max_tokens
                    )
                    totals.append(seconds)
                    generated.append(tokens)
                total, first, tokens = float(np.median(totals)), float(np.median(firsts)), int(np.median(generated))
                rates = [g / t for g, t in zip(generated, totals)]
                rows.append(
                    {
                        "mode": mode or "none",
                        "prompt_len": prompt_len,
                        "batch_size": batch,
                        "repeats": repeats,
                        "generated_tokens": tokens,
                        "total_s": total,
                        "total_s_min": min(totals),
                        "total_s_max": max(totals),
                        "tok_s": float(np.median(rates)),
                        "tok_s_min": min(rates),
                        "tok_s_max": max(rates),
                        "prefill_tok_s": batch * prompt_len / first,
                        "ttft_s": first,
                        "decode_tok_s": _decode_rate(tokens, batch, total, first),
                        "latency_p50_s": float(np.percentile(totals, 50)),
                        "latency_p90_s": float(np.percentile(totals, 90)),
                    }
                )
                bar.update(1)
    finally:
        if engine.settings.quantization != original:
            engine.set_quantization(original, progress=False)
    frame = pd.DataFrame(rows)
    base = frame[frame["batch_size"] == 1].set_index(["mode", "prompt_len"])["tok_s"]
    frame["speedup_vs_batch1"] = [base.get((m, p), float("nan")) for m, p in zip(frame["mode"], frame["prompt_len"])]
    frame["speedup_vs_batch1"] = frame["tok_s"] / frame["speedup_vs_batch1"]
    return frame[list(THROUGHPUT_COLUMNS)]


def _seeds(*key: int) -> Any:
    """Endless distinct seeds for one measurement cell (deterministic, different for every ``key``)."""
    base = hash(key) % 2**31
    return iter(range(base, base + 2**20))


def _decode_rate(tokens: int, rows: int, total_s: float, prefill_s: float) -> float:
    """Tokens after each row's first, per second of the call beyond its prefill (the module doc's decode)."""
    return max(tokens - rows, 0) / max(total_s - prefill_s, 1e-9)


def quantization(
    engine_or_settings: Any,
    prompts: Sequence[str | Sequence[int]],
    *,
    modes: Sequence[str | None] = DEFAULT_MODES,
    max_tokens: int = 32,
    repeats: int = 1,
    progress: bool | None = None,
) -> pd.DataFrame:
    """One row per mode: memory, speed, and accuracy against the unquantized model (see module doc).

    ``engine_or_settings``: a loaded :class:`~workbench.engine.engine.Engine` (toggled through ``modes`` and
    restored to its mode afterwards) or a :class:`~workbench.config.Settings` (loaded here and freed
    afterwards).  ``prompts``: strings (encoded with BOS) or token-id lists — e.g. tool dialogs rendered by
    ``engine.formatter.encode_dialog(messages, tools=...)``.  ``repeats``: each speed is the median of this
    many timed runs, with their min–max spread in ``prefill_tok_s_min``/``_max`` and ``decode_tok_s_min``/
    ``_max`` (use 3+ on a shared machine; :func:`throughput` reports its speeds the same way).
    ``progress``: a bar over the modes (None: shown once the call takes a couple of seconds).
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


class MemoryTable(pd.DataFrame):
    """:func:`memory_table`'s frame: a DataFrame that displays every cell whole.  pandas cuts a displayed cell
    at 50 characters, and the cells that matter most are the long ones: a part stored in several types (under
    fp8_mixed the routed experts of the first and last MoE layers stay bfloat16 beside the fp8 ones)."""

    @property
    def _constructor(self) -> type[MemoryTable]:
        return MemoryTable

    def __repr__(self) -> str:
        with pd.option_context("display.max_colwidth", None, "display.max_columns", None):
            return super().__repr__()

    def _repr_html_(self) -> str | None:
        with pd.option_context("display.max_colwidth", None, "display.max_columns", None):
            return super()._repr_html_()


def memory_table(table: pd.DataFrame) -> MemoryTable:
    """What each part of the model is stored as under each mode: one row per part (embedding, attention,
    feed_forward, routed_experts, ..., output), one column per mode of a :func:`quantization` table, each
    cell ``"bfloat16 37.0 MiB"`` (or ``"int4 1.1 MiB + bfloat16 scales 0.1 MiB"``; every type a part is
    stored in, none cut from the display).  Then ``weights`` (their sum), and where the table has
    ``packed_bytes``: the CPU kernel's packed float32 copy of the output projection and ``total``, what the
    weights occupy with it (``resident_bytes``); without it ``total`` is the weights."""
    parts = list(dict.fromkeys(kind for by_part in table["by_part"] for kind in by_part))
    out = pd.DataFrame(index=pd.Index(parts, name="part"))
    for mode, by_part in zip(table.index, table["by_part"]):
        out[mode] = [stored_types(by_part.get(part, {})) for part in parts]
    sums = {"weights": {mode: human_bytes(n) for mode, n in zip(table.index, table["weights_bytes"])}}
    if "packed_bytes" in table.columns:
        sums["output: CPU packed copy"] = {
            mode: f"float32 {human_bytes(n)}" if n else "-" for mode, n in zip(table.index, table["packed_bytes"])
        }
        sums["total"] = {mode: human_bytes(n) for mode, n in zip(table.index, table["resident_bytes"])}
    else:
        sums["total"] = sums.pop("weights")
    return MemoryTable(pd.concat([out, pd.DataFrame(list(sums.values()), index=pd.Index(list(sums), name="part"))]))


def _measure(
    engine: Engine,
    prompts: Sequence[str | Sequence[int]],
    modes: list[str | None],
    max_tokens: int,
    repeats: int,
    progress: bool | None = None,
) -> pd.DataFrame:
    with progress_bar(len(modes), desc="quantization modes", unit="mode", progress=progress) as bar:
        return _measure_modes(engine, prompts, modes, max_tokens, repeats, bar)


def _reply_logprobs(engine: Engine, sequences: list[list[int]], starts: list[int]) -> list[torch.Tensor]:
    """Log-softmax of the logits at the reply's positions, ``[len - start, V]`` per sequence.  One sequence
    at a time: full logits are float32 ``[len, vocab]`` (0.5 GB for a 600-token tool prompt at 202k)."""
    return [torch.log_softmax(engine.logits([seq])[0][start:], dim=-1) for seq, start in zip(sequences, starts)]


def _measure_modes(
    engine: Engine,
    prompts: Sequence[str | Sequence[int]],
    modes: list[str | None],
    max_tokens: int,
    repeats: int,
    bar: Any,
) -> pd.DataFrame:
    encoded = [engine.tokenizer.encode(p, bos=True) if isinstance(p, str) else list(p) for p in prompts]
    engine.set_quantization(None, progress=False)
    ref_runs = engine.batch_completion(encoded, max_tokens=max_tokens, temperature=0.0, progress=False)
    sequences = [p + r.tokens for p, r in zip(encoded, ref_runs)]
    starts = [len(p) - 1 for p in encoded]  # the position that predicts the reply's first token, and on
    ref_logprobs = _reply_logprobs(engine, sequences, starts)  # [n_i, V] each
    baseline = engine.memory()
    baseline_bytes = baseline["weights_bytes"]
    baseline_resident = baseline_bytes + baseline.get("packed_bytes", 0)
    lengths = [len(p) for p in encoded]
    prompt_tokens = sum(lengths)
    rows = []
    for mode in modes:
        bar.set_postfix_str(mode or "none", refresh=False)
        start = time.perf_counter()
        engine.set_quantization(mode, progress=False)
        load_s = time.perf_counter() - start
        memory = engine.memory()
        # speed on fresh prompts of the same lengths (nothing resident reused; the module doc's definitions)
        fresh = _seeds(len(encoded), *lengths)
        fixed_length_run(engine, _random_prompts(engine, lengths[:2], next(fresh)), 2)  # warm-up
        prefills = [_timed(engine, _random_prompts(engine, lengths, next(fresh)), 1)[0] for _ in range(repeats)]
        timed = [_timed(engine, _random_prompts(engine, lengths, next(fresh)), max_tokens) for _ in range(repeats)]
        prefill_s = float(np.median(prefills))
        generated = int(np.median([tokens for _, tokens in timed]))  # tokens the timed calls generated
        decodes = [_decode_rate(tokens, len(encoded), total, prefill_s) for total, tokens in timed]
        runs = fixed_length_run(engine, encoded, max_tokens)  # fidelity: the given prompts
        agree = positions = 0
        kl_sum = 0.0
        for ref, logq in zip(ref_logprobs, _reply_logprobs(engine, sequences, starts)):
            kl_sum += float((ref.exp() * (ref - logq)).sum())
            agree += int((ref.argmax(-1) == logq.argmax(-1)).sum())
            positions += ref.shape[0]
        # greedy runs of equal length: up to the reference's end they are what a normal run writes
        matched = [_prefix_match(r.tokens, q.tokens) for r, q in zip(ref_runs, runs)]
        same = sum(m == len(r.tokens) and _ends_alike(r, q, engine) for m, r, q in zip(matched, ref_runs, runs))
        low, high = wilson_interval(same, len(encoded))
        packed = memory.get("packed_bytes", 0)
        rows.append(
            {
                "mode": mode or "none",
                "weights_bytes": memory["weights_bytes"],
                "weights_ratio": memory["weights_bytes"] / baseline_bytes,
                "packed_bytes": packed,
                "resident_bytes": memory["weights_bytes"] + packed,
                "resident_ratio": (memory["weights_bytes"] + packed) / baseline_resident,
                "quantized_bytes": memory.get("quantized_bytes", 0),
                "scale_bytes": memory.get("scale_bytes", 0),
                "quantized_vs_bf16": (
                    (memory.get("quantized_bytes", 0) + memory.get("scale_bytes", 0)) / memory["quantized_bf16_bytes"]
                )
                if memory.get("quantized_bf16_bytes")
                else None,
                "kernels": ",".join(sorted(memory.get("by_kernel", {}))) or "-",
                "by_part": memory.get("by_part", {}),
                "load_s": load_s,
                "prompt_tokens": prompt_tokens,
                "generated_tokens": generated,
                "repeats": repeats,
                "prefill_tok_s": prompt_tokens / prefill_s,
                "prefill_tok_s_min": prompt_tokens / max(prefills),
                "prefill_tok_s_max": prompt_tokens / min(prefills),
                "decode_tok_s": float(np.median(decodes)),
                "decode_tok_s_min": min(decodes),
                "decode_tok_s_max": max(decodes),
                "positions": positions,
                "top1_agreement": agree / positions,
                "mean_kl": kl_sum / positions,
                "greedy_match": sum(matched) / max(sum(len(r.tokens) for r in ref_runs), 1),
                "rows": len(encoded),
                "same_reply": same / len(encoded),
                "same_reply_low": low,
                "same_reply_high": high,
            }
        )
        bar.update(1)
    return pd.DataFrame(rows).set_index("mode")


def _ends_alike(ref: Any, run: Any, engine: Any) -> bool:
    """Whether a fixed-length ``run`` ends its reply where the reference did: the reference stopped on a
    stop token and the run wrote one there too, or both ran out of tokens."""
    if ref.stop_reason == "out_of_tokens":
        return len(run.tokens) >= len(ref.tokens)
    return len(run.tokens) > len(ref.tokens) and run.tokens[len(ref.tokens)] in engine.tokenizer.stop_tokens


def _timed(engine: Any, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    """Wall seconds of :func:`fixed_length_run` and the tokens it generated (counted, not assumed: a row whose
    context fills stops short)."""
    start = time.perf_counter()
    results = fixed_length_run(engine, prompts, max_tokens)
    return time.perf_counter() - start, sum(len(r.tokens) for r in results)


def _prefix_match(reference: list[int], other: list[int]) -> int:
    """Number of leading tokens ``other`` shares with ``reference``."""
    n = 0
    for a, b in zip(reference, other):
        if a != b:
            break
        n += 1
    return n
