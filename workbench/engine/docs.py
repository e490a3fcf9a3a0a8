"""The sampling keywords' shared description, appended to every completion and chat method's docstring
(one text, so Shift+Tab and ``?`` in a notebook say the same thing on every method)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

SAMPLING_DOC = """
        Sampling (keyword-only, the same on every completion and chat method):
            max_tokens: most tokens to generate per row; None runs until a stop token or max_seq_len.
            temperature: 0 (default) always picks the most likely token (greedy, deterministic);
                higher values sample more freely.
            top_p: nucleus sampling, only from the smallest set of tokens whose probability reaches
                top_p (1.0 = off).
            top_k: sample only among the k most likely tokens (0 = off).
            seed: makes sampled rows reproducible; every row gets its own generator seeded with it,
                so a prompt gives the same tokens alone or inside any batch.
            logprobs: k > 0 records each generated token's log-probability and its k most likely
                alternatives (``result.logprobs``); up to 20.
            stop: a string or list of strings that end generation; the text is cut before it.

        ``engine.cancel()`` (from a widget callback or another thread) stops the call at its next decode
        step with :class:`~workbench.errors.GenerationCancelled` (``.partial`` holds what was generated);
        the engine stays usable and later calls are unaffected.

        response_format (keyword-only, every completion and chat method): constrains the output, token by
            token: ``{"type": "json_schema", "json_schema": {...}}`` or a pydantic model class (``parsed``
            then holds the JSON value / the model object), ``{"type": "grammar", "bnf": "<GBNF or Lark>"}``,
            ``{"type": "regex", "regex": ...}`` or ``re.compile(...)``.  Batch methods take one format for
            every row or a list with one entry (None: unconstrained) per row.  An invalid format raises
            FormatError before anything is generated; a row cut by max_tokens says ``out_of_tokens`` and
            ``format_error``.

        run (keyword-only, every completion, chat and streaming method): a name.  Every row is written to the
            run store (``wb.runs.path()``) the moment it finishes, and a row stored before — by this run or any
            other with the same checkpoint, settings and request: the key is exact — is answered from there
            (``result.cached``).  Re-running an interrupted call computes only the rows it lacks.  A sampled row
            without a seed runs with a drawn one that is recorded, so a re-run answers the same sample.
            ``refresh=True`` recomputes and replaces.  Browse with ``wb.runs.table()`` / ``wb.runs.rows(name)``.
"""


def sampling_doc(method: F) -> F:
    """Append the shared description of the sampling keywords (Shift+Tab and ``?`` show it)."""
    method.__doc__ = (method.__doc__ or "").rstrip() + "\n" + SAMPLING_DOC
    return method
