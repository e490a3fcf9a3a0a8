"""Result and message dataclasses of the public API.

Plain dicts of the same shape are accepted wherever a :class:`Message` or :class:`ToolCall` is
(see :func:`Message.coerce`), so notebooks can write dialogs as JSON-like literals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .errors import InputError

# "cancelled" only appears in the partial results of a call stopped with ``engine.cancel()``.
StopReason = Literal["end_of_turn", "end_of_message", "out_of_tokens", "cancelled"]
Role = Literal["system", "user", "assistant", "tool", "ipython"]
ROLES = ("system", "user", "assistant", "tool", "ipython")


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_pandas(self) -> Any:
        """One row per generated token (needs ``logprobs=k`` on the call): text, logprob, probability, top-k."""
        from .display import to_frame

        return to_frame(self)

    def _repr_html_(self) -> str:  # notebook display (workbench.display; imported only when shown)
        from .display import completion_html

        return completion_html(self)


@dataclass
class ToolCall:
    """A tool call written by the model; ``arguments`` is a dict of JSON-like values."""

    tool_name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str = ""

    @classmethod
    def coerce(cls, value: ToolCall | dict[str, Any]) -> ToolCall:
        if isinstance(value, ToolCall):
            return value
        if isinstance(value, dict):
            if "function" in value and isinstance(value["function"], dict):  # OpenAI style
                import json

                fn = value["function"]
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    args = json.loads(args) if args.strip() else {}
                return cls(tool_name=fn["name"], arguments=args, call_id=value.get("id", ""))
            name = value.get("tool_name", value.get("name"))
            if not name:
                raise InputError(f"tool call {value!r} has no 'tool_name'; give {{'tool_name', 'arguments'}}")
            args = value.get("arguments", value.get("parameters", {})) or {}
            return cls(tool_name=str(name), arguments=dict(args), call_id=str(value.get("call_id", "")))
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
        """Accept a Message or a dict with the same keys (``tool_call_id`` also accepted)."""
        if isinstance(value, Message):
            return value
        if not isinstance(value, dict):
            raise InputError(
                f"a message must be a Message or a dict like {{'role': 'user', 'content': '...'}}, "
                f"got {type(value).__name__}"
            )
        role = value.get("role")
        if role not in ROLES:
            raise InputError(f"message role {role!r} is not one of {', '.join(ROLES)}")
        content = value.get("content", "")
        if content is None:
            content = ""
        calls = [ToolCall.coerce(c) for c in (value.get("tool_calls") or [])]
        return cls(
            role=role,
            content=content,
            tool_calls=calls,
            call_id=str(value.get("call_id", value.get("tool_call_id", "")) or ""),
            stop_reason=value.get("stop_reason"),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _repr_html_(self) -> str:
        from .display import messages_html

        return messages_html([self])


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

    @property
    def text(self) -> str:
        return self.message.content if isinstance(self.message.content, str) else str(self.message.content)

    def to_pandas(self) -> Any:
        """One row per generated token (needs ``logprobs=k`` on the call)."""
        from .display import to_frame

        return to_frame(self)

    def _repr_html_(self) -> str:
        from .display import completion_html

        return completion_html(self, "ChatCompletion")


@dataclass
class StreamChunk:
    """One streamed piece of a completion: the new ``text`` (may be empty) and the token behind it.

    The last chunk of a stream carries ``final``, the complete result.
    """

    token: int | None
    text: str
    final: Any = None
