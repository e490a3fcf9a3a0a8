"""Image -> normalized tiles for the Llama 3.2 Vision encoder (PIL + torch; no torchvision).

Llama 3.2 Vision tiles an image the way Llama 4 does (:mod:`.layout`: the canvas of at most
``vision_max_num_chunks`` tiles of ``vision_chunk_size`` pixels that needs the least upscaling, or the least
downscaling, never distorting the image; resize with PIL's bilinear filter; paste onto a black canvas), with
two differences that matter to the encoder:

* pixels are normalized with the CLIP mean and standard deviation per channel (not 0.5 / 0.5);
* there is no global thumbnail: the encoder sees exactly ``rows x cols`` tiles, and the *aspect ratio*
  ``(rows, cols)`` travels with them (it selects the tile and gated position embeddings).

The arithmetic follows Meta's reference ``VariableSizeImageTransform`` operation for operation (uint8 / 255
in float32, then in-place per-channel subtract and divide), so tiles are bit-identical to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.vision.layout import ImageLayout, image_layout
from workbench.vision.preprocess import split_tiles

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_MAX_CHUNKS = 4  # Meta's Llama 3.2 Vision params.json: vision_max_num_chunks


@dataclass
class TiledImage:
    """One image ready for the 3.2 encoder: ``tiles`` [rows*cols, 3, T, T] float32, row-major, and its layout."""

    tiles: torch.Tensor
    layout: ImageLayout

    @property
    def aspect_ratio(self) -> tuple[int, int]:
        """(rows, cols): what Meta's encoder takes as the image's aspect ratio."""
        return (self.layout.rows, self.layout.cols)


def clip_normalized_tensor(image: Any) -> torch.Tensor:
    """RGB PIL image -> float32 [3, H, W]: pixels / 255, minus the CLIP mean, over the CLIP std, per channel."""
    width, height = image.size
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(height, width, 3)  # [H, W, 3]
    x = pixels.permute(2, 0, 1).contiguous().to(torch.float32).div(255)  # [3, H, W]
    mean = torch.tensor(CLIP_MEAN, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(CLIP_STD, dtype=torch.float32).view(3, 1, 1)
    return x.sub_(mean).div_(std)


def tile_image(image: Any, chunk_size: int, max_chunks: int = DEFAULT_MAX_CHUNKS) -> TiledImage:
    """Tile one RGB PIL image for Llama 3.2 Vision (see the module docstring)."""
    from PIL import Image

    if image.mode != "RGB":
        raise ValueError(f"tile_image expects an RGB image, got mode {image.mode!r} (use vision.images.to_rgb)")
    width, height = image.size
    layout = image_layout(width, height, chunk_size, max_chunks)
    resized = image if image.size == layout.resized else image.resize(layout.resized, Image.Resampling.BILINEAR)
    canvas = Image.new("RGB", layout.canvas, (0, 0, 0))
    canvas.paste(resized)
    tiles = split_tiles(clip_normalized_tensor(canvas), layout.rows, layout.cols)  # [R*C, 3, T, T]
    return TiledImage(tiles=tiles.contiguous(), layout=layout)


def chunk_count(width: int, height: int, chunk_size: int, max_chunks: int = DEFAULT_MAX_CHUNKS) -> int:
    """Tiles an image of this size becomes (torch-free: from the layout only)."""
    layout = image_layout(width, height, chunk_size, max_chunks)
    return layout.rows * layout.cols
