"""The Engine: the batch APIs over one loaded model (a thin façade, nano-vllm style).

The engine validates and encodes requests, hands them to a *runner* (:class:`~.interfaces.Runner`: the
in-process :class:`~workbench.runtime.local.LocalRunner`, or the model-parallel worker pool) and feeds the
runner's token events to a :class:`~.accumulator.RowAccumulator`, which builds the results.  It holds no
per-request state between calls, which is what makes it safe to interrupt.  The work is done beside it: prompt
checks (:mod:`.prompts`), the chat layer's rendering and parsing (:mod:`.chat`: ``prepare`` before generation,
``finish`` after), the streaming calls (:mod:`.streaming`) and their batched streams (:mod:`.batch_stream`), one
call at a time and cancellation (:mod:`.calls`), scoring's row checks (:mod:`.scoring`), introspection
(:mod:`.introspection`), managing the loaded model (:mod:`.management`: quantization re-loads, vision, compiled
decode, CUDA graphs, closing), Llama Stack's keyword spellings and the sampling keywords (:mod:`.llama_stack`,
:mod:`.docs`).  Each row of a call is one :class:`~workbench.generation.Request` from here to its result.  A chat
call is one straight path: ``prepare`` -> :meth:`Engine.generate_tokens` -> ``finish``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from workbench import runs
from workbench.engine import chat
from workbench.engine.accumulator import RowAccumulator
from workbench.engine.aio import AsyncEngine
from workbench.engine.calls import Calls
from workbench.engine.chat import PromptRow
from workbench.engine.docs import sampling_doc
from workbench.engine.interfaces import ChatFormatter, Runner
from workbench.engine.introspection import IntrospectionMixin, model_label
from workbench.engine.llama_stack import llama_stack_spellings
from workbench.engine.loop import EngineLoop, call_events
from workbench.engine.management import ModelManagement
from workbench.engine.prompts import Content, check_lengths, encode_row, prompt_row
from workbench.engine.remember import (
    Finish,
    StoredCall,
    chat_finish,
    chat_requests,
    check_run,
    engine_provenance,
    generation_call,
    row_items,
)
from workbench.engine.scoring import logits_rows, score_rows, scored_rows
from workbench.engine.streaming import StreamingMixin
from workbench.errors import GenerationCancelled, InputError
from workbench.formats import make_formatter
from workbench.formats.tokenizer import Tokenizer
from workbench.generation import Request, SamplingParams
from workbench.generation.constraints import GrammarRuntime
from workbench.models.args import ModelArgs
from workbench.models.llama32_vision import LLAMA32_VISION_DEFAULT_NAME, is_cross_attention_vision
from workbench.progress import TokenRate, check_progress, progress_bar
from workbench.runs import RowRequest, Run
from workbench.runtime.settings import Settings
from workbench.structured import OutputFormat, per_row_formats
from workbench.types import ChatCompletion, Completion, ScoredRow


class Engine(StreamingMixin, ModelManagement, IntrospectionMixin):
    """A loaded model with batch completion, chat and scoring APIs.  Build it with ``workbench.load``."""

    def __init__(
        self,
        *,
        runner: Runner,
        tokenizer: Tokenizer,
        args: ModelArgs,
        settings: Settings,
        model_id: str | None,
        load_seconds: float = 0.0,
    ) -> None:
        self._runner = runner
        self.tokenizer = tokenizer
        self.args = args
        self.settings = settings
        self.model_id = model_id
        self.family = args.family
        self.load_seconds = load_seconds
        self._formatter: ChatFormatter | None = None
        self._calls = Calls()  # numbers the generation calls, so that cancel() hits the running one
        self._grammars: GrammarRuntime | None = None  # built on the first response_format
        self._loop = EngineLoop(lambda: self._runner)  # the one running batch every call feeds
        self.aio = AsyncEngine(self)  # the awaitable form of the calls: ``await engine.aio.chat_completion(...)``
        self._vision_eager = False  # load_vision() was asked for: keep it loaded across re-loads
        self.compile_seconds: float | None = None  # set by compile_decode(); kept across re-loads
        self.cuda_graphs: dict[str, Any] | None = None  # set by use_cuda_graphs(); kept across re-loads
        self._identity: runs.CheckpointIdentity | None = None  # the checkpoint's content hashes, at the first run=

    # ----------------------------------------------------------------------------- properties
    @property
    def max_seq_len(self) -> int:
        return self.settings.max_seq_len

    @property
    def max_batch_size(self) -> int:
        return self.settings.max_batch_size

    @property
    def runner(self) -> Runner:
        """What runs this engine's model: the in-process runner, or the model-parallel worker pool."""
        return self._runner

    @property
    def formatter(self) -> ChatFormatter:
        """Chat-prompt renderer and reply parser for this model's prompt format."""
        if self._formatter is None:
            cross, model_id = None, self.model_id
            if is_cross_attention_vision(self.args):  # a nameless 3.2 Vision checkpoint: its (3.1-style) tool format
                cross = (self.args.vision_chunk_size, self.args.vision_max_num_chunks)
                model_id = model_id or LLAMA32_VISION_DEFAULT_NAME
            self._formatter = make_formatter(
                self.tokenizer, model_id, vision_args=self.args.vision_args, cross_attention_tiles=cross
            )
        return self._formatter

    # ----------------------------------------------------------------------------- cancellation
    def cancel(self) -> bool:
        """Stop the generation calls running now (in any thread) at the next step of the running batch.

        Safe from any thread (a Stop button's callback, a timer).  Each running call raises
        :class:`~workbench.errors.GenerationCancelled` carrying its partial results; a call started
        afterwards is not affected.  Returns True when a call was running.  To end one call of several, close
        its stream, cancel its rows (``stream.cancel(row)``) or interrupt its thread (Ctrl-C ends the
        interrupted call's rows only).
        """
        return self._calls.cancel()

    # ----------------------------------------------------------------------------- completions
    @llama_stack_spellings(content="content")
    @sampling_doc
    def completion(
        self,
        content: Content,
        *,
        sampling: SamplingParams | None = None,
        response_format: Any = None,
        item: Any = None,
        run: str | None = None,
        refresh: bool = False,
    ) -> Completion:
        """Complete one prompt and return a :class:`~workbench.types.Completion` (text, tokens, stop reason).

        content: a string (encoded with a BOS token), a list of token ids used exactly as given, a list
            mixing text and images (Llama 4: BOS, then the items, no chat headers), or a ``Prompt`` from
            ``engine.formatter.encode_prompt``.
        """
        assert sampling is not None  # resolved by the signature's wrapper (docs.take_sampling)
        prompt, tiles = encode_row(self, content, 0)
        requests = self._requests(
            [prompt], [tiles], sampling, per_row_formats(response_format, 1), [{"prompt": content}], item, "completion"
        )
        return self.generate_tokens(requests, progress=False, stored=self._stored(run, refresh, requests))[0]

    @llama_stack_spellings(batch=("contents", "content_batch"), content="contents")
    @sampling_doc
    def batch_completion(
        self,
        contents: Sequence[Content],
        *,
        sampling: SamplingParams | None = None,
        progress: bool | None = None,
        response_format: Any = None,
        item: Any = None,
        run: str | None = None,
        refresh: bool = False,
    ) -> list[Completion]:
        """Complete many prompts in one batch: one :class:`~workbench.types.Completion` per prompt, in order.

        Each row's result equals running that prompt alone (greedy, or sampled with a seed), so
        batching is purely a speed choice.  More prompts than ``max_batch_size`` flow through in waves.

        contents: strings (encoded with BOS), token-id lists, text+image lists and/or ``Prompt`` objects (see
            ``completion``).
        progress: a progress bar of rows done and tokens/s; None (default) shows it once the call has
            run for a couple of seconds, True at once, False never.
        """
        assert sampling is not None
        if isinstance(contents, str):
            raise InputError("batch_completion takes a list of prompts; for one string use completion()")
        check_progress(progress)
        rows = [encode_row(self, c, i) for i, c in enumerate(contents)]
        requests = self._requests(
            [ids for ids, _ in rows],
            [t for _, t in rows],
            sampling,
            per_row_formats(response_format, len(rows)),
            [{"prompt": c} for c in contents],
            item,
            "batch_completion",
        )
        return self.generate_tokens(requests, progress=progress, stored=self._stored(run, refresh, requests))

    def generate_tokens(
        self,
        requests: Sequence[Request] | Sequence[Sequence[int]],
        params: SamplingParams | None = None,
        *,
        progress: bool | None = False,
        on_finish: Callable[[int, Completion], None] | None = None,
        stored: StoredCall | None = None,
        finish: Finish | None = None,
    ) -> list[Any]:
        """Run a call's requests and collect one result per request: the path every batch call takes.

        ``requests``: the call's :class:`~workbench.generation.Request` s (or plain token-id lists, each run with
        ``params``).  Checks the lengths (the ids are taken as they are), compiles the rows' grammars, holds the
        engine for the call and feeds the runner's events to a :class:`~.accumulator.RowAccumulator`.
        ``on_finish(row, completion)`` is called the moment each row ends.  ``stored`` (a call against a run
        store, :mod:`.remember`): only its rows to compute run, each is stored as it ends, and the result is every
        row in order, stored ones included.  ``finish``: ``(request, Completion) -> result`` (a chat reply parsed,
        :func:`~.remember.chat_finish`); a stored call applies the same one as each row ends."""
        if not requests:
            return []
        if not isinstance(requests[0], Request):  # token-id lists
            assert params is not None, "plain token-id rows need the SamplingParams they run with"
            requests = [Request(i, list(p), params, row=i) for i, p in enumerate(requests)]
        calls = list(requests)
        check_lengths(self, [r.prompt for r in calls], [r.image_tiles for r in calls])
        todo = stored.todo if stored is not None else calls
        if not todo:
            return stored.results()  # type: ignore[union-attr]
        self._constrain(todo)
        if progress is None and len(todo) == 1:
            progress = False  # automatic bars count rows: none for a single prompt
        rate = TokenRate()

        def finished(request: Request, completion: Completion) -> None:
            rate.tokens = rows.generated
            bar.set_postfix_str(str(rate), refresh=False)
            bar.update(1)
            if stored is not None:
                stored.finish_row(request, completion)
            if on_finish is not None:
                on_finish(request.row, completion)

        rows = RowAccumulator(self.tokenizer, todo, on_finish=finished)
        try:
            bar = progress_bar(len(todo), desc="generating", unit="row", progress=progress, rate=rate)
            try:
                for event in call_events(self._loop, self._calls, todo):
                    rows.add(event)
            finally:
                rate.tokens = rows.generated
                bar.close()
        finally:
            if stored is not None:
                stored.close()  # rows still waiting for their group's write go to the store now
        if stored is None:
            completions = rows.completions()
            return completions if finish is None else [finish(r, c) for r, c in zip(todo, completions)]
        if not rows.done:
            cut = rows.cancelled()
            raise GenerationCancelled(str(cut), partial=stored.partial(cut.partial))
        return stored.results()

    def _requests(
        self,
        prompts: list[list[int]],
        tiles: list[Any],
        sampling: SamplingParams,
        formats: list[OutputFormat | None],
        given: Sequence[Any],
        item: Any,
        method: str,
    ) -> list[Request]:
        """A call's rows as :class:`~workbench.generation.Request` s: each its place, prompt ids, images, sampling
        (its own seed where the call gave one per row), output format, the request as given and its item."""
        params, seeds = sampling.split_seeds(len(prompts))
        items = row_items(item, len(prompts), method)
        return [
            Request(
                i,
                prompt,
                params if seeds is None else replace(params, seed=seeds[i]),
                image_tiles=tiles[i],
                row=i,
                format=formats[i],
                given=given[i],
                item=items[i],
            )
            for i, prompt in enumerate(prompts)
        ]

    def _chat_requests(
        self,
        dialogs: Sequence[Any],
        tools: Any,
        tool_choice: Any,
        tool_prompt_format: Any,
        response_format: Any,
        constrain_tools: bool,
        system_message_behavior: str,
        sampling: SamplingParams,
        item: Any,
        method: str,
    ) -> list[Request]:
        """A chat call's rows (one per dialog): rendered by :func:`chat.prepare`, as :meth:`_requests` makes them,
        each keeping its dialog and tool options as given (what the run store shows)."""
        prompts, formats = chat.prepare(
            self.formatter,
            dialogs,
            tools,
            tool_choice,
            tool_prompt_format,
            response_format=response_format,
            constrain_tools=constrain_tools,
            system_message_behavior=system_message_behavior,
        )
        given = chat_requests(dialogs, tools, tool_choice, tool_prompt_format)
        return self._requests(*self._rendered(prompts), sampling, formats, given, item, method)

    def _rendered(self, prompts: Sequence[PromptRow]) -> tuple[list[list[int]], list[Any]]:
        """The chat layer's prompts as token ids and image tiles (ids as the formatter built them)."""
        rows = [prompt_row(self, p, i) for i, p in enumerate(prompts)]
        return [ids for ids, _ in rows], [tiles for _, tiles in rows]

    def _constrain(self, requests: Sequence[Request]) -> None:
        """Each request's grammar (from its format), compiled (and cached) now so a bad one fails before any
        generation; the requests are numbered for the runner's events (``index``)."""
        for j, request in enumerate(requests):
            request.index = j
            fmt = request.format
            if fmt is None:
                continue
            if self._grammars is None:
                self._grammars = GrammarRuntime(self.tokenizer)
            if fmt.kind == "tool_call":  # Llama 4 ends tool-call turns with <|eom|>
                ends = (self.tokenizer.eot_id, self.tokenizer.eom_id)
                constraint = fmt.constraint(ends, "end_of_message" if self.family == "llama4" else "end_of_turn")
            else:
                constraint = fmt.constraint((self.tokenizer.eot_id,))
            self._grammars.check(constraint)
            request.constraint = constraint

    # ----------------------------------------------------------------------------- the run store
    def open_run(self, name: str) -> Run:
        """The run ``name`` in the run store (``wb.runs.path()``) as this engine writes it: its provenance is this
        engine's checkpoint identity (content hashes, computed at the first ``run=`` call of this engine and
        remembered; the store keeps each file's hash, so a checkpoint is hashed once), load settings, model and
        device, plus the versions, host and git commit of this process.  ``run=`` on every completion and chat
        method uses it; integrations that store rows of their own (``runs.Run.put``) can too."""
        store = runs.store()
        if self._identity is None:
            self._identity = store.checkpoint_identity(self.settings.checkpoint_dir)
        provenance = engine_provenance(self.settings, self._identity, model=model_label(self), family=self.family)
        return store.open_run(name, provenance)

    def _stored(
        self, run: str | None, refresh: bool, requests: list[Request], *, kind: str = "completion"
    ) -> StoredCall | None:
        """The call's requests against run ``run`` (None: no run store), keyed and looked up now."""
        if not check_run(run, refresh):
            return None
        return generation_call(
            self.open_run(run),
            requests,
            kind=kind,
            max_seq_len=self.max_seq_len,
            refresh=refresh,
            finish=chat_finish(self.formatter) if kind == "chat" else None,
        )

    # ----------------------------------------------------------------------------- chat
    @llama_stack_spellings(chat=True)
    @sampling_doc
    def chat_completion(
        self,
        messages: Sequence[Any],
        tools: Sequence[Any] | None = None,
        *,
        tool_choice: str = "auto",
        tool_prompt_format: str | None = None,
        stream: bool = False,
        sampling: SamplingParams | None = None,
        response_format: Any = None,
        constrain_tools: bool = False,
        system_message_behavior: str = "append",
        item: Any = None,
        run: str | None = None,
        refresh: bool = False,
    ) -> Any:
        """One assistant reply in the model's official prompt format (a :class:`~workbench.types.ChatCompletion`).

        messages: the dialog, :class:`~workbench.types.Message` objects or dicts like
            ``{"role": "user", "content": "..."}`` (roles system, user, assistant, tool).
        tools: Python callables, OpenAI-style or Llama-Stack-style definitions, or built-in names
            (``"brave_search"``, ``"wolfram_alpha"``, ``"code_interpreter"``); parsed calls land in
            ``result.message.tool_calls`` (run them with ``workbench.tools.run``).
        tool_choice: ``"auto"``, ``"required"``, ``"none"`` or a tool's name.
        tool_prompt_format: ``"json"``, ``"function_tag"`` or ``"python_list"`` (default: the model's own).
        system_message_behavior: ``"append"`` (default) adds the dialog's system message after the tool prompt;
            ``"replace"`` uses it instead of the default tool instructions, with ``{{function_description}}``
            where the tool list goes (Llama 3.2+ prompt formats, as Llama Stack's ``tool_config``).
        stream: True returns an iterator of ``TextDelta`` / ``ToolCallDelta`` items ending with the
            ChatCompletion (see :mod:`workbench.engine.chat`).
        constrain_tools: True with ``tool_choice="required"`` (or a tool's name) forces the reply to be a
            well-formed call of an offered tool, in the model's own syntax, with schema-valid arguments.
        A JSON-schema ``response_format`` also appends Llama Stack's "Please respond in JSON format with the
        schema: ..." user message, as the reference does.
        """
        assert sampling is not None
        if stream:
            return self._chat_stream(
                messages,
                tools,
                tool_choice,
                tool_prompt_format,
                response_format,
                constrain_tools,
                system_message_behavior,
                run,
                refresh,
                sampling,
                item,
            )
        requests = self._chat_requests(
            [messages],
            tools,
            tool_choice,
            tool_prompt_format,
            response_format,
            constrain_tools,
            system_message_behavior,
            sampling,
            item,
            "chat_completion",
        )
        stored = self._stored(run, refresh, requests, kind="chat")
        return self.generate_tokens(requests, progress=False, stored=stored, finish=chat_finish(self.formatter))[0]

    @llama_stack_spellings(batch=("dialogs", "messages_batch"), chat=True)
    @sampling_doc
    def batch_chat_completion(
        self,
        dialogs: Sequence[Sequence[Any]],
        tools: Sequence[Any] | None = None,
        *,
        tool_choice: str = "auto",
        tool_prompt_format: str | None = None,
        sampling: SamplingParams | None = None,
        progress: bool | None = None,
        response_format: Any = None,
        constrain_tools: bool = False,
        system_message_behavior: str = "append",
        item: Any = None,
        run: str | None = None,
        refresh: bool = False,
    ) -> list[ChatCompletion]:
        """One reply per dialog, generated in one batch (per-row results equal single calls).

        dialogs: a list of dialogs (each a list of messages, or a bare string for one user message);
            the same ``tools``, ``tool_choice`` and sampling apply to every dialog (see ``chat_completion``),
            or ``tools`` / ``tool_choice`` give one entry per dialog (a list of tool lists: dialogs that each
            offer their own tools share the batch, as the tool loop's and the evals' turns do).
        This is the one chat route (``engine.interfaces.ChatEngine``; a Ray pool offers the same method): the
        tool loop, the evals and serve generate chat replies through it, rendered and parsed once per call.
        progress: a progress bar of dialogs done and tokens/s; None (default) shows it once the call
            has run for a couple of seconds, True at once, False never.
        """
        assert sampling is not None
        requests = self._chat_requests(
            dialogs,
            tools,
            tool_choice,
            tool_prompt_format,
            response_format,
            constrain_tools,
            system_message_behavior,
            sampling,
            item,
            "batch_chat_completion",
        )
        if not requests:
            return []
        check_progress(progress)
        stored = self._stored(run, refresh, requests, kind="chat")
        return self.generate_tokens(requests, progress=progress, stored=stored, finish=chat_finish(self.formatter))

    # ----------------------------------------------------------------------------- scoring
    def logits(self, token_lists: Sequence[Sequence[int] | Any]) -> list[torch.Tensor]:
        """Teacher-forced float32 logits ``[len, vocab]`` for each token list (likelihood evaluation).

        A row may also be a ``Prompt`` with images (``formatter.encode_prompt(messages)``): its logits are
        computed with its images, as generation would see them."""
        prompts, images = logits_rows(self, token_lists)
        if not prompts:
            return []
        with self._loop.exclusive():  # between two steps (no cache slot is used)
            if any(tiles is not None for tiles in images):
                return self._runner.logits(prompts, images)
            return self._runner.logits(prompts)

    def score(
        self,
        sequences: Sequence[Sequence[int]],
        starts: Sequence[int] | int = 1,
        *,
        run: str | None = None,
        refresh: bool = False,
    ) -> list[ScoredRow]:
        """Log-probabilities of ``sequences[i][starts[i]:]`` (each token given all before it) and whether each
        token is the greedy choice: one :class:`~workbench.types.ScoredRow` per sequence.

        Why not :meth:`logits`: scoring needs one number per scored token, and full logits are float32
        ``[len, vocab]`` per row (1 GiB per 2,048 tokens at a 128k vocabulary) with the output projection run
        over every context position.  Here only the scored positions are projected, a chunk at a time;
        rows are packed without padding and shared prefixes (a few-shot preamble, one context with several
        answers) are computed once.  Numbers equal :meth:`logits`' log-softmax up to float rounding.

        ``starts``: one int for all rows or one per row, ``1 <= start < len(sequence)`` (1 scores every token
        after the first); ``len(sequence) - 1`` tokens (the last is only predicted) must fit ``max_seq_len``.
        ``run="name"``: each row is remembered in the run store (kind ``score``) and a stored row is answered
        from there (``row.cached``); ``refresh=True`` recomputes and replaces.
        """
        rows, firsts = score_rows(self, sequences, starts)
        if not rows:
            return []
        if not check_run(run, refresh):
            with self._loop.exclusive(drain=True):  # scoring fills cache slots: the running rows finish first
                logprobs, greedy, counts = self._runner.score(rows, firsts)
            return scored_rows(logprobs, greedy, counts)
        requests = [
            Request(i, r, SamplingParams(), row=i, given={"sequence": r, "start": f})
            for i, (r, f) in enumerate(zip(rows, firsts))
        ]
        stored = StoredCall(
            self.open_run(run),
            requests,
            [RowRequest(r, {"start": f}, "score") for r, f in zip(rows, firsts)],
            refresh=bool(refresh),
        )
        try:
            if stored.todo:
                with self._loop.exclusive(drain=True):
                    logprobs, greedy, counts = self._runner.score(
                        [r.prompt for r in stored.todo], [firsts[r.row] for r in stored.todo]
                    )
                for request, row in zip(stored.todo, scored_rows(logprobs, greedy, counts)):
                    stored.finish_row(request, row)
        finally:
            stored.close()
        return stored.results()
