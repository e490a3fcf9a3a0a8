"""Result and message dataclasses of the public API.

Plain dicts of the same shape are accepted wherever a :class:`Message` or :class:`ToolCall` is
(see :func:`Message.coerce`), so notebooks can write dialogs as JSON-like literals.
"""

from __future__ import annotations

import enum
import json
import keyword
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from workbench.errors import InputError, WorkbenchError

# "cancelled" only appears in the partial results of a call stopped with ``engine.cancel()``.
StopReason = Literal["end_of_turn", "end_of_message", "out_of_tokens", "cancelled"]
Role = Literal["system", "user", "assistant", "tool", "ipython"]
ROLES = ("system", "user", "assistant", "tool", "ipython")
STOP_REASONS = ("end_of_turn", "end_of_message", "out_of_tokens", "cancelled")

# A tool name the model can write as a call in every syntax (a python-list call is `[name(arg=...)]`).
_TOOL_NAME_RE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
# Tool-call arguments nest at most this deep: deeper values are no real arguments and would exhaust the
# recursion of renderers (and Python's parser) on the next turn.
MAX_ARGUMENT_DEPTH = 64
_MAX_INT_BITS = 13_000  # ~4000 decimal digits: Python refuses to print longer ints (sys.set_int_max_str_digits)


# ---------------------------------------------------------------------------------------------- presentation
# Results live in this ground layer; their HTML cards and DataFrames belong to the notebook face
# (:mod:`workbench.notebook.display`), which registers its renderers here when it is imported — and
# ``import workbench`` always imports it.  So results display richly without this module importing upwards.
_PRESENTERS: dict[str, Callable[..., Any]] = {}


def register_presenter(kind: str, render: Callable[..., Any]) -> None:
    """Install the notebook face's renderer for ``kind`` ("completion_html", "messages_html", "frame", ...)."""
    _PRESENTERS[kind] = render


def present(kind: str, *args: Any) -> Any:
    """Render through the registered notebook renderer of ``kind``."""
    render = _PRESENTERS.get(kind)
    if render is None:
        raise WorkbenchError(
            f"no notebook renderer for {kind!r} is registered; import workbench (its package face "
            "installs them) before displaying results"
        )
    return render(*args)


def check_tool_name(name: Any, what: str = "tool name") -> str:
    """A tool name as a string, or :class:`InputError` when the model could not write it as a call."""
    if isinstance(name, enum.Enum):
        name = name.value
    if not isinstance(name, str) or not name:
        raise InputError(f"{what} must be a non-empty string, got {name!r}")
    if not _TOOL_NAME_RE.fullmatch(name) or any(keyword.iskeyword(part) for part in name.split(".")):
        raise InputError(
            f"{what} {name!r} cannot be written as a tool call: use letters, digits and underscores, starting with "
            "a letter or underscore (e.g. 'get_weather'), and no Python keyword"
        )
    return name


def check_json_value(value: Any, where: str = "value", depth: int = 0) -> Any:
    """``value`` if it is a JSON value every prompt format can write (finite numbers, string keys, nesting at most
    :data:`MAX_ARGUMENT_DEPTH`); else :class:`InputError` naming the path of the offending part."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        if value.bit_length() > _MAX_INT_BITS:
            raise InputError(f"{where} is an integer with {value.bit_length()} bits; too large to write in a prompt")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(f"{where} is {value!r}, which is not a JSON number; use a finite number or a string")
        return value
    if depth >= MAX_ARGUMENT_DEPTH and isinstance(value, (list, tuple, dict)):
        raise InputError(f"{where} nests deeper than {MAX_ARGUMENT_DEPTH} levels; flatten the value")
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json_value(item, f"{where}[{i}]", depth + 1)
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InputError(f"{where} has the key {key!r} ({type(key).__name__}); JSON object keys are strings")
            check_json_value(item, f"{where}[{key!r}]", depth + 1)
        return value
    raise InputError(
        f"{where} is a {type(value).__name__} ({value!r:.80}); tool-call arguments must be JSON values "
        "(str, int, float, bool, None, lists and dicts of them)"
    )


def check_arguments(arguments: Any, name: str) -> dict[str, Any]:
    """Tool-call arguments as a dict of JSON values (a JSON object string is parsed; None is ``{}``)."""
    if arguments is None:
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            raise InputError(
                f"arguments of tool call {name!r} are a string that is not valid JSON ({exc}); give a "
                "dict or a JSON object string"
            ) from None
    if not isinstance(arguments, dict):
        raise InputError(
            f"arguments of tool call {name!r} must be a dict (JSON object), got "
            f"{type(arguments).__name__} {arguments!r:.80}"
        )
    return check_json_value(arguments, "arguments")


@dataclass
class TokenLogprob:
    """Log-probability of one generated token plus the top-k alternatives at that step.

    ``logprob`` is the log-softmax of the raw (untempered) logits at the chosen token;
    ``top_logprobs`` maps the decoded text of each of the k most likely tokens to its log-probability.
    """

    token: int
    text: str
    logprob: float
    top_logprobs: dict[str, float] = field(default_factory=dict)
    top_tokens: list[int] = field(default_factory=list)

    @property
    def logprobs_by_token(self) -> dict[str, float]:
        """Llama Stack's name for ``top_logprobs``."""
        return self.top_logprobs


@dataclass
class Completion:
    """One completion: generated text and ids (stop token excluded) and why generation ended."""

    text: str
    tokens: list[int]
    stop_reason: StopReason
    logprobs: list[TokenLogprob] | None = None
    prompt_tokens: int = 0
    parsed: Any = None  # response_format rows: the JSON value, or the pydantic object of a model class
    format_error: str | None = None  # response_format rows whose text does not conform: why
    # True when a run store answered this row (``run=``) instead of the model; not part of equality, so a
    # re-run's results equal an uninterrupted run's
    cached: bool = field(default=False, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_llama_stack(self, plain: bool = False) -> Any:
        """This result as Llama Stack's ``CompletionResponse`` (``content``, ``stop_reason``, ``logprobs``): the
        llama-stack pydantic object when llama-stack is installed, else (or with ``plain=True``) a dict of the
        same fields.  A cancelled row's stop reason is ``out_of_tokens`` (Llama Stack has no other)."""
        fields = {
            "content": self.text,
            "stop_reason": _stack_stop(self.stop_reason),
            "logprobs": _stack_logprobs(self.logprobs),
        }
        return _stack_object("CompletionResponse", fields, plain)

    def to_pandas(self) -> Any:
        """One row per generated token (needs ``logprobs=k`` on the call): text, logprob, probability, top-k."""
        return present("frame", self)

    def _repr_html_(self) -> str:  # notebook display (rendered by workbench.notebook.display)
        return present("completion_html", self, "Completion")


@dataclass
class ToolCall:
    """A tool call written by the model; ``arguments`` is a dict of JSON-like values."""

    tool_name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str = ""

    @classmethod
    def coerce(cls, value: ToolCall | dict[str, Any]) -> ToolCall:
        """A checked ToolCall from a ToolCall or a dict (ours, OpenAI's ``{"id", "function": {"name",
        "arguments"}}``, or Llama Stack's); errors name the field."""
        if isinstance(value, ToolCall):
            name = check_tool_name(value.tool_name, "tool_name")
            args = check_arguments(value.arguments, name)
            if not isinstance(value.call_id, str):
                raise InputError(f"call_id of tool call {name!r} must be a string, got {value.call_id!r}")
            if name is value.tool_name and args is value.arguments:
                return value
            return replace(value, tool_name=name, arguments=args)
        if hasattr(value, "model_dump") and not isinstance(value, dict):  # another stack's pydantic ToolCall
            value = value.model_dump(mode="json")
        if isinstance(value, dict):
            if "function" in value:  # OpenAI style
                fn = value["function"]
                if not isinstance(fn, dict):
                    raise InputError(
                        f"'function' of an OpenAI-style tool call must be a dict with 'name' and "
                        f"'arguments', got {fn!r:.80}"
                    )
                name = check_tool_name(fn.get("name"), "function.name")
                call_id = value.get("id", "")
                args = fn.get("arguments", {})
            else:
                raw_name = value.get("tool_name", value.get("name"))
                if raw_name is None or raw_name == "":
                    raise InputError(f"tool call {value!r:.120} has no 'tool_name'; give {{'tool_name', 'arguments'}}")
                name = check_tool_name(raw_name, "tool_name")
                args = value.get("arguments", value.get("parameters", {}))
                call_id = value.get("call_id", value.get("id", ""))
            if call_id is None:
                call_id = ""
            if not isinstance(call_id, (str, int)) or isinstance(call_id, bool):
                raise InputError(f"call_id of tool call {name!r} must be a string, got {call_id!r:.80}")
            return cls(tool_name=name, arguments=check_arguments(args, name), call_id=str(call_id))
        raise InputError(f"a tool call must be a ToolCall or dict, got {type(value).__name__}")


@dataclass
class Message:
    """A chat message. ``role`` is system|user|assistant|tool (``ipython`` is accepted for tool)."""

    role: Role
    content: Any = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    call_id: str = ""
    stop_reason: StopReason | None = None
    parse_error: str | None = None

    @classmethod
    def coerce(cls, value: Message | dict[str, Any]) -> Message:
        """A checked Message from a Message or a dict with the same keys (``tool_call_id`` also accepted).

        Both forms go through the same checks (role, tool calls, call id, stop reason), so a Message object
        is trusted no more than a dict; errors name the field (the caller adds the message index).
        """
        if isinstance(value, Message):
            fields_ = {
                "role": value.role,
                "content": value.content,
                "tool_calls": value.tool_calls,
                "call_id": value.call_id,
                "stop_reason": value.stop_reason,
            }
            checked = cls._checked(fields_)
            keys = ("role", "tool_calls", "call_id", "stop_reason")
            if all(getattr(checked, k) == getattr(value, k) for k in keys):
                return value
            return replace(value, **{k: getattr(checked, k) for k in keys})
        if not isinstance(value, dict):
            raise InputError(
                f"a message must be a Message or a dict like {{'role': 'user', 'content': '...'}}, "
                f"got {type(value).__name__}"
            )
        fields_ = dict(value)
        fields_["call_id"] = value.get("call_id", value.get("tool_call_id", ""))
        return cls._checked(fields_)

    @classmethod
    def _checked(cls, value: dict[str, Any]) -> Message:
        role = value.get("role")
        if isinstance(role, enum.Enum):
            role = role.value
        if role not in ROLES:
            raise InputError(f"field 'role' is {role!r}, not one of {', '.join(ROLES)}")
        content = value.get("content", "")
        if content is None:
            content = ""
        if isinstance(content, (bool, int, float)):
            raise InputError(f"field 'content' is a {type(content).__name__}; give a string or a list of content items")
        raw_calls = value.get("tool_calls") or []
        if not isinstance(raw_calls, (list, tuple)):
            raise InputError(
                f"field 'tool_calls' must be a list of tool calls, got {type(raw_calls).__name__} {raw_calls!r:.80}"
            )
        calls = []
        for j, call in enumerate(raw_calls):
            try:
                calls.append(ToolCall.coerce(call))
            except InputError as exc:
                raise InputError(f"field 'tool_calls'[{j}]: {exc}") from None
        call_id = value.get("call_id") or ""
        if isinstance(call_id, bool) or not isinstance(call_id, (str, int)):
            raise InputError(f"field 'call_id' must be a string, got {call_id!r:.80}")
        stop = value.get("stop_reason")
        if isinstance(stop, enum.Enum):
            stop = stop.value
        if stop is not None and stop not in STOP_REASONS:
            raise InputError(f"field 'stop_reason' is {stop!r}, not one of {', '.join(STOP_REASONS)} (or None)")
        return cls(role=role, content=content, tool_calls=calls, call_id=str(call_id), stop_reason=stop)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _repr_html_(self) -> str:
        return present("messages_html", [self])


@dataclass
class ChatCompletion:
    """One chat reply: the assistant ``message`` (with parsed ``tool_calls``) and the raw ids."""

    message: Message
    tokens: list[int]
    stop_reason: StopReason
    logprobs: list[TokenLogprob] | None = None
    prompt_tokens: int = 0
    parsed: Any = None  # response_format replies: the JSON value, or the pydantic object of a model class
    format_error: str | None = None  # response_format replies whose text does not conform: why
    cached: bool = field(default=False, compare=False, repr=False)  # answered by a run store (see Completion)

    @property
    def text(self) -> str:
        return self.message.content if isinstance(self.message.content, str) else str(self.message.content)

    def to_llama_stack(self, plain: bool = False) -> Any:
        """This reply as Llama Stack's ``ChatCompletionResponse``: ``completion_message`` (assistant content,
        ``stop_reason``, ``tool_calls`` with ``call_id``, ``tool_name``, ``arguments`` and ``arguments_json``) and
        ``logprobs``; a llama-stack pydantic object when it is installed, else (or with ``plain=True``) a dict."""
        message = {
            "role": "assistant",
            "content": self.text,
            "stop_reason": _stack_stop(self.stop_reason),
            "tool_calls": [_stack_call(c) for c in self.message.tool_calls],
        }
        fields = {"completion_message": message, "logprobs": _stack_logprobs(self.logprobs)}
        return _stack_object("ChatCompletionResponse", fields, plain)

    def to_pandas(self) -> Any:
        """One row per generated token (needs ``logprobs=k`` on the call)."""
        return present("frame", self)

    def _repr_html_(self) -> str:
        return present("completion_html", self, "ChatCompletion")


@dataclass
class StreamChunk:
    """One streamed piece of a completion: the new ``text`` (may be empty) and the token behind it.

    The last chunk of a stream carries ``final``, the complete result.
    """

    token: int | None
    text: str
    final: Any = None


def llama_stack_batch(results: list[Completion] | list[ChatCompletion], plain: bool = False) -> Any:
    """A batch's results as Llama Stack's ``BatchCompletionResponse`` / ``BatchChatCompletionResponse``
    (``{"batch": [...]}``): pydantic objects when llama-stack is installed, else (or ``plain=True``) dicts.
    An empty batch is the plain ``{"batch": []}`` (both shapes agree)."""
    results = list(results)
    if not results:
        return {"batch": []}
    if all(isinstance(r, Completion) for r in results):
        name = "BatchCompletionResponse"
    elif all(isinstance(r, ChatCompletion) for r in results):
        name = "BatchChatCompletionResponse"
    else:
        kinds = sorted({type(r).__name__ for r in results})
        raise InputError(
            f"llama_stack_batch takes the list of one batch call (all Completion or all ChatCompletion), "
            f"got {', '.join(kinds)}"
        )
    return _stack_object(name, {"batch": [r.to_llama_stack(plain=True) for r in results]}, plain)


def _stack_stop(stop_reason: str) -> str:
    return "out_of_tokens" if stop_reason == "cancelled" else stop_reason


def _stack_call(call: ToolCall) -> dict[str, Any]:
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    return {
        "call_id": call.call_id,
        "tool_name": call.tool_name,
        "arguments": call.arguments,
        "arguments_json": arguments,
    }


def _stack_logprobs(logprobs: list[TokenLogprob] | None) -> list[dict[str, Any]] | None:
    """Llama Stack's ``TokenLogProbs`` per generated token: the top-k alternatives by text, with the chosen token
    always among them (the meta-reference sends only the chosen one)."""
    if logprobs is None:
        return None
    return [{"logprobs_by_token": {**lp.top_logprobs, lp.text: lp.logprob}} for lp in logprobs]


def _stack_object(name: str, fields: dict[str, Any], plain: bool) -> Any:
    """llama-stack's pydantic model ``name`` of ``fields``, or the dict when it is not installed (an optional,
    heavy dependency: imported only here)."""
    if plain:
        return fields
    try:
        from llama_stack.apis import inference
    except ImportError:
        return fields
    return getattr(inference, name).model_validate(fields)


def message_text(message: Message) -> str:
    """One transcript line in plain text (the fallback where HTML is not shown)."""
    content = message.content if isinstance(message.content, str) else str(message.content)
    calls = "".join(
        f"\n    -> {c.tool_name}({json.dumps(c.arguments, ensure_ascii=False, default=str)})"
        for c in message.tool_calls
    )
    suffix = f" (answers {message.call_id})" if message.role == "tool" and message.call_id else ""
    return f"[{message.role}]{suffix} {content}{calls}"


# Why a tool-loop transcript ended (``Transcript.stop_reason``):
TRANSCRIPT_STOP_REASONS = (
    "answered",  # the last reply made no tool call: the model's final answer
    "max_turns",  # every one of max_turns replies called tools; the transcript ends with their results
    "prompt_too_long",  # a tool result made the next prompt longer than max_seq_len
    "out_of_tokens",  # the last reply was cut by max_tokens (its text may be unfinished; a cut call is not run)
    "tool_choice_none",  # the reply called a tool although tool_choice="none": the call was not run
    "cancelled",  # engine.cancel() / Ctrl-C stopped the loop (GenerationCancelled.transcripts holds it)
)


@dataclass
class ScoredRow:
    """``engine.score`` of one sequence: for each scored token (``sequence[start:]``) its log-probability
    given every token before it and whether it was the model's greedy (argmax) choice there."""

    logprobs: list[float]
    greedy: list[bool]
    cached: bool = field(default=False, compare=False, repr=False)  # answered by a run store (see Completion)

    @property
    def logprob(self) -> float:
        """Log-probability of the whole scored span (the sum)."""
        return float(sum(self.logprobs))

    @property
    def is_greedy(self) -> bool:
        """Whether greedy decoding would have produced the whole span."""
        return all(self.greedy)


class Transcript(list):
    """A dialog (list of :class:`Message`) that displays as cards; otherwise an ordinary list.

    ``stop_reason`` says why the tool loop ended it (one of :data:`TRANSCRIPT_STOP_REASONS`, None while it
    runs or for a dialog the loop did not produce); ``generated_tokens`` counts the tokens of all its replies;
    ``cached`` is True when a run store answered it whole.
    """

    def __init__(
        self, messages: Any = (), *, stop_reason: str | None = None, generated_tokens: int = 0, cached: bool = False
    ) -> None:
        super().__init__(messages)
        self.stop_reason = stop_reason
        self.generated_tokens = generated_tokens
        self.cached = cached

    def _repr_html_(self) -> str:
        return present("transcript_html", self)

    def __repr__(self) -> str:
        body = "\n".join(message_text(Message.coerce(m)) for m in self) or "Transcript([])"
        return body + (f"\n(ended: {self.stop_reason})" if self.stop_reason else "")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def to_pandas(self) -> Any:
        return present("frame", self)
