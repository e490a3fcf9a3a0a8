"""Pre-quantized fp8 checkpoints: ``fp8_scales_{rank}.pt`` beside the ``consolidated.NN.pth`` shards.

The format is Meta's (an interface fact; the code is ours).  In such a checkpoint the quantized
weights are stored in the shards as float8 e4m3 *codes* under their usual names and shapes, and
``fp8_scales_{r}.pt`` (one per saved shard ``r``) maps a name to the float32 scale of every output
row of shard ``r``'s slice, with ``W = code * scale``:

* Llama 3: ``"{layer}_feed_forward.{w1|w2|w3}_{r}"`` -> ``[N]`` (rows of ``feed_forward.wX.weight``,
  which is ``[out, in]``);
* Llama 4: ``"layers.{layer}.feed_forward.experts.{w1|w2|w3}"`` -> ``[E, N]`` (or flat ``[E * N]``),
  rows of the expert matrices ``[E, out, in]``, i.e. the last dim of our ``[E, in, out]`` stacks;
  ``...feed_forward.shared_expert.wX`` likewise, when present.

Checkpoint loading casts the codes to the model dtype (exact: e4m3 fits bf16, fp16 and fp32), so the
model briefly holds *unscaled* codes for these weights.  This module works out, for one runtime rank,
the scale of every row of the slice that rank loaded:

* weights cut on their output dim (``w1``/``w3``): the saved scales are concatenated and cut the same
  way — exact for any runtime model-parallel size;
* weights cut on their input dim (``w2``): one saved shard per rank (same size, or split further)
  keeps its row scales — exact; several saved shards merged into one rank carry one scale per row
  *per shard*, which a single per-row scale cannot represent, so those are returned as blocks to be
  dequantized (and re-quantized by the caller when fp8 is wanted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.checkpoints.files import shard_paths, source_shards_for_rank
from workbench.checkpoints.load import split_dim
from workbench.errors import QuantizationError

SCALES_FILE = "fp8_scales_{rank}.pt"
_LLAMA3_KEY = re.compile(r"^(\d+)_feed_forward\.(w[123])_(\d+)$")
_DENSE_KEY = re.compile(r"^layers\.\d+\.feed_forward\.(shared_expert\.)?w[123](\.weight)?$")
_EXPERT_KEY = re.compile(r"^layers\.\d+\.feed_forward\.experts\.w[123]$")


@dataclass
class RowScales:
    """Scales of the rows of one rank-local weight: ``scale`` [E?, N] when one per row is exact, else
    ``blocks``: one [E?, N] per equal block of the input dim (saved shards merged by this rank)."""

    scale: torch.Tensor | None = None
    blocks: list[torch.Tensor] | None = None


def scale_files(ckpt_dir: str | Path) -> dict[int, Path]:
    """Saved rank -> its ``fp8_scales_{rank}.pt`` (empty for an ordinary checkpoint)."""
    found: dict[int, Path] = {}
    for path in Path(ckpt_dir).glob("fp8_scales_*.pt"):
        m = re.fullmatch(r"fp8_scales_(\d+)\.pt", path.name)
        if m:
            found[int(m.group(1))] = path
    return found


def is_expert_key(key: str) -> bool:
    return bool(_EXPERT_KEY.match(key))


def canonical_key(key: str) -> str:
    """Model parameter name of a scales-file key (either generation's naming)."""
    m = _LLAMA3_KEY.match(key)
    if m:
        return f"layers.{m.group(1)}.feed_forward.{m.group(2)}.weight"
    if _EXPERT_KEY.match(key):
        return key
    if _DENSE_KEY.match(key):
        return key if key.endswith(".weight") else key + ".weight"
    raise QuantizationError(
        f"fp8 scales file holds {key!r}, which names no feed-forward or expert weight; the file does not belong "
        "to this checkpoint format — remove the fp8_scales_*.pt files to load the shards as plain weights"
    )


def _splits_output(key: str) -> bool:
    """Whether the model-parallel cut of ``key`` runs along its output rows (which its scales index)."""
    dim = split_dim(key)
    return dim == (2 if is_expert_key(key) else 0)


def _read(path: Path, saved_rank: int) -> dict[str, torch.Tensor]:
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, truncated, or pickled objects
        raise QuantizationError(
            f"could not read {path} with weights_only=True ({type(exc).__name__}: {exc}); re-download it or remove "
            "it to load the checkpoint's weights unscaled"
        ) from exc
    if not isinstance(raw, dict):
        raise QuantizationError(f"{path} holds a {type(raw).__name__}, not a name -> scale mapping; re-download it")
    out = {}
    for key, scale in raw.items():
        m = _LLAMA3_KEY.match(key)
        if m and int(m.group(3)) != saved_rank:
            raise QuantizationError(f"{path} holds {key!r}, a scale of shard {m.group(3)}; the files are mislabelled")
        out[canonical_key(key)] = scale.float()
    return out


def rank_scales(ckpt_dir: str | Path, mp_size: int, rank: int, num_experts: int | None) -> dict[str, RowScales]:
    """Row scales of every pre-quantized weight of runtime rank ``rank`` of ``mp_size`` ({} if none)."""
    files = scale_files(ckpt_dir)
    if not files:
        return {}
    n_saved = len(shard_paths(ckpt_dir))
    picked = source_shards_for_rank(n_saved, mp_size, rank)
    missing = [i for i in picked if i not in files]
    if missing:
        raise QuantizationError(
            f"{ckpt_dir} has fp8 scales for shards {sorted(files)} but not for {missing}; the pre-quantized "
            f"checkpoint is incomplete — re-download {', '.join(SCALES_FILE.format(rank=i) for i in missing)}"
        )
    saved = [_read(files[i], i) for i in picked]
    parts, index = max(mp_size // n_saved, 1), rank % max(mp_size // n_saved, 1)
    out: dict[str, RowScales] = {}
    for key in saved[0]:
        per_shard = []
        for i, scales in zip(picked, saved):
            if key not in scales:
                raise QuantizationError(f"{files[i]} lacks a scale for {key}; re-download the fp8 scale files")
            s = scales[key]
            per_shard.append(s.reshape(num_experts, -1) if is_expert_key(key) and num_experts else s.reshape(-1))
        if _splits_output(key):
            full = torch.cat(per_shard, dim=-1)  # [E?, N of the merged shards]
            out[key] = RowScales(scale=full.chunk(parts, dim=-1)[index] if parts > 1 else full)
        elif len(per_shard) == 1:
            out[key] = RowScales(scale=per_shard[0])
        else:
            out[key] = RowScales(blocks=per_shard)
    return out
