"""Spelled embeddings: the row of a word token after a space is built from the rows of its spelling.

The Llama 4 tokenizer writes "in Oslo?" with the token ``' Oslo'`` but ``city="Oslo"`` with ``'Os'``,
``'lo'``: copying a value into a call is a spelling lookup.  A model trained from scratch learns that
lookup per word, for the words it was trained to write, and cannot write a held-out value (the
diagnosis of runs F and G in ``docs/demo-model.md``).  Here the embedding row of every such word
token is, during training,

    row(' Oslo') = free(' Oslo') + space + piece('Os') + P @ piece('lo') + P^2 @ piece(...) ...

with ``P`` a fixed random rotation, ``space`` one learned vector and ``free`` a learned residual that
starts at zero.  The spelling is then *in* the embedding: the k-th piece of any word is read from
the word's row by the same linear map (``P^-k``), which the model learns once, on the words it writes
in training, and applies to words it never wrote.  Only the training parametrisation changes: the
exported checkpoint holds the materialised rows, an ordinary Llama 4 embedding matrix.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

MAX_PIECES = 4


def spelling_table(tokenizer: Any, vocab: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, pieces): compact ids [W] of the word tokens after a space whose bare spelling is at most
    ``MAX_PIECES`` compact tokens, and those pieces' compact ids [W, MAX_PIECES] (-1 pads)."""
    to_compact = {t: i for i, t in enumerate(vocab)}
    rows, pieces = [], []
    for compact, token in enumerate(vocab):
        text = tokenizer.decode([token])
        word = text[1:]
        if not (text.startswith(" ") and word.isalpha()):
            continue
        bare = tokenizer.encode(word)
        if not 1 <= len(bare) <= MAX_PIECES or any(t not in to_compact for t in bare):
            continue
        rows.append(compact)
        pieces.append([to_compact[t] for t in bare] + [-1] * (MAX_PIECES - len(bare)))
    return torch.tensor(rows, dtype=torch.long), torch.tensor(pieces, dtype=torch.long).reshape(-1, MAX_PIECES)


def rotations(dim: int, seed: int) -> torch.Tensor:
    """[MAX_PIECES, D, D]: P^0 .. P^(MAX_PIECES-1) for a fixed random orthogonal P."""
    gen = torch.Generator().manual_seed(seed * 31 + 7)
    p, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    powers = [torch.eye(dim, dtype=torch.float64)]
    for _ in range(MAX_PIECES - 1):
        powers.append(p @ powers[-1])
    return torch.stack(powers).float()


class SpelledEmbeddings(nn.Module):
    """Materialises the embedding table [V, D] from the free table and the spelling of word tokens."""

    def __init__(self, free: nn.Parameter, rows: torch.Tensor, pieces: torch.Tensor, seed: int) -> None:
        super().__init__()
        self.free = free  # [V, D], the model's tok_embeddings.weight (shared, not copied)
        dim = free.shape[1]
        self.space = nn.Parameter(torch.randn(dim, generator=torch.Generator().manual_seed(seed + 3)) / math.sqrt(dim))
        self.register_buffer("rows", rows, persistent=False)  # [W]
        self.register_buffer("pieces", pieces, persistent=False)  # [W, K]
        self.register_buffer("powers", rotations(dim, seed), persistent=False)  # [K, D, D]
        with torch.no_grad():
            free[rows] = 0.0  # word rows start as their spelling alone

    def adopt(self, table: torch.Tensor) -> None:
        """Make the materialised table equal ``table`` [V, D] (rows trained this way and exported, for a
        warm start): word rows keep their spelling and their free rows take the rest; ``space`` restarts at 0."""
        with torch.no_grad():
            table = table.detach().clone()
            self.free.copy_(table)
            self.space.zero_()
            self.free[self.rows] = 0.0
            spelling = self()[self.rows]  # [W, D]: pieces are bare tokens, never word rows themselves
            self.free[self.rows] = table[self.rows] - spelling

    def forward(self) -> torch.Tensor:
        composed = self.space.expand(len(self.rows), -1)  # [W, D]
        for k in range(MAX_PIECES):
            ids = self.pieces[:, k]  # [W]
            present = (ids >= 0).unsqueeze(1).float()  # [W, 1]
            piece = F.embedding(ids.clamp(min=0), self.free) * present  # [W, D] (deterministic backward)
            composed = composed + piece @ self.powers[k].T
        return self.free.index_add(0, self.rows, composed)  # [V, D]
