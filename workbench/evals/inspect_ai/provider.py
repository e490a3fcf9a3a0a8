"""The ``workbench`` model provider for Inspect: Inspect's messages and tools in the model's official format.

``--model workbench/<name>`` loads ``wb.load(<name>, **model_args)`` (a checkpoints.toml entry or a folder;
``workbench/default`` is ``wb.load()``), or uses the engine passed as ``get_model(..., engine=engine)``.
Each call's dialog, with its own tool set, goes through the engine's one chat route (``batch_chat_completion``,
which renders it in the model's official format — tools as the model was trained to see them — and parses the
reply), and concurrent calls are gathered into one such call (see :mod:`.batcher`).
"""

from __future__ import annotations

import inspect
import uuid
import weakref
from pathlib import Path
from typing import Any

from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    GenerateConfig,
    Logprob,
    Logprobs,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    TopLogprob,
)
from inspect_ai.tool import ToolCall, ToolChoice, ToolFunction, ToolInfo

from workbench.engine import Engine

from ...errors import InputError
from ...session import load
from .batcher import Batcher, DialogRow

#: GenerateConfig fields the engine has no equivalent for: asking for them is an error, not silently ignored.
UNSUPPORTED_CONFIG = (
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "best_of",
    "response_schema",
    "prompt_logprobs",
)

_batchers: weakref.WeakKeyDictionary[Any, Batcher] = weakref.WeakKeyDictionary()
# wb.load's keyword settings (its **unknown catch-all excepted), checked before anything is loaded
_LOAD_SETTINGS = {n for n, p in inspect.signature(load).parameters.items() if p.kind is p.KEYWORD_ONLY}


class InspectInputError(InputError):
    """Inspect asked the workbench provider for something the engine cannot do."""


class WorkbenchAPI(ModelAPI):
    """Inspect ``ModelAPI`` over a workbench engine.

    model_args: ``engine`` (an Engine to use instead of loading one), ``batch_window`` (seconds a call waits
    for others to join its batch; default 0.05), ``tool_prompt_format`` (``"json"``, ``"function_tag"`` or
    ``"python_list"``; default the model's own), and anything ``wb.load`` takes (``model``, ``max_batch_size``,
    ``max_seq_len``, ``quantization``, ``device``, ``model_parallel_size``...).
    """

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig | None = None,
        *,
        engine: Engine | None = None,
        batch_window: float = 0.05,
        tool_prompt_format: str | None = None,
        **load_kwargs: Any,
    ) -> None:
        super().__init__(model_name=model_name, base_url=base_url, api_key=api_key, config=config or GenerateConfig())
        if engine is not None and load_kwargs:
            raise InspectInputError(
                f"got engine= and load settings {sorted(load_kwargs)}; give one or the other "
                "(the settings are for loading an engine)"
            )
        unknown = sorted(set(load_kwargs) - _LOAD_SETTINGS)
        if unknown:
            settings = ", ".join(sorted(_LOAD_SETTINGS))
            raise InspectInputError(
                f"unknown model arg {unknown[0]!r} for the workbench provider; it takes engine, "
                f"batch_window, tool_prompt_format and wb.load's {settings}"
            )
        if isinstance(batch_window, bool) or not isinstance(batch_window, (int, float)) or batch_window < 0:
            raise InspectInputError(f"batch_window must be a number of seconds >= 0, got {batch_window!r}")
        self.batch_window = float(batch_window)
        self.tool_prompt_format = tool_prompt_format
        self._engine = engine
        self._load_kwargs = load_kwargs

    @property
    def engine(self) -> Any:
        """The engine, loaded at first use: Inspect also builds throwaway providers (to look a model's name up in
        its model-info database) which must not load weights, or unload the notebook's engine."""
        if self._engine is None:
            name = self.model_name
            self._engine = load(None if name in ("", "default") else name, **self._load_kwargs)
        return self._engine

    @property
    def batcher(self) -> Batcher:
        """The engine's gathering queue, shared by every provider on the same engine."""
        batcher = _batchers.get(self.engine)
        if batcher is None:
            batcher = _batchers[self.engine] = Batcher(self.engine, self.batch_window)
        batcher.window = self.batch_window
        return batcher

    def max_connections(self) -> int:
        """As many concurrent samples as the engine has batch rows, so a gathered batch can fill them."""
        return int(self.engine.max_batch_size)

    def max_tokens(self) -> int | None:
        return None  # the engine's default: until end of turn or max_seq_len

    async def count_text_tokens(self, text: str) -> int:
        return len(self.engine.tokenizer.encode(text))

    async def tokenize(self, text: str) -> list[int]:
        return list(self.engine.tokenizer.encode(text))

    async def generate(
        self, input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice, config: GenerateConfig
    ) -> ModelOutput:
        sampling = {**sampling_kwargs(config), "tool_prompt_format": self.tool_prompt_format}
        tool_defs = [to_tool(t) for t in tools] or None
        choice = to_tool_choice(tool_choice) if tool_defs else "auto"
        reply = await self.batcher.submit(DialogRow(to_messages(input), tool_defs, choice), sampling)
        return self.to_output(reply)

    def to_output(self, reply: Any) -> ModelOutput:
        """A workbench ChatCompletion as Inspect's ModelOutput: tool calls, stop reason, usage, logprobs."""
        message, prompt_tokens = reply.message, reply.prompt_tokens
        calls = [
            ToolCall(id=c.call_id or f"call_{uuid.uuid4().hex[:12]}", function=c.tool_name, arguments=dict(c.arguments))
            for c in message.tool_calls
        ]
        text = message.content if isinstance(message.content, str) else reply.text
        assistant = ChatMessageAssistant(
            content=text, tool_calls=calls or None, model=self.model_name, source="generate"
        )
        if reply.stop_reason == "out_of_tokens":
            full = prompt_tokens + len(reply.tokens) >= self.engine.max_seq_len
            stop = "model_length" if full else "max_tokens"
        else:
            stop = "tool_calls" if calls else "stop"
        output_tokens = len(reply.tokens)
        metadata = {"parse_error": message.parse_error} if message.parse_error else None
        choice = ChatCompletionChoice(message=assistant, stop_reason=stop, logprobs=to_logprobs(reply.logprobs))
        return ModelOutput(
            model=self.model_name,
            choices=[choice],
            usage=ModelUsage(
                input_tokens=prompt_tokens, output_tokens=output_tokens, total_tokens=prompt_tokens + output_tokens
            ),
            metadata=metadata,
        )


def sampling_kwargs(config: GenerateConfig) -> dict[str, Any]:
    """The engine's sampling keywords for an Inspect GenerateConfig (temperature 0, greedy, when unset)."""
    asked = [name for name in UNSUPPORTED_CONFIG if getattr(config, name, None) is not None]
    if asked:
        raise InspectInputError(
            f"the workbench provider cannot honour GenerateConfig {', '.join(asked)} (the engine "
            "has no such control); remove it from the task or the command line"
        )
    if config.num_choices not in (None, 1):
        raise InspectInputError(
            f"num_choices={config.num_choices}: the workbench provider returns one choice per "
            "call; run the sample several times (epochs) with temperature > 0 instead"
        )
    out: dict[str, Any] = {"temperature": 0.0 if config.temperature is None else float(config.temperature)}
    if config.max_tokens is not None:
        out["max_tokens"] = int(config.max_tokens)
    if config.top_p is not None:
        out["top_p"] = float(config.top_p)
    if config.top_k is not None:
        out["top_k"] = int(config.top_k)
    if config.seed is not None:
        out["seed"] = int(config.seed)
    if config.stop_seqs:
        out["stop"] = list(config.stop_seqs)
    if config.logprobs or config.top_logprobs:
        out["logprobs"] = max(1, int(config.top_logprobs or 1))
    return out


def to_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Inspect's chat messages as workbench message dicts (tool results keep their call ids)."""
    out = []
    for i, m in enumerate(messages):
        content = to_content(m.content, i)
        if m.role == "assistant":
            calls = [{"tool_name": c.function, "arguments": c.arguments, "call_id": c.id} for c in (m.tool_calls or [])]
            out.append({"role": "assistant", "content": content, "tool_calls": calls})
        elif m.role == "tool":
            if not content and m.error is not None:
                content = f"Error: {m.error.message}"
            out.append({"role": "tool", "content": content, "call_id": m.tool_call_id or ""})
        else:
            out.append({"role": m.role, "content": content})
    return out


def to_content(content: Any, index: int) -> Any:
    """A message's content: a string, or a list of text and images (data URLs or file paths) for Llama 4."""
    if isinstance(content, str):
        return content
    items: list[Any] = []
    for item in content:
        kind = getattr(item, "type", None)
        if kind == "text":
            items.append(item.text)
        elif kind == "reasoning":
            continue  # a reasoning model's hidden text; Llama models have none to send back
        elif kind == "image":
            image = item.image
            if image.startswith("data:"):
                items.append(image)
            elif image.startswith(("http://", "https://")):
                raise InspectInputError(
                    f"message {index}: image {image[:60]!r} is a URL; the workbench provider "
                    "reads images from data URLs or local files"
                )
            else:
                items.append(Path(image))
        else:
            raise InspectInputError(
                f"message {index} holds {kind!r} content; the workbench provider sends text and images only"
            )
    if all(isinstance(x, str) for x in items):
        return "\n".join(items)
    return items


def to_tool(tool: ToolInfo) -> dict[str, Any]:
    """An Inspect ToolInfo as an OpenAI-style tool (its parameters are JSON Schema)."""
    fn = {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters.model_dump(exclude_none=True),
    }
    return {"type": "function", "function": fn}


def to_tool_choice(choice: ToolChoice) -> str:
    """Inspect's tool_choice in workbench's words: auto, required (Inspect's "any"), none, or a tool's name."""
    if isinstance(choice, ToolFunction):
        return choice.name
    return {"auto": "auto", "any": "required", "none": "none"}.get(choice, choice)


def to_logprobs(logprobs: Any) -> Logprobs | None:
    if not logprobs:
        return None
    return Logprobs(
        content=[
            Logprob(
                token=lp.text,
                logprob=lp.logprob,
                top_logprobs=[TopLogprob(token=t, logprob=v) for t, v in lp.top_logprobs.items()],
            )
            for lp in logprobs
        ]
    )
