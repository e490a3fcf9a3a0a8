"""Build one rank's model from Settings: checkpoint load, then the requested quantization.

Shared by the in-process runner and the model-parallel workers, so both load exactly alike.
"""

from __future__ import annotations

import torch

from .checkpoint import build_model
from .config import Settings
from .models.args import ModelArgs
from .models.transformer import Transformer


def load_model_for_rank(settings: Settings, args: ModelArgs, rank: int = 0) -> Transformer:
    """The model slice of ``rank`` (of ``settings.model_parallel_size``), quantized as asked."""
    model = build_model(
        settings.checkpoint_dir, args, device=torch.device(settings.device), dtype=settings.dtype,
        max_seq_len=settings.max_seq_len, mp_size=settings.model_parallel_size, rank=rank,
    )  # fmt: skip
    if settings.quantization is not None:
        from .quantization import quantize_model

        model = quantize_model(model, settings.quantization, settings=settings, rank=rank)
    return model
