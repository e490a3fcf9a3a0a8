"""In-process model runner: owns the model and the generator when model_parallel_size == 1."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterator, Sequence

import torch

from .generation.generator import Event, Generator, Request
from .models.transformer import Transformer
from .tokenizer import Tokenizer
from .types import StopReason


def stop_token_reasons(tokenizer: Tokenizer) -> dict[int, StopReason]:
    """Which token ends generation and why: ``<|eom|>`` ends a message, eot/eos end the turn."""
    return {tokenizer.eos_id: "end_of_turn", tokenizer.eot_id: "end_of_turn", tokenizer.eom_id: "end_of_message"}


class LocalRunner:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, *, max_batch_size: int, max_seq_len: int) -> None:
        self.model = model
        self.generator = Generator(
            model, stop_tokens=stop_token_reasons(tokenizer), decode_text=tokenizer.decode,
            max_batch_size=max_batch_size, max_seq_len=max_seq_len,
        )  # fmt: skip

    def generate(self, requests: Sequence[Request]) -> Iterator[Event]:
        return self.generator.generate(requests)

    def logits(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        return self.generator.logits(token_lists)

    def parameter_count(self) -> int:
        return self.model.parameter_count()

    def memory(self) -> dict[str, Any]:
        return model_memory(self.model, self.generator.cache.nbytes())

    def close(self) -> None:
        self.generator = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]


def module_kind(name: str) -> str:
    """Coarse kind of a parameter for memory breakdowns."""
    if "experts" in name:
        return "routed_experts"
    if "shared_expert" in name:
        return "shared_expert"
    if "router" in name:
        return "router"
    if "feed_forward" in name:
        return "feed_forward"
    if "attention." in name:
        return "attention"
    if "tok_embeddings" in name:
        return "embedding"
    if name.startswith("output"):
        return "output"
    return "norm"


def model_memory(model: torch.nn.Module, kv_cache_bytes: int) -> dict[str, Any]:
    by_dtype: dict[str, int] = defaultdict(int)
    by_kind: dict[str, int] = defaultdict(int)
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        size = tensor.numel() * tensor.element_size()
        by_dtype[str(tensor.dtype).replace("torch.", "")] += size
        by_kind[module_kind(name)] += size
    return {
        "weights_bytes": sum(by_dtype.values()),
        "by_dtype": dict(by_dtype),
        "by_kind": dict(by_kind),
        "kv_cache_bytes": kv_cache_bytes,
    }
