"""BFCL's multi-turn verdict on one entry, and why it failed, in words a researcher can act on.

The verdict is BFCL's own: the eval runner's two checks (an entry that stopped before its last turn is
``multi_turn:force_terminated``; an entry whose generation failed is ``multi_turn:inference_error``), then
``multi_turn_checker`` (state and response checks, turn by turn, against the ground truth run on fresh instances).
The checker keeps its backend instances in its module's globals under a name built from the model name and the
entry id; each call here uses a name of its own and removes its instances afterwards, so entries can be scored
again (and from several threads) without one run's state leaking into the next.
"""

from __future__ import annotations

import importlib
import re
import threading
import uuid
from typing import Any

from .package import bfcl

_LOCK = threading.Lock()  # the checker writes module globals


def _modules() -> tuple[Any, Any, Any]:
    bfcl()
    checker = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
    utils = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    prompts = importlib.import_module("bfcl_eval.constants.default_prompts")
    return checker, utils, prompts


def step_limit() -> int:
    """BFCL's ``MAXIMUM_STEP_LIMIT``: a turn whose replies keep calling for more steps ends the entry."""
    return int(_modules()[2].MAXIMUM_STEP_LIMIT)


def check_entry(
    entry: dict[str, Any],
    ground_truth: list[list[str]],
    calls: list[list[list[str]]],
    *,
    inference_error: str | None = None,
) -> dict[str, Any]:
    """BFCL's verdict on an entry's calls (per turn, per step with calls, each a call string).

    Returns ``{"valid", "error" (BFCL's error type or None), "message", "turn" (where it failed, or None),
    "details"}``."""
    if inference_error is not None:
        return _verdict("multi_turn:inference_error", inference_error, None, {})
    if len(calls) != len(ground_truth):
        message = (
            "Model was force-terminated during inference phase. The length of the model result turns "
            f"({len(calls)}) does not match the length of the ground truth turns ({len(ground_truth)})."
        )
        return _verdict("multi_turn:force_terminated", message, len(calls) - 1, {})
    checker, utils, _ = _modules()
    name = f"workbench_{uuid.uuid4().hex}"
    test_entry = {k: entry[k] for k in ("id", "involved_classes", "initial_config") if k in entry}
    test_entry.setdefault("initial_config", {})
    category = entry["id"].rsplit("_", 1)[0]
    with _LOCK:
        try:
            result = checker.multi_turn_checker(calls, ground_truth, test_entry, category, name)
        except Exception as exc:  # noqa: BLE001 - a reply the checker did not expect: counted wrong, with why
            result = {
                "valid": False,
                "error_type": "multi_turn:checker_error",
                "error_message": f"BFCL's checker failed on this entry: {type(exc).__name__}: {exc}",
            }
        finally:
            prefix = re.sub(r"[-./:]", "_", name)
            for key in [k for k in vars(utils) if k.startswith(prefix)]:
                del vars(utils)[key]
    if result.get("valid"):
        return {"valid": True, "error": None, "message": None, "turn": None, "details": {}}
    message = result.get("error_message", "")
    details = dict(result.get("details") or {})
    if result.get("error_type") == "multi_turn:instance_state_mismatch":
        turn = len(result.get("execution_result", [])) - 1
        found = re.search(r"for (\w+) does not match", message)
        details["class"] = found.group(1) if found else None
    else:
        found = re.search(r"turn (\d+)", message)
        turn = int(found.group(1)) if found else None
    return _verdict(result.get("error_type", "multi_turn:invalid"), message, turn, details)


def _verdict(error: str, message: str, turn: int | None, details: dict[str, Any]) -> dict[str, Any]:
    return {"valid": False, "error": error, "message": message, "turn": turn, "details": details}


def _short(value: Any, limit: int = 240) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def explain(verdict: dict[str, Any], *, steps: int | None = None) -> str | None:
    """One paragraph on why an entry failed: the turn, and the state that differs attribute by attribute, the
    expected results that are missing, or why the entry ended (None for a valid entry)."""
    if verdict["valid"]:
        return None
    error, turn, details = verdict["error"], verdict["turn"], verdict["details"]
    where = f"turn {turn}: " if turn is not None else ""
    if error == "multi_turn:instance_state_mismatch":
        lines = [f"{where}{details.get('class') or 'a backend'}'s state differs from the ground truth's"]
        for attr, pair in (details.get("differences") or {}).items():
            lines.append(f"  {attr}: model {_short(pair['model'])} / expected {_short(pair['ground_truth'])}")
        return "\n".join(lines)
    if error == "multi_turn:execution_response_mismatch":
        missing = details.get("missing_items") or []
        lines = [f"{where}{len(missing)} expected result(s) missing from the model's results so far"]
        lines += [f"  missing: {_short(item)}" for item in missing]
        return "\n".join(lines)
    if error == "multi_turn:empty_turn_model_response":
        return f"{where}no call was made where the ground truth makes some"
    if error == "multi_turn:force_terminated":
        limit = f" after {steps} steps" if steps else ""
        return f"{where}force-terminated{limit} (BFCL's step limit {step_limit()}): later turns were not run"
    return f"{where}{error}: {verdict['message']}"
