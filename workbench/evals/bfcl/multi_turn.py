"""BFCL's multi-turn categories on a workbench engine: every entry one dialog of the tool loop, all in flight.

Each entry gets BFCL's stateful backends (:class:`.backends.Backends`, one instance per involved class, loaded from
its ``initial_config``; ``long_context`` for that category) and its user turns in order.  Within a turn the model
is asked again after each round of calls (a *step*); a reply with no decodable call ends the turn, as in BFCL's
``inference_multi_turn_*``; a turn that runs past BFCL's ``MAXIMUM_STEP_LIMIT`` steps ends the entry
(force-terminated).  ``multi_turn_miss_func``'s held-out functions arrive at the turn BFCL adds them, with its
exact message (the FC wording and the tools extended for ``prompt="official"``; the prompting wording, which
lists the functions, for ``prompt="bfcl"``); ``miss_param`` runs as BFCL runs it (its data already lacks the
parameter, and its ground truth expects no call in that turn).

Every step of every running entry is one batched engine call: ``prompt="official"`` through the tool loop's
:func:`workbench.tools.complete_turn` (the chat route, ``batch_chat_completion``: the model's own tool format,
each dialog with its own tools); ``prompt="bfcl"`` renders BFCL's Llama handler prompt as token ids and calls
``engine.batch_completion``.  Calls run on the entry's instances by name (:meth:`.backends.Backends.execute`),
never by ``eval``; the checker gets call strings rebuilt from the parsed calls (:func:`.backends.call_string`).
"""

from __future__ import annotations

import importlib
import json
import sqlite3
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from workbench import runs
from workbench.errors import StoreError, StoreWarning
from workbench.progress import progress_bar
from workbench.tools import Dialog, Toolbox, complete_turn
from workbench.types import Message, ToolCall, Transcript

from .backends import Backends, call_string
from .multi_turn_check import check_entry, explain, step_limit
from .package import bfcl, bfcl_messages, load_multi_turn_entries, to_openai_tool
from .replay import parse_ground_truth

COLUMNS = [
    "id",
    "category",
    "valid",
    "error",
    "turns",
    "steps",
    "calls",
    "force_terminated",
    "cached",
    "prompt",
    "failed_turn",
    "explanation",
    "tokens",
    "log",
]

#: The text BFCL's Llama 3.1 handler puts before the function docs in the first user message (its JSON handler).
_JSON_HANDLER_INTRO = (
    "Given the following functions, please respond with a JSON for a function call "
    "with its proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables.\n\n"
)
_JSON_HANDLER_SYSTEM = "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
_CHAT_TOKENS = {
    "llama4": ("<|header_start|>", "<|header_end|>", "<|eot|>"),
    "llama3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
}


def handler_style(engine: Any) -> str:
    """Which BFCL Llama handler ``prompt="bfcl"`` reproduces: ``"json"`` (Llama 3.1's, ``LlamaHandler_3_1``) or
    ``"python_list"`` (Llama 3.2, 3.3 and 4's, ``LlamaHandler``)."""
    model = getattr(engine.formatter, "model", None)
    return "json" if getattr(model, "version", None) == "3.1" else "python_list"


@dataclass(eq=False)
class _Entry:
    """One entry's dialog: its backends, where it is (turn, step), and what it called."""

    entry: dict[str, Any]
    category: str
    truth: list[list[str]]
    backends: Backends
    functions: list[dict[str, Any]]
    style: str | None = None  # prompt="bfcl": BFCL's handler ("json" or "python_list")
    dialog: Dialog | None = None  # prompt="official"
    messages: list[dict[str, Any]] = field(default_factory=list)  # prompt="bfcl": BFCL's message list
    turn: int = -1
    step: int = 0
    calls: list[list[list[str]]] = field(default_factory=list)  # per turn, per step with calls
    log: list[list[dict[str, Any]]] = field(default_factory=list)  # per turn, per step: reply, calls, results
    force_terminated: bool = False
    inference_error: str | None = None
    done: bool = False
    cached: bool = True
    tokens: int = 0
    prompts: list[list[int]] = field(default_factory=list)  # prompt="bfcl": each step's prompt ids
    toolboxes: dict[tuple[str, ...], Toolbox] = field(default_factory=dict)  # shared by the run's entries


def run_multi_turn(
    engine: Any,
    categories: Sequence[str],
    *,
    limit: int | None,
    prompt: str,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    progress: bool | None,
    run: str | None,
    refresh: bool,
) -> pd.DataFrame:
    """Run the entries of the multi-turn ``categories`` to the end and score them with BFCL's checker."""
    stored = runs.call_keywords(run, refresh)
    prompts = _modules_prompts()
    style = handler_style(engine) if prompt == "bfcl" else None
    toolboxes: dict[tuple[str, ...], Toolbox] = {}
    work = [
        _start(entry, category, prompt, style, toolboxes)
        for category in categories
        for entry in load_multi_turn_entries(category, limit)
    ]
    for e in work:
        _next_turn(e, prompt, prompts)
    sampling = {"max_tokens": max_tokens, "temperature": temperature, "seed": seed, "progress": False, **stored}
    with progress_bar(len(work), desc="BFCL multi-turn", unit="dialog", progress=progress) as bar:
        while active := [e for e in work if not e.done]:
            if prompt == "official":
                replies = _official_step(engine, active, sampling)
            else:
                replies = _bfcl_step(engine, active, sampling, style)
            for e in active:
                if e not in replies:  # its prompt no longer fits: the entry ends as BFCL's would (an error)
                    e.done = True
                    continue
                _take(e, *replies[e], prompt=prompt, prompts=prompts)
            bar.update(sum(e.done for e in active))
    rows = [_row(e, prompt) for e in work]
    stepped = [r for r in rows if r["steps"]]  # entries with rows in the store (others never fit)
    if run is not None and stepped:
        if prompt == "bfcl":  # completion rows: each numbered by its reply in the entry, as chat rows are
            _number_turns(run, [(ids, e.entry["id"], k) for e in work for k, ids in enumerate(e.prompts)])
        runs.keep_scores(run, {r["id"]: {"valid": bool(r["valid"])} for r in stepped})
        runs.put_explanations(run, {r["id"]: r["explanation"] or "" for r in stepped})
    return pd.DataFrame(rows, columns=COLUMNS)


def _number_turns(run: str, turns: list[tuple[list[int], str, int]]) -> None:
    """Number the stored completion rows; a store that cannot be written warns, as every harness write does."""
    try:
        runs.set_turns(run, turns)
    except (StoreError, sqlite3.Error, OSError) as exc:
        warnings.warn(f"the turns of run {run!r} could not be numbered ({exc})", StoreWarning, stacklevel=3)


def _modules_prompts() -> Any:
    bfcl()
    return importlib.import_module("bfcl_eval.constants.default_prompts")


def _toolbox(functions: list[dict[str, Any]], toolboxes: dict[tuple[str, ...], Toolbox]) -> Toolbox:
    """One Toolbox per distinct function set (entries of the same classes share it, so a batch checks it once);
    a set is named by its functions' names (every entry reads a class's docs from the same BFCL file)."""
    key = tuple(f["name"] for f in functions)
    if key not in toolboxes:
        toolboxes[key] = Toolbox.create([to_openai_tool(f) for f in functions])
    return toolboxes[key]


def _start(
    entry: dict[str, Any], category: str, prompt: str, style: str | None, toolboxes: dict[tuple[str, ...], Toolbox]
) -> _Entry:
    functions = [dict(f) for f in entry["function"]]
    e = _Entry(entry, category, entry["ground_truth"], Backends.for_entry(entry), functions, style)
    e.toolboxes = toolboxes
    if prompt == "official":
        tools = _toolbox(functions, toolboxes)
        e.dialog = Dialog(Transcript([]), tools, item=entry["id"])
    return e


def _next_turn(e: _Entry, prompt: str, prompts: Any) -> None:
    """Begin the entry's next turn (its user messages; the held-out functions where BFCL adds them)."""
    e.turn += 1
    questions = e.entry["question"]
    if e.turn >= len(questions) or e.force_terminated:
        e.done = True
        return
    messages = [dict(m) for m in questions[e.turn]]
    held_out = (e.entry.get("missed_function") or {}).get(str(e.turn))
    if held_out is not None:
        if prompt == "official":  # BFCL's FC flow: the tools grow, the user says so
            e.functions.extend(held_out)
            e.dialog.toolbox = _toolbox(e.functions, e.toolboxes)
            text = prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
        else:  # BFCL's prompting flow: the functions are written into the user message
            text = prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=held_out)
        messages = [{"role": "user", "content": text}]
    if prompt == "official":
        e.dialog.transcript.extend(Message.coerce(m) for m in messages)
    elif e.turn == 0 and e.style == "python_list":  # BFCL's system prompt (the functions of turn 0), first
        e.messages = bfcl_messages(messages, e.functions)
    else:
        e.messages.extend(messages)
    e.step = 0
    e.calls.append([])
    e.log.append([])


def _official_step(engine: Any, active: list[_Entry], sampling: dict[str, Any]) -> dict[_Entry, tuple]:
    by_dialog = {id(e.dialog): e for e in active}
    out = {}
    for dialog, reply in complete_turn(engine, [e.dialog for e in active], sampling=sampling, too_long="end"):
        e = by_dialog[id(dialog)]
        message = dialog.add(reply)
        out[e] = (message.content, list(message.tool_calls or []), bool(reply.cached), len(reply.tokens))
    for e in active:
        if e not in out:
            e.inference_error = "the prompt no longer fits the engine's max_seq_len (prompt_too_long)"
    return out


def _bfcl_step(engine: Any, active: list[_Entry], sampling: dict[str, Any], style: str) -> dict[_Entry, tuple]:
    asked, prompts = [], []
    for e in active:
        ids = encode_handler_prompt(engine.tokenizer, e.messages, e.functions, style)
        if len(ids) >= engine.max_seq_len:
            e.inference_error = (
                f"the prompt has {len(ids)} tokens but max_seq_len is {engine.max_seq_len}; "
                "load with a larger max_seq_len"
            )
            continue
        asked.append(e)
        prompts.append(ids)
        e.prompts.append(ids)
    if not asked:
        return {}
    completions = engine.batch_completion(prompts, item=[e.entry["id"] for e in asked], **sampling)
    out = {}
    for e, completion in zip(asked, completions):
        message = engine.formatter.decode_assistant(completion.text, completion.stop_reason)
        e.messages.append({"role": "assistant", "content": completion.text})
        cached = bool(getattr(completion, "cached", False))
        out[e] = (completion.text, list(message.tool_calls or []), cached, len(completion.tokens))
    return out


def _take(e: _Entry, text: Any, calls: list[ToolCall], cached: bool, tokens: int, *, prompt: str, prompts: Any) -> None:
    """One reply of the entry: run its calls and go on, or end the turn (no decodable call)."""
    e.cached = e.cached and cached
    e.tokens += tokens
    record = {"step": e.step, "reply": text, "calls": [], "results": []}
    e.log[-1].append(record)
    if not calls:
        _next_turn(e, prompt, prompts)
        return
    results = [e.backends.execute(c.tool_name, dict(c.arguments)) for c in calls]
    record["calls"] = [call_string(c.tool_name, dict(c.arguments)) for c in calls]
    record["parsed"] = [(c.tool_name, dict(c.arguments)) for c in calls]
    record["results"] = results
    e.calls[-1].append(record["calls"])
    if prompt == "official":
        e.dialog.answer(calls, fixed=results)
    else:
        role = "tool" if e.style == "json" else "ipython"  # the role each handler gives results
        e.messages.extend({"role": role, "content": r} for r in results)
    e.step += 1
    if e.step > step_limit():
        e.force_terminated = True
        e.done = True


def _row(e: _Entry, prompt: str) -> dict[str, Any]:
    verdict = check_entry(e.entry, e.truth, e.calls, inference_error=e.inference_error)
    steps = sum(len(t) for t in e.log)
    return {
        "id": e.entry["id"],
        "category": e.category,
        "valid": verdict["valid"],
        "error": verdict["error"],
        "turns": len(e.log),
        "steps": steps,
        "calls": e.calls,
        "force_terminated": e.force_terminated,
        "cached": bool(steps) and e.cached,
        "prompt": prompt,
        "failed_turn": verdict["turn"],
        "explanation": explain(verdict, steps=e.step if e.force_terminated else None),
        "tokens": e.tokens,
        "log": e.log,
    }


def turn_states(row: Any) -> list[dict[str, Any]]:
    """An entry's dialog turn by turn, from its result row: the user's message, the calls made, and the state of
    every stateful backend after the turn next to the ground truth's after the same turn (both replayed on fresh
    instances by name; ``differs`` lists the attributes that are not equal, as BFCL's state check compares them).
    """
    entry = next(e for e in load_multi_turn_entries(row["category"], None) if e["id"] == row["id"])
    ours, truth = Backends.for_entry(entry), Backends.for_entry(entry)
    expected = parse_ground_truth(entry)
    out = []
    for turn, steps in enumerate(row["log"]):
        for step in steps:
            for name, arguments in step.get("parsed", []):
                ours.execute(name, arguments)
        for call in expected[turn] if turn < len(expected) else []:
            truth.execute(call.tool_name, dict(call.arguments))
        state, wanted = ours.state(), truth.state()
        question = entry["question"][turn] if turn < len(entry["question"]) else []
        out.append(
            {
                "turn": turn,
                "user": " / ".join(str(m["content"]) for m in question) or "(held-out functions added)",
                "calls": [c for step in steps for c in step["calls"]],
                "state": state,
                "expected_state": wanted,
                "differs": [f"{c}.{k}" for c in wanted for k in wanted[c] if state[c].get(k) != wanted[c][k]],
            }
        )
    return out


# ------------------------------------------------------------------------------------------- BFCL's prompts
def encode_handler_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], functions: list[dict[str, Any]], style: str
) -> list[int]:
    """BFCL's Llama handler prompt for ``messages`` as token ids: ``LlamaHandler._format_prompt`` (``style``
    ``"python_list"``: each message header, role, ``"\\n\\n"``, stripped content, end of turn) or
    ``LlamaHandler_3_1._format_prompt`` (``"json"``: its system block, the function docs in the first user
    message, tool results under ``ipython`` unstripped).  Special tokens are placed by id; the text between them
    is encoded as one piece, as a tokenizer reading BFCL's prompt string with special tokens enabled does."""
    family = getattr(tokenizer, "family", "llama3")
    start, end, eot = _CHAT_TOKENS.get(family, _CHAT_TOKENS["llama3"])
    pieces: list[Any] = []

    def header(role: str) -> None:
        pieces.extend([(start,), role, (end,), "\n\n"])

    if style == "json":
        system, rest = "", messages
        if messages and messages[0]["role"] == "system":
            system, rest = str(messages[0]["content"]).strip(), messages[1:]
        header("system")
        pieces.extend([_JSON_HANDLER_SYSTEM + system, (eot,)])
        first_user = True
        for m in rest:
            if m["role"] == "user" and first_user:
                first_user = False
                header("user")
                docs = "".join(json.dumps(f, indent=4) + "\n\n" for f in functions)
                pieces.extend([_JSON_HANDLER_INTRO + docs + str(m["content"]).strip(), (eot,)])
            elif m["role"] == "tool":
                header("ipython")
                content = m["content"]
                pieces.extend([json.dumps(content) if isinstance(content, (dict, list)) else content, (eot,)])
            else:
                header(m["role"])
                pieces.extend([str(m["content"]).strip(), (eot,)])
    else:
        for m in messages:
            header(m["role"])
            pieces.extend([str(m["content"]).strip(), (eot,)])
    header("assistant")
    ids = [tokenizer.bos_id]
    text = ""
    for piece in pieces:
        if isinstance(piece, tuple):
            if text:
                ids += tokenizer.encode(text)
                text = ""
            ids.append(tokenizer.special_tokens[piece[0]])
        else:
            text += piece
    return ids + (tokenizer.encode(text) if text else [])
