"""``WorkbenchLM``: lm-evaluation-harness's model interface over a workbench engine.

Why a model of our own rather than lm-eval's ``hf`` model: the engine runs Meta's native checkpoints
directly, in the model's official chat format, batched with continuous batching and shared-prefix reuse;
and its numbers are the reference model's (``tests/test_lm_eval.py`` holds them to llama-models 0.3.0).

What lm-eval's own machinery does here, unchanged: the context/continuation split (``TemplateLM``: the
pair is encoded whole and split, trailing spaces move to the continuation), request ordering and
regrouping (``Collator``), rolling windows (``get_rolling_token_windows`` / ``make_disjoint_window``),
generation keyword normalisation (``normalize_gen_kwargs``) and stop-string cutting
(``postprocess_generated_text``), and progress bars (tqdm, with lm-eval's labels).

What is ours: every scored sequence starts with exactly one BOS (Meta's encoding; lm-eval's ``hf`` model
adds none to non-empty contexts of Llama 3 tokenizers unless ``add_bos_token=True``); each rolling window
is scored as its own sequence starting with BOS, so windows hold ``max_seq_len - 1`` document tokens;
requests that do not fit ``max_seq_len`` raise instead of being cut from the left; and the chat-template
hooks render through the engine's formatter (the official format), whose special tokens survive the round
trip through lm-eval's strings because only the exact rendered prompts are parsed for them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lm_eval.api.instance import Instance
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import Collator, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

import workbench as wb
from workbench import runs
from workbench.errors import InputError, PromptTooLongError

# What a special token's text looks like (every Llama 3 / Llama 4 special token: <|eot_id|>, <|header_end|>...).
SPECIAL_TOKEN_TEXT = re.compile(r"<\|[A-Za-z0-9_]+\|>")
# lm-eval generation keywords the engine honours (after normalize_gen_kwargs); anything else is refused.
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_p", "top_k", "seed")


class TaskOptionError(InputError):
    """A task asks for something the workbench model cannot do (an unknown generation option, an empty
    continuation)."""


class RequestTooLongError(PromptTooLongError):
    """An lm-eval request does not fit the engine's ``max_seq_len`` (workbench never cuts it silently)."""


def parse_batch_size(batch_size: int | str | None) -> int | None:
    """lm-eval's ``batch_size`` (an int, a digit string, ``"auto"``/``"auto:N"`` or None) -> requests per
    engine call, or None for the engine's own choice (its ``max_batch_size`` waves)."""
    if batch_size is None or (isinstance(batch_size, str) and batch_size.startswith("auto")):
        return None
    if isinstance(batch_size, str) and batch_size.strip().isdigit():
        batch_size = int(batch_size)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer or 'auto', got {batch_size!r}")
    return batch_size


class WorkbenchLM(TemplateLM):
    """An ``lm_eval.api.model.LM`` that runs a workbench engine.

    ``WorkbenchLM(engine)`` wraps a loaded engine; ``WorkbenchLM(checkpoint=..., model=...,
    max_batch_size=32)`` (what ``--model workbench --model_args checkpoint=...,model=...`` builds) loads one
    through :func:`workbench.load`, so the usual settings, checkpoints.toml names and environment
    variables apply.  ``batch_size`` is how many requests go to the engine per call (None/"auto": the
    engine decides — generation takes every request of one setting at once and runs them in
    ``max_batch_size`` waves, scoring takes ``max_batch_size`` rows per call).  ``max_gen_toks`` is the
    default generation budget when a task sets none (lm-eval's 256).  ``tools``: tools every chat-template
    prompt offers (what ``chat_completion(..., tools=...)`` renders): a model trained to answer with tool calls
    can only call a tool its prompt offers, so tasks about tool calls need them there.  ``run``: a run-store name
    (``--model_args ...,run=name``): every scored sequence (kind ``score``) and every generation is remembered in
    the run store, so evaluating again — another metric, after a crash, more tasks sharing requests — answers
    from there (``rows_from_store`` and ``rows_computed`` count both); ``refresh=True`` recomputes.
    """

    def __init__(
        self,
        engine: wb.Engine | None = None,
        *,
        batch_size: int | str | None = None,
        max_gen_toks: int = 256,
        tools: Sequence[Any] | None = None,
        run: str | None = None,
        refresh: bool | str = False,
        **load_kwargs: Any,
    ) -> None:
        super().__init__()
        if load_kwargs.get("device") == "auto":  # lm-eval's --device, left to workbench (see __main__)
            del load_kwargs["device"]
        if engine is None:
            engine = wb.load(**load_kwargs)
        elif load_kwargs:
            raise InputError(
                f"WorkbenchLM got an engine and load settings ({', '.join(sorted(load_kwargs))}); pass either a "
                "loaded engine or the settings to load one with, not both"
            )
        if not isinstance(engine, wb.Engine):
            raise InputError(f"WorkbenchLM takes a workbench Engine (wb.load(...)), got {type(engine).__name__}")
        if isinstance(max_gen_toks, bool) or not isinstance(max_gen_toks, int) or max_gen_toks < 1:
            raise InputError(f"max_gen_toks must be a positive integer, got {max_gen_toks!r}")
        self.engine = engine
        self.batch_size = parse_batch_size(batch_size)
        self.max_gen_toks = max_gen_toks
        self.tools = list(tools) if tools else None
        if isinstance(refresh, str):  # from --model_args text
            refresh = refresh.strip().lower() in ("1", "true", "yes")
        self.stored: dict[str, Any] = runs.call_keywords(run, bool(refresh))
        self.rows_from_store = 0
        self.rows_computed = 0
        self._rank, self._world_size = 0, 1
        self._device = engine.info().get("device", "cpu")
        self._bos = engine.tokenizer.bos_id
        self._chat_prefixes: dict[str, list[int]] = {}  # rendered chat prompt, trailing whitespace cut -> ids

    # ----------------------------------------------------------------------------- tokens
    @property
    def eot_token_id(self) -> int:
        return self.engine.tokenizer.eot_id

    @property
    def prefix_token_id(self) -> int:
        """The token an empty context is replaced by: BOS (every scored sequence starts with it)."""
        return self._bos

    @property
    def max_length(self) -> int:
        return self.engine.max_seq_len

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Token ids of ``string`` without BOS (scoring adds exactly one); a string that starts with a chat
        prompt rendered by :meth:`apply_chat_template` gets that prompt's official ids, the rest is plain
        text (special-looking text anywhere else stays plain, as everywhere in workbench)."""
        prefix = self._chat_prefix(string)
        if prefix is None:
            return self.engine.tokenizer.encode(string)
        return self._chat_prefixes[prefix] + self.engine.tokenizer.encode(string[len(prefix) :])

    def tok_decode(self, tokens: Sequence[int], **kwargs: Any) -> str:
        return self.engine.tokenizer.decode(list(tokens))

    def _chat_prefix(self, string: str) -> str | None:
        """The rendered chat prompt (trailing whitespace cut) that ``string`` starts with, if any.

        Every such prompt ends with a special token's text, so only the ends of special-token matches
        are candidates (checked from the last one back; a continuation may hold special-looking text).
        """
        if not self._chat_prefixes or not string.startswith("<|begin_of_text|>"):
            return None
        for match in reversed(list(SPECIAL_TOKEN_TEXT.finditer(string))):
            candidate = string[: match.end()]
            if candidate in self._chat_prefixes:
                return candidate
        return None

    def _with_bos(self, ids: list[int]) -> list[int]:
        return ids if ids and ids[0] == self._bos else [self._bos, *ids]

    # ----------------------------------------------------------------------------- chat template
    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The dialog in the model's official chat format (``engine.formatter``), as text.

        With ``add_generation_prompt=False`` (lm-eval does this when a task has a ``gen_prefix``) the last
        message is the assistant's start: the prompt ends with the open assistant header and that text.
        """
        messages = [dict(m) for m in chat_history]
        prefill = ""
        if not add_generation_prompt and messages and messages[-1].get("role") == "assistant":
            prefill = str(messages.pop()["content"])
        ids = self.engine.formatter.encode_dialog(messages, tools=self.tools)
        text = self.engine.tokenizer.decode(ids)
        cut = text.rstrip()
        # ids of the prompt without its trailing whitespace tokens (the "\n\n" after the header)
        for k in range(len(ids)):
            if self.engine.tokenizer.decode(ids[: len(ids) - k]) == cut:
                self._chat_prefixes[cut] = list(ids[: len(ids) - k])
                break
        else:  # pragma: no cover - a header always ends with a special token
            raise InputError("the chat prompt does not end with a special token; cannot split it for lm-eval")
        return text + prefill

    @property
    def tokenizer_name(self) -> str:
        return f"workbench-{self.engine.family}-{self.engine.model_id}"

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """What lm-eval records as the template: the official format the formatter renders (no Jinja)."""
        if not chat_template:
            return None
        return f"official {self.engine.family} chat format of {self.engine.model_id} (workbench formatter)"

    # ----------------------------------------------------------------------------- scoring
    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
        disable_tqdm: bool = False,
        desc: str = "Running loglikelihood requests",
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        """Score each (key, context ids, continuation ids): log P(continuation | BOS + context), greedy flag."""
        rows: list[tuple[list[int], int]] = []
        for index, (key, context, continuation) in enumerate(requests):
            if not continuation:
                raise TaskOptionError(
                    f"request {index} ({_describe(key)}) has an empty continuation: there is nothing to score; "
                    "check the task's doc_to_target / doc_to_choice"
                )
            sequence = self._with_bos(list(context) + list(continuation))
            inputs = len(sequence) - 1  # the last token is only predicted
            if inputs > self.engine.max_seq_len:
                raise RequestTooLongError(
                    f"request {index} ({_describe(key)}) needs {inputs} positions but max_seq_len is "
                    f"{self.engine.max_seq_len}; load the engine with a larger max_seq_len (e.g. --model_args "
                    "...,max_seq_len=4096) or use fewer few-shot examples (--num_fewshot)"
                )
            rows.append((sequence, len(sequence) - len(continuation)))
        collator = Collator(list(range(len(rows))), sort_fn=lambda i: (-len(rows[i][0]), tuple(rows[i][0])))
        chunk = self.batch_size or self.engine.max_batch_size
        out: list[tuple[float, bool]] = []
        with tqdm(total=len(rows), disable=disable_tqdm, desc=desc) as bar:
            for batch in collator.get_batched(n=chunk):
                scored = self._score([rows[i] for i in batch])
                for i, answer in zip(batch, scored):
                    key = requests[i][0]
                    if key is not None:
                        self.cache_hook.add_partial("loglikelihood", key, answer)
                out.extend(scored)
                bar.update(len(batch))
        return collator.get_original(out)

    def _score(self, rows: list[tuple[list[int], int]]) -> list[tuple[float, bool]]:
        """(sequence, start) rows -> (sum of log P(sequence[start:]), whether each was the argmax), through the
        engine's memory-light scoring (shared contexts computed once, only continuation positions projected)."""
        scored = self.engine.score([seq for seq, _ in rows], [start for _, start in rows], **self.stored)
        self._count(scored)
        return [(row.logprob, row.is_greedy) for row in scored]

    def _count(self, results: Sequence[Any]) -> None:
        cached = sum(bool(r.cached) for r in results)
        self.rows_from_store += cached
        self.rows_computed += len(results) - cached

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole documents, each cut into its own windows (lm-eval's rolling windows with
        one token of context); every window is a sequence of BOS + at most ``max_seq_len - 1`` tokens."""
        width = self.engine.max_seq_len - 1
        if width < 1:
            raise RequestTooLongError("loglikelihood_rolling needs max_seq_len >= 2 (BOS plus one token per window)")
        windows: list[tuple[None, list[int], list[int]]] = []
        owner: list[int] = []
        for doc, (text,) in enumerate(req.args for req in requests):
            for context, continuation in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self._bos, max_seq_len=width, context_len=1
                ),
            ):
                windows.append((None, context, continuation))
                owner.append(doc)
        scores = self._loglikelihood_tokens(
            windows, disable_tqdm=disable_tqdm, desc="Running loglikelihood_rolling requests"
        )
        totals = [0.0] * len(requests)
        for doc, (logprob, _) in zip(owner, scores):
            totals[doc] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ----------------------------------------------------------------------------- generation
    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Generate for each (context, gen_kwargs), stopping at ``until`` strings (cut from the text, as
        lm-eval does), the model's end-of-turn tokens or ``max_gen_toks``; requests with the same
        settings run together in the engine's batches, longest first.  The text skips special tokens, as
        lm-eval's ``hf`` model's does."""
        args = [req.args for req in requests]
        encoded = {context: self._with_bos(self.tok_encode(context)) for context, _ in args}
        for index, (context, _) in enumerate(args):
            if len(encoded[context]) >= self.engine.max_seq_len:
                raise RequestTooLongError(
                    f"generate_until request {index} has a {len(encoded[context])}-token prompt but max_seq_len is "
                    f"{self.engine.max_seq_len} (no room to generate); load the engine with a larger max_seq_len or "
                    "use fewer few-shot examples"
                )
        collator = Collator(
            args, sort_fn=lambda a: (-len(encoded[a[0]]), a[0]), group_by="gen_kwargs", group_fn=lambda a: a[1]
        )
        out: list[str] = []
        with tqdm(total=len(args), disable=disable_tqdm, desc="Running generate_until requests") as bar:
            for batch in collator.get_batched(n=self.batch_size or 0):
                contexts = [context for context, _ in batch]
                until, sampling = self._sampling(batch[0][1])
                completions = self.engine.batch_completion(
                    [encoded[c] for c in contexts], stop=until or None, progress=False, **sampling, **self.stored
                )
                self._count(completions)
                for (context, gen_kwargs), completion in zip(batch, completions):
                    text = postprocess_generated_text(self._generated_text(completion.tokens), until, None)
                    out.append(text)
                    self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                bar.update(len(batch))
        return collator.get_original(out)

    def _generated_text(self, tokens: Sequence[int]) -> str:
        """The generated text as lm-eval's models report it: special tokens skipped (``hf`` decodes with
        ``skip_special_tokens=True``), the stop token already excluded by the engine; the ``until`` cut
        follows."""
        tok = self.engine.tokenizer
        return tok.decode([t for t in tokens if not tok.is_special(t)])

    def _sampling(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """lm-eval generation keywords -> (stop strings, engine sampling keywords)."""
        if not isinstance(gen_kwargs, dict):
            raise TaskOptionError(f"generation_kwargs must be a dict, got {gen_kwargs!r}")
        kwargs = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
        unknown = sorted(set(kwargs) - set(GEN_KWARGS))
        if unknown:
            raise TaskOptionError(
                f"generation option {unknown[0]!r} is not supported by the workbench model (supported: "
                f"{', '.join(GEN_KWARGS)} and the max_gen_toks aliases max_new_tokens, max_tokens, "
                "max_completion_tokens); remove it from the task's generation_kwargs or --gen_kwargs"
            )
        until = [s for s in kwargs["until"] if isinstance(s, str) and s]
        if len(until) != len(kwargs["until"]):
            raise TaskOptionError(f"'until' must be a string or a list of non-empty strings, got {kwargs['until']!r}")
        temperature = float(kwargs.get("temperature") or 0.0)
        if kwargs.get("do_sample"):
            # transformers' default when sampling without a temperature; an explicit 0 stays greedy
            temperature = temperature if "temperature" in gen_kwargs else 1.0
        else:
            temperature = 0.0
        sampling: dict[str, Any] = {"max_tokens": int(kwargs["max_gen_toks"]), "temperature": temperature}
        if temperature > 0:
            sampling["top_p"] = float(kwargs.get("top_p", 1.0))
            sampling["top_k"] = int(kwargs.get("top_k", 0) or 0)
        if kwargs.get("seed") is not None:
            sampling["seed"] = int(kwargs["seed"])
        return until, sampling


def _describe(key: tuple[str, str] | None) -> str:
    if key is None:
        return "a rolling window"
    context, continuation = key
    return f"context {context[-40:]!r}, continuation {continuation[:40]!r}"
