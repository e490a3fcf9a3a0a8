"""Llama 3.2 Vision through the engine on a tiny factory checkpoint: prompt tokens equal to the reference chat format,
greedy rows equal to the reference's cache-free greedy (one and two images), batched rows equal to each row alone,
logits with images, streaming and the tool loop with images, model parallel 2 equal to 1, and the errors.

The reference is ``llama_models.llama3`` 0.3.0 (``ChatFormat`` with ``RawMediaItem`` content, and the multimodal
``CrossAttentionTransformer`` loaded strictly from the same checkpoint; see ``oracle_vision32.py``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Literal

import pytest
import torch
import torchvision_standin
from _chat_helpers import our_tokenizer
from oracle_vision32 import IMAGE_TOKEN_IN_MODEL, reference_greedy, reference_logits, reference_vision_model
from PIL import Image
from test_vision_preprocess import pattern_image

import workbench as wb
from workbench.checkpoints.vision32 import TINY_LLAMA32_VISION
from workbench.errors import ImageError, PromptTooLongError
from workbench.formats import make_formatter
from workbench.session import build_engine, resolve_settings

SETTINGS = dict(max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32", quantization="none")
_REF: dict[str, torch.nn.Module] = {}


@pytest.fixture(scope="module")
def vision32_dir(make_checkpoint) -> Path:
    return make_checkpoint(TINY_LLAMA32_VISION)


@pytest.fixture(scope="module")
def engine(vision32_dir):
    engine = build_engine(resolve_settings(vision32_dir, **SETTINGS))
    yield engine
    engine.close()


def reference(ckpt: Path) -> torch.nn.Module:
    if "model" not in _REF:
        params = json.loads((ckpt / "params.json").read_text())
        _REF["model"] = reference_vision_model(params, torch.load(ckpt / "consolidated.00.pth", weights_only=True))
    return _REF["model"]


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def dialogs() -> list[list[dict]]:
    """Rows with one image, none, two (one given as PNG bytes), a system prompt, and an image alone."""
    wide, tall, small = pattern_image(60, 25, 1), pattern_image(20, 70, 2), pattern_image(15, 12, 3)
    return [
        [{"role": "user", "content": [wide, "Describe the picture."]}],
        [{"role": "user", "content": "Tell me about llamas."}],
        [{"role": "user", "content": ["Compare", tall, "with", png(small)]}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
        [{"role": "user", "content": [small]}],
    ]


def reference_prompt(dialog: list[dict]) -> tuple[list[int], list[Image.Image]]:
    """The reference chat format's tokens (its 128256 image id mapped back to <|image|>) and images."""
    torchvision_standin.install()
    from llama_models import datatypes as dt
    from llama_models.llama3.chat_format import ChatFormat
    from llama_models.llama3.tokenizer import Tokenizer

    tokenizer = Tokenizer.get_instance()
    messages = []
    for m in dialog:
        content = m["content"]
        if isinstance(content, list):
            content = [
                dt.RawMediaItem(data=png(c) if isinstance(c, Image.Image) else c)
                if not isinstance(c, str)
                else dt.RawTextItem(text=c)
                for c in content
            ]
        messages.append(dt.RawMessage(role=m["role"], content=content))
    out = ChatFormat(tokenizer).encode_dialog_prompt(messages)
    image = tokenizer.special_tokens["<|image|>"]
    tokens = [image if t == IMAGE_TOKEN_IN_MODEL else t for t in out.tokens]
    return tokens, (out.vision.images if out.vision is not None else [])


@pytest.mark.parametrize("row", range(5))
def test_prompt_tokens_match_the_reference_chat_format(row):
    dialog = dialogs()[row]
    formatter = make_formatter(our_tokenizer("llama3"), "Llama3.2-11B-Vision-Instruct", cross_attention_tiles=(28, 4))
    prompt = formatter.encode_prompt(dialog)
    ref_tokens, ref_images = reference_prompt(dialog)
    assert prompt.tokens == ref_tokens
    assert [im.image.size for im in prompt.images] == [im.size for im in ref_images]
    assert prompt.tokens.count(our_tokenizer("llama3").special_tokens["<|image|>"]) == len(prompt.images)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("row", [0, 2])
def test_greedy_chat_with_images_matches_the_reference(engine, vision32_dir, row):
    dialog = dialogs()[row]
    ours = engine.chat_completion(dialog, max_tokens=6, temperature=0.0, logprobs=1)
    prompt = engine.formatter.encode_prompt(dialog)
    image = engine.tokenizer.special_tokens["<|image|>"]
    pil = [im.image for im in prompt.images]
    want = reference_greedy(reference(vision32_dir), prompt.tokens, pil, image, 6, engine.tokenizer.stop_tokens)
    assert ours.tokens == want
    # and every decode step's log-probability equals the reference's (the cached image keys/values in decode)
    logits = reference_logits(reference(vision32_dir), prompt.tokens + want, pil, image)
    n = len(prompt.tokens)
    ref_lp = torch.log_softmax(logits[n - 1 : n - 1 + len(want)], dim=-1)[torch.arange(len(want)), torch.tensor(want)]
    torch.testing.assert_close(torch.tensor([lp.logprob for lp in ours.logprobs]), ref_lp, atol=1e-4, rtol=0)


@pytest.mark.timeout(600)
def test_logits_with_images_match_the_reference(engine, vision32_dir):
    prompts = [engine.formatter.encode_prompt(d) for d in dialogs()[:3]]
    got = engine.logits(prompts)
    image = engine.tokenizer.special_tokens["<|image|>"]
    for prompt, ours in zip(prompts, got):
        want = reference_logits(reference(vision32_dir), prompt.tokens, [im.image for im in prompt.images], image)
        torch.testing.assert_close(ours, want, atol=1e-4, rtol=0)
    text_only = engine.logits([prompts[0].tokens])[0]  # the same ids without their image differ after it
    first = prompts[0].tokens.index(image)
    assert (text_only[first:] - got[0][first:]).abs().max() > 1e-2


@pytest.mark.timeout(600)
def test_batched_rows_with_and_without_images_equal_each_row_alone(engine):
    rows = dialogs()
    batched = engine.batch_chat_completion(rows, max_tokens=8, temperature=0.0)
    alone = [engine.chat_completion(d, max_tokens=8, temperature=0.0) for d in rows]
    assert [b.tokens for b in batched] == [a.tokens for a in alone]
    assert all(len(b.tokens) > 0 for b in batched)
    swapped = [{"role": "user", "content": [pattern_image(60, 25, 9), "Describe the picture."]}]
    first = engine.chat_completion(swapped, max_tokens=1, logprobs=1).logprobs[0].logprob
    assert abs(first - engine.chat_completion(rows[0], max_tokens=1, logprobs=1).logprobs[0].logprob) > 1e-4
    streamed = list(engine.chat_completion(rows[2], max_tokens=8, stream=True))
    assert streamed[-1].tokens == batched[2].tokens
    raw = engine.completion(["A picture:", pattern_image(60, 25, 1), "It shows"], max_tokens=4)
    assert len(raw.tokens) == 4


@pytest.mark.timeout(600)
def test_tool_loop_with_images(engine):
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Weather of a city.

        Args:
            city: the city name
        """
        return "sunny"

    dialog = [{"role": "user", "content": [pattern_image(60, 25, 1), "What is the weather where this was taken?"]}]
    transcript = wb.tools.run(
        engine, dialog, [get_weather], tool_choice="required", constrain_tools=True, max_turns=2, max_tokens=40
    )
    assert transcript[1].role == "assistant" and transcript[1].tool_calls
    assert transcript[2].role == "tool" and transcript[2].content == "sunny"


@pytest.mark.timeout(600)
def test_vision_weights_load_on_first_image_or_when_asked(vision32_dir):
    engine = build_engine(resolve_settings(vision32_dir, **SETTINGS))
    try:
        assert engine.info()["vision"] == "not loaded"
        text_bytes = engine.memory()["weights_bytes"]
        engine.chat_completion([{"role": "user", "content": "hi"}], max_tokens=2)
        assert engine.info()["vision"] == "not loaded"  # text never loads it
        engine.chat_completion([{"role": "user", "content": [pattern_image(40, 40), "hi"]}], max_tokens=2)
        assert engine.info()["vision"] == "loaded"
        vision_bytes = engine.memory()["by_kind"]["vision"]
        assert vision_bytes > 0 and engine.memory()["weights_bytes"] == text_bytes + vision_bytes
    finally:
        engine.close()


@pytest.mark.timeout(600)
def test_errors_name_the_problem_and_the_engine_stays_usable(engine, llama3_dir):
    text_only = build_engine(resolve_settings(llama3_dir, max_seq_len=64, max_batch_size=1))
    try:
        with pytest.raises(ImageError, match="text-only"):
            text_only.chat_completion([{"role": "user", "content": [pattern_image(30, 30), "hi"]}], max_tokens=2)
    finally:
        text_only.close()
    with pytest.raises(ImageError, match="could not read"):
        engine.chat_completion([{"role": "user", "content": [b"\x89PNG broken", "hi"]}], max_tokens=2)
    long = [{"role": "user", "content": [pattern_image(30, 30), "word " * 300]}]
    with pytest.raises(PromptTooLongError, match="<\\|image\\|>"):
        engine.chat_completion(long, max_tokens=2)
    assert len(engine.chat_completion(dialogs()[0], max_tokens=3).tokens) == 3


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_model_parallel_2_equals_1(engine, vision32_dir, make_checkpoint):
    rows = dialogs()
    expected = [r.tokens for r in engine.batch_chat_completion(rows, max_tokens=6)]
    logits = engine.logits([engine.formatter.encode_prompt(rows[2])])[0]
    for folder in (vision32_dir, make_checkpoint(TINY_LLAMA32_VISION, n_shards=2)):
        mp2 = build_engine(resolve_settings(folder, model_parallel_size=2, **SETTINGS))
        try:
            assert [r.tokens for r in mp2.batch_chat_completion(rows, max_tokens=6)] == expected
            torch.testing.assert_close(mp2.logits([mp2.formatter.encode_prompt(rows[2])])[0], logits, atol=1e-4, rtol=0)
        finally:
            mp2.close()
