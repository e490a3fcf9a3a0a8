"""Teacher-forced scoring on the engine: full logits per position (:meth:`ScoringMixin.logits`) and the
memory-light log-probabilities of given continuations (:meth:`ScoringMixin.score`), which evaluation
harnesses need for every multiple-choice answer without ``[len, vocab]`` float32 logits per row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from workbench.engine.prompts import check_ids, encode_row
from workbench.errors import InputError, PromptTooLongError
from workbench.formats import Prompt
from workbench.types import ScoredRow


class ScoringMixin:
    """The Engine's scoring methods (they use its gate, runner, limits and prompt checks)."""

    _gate: Any
    _runner: Any
    max_seq_len: int

    def logits(self, token_lists: Sequence[Sequence[int] | Any]) -> list[torch.Tensor]:
        """Teacher-forced float32 logits ``[len, vocab]`` for each token list (likelihood evaluation).

        A row may also be a ``Prompt`` with images (``formatter.encode_prompt(messages)``): its logits are
        computed with its images, as generation would see them."""
        if isinstance(token_lists, (str, torch.Tensor)) or (token_lists and isinstance(token_lists[0], int)):
            raise InputError("logits() takes a list of token-id lists, e.g. engine.logits([[128000, 791, 6864]])")
        rows = [encode_row(self, t, i) if isinstance(t, Prompt) else (check_ids(self, list(t), i), None)
                for i, t in enumerate(token_lists)]
        prompts = [ids for ids, _ in rows]
        images = [tiles for _, tiles in rows]
        if not prompts:
            return []
        empty = [i for i, p in enumerate(prompts) if not p]
        if empty:
            raise InputError(
                f"row {empty[0]} of logits() is empty; every row needs at least one token id (logits are "
                "per position), e.g. engine.tokenizer.encode(text, bos=True)"
            )
        too_long = [(i, len(p)) for i, p in enumerate(prompts) if len(p) > self.max_seq_len]
        if too_long:
            i, n = too_long[0]
            raise PromptTooLongError(
                f"row {i} has {n} tokens but max_seq_len is {self.max_seq_len}; shorten it or load with a larger "
                "max_seq_len"
            )
        with self._gate.exclusive("logits"):
            if any(tiles is not None for tiles in images):
                return self._runner.logits(prompts, images)
            return self._runner.logits(prompts)

    def score(self, sequences: Sequence[Sequence[int]], starts: Sequence[int] | int = 1) -> list[ScoredRow]:
        """Log-probabilities of ``sequences[i][starts[i]:]`` (each token given all before it) and whether each
        token is the greedy choice: one :class:`~workbench.types.ScoredRow` per sequence.

        Why not :meth:`logits`: scoring needs one number per scored token, and full logits are float32
        ``[len, vocab]`` per row (1 GiB per 2,048 tokens at a 128k vocabulary) with the output projection run
        over every context position.  Here only the scored positions are projected, a chunk at a time;
        rows are packed without padding and shared prefixes (a few-shot preamble, one context with several
        answers) are computed once.  Numbers equal :meth:`logits`' log-softmax up to float rounding.

        ``starts``: one int for all rows or one per row, ``1 <= start < len(sequence)`` (1 scores every token
        after the first); ``len(sequence) - 1`` tokens (the last is only predicted) must fit ``max_seq_len``.
        """
        if isinstance(sequences, (str, torch.Tensor)) or (sequences and isinstance(sequences[0], int)):
            raise InputError("score() takes a list of token-id lists, e.g. engine.score([[128000, 791, 6864]], 1)")
        rows = [check_ids(self, list(s), i) for i, s in enumerate(sequences)]
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
            if len(row) - 1 > self.max_seq_len:
                raise PromptTooLongError(
                    f"score() row {i} needs {len(row) - 1} positions but max_seq_len is {self.max_seq_len}; "
                    "shorten it or load with a larger max_seq_len"
                )
        if not rows:
            return []
        with self._gate.exclusive("score"):
            logprobs, greedy, counts = self._runner.score(rows, starts)
        lp, gr = logprobs.tolist(), greedy.tolist()
        out, at = [], 0
        for n in counts:
            out.append(ScoredRow(lp[at : at + n], gr[at : at + n]))
            at += n
        return out
