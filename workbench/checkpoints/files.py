"""Where a Meta checkpoint's files are and how one shard is opened: ``consolidated.NN.pth`` in rank order,
which saved shards a model-parallel rank needs, and a tensor-only, memory-mapped ``torch.load``.

Everything that reads a checkpoint folder (validation, loading, settings checks) starts here, so the
errors for a missing shard or a file that is not a state dict are the same everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from workbench.errors import CheckpointError, MissingCheckpointFileError

SHARD_PATTERN = re.compile(r"^consolidated\.(\d+)\.pth$")


def shard_paths(ckpt_dir: str | Path) -> list[Path]:
    """The checkpoint's ``consolidated.NN.pth`` files in rank order; errors name what is missing."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        if ckpt_dir.exists():
            raise CheckpointError(
                f"{ckpt_dir} is a file, not a folder; give the folder that holds params.json and "
                "the consolidated.NN.pth shards"
            )
        raise MissingCheckpointFileError(f"checkpoint folder {ckpt_dir} does not exist; check the path")
    found = {}
    for path in ckpt_dir.iterdir():
        m = SHARD_PATTERN.match(path.name)
        if m:
            found[int(m.group(1))] = path
    if not found:
        raise MissingCheckpointFileError(
            f"no consolidated.NN.pth shards in {ckpt_dir}; download the checkpoint's weights into this folder"
        )
    missing = [i for i in range(max(found) + 1) if i not in found]
    if missing:
        names = ", ".join(f"consolidated.{i:02d}.pth" for i in missing)
        raise MissingCheckpointFileError(
            f"{ckpt_dir} has {len(found)} shards but is missing {names}; re-download the missing shard(s)"
        )
    return [found[i] for i in range(len(found))]


def source_shards_for_rank(n_shards: int, mp_size: int, rank: int) -> list[int]:
    """Saved shards that rank ``rank`` of ``mp_size`` needs: one to split, or a run to merge."""
    if mp_size % n_shards == 0:
        return [rank * n_shards // mp_size]
    if n_shards % mp_size == 0:
        per_rank = n_shards // mp_size
        return list(range(rank * per_rank, (rank + 1) * per_rank))
    raise CheckpointError(
        f"the checkpoint has {n_shards} shards, which model_parallel_size={mp_size} neither divides nor is a "
        f"multiple of; use a size among {sorted({d for d in range(1, n_shards + 1) if n_shards % d == 0})} "
        f"or a multiple of {n_shards}"
    )


def read_shard(path: Path) -> dict[str, torch.Tensor]:
    """One ``consolidated.NN.pth`` memory-mapped with ``weights_only=True``; it must map names to tensors."""
    try:
        raw = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # corrupted, truncated, not a zip/pickle, or pickled with arbitrary objects
        raise CheckpointError(
            f"could not load {path} with weights_only=True ({type(exc).__name__}: {exc}); the file is corrupt or "
            "not a tensor-only checkpoint — re-download it"
        ) from exc
    if not isinstance(raw, dict):
        raise CheckpointError(
            f"{path} holds a {type(raw).__name__}, not a dict of parameter name -> tensor; a consolidated.NN.pth "
            "is a saved state_dict — re-download it or save model.state_dict()"
        )
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise CheckpointError(
                f"{path}: entry {key!r} maps to a {type(value).__name__}; a consolidated.NN.pth must map parameter "
                "names (strings) to tensors — re-download it or save model.state_dict()"
            )
    return raw
