"""Where an image goes on the tile canvas: pure arithmetic, no torch (the chat format needs it for tokens).

Meta's Llama 4 preprocessing never distorts an image.  It picks a *canvas* of whole tiles (at most
``max_tiles`` of them, in any rows x columns arrangement), scales the image to fit that canvas without
changing its aspect ratio, pads the rest with black, and cuts the canvas into tiles.  The canvas is the
one that needs the least upscaling (or, when every canvas is smaller than the image, the least
downscaling); among equal scales the smallest canvas wins, and among equal canvases the first in
Meta's enumeration order.

The scale comparison is done in float32, exactly as the reference's tensor arithmetic does it, so that
near-ties between canvases resolve the same way.  The resize target itself is computed in float64, as
the reference's plain Python does.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass


def _f32(x: float) -> float:
    """``x`` rounded to float32 (float64 division then rounding equals float32 division for these ints)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def canvas_grids(max_tiles: int) -> list[tuple[int, int]]:
    """Every (a, b) tile grid with a * b <= max_tiles, in the reference's order.

    The order matters only for ties: grids are produced for tile counts from ``max_tiles`` down to 1,
    factor pairs ascending, and grouped by aspect ratio in order of first appearance.
    """
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for count in range(max_tiles, 0, -1):
        for a in sorted(d for d in range(1, count + 1) if count % d == 0):
            by_ratio.setdefault(a / (count // a), []).append((a, count // a))
    return [grid for group in by_ratio.values() for grid in group]


@dataclass(frozen=True)
class ImageLayout:
    """How one image is tiled.

    ``size`` is the original (width, height); ``resized`` the (width, height) it is scaled to; ``canvas``
    the padded (width, height), ``rows`` x ``cols`` tiles of ``tile_size``.  With more than one tile a
    global thumbnail (the whole image squeezed into one tile) follows the tiles.
    """

    size: tuple[int, int]
    resized: tuple[int, int]
    canvas: tuple[int, int]
    rows: int
    cols: int
    tile_size: int

    @property
    def n_tiles(self) -> int:
        """Tiles the encoder sees: the grid, plus the global thumbnail when the grid has more than one."""
        grid = self.rows * self.cols
        return grid + 1 if grid > 1 else grid


def best_canvas(width: int, height: int, tile_size: int, max_tiles: int) -> tuple[int, int]:
    """The canvas (width, height) in pixels that the image is fitted into (see the module docstring)."""
    canvases = [(a * tile_size, b * tile_size) for a, b in canvas_grids(max_tiles)]
    scales = []
    for cw, ch in canvases:
        sw, sh = _f32(cw / width), _f32(ch / height)
        scales.append(sh if sw > sh else sw)  # the limiting side
    upscales = [s for s in scales if s >= 1]
    chosen = min(upscales) if upscales else max(s for s in scales if s < 1)
    candidates = [c for c, s in zip(canvases, scales) if s == chosen]
    return min(candidates, key=lambda c: c[0] * c[1])  # first of the smallest (min keeps the first on ties)


def fit_without_distortion(width: int, height: int, canvas: tuple[int, int], tile_size: int) -> tuple[int, int]:
    """(width, height) the image is resized to: as large as fits the canvas, but upscaled only up to one tile
    side (a small image stays small rather than being blown up to the whole canvas)."""
    target_w = min(max(width, tile_size), canvas[0])
    target_h = min(max(height, tile_size), canvas[1])
    scale_w = target_w / width
    scale_h = target_h / height
    if scale_w < scale_h:
        new_w, new_h = target_w, min(math.floor(height * scale_w), target_h)
    else:
        new_w, new_h = min(math.floor(width * scale_h), target_w), target_h
    return max(new_w, 1), max(new_h, 1)


def image_layout(width: int, height: int, tile_size: int, max_tiles: int) -> ImageLayout:
    """The full tiling plan of a ``width`` x ``height`` image."""
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    canvas = best_canvas(width, height, tile_size, max_tiles)
    resized = fit_without_distortion(width, height, canvas, tile_size)
    return ImageLayout(
        size=(width, height),
        resized=resized,
        canvas=canvas,
        rows=canvas[1] // tile_size,
        cols=canvas[0] // tile_size,
        tile_size=tile_size,
    )
