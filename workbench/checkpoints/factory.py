"""Writes random-weight checkpoints in Meta's native layout, for tests, benchmarks and demos.

A written folder is indistinguishable in form from a downloaded one: ``params.json``,
``consolidated.NN.pth`` shards in bfloat16 (split on Meta's model-parallel dims), the real
``tokenizer.model`` of the family, and optionally the fused key names of published Llama 4
checkpoints.  Weights are deterministic in ``seed``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Literal

import torch

from workbench.checkpoints import vision32
from workbench.checkpoints.load import split_dim
from workbench.errors import ConfigError
from workbench.formats.tokenizer import bundled_tokenizer_path
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.llama32_vision import is_cross_attention_vision
from workbench.models.transformer import Transformer
from workbench.models.vision import VisionModel
from workbench.places import CACHE_ENV

Layout = Literal["modules", "fused"]

TINY_LLAMA3: dict[str, Any] = {
    "dim": 128,
    "n_layers": 3,
    "n_heads": 4,
    "n_kv_heads": 2,
    "vocab_size": 128256,
    "multiple_of": 32,
    "ffn_dim_multiplier": 1.3,
    "norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "use_scaled_rope": True,
}

TINY_LLAMA4: dict[str, Any] = {
    "dim": 128,
    "n_layers": 4,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 32,
    "vocab_size": 202048,
    "multiple_of": 32,
    "ffn_dim_multiplier": 1.2,
    "ffn_exp": 4.0,
    "norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "use_scaled_rope": True,
    "rope_scaling_factor": 16.0,
    "rope_high_freq_factor": 1.0,
    "attention_chunk_size": 32,
    "nope_layer_interval": 2,
    "use_qk_norm": True,
    "attn_temperature_tuning": True,
    "floor_scale": 16.0,
    "attn_scale": 0.1,
    "moe_args": {
        "num_experts": 4,
        "capacity_factor": 1.0,
        "auto_scale_F": True,
        "top_k": 1,
        "interleave_moe_layer_step": 2,
    },
}

# TINY_LLAMA4 with a tiny vision encoder: 56-pixel tiles of 4x4 patches, 4 <|patch|> tokens per tile.
TINY_VISION_ARGS: dict[str, Any] = {
    "image_size": {"height": 56, "width": 56},
    "patch_size": {"height": 14, "width": 14},
    "dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "mlp_ratio": 2.0,
    "output_dim": 96,
    "pixel_shuffle_ratio": 0.5,
}
TINY_LLAMA4_VISION: dict[str, Any] = {**TINY_LLAMA4, "vision_args": TINY_VISION_ARGS}

# About 50M parameters (most in the embedding/output of the 128k vocabulary): the "larger tiny" model.
SMALL_LLAMA3: dict[str, Any] = {**TINY_LLAMA3, "dim": 192, "n_layers": 6, "n_heads": 6, "n_kv_heads": 2}


def random_state_dict(args: ModelArgs, seed: int = 0) -> dict[str, torch.Tensor]:
    """Full (unsharded) float32 weights with module names; scales keep activations near unit size."""
    if is_cross_attention_vision(args):  # Meta's text_model.* / vision_model.* layout
        return vision32.random_state_dict(args, seed)
    ensure_model_parallel(1)
    shapes = {k: tuple(v.shape) for k, v in Transformer(args, max_seq_len=8, device="meta").state_dict().items()}
    if args.vision_args is not None:
        shapes.update({k: tuple(v.shape) for k, v in VisionModel(args, device="meta").state_dict().items()})
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for key in sorted(shapes):
        shape = shapes[key]
        if key.endswith("norm.weight"):
            tensor = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif key == "tok_embeddings.weight":
            tensor = torch.randn(shape, generator=gen)
        elif key == "output.weight":
            tensor = torch.randn(shape, generator=gen) * (2.0 / args.dim**0.5)
        elif key.endswith("router_DE"):
            tensor = torch.randn(shape, generator=gen) / args.dim**0.5
        elif key.startswith("vision_") and key.endswith(
            (".bias", "ln_1.weight", "ln_2.weight", "ln_pre.weight", "ln_post.weight")
        ):
            tensor = (1.0 if key.endswith("weight") else 0.0) + 0.1 * torch.randn(shape, generator=gen)
        elif key.endswith(("class_embedding", "positional_embedding_vlm")):
            tensor = torch.randn(shape, generator=gen) * shape[-1] ** -0.5
        elif key.endswith(("experts.w1", "experts.w3", "experts.w2")):
            tensor = torch.randn(shape, generator=gen) / shape[1] ** 0.5  # fan-in is dim 1 of [E, in, out]
        else:
            tensor = torch.randn(shape, generator=gen) / shape[-1] ** 0.5  # [out, in]
        state[key] = tensor
    return state


def shard_state_dict(state: dict[str, torch.Tensor], n_shards: int) -> list[dict[str, torch.Tensor]]:
    """Cut full weights into ``n_shards`` model-parallel shards along Meta's split dims."""
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(n_shards)]
    for key, tensor in state.items():
        dim = split_dim(key)
        for rank in range(n_shards):
            shards[rank][key] = tensor if dim is None else tensor.chunk(n_shards, dim=dim)[rank].contiguous()
    return shards


def fuse_keys(shard: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Rename one shard's module names to the fused names of published Llama 4 checkpoints."""
    out: dict[str, torch.Tensor] = {"rope.freqs": torch.zeros(args.rope_head_dim // 2)}
    for layer in range(args.n_layers):
        p = f"layers.{layer}."
        ff = p + "feed_forward."
        out[p + "attention.wqkv.weight"] = torch.cat(
            [shard.pop(p + f"attention.{w}.weight") for w in ("wq", "wk", "wv")], dim=0
        )
        out[p + "attention.wqkv.layer_norm_weight"] = shard.pop(p + "attention_norm.weight")
        out[p + "attention.wqkv._extra_state"] = torch.empty(0, dtype=torch.uint8)
        out[p + "attention.wo.weight"] = shard.pop(p + "attention.wo.weight")
        out[p + "attention.wo._extra_state"] = torch.empty(0, dtype=torch.uint8)
        if args.is_moe_layer(layer):
            out[ff + "norm.weight"] = shard.pop(p + "ffn_norm.weight")
            w1, w3, w2 = (shard.pop(ff + f"experts.{w}") for w in ("w1", "w3", "w2"))
            out[ff + "experts.moe_w_in_eD_F"] = w1.flatten(0, 1)
            out[ff + "experts.moe_w_swiglu_eD_F"] = w3.flatten(0, 1)
            out[ff + "experts.moe_w_out_eF_D"] = w2.flatten(0, 1)
            out[ff + "router_DE"] = shard.pop(ff + "router_DE")
            for ours, fused in (("w1", "w_in_shared_FD"), ("w3", "w_swiglu_FD"), ("w2", "w_out_shared_DF")):
                out[ff + f"{fused}.weight"] = shard.pop(ff + f"shared_expert.{ours}.weight")
            out[ff + "experts.mlp._extra_state"] = torch.empty(0, dtype=torch.uint8)
            out[ff + "mlp_shared._extra_state"] = torch.empty(0, dtype=torch.uint8)
        else:
            out[ff + "mlp.layer_norm_weight"] = shard.pop(p + "ffn_norm.weight")
            out[ff + "mlp.fc1_weight"] = torch.cat([shard.pop(ff + "w1.weight"), shard.pop(ff + "w3.weight")], dim=0)
            out[ff + "mlp.fc2_weight"] = shard.pop(ff + "w2.weight")
    out.update(shard)  # embeddings, final norm, output
    return out


def write_checkpoint(
    path: str | Path,
    params: dict[str, Any],
    *,
    n_shards: int = 1,
    layout: Layout = "modules",
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    with_tokenizer: bool = True,
) -> Path:
    """Write a random-weight checkpoint folder in Meta's layout and return its path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    args = ModelArgs.from_dict(dict(params), source="factory params")
    state = {k: v.to(dtype) for k, v in random_state_dict(args, seed).items()}
    for rank, shard in enumerate(shard_state_dict(state, n_shards)):
        if layout == "fused":
            shard = fuse_keys(shard, args)
        torch.save(shard, path / f"consolidated.{rank:02d}.pth")
    (path / "params.json").write_text(json.dumps(params, indent=2))
    if with_tokenizer:
        shutil.copyfile(bundled_tokenizer_path(args.family), path / "tokenizer.model")
    return path


def cache_root() -> Path:
    """Where generated checkpoints live: ``$WORKBENCH_CACHE`` or ``~/.cache/workbench``."""
    named = os.environ.get(CACHE_ENV)
    root = Path(named).expanduser() if named else Path.home() / ".cache" / "workbench"
    if root.exists() and not root.is_dir():
        where = f"environment variable {CACHE_ENV}" if named else "the default cache location"
        fix = f"point {CACHE_ENV} at a folder (or unset it)" if named else f"move the file away or set {CACHE_ENV}"
        raise ConfigError(f"the workbench cache {str(root)!r} (from {where}) is a file, not a folder; {fix}")
    return root
