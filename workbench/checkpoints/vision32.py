"""Llama 3.2 Vision checkpoints: Meta's ``text_model.*`` / ``vision_model.*`` layout, tiny random ones, and the
on-demand vision loader.

The text decoder's keys are a Llama 3 model's under ``text_model.`` plus ``learnable_embedding`` and
``cross_attention_layers``; the loader strips the prefix (see :mod:`workbench.models.llama32_vision`).  The
vision encoder's dimensions are not in params.json; they are read from the shard's tensor shapes
(:meth:`VisionDims.from_shapes`), so tiny checkpoints may shrink its width: :func:`random_state_dict` writes
Meta's 32 local layers (the intermediate outputs need 31) at ``TINY_WIDTH`` with ``TINY_GLOBAL_LAYERS`` global ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from workbench.checkpoints.files import read_shard, shard_paths, source_shards_for_rank
from workbench.checkpoints.load import assign_state, reshard
from workbench.errors import CheckpointError
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.llama32_vision import CrossAttentionTextModel
from workbench.models.vision_llama3 import CrossAttentionVision, VisionDims

TEXT_PREFIX = "text_model."
VISION_PREFIX = "vision_model."
TINY_WIDTH = 32  # tiny encoder width (Meta: 1280); 16 heads of 2
TINY_GLOBAL_LAYERS = 2  # Meta: 8

# A tiny Llama 3.2 Vision model: the TINY_LLAMA3 text shape with 4 layers, 2 of them preceded by cross-attention,
# 28-pixel tiles of 2 x 2 patches (5 encoder tokens per tile), at most 4 tiles per image.
TINY_LLAMA32_VISION: dict[str, Any] = {
    "dim": 128,
    "n_layers": 4,
    "n_heads": 4,
    "n_kv_heads": 2,
    "vocab_size": 128256,
    "multiple_of": 32,
    "ffn_dim_multiplier": 1.3,
    "norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "use_scaled_rope": True,
    "vision_chunk_size": 28,
    "vision_max_num_chunks": 4,
    "vision_num_cross_attention_layers": 2,
}


def tiny_dims(args: ModelArgs, width: int = TINY_WIDTH, n_global: int = TINY_GLOBAL_LAYERS) -> VisionDims:
    if args.vision_chunk_size % 14:
        raise CheckpointError(f"vision_chunk_size={args.vision_chunk_size} is not a multiple of Meta's patch 14")
    return VisionDims(
        width=width,
        patch=14,
        grid=args.vision_chunk_size // 14,
        max_tiles=4,
        n_local_layers=32,
        n_global_layers=n_global,
        mlp_hidden=4 * width,
    )


def _init(key: str, shape: tuple[int, ...], gen: torch.Generator, dim: int) -> torch.Tensor:
    """Scales that keep activations near unit size; gates well away from 0 so every branch matters."""
    leaf = key.rsplit(".", 1)[-1]
    if "gate" in leaf:
        return 0.5 + 0.25 * torch.randn(shape, generator=gen)
    if key.endswith(("norm.weight", "ln_1.weight", "ln_2.weight", "ln_pre.weight", "ln_post.weight")):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if leaf == "bias" or key.endswith(("ln_pre.bias", "ln_post.bias")):
        return 0.1 * torch.randn(shape, generator=gen)
    if key.endswith(("tok_embeddings.weight", "learnable_embedding.weight")):
        return torch.randn(shape, generator=gen)
    if key.endswith("text_model.output.weight"):
        return torch.randn(shape, generator=gen) * (2.0 / dim**0.5)
    if key.endswith(("embedding", "class_embedding", "positional_embedding")):
        return torch.randn(shape, generator=gen) * shape[-1] ** -0.5
    return torch.randn(shape, generator=gen) / shape[-1] ** 0.5  # [out, in]


def meta_shapes(args: ModelArgs, dims: VisionDims) -> dict[str, tuple[int, ...]]:
    """Every key of a 3.2 Vision checkpoint (one shard) and its full shape, under Meta's names."""
    ensure_model_parallel(1)
    text = CrossAttentionTextModel(args, max_seq_len=8, device="meta").state_dict()
    vision = CrossAttentionVision(dims, args.dim, device="meta").state_dict()
    shapes = {TEXT_PREFIX + k: tuple(v.shape) for k, v in text.items()}
    shapes.update({VISION_PREFIX + k: tuple(v.shape) for k, v in vision.items()})
    return shapes


def random_state_dict(args: ModelArgs, seed: int = 0, dims: VisionDims | None = None) -> dict[str, torch.Tensor]:
    """Full (unsharded) float32 weights of a tiny 3.2 Vision model, Meta's key names, deterministic in ``seed``."""
    shapes = meta_shapes(args, dims or tiny_dims(args))
    gen = torch.Generator().manual_seed(seed)
    return {key: _init(key, shapes[key], gen, args.dim) for key in sorted(shapes)}


def strip_text_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``text_model.X`` -> ``X``; other keys (``vision_model.*``) unchanged."""
    return {(k[len(TEXT_PREFIX) :] if k.startswith(TEXT_PREFIX) else k): v for k, v in state.items()}


def vision_dims(ckpt_dir: str | Path) -> VisionDims:
    """The encoder's dimensions from shard 0's tensor shapes (memory-mapped; no weights are read)."""
    paths = shard_paths(ckpt_dir)
    shard = read_shard(paths[0])
    shapes = {k: tuple(v.shape) for k, v in shard.items() if k.startswith(VISION_PREFIX)}
    return VisionDims.from_shapes(shapes, n_shards=len(paths), source=str(paths[0]))


def build_vision(
    ckpt_dir: str | Path, args: ModelArgs, *, device: torch.device, dtype: torch.dtype, mp_size: int = 1, rank: int = 0
) -> torch.nn.Module:
    """This rank's slice of ``vision_model.*`` (encoder and projection), read from the shards on first use."""
    dims = vision_dims(ckpt_dir)
    if dims.tile_size != args.vision_chunk_size:
        raise CheckpointError(
            f"{ckpt_dir}: params.json says vision_chunk_size={args.vision_chunk_size} but the encoder's "
            f"{dims.grid} x {dims.grid} patches of {dims.patch} make {dims.tile_size}-pixel tiles; use the "
            "params.json that belongs to these shards"
        )
    if args.vision_max_num_chunks > dims.max_tiles:
        raise CheckpointError(
            f"{ckpt_dir}: vision_max_num_chunks={args.vision_max_num_chunks} exceeds the "
            f"encoder's {dims.max_tiles}-tile embeddings"
        )
    paths = shard_paths(ckpt_dir)
    picked = source_shards_for_rank(len(paths), mp_size, rank)
    shards = [
        {k[len(VISION_PREFIX) :]: v for k, v in read_shard(paths[i]).items() if k.startswith(VISION_PREFIX)}
        for i in picked
    ]
    state = reshard(shards, n_saved=len(paths), mp_size=mp_size, rank=rank, args=args)
    model = CrossAttentionVision(dims, args.dim, device="meta", dtype=dtype)
    assign_state(model, state, ckpt_dir, mp_size, device, what="vision encoder")
    return model.eval()
