"""Llama Stack's inference spellings, translated to the native keywords in one place.

Why: the batch APIs came from Llama Stack (``batch_chat_completion(model_id, messages_batch, sampling_params,
tools, tool_config, response_format, logprobs)``), and code written against it — an eval, a snippet from its
docs — should run unchanged.  Every completion and chat method of the engine, and the tool loop, is wrapped
by :func:`llama_stack_spellings`: it takes Llama Stack's keywords out of the call, maps them to the native
ones (:func:`to_native`) and calls the method with native keywords only, so each method keeps its own
readable signature (Shift+Tab shows it through ``__wrapped__``).

The spellings: ``sampling_params`` (a dict or llama-stack's pydantic ``SamplingParams``: ``strategy``
greedy / top_p / top_k, ``max_tokens`` (0 = no limit), ``stop``, ``repetition_penalty``),
``tool_config`` (``tool_choice``, ``tool_prompt_format``, ``system_message_behavior``),
``logprobs={"top_k": k}``, ``content_batch=`` / ``messages_batch=`` and ``model_id=`` (checked against the
loaded model).  A native keyword given explicitly beside a Llama Stack spelling must agree with it, or the
call raises :class:`SpellingConflictError` before anything runs.  Llama Stack's content items, messages,
tool definitions and enums are accepted as they are.
"""

from __future__ import annotations

import enum
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar

from workbench.engine.docs import public_signature, take_sampling
from workbench.engine.interfaces import ModelIdentity
from workbench.errors import InputError, SamplingError
from workbench.runtime.settings import default_model_name

F = TypeVar("F", bound=Callable[..., Any])

SAMPLING_FIELDS = ("strategy", "max_tokens", "repetition_penalty", "stop")
TOOL_CONFIG_FIELDS = ("tool_choice", "tool_prompt_format", "system_message_behavior")
STRATEGIES = ("greedy", "top_p", "top_k")

LLAMA_STACK_DOC = """
        Llama Stack's spellings are accepted too (code written for its inference API runs unchanged):
            ``sampling_params`` (dict or ``SamplingParams``: strategy greedy / top_p / top_k, max_tokens, stop,
            repetition_penalty),
            ``logprobs={"top_k": k}``, ``model_id`` (must name the loaded model){extra}.
            A native keyword given beside its Llama Stack spelling must agree with it (else SpellingConflictError).
"""


class SpellingConflictError(InputError):
    """A native keyword and its Llama Stack spelling were both given and disagree (e.g. ``temperature=0.7``
    with ``sampling_params={"strategy": {"type": "greedy"}}``)."""


class ModelMismatchError(InputError):
    """``model_id=`` names another model than the one loaded."""


# ---------------------------------------------------------------------------------------------- the decorator
def llama_stack_spellings(
    *, batch: tuple[str, str] | None = None, chat: bool = False, content: str | None = None
) -> Callable[[F], F]:
    """Wrap an engine method (or a tool-loop function whose first argument is the engine) so that it also
    accepts Llama Stack's keywords; the method itself only ever sees native keywords.  A method with a
    ``sampling`` parameter shows every sampling keyword in its signature and gets them resolved into one
    SamplingParams (:func:`~.docs.take_sampling`) in this same frame.

    batch: ``(native_name, llama_stack_name)`` of the list argument (``("contents", "content_batch")``).
    chat: the method takes ``tool_config`` (tool choice, call syntax, system-message behaviour).
    content: the native name of a completion prompt argument whose Llama Stack content items (pydantic
        ``TextContentItem`` / ``ImageContentItem`` or their dicts) become native content.
    """
    accepted = {"sampling_params", "model_id"} | ({"tool_config"} if chat else set()) | ({batch[1]} if batch else set())

    def decorate(method: F) -> F:
        signature = inspect.signature(method)
        # a `sampling=` parameter (not a **sampling catch-all): its keywords come from SamplingParams
        takes_sampling = getattr(signature.parameters.get("sampling"), "kind", None) is inspect.Parameter.KEYWORD_ONLY
        if takes_sampling:
            signature = public_signature(signature, method.__name__)
        var_keyword = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            extra = {name: kwargs.pop(name) for name in list(kwargs) if name in accepted}
            bound = signature.bind_partial(*args, **kwargs)
            given = dict(bound.arguments)  # only what the caller wrote: defaults are not "given"
            if var_keyword is not None:
                given.update(given.pop(var_keyword, {}))
            engine = next(iter(given.values()))  # `self`, or the tool loop's engine
            if batch is not None and batch[1] in extra:
                _merge(given, batch[0], extra.pop(batch[1]), batch[1])
            given = to_native(engine, given, extra, content=content)
            if takes_sampling:
                take_sampling(given, method.__name__)
            return method(**given)

        wrapper.__doc__ = (method.__doc__ or "").rstrip() + "\n" + _doc(batch, chat)
        wrapper.__signature__ = signature  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def _doc(batch: tuple[str, str] | None, chat: bool) -> str:
    extra = ""
    if chat:
        extra += ",\n            ``tool_config`` (tool_choice, tool_prompt_format, system_message_behavior)"
    if batch:
        extra += f",\n            ``{batch[1]}=`` (the same as ``{batch[0]}``)"
    return LLAMA_STACK_DOC.replace("{extra}", extra)


# ---------------------------------------------------------------------------------------------- translation
def to_native(
    engine: ModelIdentity, given: dict[str, Any], extra: dict[str, Any], *, content: str | None = None
) -> dict[str, Any]:
    """The native keywords of a call: ``given`` (the native keywords the caller wrote) with Llama Stack's
    ``extra`` keywords (``sampling_params``, ``tool_config``, ``model_id``) mapped in, ``logprobs`` configs
    turned into k, and Llama Stack content items (for the ``content`` argument) into native content.

    Raises :class:`SpellingConflictError` when a native keyword disagrees with its Llama Stack spelling,
    :class:`ModelMismatchError` for a ``model_id`` of another model, SamplingError / InputError for values
    Llama Stack itself would refuse (each naming the field and the fix)."""
    out = dict(given)
    if "model_id" in extra:
        check_model_id(engine, extra["model_id"])
    if extra.get("sampling_params") is not None:
        for name, value in sampling_to_native(extra["sampling_params"], out).items():
            _merge(out, name, value, f"sampling_params ({_describe(extra['sampling_params'])})")
    if extra.get("tool_config") is not None:
        for name, value in tool_config_to_native(extra["tool_config"]).items():
            _merge(out, name, value, f"tool_config ({_describe(extra['tool_config'])})")
    if "logprobs" in out and not _is_int(out["logprobs"]):
        out["logprobs"] = logprobs_to_native(out["logprobs"])
    if content is not None and content in out:
        value = out[content]
        out[content] = (
            [content_to_native(v) for v in value]
            if content == "contents" and _is_list(value)
            else content_to_native(value)
        )
    return out


def _merge(out: dict[str, Any], name: str, value: Any, source: str) -> None:
    """Set ``out[name]`` from a Llama Stack spelling unless the caller gave a different native value."""
    if name in out and not _same(out[name], value):
        raise SpellingConflictError(
            f"{name}={_short(out[name])} disagrees with {source}, which means {name}={_short(value)}; give one of "
            f"them (or the same value in both)"
        )
    out[name] = value


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    a, b = _plain(a), _plain(b)
    if isinstance(a, tuple):
        a = list(a)
    if isinstance(b, tuple):
        b = list(b)
    if isinstance(a, str) and isinstance(b, list) and len(b) == 1:  # stop="x" is stop=["x"]
        a = [a]
    if isinstance(b, str) and isinstance(a, list) and len(a) == 1:
        b = [b]
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values (tensors...) are different values
        return False


def _plain(value: Any) -> Any:
    """Enums as their values, pydantic objects as dicts: how a spelling and its native twin compare."""
    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "model_dump") and not isinstance(value, type):
        return value.model_dump(mode="json")
    return value


def _short(value: Any) -> str:
    text = repr(_plain(value))
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(value: Any) -> str:
    return _short(_fields(value, "value"))


def _fields(value: Any, what: str) -> dict[str, Any]:
    """A Llama Stack object's fields as a dict: a dict as it is, a pydantic object's explicitly set fields."""
    if isinstance(value, dict):
        return dict(value)
    if hasattr(value, "model_dump") and hasattr(value, "model_fields_set"):
        dumped = value.model_dump(mode="json")
        return {k: dumped[k] for k in value.model_fields_set if k in dumped}
    raise InputError(
        f"{what} must be a dict or a llama-stack pydantic object, got {type(value).__name__} {value!r:.80}"
    )


def sampling_to_native(params: Any, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """Native sampling keywords of a Llama Stack ``SamplingParams`` (dict or pydantic), as the meta-reference
    provider reads them: greedy is temperature 0; top_p takes ``temperature or 1.0`` and ``top_p or 1.0``;
    top_k samples among the k most likely tokens at temperature 1 (or the native ``temperature`` given
    beside it); ``max_tokens`` 0 or None means no limit; ``repetition_penalty`` is the native keyword of the
    same name (transformers' definition: llama-models' reference generator has none to match)."""
    given = given or {}
    fields = _fields(params, "sampling_params")
    unknown = sorted(set(fields) - set(SAMPLING_FIELDS))
    if unknown:
        raise InputError(
            f"sampling_params has no field {unknown[0]!r}; Llama Stack's SamplingParams has "
            f"{', '.join(SAMPLING_FIELDS)}"
        )
    out: dict[str, Any] = {}
    if fields.get("strategy") is not None:
        out.update(_strategy(fields["strategy"], given))
    if "max_tokens" in fields:
        n = fields["max_tokens"]
        if n is not None and (not _is_int(n) or n < 0):
            raise SamplingError(f"sampling_params.max_tokens must be an integer >= 0 (0 = no limit), got {n!r}")
        out["max_tokens"] = n or None
    if fields.get("repetition_penalty") is not None:
        out["repetition_penalty"] = fields["repetition_penalty"]
    if fields.get("stop") is not None:
        stop = fields["stop"]
        if isinstance(stop, str) or not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise SamplingError(f"sampling_params.stop must be a list of strings, got {stop!r:.80}")
        out["stop"] = list(stop)
    return out


def _strategy(strategy: Any, given: dict[str, Any]) -> dict[str, Any]:
    fields = _plain(strategy)  # a pydantic strategy with all its fields: its type is a default, never "set"
    if not isinstance(fields, dict):
        raise SamplingError(
            f"sampling_params.strategy must be a dict like {{'type': 'top_p', 'temperature': 0.7, "
            f"'top_p': 0.9}}, got {strategy!r:.80}"
        )
    kind = _plain(fields.get("type", "greedy"))
    if kind == "greedy":
        return {"temperature": 0.0}
    if kind == "top_p":
        temperature, top_p = fields.get("temperature"), fields.get("top_p", 0.95)
        if temperature is not None and (not _is_number(temperature) or temperature <= 0):
            raise SamplingError(
                f"sampling_params.strategy.temperature must be > 0 for top_p sampling, got "
                f"{temperature!r}; use strategy {{'type': 'greedy'}} for temperature 0"
            )
        return {"temperature": temperature or 1.0, "top_p": top_p or 1.0}
    if kind == "top_k":
        k = fields.get("top_k")
        if not _is_int(k) or k < 1:
            raise SamplingError(f"sampling_params.strategy.top_k must be an integer >= 1, got {k!r}")
        temperature = given.get("temperature", 1.0)  # Llama Stack's top_k has no temperature: 1 unless given
        return {"top_k": k, "temperature": temperature if temperature else 1.0}
    raise SamplingError(f"sampling_params.strategy.type must be one of {', '.join(STRATEGIES)}, got {kind!r}")


def tool_config_to_native(config: Any) -> dict[str, Any]:
    """Native ``tool_choice``, ``tool_prompt_format`` and ``system_message_behavior`` of a Llama Stack
    ``ToolConfig`` (dict or pydantic; enums become their values)."""
    fields = _fields(config, "tool_config")
    unknown = sorted(set(fields) - set(TOOL_CONFIG_FIELDS))
    if unknown:
        raise InputError(
            f"tool_config has no field {unknown[0]!r}; Llama Stack's ToolConfig has {', '.join(TOOL_CONFIG_FIELDS)}"
        )
    out = {name: _plain(value) for name, value in fields.items() if value is not None}
    behavior = out.get("system_message_behavior")
    if behavior is not None and behavior not in ("append", "replace"):
        raise InputError(f"tool_config.system_message_behavior must be 'append' or 'replace', got {behavior!r}")
    return out


def logprobs_to_native(config: Any) -> int:
    """k of a Llama Stack ``LogProbConfig`` (``{"top_k": k}`` or pydantic); a config without k asks for the
    chosen token's log-probability, which k = 1 records."""
    if config is None or config is False:
        return 0
    if config is True:
        return 1
    fields = _fields(config, "logprobs")
    unknown = sorted(set(fields) - {"top_k"})
    if unknown:
        raise InputError(f"logprobs has no field {unknown[0]!r}; give an integer k or {{'top_k': k}}")
    k = fields.get("top_k")
    if k is None or k == 0:
        return 1
    if not _is_int(k) or k < 0:
        raise SamplingError(f"logprobs.top_k must be an integer >= 0, got {k!r}")
    return k


def content_to_native(content: Any) -> Any:
    """A completion prompt with Llama Stack content items made native: a text item becomes its string, a
    list keeps its order with text items as strings (image items stay: the engine reads them as they are).
    Strings, token-id lists and ``Prompt`` objects pass through untouched."""
    if isinstance(content, str) or content is None:
        return content
    if _text_item(content) is not None:
        return _text_item(content)
    if _is_list(content):
        if not content or _is_int(content[0]):
            return content
        if any(_text_item(c) is not None for c in content):
            return [_text_item(c) if _text_item(c) is not None else c for c in content]
        return content
    if getattr(content, "type", None) is not None or isinstance(content, dict):  # one image item
        return [content]
    return content


def _text_item(item: Any) -> str | None:
    if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
        return item["text"]
    text = getattr(item, "text", None)
    if not isinstance(item, dict) and getattr(item, "type", None) == "text" and isinstance(text, str):
        return text
    return None


# ---------------------------------------------------------------------------------------------- model ids
def _key(name: str) -> str:
    """A model name compared loosely: the last path part, lower case, letters and digits only
    (``meta-llama/Llama-3.2-3B-Instruct`` and ``Llama3.2-3B-Instruct`` are the same model)."""
    return re.sub(r"[^a-z0-9]", "", name.strip().split("/")[-1].lower())


def loaded_model_ids(engine: ModelIdentity) -> list[str]:
    """The names a ``model_id`` may give for this engine: its model id, else its checkpoint folder (and the
    embedded default's name)."""
    names = [str(engine.model_id)] if getattr(engine, "model_id", None) else []
    if not names:
        settings = getattr(engine, "settings", None)
        folder = getattr(getattr(settings, "checkpoint_dir", None), "name", None)
        names = [n for n in (folder, getattr(engine, "family", None), default_model_name(settings)) if n]
    return names


def check_model_id(engine: ModelIdentity, model_id: Any) -> None:
    """Refuse a ``model_id`` of another model (Llama Stack routes by it; here one model is loaded)."""
    if model_id is None:
        return
    if not isinstance(model_id, str) or not model_id.strip():
        raise InputError(f"model_id must be a non-empty string naming the loaded model, got {model_id!r}")
    names = loaded_model_ids(engine)
    if _key(model_id) not in {_key(n) for n in names}:
        raise ModelMismatchError(
            f"model_id={model_id!r} is not the loaded model ({names[0]!r}); pass model_id={names[0]!r} (or leave it "
            f"out), or load that model with workbench.load(..., model={model_id!r})"
        )


# ---------------------------------------------------------------------------------------------- small checks
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple))
