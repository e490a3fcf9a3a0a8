"""Tokenizer facts every runner hands its generator: which tokens end a row and why, and where image
embeddings go.  Shared by the in-process runner and the model-parallel workers, which must agree on them."""

from __future__ import annotations

from workbench.formats.tokenizer import Tokenizer
from workbench.types import StopReason


def stop_token_reasons(tokenizer: Tokenizer) -> dict[int, StopReason]:
    """Which token ends generation and why: ``<|eom|>`` ends a message, eot/eos end the turn."""
    return {tokenizer.eos_id: "end_of_turn", tokenizer.eot_id: "end_of_turn", tokenizer.eom_id: "end_of_message"}


def image_token(tokenizer: Tokenizer) -> int | None:
    """The ``<|patch|>`` id (Llama 4 tokenizers), where image embeddings go; None for Llama 3."""
    return getattr(tokenizer, "special_tokens", {}).get("<|patch|>")
