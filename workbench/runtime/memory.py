"""What a loaded model holds in memory, counted the same way by every runner: parameter bytes by dtype and
by module kind, the KV cache, extra packed weight copies; and the sum over model-parallel ranks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch


def module_kind(name: str) -> str:
    """Coarse kind of a parameter for memory breakdowns."""
    if name.startswith("vision_"):
        return "vision"
    if "experts" in name:
        return "routed_experts"
    if "shared_expert" in name:
        return "shared_expert"
    if "router" in name:
        return "router"
    if "feed_forward" in name:
        return "feed_forward"
    if "attention." in name:
        return "attention"
    if "tok_embeddings" in name:
        return "embedding"
    if name.startswith("output"):
        return "output"
    return "norm"


def model_memory(model: torch.nn.Module, kv_cache_bytes: int) -> dict[str, Any]:
    """Bytes this rank holds: weights by dtype and by module kind, quantized weights and their scales, KV cache.

    Quantized modules store weights as buffers in packed dtypes; they declare what a buffer really
    holds (``DTYPE_LABELS``: int4 codes packed in uint8/int32 are reported as ``"int4"``) and which
    buffers are scales (``SCALE_BUFFERS``).  ``quantized_bytes`` counts the quantized weights proper,
    ``scale_bytes`` their scales (and zeros); both are included in ``weights_bytes``;
    ``quantized_bf16_bytes`` is what the quantized weights would take in bfloat16.  ``by_kernel``
    splits the quantized bytes (scales included) by ``"format/kernel"`` (e.g. ``"int4/cpu"``), which
    shows whether torch's kernels or the dequantizing fallback serve them.  ``by_part`` says per module kind
    what is stored in which type (``{"routed_experts": {"int4": ..., "bfloat16 scales": ...}, "embedding":
    {"bfloat16": ...}}``): a mode's total alone hides that most of a small model is its embedding.
    """
    by_dtype: dict[str, int] = defaultdict(int)
    by_kind: dict[str, int] = defaultdict(int)
    by_part: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    by_kernel: dict[str, int] = defaultdict(int)
    quantized_bytes = scale_bytes = quantized_bf16_bytes = packed_bytes = 0
    for module_name, module in model.named_modules():
        packed_bytes += getattr(module, "packed_bytes", 0)  # a CPU kernel's repacked copy (ColumnParallel.pack_for_cpu)
        labels = getattr(module, "DTYPE_LABELS", {})
        scales = getattr(module, "SCALE_BUFFERS", ())
        quantized = bool(getattr(module, "FORMAT", ""))
        if quantized:
            quantized_bf16_bytes += 2 * module.logical_numel()
        tensors = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        for name, tensor in tensors:
            size = tensor.numel() * tensor.element_size()
            label = labels.get(name, str(tensor.dtype).replace("torch.", ""))
            kind = module_kind(f"{module_name}.{name}" if module_name else name)
            by_dtype[label] += size
            by_kind[kind] += size
            by_part[kind][f"{label} scales" if name in scales else label] += size
            if quantized:
                by_kernel[f"{module.FORMAT}/{module.kernel}"] += size
            if name in scales:
                scale_bytes += size
            elif quantized:
                quantized_bytes += size
    return {
        "weights_bytes": sum(by_dtype.values()),
        "by_dtype": dict(by_dtype),
        "by_kind": dict(by_kind),
        "by_part": {kind: dict(types) for kind, types in by_part.items()},
        "quantized_bytes": quantized_bytes,
        "scale_bytes": scale_bytes,
        "quantized_bf16_bytes": quantized_bf16_bytes,
        "by_kernel": dict(by_kernel),
        "packed_bytes": packed_bytes,  # not in weights_bytes: extra copies kept for faster CPU kernels
        "kv_cache_bytes": kv_cache_bytes,
    }


def merge_memory(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Sum :func:`model_memory` reports of several ranks (what is resident in total), keeping each rank's."""
    keys = ("weights_bytes", "quantized_bytes", "scale_bytes", "quantized_bf16_bytes", "packed_bytes", "kv_cache_bytes")
    total: dict[str, Any] = dict.fromkeys(keys, 0)
    for key in total:
        total[key] = sum(info.get(key, 0) for info in per_rank)
    for key in ("by_dtype", "by_kind", "by_kernel"):
        merged: dict[str, int] = defaultdict(int)
        for info in per_rank:
            for name, value in info.get(key, {}).items():
                merged[name] += value
        total[key] = dict(merged)
    parts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for info in per_rank:
        for kind, types in info.get("by_part", {}).items():
            for label, value in types.items():
                parts[kind][label] += value
    total["by_part"] = {kind: dict(types) for kind, types in parts.items()}
    total["per_rank"] = [dict(info) for info in per_rank]
    return total
