"""The token ids every runner hands its scheduler: which tokens end a row and why, and where image embeddings
go.  Shared by the in-process runner and the model-parallel workers, which must agree on them."""

from __future__ import annotations

from workbench.formats.tokenizer import Tokenizer
from workbench.models.args import ModelArgs
from workbench.models.llama32_vision import is_cross_attention_vision
from workbench.types import StopReason


def stop_token_reasons(tokenizer: Tokenizer) -> dict[int, StopReason]:
    """Which token ends generation and why: ``<|eom|>`` ends a message, eot/eos end the turn."""
    return {tokenizer.eos_id: "end_of_turn", tokenizer.eot_id: "end_of_turn", tokenizer.eom_id: "end_of_message"}


def image_token(tokenizer: Tokenizer, args: ModelArgs | None = None) -> int | None:
    """Where a prompt's image positions start: ``<|patch|>`` (Llama 4 tokenizers), ``<|image|>`` for a Llama 3.2
    Vision model (cross-attention: the image token itself); None for text-only Llama 3."""
    special = getattr(tokenizer, "special_tokens", {})
    if args is not None and is_cross_attention_vision(args):
        return special.get("<|image|>")
    return special.get("<|patch|>")
