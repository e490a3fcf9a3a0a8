"""Test oracle: Meta's reference model code (llama-models 0.3.0) run on CPU in float32.

``llama_models.llama3.model.Transformer`` serves Llama 3.x checkpoints and
``llama_models.llama4.model.Transformer`` serves Llama 4 ones (``moe_args`` in params.json).  The
reference is used as published, with two CPU accommodations: its KV caches are allocated with
``.cuda()`` (made an identity while the model is constructed), and fairscale's model-parallel state
comes from ``workbench.models.distributed.ensure_model_parallel(1)``.

Only tests import this module; ``workbench/`` never imports ``llama_models``.

API::

    reference_model(ckpt_dir, max_seq_len=256) -> Transformer            # cached per checkpoint
    reference_logits(ckpt_dir, token_lists, *, max_seq_len=256) -> list[Tensor]  # float32 [len, vocab]
    reference_greedy(ckpt_dir, prompt_tokens, max_tokens, stop_tokens, *, max_seq_len=256) -> list[int]
    clear_reference_cache() -> None
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import nn

from workbench.models.distributed import ensure_model_parallel

_MODELS: dict[tuple[str, int, int, int], nn.Module] = {}


def _params(ckpt_dir: Path) -> dict:
    return json.loads((ckpt_dir / "params.json").read_text())


def _is_llama4(params: dict) -> bool:
    return params.get("moe_args") is not None


def _shard_path(ckpt_dir: Path) -> Path:
    shards = sorted(ckpt_dir.glob("consolidated.*.pth"))
    if len(shards) != 1:
        raise ValueError(
            f"the oracle loads 1-shard checkpoints only; {ckpt_dir} has {len(shards)} shards "
            "(compare multi-shard loads against the 1-shard checkpoint of the same seed instead)"
        )
    return shards[0]


def _construct(params: dict, max_seq_len: int) -> nn.Module:
    """Build the reference Transformer on CPU in float32 (``.cuda()`` neutralised meanwhile)."""
    if _is_llama4(params):
        from llama_models.llama4.args import ModelArgs
        from llama_models.llama4.model import Transformer
    else:
        from llama_models.llama3.args import ModelArgs
        from llama_models.llama3.model import Transformer
    args = ModelArgs(**{**params, "max_seq_len": max_seq_len, "max_batch_size": 1})

    original_cuda = torch.Tensor.cuda
    original_dtype = torch.get_default_dtype()
    try:
        torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
        torch.set_default_dtype(torch.float32)
        model = Transformer(args)
    finally:
        torch.Tensor.cuda = original_cuda  # type: ignore[method-assign]
        torch.set_default_dtype(original_dtype)
    return model


def reference_model(ckpt_dir: str | Path, max_seq_len: int = 256) -> nn.Module:
    """Meta's reference ``Transformer`` for a 1-shard checkpoint, float32 on CPU, eval mode.

    Cached per (checkpoint folder, shard file identity, max_seq_len).
    """
    ckpt_dir = Path(ckpt_dir).resolve()
    shard = _shard_path(ckpt_dir)
    stat = shard.stat()
    key = (str(ckpt_dir), max_seq_len, stat.st_mtime_ns, stat.st_size)
    if key in _MODELS:
        return _MODELS[key]
    ensure_model_parallel(1)
    params = _params(ckpt_dir)
    model = _construct(params, max_seq_len)
    state = torch.load(shard, map_location="cpu", weights_only=True)
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    # The reference's load_state_dict pre-hooks rename the fused Llama 4 keys (wqkv, fc1/fc2,
    # moe_w_*, *_shared_*) and drop rope.freqs / _extra_state; anything left over is an error.
    model.load_state_dict(state, strict=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    _MODELS[key] = model
    return model


def clear_reference_cache() -> None:
    _MODELS.clear()


def _seq_len_for(n: int, requested: int) -> int:
    """``requested``, or the next power of two that holds ``n`` positions (so models stay cached)."""
    size = requested
    while size < n:
        size *= 2
    return size


def _forward(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """One full forward from position 0; ``tokens`` [1, T] -> float32 logits [T, V]."""
    from llama_models.llama4.model import Transformer as Llama4Transformer

    if isinstance(model, Llama4Transformer):
        from llama_models.llama4.datatypes import TransformerInput

        logits = model.forward(TransformerInput(tokens=tokens, tokens_position=0)).logits
    else:
        logits = model.forward(tokens, 0)
    return logits[0].float().clone()


def reference_logits(
    ckpt_dir: str | Path, token_lists: Sequence[Sequence[int]], *, max_seq_len: int = 256
) -> list[torch.Tensor]:
    """Full-sequence reference logits, one float32 ``[len, vocab]`` tensor per token list (batch 1 each)."""
    out = []
    for ids in token_lists:
        if len(ids) == 0:
            raise ValueError("reference_logits: empty token list")
        model = reference_model(ckpt_dir, _seq_len_for(len(ids), max_seq_len))
        out.append(_forward(model, torch.tensor([list(ids)], dtype=torch.long)))
    return out


def reference_greedy(
    ckpt_dir: str | Path,
    prompt_tokens: Sequence[int],
    max_tokens: int,
    stop_tokens: Iterable[int],
    *,
    max_seq_len: int = 256,
) -> list[int]:
    """Cache-free greedy decoding with the reference model.

    Every step runs prompt + generated-so-far from position 0 and takes ``argmax`` (first index on
    ties) of the last position.  Stops after ``max_tokens`` tokens or at a stop token, which is not
    included in the result.
    """
    if len(prompt_tokens) == 0:
        raise ValueError("reference_greedy: empty prompt")
    stops = set(stop_tokens)
    model = reference_model(ckpt_dir, _seq_len_for(len(prompt_tokens) + max_tokens, max_seq_len))
    seq = list(prompt_tokens)
    generated: list[int] = []
    for _ in range(max_tokens):
        logits = _forward(model, torch.tensor([seq], dtype=torch.long))
        token = int(torch.argmax(logits[-1]))
        if token in stops:
            break
        generated.append(token)
        seq.append(token)
    return generated
