"""Image items in message content: recognising them and opening them as RGB PIL images (no torch here).

Accepted anywhere a user message's content list accepts a text item:

* a ``PIL.Image.Image``;
* a ``pathlib.Path`` (any ``os.PathLike``) to an image file;
* raw encoded bytes (``bytes``, ``bytearray``, ``memoryview``) of a PNG/JPEG/... file;
* a base64 data URL string ``"data:image/png;base64,..."``;
* Llama Stack's item ``{"type": "image", "image": X}`` where X is any of the above, ``{"data": base64 | bytes}``,
  ``{"url": {"uri": data URL or file path}}`` or ``{"url": "..."}``, or ``{"path": ...}``; the flat forms
  ``{"type": "image", "data" | "url" | "path": ...}`` (llama-models' ``RawMediaItem`` dumps to one) and OpenAI's
  ``{"type": "image_url", "image_url": {"url": ...}}``.

Images are converted to RGB as Meta's reference does: RGBA is composited onto white, every other mode
is converted with ``Image.convert("RGB")``.  Web URLs are refused (workbench never downloads): fetch the
file first.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from pathlib import Path
from typing import Any

from workbench.errors import ImageError

IMAGE_TYPES = ("image", "image_url")


def looks_like_data_url(text: str) -> bool:
    return text.startswith("data:image/") and ";base64," in text[:100]


def is_image_item(item: Any) -> bool:
    """True for every content item this module would try to open as an image (valid or not)."""
    if isinstance(item, (bytes, bytearray, memoryview, os.PathLike)):
        return True
    if isinstance(item, str):
        return looks_like_data_url(item)
    if isinstance(item, dict):
        return item.get("type") in IMAGE_TYPES
    if getattr(item, "type", None) in IMAGE_TYPES:  # pydantic content items of llama-stack / llama-models
        return True
    return _is_pil(item)


def _is_pil(item: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a dependency
        return False
    return isinstance(item, Image.Image)


def open_image(item: Any) -> Any:
    """The item as an RGB ``PIL.Image.Image``; anything unreadable raises :class:`ImageError`."""
    from PIL import Image

    source = _source(item)
    if isinstance(source, Image.Image):
        image = source
    else:
        data, where = source
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except Exception as exc:  # PIL raises UnidentifiedImageError, OSError (truncated), ValueError, ...
            raise ImageError(
                f"could not read the image {where} ({type(exc).__name__}: {exc}); give a PNG, JPEG, GIF, WebP or "
                "BMP file, its bytes, a base64 data URL, or a PIL image"
            ) from exc
    if image.width <= 0 or image.height <= 0:
        raise ImageError(f"the image {where_of(item)} is empty ({image.width}x{image.height} pixels)")
    return to_rgb(image)


def to_rgb(image: Any) -> Any:
    """RGB copy of ``image``: transparency of RGBA images becomes white (Meta's convention)."""
    from PIL import Image

    if image.mode == "RGBA":
        out = Image.new("RGB", image.size, (255, 255, 255))
        out.paste(image, mask=image.split()[3])
        return out
    return image.convert("RGB")


def where_of(item: Any) -> str:
    if isinstance(item, os.PathLike):
        return f"at {os.fspath(item)!r}"
    return f"({type(item).__name__})"


def _source(item: Any) -> Any:
    """A PIL image, or (encoded bytes, description for errors)."""
    if _is_pil(item):
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item), f"({len(item)} bytes)"
    if isinstance(item, os.PathLike):
        return _read_path(Path(os.fspath(item)))
    if isinstance(item, str):
        return _from_string(item)
    if not isinstance(item, dict) and hasattr(item, "model_dump"):  # pydantic items (llama-stack, llama-models)
        return _source(_pydantic_item(item))
    if isinstance(item, dict):
        kind = item.get("type")
        if kind == "image_url":
            inner = item.get("image_url")
            url = inner.get("url") if isinstance(inner, dict) else inner
            return _from_url(url)
        if "image" in item:
            inner = item["image"]
            if isinstance(inner, dict):
                return _from_fields(inner)
            return _source(inner)
        return _from_fields(item)
    raise ImageError(f"cannot use a {type(item).__name__} as an image; see workbench.vision.images for the forms")


def _pydantic_item(item: Any) -> Any:
    image = getattr(item, "image", None)
    if image is not None:  # llama-stack ImageContentItem(image=_URLOrData(url=URL(uri=...), data=bytes|b64))
        data = getattr(image, "data", None)
        url = getattr(image, "url", None)
        if data is not None:
            return {"type": "image", "data": data}
        return {"type": "image", "url": getattr(url, "uri", url)}
    data = getattr(item, "data", None)  # llama-models RawMediaItem(data=bytes | BytesIO)
    if hasattr(data, "getvalue"):
        data = data.getvalue()
    return {"type": "image", "data": data}


def _from_fields(fields: dict[str, Any]) -> Any:
    if fields.get("data") is not None:
        data = fields["data"]
        if isinstance(data, (bytes, bytearray, memoryview)):
            return bytes(data), f"({len(data)} bytes)"
        if isinstance(data, str):
            return _decode_base64(data.split(",", 1)[1] if looks_like_data_url(data) else data)
        return _source(data)
    if fields.get("url") is not None:
        url = fields["url"]
        return _from_url(url.get("uri") if isinstance(url, dict) else url)
    if fields.get("path") is not None:
        return _read_path(Path(os.fspath(fields["path"])))
    raise ImageError(
        "an image item needs its pixels: give {'type': 'image', 'image': PIL image | Path | bytes}, "
        "{'type': 'image', 'image': {'data': base64}} or {'type': 'image', 'image': {'url': {'uri': data URL}}}"
    )


def _from_url(url: Any) -> Any:
    if not isinstance(url, str):
        raise ImageError(f"an image url must be a string, got {type(url).__name__}")
    if looks_like_data_url(url):
        return _decode_base64(url.split(",", 1)[1])
    if url.startswith("file://"):
        return _read_path(Path(url[len("file://") :]))
    if url.startswith(("http://", "https://")):
        raise ImageError(
            f"workbench does not download images ({url[:80]}); fetch the file first and pass its path, bytes or a "
            "data URL"
        )
    return _read_path(Path(url))


def _from_string(text: str) -> Any:
    if looks_like_data_url(text):
        return _decode_base64(text.split(",", 1)[1])
    raise ImageError("a plain string is text; give images as a PIL image, a Path, bytes or a data URL")


def _decode_base64(text: str) -> tuple[bytes, str]:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(
            f"an image's base64 data does not decode ({exc}); check the data URL or base64 string"
        ) from exc
    return data, f"(base64, {len(data)} bytes)"


def _read_path(path: Path) -> tuple[bytes, str]:
    path = path.expanduser()
    try:
        return path.read_bytes(), f"at {str(path)!r}"
    except FileNotFoundError:
        raise ImageError(f"image file {str(path)!r} does not exist; check the path") from None
    except OSError as exc:
        raise ImageError(f"cannot read image file {str(path)!r} ({exc})") from exc
