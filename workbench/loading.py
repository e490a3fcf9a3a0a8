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
    from .quantization import load_options, quantize_model

    # fp8/int4 on a GPU assemble on the CPU and quantize onto the GPU module by module (see load_options).
    device, dtype = load_options(settings)
    model = build_model(
        settings.checkpoint_dir, args, device=torch.device(device), dtype=dtype,
        max_seq_len=settings.max_seq_len, mp_size=settings.model_parallel_size, rank=rank,
    )  # fmt: skip
    # Called for every mode: a pre-quantized checkpoint's shards hold unscaled fp8 codes that need their scales.
    return quantize_model(model, settings.quantization, settings=settings, rank=rank)
