"""Build one rank's model from Settings: checkpoint load, then the requested quantization.

Shared by the in-process runner and the model-parallel workers, so both load exactly alike.
"""

from __future__ import annotations

import functools

import torch

from workbench.checkpoints import vision32
from workbench.checkpoints.load import build_model, build_vision
from workbench.models.args import ModelArgs
from workbench.models.invariant import make_batch_invariant
from workbench.models.llama32_vision import is_cross_attention_vision
from workbench.models.transformer import Transformer
from workbench.quantization import load_options, quantize_model
from workbench.quantization.kernels import apply_plan
from workbench.runtime.settings import Settings


def load_model_for_rank(
    settings: Settings, args: ModelArgs, rank: int = 0, *, progress: bool | None = False
) -> Transformer:
    """The model slice of ``rank`` (of ``settings.model_parallel_size``), quantized as asked.

    ``progress``: a bar over the checkpoint shards (the in-process runner shows it in the notebook).
    """

    # fp8/int4 on a GPU assemble on the CPU and quantize onto the GPU module by module (see load_options).
    device, dtype = load_options(settings)
    model = build_model(
        settings.checkpoint_dir,
        args,
        device=torch.device(device),
        dtype=dtype,
        max_seq_len=settings.max_seq_len,
        mp_size=settings.model_parallel_size,
        rank=rank,
        progress=progress,
    )
    # Called for every mode: a pre-quantized checkpoint's shards hold unscaled fp8 codes that need their scales.
    model = quantize_model(model, settings.quantization, settings=settings, rank=rank)
    apply_plan(model, settings.kernels)  # weight layouts and arithmetic dtype chosen for this CPU
    if args.vision_args is not None or is_cross_attention_vision(args):
        model.vision_loader = functools.partial(_load_vision, settings, args, rank, model)
    if settings.batch_invariant:
        make_batch_invariant(model)
    return model


def _load_vision(settings: Settings, args: ModelArgs, rank: int, model: Transformer) -> torch.nn.Module:
    """The vision encoder of this rank, in the text model's (possibly bf16) dtype and on its device."""
    build = vision32.build_vision if is_cross_attention_vision(args) else build_vision
    return build(
        settings.checkpoint_dir,
        args,
        device=model.device,
        dtype=model.dtype,
        mp_size=settings.model_parallel_size,
        rank=rank,
    )
