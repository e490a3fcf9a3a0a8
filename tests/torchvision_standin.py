"""A minimal stand-in for the few torchvision 0.28 transforms Meta's Llama 4 preprocessing uses (tests only).

``llama_models/llama4/preprocess.py`` imports ``torchvision.transforms`` (``Compose``, ``Resize``,
``ToTensor``, ``Normalize``, ``InterpolationMode``) and ``torchvision.transforms.functional.resize``.
No torchvision build for the CPU torch 2.13 can be installed here, so the tests that run the reference
preprocessing install this module tree into ``sys.modules`` instead (never when a real torchvision is
importable, and never touching torch itself).

Each function follows the code of torchvision 0.28.0 (``transforms/functional.py``,
``_functional_pil.py``, ``_functional_tensor.py``, ``transforms.py``):

* ``resize``: the output size rule of ``_compute_resized_output_size`` (an int or 1-sequence sets the
  shorter edge; ``(h, w)`` is exact), the early return when the size is unchanged, PIL images resized
  with ``Image.resize((w, h), filter)`` (PIL always antialiases bilinear/bicubic), tensors with
  ``interpolate(..., align_corners=False, antialias=antialias)`` after casting non-float input to float32
  and rounding it back;
* ``to_tensor``: PIL image -> ``[C, H, W]``, uint8 pixels divided by 255 in torch's default float dtype;
* ``normalize``: ``(x - mean) / std`` per channel with in-place ``sub_``/``div_`` (on a clone unless
  ``inplace``).

``tests/test_vision_preprocess.py`` checks each of these against direct PIL / torch computations.
"""

from __future__ import annotations

import enum
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


_PIL_MODES = {
    InterpolationMode.NEAREST: Image.Resampling.NEAREST,
    InterpolationMode.NEAREST_EXACT: Image.Resampling.NEAREST,
    InterpolationMode.BILINEAR: Image.Resampling.BILINEAR,
    InterpolationMode.BICUBIC: Image.Resampling.BICUBIC,
    InterpolationMode.BOX: Image.Resampling.BOX,
    InterpolationMode.HAMMING: Image.Resampling.HAMMING,
    InterpolationMode.LANCZOS: Image.Resampling.LANCZOS,
}


def _dimensions(img: Any) -> tuple[int, int]:
    if isinstance(img, torch.Tensor):
        return int(img.shape[-2]), int(img.shape[-1])
    return img.size[1], img.size[0]


def _output_size(height: int, width: int, size: Sequence[int], max_size: int | None) -> list[int]:
    if len(size) == 2:
        return [int(size[0]), int(size[1])]
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size[0], int(size[0] * long / short)
    if max_size is not None:
        if max_size <= size[0]:
            raise ValueError(f"max_size = {max_size} must be strictly greater than the requested size {size}")
        if new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    return [new_h, new_w]


def resize(
    img: Any,
    size: int | Sequence[int],
    interpolation: InterpolationMode = InterpolationMode.BILINEAR,
    max_size: int | None = None,
    antialias: bool | None = True,
) -> Any:
    if isinstance(size, int):
        size = [size]
    if len(size) not in (1, 2):
        raise ValueError(f"Size must be an int or a 1 or 2 element tuple/list, not a {len(size)} element tuple/list")
    if max_size is not None and len(size) != 1:
        raise ValueError("max_size should only be passed if size specifies the length of the smaller edge")
    height, width = _dimensions(img)
    out_h, out_w = _output_size(height, width, list(size), max_size)
    if [height, width] == [out_h, out_w]:
        return img
    if not isinstance(img, torch.Tensor):
        return img.resize((out_w, out_h), _PIL_MODES[interpolation])
    mode = interpolation.value
    if antialias is None or mode not in ("bilinear", "bicubic"):
        antialias = False
    x, squeeze, dtype = img, img.ndim < 4, img.dtype
    if squeeze:
        x = x.unsqueeze(0)
    cast = dtype not in (torch.float32, torch.float64)
    if cast:
        x = x.to(torch.float32)
    align = False if mode in ("bilinear", "bicubic") else None
    x = F.interpolate(x, size=[out_h, out_w], mode=mode, align_corners=align, antialias=antialias)
    if mode == "bicubic" and dtype == torch.uint8:
        x = x.clamp(min=0, max=255)
    if squeeze:
        x = x.squeeze(0)
    if cast:
        if dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
            x = torch.round(x)
        x = x.to(dtype)
    return x


def to_tensor(pic: Any) -> torch.Tensor:
    if not isinstance(pic, Image.Image):
        raise TypeError(f"the stand-in ToTensor handles PIL images only, got {type(pic)}")
    if pic.mode not in ("L", "RGB", "RGBA", "1"):
        raise TypeError(f"the stand-in ToTensor handles 8-bit modes only, got {pic.mode}")
    channels = len(pic.getbands())
    raw = torch.frombuffer(
        bytearray(pic.convert("L").tobytes() if pic.mode == "1" else pic.tobytes()), dtype=torch.uint8
    )
    img = raw.view(pic.size[1], pic.size[0], channels).permute(2, 0, 1).contiguous()
    return img.to(dtype=torch.get_default_dtype()).div(255)


def normalize(tensor: torch.Tensor, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> torch.Tensor:
    if not tensor.is_floating_point():
        raise TypeError(f"Input tensor should be a float tensor. Got {tensor.dtype}.")
    if not inplace:
        tensor = tensor.clone()
    mean_t = torch.as_tensor(mean, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
    return tensor.sub_(mean_t).div_(std_t)


class Compose:
    def __init__(self, transforms: Sequence[Any]) -> None:
        self.transforms = list(transforms)

    def __call__(self, img: Any) -> Any:
        for t in self.transforms:
            img = t(img)
        return img


class Resize:
    def __init__(
        self,
        size: int | Sequence[int],
        interpolation: InterpolationMode = InterpolationMode.BILINEAR,
        max_size: int | None = None,
        antialias: bool | None = True,
    ) -> None:
        self.size = size
        self.interpolation = interpolation
        self.max_size = max_size
        self.antialias = antialias

    def __call__(self, img: Any) -> Any:
        return resize(img, self.size, self.interpolation, self.max_size, self.antialias)


class ToTensor:
    def __call__(self, pic: Any) -> torch.Tensor:
        return to_tensor(pic)


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        self.mean, self.std, self.inplace = mean, std, inplace

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return normalize(tensor, self.mean, self.std, self.inplace)


def install() -> None:
    """Register the stand-in as ``torchvision`` unless a real torchvision is importable (or already loaded)."""
    if "torchvision" in sys.modules:
        if getattr(sys.modules["torchvision"], "__workbench_standin__", False) or hasattr(
            sys.modules["torchvision"], "__version__"
        ):
            return
    elif importlib.util.find_spec("torchvision") is not None:
        return
    tv = types.ModuleType("torchvision")
    tv.__workbench_standin__ = True  # type: ignore[attr-defined]
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.resize = resize  # type: ignore[attr-defined]
    functional.to_tensor = to_tensor  # type: ignore[attr-defined]
    functional.normalize = normalize  # type: ignore[attr-defined]
    functional.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
    for name, value in (
        ("Compose", Compose),
        ("Resize", Resize),
        ("ToTensor", ToTensor),
        ("Normalize", Normalize),
        ("InterpolationMode", InterpolationMode),
        ("functional", functional),
    ):
        setattr(transforms, name, value)
    tv.transforms = transforms  # type: ignore[attr-defined]
    sys.modules.update(
        {"torchvision": tv, "torchvision.transforms": transforms, "torchvision.transforms.functional": functional}
    )
