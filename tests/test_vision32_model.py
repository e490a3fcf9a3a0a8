"""A tiny Llama 3.2 Vision checkpoint written by the factory, loaded by us and by Meta's reference
(``llama_models.llama3.multimodal.model.CrossAttentionTransformer``, strictly, float32 on CPU): encoder outputs and
logits (text only, one image, two images) within 1e-4, and the checkpoint layout the reference expects.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _chat_helpers import our_tokenizer
from oracle_vision32 import reference_logits, reference_vision_model
from test_vision_preprocess import pattern_image

from workbench.checkpoints import vision32
from workbench.checkpoints.load import build_model
from workbench.checkpoints.vision32 import TINY_LLAMA32_VISION
from workbench.models.args import ModelArgs
from workbench.models.cross_attention import ImageSet, image_spans
from workbench.models.distributed import ensure_model_parallel
from workbench.models.llama32_vision import (
    CrossAttentionTextModel,
    cross_attention_layer_count,
    is_cross_attention_vision,
)
from workbench.vision.tiling_llama3 import tile_image

ATOL = 1e-4
IMAGE = 128011  # <|image|> in the Llama 3 tokenizer
_CACHE: dict[str, torch.nn.Module] = {}


@pytest.fixture(scope="module")
def vision32_dir(make_checkpoint) -> Path:
    return make_checkpoint(TINY_LLAMA32_VISION)


def reference(ckpt: Path) -> torch.nn.Module:
    if "ref" not in _CACHE:
        params = json.loads((ckpt / "params.json").read_text())
        state = torch.load(ckpt / "consolidated.00.pth", weights_only=True)
        _CACHE["ref"] = reference_vision_model(params, state)
    return _CACHE["ref"]


def ours(ckpt: Path) -> CrossAttentionTextModel:
    if "ours" not in _CACHE:
        ensure_model_parallel(1)
        args = ModelArgs.from_checkpoint(ckpt)
        model = build_model(ckpt, args, device=torch.device("cpu"), dtype=torch.float32, max_seq_len=256)
        model.vision_loader = lambda: vision32.build_vision(ckpt, args, device=torch.device("cpu"), dtype=torch.float32)
        _CACHE["ours"] = model
    return _CACHE["ours"]


def _images(sizes: list[tuple[int, int]]) -> list:
    return [pattern_image(w, h, seed=w + h) for w, h in sizes]


def _image_set(tokens: list[int], pil_images: list) -> ImageSet:
    tiled = [tile_image(im, 28, 4) for im in pil_images]
    return ImageSet([t.tiles for t in tiled], [t.aspect_ratio for t in tiled], image_spans(tokens, IMAGE))


def test_the_model_is_a_cross_attention_decoder(vision32_dir):
    model = ours(vision32_dir)
    assert isinstance(model, CrossAttentionTextModel)
    assert model.schedule == [1, 3] and len(model.cross_attention_layers) == 2
    assert not model.vision_loaded  # loaded on the first image
    assert model.image_token == IMAGE == our_tokenizer("llama3").special_tokens["<|image|>"]


def test_encoder_outputs_match_the_reference(vision32_dir):
    ref, model = reference(vision32_dir), ours(vision32_dir)
    model.ensure_vision()
    tiled = [tile_image(im, 28, 4) for im in _images([(60, 30), (20, 20)])]
    aspects = [t.aspect_ratio for t in tiled]
    stacked = torch.zeros(1, 2, 4, 3, 28, 28)
    for i, t in enumerate(tiled):
        stacked[0, i, : t.tiles.shape[0]] = t.tiles
    with torch.inference_mode():
        want = ref.vision_model(stacked, torch.tensor([aspects]))[0]  # [2, 4, 5, dim]
        got = model.vision_model(stacked[0], aspects)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", ["text", "one image", "two images", "adjacent images"])
def test_logits_match_the_reference(vision32_dir, case):
    ref, model = reference(vision32_dir), ours(vision32_dir)
    tokens, sizes = {
        "text": ([128000, 9906, 1917, 11, 1268, 527, 499, 30], []),
        "one image": ([128000, 791, IMAGE, 1115, 374, 264, 8415, 13, 3639], [(60, 30)]),
        "two images": ([128000, IMAGE, 1115, 374, 264, IMAGE, 323, 420, 30, 2650], [(30, 70), (28, 28)]),
        "adjacent images": ([128000, 791, IMAGE, IMAGE, 9606, 1268, 30], [(90, 20), (40, 41)]),
    }[case]
    pil = _images(sizes)
    want = reference_logits(ref, tokens, pil, IMAGE)
    images = [_image_set(tokens, pil)] if pil else None
    got = model.forward_full(torch.tensor([tokens]), images=images, image_token=IMAGE)[0]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    if pil:  # the images matter (gates are far from 0 in tiny checkpoints) ...
        text_only = model.forward_full(torch.tensor([tokens]))[0]
        first = tokens.index(IMAGE)
        assert (text_only[first:] - got[first:]).abs().max() > 1e-2
        # ... and positions before the first <|image|> see none of them
        torch.testing.assert_close(text_only[:first], got[:first], atol=1e-5, rtol=0)


@pytest.mark.parametrize("nested", [False, True])
def test_metas_11b_params_json_parses(nested):
    params = {
        "dim": 4096,
        "ffn_dim_multiplier": 1.3,
        "multiple_of": 1024,
        "n_heads": 32,
        "n_kv_heads": 8,
        "n_layers": 32,
        "norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "use_scaled_rope": True,
        "vision_chunk_size": 560,
        "vision_max_num_chunks": 4,
        "vocab_size": 128256,
    }
    if nested:
        params["vision_model"] = {"cross_attention_adapter": {"num_layers": 8}}
    else:
        params["vision_num_cross_attention_layers"] = 8
    args = ModelArgs.from_dict(params)
    assert is_cross_attention_vision(args) and cross_attention_layer_count(args) == 8
    ensure_model_parallel(1)
    model = CrossAttentionTextModel(args, max_seq_len=16, device="meta")
    assert model.schedule == [3, 7, 11, 15, 19, 23, 27, 31]
    assert model.learnable_embedding.weight.shape == (8, 4096)


def test_preflight_counts_the_text_decoder_exactly(vision32_dir):
    from workbench.checkpoints.preflight import parameter_count

    model = ours(vision32_dir)
    text = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("vision_model."))
    assert parameter_count(ModelArgs.from_checkpoint(vision32_dir)) == text


def test_the_checkpoint_has_metas_names(vision32_dir):
    state = torch.load(vision32_dir / "consolidated.00.pth", weights_only=True, mmap=True)
    assert "text_model.learnable_embedding.weight" in state
    assert "text_model.cross_attention_layers.1.attention.k_norm.weight" in state
    assert "vision_model.vision_encoder.gated_positional_embedding" in state
    assert "vision_model.vision_projection.bias" in state
    assert state["vision_model.vision_projection.weight"].shape == (128, 6 * vision32.TINY_WIDTH)
