"""Matplotlib figures of :mod:`workbench.notebook.bench` results (each returns a ``Figure``; ``save=`` writes a PNG).

Figures are built with ``matplotlib.figure.Figure`` rather than ``pyplot``: a returned figure displays
once in a notebook (inline backend), nothing piles up in pyplot's global state, and the same code runs
headless in scripts and CI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure


def _finish(fig: Figure, save: str | Path | None) -> Figure:
    fig.tight_layout()
    if save is not None:
        path = Path(save)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, format="png")
    return fig


def _series(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """One line per quantization mode (and per prompt length when several were measured)."""
    keys = ["mode"] + (["prompt_len"] if frame["prompt_len"].nunique() > 1 else [])
    out = []
    for key, group in frame.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k}={v}" if k == "prompt_len" else str(v) for k, v in zip(keys, key))
        out.append((label, group.sort_values("batch_size")))
    return out


def throughput(frame: pd.DataFrame, *, save: str | Path | None = None, title: str | None = None) -> Figure:
    """Generated tokens/s against batch size (median, error bars from min to max over the repeats), and the
    speed-up over batch size 1 (running the prompts one by one), one line per quantization mode."""
    fig = Figure(figsize=(10, 4))
    rate, gain = fig.subplots(1, 2)
    for label, group in _series(frame):
        x = group["batch_size"]
        yerr = [group["tok_s"] - group["tok_s_min"], group["tok_s_max"] - group["tok_s"]]
        rate.errorbar(x, group["tok_s"], yerr=yerr, marker="o", capsize=3, label=label)
        if group["speedup_vs_batch1"].notna().any():
            gain.plot(x, group["speedup_vs_batch1"], marker="o", label=label)
    for ax in (rate, gain):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
        ax.legend(title="quantization", fontsize=8)
    rate.set_ylabel("generated tokens / s")
    rate.set_title("throughput (median, min–max)")
    gain.axhline(1.0, color="#999", lw=1, ls="--")
    gain.set_ylabel("× tokens/s of batch size 1")
    gain.set_title("speed-up over sequential")
    if title:
        fig.suptitle(title)
    return _finish(fig, save)


def latency(frame: pd.DataFrame, *, save: str | Path | None = None) -> Figure:
    """Time to first token and call latency (p50, p90) against batch size."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for label, group in _series(frame):
        line = ax.plot(group["batch_size"], group["latency_p50_s"], marker="o", label=f"{label} p50")[0]
        ax.plot(group["batch_size"], group["latency_p90_s"], ls="--", color=line.get_color(), label=f"{label} p90")
        ax.plot(group["batch_size"], group["ttft_s"], ls=":", marker="x", color=line.get_color(),
                label=f"{label} first token")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("seconds")
    ax.set_title("latency of one batch call")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, save)


def quantization(frame: pd.DataFrame, *, save: str | Path | None = None) -> Figure:
    """Memory, speed and accuracy of each quantization mode (the frame of ``workbench.notebook.bench.quantization``)."""
    fig = Figure(figsize=(12, 3.6))
    axes = fig.subplots(1, 3)
    modes = [str(m) for m in frame.index]
    colors = [f"C{i}" for i in range(len(modes))]
    axes[0].bar(modes, frame["weights_bytes"] / 2**20, color=colors)
    axes[0].set_ylabel("weights (MiB)")
    axes[0].set_title("memory")
    width = 0.4
    xs = range(len(modes))
    axes[1].bar([x - width / 2 for x in xs], frame["prefill_tok_s"], width, label="prefill")
    axes[1].bar([x + width / 2 for x in xs], frame["decode_tok_s"], width, label="decode")
    axes[1].set_xticks(list(xs), modes)
    axes[1].set_ylabel("tokens / s")
    axes[1].set_title("speed")
    axes[1].legend(fontsize=8)
    axes[2].bar(modes, frame["top1_agreement"], color=colors)
    axes[2].set_ylim(0, 1.05)
    axes[2].set_ylabel("top-1 agreement with none")
    axes[2].set_title("accuracy")
    for ax in axes:
        ax.tick_params(axis="x", rotation=20)
        ax.grid(axis="y", alpha=0.3)
    return _finish(fig, save)


def show(fig: Figure) -> Any:
    """Display a figure in a notebook (what a returned figure does as a cell's last expression)."""
    from IPython.display import display

    return display(fig)


def peers(results: dict[str, dict[str, Any]], *, baseline: str = "workbench", save: str | Path | None = None,
          title: str | None = None) -> Figure:
    """Tokens/s of each contender on the same prompts (the results of ``bench/peers.py``'s ``measure``:
    name -> {"tok_s", "seconds", ...}), with the ``baseline``'s speed-up over each peer written on its bar."""
    names = list(results)
    rates = [float(results[n]["tok_s"]) for n in names]
    fig = Figure(figsize=(6, 3.2))
    ax = fig.add_subplot(1, 1, 1)
    colors = ["#388e3c" if n == baseline else "#9e9e9e" for n in names]
    bars = ax.bar(names, rates, color=colors)
    base = float(results[baseline]["tok_s"]) if baseline in results else None
    for bar, name, rate in zip(bars, names, rates):
        label = f"{rate:.0f} tok/s"
        if name != baseline and base is not None:
            label += f"\n{baseline} {base / rate:.1f}×"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=9)
    ax.set_ylabel("generated tokens/s")
    ax.set_ylim(0, max(rates) * 1.3)
    ax.set_title(title or "the same prompts and weights, greedy")
    return _finish(fig, save)
