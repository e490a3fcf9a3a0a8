"""Teacher-forced scoring's rows, checked before they reach the runner, and its results shaped: the input checks
of ``Engine.logits`` (full logits per position) and ``Engine.score`` (the memory-light log-probabilities of
given continuations that evaluation harnesses need for every multiple-choice answer), each naming the row and
the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from workbench.engine.interfaces import LoadedModel
from workbench.engine.prompts import check_ids, encode_row
from workbench.errors import InputError, PromptTooLongError
from workbench.formats import Prompt
from workbench.types import ScoredRow


def logits_rows(model: LoadedModel, token_lists: Sequence[Sequence[int] | Any]) -> tuple[list[list[int]], list[Any]]:
    """The token ids of every ``logits()`` row and its image tiles (None for a row without images)."""
    if isinstance(token_lists, (str, torch.Tensor)) or (token_lists and isinstance(token_lists[0], int)):
        raise InputError("logits() takes a list of token-id lists, e.g. engine.logits([[128000, 791, 6864]])")
    rows = [
        encode_row(model, t, i) if isinstance(t, Prompt) else (check_ids(model, list(t), i), None)
        for i, t in enumerate(token_lists)
    ]
    prompts = [ids for ids, _ in rows]
    empty = [i for i, p in enumerate(prompts) if not p]
    if empty:
        raise InputError(
            f"row {empty[0]} of logits() is empty; every row needs at least one token id (logits are "
            "per position), e.g. engine.tokenizer.encode(text, bos=True)"
        )
    too_long = [(i, len(p)) for i, p in enumerate(prompts) if len(p) > model.max_seq_len]
    if too_long:
        i, n = too_long[0]
        raise PromptTooLongError(
            f"row {i} has {n} tokens but max_seq_len is {model.max_seq_len}; shorten it or load with a larger "
            "max_seq_len"
        )
    return prompts, [tiles for _, tiles in rows]


def score_rows(
    model: LoadedModel, sequences: Sequence[Sequence[int]], starts: Sequence[int] | int
) -> tuple[list[list[int]], list[int]]:
    """The token ids of every ``score()`` row and the position its scored tokens start at."""
    if isinstance(sequences, (str, torch.Tensor)) or (sequences and isinstance(sequences[0], int)):
        raise InputError("score() takes a list of token-id lists, e.g. engine.score([[128000, 791, 6864]], 1)")
    rows = [check_ids(model, list(s), i) for i, s in enumerate(sequences)]
    if isinstance(starts, int) and not isinstance(starts, bool):
        starts = [starts] * len(rows)
    starts = list(starts)
    if len(starts) != len(rows):
        raise InputError(f"score() got {len(rows)} sequences but {len(starts)} starts; give one start per row")
    for i, (row, start) in enumerate(zip(rows, starts)):
        if isinstance(start, bool) or not isinstance(start, int) or not 1 <= start < len(row):
            raise InputError(
                f"start {start!r} of score() row {i} ({len(row)} tokens) must be an int in 1..{len(row) - 1}: "
                "the first scored token needs one before it (e.g. BOS), and at least one token is scored"
            )
        if len(row) - 1 > model.max_seq_len:
            raise PromptTooLongError(
                f"score() row {i} needs {len(row) - 1} positions but max_seq_len is {model.max_seq_len}; "
                "shorten it or load with a larger max_seq_len"
            )
    return rows, starts


def scored_rows(logprobs: torch.Tensor, greedy: torch.Tensor, counts: Sequence[int]) -> list[ScoredRow]:
    """The runner's flat per-token numbers ``[sum(counts)]`` cut into one :class:`ScoredRow` per sequence."""
    lp, gr = logprobs.tolist(), greedy.tolist()
    out, at = [], 0
    for n in counts:
        out.append(ScoredRow(lp[at : at + n], gr[at : at + n]))
        at += n
    return out
