"""The Llama 4 vision encoder + adapter + projection and image prefill: parity with llama-models 0.3.0 on CPU float32.

The reference is Meta's ``Transformer`` built with ``vision_args`` (``.cuda()`` neutralised as in the oracle), cast
to float32 (its constructor puts the encoder in bfloat16) and loaded *strictly* from the factory's checkpoint, so
the factory must write every vision tensor Meta's model has, under Meta's names.  Image prefill is run as the
reference generator runs it: ``vision_embeddings(images, patch_mask, h)`` then ``forward`` with the masked embedding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torchvision_standin
from _chat_helpers import our_tokenizer
from test_vision_preprocess import pattern_image

from workbench.checkpoints.factory import TINY_LLAMA4, TINY_LLAMA4_VISION
from workbench.checkpoints.load import build_model, build_vision
from workbench.errors import CheckpointError
from workbench.formats import make_formatter
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.vision.preprocess import prepare_image

PARITY_ATOL = 1e-4
_REFERENCE: dict[str, torch.nn.Module] = {}


@pytest.fixture(scope="module")
def vision_dir(make_checkpoint) -> Path:
    return make_checkpoint(TINY_LLAMA4_VISION)


def reference(ckpt_dir: Path) -> torch.nn.Module:
    """Meta's Llama 4 Transformer with its vision encoder, float32, strictly loaded from ``ckpt_dir``."""
    if str(ckpt_dir) not in _REFERENCE:
        torchvision_standin.install()
        from oracle import _construct

        ensure_model_parallel(1)
        params = json.loads((ckpt_dir / "params.json").read_text())
        model = _construct(params, 512).float()
        state = torch.load(ckpt_dir / "consolidated.00.pth", weights_only=True)
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=True)
        _REFERENCE[str(ckpt_dir)] = model.eval()
    return _REFERENCE[str(ckpt_dir)]


def ours(ckpt_dir: Path) -> torch.nn.Module:
    """Our float32 model, vision weights unloaded (the loader reads them from the checkpoint on first use)."""
    ensure_model_parallel(1)
    args = ModelArgs.from_checkpoint(ckpt_dir)
    model = build_model(ckpt_dir, args, device=torch.device("cpu"), dtype=torch.float32, max_seq_len=512)
    model.vision_loader = lambda: build_vision(ckpt_dir, args, device=torch.device("cpu"), dtype=torch.float32)
    return model


def reference_image_logits(
    model: torch.nn.Module, tokens: list[int], tiles: list[torch.Tensor], patch: int
) -> torch.Tensor:
    from llama_models.llama4.datatypes import MaskedEmbedding, TransformerInput

    ids = torch.tensor([tokens])
    mask = (ids == patch).unsqueeze(-1)
    with torch.inference_mode():
        h = model.tok_embeddings(ids)
        embedding = model.vision_embeddings([tiles], mask, h)
        masked = MaskedEmbedding(embedding=embedding, mask=mask)
        out = model.forward(TransformerInput(tokens=ids, tokens_position=0, image_embedding=masked))
    return out.logits[0].float()


def test_encoder_and_projection_match_the_reference(vision_dir):
    ref = reference(vision_dir)
    model = ours(vision_dir)
    assert not model.vision_loaded  # nothing loaded until the first image
    gen = torch.Generator().manual_seed(0)
    tiles = torch.rand(5, 3, 56, 56, generator=gen) * 2 - 1
    with torch.inference_mode():
        expected = ref.vision_projection(
            ref.vision_embeddings.vision_adapter(ref.vision_embeddings.vision_encoder(tiles[:, None]))
        )
        encoder_ref = ref.vision_embeddings.vision_encoder(tiles[:, None])
    got = model.encode_images(tiles)
    assert model.vision_loaded
    assert got.shape == expected.shape == (5, 4, 128)
    assert (got - expected).abs().max().item() <= PARITY_ATOL
    encoder_ours = model.vision_embeddings.vision_encoder(tiles)
    assert (encoder_ours - encoder_ref).abs().max().item() <= PARITY_ATOL
    # tiles are encoded independently: one tile alone gives its row of the batch
    assert (model.encode_images(tiles[3:4]) - got[3:4]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("sizes", [[(40, 30)], [(300, 120)], [(90, 400), (30, 20)]], ids=["one_tile", "wide", "two"])
def test_logits_with_images_match_the_reference(vision_dir, sizes):
    args = ModelArgs.from_checkpoint(vision_dir)
    formatter = make_formatter(our_tokenizer("llama4"), vision_args=args.vision_args)
    images = [pattern_image(w, h, seed=w + h) for w, h in sizes]
    prompt = formatter.encode_prompt([{"role": "user", "content": [*images, "What do you see?"]}])
    tiles = [prepare_image(p.image, 56, layout=p.layout).tiles for p in prompt.images]
    patch = our_tokenizer("llama4").special_tokens["<|patch|>"]
    expected = reference_image_logits(reference(vision_dir), prompt.tokens, tiles, patch)
    model = ours(vision_dir)
    got = model.forward_full(torch.tensor([prompt.tokens]), images=[torch.cat(tiles)], image_token=patch)[0]
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= PARITY_ATOL
    # the images matter: the same tokens without them give other logits
    plain = model.forward_full(torch.tensor([prompt.tokens]))[0]
    assert (plain - expected).abs().max().item() > 1e-2


def test_two_shards_merge_to_the_same_vision_weights(vision_dir, make_checkpoint):
    two = make_checkpoint(TINY_LLAMA4_VISION, n_shards=2)
    args = ModelArgs.from_checkpoint(vision_dir)
    one = build_vision(vision_dir, args, device=torch.device("cpu"), dtype=torch.float32).state_dict()
    merged = build_vision(two, args, device=torch.device("cpu"), dtype=torch.float32).state_dict()
    assert one.keys() == merged.keys() and all(torch.equal(one[k], merged[k]) for k in one)
    shard = torch.load(two / "consolidated.01.pth", weights_only=True)
    assert shard["vision_projection.weight"].shape == (64, 96)  # split on the output dim like Meta's shards
    assert shard["vision_embeddings.vision_encoder.transformer.resblocks.0.attn.wo.weight"].shape == (64, 32)


def test_text_only_checkpoint_has_no_vision(llama4_dir):
    args = ModelArgs.from_checkpoint(llama4_dir)
    with pytest.raises(CheckpointError, match="no vision_args"):
        build_vision(llama4_dir, args, device=torch.device("cpu"), dtype=torch.float32)
    vision_params = {**TINY_LLAMA4, "vision_args": TINY_LLAMA4_VISION["vision_args"]}
    with pytest.raises(CheckpointError, match="cannot take images"):
        build_vision(llama4_dir, ModelArgs.from_dict(vision_params), device=torch.device("cpu"), dtype=torch.float32)
