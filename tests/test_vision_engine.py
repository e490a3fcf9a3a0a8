"""Images through the engine's chat APIs on a tiny Llama 4 checkpoint with vision weights: greedy parity with
llama-models 0.3.0, batching rows with and without images, lazy loading of the vision weights, model parallel
2 == 1, and the errors for images a model cannot take."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
import torch
from PIL import Image
from test_vision_model import reference, reference_image_logits
from test_vision_preprocess import pattern_image

import workbench as wb
from workbench.checkpoints.factory import TINY_LLAMA4_VISION
from workbench.errors import ImageError, PromptTooLongError
from workbench.session import build_engine, resolve_settings
from workbench.vision.preprocess import prepare_image

SETTINGS = dict(max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32", quantization="none")


@pytest.fixture(scope="module")
def vision_dir(make_checkpoint) -> Path:
    return make_checkpoint(TINY_LLAMA4_VISION)


@pytest.fixture(scope="module")
def engine(vision_dir):
    engine = build_engine(resolve_settings(vision_dir, **SETTINGS))
    yield engine
    engine.close()


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def dialogs() -> list[list[dict]]:
    """Rows with one, two and no images, in the different accepted forms."""
    wide, tall, small = pattern_image(300, 120, 1), pattern_image(90, 400, 2), pattern_image(30, 20, 3)
    url = "data:image/png;base64," + base64.b64encode(png(tall)).decode()
    return [
        [{"role": "user", "content": [wide, "Describe the picture."]}],
        [{"role": "user", "content": "Tell me about llamas."}],
        [
            {
                "role": "user",
                "content": ["Compare", {"type": "image", "image": {"url": {"uri": url}}}, "with", png(small)],
            }
        ],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
        [{"role": "user", "content": [small]}],
    ]


def reference_greedy_with_images(ckpt_dir: Path, engine: wb.Engine, dialog: list[dict], max_tokens: int) -> list[int]:
    """Cache-free greedy decoding with Meta's model: every step re-runs the prompt (images included) + output."""
    prompt = engine.formatter.encode_prompt(dialog)
    tiles = [prepare_image(p.image, 56, layout=p.layout).tiles for p in prompt.images]
    patch = engine.tokenizer.special_tokens["<|patch|>"]
    stops = set(engine.tokenizer.stop_tokens)
    seq, out = list(prompt.tokens), []
    for _ in range(max_tokens):
        token = int(torch.argmax(reference_image_logits(reference(ckpt_dir), seq, tiles, patch)[-1]))
        if token in stops:
            break
        out.append(token)
        seq.append(token)
    return out


@pytest.mark.timeout(600)
def test_greedy_chat_with_images_matches_the_reference(engine, vision_dir):
    for dialog in (dialogs()[0], dialogs()[2]):
        ours = engine.chat_completion(dialog, max_tokens=8, temperature=0.0)
        assert ours.tokens == reference_greedy_with_images(vision_dir, engine, dialog, 8)


@pytest.mark.timeout(600)
def test_batched_rows_with_and_without_images_equal_each_row_alone(engine):
    rows = dialogs()
    batched = engine.batch_chat_completion(rows, max_tokens=10, temperature=0.0)
    alone = [engine.chat_completion(d, max_tokens=10, temperature=0.0) for d in rows]
    assert [b.tokens for b in batched] == [a.tokens for a in alone]
    assert all(len(b.tokens) > 0 for b in batched)
    # the image changes the answer (so the vision path really ran)
    swapped = [{"role": "user", "content": [pattern_image(300, 120, 9), "Describe the picture."]}]
    assert engine.chat_completion(swapped, max_tokens=10).tokens != batched[0].tokens
    streamed = list(engine.chat_completion(rows[0], max_tokens=10, stream=True))
    assert streamed[-1].tokens == batched[0].tokens


@pytest.mark.timeout(600)
def test_vision_weights_load_on_first_image_or_when_asked(vision_dir):
    engine = build_engine(resolve_settings(vision_dir, **SETTINGS))
    try:
        assert engine.info()["vision"] == "not loaded"
        assert "vision" not in engine.memory()["by_kind"]
        text_bytes = engine.memory()["weights_bytes"]
        engine.chat_completion([{"role": "user", "content": "hi"}], max_tokens=2)
        assert engine.info()["vision"] == "not loaded"  # text never loads it
        engine.chat_completion([{"role": "user", "content": [pattern_image(40, 40), "hi"]}], max_tokens=2)
        assert engine.info()["vision"] == "loaded"
        vision_bytes = engine.memory()["by_kind"]["vision"]
        assert vision_bytes > 0 and engine.memory()["weights_bytes"] == text_bytes + vision_bytes
    finally:
        engine.close()
    wb.unload()
    try:
        eager = wb.load(str(vision_dir), load_vision=True, **SETTINGS)
        assert eager.info()["vision"] == "loaded"
        assert wb.load(str(vision_dir), **SETTINGS) is eager  # same settings: the same engine
    finally:
        wb.unload()


@pytest.mark.timeout(600)
def test_errors_name_the_problem_and_the_engine_stays_usable(engine, llama4_dir, llama3_dir):
    image = pattern_image(60, 60)
    for folder, needle in ((llama4_dir, "vision_args"), (llama3_dir, "Llama 3")):
        text_only = build_engine(resolve_settings(folder, max_seq_len=64, max_batch_size=1))
        try:
            with pytest.raises(ImageError, match=needle):
                text_only.chat_completion([{"role": "user", "content": [image, "hi"]}], max_tokens=2)
            with pytest.raises(ImageError):
                text_only.load_vision()
            assert text_only.info()["vision"] is None
        finally:
            text_only.close()
    with pytest.raises(ImageError, match="could not read"):
        engine.chat_completion([{"role": "user", "content": [b"\x89PNG broken", "hi"]}], max_tokens=2)
    big = [{"role": "user", "content": [pattern_image(56 * 4, 56 * 4)] * 4}]  # 4 images x 17 tiles x 4 tokens
    with pytest.raises(PromptTooLongError, match="images"):
        engine.chat_completion(big, max_tokens=2)
    assert len(engine.chat_completion(dialogs()[0], max_tokens=3).tokens) == 3


@pytest.mark.timeout(900)
def test_model_parallel_2_equals_1(engine, vision_dir, make_checkpoint):
    rows = dialogs()
    expected = [r.tokens for r in engine.batch_chat_completion(rows, max_tokens=8)]
    for folder in (vision_dir, make_checkpoint(TINY_LLAMA4_VISION, n_shards=2)):
        mp2 = build_engine(resolve_settings(folder, model_parallel_size=2, **SETTINGS))
        try:
            assert mp2.info()["vision"] == "not loaded"
            assert [r.tokens for r in mp2.batch_chat_completion(rows, max_tokens=8)] == expected
            assert mp2.info()["vision"] == "loaded"
        finally:
            mp2.close()


def test_completion_with_raw_text_and_images(engine):
    image = pattern_image(300, 120)
    raw = engine.completion(["A picture:", image, "It shows"], max_tokens=5)
    prompt = engine.formatter.encode_content(["A picture:", image, "It shows"])
    assert raw.prompt_tokens == len(prompt.tokens) and raw.tokens == engine.completion(prompt, max_tokens=5).tokens
    assert prompt.tokens[0] == engine.tokenizer.special_tokens["<|begin_of_text|>"]
