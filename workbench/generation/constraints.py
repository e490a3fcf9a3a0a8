"""llguidance over our tiktoken vocabularies: tokenizer info, compiled-grammar cache, batched token masks.

One :class:`GrammarRuntime` per tokenizer (the engine's, and one per model-parallel worker: masks are
deterministic functions of the grammar and the tokens, so every rank computes the same mask and takes the
same step).  Per decode step the scheduler calls :meth:`GrammarRuntime.mask_logits` once for all
constrained rows: llguidance fills one bitmask per row (in parallel, off the GIL), and only the rows
whose choice the mask can change get their logits rewritten.  Rows without a format are never touched.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workbench.errors import FormatError
from workbench.generation.sampling import fast_argmax
from workbench.structured.spec import Constraint

_GRAMMAR_CACHE_SIZE = 128
_TOKENIZER_CACHE: dict[tuple[str, str, int], Any] = {}
_TOKENIZER_LOCK = threading.Lock()
# Compiled grammars (llguidance matchers in their initial state), per vocabulary and grammar, shared by every
# runtime of the process: the engine's check and the scheduler's rows compile a schema once.
_TEMPLATES: OrderedDict[tuple[tuple[str, str, int], str], Any] = OrderedDict()


_KIND_NAMES = {"json_schema": "JSON schema", "grammar": "grammar", "regex": "regex", "tool_call": "tool-call grammar"}


def _tokenizer_key(tokenizer: Any) -> tuple[str, str, int]:
    return (str(tokenizer.path), tokenizer.family, tokenizer.n_words)


def build_lltokenizer(tokenizer: Any) -> Any:
    """llguidance's view of a workbench :class:`~workbench.formats.tokenizer.Tokenizer` (cached: ~1-2 s to build).

    Only the turn-ending special tokens are included (``<|eot|>``, ``<|eom|>``, ``<|end_of_text|>``;
    ``<|eot|>`` is the grammar's end-of-sequence): every other special token gets an empty mask bit, so no
    grammar can make a row emit a header, an image or a python tag.
    """
    import llguidance

    key = _tokenizer_key(tokenizer)
    with _TOKENIZER_LOCK:
        if key not in _TOKENIZER_CACHE:
            ends = {tokenizer.eot_id, tokenizer.eom_id, tokenizer.eos_id}
            specials = {name: i for name, i in tokenizer.special_tokens.items() if i in ends}
            _TOKENIZER_CACHE[key] = llguidance.LLTokenizer.from_tiktoken(
                encoder=tokenizer.bpe_ranks,
                special_tokens=specials,
                pattern=tokenizer.pattern,
                eos_token=tokenizer.eot_id,
                n_vocab=tokenizer.n_words,
            )
        return _TOKENIZER_CACHE[key]


class RowConstraint:
    """One running row's grammar state (an llguidance matcher) and how the row may end."""

    def __init__(self, matcher: Any, constraint: Constraint, eos: int, runtime: GrammarRuntime | None = None) -> None:
        self.matcher = matcher
        self.runtime = runtime  # whose worker may be computing this row's next mask
        self.constraint = constraint
        self.eos = eos  # the grammar's own end token (<|eot|>)
        self.dead = False  # the grammar allows no token at all (unsatisfiable schema or a matcher error)
        self.consumed = 0  # tokens consumed so far: a prefetched mask is valid only for the same count

    def consume(self, token: int) -> None:
        if self.runtime is not None:  # never while the worker reads it
            self.runtime.wait_for_prefetch()
        self.consumed += 1
        if not self.matcher.consume_token(token):
            self.dead = True

    @property
    def complete(self) -> bool:
        """The grammar is satisfied and allows nothing more: the row ends now (no end token needed)."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting() and not self.matcher.is_error()

    @property
    def error(self) -> str:
        return self.matcher.get_error() or "the grammar allows no further token"


@dataclass
class MaskRow:
    """A constrained row of one step: its index in the logits, its state, and whether argmax alone decides it."""

    index: int
    state: RowConstraint
    argmax_only: bool  # greedy without logprobs: the mask only matters if it rejects the argmax


class GrammarRuntime:
    """Compiles, caches and runs grammars for one tokenizer; built lazily, so unconstrained engines pay nothing."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._lltok: Any = None
        self._executor: Any = None
        self._words = (tokenizer.n_words + 31) // 32
        self._buffer = np.zeros((0, self._words), dtype=np.int32)
        self._prefetch_buffer = np.zeros((0, self._words), dtype=np.int32)
        self._worker: ThreadPoolExecutor | None = None
        self._pending: tuple[list[tuple[RowConstraint, int]], Future] | None = None  # ((state, consumed)s, masks)

    @property
    def lltokenizer(self) -> Any:
        if self._lltok is None:
            self._lltok = build_lltokenizer(self.tokenizer)
        return self._lltok

    # ----------------------------------------------------------------------------- compile
    def check(self, constraint: Constraint) -> None:
        """Compile ``constraint``'s grammar now (cached), raising FormatError with llguidance's message."""
        self._template(constraint.grammar, constraint.kind)

    def _template(self, grammar: str, kind: str) -> Any:
        key = (_tokenizer_key(self.tokenizer), grammar)
        with _TOKENIZER_LOCK:
            template = _TEMPLATES.get(key)
            if template is not None:
                _TEMPLATES.move_to_end(key)
                return template
        import llguidance

        what = _KIND_NAMES.get(kind, kind)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.lltokenizer)
        if is_error:
            raise FormatError(f"invalid {what} in response_format: {messages[0]}")
        template = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0)
        if template.is_error():
            raise FormatError(f"invalid {what} in response_format: {template.get_error()}")
        with _TOKENIZER_LOCK:
            _TEMPLATES[key] = template
            if len(_TEMPLATES) > _GRAMMAR_CACHE_SIZE:
                _TEMPLATES.popitem(last=False)
        return template

    def start(self, constraint: Constraint) -> RowConstraint:
        """Fresh grammar state for a new row (a copy of the cached compiled matcher)."""
        matcher = self._template(constraint.grammar, constraint.kind).deep_copy()
        return RowConstraint(matcher, constraint, self.tokenizer.eot_id, self)

    # ----------------------------------------------------------------------------- masks
    def prefetch(self, states: Sequence[RowConstraint]) -> None:
        """Start computing the next masks of ``states`` on a worker thread, while the caller runs the
        forward pass (llguidance and torch both release the GIL): :meth:`fill` then finds them ready.

        Safe whatever happens next: masks are used only for exactly these states at exactly their
        current positions (a row that advanced, ended or joined in between is recomputed), and every
        fill first waits for the worker, so the matchers are never used by two threads at once.
        """
        self._settle()
        if not states:
            return
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-masks")
        if self._prefetch_buffer.shape[0] < len(states):
            self._prefetch_buffer = np.zeros(
                (max(len(states), 2 * self._prefetch_buffer.shape[0]), self._words), dtype=np.int32
            )
        keys = [(s, s.consumed) for s in states]
        self._pending = (keys, self._worker.submit(self._fill_into, list(states), self._prefetch_buffer))

    def _settle(self) -> tuple[list[tuple[RowConstraint, int]], np.ndarray | None] | None:
        """Wait for a prefetch in flight; its ((state, consumed)s, masks), masks None if it failed."""
        if self._pending is None:
            return None
        keys, future = self._pending
        self._pending = None
        try:
            return keys, future.result()
        except Exception:  # recomputed on the caller's thread, where an error surfaces normally
            return keys, None

    def wait_for_prefetch(self) -> None:
        """Let a mask prefetch in flight finish: a matcher must not change while the worker reads it."""
        if self._pending is not None:
            self._settle()

    def fill(self, states: Sequence[RowConstraint]) -> np.ndarray:
        """Next-token bitmasks ``[n, words]`` (int32, bit i of word w = token 32*w + i) of ``states``."""
        ready = self._settle()
        if ready is not None and ready[1] is not None and _same_positions(ready[0], states):
            return ready[1]
        if self._buffer.shape[0] < len(states):
            self._buffer = np.zeros((max(len(states), 2 * self._buffer.shape[0]), self._words), dtype=np.int32)
        return self._fill_into(states, self._buffer)

    def _fill_into(self, states: Sequence[RowConstraint], buffer: np.ndarray) -> np.ndarray:
        import llguidance
        import llguidance.numpy as llnp

        n = len(states)
        masks = buffer[:n]
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        llnp.fill_next_token_bitmask_par(self._executor, [(s.matcher, i) for i, s in enumerate(states)], masks)
        for i, state in enumerate(states):
            ends = state.constraint.end_tokens
            if ends != (state.eos,) and _bit(masks[i], state.eos):  # the row may end: with its own end tokens
                _set_bit(masks[i], state.eos, False)
                for token in ends:
                    _set_bit(masks[i], token, True)
        return masks

    def mask_logits(
        self, logits: torch.Tensor, rows: Sequence[MaskRow], argmax: Sequence[int] | None = None
    ) -> dict[int, int]:
        """Apply each constrained row's grammar to its logits ``[n, V]``; returns the tokens of argmax-only rows.

        A row that samples or reports logprobs gets the tokens its grammar forbids set to -inf (in place), so
        temperature, top-k/top-p and logprobs all see the renormalized distribution.  A greedy row without
        logprobs is decided here instead, without rewriting its logits: its argmax when the grammar allows it
        (so such rows stay token-identical to unconstrained ones), else the best allowed token.  A row whose
        grammar allows nothing is marked ``dead`` (the scheduler ends it).  ``argmax``: every row's argmax,
        when the caller has it already.
        """
        if not rows:
            return {}
        masks = self.fill([r.state for r in rows])
        n_vocab = self.tokenizer.n_words
        nonempty = masks.any(axis=1)
        chosen: dict[int, int] = {}
        check = [j for j, r in enumerate(rows) if r.argmax_only and nonempty[j]]
        if check:
            if not argmax:
                argmax = fast_argmax(logits).tolist()
            refused = []
            for j in check:
                token = argmax[rows[j].index]
                if token < n_vocab and _bit(masks[j], token):
                    chosen[rows[j].index] = token
                else:
                    refused.append(j)
            unresolved = []
            for j in refused:  # the best token the grammar allows, found without unpacking the whole mask
                token = _best_allowed(logits[rows[j].index, :n_vocab], masks[j])
                if token is None:
                    unresolved.append(j)
                else:
                    chosen[rows[j].index] = token
            if unresolved:  # many tokens allowed, none of them near the top: one masked argmax over those rows
                forbidden = _unpack_forbidden(masks[unresolved], n_vocab, logits.device)  # [m, n_vocab] bool
                picked = logits[[rows[j].index for j in unresolved], :n_vocab].masked_fill_(forbidden, float("-inf"))
                for j, token in zip(unresolved, picked.argmax(dim=-1).tolist()):
                    chosen[rows[j].index] = token
        dense = []
        for j, row in enumerate(rows):
            if row.argmax_only or not nonempty[j]:
                continue
            allowed = _allowed_ids(masks[j], n_vocab)
            if allowed is not None and len(allowed):  # few tokens allowed (usual inside a structure): keep those
                ids = torch.from_numpy(allowed).to(logits.device)
                kept = logits[row.index, ids]  # [k]
                logits[row.index].fill_(float("-inf"))
                logits[row.index, ids] = kept
                continue
            forbidden = _allowed_ids(~masks[j], n_vocab) if allowed is None else None
            if forbidden is not None:  # few tokens forbidden (e.g. inside a string): -inf just those
                logits[row.index, torch.from_numpy(forbidden).to(logits.device)] = float("-inf")
                logits[row.index, n_vocab:] = float("-inf")  # model vocabulary padded past the tokenizer's
            else:
                dense.append(j)
        if dense:
            forbidden = _unpack_forbidden(masks[dense], n_vocab, logits.device)  # [m, n_vocab] bool
            for k, j in enumerate(dense):
                logits[rows[j].index, :n_vocab].masked_fill_(forbidden[k], float("-inf"))
                if logits.shape[-1] > n_vocab:  # model vocabulary padded past the tokenizer's
                    logits[rows[j].index, n_vocab:] = float("-inf")
        for j, row in enumerate(rows):
            if not nonempty[j]:
                row.state.dead = True
        return chosen


# A mask with at most this many non-zero words (<= 32k allowed ids) is read as a list of ids: gathering
# those logits costs microseconds, unpacking and applying the whole mask about a millisecond per row.
_SPARSE_WORDS = 1024
# A greedy row whose argmax is refused looks for the best allowed token among this many top logits first.
_TOP_CANDIDATES = 64


def _allowed_ids(words: np.ndarray, n_vocab: int) -> np.ndarray | None:
    """The allowed token ids of one bitmask ``[words]`` when it is sparse (few non-zero words), else None.
    (Of an inverted bitmask: the forbidden ids.)"""
    nonzero = np.flatnonzero(words)  # [w]
    if len(nonzero) > _SPARSE_WORDS:
        return None
    bits = (words[nonzero].view(np.uint32)[:, None] >> np.arange(32, dtype=np.uint32)) & 1  # [w, 32]
    ids = (nonzero[:, None] * 32 + np.arange(32))[bits.astype(bool)]
    return ids[ids < n_vocab].astype(np.int64)


def _best_allowed(row_logits: torch.Tensor, words: np.ndarray) -> int | None:
    """The highest-scoring token one bitmask allows, from a sparse mask's ids or among the top logits.

    Exact: with few allowed ids it is their argmax; otherwise the first allowed token in descending logit
    order among the top candidates is the best allowed overall.  None when neither applies (the caller
    unpacks the mask).
    """
    allowed = _allowed_ids(words, row_logits.shape[-1])
    if allowed is not None:
        if len(allowed) == 0:
            return None
        ids = torch.from_numpy(allowed).to(row_logits.device)
        return int(ids[row_logits[ids].argmax()])
    for token in row_logits.topk(min(_TOP_CANDIDATES, row_logits.shape[-1])).indices.tolist():
        if _bit(words, token):
            return token
    return None


def _same_positions(keys: list[tuple[RowConstraint, int]], states: Sequence[RowConstraint]) -> bool:
    """Whether ``states`` are exactly the prefetched states, each still where it was."""
    return len(keys) == len(states) and all(k is s and n == s.consumed for (k, n), s in zip(keys, states))


def _bit(words: np.ndarray, token: int) -> bool:
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)


def _set_bit(words: np.ndarray, token: int, on: bool) -> None:
    word = int(words[token >> 5]) & 0xFFFFFFFF
    word = word | (1 << (token & 31)) if on else word & ~(1 << (token & 31))
    words[token >> 5] = np.array(word, dtype=np.uint32).view(np.int32)


def _unpack_forbidden(masks: np.ndarray, n_vocab: int, device: torch.device) -> torch.Tensor:
    """Bitmasks ``[m, words]`` -> forbidden-token booleans ``[m, n_vocab]`` on ``device``."""
    inverted = ~np.ascontiguousarray(masks)  # invert the packed words: cheaper than inverting the unpacked bits
    if device.type == "cpu":
        bits = np.unpackbits(inverted.view(np.uint8), axis=1, bitorder="little")
        return torch.from_numpy(bits[:, :n_vocab]).view(torch.bool)
    words = torch.from_numpy(inverted).to(device, non_blocking=True)  # [m, W] int32
    shifts = torch.arange(32, device=device, dtype=torch.int32)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # [m, W, 32]
    return bits.flatten(1)[:, :n_vocab].bool()
