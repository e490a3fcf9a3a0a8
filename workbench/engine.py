"""The Engine: the batch APIs over one loaded model (a thin façade, nano-vllm style).

The engine validates and encodes requests, hands them to a *runner* (the in-process
:class:`~workbench.generation.generator.Generator`, or the model-parallel worker pool) and turns
the runner's token events into result dataclasses.  It holds no per-request state between calls,
which is what makes it safe to interrupt.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .errors import InputError, PromptTooLongError
from .generation.generator import Event, Request
from .generation.sampling import SamplingParams
from .models.args import ModelArgs
from .tokenizer import Tokenizer
from .types import Completion, StreamChunk, TokenLogprob

Content = str | Sequence[int]


class Engine:
    """A loaded model with batch completion, chat and scoring APIs.  Build it with ``workbench.load``."""

    def __init__(self, *, runner: Any, tokenizer: Tokenizer, args: ModelArgs, settings: Any,
                 model_id: str | None, load_seconds: float = 0.0) -> None:  # fmt: skip
        self._runner = runner
        self.tokenizer = tokenizer
        self.args = args
        self.settings = settings
        self.model_id = model_id
        self.family = args.family
        self.load_seconds = load_seconds
        self._formatter = None

    # ----------------------------------------------------------------------------- properties
    @property
    def max_seq_len(self) -> int:
        return self.settings.max_seq_len

    @property
    def max_batch_size(self) -> int:
        return self.settings.max_batch_size

    @property
    def formatter(self) -> Any:
        """Chat-prompt renderer and reply parser for this model's prompt format."""
        if self._formatter is None:
            from .formats import make_formatter

            self._formatter = make_formatter(self.tokenizer, self.model_id, vision_args=self.args.vision_args)
        return self._formatter

    # ----------------------------------------------------------------------------- completions
    def completion(self, content: Content, **sampling: Any) -> Completion:
        """Complete one prompt (a string, encoded with BOS, or a list of token ids used as given)."""
        return self.batch_completion([content], **sampling)[0]

    def batch_completion(self, contents: Sequence[Content], **sampling: Any) -> list[Completion]:
        """Complete many prompts at once; each row's result equals running that prompt alone (greedy)."""
        if isinstance(contents, str):
            raise InputError("batch_completion takes a list of prompts; for one string use completion()")
        params = SamplingParams.create(**sampling)
        prompts = [self._encode_content(c, i) for i, c in enumerate(contents)]
        return self.generate_tokens(prompts, params)

    def generate_tokens(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Run already-encoded prompts (validated here) and collect one Completion per prompt."""
        if not prompts:
            return []
        self._check_lengths(prompts)
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[TokenLogprob]] = [[] for _ in prompts]
        finals: list[Event | None] = [None] * len(prompts)
        requests = [Request(i, p, params) for i, p in enumerate(prompts)]
        for event in self._runner.generate(requests):
            if event.token is not None:
                tokens[event.index].append(event.token)
                if event.logprob is not None:
                    logprobs[event.index].append(event.logprob)
            if event.stop_reason is not None:
                finals[event.index] = event
        return [self._completion(t, lp, f, params, len(p)) for t, lp, f, p in zip(tokens, logprobs, finals, prompts)]

    def stream_completion(self, content: Content, **sampling: Any) -> Iterator[StreamChunk]:
        """Yield text deltas of one completion as tokens arrive; the last chunk carries ``final``."""
        params = SamplingParams.create(**sampling)
        prompt = self._encode_content(content, 0)
        self._check_lengths([prompt])
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        decoded, text, emitted = 0, "", 0  # tokens decoded into `text`; characters of `text` yielded
        for event in self._runner.generate([Request(0, prompt, params)]):
            if event.token is not None:
                tokens.append(event.token)
                if event.logprob is not None:
                    logprobs.append(event.logprob)
            if event.stop_reason is not None:
                final = self._completion(tokens, logprobs, event, params, len(prompt))
                yield StreamChunk(token=event.token, text=final.text[emitted:], final=final)
                return
            piece = self.tokenizer.decode(tokens[decoded:])  # only the new tokens: no re-decoding per step
            if piece.endswith("\ufffd"):  # hold back a half-decoded UTF-8 character
                continue
            text, decoded = text + piece, len(tokens)
            safe = len(text) - _stop_prefix_overlap(text, params.stop)  # never leak the start of a stop string
            delta, emitted = text[emitted:safe], max(emitted, safe)
            yield StreamChunk(token=event.token, text=delta)

    def _completion(self, tokens: list[int], logprobs: list[TokenLogprob], final: Event | None,
                    params: SamplingParams, prompt_len: int) -> Completion:  # fmt: skip
        assert final is not None and final.stop_reason is not None, "runner ended a request without a stop event"
        text = self.tokenizer.decode(tokens)
        if final.truncate_text_at is not None:
            text = text[: final.truncate_text_at]
        return Completion(
            text=text,
            tokens=list(tokens),
            stop_reason=final.stop_reason,
            logprobs=logprobs[: len(tokens)] if params.logprobs else None,
            prompt_tokens=prompt_len,
        )

    # ----------------------------------------------------------------------------- chat
    def chat_completion(self, messages: Sequence[Any], tools: Sequence[Any] | None = None,
                        tool_choice: str = "auto", tool_prompt_format: str | None = None, stream: bool = False,
                        **sampling: Any) -> Any:  # fmt: skip
        """One chat reply in the model's official prompt format; ``message.tool_calls`` holds parsed calls."""
        from . import chat

        return chat.chat_completion(self, messages, tools=tools, tool_choice=tool_choice,
                                    tool_prompt_format=tool_prompt_format, stream=stream, **sampling)  # fmt: skip

    def batch_chat_completion(self, dialogs: Sequence[Sequence[Any]], tools: Sequence[Any] | None = None,
                              tool_choice: str = "auto", tool_prompt_format: str | None = None,
                              **sampling: Any) -> list[Any]:  # fmt: skip
        """Many chat replies in one batch (per-row results equal single calls, greedy)."""
        from . import chat

        return chat.batch_chat_completion(self, dialogs, tools=tools, tool_choice=tool_choice,
                                          tool_prompt_format=tool_prompt_format, **sampling)  # fmt: skip

    # ----------------------------------------------------------------------------- scoring
    def logits(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Teacher-forced float32 logits ``[len, vocab]`` for each token list (likelihood evaluation)."""
        if isinstance(token_lists, (str, torch.Tensor)) or (token_lists and isinstance(token_lists[0], int)):
            raise InputError("logits() takes a list of token-id lists, e.g. engine.logits([[128000, 791, 6864]])")
        prompts = [self._check_ids(list(t), i) for i, t in enumerate(token_lists)]
        if not prompts:
            return []
        too_long = [(i, len(p)) for i, p in enumerate(prompts) if len(p) > self.max_seq_len]
        if too_long:
            i, n = too_long[0]
            raise PromptTooLongError(
                f"row {i} has {n} tokens but max_seq_len is {self.max_seq_len}; shorten it or load with a larger "
                "max_seq_len"
            )
        return self._runner.logits(prompts)

    # ----------------------------------------------------------------------------- validation
    def _encode_content(self, content: Content, row: int) -> list[int]:
        if isinstance(content, str):
            return self.tokenizer.encode(content, bos=True)
        if isinstance(content, torch.Tensor):
            content = content.tolist()
        if isinstance(content, (list, tuple)):
            return self._check_ids(list(content), row)
        raise InputError(
            f"prompt row {row} is a {type(content).__name__}; give a string or a list of token ids"
        )

    def _check_ids(self, ids: list[Any], row: int) -> list[int]:
        vocab = self.args.vocab_size
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise InputError(
                    f"prompt row {row} holds {t!r}, which is not a token id in 0..{vocab - 1}; "
                    "pass token ids from engine.tokenizer.encode()"
                )
        return ids

    def _check_lengths(self, prompts: list[list[int]]) -> None:
        for i, p in enumerate(prompts):
            if not p:
                raise InputError(f"prompt row {i} is empty; give at least one token (strings get a BOS token)")
            if len(p) >= self.max_seq_len:
                raise PromptTooLongError(
                    f"prompt row {i} has {len(p)} tokens but max_seq_len is {self.max_seq_len} (room is needed "
                    f"for at least one generated token); shorten the prompt or load with max_seq_len > {len(p)}"
                )

    # ----------------------------------------------------------------------------- quantization
    def set_quantization(self, mode: str | None) -> None:
        """Re-load the weights from the checkpoint under another quantization mode (None | "bf16" |
        "fp8_mixed" | "int4_mixed").  The old model is freed first, so only one copy is resident.

        The mode is checked against the device *before* anything is freed: a bad mode raises
        QuantizationError and leaves the current model loaded.
        """
        from .quantization import check_supported

        mode = check_supported(mode, self.settings.device)
        settings = self.settings.with_quantization(mode)
        if settings == self.settings:
            return
        self._runner.reload(settings)
        self.settings = settings

    # ----------------------------------------------------------------------------- introspection
    def info(self) -> dict[str, Any]:
        """Model id, family, sizes, dtype, device, parallelism, quantization and memory, as a dict."""
        memory = self._runner.memory()
        return {
            "model_id": self.model_id,
            "family": self.family,
            "checkpoint": str(self.settings.checkpoint_dir),
            "parameters": self._runner.parameter_count(),
            "dtype": self._compute_dtype(),
            "device": str(self.settings.device),
            "model_parallel_size": self.settings.model_parallel_size,
            "quantization": self.settings.quantization,
            "max_batch_size": self.max_batch_size,
            "max_seq_len": self.max_seq_len,
            "weights_bytes": memory["weights_bytes"],
            "kv_cache_bytes": memory["kv_cache_bytes"],
            "load_seconds": round(self.load_seconds, 2),
        }

    def _compute_dtype(self) -> str:
        """bf16 mode runs the whole model in bfloat16, whatever dtype was asked for at load."""
        dtype = torch.bfloat16 if self.settings.quantization == "bf16" else self.settings.dtype
        return str(dtype).replace("torch.", "")

    def memory(self) -> dict[str, Any]:
        """Bytes of parameters (by dtype and by module kind) and of the KV cache."""
        return self._runner.memory()

    def __repr__(self) -> str:
        if self.closed:
            return f"Engine(model={self.model_id!r}, family={self.family}, unloaded)"
        i = self.info()
        return (
            f"Engine(model={i['model_id']!r}, family={i['family']}, params={i['parameters'] / 1e6:.1f}M, "
            f"dtype={i['dtype']}, device={i['device']}, mp={i['model_parallel_size']}, "
            f"quantization={i['quantization']}, weights={_fmt_bytes(i['weights_bytes'])}, "
            f"kv_cache={_fmt_bytes(i['kv_cache_bytes'])})"
        )

    @property
    def closed(self) -> bool:
        """True after :meth:`close` (or ``workbench.unload()``)."""
        return isinstance(self._runner, _ClosedRunner)

    def close(self) -> None:
        """Free the model, cache and any worker processes (the engine is unusable afterwards)."""
        runner, self._runner = self._runner, _ClosedRunner()
        if hasattr(runner, "close"):
            runner.close()


class _ClosedRunner:
    def __getattr__(self, name: str) -> Any:
        from .errors import WorkbenchError

        raise WorkbenchError("this engine was unloaded; call workbench.load(...) again")


def _stop_prefix_overlap(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that could still grow into one of ``stops``."""
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])),
               default=0)  # fmt: skip


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f}{unit}" if unit != "B" else f"{n}B"
        n /= 1024
    return f"{n}B"
