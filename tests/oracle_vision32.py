"""Test oracle for Llama 3.2 Vision: Meta's ``llama_models.llama3.multimodal`` (llama-models 0.3.0), CPU, float32.

The reference builds its vision encoder with constants that are not in params.json (width 1280, 32 local and
8 global layers, 16 heads, patch 14, intermediate layers 3/7/15/23/30, 4 tiles) and ``vision_input_dim = 1280 * 6``.
Tiny test checkpoints shrink the *width* (and the global layer count) only, so the reference is built with its
``VisionEncoder`` default ``width=`` (and ``n_global_layers``) patched to the checkpoint's, and its projection
input width to match; nothing else about Meta's code changes.  ``torchvision`` is the tests' stand-in (the
reference's image transform imports it), and the text model's ``.cuda()``-free CPU construction is as in
``oracle.py``.

API::

    vision_dims(state) -> (width, n_global_layers)
    reference_vision_model(params, state, max_seq_len=256) -> CrossAttentionTransformer  # loaded strictly
    reference_input(model, token_ids, images, vision_token) -> (tokens, xattn caches, masks, full-row mask)
    reference_logits(model, token_ids, images, vision_token) -> float32 [len, vocab]
    reference_greedy(model, prompt, images, vision_token, max_tokens, stops) -> list[int]
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torchvision_standin

from workbench.models.distributed import ensure_model_parallel

IMAGE_TOKEN_IN_MODEL = 128256  # the reference's chat format rewrites <|image|> to this id


def vision_dims(state: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(width, global layers) of a 3.2 Vision state dict."""
    width = state["vision_model.vision_encoder.class_embedding"].shape[0]
    prefix = "vision_model.vision_encoder.global_transformer.resblocks."
    n_global = len({k[len(prefix) :].split(".")[0] for k in state if k.startswith(prefix)})
    return width, n_global


def reference_vision_model(
    params: dict[str, Any], state: dict[str, torch.Tensor], max_seq_len: int = 256, max_batch_size: int = 4
) -> torch.nn.Module:
    """Meta's ``CrossAttentionTransformer`` with the encoder width patched to the checkpoint's, loaded strictly."""
    torchvision_standin.install()
    from llama_models.llama3 import args as ref_args
    from llama_models.llama3.multimodal import model as ref

    ensure_model_parallel(1)
    width, n_global = vision_dims(state)
    original_encoder = ref.VisionEncoder
    original_init = ref.CrossAttentionTransformerVision.__init__

    def vision_init(self: Any, args: Any) -> None:
        original_init(self, args)
        self.vision_input_dim = width * 6
        self.vision_projection = ref.ColumnParallelLinear(width * 6, args.dim, bias=True, init_method=lambda x: x)

    class PatchedEncoder(original_encoder):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            k.setdefault("width", width)
            k["n_global_layers"] = n_global
            super().__init__(*a, **k)

    original_dtype = torch.get_default_dtype()
    try:
        ref.VisionEncoder = PatchedEncoder
        ref.CrossAttentionTransformerVision.__init__ = vision_init
        torch.set_default_dtype(torch.float32)
        args = ref_args.ModelArgs(**{**params, "max_seq_len": max_seq_len, "max_batch_size": max_batch_size})
        model = ref.CrossAttentionTransformer(args)
        model.setup_cache(max_batch_size, device=torch.device("cpu"), dtype=torch.float32)
    finally:
        ref.VisionEncoder = original_encoder
        ref.CrossAttentionTransformerVision.__init__ = original_init
        torch.set_default_dtype(original_dtype)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _vision_mask(tokens: Sequence[int], vision_token: int) -> list[list[int]]:
    from llama_models.llama3.chat_format import create_vision_mask

    return create_vision_mask(list(tokens), vision_token)


@torch.inference_mode()
def reference_logits(
    model: torch.nn.Module, token_ids: Sequence[int], images: Sequence[Any], vision_token: int
) -> torch.Tensor:
    """Logits [len, vocab] of one prompt with its PIL images, as the reference generator prepares them."""
    tokens = [IMAGE_TOKEN_IN_MODEL if t == vision_token else t for t in token_ids]
    total = len(tokens)
    mask = _vision_mask(token_ids, vision_token) if images else []
    caches, xmask, full_row = model.compute_vision_tokens_masks(
        batch_images=[list(images)], batch_masks=[mask], total_len=total, device=torch.device("cpu")
    )
    ids = torch.tensor([tokens])
    positions = torch.arange(total)
    logits = model.forward(positions, ids, xmask, full_row, caches, text_only_inference=not images)
    return logits[0].float().clone()


def reference_greedy(
    model: torch.nn.Module,
    prompt: Sequence[int],
    images: Sequence[Any],
    vision_token: int,
    max_tokens: int,
    stop_tokens: Iterable[int],
) -> list[int]:
    """Cache-free greedy decoding: every step runs the whole sequence (prompt + generated) from position 0,
    with the image masks of that whole sequence, and takes the first argmax of the last position."""
    stops = set(stop_tokens)
    seq, out = list(prompt), []
    for _ in range(max_tokens):
        token = int(torch.argmax(reference_logits(model, seq, images, vision_token)[-1]))
        if token in stops:
            break
        out.append(token)
        seq.append(token)
    return out


@functools.cache
def reference_transform(chunk_size: int) -> Any:
    torchvision_standin.install()
    from llama_models.llama3.multimodal.image_transform import VariableSizeImageTransform

    return VariableSizeImageTransform(chunk_size)
