"""The installed ``bfcl_eval`` package, imported safely: its data, ground truth, checker and prompt wording.

Nothing of BFCL is vendored here: every question, answer, system-prompt piece and the AST checker are read
from the installed package at run time.  Two facts shape the import:

- the checker imports ``bfcl_eval.constants.model_config`` (the model registry), which imports every vendor
  SDK BFCL supports; a small stand-in module is put in ``sys.modules`` first.  The checker only asks the
  registry whether a model's API rewrote ``.`` to ``_`` in function names, and workbench never does.
- importing ``bfcl_eval.constants.eval_config`` creates ``result/``, ``score/`` and ``.file_locks/`` under
  ``$BFCL_PROJECT_ROOT`` (by default next to the installed package); workbench points it at its cache.

BFCL's decoders ``eval()`` model output; they are never imported or called here.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import sys
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ...checkpoints.factory import cache_root as checkpoint_cache_root
from ...errors import ConfigError, InputError

#: The model name given to BFCL's checker (its registry stand-in answers for it).
CHECKER_MODEL_NAME = "workbench"
_MODEL_CONFIG = "bfcl_eval.constants.model_config"

#: Categories scored by BFCL's AST checker (one turn, calls compared with the possible answers).
#: (``simple_java`` and ``simple_javascript`` are left out: their values are Java/JavaScript source text, which
#: BFCL decodes with tree-sitter parsers of the model's raw text.)
AST_CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
#: Categories scored on whether the reply holds a call at all (irrelevance: it must not; relevance: it must).
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
#: Multi-turn categories: dialogs on BFCL's stateful backends, scored by its multi-turn checker.
MULTI_TURN_CATEGORIES = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
SUPPORTED_CATEGORIES = AST_CATEGORIES + RELEVANCE_CATEGORIES + MULTI_TURN_CATEGORIES


class BFCLError(InputError):
    """A BFCL run was asked for something it cannot do (unknown category, bad limit or prompt)."""


@dataclass(frozen=True)
class _CheckerModelConfig:
    """What BFCL's checker reads from its model registry for the model being scored."""

    underscore_to_dot: bool = False


class _Registry(dict):
    """The stand-in registry: every model name maps to a config that keeps function names as written."""

    def __missing__(self, key: str) -> _CheckerModelConfig:
        return _CheckerModelConfig()


def cache_root() -> Path:
    """Where BFCL's import-time folders go: ``$WORKBENCH_CACHE/bfcl`` (default ``~/.cache/workbench/bfcl``)."""
    return checkpoint_cache_root() / "bfcl"


@cache
def bfcl() -> types.SimpleNamespace:
    """The parts of ``bfcl_eval`` workbench uses (imported once); ConfigError when it is not installed."""
    try:
        importlib.import_module("bfcl_eval")
    except ImportError:
        raise ConfigError(
            "BFCL needs the bfcl-eval package: pip install --no-deps bfcl-eval==2026.3.23 "
            '(then pip install -e ".[bfcl]"); --no-deps because its pins (numpy==1.26.4 and every vendor SDK) '
            "are not needed by the data and the AST checker workbench uses"
        ) from None
    if _MODEL_CONFIG not in sys.modules:
        stub = types.ModuleType(_MODEL_CONFIG)
        stub.__doc__ = "workbench's stand-in for BFCL's model registry (which imports every vendor SDK)"
        stub.MODEL_CONFIG_MAPPING = _Registry()  # type: ignore[attr-defined]
        sys.modules[_MODEL_CONFIG] = stub
    else:  # the real registry was imported by someone else: make sure it answers for our name
        sys.modules[_MODEL_CONFIG].MODEL_CONFIG_MAPPING.setdefault(CHECKER_MODEL_NAME, _CheckerModelConfig())
    previous = os.environ.get("BFCL_PROJECT_ROOT")
    if previous is None:
        os.environ["BFCL_PROJECT_ROOT"] = str(cache_root())
    try:
        utils = importlib.import_module("bfcl_eval.utils")
        checker = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    finally:
        if previous is None:
            os.environ.pop("BFCL_PROJECT_ROOT", None)
    return types.SimpleNamespace(
        utils=utils,
        checker=checker,
        enums=importlib.import_module("bfcl_eval.constants.enums"),
        prompts=importlib.import_module("bfcl_eval.constants.default_prompts"),
        types=importlib.import_module("bfcl_eval.constants.type_mappings"),
    )


def check_categories(categories: Any) -> tuple[str, ...]:
    """The categories as a tuple of supported names, or BFCLError naming the bad one and the choices."""
    if isinstance(categories, str):
        categories = (categories,)
    try:
        out = tuple(categories)
    except TypeError:
        raise BFCLError(f"categories must be a list of BFCL category names, got {categories!r:.80}") from None
    if not out:
        raise BFCLError(f"categories is empty; name at least one of {', '.join(SUPPORTED_CATEGORIES)}")
    for name in out:
        if name in SUPPORTED_CATEGORIES:
            continue
        if isinstance(name, str) and name.startswith(("multi_turn", "memory", "web_search", "format_sensitivity")):
            raise BFCLError(
                f"BFCL category {name!r} is agentic or a composite (memory, web search, format sensitivity); "
                f"workbench runs these: {', '.join(SUPPORTED_CATEGORIES)}"
            )
        if name in ("simple_java", "simple_javascript"):
            raise BFCLError(
                f"BFCL category {name!r} scores Java/JavaScript source text, which BFCL decodes from the "
                "model's raw reply with tree-sitter; workbench gives the checker parsed calls only. Run "
                f"the Python ones: {', '.join(SUPPORTED_CATEGORIES)}"
            )
        raise BFCLError(f"unknown BFCL category {name!r}; choose from {', '.join(SUPPORTED_CATEGORIES)}")
    if len(set(out)) != len(out):
        raise BFCLError(f"categories {out!r} name a category twice")
    return out


def load_entries(category: str, limit: int | None) -> list[dict[str, Any]]:
    """The first ``limit`` entries of a category in BFCL's own order, as BFCL's loader gives them for prompting
    (language hints added to the function docs), each with its ``ground_truth`` (None for relevance categories)
    and ``checker_function`` (the function docs BFCL's eval runner gives its checker)."""
    pkg = bfcl()
    entries = pkg.utils.load_dataset_entry(category, include_prereq=False)
    # BFCL's eval runner checks against the function docs without the language hints (Java and JavaScript
    # parameter types stay as written there, and its type converters need them)
    plain = pkg.utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    if limit is not None:
        entries, plain = entries[:limit], plain[:limit]
    checker_docs = {e["id"]: e["function"] for e in plain}
    answers: dict[str, Any] = {}
    if category in AST_CATEGORIES:
        answers = {a["id"]: a["ground_truth"] for a in pkg.utils.load_ground_truth_entry(category)}
    out = []
    for entry in entries:
        if len(entry["question"]) != 1:
            raise BFCLError(
                f"BFCL entry {entry['id']} has {len(entry['question'])} turns; only single-turn "
                "categories are supported"
            )
        if category in AST_CATEGORIES and entry["id"] not in answers:
            raise BFCLError(f"BFCL entry {entry['id']} has no ground truth in the installed bfcl-eval")
        out.append({**entry, "ground_truth": answers.get(entry["id"]), "checker_function": checker_docs[entry["id"]]})
    return out


def load_multi_turn_entries(category: str, limit: int | None) -> list[dict[str, Any]]:
    """The first ``limit`` entries of a multi-turn category as BFCL's generation loads them (function docs of
    the involved classes, held-out functions moved to ``missed_function``), each with its ``ground_truth``
    (per turn, BFCL's call strings).  Read once per process (BFCL's loader reads the function-doc files again for
    every entry); each call gets its own entry dicts, whose contents are shared and must be treated as read-only.
    """
    entries = _multi_turn_entries(category)
    return [dict(e) for e in (entries if limit is None else entries[:limit])]


@cache
def _multi_turn_entries(category: str) -> tuple[dict[str, Any], ...]:
    pkg = bfcl()
    entries = pkg.utils.load_dataset_entry(category, include_prereq=False)
    answers = {a["id"]: a["ground_truth"] for a in pkg.utils.load_ground_truth_entry(category)}
    missing = [e["id"] for e in entries if e["id"] not in answers]
    if missing:
        raise BFCLError(f"BFCL entries {missing[:3]} have no ground truth in the installed bfcl-eval")
    return tuple({**e, "ground_truth": answers[e["id"]]} for e in entries)


def check_calls(entry: dict[str, Any], category: str, calls: list[dict[str, Any]]) -> tuple[bool, str | None]:
    """BFCL's verdict on ``calls`` (``[{name: {arg: value}}]``) for one entry, and its error text if invalid.

    AST categories go through BFCL's ``ast_checker``; relevance categories through BFCL's ``is_empty_output``,
    as BFCL's eval runner does (a reply with no parsable call counts as no call)."""
    pkg = bfcl()
    if category in RELEVANCE_CATEGORIES:
        has_call = bool(calls) and not pkg.utils.is_empty_output(calls)
        if category.endswith("irrelevance"):
            return (not has_call), (None if not has_call else "made a function call where none applies")
        return has_call, (None if has_call else "made no function call where one applies")
    if not calls:
        return False, "no function call in the reply"
    try:
        result = pkg.checker.ast_checker(
            copy.deepcopy(entry["checker_function"]),
            copy.deepcopy(calls),
            entry["ground_truth"],
            pkg.enums.Language.PYTHON,
            category,
            CHECKER_MODEL_NAME,
        )
    except Exception as exc:  # a reply the checker did not expect (BFCL's runner would stop): counted wrong
        return False, f"BFCL's checker failed on this reply: {type(exc).__name__}: {exc}"
    if result["valid"]:
        return True, None
    return False, "; ".join(str(e) for e in result["error"]) or result.get("error_type", "invalid")


# ------------------------------------------------------------------------------------------- schemas
def to_json_schema(properties: dict[str, Any]) -> dict[str, Any]:
    """BFCL's parameter dialect (``dict``, ``float``, ``tuple``, ``any``...) as JSON Schema, mapped through
    BFCL's own ``GORILLA_TO_OPENAPI`` table the way its function-calling handlers do: unknown or missing types
    become ``string``; a ``float`` parameter becomes ``number`` with ``format: float`` and a note in its
    description; array items get their type mapped; nested objects' properties are mapped the same way."""
    mapping = bfcl().types.GORILLA_TO_OPENAPI
    return {name: _parameter(spec, mapping) for name, spec in properties.items()}


def _parameter(spec: Any, mapping: dict[str, str]) -> dict[str, Any]:
    spec = copy.deepcopy(spec) if isinstance(spec, dict) else {}
    bfcl_type = spec.get("type")
    if bfcl_type == "float":
        spec["format"] = "float"
        spec["description"] = spec.get("description", "") + " This is a float type value."
    spec["type"] = _json_type(bfcl_type, mapping)
    if spec["type"] in ("array", "object"):
        if isinstance(spec.get("properties"), dict):
            spec["properties"] = {k: _parameter(v, mapping) for k, v in spec["properties"].items()}
        elif isinstance(spec.get("items"), dict):
            spec["items"] = _items(spec["items"], mapping)
    return spec


def _items(items: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """Array items: the type mapped (no float note, as BFCL does), nested items and object properties too."""
    items["type"] = _json_type(items.get("type"), mapping)
    if items["type"] == "array" and isinstance(items.get("items"), dict):
        items["items"] = _items(items["items"], mapping)
    elif items["type"] == "object" and isinstance(items.get("properties"), dict):
        items["properties"] = {k: _parameter(v, mapping) for k, v in items["properties"].items()}
    return items


def _json_type(bfcl_type: Any, mapping: dict[str, str]) -> str:
    return mapping.get(bfcl_type, "string") if isinstance(bfcl_type, str) else "string"


def to_openai_tool(function: dict[str, Any]) -> dict[str, Any]:
    """One BFCL function doc as an OpenAI-style tool (what ``engine.formatter`` renders officially)."""
    params = dict(function.get("parameters") or {})
    params["type"] = "object"
    params["properties"] = to_json_schema(params.get("properties") or {})
    fn = {"name": function["name"], "description": function.get("description", ""), "parameters": params}
    return {"type": "function", "function": fn}


# ------------------------------------------------------------------------------------------- BFCL's prompt
def system_prompt(functions: list[dict[str, Any]]) -> str:
    """BFCL's default system prompt for prompting models (its Llama handler's), with the function docs as the
    raw JSON BFCL shows them.  Every piece of wording comes from ``bfcl_eval.constants.default_prompts``."""
    p = bfcl().prompts
    config = dict(part.split("=", 1) for part in p.DEFAULT_SYSTEM_PROMPT_FORMAT.split("&"))
    ret, doc_format = config["ret_fmt"], config["func_doc_fmt"]
    if doc_format != "json":
        raise ConfigError(
            f"the installed bfcl-eval's default prompt shows function docs as {doc_format!r}; "
            "workbench reproduces the 'json' one: install bfcl-eval==2026.3.23"
        )
    style = p.PROMPT_STYLE_TEMPLATES[config["style"]]
    tag = config["tool_call_tag"] == "True"
    call_format = style["tool_call_with_tag" if tag else "tool_call_no_tag"].format(
        output_format=p.OUTPUT_FORMAT_MAPPING[ret], param_types=p.PARAM_TYPE_MAPPING[ret]
    )
    tools = style["available_tools"].format(format=doc_format, functions=json.dumps(functions, indent=4))
    return p.PROMPT_TEMPLATE_MAPPING[config["prompt_fmt"]].format(
        persona=style["persona"],
        task=style["task"],
        tool_call_format=call_format,
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=tools,
    )


def bfcl_messages(messages: list[dict[str, Any]], functions: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The dialog BFCL's prompting handlers send: its system prompt first (a question's own system message is
    appended to it after a blank line)."""
    prompt = system_prompt(functions)
    msgs = [dict(m) for m in messages]
    if msgs and msgs[0]["role"] == "system":
        msgs[0]["content"] = prompt + "\n\n" + msgs[0]["content"]
    else:
        msgs.insert(0, {"role": "system", "content": prompt})
    return msgs
