"""Image preprocessing parity with llama-models 0.3.0 (``llama4/preprocess.py`` + the chat format's tiling),
plus checks of the torchvision stand-in the reference runs on here, and of image loading.

The reference is run as its chat format runs it: ``VariableSizeImageTransform(tile)(image, max_num_chunks)``
and, when that yields more than one tile, ``ResizeNormalizeImageTransform`` for the global thumbnail.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchvision_standin
from PIL import Image

from workbench.errors import ImageError
from workbench.vision.images import open_image, to_rgb
from workbench.vision.layout import canvas_grids, image_layout
from workbench.vision.preprocess import prepare_image

TILE_ATOL = 1e-5

# (width, height): tiny, square, wide, tall, extreme aspect ratios, exact tile multiples, odd sizes.
SIZES = [
    (1, 1),
    (20, 33),
    (56, 56),
    (57, 20),
    (300, 120),
    (120, 300),
    (113, 449),
    (448, 56),
    (56, 900),
    (224, 224),
    (225, 223),
    (640, 480),
    (37, 512),
]


def reference_tiles(image: Image.Image, tile: int, max_tiles: int) -> tuple[torch.Tensor, tuple[int, int]]:
    torchvision_standin.install()
    from llama_models.llama4.preprocess import ResizeNormalizeImageTransform, VariableSizeImageTransform

    tiles, aspect = VariableSizeImageTransform(tile)(image, max_num_chunks=max_tiles)
    if tiles.shape[0] > 1:
        tiles = torch.cat([tiles, ResizeNormalizeImageTransform(tile, tile)(image)[None]], dim=0)
    return tiles, aspect


def pattern_image(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """A deterministic image with smooth gradients and noise (so resampling differences would show)."""
    gen = torch.Generator().manual_seed(seed)
    ys = torch.linspace(0, 1, height)[:, None]
    xs = torch.linspace(0, 1, width)[None, :]
    base = torch.stack([xs * 255 + 0 * ys, ys * 255 + 0 * xs, (xs + ys) * 127], dim=-1)
    noise = torch.randint(0, 40, (height, width, 3), generator=gen)
    pixels = (base + noise).clamp(0, 255).to(torch.uint8).numpy()
    image = Image.fromarray(pixels, "RGB")
    return image.convert(mode) if mode != "RGB" else image


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tile,max_tiles", [(56, 16), (28, 4)])
def test_tiles_match_the_reference(size, tile, max_tiles):
    image = pattern_image(*size, seed=size[0] * 7 + size[1])
    ref, aspect = reference_tiles(image, tile, max_tiles)
    ours = prepare_image(image, tile, max_tiles)
    assert (ours.layout.rows, ours.layout.cols) == aspect
    assert ours.tiles.shape == ref.shape and ours.tiles.dtype == torch.float32
    assert (ours.tiles - ref).abs().max().item() <= TILE_ATOL


def test_layout_choices_match_the_reference_over_many_sizes():
    torchvision_standin.install()
    from llama_models.llama4.preprocess import VariableSizeImageTransform

    ref = VariableSizeImageTransform(336)
    resolutions = torch.tensor(ref.find_supported_resolutions(max_num_chunks=16, patch_size=336))
    assert [tuple(r) for r in resolutions.tolist()] == [(a * 336, b * 336) for a, b in canvas_grids(16)]
    gen = torch.Generator().manual_seed(3)
    sizes = torch.randint(1, 4000, (400, 2), generator=gen).tolist() + [[336, 336], [672, 336], [337, 336]]
    for width, height in sizes:
        canvas = ref.get_best_fit((width, height), resolutions)
        ours = image_layout(width, height, 336, 16)
        assert ours.canvas == canvas, (width, height)
        target = (min(max(width, 336), canvas[0]), min(max(height, 336), canvas[1]))
        assert ours.resized == tuple(max(v, 1) for v in ref.get_max_res_without_distortion((width, height), target))


def test_many_tiles_and_the_thumbnail():
    image = pattern_image(300, 120)
    prepared = prepare_image(image, 56, 16)
    layout = prepared.layout
    assert layout.rows * layout.cols > 1 and layout.n_tiles == layout.rows * layout.cols + 1
    # the last tile is the whole image squeezed into one tile
    thumb = image.resize((56, 56), Image.Resampling.BILINEAR)
    expected = torch.tensor(list(thumb.tobytes()), dtype=torch.float32).view(56, 56, 3).permute(2, 0, 1) / 255 - 0.5
    assert torch.allclose(prepared.tiles[-1], expected / 0.5, atol=1e-6)
    single = prepare_image(pattern_image(40, 30), 56, 16)
    assert single.layout.n_tiles == 1 and single.tiles.shape == (1, 3, 56, 56)
    # a small image is not blown up: it keeps its size and the rest of the tile is black (-1 after normalizing)
    assert single.layout.resized == (56, 42)
    assert torch.all(single.tiles[0, :, 42:, :] == -1.0)


# --- the stand-in itself, against direct PIL / torch computations ------------------------------------------------


def test_standin_resize_follows_torchvision_semantics():
    tv_f = torchvision_standin
    image = pattern_image(50, 30)
    assert tv_f.resize(image, [30, 50]) is image  # unchanged size returns the input
    resized = tv_f.resize(image, (12, 20))  # (h, w)
    assert resized.size == (20, 12)
    assert resized.tobytes() == image.resize((20, 12), Image.Resampling.BILINEAR).tobytes()
    assert tv_f.resize(image, 15).size == (25, 15)  # an int sets the shorter edge
    tensor = torch.rand(3, 30, 50)
    out = tv_f.resize(tensor, [12, 20])
    expected = F.interpolate(tensor[None], size=[12, 20], mode="bilinear", align_corners=False, antialias=True)[0]
    assert torch.equal(out, expected)
    as_uint8 = (tensor * 255).to(torch.uint8)
    out8 = tv_f.resize(as_uint8, [12, 20])
    direct = (
        F.interpolate(as_uint8[None].float(), size=[12, 20], mode="bilinear", align_corners=False, antialias=True)[0]
        .round()
        .to(torch.uint8)
    )
    assert out8.dtype == torch.uint8 and torch.equal(out8, direct)


def test_standin_to_tensor_and_normalize():
    image = pattern_image(7, 5)
    t = torchvision_standin.to_tensor(image)
    assert t.shape == (3, 5, 7) and t.dtype == torch.float32
    assert torch.equal(t[:, 2, 3], torch.tensor(image.getpixel((3, 2)), dtype=torch.float32) / 255)
    norm = torchvision_standin.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))(t)
    assert torch.equal(norm, (t - 0.5) / 0.5) and not torch.equal(norm, t)


# --- loading images from every accepted form ----------------------------------------------------------------------


def _png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_every_image_form_opens_to_the_same_pixels(tmp_path: Path):
    image = pattern_image(31, 17)
    data = _png_bytes(image)
    path = tmp_path / "pic.png"
    path.write_bytes(data)
    b64 = base64.b64encode(data).decode()
    url = "data:image/png;base64," + b64
    forms = [
        image,
        path,
        data,
        bytearray(data),
        url,
        {"type": "image", "image": image},
        {"type": "image", "image": {"data": b64}},
        {"type": "image", "image": {"url": {"uri": url}}},
        {"type": "image", "image": {"url": {"uri": str(path)}}},
        {"type": "image", "data": data},
        {"type": "image", "image": {"path": str(path)}},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    for form in forms:
        opened = open_image(form)
        assert opened.mode == "RGB" and opened.tobytes() == image.tobytes(), type(form)


def test_rgba_is_composited_on_white_like_the_reference():
    torchvision_standin.install()
    from llama_models.llama4.chat_format import convert_image_to_rgb

    rgba = Image.new("RGBA", (4, 3), (10, 200, 30, 0))
    rgba.putpixel((1, 1), (10, 200, 30, 128))
    assert to_rgb(rgba).tobytes() == convert_image_to_rgb(rgba).tobytes()
    assert to_rgb(rgba).getpixel((0, 0)) == (255, 255, 255)
    gray = pattern_image(5, 5, mode="L")
    assert to_rgb(gray).tobytes() == convert_image_to_rgb(gray).tobytes()


@pytest.mark.parametrize(
    "item,needle",
    [
        (b"not an image", "could not read"),
        ({"type": "image", "image": {"data": "!!!"}}, "base64"),
        (Path("/nonexistent/pic.png"), "does not exist"),
        ({"type": "image", "image": {}}, "needs its pixels"),
        ({"type": "image", "image": {"url": {"uri": "https://example.com/x.png"}}}, "does not download"),
    ],
)
def test_unreadable_images_raise_image_error(item, needle):
    with pytest.raises(ImageError, match=needle):
        open_image(item)
