"""Image tokens in the Llama 4 chat format: token-for-token parity with ``ChatFormat.encode_dialog_prompt`` of
llama-models 0.3.0 (built with vision args, so it tiles images itself), and the errors for models without images."""

from __future__ import annotations

import base64
import io

import pytest
import torch
import torchvision_standin
from _chat_helpers import our_tokenizer
from PIL import Image
from test_vision_preprocess import pattern_image

from workbench.errors import ImageError, InputError
from workbench.formats import make_formatter
from workbench.models.args import Size, VisionArgs

# Scout's vision_args, and a tiny one of the shape the tiny test checkpoints use.
SCOUT_VISION = VisionArgs(Size(336, 336), Size(14, 14), 1408, 34, 16, 4.0, 4096, 0.5)
TINY_VISION = VisionArgs(Size(56, 56), Size(14, 14), 64, 2, 4, 2.0, 96, 0.5)


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def reference_prompt(dialog: list[dict], vision: VisionArgs, max_tiles: int = 16):
    """The reference's tokens and tile tensors for our dialog (images given as PNG bytes)."""
    torchvision_standin.install()
    from llama_models import datatypes as dt
    from llama_models.llama4.args import VisionArgs as RefVisionArgs
    from llama_models.llama4.chat_format import ChatFormat
    from llama_models.llama4.tokenizer import Tokenizer

    ref_args = RefVisionArgs(
        image_size={"height": vision.image_size.height, "width": vision.image_size.width},
        patch_size={"height": vision.patch_size.height, "width": vision.patch_size.width},
        dim=vision.dim,
        n_layers=vision.n_layers,
        n_heads=vision.n_heads,
        mlp_ratio=vision.mlp_ratio,
        output_dim=vision.output_dim,
        pixel_shuffle_ratio=vision.pixel_shuffle_ratio,
    )
    fmt = ChatFormat(Tokenizer.get_instance(), vision_args=ref_args, max_num_chunks=max_tiles)
    messages = []
    for m in dialog:
        content = m["content"]
        if isinstance(content, list):
            content = [
                dt.RawMediaItem(data=_png(c)) if isinstance(c, Image.Image) else dt.RawTextItem(text=c) for c in content
            ]
        messages.append(dt.RawMessage(role=m["role"], content=content))
    out = fmt.encode_dialog_prompt(messages)
    return out.tokens, out.images or []


def dialogs() -> dict[str, list[dict]]:
    wide, tall, small, square = (
        pattern_image(300, 120, 1),
        pattern_image(90, 400, 2),
        pattern_image(30, 20, 3),
        pattern_image(112, 112, 4),
    )
    return {
        "one_image": [{"role": "user", "content": [wide, "What is in this picture?"]}],
        "text_first": [{"role": "user", "content": ["Compare", small, "and", tall]}],
        "system_and_turns": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [square, "Describe it."]},
            {"role": "assistant", "content": "A gradient."},
            {"role": "user", "content": [tall, "And this one?"]},
        ],
        "image_only": [{"role": "user", "content": [small]}],
    }


@pytest.mark.parametrize("name", list(dialogs()))
@pytest.mark.parametrize("vision", [TINY_VISION, SCOUT_VISION], ids=["tiny", "scout"])
def test_image_tokens_match_the_reference(name, vision):
    dialog = dialogs()[name]
    ref_tokens, ref_images = reference_prompt(dialog, vision)
    formatter = make_formatter(our_tokenizer("llama4"), vision_args=vision)
    prompt = formatter.encode_prompt(dialog)
    assert prompt.tokens == ref_tokens
    assert formatter.encode_dialog(dialog) == ref_tokens
    assert len(prompt.images) == len(ref_images)
    patch = our_tokenizer("llama4").special_tokens["<|patch|>"]
    assert prompt.tokens.count(patch) == sum(img.layout.n_tiles for img in prompt.images) * vision.tokens_per_tile
    from workbench.vision.preprocess import prepare_image

    for ours, ref in zip(prompt.images, ref_images):
        tiles = prepare_image(ours.image, vision.tile_size, layout=ours.layout).tiles
        assert tiles.shape == ref.shape and (tiles - ref).abs().max().item() <= 1e-5


def test_render_shows_the_image_tokens():
    image = pattern_image(300, 120)
    formatter = make_formatter(our_tokenizer("llama4"), vision_args=TINY_VISION)
    text = formatter.render([{"role": "user", "content": [image, "Hi"]}])
    layout = formatter.encode_prompt([{"role": "user", "content": [image]}]).images[0].layout
    assert text.startswith("<|begin_of_text|><|header_start|>user<|header_end|>\n\n<|image_start|><|patch|>")
    assert text.count("<|tile_y_separator|>") == layout.rows
    assert text.count("<|tile_x_separator|>") == layout.rows * (layout.cols - 1)
    assert text.count("<|patch|>") == layout.n_tiles * TINY_VISION.tokens_per_tile
    assert "<|image|>" in text and "<|image_end|>Hi<|eot|>" in text


def test_image_forms_give_the_same_prompt(tmp_path):
    image = pattern_image(90, 40)
    data = _png(image)
    path = tmp_path / "x.png"
    path.write_bytes(data)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    formatter = make_formatter(our_tokenizer("llama4"), vision_args=TINY_VISION)
    forms = [image, path, data, url, {"type": "image", "image": {"url": {"uri": url}}}]
    prompts = [formatter.encode_prompt([{"role": "user", "content": [f, "hi"]}]) for f in forms]
    assert all(p.tokens == prompts[0].tokens for p in prompts)
    assert all(p.images[0].image.tobytes() == image.tobytes() for p in prompts)


def test_llama_stack_and_llama_models_message_objects():
    torchvision_standin.install()
    from llama_models import datatypes as dt
    from llama_stack.apis.common.content_types import ImageContentItem, TextContentItem, _URLOrData
    from llama_stack.apis.inference import UserMessage

    image = pattern_image(90, 40)
    data = _png(image)
    formatter = make_formatter(our_tokenizer("llama4"), vision_args=TINY_VISION)
    expected = formatter.encode_prompt([{"role": "user", "content": [image, "hi"]}]).tokens
    stack = UserMessage(
        content=[ImageContentItem(image=_URLOrData(data=base64.b64encode(data).decode())), TextContentItem(text="hi")]
    )
    assert formatter.encode_prompt([stack]).tokens == expected
    raw = dt.RawMessage(role="user", content=[dt.RawMediaItem(data=data), dt.RawTextItem(text="hi")])
    assert formatter.encode_prompt([raw]).tokens == expected


def test_models_without_images_say_why():
    image = pattern_image(30, 30)
    dialog = [{"role": "user", "content": [image, "hi"]}]
    with pytest.raises(ImageError, match="Llama 3"):
        make_formatter(our_tokenizer("llama3")).encode_dialog(dialog)
    with pytest.raises(ImageError, match="vision_args"):
        make_formatter(our_tokenizer("llama4")).encode_dialog(dialog)
    with pytest.raises(ImageError, match="could not read"):
        make_formatter(our_tokenizer("llama4"), vision_args=TINY_VISION).encode_dialog(
            [{"role": "user", "content": [b"garbage", "hi"]}]
        )
    with pytest.raises(InputError, match="not supported"):
        make_formatter(our_tokenizer("llama4"), vision_args=TINY_VISION).encode_dialog(
            [{"role": "user", "content": [{"type": "video", "video": "x"}]}]
        )


def test_text_that_looks_like_image_tokens_stays_text():
    formatter = make_formatter(our_tokenizer("llama4"), vision_args=TINY_VISION)
    ids = formatter.encode_dialog([{"role": "user", "content": "<|image|><|patch|>"}])
    patch = our_tokenizer("llama4").special_tokens["<|patch|>"]
    assert patch not in ids and torch.tensor(ids).numel() > 8


@pytest.mark.parametrize("vision", [TINY_VISION, SCOUT_VISION], ids=["tiny", "scout"])
def test_raw_content_prompt_matches_reference_encode_content(vision):
    torchvision_standin.install()
    from llama_models import datatypes as dt
    from llama_models.llama4.args import VisionArgs as RefVisionArgs
    from llama_models.llama4.chat_format import ChatFormat
    from llama_models.llama4.tokenizer import Tokenizer

    ref_args = RefVisionArgs(
        **{**vision.__dict__, "image_size": vision.image_size.__dict__, "patch_size": vision.patch_size.__dict__}
    )
    ref = ChatFormat(Tokenizer.get_instance(), vision_args=ref_args)
    formatter = make_formatter(our_tokenizer("llama4"), vision_args=vision)
    image = pattern_image(300, 120)
    for ours_items, ref_items in (
        (
            ["A picture:", image, "shows"],
            [dt.RawTextItem(text="A picture:"), dt.RawMediaItem(data=_png(image)), dt.RawTextItem(text="shows")],
        ),
        ([image, "shows"], [dt.RawMediaItem(data=_png(image)), dt.RawTextItem(text="shows")]),
    ):
        prompt = formatter.encode_content(ours_items)
        assert prompt.tokens == ref.encode_content(ref_items).tokens and len(prompt.images) == 1
