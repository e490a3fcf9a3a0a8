"""The demo model's shipped artifact: compact weights in, a normal Meta-layout checkpoint out.

The artifact (``workbench/demo/weights/demo-llama4.pt``, written by :mod:`workbench.training.export`) holds
the transformer body, the embedding rows of the compact vocabulary only, and two fitted rows for the rest
of the 202048-token vocabulary.  ``expand`` writes
the folder the normal loader reads (``consolidated.00.pth`` in the fused key layout of published
Llama 4 checkpoints, ``params.json``, the bundled ``tokenizer.model``).

Rows outside the compact vocabulary: the model never saw those tokens, so

* their *input* embedding is the mean trained embedding (an unknown token reads as an average one);
* their *output* row must never win the argmax.  A zero row gives no guarantee (the best used logit
  can be negative).  The row used is the mean of the used rows that score lowest on the model's own
  final hidden states: as a convex combination of used rows its logit can never exceed the best used
  logit, whatever the input, and on the sampled states it sits far below.  The check's numbers
  (smallest gap, largest total probability of all unused rows) are stored in the artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from workbench.checkpoints.factory import cache_root, fuse_keys
from workbench.errors import ConfigError
from workbench.formats.tokenizer import bundled_tokenizer_path
from workbench.models.args import ModelArgs

ARTIFACT = Path(__file__).with_name("weights") / "demo-llama4.pt"
FULL_VOCAB = 202048
DEFAULT_MODEL_VERSION = "demo-llama4-v1"
DEFAULT_MODEL_NAME = "workbench-demo-llama4 (trained tool-calling demo, 82M parameters)"
NEVER_WRITTEN = ("<|finetune_right_pad|>", "<|begin_of_text|>", "<|header_start|>", "<|header_end|>")


def full_state_dict(artifact: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Module-named full-vocabulary weights (bfloat16) from a loaded artifact."""
    vocab = artifact["vocab"].long()
    dim = artifact["embeddings"].shape[1]
    tok = artifact["unknown_embedding"].expand(FULL_VOCAB, dim).clone()
    tok[vocab] = artifact["embeddings"]
    out = artifact["never_win_row"].expand(FULL_VOCAB, dim).clone()
    out[vocab] = artifact["embeddings"]
    out[artifact["never_written"].long()] = artifact["never_win_row"]
    return {**artifact["body"], "tok_embeddings.weight": tok, "output.weight": out}


def expand(target: str | Path, artifact_path: str | Path = ARTIFACT) -> Path:
    """Write the demo model as a Meta-layout checkpoint folder (deterministic: same bytes every time)."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    artifact = torch.load(artifact_path, weights_only=True)
    params = {**artifact["params"], "vocab_size": FULL_VOCAB}
    args = ModelArgs.from_dict(dict(params), source="demo artifact")
    shard = fuse_keys(full_state_dict(artifact), args)
    torch.save(dict(sorted(shard.items())), target / "consolidated.00.pth")
    (target / "params.json").write_text(json.dumps(params, indent=2))
    shutil.copyfile(bundled_tokenizer_path("llama4"), target / "tokenizer.model")
    return target


def default_checkpoint_dir() -> Path:
    """The embedded default model: the trained demo model (a tiny Llama 4 with MoE, NoPE and chunked
    layers that calls tools; see docs/demo-model.md), expanded on first use from the compact weights
    shipped in the package into a normal Meta-layout folder in the cache.

    The folder name carries a hash of the shipped weights, so a new artifact never reuses an old
    expansion.  Written to a temporary folder and renamed into place, so concurrent first uses cannot
    see a half-written checkpoint.
    """
    digest = hashlib.sha256(ARTIFACT.read_bytes()).hexdigest()[:12]
    target = cache_root() / f"{DEFAULT_MODEL_VERSION}-{digest}"
    if (target / "params.json").exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    except OSError as exc:
        raise ConfigError(
            f"cannot create the workbench cache folder {str(target.parent)!r} ({exc.strerror}); set "
            "WORKBENCH_CACHE to a writable folder"
        ) from exc
    expand(tmp, ARTIFACT)
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target
