"""Exporting a trained demo model into the compact artifact shipped in the package.

``export_compact`` turns a training folder into ``workbench/demo/weights/demo-llama4.pt`` (the format
:mod:`workbench.demo.artifact` expands into a Meta-layout checkpoint): the transformer body, the
embedding rows of the compact vocabulary only, and a fitted *never-win* output row for the rest of the
202048-token vocabulary (see the artifact module's docstring for why that row is safe).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from workbench.demo.artifact import ARTIFACT, FULL_VOCAB, NEVER_WRITTEN
from workbench.demo.data import DialogGenerator, encode
from workbench.formats import make_formatter
from workbench.formats.tokenizer import Tokenizer, bundled_tokenizer_path
from workbench.training.forward import build_model, hidden_states


def _fit_never_win_row(
    hidden: torch.Tensor, used: torch.Tensor, lowest: int = 8
) -> tuple[torch.Tensor, dict[str, float]]:
    """A row whose logit never exceeds the best used logit, for *any* hidden state, and is far below it
    on the model's own states.

    The row is a convex combination (the mean) of used rows, so its logit is the mean of theirs and
    can never beat their maximum; taking the ``lowest`` rows with the lowest average logit over the
    sampled states ``hidden`` [N, D] makes it score far below.  Returned numbers: the smallest gap to the
    best used logit over the samples, and the largest probability mass all unused rows together would
    get at temperature 1 (``unused`` rows x exp(gap)).
    """
    mean_logit = torch.zeros(used.shape[0])
    for chunk in hidden.split(1024):
        mean_logit += (chunk @ used.T).sum(0)  # [V]
    low_rows = mean_logit.topk(lowest, largest=False).indices
    row = used[low_rows].mean(0)  # [D]
    gaps, masses = [], []
    unused = FULL_VOCAB - used.shape[0]
    for chunk in hidden.split(1024):
        logits = chunk @ used.T  # [n, V]
        own = chunk @ row  # [n]
        gaps.append(logits.max(-1).values - own)
        masses.append(unused * torch.exp(own - torch.logsumexp(logits, -1)))
    gap, mass = torch.cat(gaps), torch.cat(masses)
    return row, {
        "min_gap": float(gap.min()),
        "mean_gap": float(gap.mean()),
        "max_unused_mass": float(mass.max()),
        "states_checked": int(hidden.shape[0]),
    }


def export_compact(train_dir: str | Path, out: str | Path = ARTIFACT, *, sample_dialogs: int = 256) -> dict[str, Any]:
    """Write the compact artifact from a training folder; returns the never-win check's numbers."""

    train_dir = Path(train_dir)
    config = json.loads((train_dir / "config.json").read_text())
    state = torch.load(train_dir / "state.pt", weights_only=True)["model"]
    vocab = config["vocab"]
    model = build_model(config["params"], len(vocab), seed=0)
    model.load_state_dict(state)
    model.output.weight = model.tok_embeddings.weight
    # final hidden states over dialogs of both splits, every position
    tokenizer = Tokenizer(bundled_tokenizer_path("llama4"))
    formatter = make_formatter(tokenizer, None)
    to_compact = {t: i for i, t in enumerate(vocab)}
    states = []
    with torch.no_grad():
        for split in ("train", "heldout"):
            gen = DialogGenerator(split, seed=777)
            for _ in range(sample_dialogs // 2):
                ids = [to_compact.get(t, 0) for t in encode(formatter, gen.dialog()).tokens]
                states.append(hidden_states(model, torch.tensor([ids]))[0])  # [T, D]
    hidden = torch.cat(states)  # [N, D]
    embeddings = model.tok_embeddings.weight.detach()  # [V, D]
    never_win, check = _fit_never_win_row(hidden, embeddings)
    body = {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if k not in ("tok_embeddings.weight", "output.weight")
    }
    artifact = {
        "params": config["params"],
        "vocab": torch.tensor(vocab, dtype=torch.int32),
        "embeddings": embeddings.to(torch.bfloat16),
        "unknown_embedding": embeddings.mean(0).to(torch.bfloat16),
        "never_win_row": never_win.to(torch.bfloat16),
        "body": {k: v.to(torch.bfloat16) for k, v in body.items()},
        # special tokens the model reads but must never write (the padding token stood for unknown
        # tokens while training); their output rows become never-win rows
        "never_written": torch.tensor([tokenizer.encode_special(t) for t in NEVER_WRITTEN], dtype=torch.int32),
        "check": check,
        "train": {k: config[k] for k in ("seed", "batch_size", "lr", "steps")},
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(artifact, out)
    return check
