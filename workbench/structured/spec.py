"""What a caller may pass as ``response_format``, turned into one grammar the scheduler can enforce.

Accepted (per row of a batch):

* ``{"type": "json_schema", "json_schema": {...}}`` — Llama Stack's shape (OpenAI's
  ``{"json_schema": {"name": ..., "schema": {...}}}`` is unwrapped too); ``json_schema`` may also be a
  pydantic model class;
* a pydantic model class (the result then carries the validated object in ``parsed``);
* ``{"type": "json_object"}`` — any JSON object;
* ``{"type": "grammar", "bnf": "..."}`` — a GBNF (llama.cpp) or Lark grammar; Llama Stack types ``bnf`` as a
  dict, so ``{"root": "...", "rule": "..."}`` (rule name -> GBNF body) is accepted as well;
* ``{"type": "regex", "regex": "..."}`` (or ``"pattern"``) and a compiled ``re.Pattern``;
* the pydantic request objects of llama-stack (``JsonSchemaResponseFormat`` ...), via ``model_dump``.

Everything becomes an llguidance grammar string here (no tokenizer needed); :mod:`.runtime` compiles and
checks it against the vocabulary.  :class:`Constraint` is the picklable part that travels to
model-parallel workers; the pydantic class stays in the kernel (it may live in a notebook's ``__main__``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from workbench.errors import FormatError
from workbench.types import StopReason

# JSON as Llama models write it (json.dumps' separators) and no free whitespace between tokens, so a
# constrained row cannot wander into endless indentation.  A schema's own "x-guidance" overrides these.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_OPENAI_WRAPPER_KEYS = {"name", "schema", "strict", "description"}  # OpenAI's {"json_schema": {"schema": ...}}
_TYPES = "'json_schema', 'json_object', 'grammar' or 'regex'"


@dataclass(frozen=True)
class Constraint:
    """One row's grammar as the scheduler sees it.

    ``grammar`` is an llguidance grammar (serialized); ``end_tokens`` are the token ids that may end the row
    once the grammar is complete (``<|eot|>`` for response formats; tool calls may also end with ``<|eom|>``);
    ``end_reason`` is the stop reason of a row whose grammar completes without the model writing an end token
    (the grammar allows nothing else, so the row ends at once).
    """

    grammar: str
    kind: str
    end_tokens: tuple[int, ...]
    end_reason: StopReason = "end_of_turn"


@dataclass(frozen=True)
class OutputFormat:
    """A parsed ``response_format``: the grammar source plus what the engine needs to build the result."""

    kind: str  # json_schema | grammar | regex | tool_call
    grammar: str
    schema: dict[str, Any] | None = None  # JSON formats: the schema (for the chat prompt and for users)
    model: Any = None  # a pydantic model class, when one was given

    def constraint(self, end_tokens: tuple[int, ...], end_reason: StopReason = "end_of_turn") -> Constraint:
        return Constraint(self.grammar, self.kind, end_tokens, end_reason)


def coerce_response_format(value: Any) -> OutputFormat | None:
    """Turn a user's ``response_format`` into an :class:`OutputFormat` (None stays None).

    Raises :class:`~workbench.errors.FormatError` for shapes it does not know; the grammar itself is checked
    later, against the vocabulary (:meth:`GrammarRuntime.check`).
    """
    if value is None or isinstance(value, OutputFormat):
        return value
    if isinstance(value, re.Pattern):
        return regex_format(value.pattern)
    if _is_pydantic_class(value):
        return json_schema_format(value.model_json_schema(), model=value)
    if hasattr(value, "model_dump") and not isinstance(value, type):  # llama-stack's request objects
        value = value.model_dump(mode="json")
    if isinstance(value, str):
        raise FormatError(
            f"response_format {value[:60]!r} is a bare string; give {{'type': 'regex', 'regex': ...}}, "
            "{'type': 'grammar', 'bnf': ...}, {'type': 'json_schema', 'json_schema': {...}} or a pydantic model class"
        )
    if not isinstance(value, dict):
        raise FormatError(
            f"response_format must be a dict like {{'type': 'json_schema', 'json_schema': {{...}}}}, a pydantic "
            f"model class or re.compile(...), got {type(value).__name__}"
        )
    kind = value.get("type")
    kind = getattr(kind, "value", kind)  # enum members of other packages
    if kind == "json_schema":
        schema = value.get("json_schema", value.get("schema"))
        if _is_pydantic_class(schema):
            return json_schema_format(schema.model_json_schema(), model=schema)
        if isinstance(schema, dict) and "schema" in schema and set(schema) <= _OPENAI_WRAPPER_KEYS:
            schema = schema["schema"]
        if not isinstance(schema, (dict, bool)):
            raise FormatError(
                "response_format {'type': 'json_schema'} needs 'json_schema': a JSON Schema dict or a pydantic "
                f"model class, got {type(schema).__name__}"
            )
        return json_schema_format(schema)
    if kind == "json_object":
        return json_schema_format({"type": "object"})
    if kind == "grammar":
        return grammar_format(value.get("bnf", value.get("grammar")))
    if kind == "regex":
        pattern = value.get("regex", value.get("pattern"))
        if isinstance(pattern, re.Pattern):
            pattern = pattern.pattern
        if not isinstance(pattern, str) or not pattern:
            raise FormatError("response_format {'type': 'regex'} needs a non-empty 'regex' string")
        return regex_format(pattern)
    raise FormatError(f"response_format type {kind!r} is not supported; use {_TYPES}")


def json_schema_format(schema: dict[str, Any] | bool, model: Any = None) -> OutputFormat:
    import llguidance

    if schema is False:
        raise FormatError("the JSON schema `false` accepts nothing; give a schema some output can satisfy")
    schema = {} if schema is True else schema
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except (TypeError, ValueError) as exc:
        raise FormatError(f"invalid JSON schema in response_format: {exc}") from exc
    return OutputFormat("json_schema", grammar, schema=schema, model=model)


def grammar_format(bnf: Any) -> OutputFormat:
    """A GBNF grammar (``root ::= ...``) or a Lark grammar (``start: ...``)."""
    import llguidance
    from llguidance.gbnf_to_lark import any_to_lark

    if isinstance(bnf, dict) and bnf and all(isinstance(k, str) and isinstance(v, str) for k, v in bnf.items()):
        bnf = "\n".join(f"{name} ::= {body}" for name, body in bnf.items())
    if not isinstance(bnf, str) or not bnf.strip():
        raise FormatError(
            "response_format {'type': 'grammar'} needs 'bnf': GBNF text like 'root ::= \"yes\" | \"no\"' "
            "(or a dict of rule name -> GBNF body)"
        )
    try:
        lark = any_to_lark(bnf)
    except Exception as exc:  # the converter raises its own error types
        raise FormatError(f"invalid grammar in response_format: {exc}") from exc
    return OutputFormat("grammar", llguidance.LLMatcher.grammar_from_lark(lark))


def regex_format(pattern: str) -> OutputFormat:
    import llguidance

    return OutputFormat("regex", llguidance.LLMatcher.grammar_from_regex(pattern))


def _is_pydantic_class(value: Any) -> bool:
    return isinstance(value, type) and hasattr(value, "model_json_schema") and hasattr(value, "model_validate_json")


def per_row_formats(response_format: Any, n_rows: int) -> list[OutputFormat | None]:
    """One format for every row, or a list/tuple with one entry (or None) per row."""
    if isinstance(response_format, (list, tuple)):
        if len(response_format) != n_rows:
            raise FormatError(
                f"response_format has {len(response_format)} entries for {n_rows} prompts; give one format for "
                "all rows or one entry (None for unconstrained) per row"
            )
        return [coerce_response_format(f) for f in response_format]
    fmt = coerce_response_format(response_format)
    return [fmt] * n_rows
