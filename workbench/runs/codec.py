"""Results to JSON and back, exactly: what the store writes for a row's output, and what a re-run returns.

:func:`encode` / :func:`decode` round-trip :class:`~workbench.types.Completion`,
:class:`~workbench.types.ChatCompletion`, :class:`~workbench.types.Message`,
:class:`~workbench.types.ToolCall`, :class:`~workbench.types.TokenLogprob`,
:class:`~workbench.types.ScoredRow` and :class:`~workbench.types.Transcript` (and lists of them): the decoded
object equals the original, field types included (ints stay ints, tuples tuples, ``-inf`` log-probabilities
stay ``-inf``).  Arbitrary values inside results (message content items, tool-call arguments, ``parsed``) are
JSON where they are JSON; other values carry a tag under the reserved key ``"__wb"`` (bytes, tuples, dicts with
non-string keys, PIL images as PNG, paths).  A pydantic object in ``parsed`` is stored as its JSON dump and
comes back as that object only when :func:`decode` is given its class (``parsed_type=``; the engine passes the
call's ``response_format``), else as the plain dict.  Values of no known kind are stored by repr (lossy).

:func:`plain` is the lenient cousin for what is only browsed (a request as given: tools may be Python
callables): it never raises and never round-trips.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import io
import json
from collections.abc import Mapping
from math import isfinite
from pathlib import Path, PurePath
from typing import Any

from workbench.errors import InputError
from workbench.types import ChatCompletion, Completion, Message, ScoredRow, TokenLogprob, ToolCall, Transcript

TAG = "__wb"


# ------------------------------------------------------------------------------------------------ encode
def encode(result: Any) -> dict[str, Any]:
    """A result (or a list of results) as JSON-ready data that :func:`decode` turns back into an equal object."""
    if isinstance(result, Completion):
        return {
            "type": "Completion",
            "text": result.text,
            "tokens": _ints(result.tokens),
            "stop_reason": result.stop_reason,
            "logprobs": _enc_logprobs(result.logprobs),
            "prompt_tokens": result.prompt_tokens,
            "parsed": _enc(result.parsed),
            "format_error": result.format_error,
            "cached": bool(result.cached),
        }
    if isinstance(result, ChatCompletion):
        return {
            "type": "ChatCompletion",
            "message": _enc_message(result.message),
            "tokens": _ints(result.tokens),
            "stop_reason": result.stop_reason,
            "logprobs": _enc_logprobs(result.logprobs),
            "prompt_tokens": result.prompt_tokens,
            "parsed": _enc(result.parsed),
            "format_error": result.format_error,
            "cached": bool(result.cached),
        }
    if isinstance(result, Transcript):
        return {
            "type": "Transcript",
            "messages": [_enc(m) for m in result],
            "stop_reason": result.stop_reason,
            "generated_tokens": result.generated_tokens,
            "cached": bool(getattr(result, "cached", False)),
        }
    if isinstance(result, Message):
        return {"type": "Message", **_enc_message(result)}
    if isinstance(result, ToolCall):
        return {"type": "ToolCall", **_enc_call(result)}
    if isinstance(result, ScoredRow):
        return {
            "type": "ScoredRow",
            "logprobs": [_float(x) for x in result.logprobs],
            "greedy": [bool(g) for g in result.greedy],
        }
    if isinstance(result, list):
        return {"type": "list", "items": [encode(r) for r in result]}
    raise InputError(
        f"cannot store a {type(result).__name__} as a run result; results are Completion, "
        "ChatCompletion, Message, ToolCall, ScoredRow, Transcript or lists of them"
    )


def dumps(result: Any) -> str:
    """:func:`encode` as compact JSON text."""
    return json.dumps(encode(result), ensure_ascii=False, separators=(",", ":"))


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


def _float(value: Any) -> Any:
    """A float JSON can carry exactly (``-inf``/``nan`` tagged: strict JSON readers accept the output)."""
    value = float(value)
    return value if isfinite(value) else {TAG: "float", "repr": repr(value)}


def _enc_logprobs(logprobs: list[TokenLogprob] | None) -> Any:
    if logprobs is None:
        return None
    # the bulk of a row with logprobs: finite floats pass straight through
    return [
        [
            int(lp.token),
            lp.text,
            _float(lp.logprob),
            [[k, v if type(v) is float and isfinite(v) else _float(v)] for k, v in lp.top_logprobs.items()],
            _ints(lp.top_tokens),
        ]
        for lp in logprobs
    ]


def _enc_call(call: ToolCall) -> dict[str, Any]:
    return {"tool_name": call.tool_name, "arguments": _enc(call.arguments), "call_id": call.call_id}


def _enc_message(message: Message) -> dict[str, Any]:
    return {
        "role": message.role,
        "content": _enc(message.content),
        "tool_calls": [_enc_call(c) for c in message.tool_calls],
        "call_id": message.call_id,
        "stop_reason": message.stop_reason,
        "parse_error": message.parse_error,
    }


def _enc(value: Any) -> Any:
    """An arbitrary value as JSON data; non-JSON values (and dicts using the reserved key) are tagged."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, list):
        return [_enc(v) for v in value]
    if isinstance(value, tuple):
        return {TAG: "tuple", "items": [_enc(v) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and TAG not in value:
            return {k: _enc(v) for k, v in value.items()}
        return {TAG: "dict", "items": [[_enc(k), _enc(v)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {TAG: "bytes", "b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Message):
        return {TAG: "Message", **_enc_message(value)}
    if isinstance(value, ToolCall):
        return {TAG: "ToolCall", **_enc_call(value)}
    if isinstance(value, PurePath):
        return {TAG: "path", "path": str(value)}
    if _is_pil(value):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return {TAG: "image", "png": base64.b64encode(buffer.getvalue()).decode("ascii")}
    if hasattr(value, "model_dump") and not isinstance(value, type):  # a pydantic object (parsed output)
        cls = type(value)
        return {
            TAG: "model",
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "json": _enc(value.model_dump(mode="json")),
        }
    return {TAG: "repr", "type": f"{type(value).__module__}.{type(value).__qualname__}", "repr": repr(value)}


def _is_pil(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "save") and hasattr(value, "mode")


# ------------------------------------------------------------------------------------------------ decode
def decode(data: Mapping[str, Any], *, parsed_type: Any = None) -> Any:
    """The object :func:`encode` was given (``parsed_type``: the pydantic class a ``parsed`` object is rebuilt
    as, when it was one)."""
    kind = data.get("type") if isinstance(data, Mapping) else None
    if kind == "Completion":
        return Completion(
            text=data["text"],
            tokens=list(data["tokens"]),
            stop_reason=data["stop_reason"],
            logprobs=_dec_logprobs(data["logprobs"]),
            prompt_tokens=data["prompt_tokens"],
            parsed=_dec(data["parsed"], parsed_type),
            format_error=data["format_error"],
            cached=data.get("cached", False),
        )
    if kind == "ChatCompletion":
        return ChatCompletion(
            message=_dec_message(data["message"]),
            tokens=list(data["tokens"]),
            stop_reason=data["stop_reason"],
            logprobs=_dec_logprobs(data["logprobs"]),
            prompt_tokens=data["prompt_tokens"],
            parsed=_dec(data["parsed"], parsed_type),
            format_error=data["format_error"],
            cached=data.get("cached", False),
        )
    if kind == "Transcript":
        return Transcript(
            [_dec(m) for m in data["messages"]],
            stop_reason=data["stop_reason"],
            generated_tokens=data["generated_tokens"],
            cached=data.get("cached", False),
        )
    if kind == "Message":
        return _dec_message(data)
    if kind == "ToolCall":
        return _dec_call(data)
    if kind == "ScoredRow":
        return ScoredRow(logprobs=[_dec(x) for x in data["logprobs"]], greedy=list(data["greedy"]))
    if kind == "list":
        return [decode(item, parsed_type=parsed_type) for item in data["items"]]
    raise InputError(f"stored output of unknown type {kind!r}; it was written by another workbench version")


def loads(text: str, *, parsed_type: Any = None) -> Any:
    """:func:`decode` of :func:`dumps` text."""
    return decode(json.loads(text), parsed_type=parsed_type)


def _dec_logprobs(items: Any) -> list[TokenLogprob] | None:
    if items is None:
        return None
    return [
        TokenLogprob(
            token=token,
            text=text,
            logprob=_dec(logprob),
            top_logprobs={k: v if type(v) is not dict else _dec(v) for k, v in top},
            top_tokens=top_tokens,
        )
        for token, text, logprob, top, top_tokens in items
    ]


def _dec_call(data: Mapping[str, Any]) -> ToolCall:
    return ToolCall(tool_name=data["tool_name"], arguments=_dec(data["arguments"]), call_id=data["call_id"])


def _dec_message(data: Mapping[str, Any]) -> Message:
    return Message(
        role=data["role"],
        content=_dec(data["content"]),
        tool_calls=[_dec_call(c) for c in data["tool_calls"]],
        call_id=data["call_id"],
        stop_reason=data["stop_reason"],
        parse_error=data["parse_error"],
    )


def _dec(value: Any, parsed_type: Any = None) -> Any:
    if isinstance(value, list):
        return [_dec(v) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(TAG)
    if tag is None:
        return {k: _dec(v) for k, v in value.items()}
    if tag == "float":
        return float(value["repr"])
    if tag == "tuple":
        return tuple(_dec(v) for v in value["items"])
    if tag == "dict":
        return {_dec(k): _dec(v) for k, v in value["items"]}
    if tag == "bytes":
        return base64.b64decode(value["b64"])
    if tag == "Message":
        return _dec_message(value)
    if tag == "ToolCall":
        return _dec_call(value)
    if tag == "path":
        return Path(value["path"])
    if tag == "image":
        from PIL import Image  # Pillow: a dependency, imported only where an image was stored

        with Image.open(io.BytesIO(base64.b64decode(value["png"]))) as image:
            return image.copy()  # a plain Image (not the PNG file's subclass), like the one stored
    if tag == "model":
        data = _dec(value["json"])
        wanted = f"{getattr(parsed_type, '__module__', '')}.{getattr(parsed_type, '__qualname__', '')}"
        if parsed_type is not None and hasattr(parsed_type, "model_validate") and wanted == value["class"]:
            return parsed_type.model_validate(data)
        return data
    if tag == "repr":
        return value["repr"]
    raise InputError(f"stored value with unknown tag {tag!r}; it was written by another workbench version")


# ------------------------------------------------------------------------------------------------ plain
def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON data for browsing (a request as given): dataclasses and pydantic objects as dicts,
    callables by name, images and bytes by content hash, anything else by repr.  Never raises."""
    try:
        return _plain(value, depth)
    except Exception as exc:  # a value whose repr or dump raises: still a row, never a failed call
        return f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"


def _plain(value: Any, depth: int) -> Any:
    if depth > 64:
        return "<nested too deep>"
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, enum.Enum):
        return _plain(value.value, depth + 1)
    if isinstance(value, Mapping):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [_plain(v, depth + 1) for v in items]
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if isinstance(value, PurePath):
        return str(value)
    if _is_pil(value):
        digest = hashlib.sha256(value.tobytes()).hexdigest()
        return {"image": f"{value.mode} {value.size[0]}x{value.size[1]}", "sha256": digest}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, type) and hasattr(value, "model_json_schema"):
        return {"pydantic_model": value.__qualname__, "schema": _plain(value.model_json_schema(), depth + 1)}
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump(mode="json"), depth + 1)
    if callable(value):
        return {"callable": f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"}
    return repr(value)
