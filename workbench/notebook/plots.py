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


def _finish(fig: Figure, save: str | Path | None, *, layout: bool = True) -> Figure:
    if layout:
        fig.tight_layout()
    if save is not None:
        path = Path(save)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, format="png")
    return fig


def _series(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame, dict[str, Any]]]:
    """One line per quantization mode (and per prompt length when several were measured): a colour per mode,
    a line style per prompt length, so a reader can tell the two apart at a glance."""
    keys = ["mode"] + (["prompt_len"] if frame["prompt_len"].nunique() > 1 else [])
    modes = list(dict.fromkeys(frame["mode"]))
    lengths = list(dict.fromkeys(frame["prompt_len"]))
    out = []
    for key, group in frame.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"prompt {v} tokens" if k == "prompt_len" else str(v) for k, v in zip(keys, key))
        length = key[1] if len(key) > 1 else lengths[0]
        style = {
            "color": f"C{modes.index(key[0])}",
            "ls": ("-", "--", ":", "-.")[lengths.index(length) % 4],
            "marker": "os^D"[lengths.index(length) % 4],
        }
        out.append((label, group.sort_values("batch_size"), style))
    return out


def _legend_below(fig: Figure, ax: Any, title: str | None = None, ncols: int = 3) -> None:
    """One axes' legend under it, never on the data."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(
            handles,
            labels,
            title=title,
            fontsize=8,
            title_fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.2),
            ncols=min(ncols, len(labels)),
            frameon=False,
        )


def _batch_axis(ax: Any, frame: pd.DataFrame) -> None:
    sizes = sorted(frame["batch_size"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def _figure_legend(fig: Figure, ax: Any, title: str) -> None:
    """One legend for the whole figure, under the axes (never on the data)."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        title=title,
        loc="lower center",
        ncols=min(4, len(labels)),
        fontsize=8,
        title_fontsize=8,
        frameon=False,
    )


def _tokens_per_row(frame: pd.DataFrame) -> str:
    tokens = sorted(set((frame["generated_tokens"] // frame["batch_size"]).astype(int)))
    return f"{tokens[0]} generated tokens per row" if len(tokens) == 1 else "generated tokens per row vary"


def throughput(frame: pd.DataFrame, *, save: str | Path | None = None, title: str | None = None) -> Figure:
    """Generated tokens/s against batch size (median, error bars from min to max over the repeats), and the
    speed-up over batch size 1 (running the prompts one by one), one line per quantization mode (and prompt
    length).  Both axes start at zero: the size of a gain is the point."""
    fig = Figure(figsize=(10, 4.6))
    rate, gain = fig.subplots(1, 2)
    for label, group, style in _series(frame):
        x = group["batch_size"]
        yerr = [group["tok_s"] - group["tok_s_min"], group["tok_s_max"] - group["tok_s"]]
        rate.errorbar(x, group["tok_s"], yerr=yerr, capsize=3, label=label, **style)
        if group["speedup_vs_batch1"].notna().any():
            gain.plot(x, group["speedup_vs_batch1"], label=label, **style)
    for ax in (rate, gain):
        _batch_axis(ax, frame)
    rate.set_ylabel("generated tokens / s")
    rate.set_title(f"throughput ({_tokens_per_row(frame)}; median, min–max)", fontsize=10)
    gain.axhline(1.0, color="#999", lw=1, ls="--")
    gain.set_ylabel("× tokens/s of batch size 1")
    gain.set_title("speed-up over one prompt at a time", fontsize=10)
    _figure_legend(fig, rate, "quantization mode" + (", prompt length" if frame["prompt_len"].nunique() > 1 else ""))
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return _finish(fig, save, layout=False)


def latency(frame: pd.DataFrame, *, save: str | Path | None = None) -> Figure:
    """Wall time of one batch call (median, whiskers from min to max over the repeats) and its time to first
    token (the prefill), against batch size, from zero seconds."""
    fig = Figure(figsize=(10, 4.6))
    call, first = fig.subplots(1, 2)
    for label, group, style in _series(frame):
        x = group["batch_size"]
        spread = [
            (group["total_s"] - group["total_s_min"]).clip(lower=0),
            (group["total_s_max"] - group["total_s"]).clip(lower=0),
        ]
        call.errorbar(x, group["total_s"], yerr=spread, capsize=3, label=label, **style)
        first.plot(x, group["ttft_s"], label=label, **style)
    for ax in (call, first):
        _batch_axis(ax, frame)
        ax.set_ylabel("seconds")
    call.set_title(f"one batch call ({_tokens_per_row(frame)}; median, min–max)", fontsize=10)
    first.set_title("time to first token (prefill of the batch)", fontsize=10)
    _figure_legend(fig, call, "quantization mode" + (", prompt length" if frame["prompt_len"].nunique() > 1 else ""))
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return _finish(fig, save, layout=False)


PACKED_LABEL = "float32 packed copy (CPU kernel)"
PLAIN_TYPES = ("float32", "bfloat16", "float16", "float64")
SPEED_COLORS = {"prefill_tok_s": "#5c6bc0", "decode_tok_s": "#26a69a"}  # apart from the memory panel's types


def _stored_types(frame: pd.DataFrame) -> dict[str, list[float]]:
    """MiB per stored type and mode, each quantized type with its scales (a scale is a sliver no bar shows
    apart), and the CPU kernel's packed copy where the frame has it."""
    types: dict[str, list[float]] = {}
    for i, by_part in enumerate(frame["by_part"]):
        for part in by_part.values():
            scaled = any(label.endswith(" scales") for label in part)
            quantized = [label for label in part if not label.endswith(" scales") and label not in PLAIN_TYPES]
            for label, n in part.items():
                if scaled and quantized and (label.endswith(" scales") or label == quantized[0]):
                    label = f"{quantized[0]} + scales"
                types.setdefault(label, [0.0] * len(frame))[i] += n / 2**20
    if "packed_bytes" in frame.columns and frame["packed_bytes"].any():
        types[PACKED_LABEL] = [n / 2**20 for n in frame["packed_bytes"]]
    return types


def quantization(frame: pd.DataFrame, *, save: str | Path | None = None) -> Figure:
    """Memory, speed and fidelity (to the first mode) of each quantization mode (the frame of
    ``workbench.notebook.bench.quantization``).

    memory: what the weights occupy, stacked by stored type (with the CPU kernel's packed copy).  speed: prefill
    and decode as multiples of the first mode's (the baseline, so both show on one axis however far apart their
    tokens/s are), median with min–max whiskers, the tokens/s written on each bar.  fidelity: the share of prompts
    whose whole greedy reply equals the baseline's, with its 95% Wilson interval (top-1 agreement and KL written
    on each bar)."""
    fig = Figure(figsize=(13, 4.8))
    axes = fig.subplots(1, 3)
    modes = [str(m) for m in frame.index]
    xs = list(range(len(modes)))
    totals = (frame["resident_bytes"] / 2**20).tolist()
    notes = [""] * len(modes)  # types too thin to see as a segment, written on the bar instead
    bottom = [0.0] * len(modes)  # stacked by what the bytes are stored as
    types = sorted(_stored_types(frame).items(), key=lambda kv: (kv[0] == PACKED_LABEL, -sum(kv[1])))
    for color, (label, values) in enumerate(types):
        visible = max(values) >= 0.01 * max(totals)  # a segment under 1% of the axis is a hairline
        style = (
            {"hatch": "//", "color": "#cfd8dc", "edgecolor": "#607d8b"}
            if label == PACKED_LABEL
            else {"color": f"C{color}"}
        )
        axes[0].bar(xs, values, bottom=bottom, label=label if visible else "_hidden", **style)
        bottom = [b + v for b, v in zip(bottom, values)]
        if not visible:
            short = label.replace("float8_e4m3fn", "fp8")
            notes = [f"{note}\n{short}\n{v:.1f} MiB" if v else note for note, v in zip(notes, values)]
    _legend_below(fig, axes[0], "stored as", ncols=2)
    for x, total, note in zip(xs, totals, notes):  # the total on each bar: small differences stay readable
        axes[0].annotate(f"{total:.1f}", (x, total), ha="center", va="bottom", fontsize=8)
        if note:  # inside the bar: what it holds beyond its visible segments
            axes[0].annotate(f"incl.{note}", (x, total / 2), ha="center", va="center", fontsize=7, color="white")
    axes[0].set_ylim(0, 1.15 * max(totals))
    axes[0].set_ylabel("weights in memory (MiB)")
    axes[0].set_title("memory")
    width = 0.4
    for offset, column, label in (
        (-width / 2, "prefill_tok_s", "prefill (prompt tokens/s)"),
        (width / 2, "decode_tok_s", "decode (generated tokens/s)"),
    ):
        base = float(frame[column].iloc[0])
        values = frame[column] / base
        errors = [
            (values - frame[f"{column}_min"] / base).clip(lower=0),
            (frame[f"{column}_max"] / base - values).clip(lower=0),
        ]
        bars = axes[1].bar(
            [x + offset for x in xs], values, width, yerr=errors, capsize=3, label=label, color=SPEED_COLORS[column]
        )
        axes[1].bar_label(bars, labels=[f"{v:.0f}" for v in frame[column]], fontsize=8, padding=3)
    top = 1.0
    for column in ("prefill_tok_s", "decode_tok_s"):
        top = max(top, float((frame[f"{column}_max"] / float(frame[column].iloc[0])).max()))
    axes[1].axhline(1.0, color="#999", lw=1, ls="--")
    axes[1].set_ylim(0, 1.25 * top)
    axes[1].set_ylabel(f"× {modes[0]}'s tokens/s, median, min–max")
    axes[1].set_title("speed")
    _legend_below(fig, axes[1], "tokens/s on each bar", ncols=1)
    values = frame["same_reply"].astype(float)
    errors = [(values - frame["same_reply_low"]).clip(lower=0), (frame["same_reply_high"] - values).clip(lower=0)]
    bars = axes[2].bar(xs, values, yerr=errors, capsize=3, color="#90a4ae")
    labels = [
        f"{int(round(v * n))}/{int(n)}\ntop-1 {t:.3f}\nKL {k:.0e}"
        for v, n, t, k in zip(values, frame["rows"], frame["top1_agreement"], frame["mean_kl"])
    ]
    axes[2].bar_label(bars, labels=labels, fontsize=8, padding=3)
    axes[2].set_ylabel(f"same greedy reply as {modes[0]} (95% Wilson)")
    axes[2].set_ylim(0, 1.45)
    axes[2].set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    axes[2].set_title(f"fidelity to {modes[0]} (not task accuracy)")
    for ax in axes:
        ax.set_xticks(xs, modes, rotation=20)
        ax.grid(axis="y", alpha=0.3)
    first = frame.iloc[0]
    fig.suptitle(
        f"{int(first['rows'])} prompts, {int(first['generated_tokens']) // int(first['rows'])} generated "
        f"tokens each; agreement over {int(first['positions'])} reply positions; speeds over "
        f"{int(first['repeats'])} runs",
        fontsize=10,
    )
    return _finish(fig, save)


def show(fig: Figure) -> Any:
    """Display a figure in a notebook (what a returned figure does as a cell's last expression)."""
    from IPython.display import display

    return display(fig)


def peers(
    results: dict[str, dict[str, Any]],
    *,
    baseline: str = "workbench",
    save: str | Path | None = None,
    title: str | None = None,
) -> Figure:
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
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("generated tokens / s")
    ax.set_ylim(0, max(rates) * 1.3)
    ax.set_title(title or "the same prompts and weights, greedy")
    return _finish(fig, save)
