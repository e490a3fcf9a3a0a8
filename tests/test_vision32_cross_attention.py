"""Llama 3.2 Vision gated cross-attention: parity with llama-models 0.3.0 (``llama3/multimodal/model.py``), CPU float32.

Our block is loaded with the reference ``CrossAttentionTransformerBlock``'s random weights (same names) and fed
the same vision tokens; the reference's masks are built by its own ``create_vision_mask`` / ``_pad_masks`` /
``_get_xattn_mask``, ours by :func:`image_spans` and :class:`ImageState`.
"""

from __future__ import annotations

import pytest
import torch
import torchvision_standin

from workbench.models.args import ModelArgs
from workbench.models.cross_attention import (
    CrossAttentionTransformerBlock,
    ImageSet,
    fusion_schedule,
    image_spans,
    image_state,
)
from workbench.models.distributed import ensure_model_parallel

PARAMS = {
    "dim": 64,
    "n_layers": 4,
    "n_heads": 4,
    "n_kv_heads": 2,
    "vocab_size": 256,
    "multiple_of": 32,
    "norm_eps": 1e-5,
    "vision_chunk_size": 28,
    "vision_num_cross_attention_layers": 2,
}
IMG = 99  # stand-in <|image|> id

torchvision_standin.install()  # the reference multimodal module imports torchvision


def _reference_block(seed: int = 0) -> torch.nn.Module:
    from llama_models.llama3.args import ModelArgs as RefArgs
    from llama_models.llama3.multimodal.model import CrossAttentionTransformerBlock as RefBlock

    ensure_model_parallel(1)
    block = RefBlock(RefArgs(**PARAMS), layer_id=4)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.7 if "gate" in name else 0.2))
            if "norm" in name:
                p.add_(1.0)
    return block.eval()


@pytest.mark.parametrize("n_layers,n_cross", [(32, 8), (100, 20), (4, 2), (3, 1), (5, 2)])
def test_fusion_schedule_matches_the_reference(n_layers, n_cross):
    from llama_models.llama3.multimodal.model import CrossAttentionTransformerText

    class Stub:
        n_llama_layers = n_layers

    assert fusion_schedule(n_layers, n_cross) == CrossAttentionTransformerText._init_fusion_schedule(Stub(), n_cross)


@pytest.mark.parametrize(
    "tokens", [[1, IMG, 2, 3], [1, IMG, 2, IMG, 3, 4], [IMG, IMG, 5, 6, IMG, 2], [1, IMG, IMG, IMG, 9], [1, 2, 3]]
)
def test_image_spans_match_the_reference_vision_mask(tokens):
    from llama_models.llama3.chat_format import create_vision_mask

    want = create_vision_mask(tokens, IMG)
    # the reference marks "to the end" as -1 for one image and len(tokens) for the last of several
    want = [(a, None if b in (-1, len(tokens)) else b) for a, b in want]
    assert image_spans(tokens, IMG) == want


@pytest.mark.parametrize(
    "tokens,aspects",
    [
        ([1, 2, IMG, 3, 4, 5, 6, 7], [(2, 1)]),
        ([1, IMG, 3, 4, IMG, 5, 6, 8, 9], [(1, 1), (2, 2)]),
        ([1, IMG, IMG, 4, 5, 6], [(1, 3), (1, 1)]),
    ],
)
def test_block_matches_the_reference(tokens, aspects):
    from llama_models.llama3.multimodal.model import CrossAttentionTransformerText, _pad_masks

    ref = _reference_block()
    ours = CrossAttentionTransformerBlock(ModelArgs.from_dict(PARAMS), device="cpu", dtype=torch.float32)
    ours.load_state_dict(ref.state_dict(), strict=True)
    gen = torch.Generator().manual_seed(len(tokens))
    chunks, ntok, dim = 4, 5, PARAMS["dim"]
    vision = torch.randn(1, len(aspects), chunks, ntok, dim, generator=gen)  # [B, I, C, N, D]
    x = torch.randn(1, len(tokens), dim, generator=gen)
    with torch.inference_mode():
        cache = ref.compute_xattn_kv_cache(vision.view(1, -1, dim))
        spans = [[a, b] for a, b in image_spans(tokens, IMG)]
        spans = [[a, -1 if b is None else b] for a, b in spans]
        masks = _pad_masks([spans], [[r * c for r, c in aspects]], len(tokens), chunks)
        xmask, full_row = CrossAttentionTransformerText._get_xattn_mask(
            None, len(tokens), "cpu", torch.float32, vision, masks
        )
        want = ref(x, xmask, full_row, cache)
        state = image_state(
            [ours], vision[0], ImageSet([torch.empty(0)] * len(aspects), aspects, image_spans(tokens, IMG))
        )
        visible = state.visible(torch.arange(len(tokens)))
        got = ours(x, state.keys[0], state.values[0], visible)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    before = tokens.index(IMG)
    assert torch.equal(got[:, :before], x[:, :before])  # rows before the first image are untouched
