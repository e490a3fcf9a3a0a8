"""params.json parsing and checkpoint-folder errors: each names the problem and the fix."""

from __future__ import annotations

import json
import shutil

import pytest

from workbench.checkpoints.factory import TINY_LLAMA3, TINY_LLAMA4
from workbench.errors import CheckpointError, MissingCheckpointFileError, ModelArgsError, VocabMismatchError
from workbench.models.args import ModelArgs
from workbench.session import build_engine, resolve_settings

LLAMA31_8B = {
    "dim": 4096,
    "n_layers": 32,
    "n_heads": 32,
    "n_kv_heads": 8,
    "vocab_size": 128256,
    "ffn_dim_multiplier": 1.3,
    "multiple_of": 1024,
    "norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "use_scaled_rope": True,
}
SCOUT = {
    "dim": 5120,
    "n_layers": 48,
    "n_heads": 40,
    "n_kv_heads": 8,
    "vocab_size": 202048,
    "multiple_of": 2048,
    "ffn_dim_multiplier": 1.2,
    "ffn_exp": 4.0,
    "norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "use_scaled_rope": True,
    "attention_chunk_size": 8192,
    "nope_layer_interval": 4,
    "use_qk_norm": True,
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "moe_args": {
        "num_experts": 16,
        "capacity_factor": 1.0,
        "auto_scale_F": True,
        "top_k": 1,
        "interleave_moe_layer_step": 1,
    },
    "vision_args": {
        "image_size": {"height": 336, "width": 336},
        "patch_size": {"height": 14, "width": 14},
        "dim": 1408,
        "n_layers": 34,
        "n_heads": 16,
        "mlp_ratio": 4.0,
        "output_dim": 4096,
        "pixel_shuffle_ratio": 0.5,
    },
}


def test_published_params_parse():
    l3 = ModelArgs.from_dict(LLAMA31_8B)
    assert l3.family == "llama3" and l3.dense_hidden_dim() == 14336 and l3.rope_scaling() == (8.0, 1.0, 4.0)
    scout = ModelArgs.from_dict(SCOUT)
    assert scout.family == "llama4" and scout.moe_hidden_dim() == 8192 and scout.rope_scaling() == (16.0, 1.0, 1.0)
    assert scout.is_nope_layer(3) and not scout.is_nope_layer(2) and scout.is_moe_layer(0)
    assert scout.dense_hidden_dim() == 16384


@pytest.mark.parametrize(
    "params,needle",
    [
        ({**TINY_LLAMA3, "n_layerz": 2}, "n_layerz"),
        ({k: v for k, v in TINY_LLAMA3.items() if k != "dim"}, "'dim'"),
        ({**TINY_LLAMA3, "n_heads": "4"}, "n_heads"),
        ({**TINY_LLAMA3, "use_scaled_rope": 1}, "use_scaled_rope"),
        ({**TINY_LLAMA4, "moe_args": {"num_experts": 4, "topk": 1}}, "topk"),
        ({**TINY_LLAMA3, "n_kv_heads": 3}, "n_kv_heads"),
        ({**TINY_LLAMA4, "ffn_exp": None}, "ffn_exp"),
    ],
)
def test_bad_params_name_the_field(params, needle):
    with pytest.raises(ModelArgsError) as info:
        ModelArgs.from_dict(params)
    assert needle in str(info.value)


def test_missing_files_and_shards(tmp_path, make_checkpoint):
    with pytest.raises(MissingCheckpointFileError, match="params.json"):
        build_engine(resolve_settings(tmp_path))
    two = make_checkpoint(TINY_LLAMA3, n_shards=2)
    broken = tmp_path / "broken"
    shutil.copytree(two, broken)
    (broken / "consolidated.00.pth").unlink()
    with pytest.raises(MissingCheckpointFileError, match=r"consolidated\.00\.pth"):
        build_engine(resolve_settings(broken))
    (broken / "consolidated.01.pth").unlink()
    with pytest.raises(MissingCheckpointFileError, match="no consolidated"):
        build_engine(resolve_settings(broken))


def test_vocab_mismatch_and_bad_shapes(tmp_path, llama3_dir):
    folder = tmp_path / "ckpt"
    shutil.copytree(llama3_dir, folder)
    (folder / "params.json").write_text(json.dumps({**TINY_LLAMA3, "vocab_size": 1000}))
    with pytest.raises(VocabMismatchError, match="vocab_size=1000"):
        build_engine(resolve_settings(folder))
    (folder / "params.json").write_text(json.dumps({**TINY_LLAMA3, "dim": 256, "n_heads": 8}))
    with pytest.raises(CheckpointError, match="shape"):
        build_engine(resolve_settings(folder))
    (folder / "consolidated.00.pth").write_bytes(b"not a checkpoint")
    (folder / "params.json").write_text(json.dumps(TINY_LLAMA3))
    with pytest.raises(CheckpointError, match="re-download"):
        build_engine(resolve_settings(folder))


def test_vision_weights_load_without_error(tmp_path, llama4_dir):
    import torch

    folder = tmp_path / "vision"
    shutil.copytree(llama4_dir, folder)
    state = torch.load(folder / "consolidated.00.pth", weights_only=True)
    state["vision_embeddings.patch_embedding.weight"] = torch.zeros(4, 4)
    state["vision_projection.weight"] = torch.zeros(128, 8)
    torch.save(state, folder / "consolidated.00.pth")
    params = {**TINY_LLAMA4, "vision_args": SCOUT["vision_args"]}
    (folder / "params.json").write_text(json.dumps(params))
    engine = build_engine(resolve_settings(folder, max_seq_len=64, max_batch_size=1))
    assert len(engine.completion("hi", max_tokens=2).tokens) == 2


def test_unused_tensors_are_ignored_with_a_warning(tmp_path, llama3_dir):
    import torch

    folder = tmp_path / "extra"
    shutil.copytree(llama3_dir, folder)
    state = torch.load(folder / "consolidated.00.pth", weights_only=True)
    state["adapter.lora_A.weight"] = torch.zeros(2, 2)
    torch.save(state, folder / "consolidated.00.pth")
    with pytest.warns(UserWarning, match="adapter.lora_A.weight"):
        engine = build_engine(resolve_settings(folder, max_seq_len=64, max_batch_size=1))
    assert len(engine.completion("hi", max_tokens=2).tokens) == 2
