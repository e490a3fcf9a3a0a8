"""A grid of settings (checkpoint, quantization, prompt format, sampling...) over the same dialogs: one DataFrame.

Grid points that share their load settings (all but ``quantization``) share one pool: a quantization
change re-loads the replicas in place (``pool.set_quantization``), a call setting (``tool_prompt_format``,
``temperature``...) only changes the call.  Ray is joined or started once for the whole sweep.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InputError
from .connect import connect, disconnect
from .pool import load

__all__ = ["LOAD_KEYS", "CALL_KEYS", "sweep"]

LOAD_KEYS = (
    "checkpoint",
    "model",
    "device",
    "dtype",
    "max_batch_size",
    "max_seq_len",
    "model_parallel_size",
    "quantization",
)
CALL_KEYS = (
    "tool_choice",
    "tool_prompt_format",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "logprobs",
    "stop",
    "response_format",
    "constrain_tools",
)


def _points(grid: Any) -> list[dict[str, Any]]:
    """A list of settings dicts, or a dict of lists (every combination)."""
    if isinstance(grid, Mapping):
        keys = list(grid)
        values = [v if isinstance(v, (list, tuple)) else [v] for v in grid.values()]
        return [dict(zip(keys, combo)) for combo in itertools.product(*values)]
    if isinstance(grid, (list, tuple)) and all(isinstance(p, Mapping) for p in grid):
        return [dict(p) for p in grid]
    raise InputError(
        "grid must be a list of settings dicts, e.g. [{'quantization': None}, {'quantization': "
        "'int4_mixed'}], or a dict of lists, e.g. {'tool_prompt_format': ['json', 'python_list']}"
    )


def _row(point: dict[str, Any], index: int, reply: Any, seconds: float, tok_s: float) -> dict[str, Any]:
    message = reply.message
    calls = [{"tool_name": c.tool_name, "arguments": c.arguments} for c in (message.tool_calls or [])]
    return {
        **{k: (v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)) for k, v in point.items()},
        "dialog": index,
        "content": message.content,
        "tool_calls": calls,
        "stop_reason": reply.stop_reason,
        "tokens": len(reply.tokens),
        "prompt_tokens": reply.prompt_tokens,
        "point_seconds": seconds,
        "point_tok_s": tok_s,
    }


def sweep(
    grid: Any,
    dialogs: Sequence[Any],
    tools: Sequence[Any] | None = None,
    *,
    checkpoint: Any = None,
    replicas: int = 1,
    address: str | None = None,
    pool: Any = None,
    load_kwargs: dict[str, Any] | None = None,
    progress: bool | None = None,
    **call_kwargs: Any,
) -> Any:
    """Run ``batch_chat_completion(dialogs, tools, ...)`` at every grid point; one row per (point, dialog).

    grid: settings dicts (or a dict of lists: every combination); keys are load settings (``checkpoint``,
        ``quantization``, ``max_batch_size``...) and call settings (``tool_prompt_format``, ``temperature``...).
    checkpoint, load_kwargs: load settings shared by every point; ``replicas``, ``address``: the pools'.
    pool: run on this pool instead (then the grid may only change ``quantization`` and call settings; the pool's
        quantization is restored afterwards).
    call_kwargs: call settings shared by every point (``max_tokens=64``...).

    Columns: the point's settings, ``dialog`` (its index), ``content``, ``tool_calls``, ``stop_reason``,
    ``tokens``, ``prompt_tokens``, and the point's wall time and tokens/s.
    """
    import pandas as pd

    points = _points(grid)
    for point in points:
        unknown = [k for k in point if k not in LOAD_KEYS and k not in CALL_KEYS]
        if unknown:
            raise InputError(
                f"grid setting {unknown[0]!r} is neither a load setting ({', '.join(LOAD_KEYS)}) nor a "
                f"call setting ({', '.join(CALL_KEYS)})"
            )
    bad = [k for k in call_kwargs if k not in CALL_KEYS]
    if bad:
        raise InputError(f"sweep() got {bad[0]!r}; shared call settings are {', '.join(CALL_KEYS)}")

    def pool_key(point: dict[str, Any]) -> tuple:
        return tuple((k, repr(point[k])) for k in LOAD_KEYS if k in point and k != "quantization")

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for point in points:
        groups.setdefault(pool_key(point), []).append(point)
    if pool is not None and any(groups):
        raise InputError(
            "with pool=..., the grid may only change quantization and call settings; drop pool= to let "
            "sweep load a pool per checkpoint"
        )
    started = connect(address) if pool is None else False
    rows: list[dict[str, Any]] = []
    try:
        for key, members in groups.items():
            settings = {**(load_kwargs or {}), **dict((k, members[0][k]) for k, _ in key)}
            ckpt = settings.pop("checkpoint", checkpoint)
            current = pool if pool is not None else load(ckpt, replicas=replicas, address=address, **settings)
            original = current.settings.quantization
            try:
                for point in members:
                    if "quantization" in point and current.settings.quantization != point["quantization"]:
                        current.set_quantization(point["quantization"])
                    call = {**call_kwargs, **{k: v for k, v in point.items() if k in CALL_KEYS}}
                    start = time.perf_counter()
                    replies = current.batch_chat_completion(list(dialogs), tools, progress=progress, **call)
                    seconds = time.perf_counter() - start
                    tok_s = sum(len(r.tokens) for r in replies) / seconds if seconds > 0 else 0.0
                    rows.extend(_row(point, i, r, seconds, tok_s) for i, r in enumerate(replies))
            finally:
                if current is not pool:
                    current.shutdown()
                elif current.settings.quantization != original:  # the caller's pool is handed back as it came
                    current.set_quantization(original)
    finally:
        if started:
            disconnect()
    return pd.DataFrame(rows)
