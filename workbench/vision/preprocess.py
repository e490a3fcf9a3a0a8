"""Image -> normalized tiles for the Llama 4 vision encoder (PIL + torch; no torchvision).

Steps, following Meta's reference preprocessing: choose the canvas and resize target
(:mod:`.layout`), resize with PIL's bilinear filter (which antialiases when shrinking), paste onto a
black canvas, scale pixels to [0, 1] and normalize with mean 0.5 and std 0.5 (so to [-1, 1]), cut the
canvas into ``rows x cols`` tiles in row-major order, and, when there is more than one tile, append a
global thumbnail: the whole original image resized (with distortion) to one tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.vision.layout import ImageLayout, image_layout

MEAN = 0.5
STD = 0.5
DEFAULT_MAX_TILES = 16  # Meta's chat format default (max_num_chunks)


@dataclass
class PreparedImage:
    """One image ready for the encoder: ``tiles`` [n_tiles, 3, tile, tile] float32 and how it was tiled."""

    tiles: torch.Tensor
    layout: ImageLayout


def _bilinear(image: Any, width: int, height: int) -> Any:
    from PIL import Image

    if image.size == (width, height):
        return image
    return image.resize((width, height), Image.Resampling.BILINEAR)


def to_normalized_tensor(image: Any) -> torch.Tensor:
    """RGB PIL image -> float32 [3, H, W]: pixels / 255, then (x - 0.5) / 0.5."""
    width, height = image.size
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(height, width, 3)  # [H, W, 3]
    x = pixels.permute(2, 0, 1).contiguous().to(torch.float32).div(255)  # [3, H, W]
    return x.sub_(MEAN).div_(STD)


def split_tiles(canvas: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """[3, rows*T, cols*T] -> [rows*cols, 3, T, T], tiles in row-major order."""
    channels, height, width = canvas.shape
    tile_h, tile_w = height // rows, width // cols
    grid = canvas.view(channels, rows, tile_h, cols, tile_w)
    return grid.permute(1, 3, 0, 2, 4).reshape(rows * cols, channels, tile_h, tile_w)


def prepare_image(
    image: Any, tile_size: int, max_tiles: int = DEFAULT_MAX_TILES, layout: ImageLayout | None = None
) -> PreparedImage:
    """Tile one RGB PIL image (see the module docstring); ``layout`` skips recomputing the plan."""
    from PIL import Image

    if image.mode != "RGB":
        raise ValueError(f"prepare_image expects an RGB image, got mode {image.mode!r} (use vision.images.to_rgb)")
    width, height = image.size
    layout = layout or image_layout(width, height, tile_size, max_tiles)
    resized = _bilinear(image, *layout.resized)
    canvas = Image.new("RGB", layout.canvas, (0, 0, 0))
    canvas.paste(resized)
    tiles = split_tiles(to_normalized_tensor(canvas), layout.rows, layout.cols)  # [R*C, 3, T, T]
    if layout.rows * layout.cols > 1:
        thumbnail = to_normalized_tensor(_bilinear(image, tile_size, tile_size))[None]  # [1, 3, T, T]
        tiles = torch.cat([tiles, thumbnail], dim=0)
    return PreparedImage(tiles=tiles, layout=layout)
