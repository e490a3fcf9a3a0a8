"""What a run was run with, read back from the store: :func:`settings` (one dict per run) and
:func:`diff_settings` (only what differs between two runs) — the answer to "what did I change?".

The dict holds the engine's load settings and checkpoint identity (from the run's sessions) and the call
settings of its rows (from the requests and sampling they stored): the system prompt, the tools by name and
schema hash, the tool format and tool choice, the kind of row, every sampling setting and the response format
(by its grammar's hash).  A setting that takes more than one value inside the run is a :class:`Varies` holding
the values (at most :data:`VARIES_SHOWN` of them, and how many there were).  Seeds workbench drew for unseeded
sampled rows show as ``"drawn"``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.runs import codec
from workbench.runs.database import Database
from workbench.runs.store import Store, open_store

VARIES_SHOWN = 20
# load settings and provenance fields, in the order settings() lists them
_ENGINE_FIELDS = ("model", "checkpoint", "checkpoint_path", "dtype", "quantization", "model_parallel_size", "device")
_CALL_FIELDS = ("kind", "system_prompt", "tools", "tool_choice", "tool_prompt_format")


@dataclass(frozen=True)
class Varies:
    """A setting that takes several values inside one run: ``values`` (distinct, at most
    :data:`VARIES_SHOWN`, in a stable order) and ``count`` (how many distinct values there were)."""

    values: tuple[Any, ...]
    count: int

    def __repr__(self) -> str:
        more = f", ... {self.count} in all" if self.count > len(self.values) else ""
        return f"Varies({list(self.values)!r}{more})"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def tool_schema_hash(definition: Any) -> str:
    """A tool's schema by content (10 hex digits of sha256 of its definition as plain JSON: a tool definition by
    its name, description and parameters), so two runs offering the same tool under one name agree.  A Python
    function given to a chat call is stored by its name only, so its hash covers the name."""
    plain = codec.plain(definition)
    if isinstance(plain, dict):
        plain = {k: v for k, v in plain.items() if k != "function" or isinstance(v, dict)}
    return hashlib.sha256(_canonical(plain).encode()).hexdigest()[:10]


def tool_name(definition: Any) -> str:
    """A tool's name in any of the spellings a request may hold (a name, Llama Stack's or OpenAI's dict)."""
    if isinstance(definition, Mapping):
        function = definition.get("function")
        return str(
            definition.get("tool_name")
            or definition.get("name")
            or (function.get("name") if isinstance(function, Mapping) else None)
            or "?"
        )
    return str(definition)


def tools_setting(tools_json: str | None, schemas_json: str | None) -> dict[str, str] | None:
    """The tools of a request as ``{name: schema hash}`` (None: no tools)."""
    tools = json.loads(tools_json) if tools_json else None
    if not tools:
        return None
    schemas = json.loads(schemas_json) if schemas_json else {}
    return {tool_name(t): schemas.get(tool_name(t)) or tool_schema_hash(t) for t in tools}


def _merge(values: Iterable[Any]) -> Any:
    """One value, or :class:`Varies` over the distinct ones."""
    distinct = {}
    for value in values:
        distinct.setdefault(_canonical(value), value)
    if len(distinct) <= 1:
        return next(iter(distinct.values()), None)
    keys = sorted(distinct)
    return Varies(tuple(distinct[k] for k in keys[:VARIES_SHOWN]), len(keys))


def _engine_settings(store: Database, name: str) -> dict[str, Any]:
    found: dict[str, list[Any]] = {k: [] for k in _ENGINE_FIELDS}
    for prov in store.sessions(name).values():
        load = prov.get("load", {})
        row = {
            "model": prov.get("model"),
            "checkpoint": prov.get("checkpoint_identity"),
            "checkpoint_path": prov.get("checkpoint_path"),
            "dtype": load.get("dtype"),
            "quantization": load.get("quantization"),
            "model_parallel_size": load.get("model_parallel_size"),
            "device": prov.get("device"),
        }
        for key, value in row.items():
            found[key].append(value)
    return {k: _merge(v) for k, v in found.items()}


def _call_settings(store: Database, run_id: int) -> dict[str, Any]:
    """The call settings of a run's rows, read as distinct combinations (a few, not one per row)."""
    combos = store.query(
        "SELECT DISTINCT kind, CASE WHEN json_extract(request, '$.messages[0].role') = 'system' "
        "THEN json_extract(request, '$.messages[0].content') END, json_extract(request, '$.tools'), "
        "json_extract(request, '$.tool_schemas'), json_extract(request, '$.tool_choice'), "
        "json_extract(request, '$.tool_prompt_format'), json_remove(sampling, '$.seed') "
        "FROM rows WHERE run_id = ? AND json_valid(request) AND json_valid(sampling)",
        (run_id,),
    )
    columns: dict[str, list[Any]] = {k: [] for k in _CALL_FIELDS}
    sampling_rows: list[dict[str, Any]] = []
    tools_memo: dict[tuple[Any, Any], Any] = {}
    for kind, system, tools, schemas, choice, tool_format, sampling in combos:
        system = json.loads(system) if isinstance(system, str) and system[:1] in "[{" else system
        if (tools, schemas) not in tools_memo:
            tools_memo[(tools, schemas)] = tools_setting(tools, schemas)
        for key, value in zip(
            _CALL_FIELDS, (kind, system, tools_memo[(tools, schemas)], choice or "auto", tool_format)
        ):
            columns[key].append(value)
        sampling_rows.append(json.loads(sampling))
    out = {k: _merge(v) for k, v in columns.items()}
    for key in sorted({k for s in sampling_rows for k in s}):
        out[key] = _merge(s.get(key) for s in sampling_rows)
    seeds = store.query(
        "SELECT count(DISTINCT json_extract(sampling, '$.seed')), max(seed_drawn), "
        "min(json_extract(sampling, '$.seed')) FROM rows WHERE run_id = ? AND seed_drawn = 0",
        (run_id,),
    )
    drawn = store.query("SELECT count(*) FROM rows WHERE run_id = ? AND seed_drawn = 1", (run_id,))[0][0]
    given_count, _, given_one = seeds[0] if seeds else (0, None, None)
    given: Any = given_one if given_count == 1 else None
    if given_count > 1:
        values = [
            v
            for (v,) in store.query(
                "SELECT DISTINCT json_extract(sampling, '$.seed') FROM rows WHERE run_id = ? AND seed_drawn = 0 "
                f"ORDER BY 1 LIMIT {VARIES_SHOWN}",
                (run_id,),
            )
        ]
        given = Varies(tuple(values), given_count)
    if drawn:
        given = "drawn" if given is None else Varies(("drawn", given), 2)
    out["seed"] = given
    return out


def settings(name: str, *, store: str | Path | Store | None = None) -> dict[str, Any]:
    """Run ``name``'s settings as one dict: the engine's (``model``, ``checkpoint`` identity and path,
    ``dtype``, ``quantization``, ``model_parallel_size``, ``device``) and the calls' (``kind``,
    ``system_prompt``, ``tools`` as ``{name: schema hash}``, ``tool_choice``, ``tool_prompt_format``, every
    sampling setting, ``response_format`` by its grammar's hash); a setting that varies inside the run is a
    :class:`Varies`.  Unknown run: InputError listing the runs."""
    st = open_store(store)
    run_id = st.run_id(name)
    return {**_engine_settings(st, name), **_call_settings(st, run_id)}


def diff_settings(a: str, b: str, *, store: str | Path | Store | None = None) -> dict[str, tuple[Any, Any]]:
    """The settings of runs ``a`` and ``b`` that differ: ``{setting: (value in a, value in b)}`` (a setting one
    run lacks shows as None there)."""
    st = open_store(store)
    left, right = settings(a, store=st), settings(b, store=st)
    return {
        k: (left.get(k), right.get(k))
        for k in dict.fromkeys([*left, *right])
        if _canonical(left.get(k)) != _canonical(right.get(k))
    }
