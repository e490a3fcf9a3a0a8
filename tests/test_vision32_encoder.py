"""Llama 3.2 Vision preprocessing and encoder: parity with llama-models 0.3.0 (``llama3/multimodal``) on CPU, float32.

Tiles and aspect ratios are compared with the reference ``VariableSizeImageTransform`` (run on the tests'
torchvision stand-in).  The encoder and projection are compared with the reference ``VisionEncoder`` built at a
tiny width (its ``width=`` argument; heads, patch, local layers and intermediate layers are Meta's), with
random weights and non-zero gates, loaded into ours under the same names.
"""

from __future__ import annotations

import pytest
import torch
from oracle_vision32 import reference_transform
from test_vision_preprocess import pattern_image

from workbench.errors import CheckpointError
from workbench.models.distributed import ensure_model_parallel
from workbench.models.vision_llama3 import ENCODER_PREFIX, VisionDims, VisionEncoder, stack_tiles
from workbench.vision.tiling_llama3 import chunk_count, tile_image

# (width, height): tiny, square, wide, tall, exact multiples, odd sizes (all within the reference's range).
SIZES = [(1, 1), (20, 33), (28, 28), (57, 20), (300, 120), (120, 300), (113, 449), (56, 28), (29, 27), (640, 480)]
WIDTH = 32  # tiny encoder width (Meta: 1280)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("chunk,max_chunks", [(28, 4), (56, 6)])
def test_tiles_and_aspect_ratios_match_the_reference(size, chunk, max_chunks):
    image = pattern_image(*size, seed=size[0] * 3 + size[1])
    ref_tiles, ref_aspect = reference_transform(chunk)(image, max_num_chunks=max_chunks)
    ours = tile_image(image, chunk, max_chunks)
    assert ours.aspect_ratio == tuple(ref_aspect)
    assert ours.tiles.shape == ref_tiles.shape
    assert torch.equal(ours.tiles, ref_tiles)
    assert chunk_count(*size, chunk, max_chunks) == ours.tiles.shape[0]


def _reference_encoder(n_global: int = 2, max_tiles: int = 4, seed: int = 0) -> torch.nn.Module:
    from llama_models.llama3.multimodal.model import VisionEncoder as RefEncoder

    ensure_model_parallel(1)
    torch.manual_seed(seed)
    enc = RefEncoder(
        max_num_tiles=max_tiles,
        image_size=28,
        patch_size=14,
        width=WIDTH,
        n_global_layers=n_global,
        global_model=True,
        return_intermediate=[3, 7, 15, 23, 30],
    )
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in enc.named_parameters():  # fairscale leaves some weights uninitialised; gates start at 0
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if "gate" in name else 0.2))
    return enc.eval()


def _ours(ref: torch.nn.Module) -> VisionEncoder:
    state = ref.state_dict()
    dims = VisionDims.from_shapes({ENCODER_PREFIX + k: v.shape for k, v in state.items()})
    ours = VisionEncoder(dims, device="cpu", dtype=torch.float32)
    ours.load_state_dict(state, strict=True)
    return ours.eval()


def test_dims_are_read_from_tensor_shapes():
    ref = _reference_encoder(n_global=3)
    dims = VisionDims.from_shapes({ENCODER_PREFIX + k: v.shape for k, v in ref.state_dict().items()})
    assert (dims.width, dims.patch, dims.grid, dims.max_tiles) == (WIDTH, 14, 2, 4)
    assert (dims.n_local_layers, dims.n_global_layers, dims.mlp_hidden) == (32, 3, 4 * WIDTH)
    assert dims.output_dim == 6 * WIDTH and dims.tokens_per_tile == 5


def test_too_few_local_layers_is_a_checkpoint_error():
    ref = _reference_encoder()
    shapes = {
        ENCODER_PREFIX + k: v.shape
        for k, v in ref.state_dict().items()
        if "transformer.resblocks.31" not in k
        and not any(f"transformer.resblocks.{i}." in k and "global" not in k for i in range(16, 32))
    }
    with pytest.raises(CheckpointError, match="at least 31"):
        VisionDims.from_shapes(shapes)


@pytest.mark.parametrize("aspects", [[(1, 1)], [(2, 2), (1, 3)], [(2, 1), (1, 1), (1, 4)]])
def test_encoder_matches_the_reference(aspects):
    ref = _reference_encoder()
    ours = _ours(ref)
    gen = torch.Generator().manual_seed(len(aspects))
    images = [torch.rand(r * c, 3, 28, 28, generator=gen) * 2 - 1 for r, c in aspects]
    tiles = stack_tiles(images, 4)  # [M, 4, 3, 28, 28]
    with torch.inference_mode():
        want = ref(tiles[None], torch.tensor([aspects]))[0]  # [M, 4, 5, 6W]
        got = ours(tiles, aspects)
    assert got.shape == want.shape == (len(aspects), 4, 5, 6 * WIDTH)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
