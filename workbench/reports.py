"""Reports: dicts of raw numbers (``engine.info()``, ``engine.memory()``) that display readably, and the
small text helpers (human sizes and counts, HTML escaping) that every card shares.

Ground layer (standard library only): the engine builds reports, the notebook face draws with the same
helpers, and neither has to import the other for it.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path
from typing import Any

from workbench.places import CACHE_ENV, DATA_DIR_ENV, STORE_ENV

BOX = "font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;line-height:1.45;"


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as memory is allocated)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: float) -> str:
    """12_345_678 -> '12.3M'."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return str(int(n))


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% for ``z=1.96``) of a rate of ``successes`` out of ``n`` trials.

    Why Wilson and not ``p ± z·sqrt(p(1-p)/n)``: with the few dozen cases a notebook runs, rates sit near 0
    or 1, where the normal interval collapses to a point or leaves [0, 1]; Wilson's stays inside and honest
    (0 of 15 is [0, 0.20], not [0, 0]).  ``n == 0`` gives (nan, nan): no trials, no interval.
    """
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def rate_text(successes: float, n: int, digits: int = 2) -> str:
    """``"0.27 [0.11, 0.52] n=15"``: a rate with its 95% Wilson interval and its number of trials."""
    if n <= 0:
        return "- (n=0)"
    low, high = wilson_interval(successes, n)
    return f"{successes / n:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}] n={n}"


def stored_types(types: dict[str, int]) -> str:
    """What one part of a model is stored as: ``"int4 1.1 MiB + bfloat16 scales 0.1 MiB"`` (``"-"``: nothing)."""
    return " + ".join(f"{label} {human_bytes(n)}" for label, n in types.items()) or "-"


def short_path(path: Any) -> str:
    """A path as a shared notebook should show it: the run store named by ``$WORKBENCH_STORE``, or under
    ``$WORKBENCH_CACHE``, ``$WORKBENCH_DATA_DIR`` or the home folder it is written from there
    (``~/.cache/workbench/demo-llama4-v1-...``, ``$WORKBENCH_DATA_DIR/runs.sqlite``), so a stored output names no
    machine's user folder; other paths are shown as they are."""
    text = str(path)
    roots = [
        (str(Path(os.environ[name]).expanduser()), f"${name}")
        for name in (STORE_ENV, CACHE_ENV, DATA_DIR_ENV)
        if os.environ.get(name, "").strip()
    ]
    roots.append((str(Path.home()), "~"))
    for root, name in roots:
        root = root.rstrip(os.sep)
        if root and (text == root or text.startswith(root + os.sep)):
            return name + text[len(root) :]
    return text


class Report(dict):
    """A dict of raw numbers that displays readably: ``*_bytes`` as KiB/MiB/GiB, ``parameters`` as 12.3M.

    The raw values are the dict's items (``report["weights_bytes"]`` is an int).
    """

    title = "report"

    def _human(self, key: str, value: Any) -> str:
        if key in ("checkpoint", "run_store") and isinstance(value, str):
            return short_path(value)
        if key == "model_id" and value is None:
            return "not given (the prompt format follows params.json)"
        if key == "by_part" and isinstance(value, dict):  # kind -> {type: bytes}: "embedding: bfloat16 37.0 MiB; ..."
            return "; ".join(f"{kind}: {stored_types(types)}" for kind, types in value.items()) or "-"
        if isinstance(value, dict):
            return ", ".join(f"{k}: {self._human(key, v)}" for k, v in value.items()) or "-"
        if isinstance(value, list):
            return f"{len(value)} items"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if key.endswith("bytes") or key in ("by_dtype", "by_kind", "by_kernel"):
                return human_bytes(value)
            if key == "parameters":
                return human_count(value)
        return "none" if value is None else str(value)

    def readable(self) -> dict[str, str]:
        """The same keys with human-readable values."""
        return {k: self._human(k, v) for k, v in self.items()}

    def __repr__(self) -> str:
        width = max((len(k) for k in self), default=0)
        lines = [f"{k:<{width}}  {v}" for k, v in self.readable().items()]
        return f"{self.title}:\n  " + "\n  ".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        cells = "".join(
            f'<tr><td style="color:#777;padding:0 10px 0 0;text-align:left">{esc(k)}</td>'
            f'<td style="text-align:left">{esc(v)}</td></tr>'
            for k, v in self.readable().items()
        )
        return f'<div style="{BOX}"><b>{esc(self.title)}</b><table>{cells}</table></div>'


class InfoReport(Report):
    title = "engine info"


class MemoryReport(Report):
    title = "memory"
