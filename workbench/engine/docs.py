"""The sampling keywords' face on every completion and chat method, built from the one definition
(:class:`~workbench.generation.SamplingParams`): the shared docstring, the signature Shift+Tab shows, and the
one place a call's keywords and ``sampling=`` become the call's SamplingParams (:func:`take_sampling`).

Why built: each method declares only ``sampling=``; the keywords (``max_tokens``, ``temperature``, ...) are
added to its signature here from the fields, so a new field is a keyword of every method (and of the Ray pool,
which copies the engine's signatures) without touching one."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from workbench.errors import FormatError, SamplingError
from workbench.generation import SamplingParams

F = TypeVar("F", bound=Callable[..., Any])


def _field_lines() -> str:
    lines = []
    for f in SamplingParams.keywords():
        first, *rest = f.metadata["doc"].split("\n")
        lines.append(f"            {f.name}: {first}")
        lines += [f"                {more}" for more in rest]
    return "\n".join(lines)


SAMPLING_DOC = (
    """
        Sampling (keyword-only, the same on every completion and chat method):
            sampling: a ``wb.SamplingParams`` holding the settings below; a keyword given beside it
                overrides that field (``sampling=greedy, max_tokens=8``).
"""
    + _field_lines()
    + """

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

        item (keyword-only, every completion and chat method): what each row is a case of (a case id such as
            ``"q17"``); stored with the row under ``run=`` so runs compare item by item.  Batch methods take one
            item for every row or a list with one entry per row.  None (default): the store derives one.

        run (keyword-only, every completion, chat and streaming method): a name.  Every row is written to the
            run store (``wb.runs.path()``) the moment it finishes, and a row stored before — by this run or any
            other with the same checkpoint, settings and request: the key is exact — is answered from there
            (``result.cached``).  Re-running an interrupted call computes only the rows it lacks.  A sampled row
            without a seed runs with a drawn one that is recorded, so a re-run answers the same sample.
            ``refresh=True`` recomputes and replaces.  Browse with ``wb.runs.table()`` / ``wb.runs.rows(name)``.
"""
)


def sampling_doc(method: F) -> F:
    """Append the shared description of the sampling keywords (Shift+Tab and ``?`` show it)."""
    method.__doc__ = (method.__doc__ or "").rstrip() + "\n" + SAMPLING_DOC
    return method


def is_batch(method_name: str) -> bool:
    """A batch method (one value per row is allowed) by its name: ``batch_*`` and ``stream_batch_*``."""
    return "batch" in method_name


def public_signature(signature: inspect.Signature, method_name: str) -> inspect.Signature:
    """A method's signature with every sampling keyword (its default and type from the field) placed just
    before its ``sampling`` parameter."""
    batch = is_batch(method_name)
    keywords = [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=f.metadata["keyword"],
            annotation=(batch and f.metadata["batch_annotation"]) or f.metadata["annotation"] or f.type,
        )
        for f in SamplingParams.keywords()
    ]
    params = []
    for p in signature.parameters.values():
        if p.name == "sampling":
            params += keywords
        params.append(p)
    return signature.replace(parameters=params)


def take_sampling(given: dict[str, Any], method_name: str) -> None:
    """Resolve a call's sampling in place: the sampling keywords in ``given`` leave it, and ``given["sampling"]``
    becomes the call's :class:`SamplingParams` (:meth:`SamplingParams.resolve`: keywords override the fields
    of ``sampling=``).  A single-row method refuses a list where batch methods take one value per row."""
    keywords = {f.name: given.pop(f.name) for f in SamplingParams.keywords() if f.name in given}
    sampling = SamplingParams.resolve(given.get("sampling"), **keywords)
    if not is_batch(method_name):
        twin = "batch_" + method_name.replace("stream_", "")
        if isinstance(given.get("response_format"), (list, tuple)):
            raise FormatError(f"{method_name} takes one response_format (a list is for {twin})")
        if isinstance(sampling.seed, tuple):
            raise SamplingError(f"{method_name} takes one seed (a list with one per row is for {twin})")
    given["sampling"] = sampling
