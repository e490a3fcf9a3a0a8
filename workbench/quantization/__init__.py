"""Quantization of a loaded model slice: ``None | "bf16" | "fp8_mixed" | "int4_mixed"``.

Pure PyTorch (no FBGEMM), so every mode runs on CPU and GPU; what is quantized follows Meta's
meta-reference scheme, because that is what the published pre-quantized checkpoints and the
accuracy numbers researchers compare against assume:

========== ================================================== ==============================================
mode       Llama 3                                            Llama 4
========== ================================================== ==============================================
bf16       every weight in bfloat16, KV cache too (activations: see :mod:`.kernels`, chosen by the CPU)
fp8_mixed  ``feed_forward.w1/w2/w3`` of layers 1..n-2         routed experts of MoE layers other than 0, n-1
int4_mixed ``feed_forward.w1/w2/w3`` of every layer           routed + shared experts of every MoE layer
========== ================================================== ==============================================

Everything else (attention, norms, embeddings, output, router, Llama 4's dense layers) is stored in the
model dtype — under every mode bfloat16 unless ``load(dtype=...)`` asks for another type
(:func:`workbench.runtime.settings.resolve_dtype`), as Llama Stack's meta-reference builds its quantized
models, so memory falls from bf16 to fp8_mixed to int4_mixed on every device.  Formats and kernels are
documented in :mod:`.fp8` and :mod:`.int4`; the replacement modules in :mod:`.modules`; which kernels and
arithmetic dtype run on this CPU (float32 arithmetic on bf16 weights without native bf16) in :mod:`.kernels`.
Pre-quantized fp8 checkpoints (``fp8_scales_{rank}.pt``) are handled by :mod:`.prequantized` — under *any* mode, since
their shards hold unscaled fp8 codes.

Quantization is rank-local: :func:`quantize_model` sees only this rank's slice (``build_model`` has
already cut it) and never communicates, so model-parallel workers call it exactly as the in-process
runner does.  It never touches global torch state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.errors import QuantizationError
from workbench.models.args import ModelArgs
from workbench.models.feed_forward import Experts, FeedForward
from workbench.models.transformer import Transformer
from workbench.quantization import fp8, int4
from workbench.quantization.modules import (
    Fp8Weight,
    Int4Weight,
    Pair,
    QuantizedExperts,
    QuantizedFeedForward,
    QuantizedWeight,
    fp8_from_pairs,
    make_weight,
)
from workbench.quantization.prequantized import RowScales, rank_scales, scale_files

MODES: tuple[str | None, ...] = (None, "bf16", "fp8_mixed", "int4_mixed")

__all__ = [
    "MODES",
    "Fp8Weight",
    "Int4Weight",
    "QuantizedExperts",
    "QuantizedFeedForward",
    "QuantizedWeight",
    "Target",
    "check_mode",
    "check_supported",
    "load_options",
    "quantization_plan",
    "quantize_model",
    "summary",
]


def check_mode(mode: object) -> str | None:
    """The mode as a canonical value; ``"none"``/``""`` mean None.  Unknown modes raise QuantizationError."""
    if mode in ("", "none", "None"):
        return None
    if mode not in MODES:
        raise QuantizationError(
            f"quantization={mode!r} is not a quantization mode; use one of "
            f"{', '.join(repr(m) for m in MODES)} (None loads the checkpoint as it is)"
        )
    return mode  # type: ignore[return-value]


def check_supported(mode: object, device: torch.device | str) -> str | None:
    """:func:`check_mode`, plus whether ``device`` can run it (fp8 needs float8 tensors there)."""
    mode = check_mode(mode)
    if mode == "fp8_mixed":
        fp8.check_storage(device)
    return mode


def load_options(settings: Any) -> tuple[str, torch.dtype]:
    """(device, dtype) in which to assemble a rank's weights before :func:`quantize_model`.

    fp8/int4 on a GPU assemble on the CPU (memory-mapped, no copy when dtypes agree) and quantize one
    module at a time onto the GPU, so a model whose bf16 weights would not fit there still loads — the
    point of quantizing.  bf16 assembles directly in bfloat16 (one cast, not two).  Checkpoints this
    package cannot read (Meta's pre-quantized int4 format) are refused here, before any shard is read.
    """
    mode = check_mode(settings.quantization)
    int4_files = sorted(Path(settings.checkpoint_dir).glob("int4_scales_*.pt"))
    if int4_files:
        raise QuantizationError(
            f"{settings.checkpoint_dir} is a pre-quantized int4 checkpoint ({int4_files[0].name}), whose packed "
            "shards workbench cannot load; use the bf16 checkpoint of the same model with quantization='int4_mixed' "
            "(quantized at load), or a pre-quantized fp8 checkpoint"
        )
    device, dtype = settings.device, settings.dtype
    if mode in ("fp8_mixed", "int4_mixed") and torch.device(device).type == "cuda":
        return "cpu", dtype
    if mode == "bf16":
        return device, torch.bfloat16
    return device, dtype


@dataclass(frozen=True)
class Target:
    """One module the scheme quantizes: ``layers.{layer}.{path}`` in format ``fmt``."""

    layer: int
    path: str  # "feed_forward" | "feed_forward.experts" | "feed_forward.shared_expert"
    fmt: str  # "fp8" | "int4"

    def weight_keys(self) -> dict[str, str]:
        """``w1``/``w2``/``w3`` -> parameter name in the unquantized model."""
        suffix = "" if self.path.endswith("experts") else ".weight"
        return {w: f"layers.{self.layer}.{self.path}.{w}{suffix}" for w in ("w1", "w2", "w3")}


def quantization_plan(args: ModelArgs, mode: str | None) -> list[Target]:
    """The modules ``mode`` quantizes in a model with ``args`` (Meta's meta-reference scheme)."""
    mode = check_mode(mode)
    n = args.n_layers
    llama4 = args.moe_args is not None
    targets: list[Target] = []
    for layer in range(n):
        if mode == "fp8_mixed" and layer not in (0, n - 1):
            if not llama4:
                targets.append(Target(layer, "feed_forward", "fp8"))
            elif args.is_moe_layer(layer):
                targets.append(Target(layer, "feed_forward.experts", "fp8"))
        elif mode == "int4_mixed":
            if not llama4:
                targets.append(Target(layer, "feed_forward", "int4"))
            elif args.is_moe_layer(layer):
                targets.append(Target(layer, "feed_forward.experts", "int4"))
                targets.append(Target(layer, "feed_forward.shared_expert", "int4"))
    return targets


def quantize_model(model: Transformer, mode: str | None, *, settings: Any = None, rank: int = 0) -> Transformer:
    """Quantize this rank's ``model`` in place to ``mode`` and move it to ``settings.device``; returns it.

    ``settings`` (a :class:`~workbench.config.Settings`) supplies the checkpoint folder (for
    pre-quantized scales), the model-parallel size and the target device; without it the model stays
    on its device and no scale files are looked for.
    """
    mode = check_mode(mode)
    device = torch.device(settings.device) if settings is not None else model.device
    if mode == "fp8_mixed":
        fp8.check_storage(device)
    plan = quantization_plan(model.args, mode)
    direct: dict[str, Pair] = {}
    if settings is not None and scale_files(settings.checkpoint_dir):
        num_experts = model.args.moe_args.num_experts if model.args.moe_args is not None else None
        scales = rank_scales(settings.checkpoint_dir, settings.model_parallel_size, rank, num_experts)
        direct = _apply_prequantized(model, scales, [t for t in plan if t.fmt == "fp8"])
    pickers = {"fp8": fp8.pick_kernel, "int4": int4.pick_kernel}
    kernels = {fmt: pickers[fmt](device) for fmt in {t.fmt for t in plan}}
    for target in plan:
        _replace(model, target, device=device, kernel=kernels[target.fmt], direct=direct)
    if mode == "bf16":
        model.to(dtype=torch.bfloat16)
    return model.to(device=device)


# ------------------------------------------------------------------------------------------ replacement
def _replace(model: Transformer, target: Target, *, device: torch.device, kernel: str, direct: dict[str, Pair]) -> None:
    parent_path, _, attr = f"layers.{target.layer}.{target.path}".rpartition(".")
    parent = model.get_submodule(parent_path)
    old = getattr(parent, attr)
    keys = target.weight_keys()
    pre = {w: direct[k] for w, k in keys.items() if k in direct}
    if isinstance(old, Experts):
        w1, w3, w2 = old.w1, old.w3, old.w2  # [E, D, F], [E, D, F], [E, F, D]
        hidden = w1.shape[2]
        if "w1" in pre:  # pre-quantized: (codes, scales) already oriented [E, N, K]
            w13 = fp8_from_pairs(pre["w1"], pre["w3"], device=device, kernel=kernel)
        else:
            w13 = make_weight(target.fmt, _FusedExperts(w1, w3, device), device=device, kernel=kernel)
        if "w2" in pre:
            w2q = fp8_from_pairs(pre["w2"], None, device=device, kernel=kernel)
        else:
            w2q = make_weight(target.fmt, w2.transpose(1, 2), device=device, kernel=kernel)  # [E, D, F]
        new: nn.Module = QuantizedExperts(w13, w2q, hidden=hidden)
    elif isinstance(old, FeedForward):
        w1, w3, w2 = old.w1.weight, old.w3.weight, old.w2.weight  # [F, D], [F, D], [D, F]
        hidden = w1.shape[0]
        if "w1" in pre:
            w13 = fp8_from_pairs(pre["w1"], pre["w3"], device=device, kernel=kernel)
        else:
            w13 = make_weight(target.fmt, torch.cat([w1.to(device), w3.to(device)]), device=device, kernel=kernel)
        if "w2" in pre:
            w2q = fp8_from_pairs(pre["w2"], None, device=device, kernel=kernel)
        else:
            w2q = make_weight(target.fmt, w2, device=device, kernel=kernel)
        new = QuantizedFeedForward(w13, w2q, hidden=hidden, reduce=old.reduce)
    else:
        raise QuantizationError(
            f"layers.{target.layer}.{target.path} is a {type(old).__name__}, which cannot be "
            "quantized; it was already quantized — reload the checkpoint instead"
        )
    setattr(parent, attr, new)


class _FusedExperts:
    """Lazy stack ``[E, 2F, D]`` of ``cat(w1[e]^T, w3[e]^T)``: one expert's matrix exists at a time."""

    def __init__(self, w1: torch.Tensor, w3: torch.Tensor, device: torch.device) -> None:
        self.w1, self.w3, self.device = w1, w3, device  # [E, D, F] each
        self.shape = (w1.shape[0], 2 * w1.shape[2], w1.shape[1])

    def dim(self) -> int:
        return 3

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self):  # type: ignore[no-untyped-def]
        for e in range(self.shape[0]):
            yield torch.cat([self.w1[e].to(self.device).t(), self.w3[e].to(self.device).t()])  # [2F, D]


# ------------------------------------------------------------------------------------------ pre-quantized
def _oriented(param: torch.Tensor) -> torch.Tensor:
    """The parameter as ``[E?, N, K]`` (out, in): expert stacks are stored ``[E, in, out]``."""
    return param.transpose(1, 2) if param.dim() == 3 else param


def _apply_prequantized(model: Transformer, scales: dict[str, RowScales], fp8_targets: list[Target]) -> dict[str, Pair]:
    """Consume the pre-quantized weights of this rank.

    Weights of fp8 targets with exact per-row scales are returned as (codes, scale) pairs to be used as
    stored; every other pre-quantized weight (not quantized by this mode, or merged from shards with
    different scales) is dequantized in place to the model dtype.
    """

    def exact(key: str) -> bool:
        return key in scales and scales[key].scale is not None

    wanted: set[str] = set()
    for t in fp8_targets:  # w1 and w3 are stored fused: both must be usable as stored, or neither is
        k = t.weight_keys()
        if exact(k["w1"]) and exact(k["w3"]):
            wanted |= {k["w1"], k["w3"]}
        if exact(k["w2"]):
            wanted.add(k["w2"])
    direct: dict[str, Pair] = {}
    for key, row_scales in scales.items():
        try:
            param = model.get_parameter(key)
        except AttributeError as exc:
            raise QuantizationError(
                f"the fp8 scales name {key}, which this model does not have; the fp8_scales_*.pt files do not "
                "belong to these shards/params.json — re-download the checkpoint"
            ) from exc
        w = _oriented(param)  # [E?, N, K], values are e4m3 codes
        codes = w.to(fp8.FP8_DTYPE)
        if not torch.equal(codes.to(w.dtype), w):
            raise QuantizationError(
                f"{key} holds values that are not float8 e4m3 codes although fp8_scales_*.pt lists it; the scale "
                "files do not belong to these shards — remove them or re-download the pre-quantized checkpoint"
            )
        if key in wanted:
            _check_scale(key, row_scales.scale, w.shape[:-1])
            direct[key] = (codes.contiguous(), row_scales.scale)  # type: ignore[assignment]
            continue
        dense = _dequantize_blocks(w, row_scales, key).to(param.dtype)  # [E?, N, K]
        module_path, _, name = key.rpartition(".")
        setattr(
            model.get_submodule(module_path), name, nn.Parameter(_oriented(dense).contiguous(), requires_grad=False)
        )
    return direct


def _check_scale(key: str, scale: torch.Tensor | None, rows: torch.Size) -> None:
    if scale is None or tuple(scale.shape) != tuple(rows):
        got = None if scale is None else tuple(scale.shape)
        raise QuantizationError(
            f"fp8 scales of {key} have shape {got} but this rank's weight has rows {tuple(rows)}; the scale files "
            "do not match the shards — re-download the pre-quantized checkpoint"
        )


def _dequantize_blocks(w: torch.Tensor, row_scales: RowScales, key: str) -> torch.Tensor:
    """``codes * scale`` in float32, with one scale per row, or per row and input block."""
    if row_scales.scale is not None:
        _check_scale(key, row_scales.scale, w.shape[:-1])
        return w.float() * row_scales.scale[..., None]
    blocks = row_scales.blocks or []
    if w.shape[-1] % len(blocks):
        raise QuantizationError(f"{key}: {w.shape[-1]} inputs cannot be cut into {len(blocks)} saved shards")
    pieces = []
    for piece, scale in zip(w.chunk(len(blocks), dim=-1), blocks):
        _check_scale(key, scale, piece.shape[:-1])
        pieces.append(piece.float() * scale[..., None])
    return torch.cat(pieces, dim=-1)


# ------------------------------------------------------------------------------------------ inspection
def summary(model: nn.Module) -> list[dict[str, Any]]:
    """One row per quantized weight: name, format, kernel, logical shape, bytes stored, bf16 bytes."""
    rows = []
    for name, module in model.named_modules():
        if isinstance(module, QuantizedWeight):
            stored = sum(t.numel() * t.element_size() for t in module.buffers(recurse=False))
            rows.append(
                {
                    "name": name,
                    "format": module.FORMAT,
                    "kernel": module.kernel,
                    "shape": list(module.shape),
                    "bytes": stored,
                    "bf16_bytes": 2 * module.logical_numel(),
                }
            )
    return rows
