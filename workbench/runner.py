"""In-process model runner: owns the model and the generator when model_parallel_size == 1."""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .config import Settings
from .generation.generator import Event, Generator, Request
from .models.args import ModelArgs
from .models.transformer import Transformer
from .structured.runtime import GrammarRuntime
from .tokenizer import Tokenizer
from .types import StopReason


def stop_token_reasons(tokenizer: Tokenizer) -> dict[int, StopReason]:
    """Which token ends generation and why: ``<|eom|>`` ends a message, eot/eos end the turn."""
    return {tokenizer.eos_id: "end_of_turn", tokenizer.eot_id: "end_of_turn", tokenizer.eom_id: "end_of_message"}


def image_token(tokenizer: Tokenizer) -> int | None:
    """The ``<|patch|>`` id (Llama 4 tokenizers), where image embeddings go; None for Llama 3."""
    return getattr(tokenizer, "special_tokens", {}).get("<|patch|>")


class LocalRunner:
    """Runs the model in this process (model_parallel_size == 1)."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, *, settings: Settings, args: ModelArgs) -> None:
        self.tokenizer = tokenizer
        self.settings = settings
        self.args = args
        self._start(model)

    def _start(self, model: Transformer) -> None:
        self.model = model
        self.generator = Generator(
            model, stop_tokens=stop_token_reasons(self.tokenizer), decode_text=self.tokenizer.decode,
            max_batch_size=self.settings.max_batch_size, max_seq_len=self.settings.max_seq_len,
            grammars=GrammarRuntime(self.tokenizer),
            image_token=image_token(self.tokenizer),
        )  # fmt: skip

    def reload(self, settings: Settings) -> None:
        """Replace the model with one loaded under ``settings`` (old one freed first: one model resident)."""
        from .loading import load_model_for_rank

        self.close()
        gc.collect()
        self.settings = settings
        self._start(load_model_for_rank(settings, self.args, progress=None))

    def generate(self, requests: Sequence[Request]) -> Iterator[Event]:
        return self.generator.generate(requests)

    def load_vision(self) -> None:
        """Load the vision encoder now instead of at the first image."""
        self.model.ensure_vision()

    @property
    def vision_loaded(self) -> bool:
        return self.model.vision_loaded

    def compile_decode(self, enabled: bool = True) -> None:
        self.model.compile_decode(enabled)

    def logits(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        return self.generator.logits(token_lists)

    def parameter_count(self) -> int:
        return self.model.parameter_count()

    def memory(self) -> dict[str, Any]:
        return model_memory(self.model, self.generator.cache.nbytes())

    @property
    def alive(self) -> bool:
        return self.model is not None

    def close(self) -> None:
        """Drop the model and cache *and* free their storage.

        Freeing the storage (parameters and buffers moved to the meta device) matters in a notebook:
        after an interrupted or failed cell, ``sys.last_traceback`` keeps the generator's and the
        model's frames alive, so merely dropping our references would not return the memory.
        """
        generator, model = self.generator, self.model
        self.generator = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]
        if generator is not None:
            if generator.cache is not None:
                generator.cache.keys.clear()  # the cache object may be referenced from old frames too
                generator.cache.values.clear()
            generator.model = None  # type: ignore[assignment]
            generator.cache = None  # type: ignore[assignment]
        if model is not None:
            try:
                model.to("meta")
            except Exception:  # a quantized module that cannot move: dropping references must do
                pass


def module_kind(name: str) -> str:
    """Coarse kind of a parameter for memory breakdowns."""
    if name.startswith("vision_"):
        return "vision"
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
    """Bytes this rank holds: weights by dtype and by module kind, quantized weights and their scales, KV cache.

    Quantized modules store weights as buffers in packed dtypes; they declare what a buffer really
    holds (``DTYPE_LABELS``: int4 codes packed in uint8/int32 are reported as ``"int4"``) and which
    buffers are scales (``SCALE_BUFFERS``).  ``quantized_bytes`` counts the quantized weights proper,
    ``scale_bytes`` their scales (and zeros); both are included in ``weights_bytes``;
    ``quantized_bf16_bytes`` is what the quantized weights would take in bfloat16.  ``by_kernel``
    splits the quantized bytes (scales included) by ``"format/kernel"`` (e.g. ``"int4/cpu"``), which
    shows whether torch's kernels or the dequantizing fallback serve them.
    """
    by_dtype: dict[str, int] = defaultdict(int)
    by_kind: dict[str, int] = defaultdict(int)
    by_kernel: dict[str, int] = defaultdict(int)
    quantized_bytes = scale_bytes = quantized_bf16_bytes = packed_bytes = 0
    for module_name, module in model.named_modules():
        packed_bytes += getattr(module, "packed_bytes", 0)  # a CPU kernel's repacked copy (ColumnParallel.pack_for_cpu)
        labels = getattr(module, "DTYPE_LABELS", {})
        scales = getattr(module, "SCALE_BUFFERS", ())
        quantized = bool(getattr(module, "FORMAT", ""))
        if quantized:
            quantized_bf16_bytes += 2 * module.logical_numel()
        tensors = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        for name, tensor in tensors:
            size = tensor.numel() * tensor.element_size()
            by_dtype[labels.get(name, str(tensor.dtype).replace("torch.", ""))] += size
            by_kind[module_kind(f"{module_name}.{name}" if module_name else name)] += size
            if quantized:
                by_kernel[f"{module.FORMAT}/{module.kernel}"] += size
            if name in scales:
                scale_bytes += size
            elif quantized:
                quantized_bytes += size
    return {
        "weights_bytes": sum(by_dtype.values()),
        "by_dtype": dict(by_dtype),
        "by_kind": dict(by_kind),
        "quantized_bytes": quantized_bytes,
        "scale_bytes": scale_bytes,
        "quantized_bf16_bytes": quantized_bf16_bytes,
        "by_kernel": dict(by_kernel),
        "packed_bytes": packed_bytes,  # not in weights_bytes: extra copies kept for faster CPU kernels
        "kv_cache_bytes": kv_cache_bytes,
    }


def merge_memory(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Sum :func:`model_memory` reports of several ranks (what is resident in total), keeping each rank's."""
    keys = ("weights_bytes", "quantized_bytes", "scale_bytes", "quantized_bf16_bytes", "packed_bytes",
            "kv_cache_bytes")
    total: dict[str, Any] = dict.fromkeys(keys, 0)
    for key in total:
        total[key] = sum(info.get(key, 0) for info in per_rank)
    for key in ("by_dtype", "by_kind", "by_kernel"):
        merged: dict[str, int] = defaultdict(int)
        for info in per_rank:
            for name, value in info.get(key, {}).items():
                merged[name] += value
        total[key] = dict(merged)
    total["per_rank"] = [dict(info) for info in per_rank]
    return total
