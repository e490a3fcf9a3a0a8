"""OpenAI request bodies → engine calls: each field checked, with the field named when it is wrong.

Why parse by hand rather than with pydantic request models: the client must get OpenAI's error shape with
``param`` naming the field (``messages[2].content``, ``top_logprobs``), and the translation is where OpenAI's
spellings meet the engine's (``max_completion_tokens`` → ``max_tokens``, ``tool_call_id`` → ``call_id``,
``image_url`` parts → image bytes).  Omitted sampling fields take the engine's defaults (greedy, no limit
but ``max_seq_len``), so a request gives exactly what the same in-process call gives.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import APIError

MAX_N = 16  # choices per request: more is a batch job, not a request
MAX_TOP_LOGPROBS = 20
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_UNSUPPORTED_NONZERO = ("frequency_penalty", "presence_penalty")


@dataclass(frozen=True)
class Sampling:
    """The engine's sampling keywords for one engine call (hashable: equal samplings share a batch)."""

    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: int = 0
    stop: tuple[str, ...] = ()
    repetition_penalty: float = 1.0  # vLLM's extension field (1.0: off)

    def kwargs(self) -> dict[str, Any]:
        out = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "logprobs": self.logprobs,
            "stop": list(self.stop) or None,
        }
        if self.repetition_penalty != 1.0:  # only when given: the engine's keywords (and run-store keys) as before
            out["repetition_penalty"] = self.repetition_penalty
        return out

    def for_choice(self, i: int) -> Sampling:
        """Choice ``i`` of ``n``: a sampled row gets ``seed + i`` so the choices differ yet stay reproducible
        (choice 0 is the in-process call with ``seed``); greedy rows need no seed at all."""
        if self.temperature == 0.0:
            return replace(self, seed=None)
        if self.seed is None or i == 0:
            return self
        return replace(self, seed=self.seed + i)


@dataclass
class ChatRequest:
    """A checked ``/v1/chat/completions`` body."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: str
    sampling: Sampling
    n: int = 1
    response_format: Any = None
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tools_key: str = ""  # the tools as canonical JSON: requests with equal tools can share an engine call

    def row_key(self, i: int) -> tuple:
        """What must be equal for rows to share one ``batch_chat_completion`` call."""
        return ("chat", self.tools_key, self.tool_choice, self.sampling.for_choice(i))

    def engine_kwargs(self, i: int) -> dict[str, Any]:
        return {"tools": self.tools, "tool_choice": self.tool_choice, **self.sampling.for_choice(i).kwargs()}


@dataclass
class CompletionRequest:
    """A checked ``/v1/completions`` body (``prompts``: strings or token-id lists, one per row)."""

    prompts: list[str | list[int]]
    sampling: Sampling
    n: int = 1
    echo: bool = False
    logprobs: int | None = None  # OpenAI's legacy integer; None: no logprobs in the response
    stream: bool = False
    include_usage: bool = False
    generate: bool = True  # False: max_tokens=0 with echo (score the prompt only)
    rows: list[tuple[int, int]] = field(default_factory=list)  # (prompt index, choice index) per output row

    def row_key(self, i: int) -> tuple:
        return ("completion", self.sampling.for_choice(i))


# ----------------------------------------------------------------------------------------------- fields
def _int(body: dict, name: str, default: Any, lo: int | None = None, hi: int | None = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"'{name}' must be an integer, got {value!r:.60}", param=name)
    if lo is not None and value < lo:
        raise APIError(f"'{name}' must be >= {lo}, got {value}", param=name)
    if hi is not None and value > hi:
        raise APIError(f"'{name}' must be <= {hi}, got {value}", param=name)
    return value


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise APIError(f"'{name}' must be a finite number, got {value!r:.60}", param=name)
    if value < lo or (lo_open and value == lo) or value > hi:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise APIError(f"'{name}' must be in {interval}, got {value}", param=name)
    return float(value)


def _bool(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(f"'{name}' must be true or false, got {value!r:.60}", param=name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise APIError("'stop' must be a non-empty string or a list of non-empty strings", param="stop")
    return tuple(stop)


def _sampling(body: dict, max_tokens: int | None, logprobs: int) -> Sampling:
    for name in _UNSUPPORTED_NONZERO:
        if body.get(name) not in (None, 0, 0.0):
            raise APIError(f"'{name}' is not supported by this engine; leave it out (or 0)", param=name)
    return Sampling(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 0.0, 1e6),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=_int(body, "top_k", 0, lo=0),
        seed=_int(body, "seed", None, lo=-(2**63), hi=2**64 - 1),
        logprobs=logprobs,
        stop=_stop(body),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 1e6, lo_open=True),
    )


def _stream_options(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise APIError("'stream_options' is only allowed with \"stream\": true", param="stream_options")
    if not isinstance(options, dict):
        raise APIError("'stream_options' must be an object like {\"include_usage\": true}", param="stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise APIError("'stream_options.include_usage' must be true or false", param="stream_options.include_usage")
    return usage


def check_model(body: dict, served: str | Sequence[str], field: str = "model") -> None:
    """The one model-id check of every route: ``body[field]`` (OpenAI's ``model``, Llama Stack's ``model_id``)
    absent means the served model; any other id is a 404 ``model_not_found`` naming the served one.

    ``served``: the served id, or every accepted id (the served id first, then registered aliases)."""
    model = body.get(field)
    ids = (served,) if isinstance(served, str) else tuple(served)
    if model is None or model in ids:
        return
    raise APIError(
        f"the model {model!r:.80} is not served here; this server serves {ids[0]!r} (see GET /v1/models)",
        param=field,
        status=404,
        code="model_not_found",
    )


# ----------------------------------------------------------------------------------------------- chat
def _image_part(part: dict, where: str) -> bytes:
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str) or not url.startswith("data:image/") or ";base64," not in url[:100]:
        raise APIError(
            f"{where}.image_url.url must be a base64 data URL (data:image/png;base64,...); this server "
            "fetches nothing from the network",
            param=f"{where}.image_url",
        )
    try:
        return base64.b64decode(url.split(";base64,", 1)[1], validate=True)
    except (binascii.Error, ValueError):
        raise APIError(f"{where}.image_url.url is not valid base64", param=f"{where}.image_url") from None


def _content(content: Any, where: str) -> Any:
    """OpenAI content (a string or text/image parts) as the engine's: a string, or a list of text and image bytes."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(f"{where} must be a string or a list of content parts", param=where)
    items: list[Any] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            items.append(part["text"])
        elif kind == "image_url":
            items.append(_image_part(part, at))
        else:
            raise APIError(f"{at} must be {{'type': 'text', 'text': ...}} or {{'type': 'image_url', ...}}", param=at)
    if all(isinstance(i, str) for i in items):
        return "".join(items)
    return items


def _message(raw: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise APIError(f"{where} must be an object with 'role' and 'content'", param=where)
    role = _ROLES.get(raw.get("role"))
    if role is None:
        raise APIError(
            f"{where}.role is {raw.get('role')!r:.40}; use system, developer, user, assistant or tool",
            param=f"{where}.role",
        )
    if raw.get("content") is None and not (role == "assistant" and raw.get("tool_calls")):
        needs = "its 'content' or 'tool_calls'" if role == "assistant" else "its 'content' (a string or content parts)"
        raise APIError(
            f"{where} ({raw.get('role')}) has no content: a {raw.get('role')} message needs {needs}",
            param=f"{where}.content",
        )
    message: dict[str, Any] = {"role": role, "content": _content(raw.get("content"), f"{where}.content")}
    if role == "assistant" and raw.get("tool_calls"):
        calls = raw["tool_calls"]
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls
        ):
            raise APIError(
                f"{where}.tool_calls must be a list of {{'id', 'type': 'function', 'function': "
                "{'name', 'arguments'}}",
                param=f"{where}.tool_calls",
            )
        message["tool_calls"] = calls
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise APIError(f"{where}.tool_call_id must be a string", param=f"{where}.tool_call_id")
        message["call_id"] = call_id or ""
    return message


def _tools(body: dict) -> tuple[list[dict[str, Any]] | None, str]:
    tools = body.get("tools")
    if tools is None or tools == []:
        return None, ""
    if not isinstance(tools, list):
        raise APIError("'tools' must be a list of {'type': 'function', 'function': {...}}", param="tools")
    for j, tool in enumerate(tools):
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(tool.get("function"), dict)
            or not isinstance(tool["function"].get("name"), str)
        ):
            raise APIError(
                f"tools[{j}] must be {{'type': 'function', 'function': {{'name', 'description', 'parameters'}}}}",
                param=f"tools[{j}]",
            )
    return tools, json.dumps(tools, sort_keys=True)


def _tool_choice(body: dict, tools: list[dict[str, Any]] | None) -> str:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto"
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise APIError(
                "'tool_choice' must be auto, none, required or {'type': 'function', 'function': {'name': ...}}",
                param="tool_choice",
            )
        choice = name
    elif choice not in ("auto", "none", "required"):
        raise APIError(
            f"'tool_choice' is {choice!r:.60}; use auto, none, required or a named function", param="tool_choice"
        )
    if choice not in ("auto", "none") and not tools:
        raise APIError(f"'tool_choice' {choice!r} needs 'tools' to choose from", param="tool_choice")
    if choice not in ("auto", "none", "required") and choice not in {t["function"]["name"] for t in tools or ()}:
        raise APIError(f"'tool_choice' names {choice!r}, which is not among 'tools'", param="tool_choice")
    return choice


def _response_format(body: dict) -> Any:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise APIError(
            "'response_format' must be {'type': 'text' | 'json_object' | 'json_schema', ...}", param="response_format"
        )
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
            raise APIError(
                "'response_format.json_schema' must be {'name': ..., 'schema': {...}}",
                param="response_format.json_schema",
            )
        return {"type": "json_schema", "json_schema": spec.get("schema", {})}
    return {"type": "json_object"}


def parse_chat(body: dict) -> ChatRequest:
    """The engine's view of a chat body; :class:`APIError` (naming the field) for anything it cannot serve."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list of messages", param="messages")
    converted = [_message(m, i) for i, m in enumerate(messages)]
    tools, tools_key = _tools(body)
    max_tokens = _int(body, "max_completion_tokens", None, lo=1)
    max_tokens = _int(body, "max_tokens", max_tokens, lo=1)
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, lo=0, hi=MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise APIError("'top_logprobs' needs \"logprobs\": true", param="top_logprobs")
    stream = _bool(body, "stream")
    return ChatRequest(
        messages=converted,
        tools=tools,
        tool_choice=_tool_choice(body, tools),
        sampling=_sampling(body, max_tokens, max(top, 1) if logprobs else 0),
        n=_int(body, "n", 1, lo=1, hi=MAX_N),
        response_format=_response_format(body),
        stream=stream,
        include_usage=_stream_options(body, stream),
        logprobs=logprobs,
        top_logprobs=top,
        tools_key=tools_key,
    )


# ----------------------------------------------------------------------------------------------- completions
def _prompts(body: dict) -> list[str | list[int]]:
    prompt = body.get("prompt")
    bad = APIError(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists", param="prompt"
    )
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise bad
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [list(prompt)]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt):
        return [list(p) for p in prompt]
    raise bad


def parse_completion(body: dict) -> CompletionRequest:
    """The engine's view of a legacy completions body (what lm-eval's ``local-completions`` sends)."""
    prompts = _prompts(body)
    echo = _bool(body, "echo")
    max_tokens = _int(body, "max_tokens", None, lo=0)
    if max_tokens == 0 and not echo:
        raise APIError(
            "'max_tokens' must be >= 1 (0 is allowed only with \"echo\": true, to score the prompt)", param="max_tokens"
        )
    logprobs = _int(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    stream = _bool(body, "stream")
    if stream and echo:
        raise APIError(
            "'echo' with \"stream\": true is not supported; send the request without streaming", param="echo"
        )
    n = _int(body, "n", 1, lo=1, hi=MAX_N)
    if len(prompts) * n > 4 * MAX_N * MAX_N:
        raise APIError(
            f"{len(prompts)} prompts x n={n} rows is too many for one request; send at most {4 * MAX_N * MAX_N} rows",
            param="prompt",
        )
    return CompletionRequest(
        prompts=prompts,
        sampling=_sampling(body, max_tokens or None, max(logprobs or 0, 1) if logprobs is not None else 0),
        n=n,
        echo=echo,
        logprobs=logprobs,
        stream=stream,
        include_usage=_stream_options(body, stream),
        generate=max_tokens != 0,
        rows=[(p, c) for p in range(len(prompts)) for c in range(n)],
    )
