"""Streaming: the Engine's calls that hand tokens back as they arrive, one prompt or a batch of them, completions
and chat.  :class:`StreamingMixin` is a part of :class:`~.engine.Engine` (its methods are the Engine's); a stream
is a :class:`~.batch_stream.BatchStream` over the same requests, grammars and run-store rows as the batch calls,
so each row's tokens equal ``batch_completion``'s.  The chat streams' deltas are :func:`~.chat.finish_stream`'s."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from workbench.engine import chat
from workbench.engine.accumulator import RowAccumulator
from workbench.engine.batch_stream import BatchStream
from workbench.engine.docs import sampling_doc
from workbench.engine.llama_stack import llama_stack_spellings
from workbench.engine.prompts import Content, check_lengths, encode_row
from workbench.engine.remember import Finish, StoredCall, chat_finish
from workbench.generation import Request, SamplingParams
from workbench.structured import per_row_formats
from workbench.types import StreamChunk


class StreamingMixin:
    """The Engine's streaming methods (see the module docstring).  The Engine sets the attributes they use
    (``_loop``, ``_calls``, ``tokenizer``, ``formatter``) and has the request-building steps they
    share with the batch calls (``_requests``, ``_rendered``, ``_stored``, ``_constrain``)."""

    @llama_stack_spellings(content="content")
    @sampling_doc
    def stream_completion(
        self,
        content: Content,
        *,
        sampling: SamplingParams | None = None,
        response_format: Any = None,
        item: Any = None,
        run: str | None = None,
        refresh: bool = False,
    ) -> Iterator[StreamChunk]:
        """Yield :class:`~workbench.types.StreamChunk` text deltas of one completion as tokens arrive.

        The last chunk carries ``final``, the complete :class:`~workbench.types.Completion`.  Stop strings
        never leak: text that could be the start of a stop string is held back until it is decided.  A row
        answered from the run store (``run=``) streams its stored tokens the same way.
        """
        assert sampling is not None
        prompt, tiles = encode_row(self, content, 0)
        requests = self._requests(
            [prompt],
            [tiles],
            sampling,
            per_row_formats(response_format, 1),
            [{"prompt": content}],
            item,
            "stream_completion",
        )
        return self._open_stream(requests, stored=self._stored(run, refresh, requests)).chunks()

    @llama_stack_spellings(batch=("contents", "content_batch"), content="contents")
    @sampling_doc
    def stream_batch_completion(
        self,
        contents: Sequence[Content],
        *,
        sampling: SamplingParams | None = None,
        response_format: Any = None,
        preemptible: bool = True,
        item: Any = None,
        run: str | None = None,
        refresh: bool = False,
    ) -> BatchStream:
        """Stream many prompts in one batch: ``(row, StreamChunk)`` pairs as tokens arrive (rows interleave).

        Each row's tokens equal ``batch_completion``'s; its last chunk carries ``final``.  ``stream.cancel(row)``
        ends one row at the next step (final ``stop_reason="cancelled"``) and the others go on.
        preemptible: kept for compatibility; it changes nothing now (a stream never holds other calls up: its
            rows share the engine's running batch).
        With ``run=``, rows the run store holds are streamed first (from their stored tokens), then the others.
        """
        assert sampling is not None
        rows = [encode_row(self, c, i) for i, c in enumerate(contents)]
        requests = self._requests(
            [ids for ids, _ in rows],
            [t for _, t in rows],
            sampling,
            per_row_formats(response_format, len(rows)),
            [{"prompt": c} for c in contents],
            item,
            "stream_batch_completion",
        )
        return self._open_stream(
            requests,
            stored=self._stored(run, refresh, requests),
        )

    @llama_stack_spellings(chat=True)
    @sampling_doc
    def stream_chat_completion(
        self,
        messages: Sequence[Any],
        tools: Sequence[Any] | None = None,
        *,
        tool_choice: str = "auto",
        tool_prompt_format: str | None = None,
        sampling: SamplingParams | None = None,
        response_format: Any = None,
        constrain_tools: bool = False,
        system_message_behavior: str = "append",
        item: Any = None,
        run: str | None = None,
        refresh: bool = False,
    ) -> Iterator[Any]:
        """``chat_completion(..., stream=True)``: ``TextDelta`` / ``ToolCallDelta`` items, then the ChatCompletion."""
        assert sampling is not None
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

    def _chat_stream(
        self,
        messages: Sequence[Any],
        tools: Sequence[Any] | None,
        tool_choice: str,
        tool_prompt_format: str | None,
        response_format: Any,
        constrain_tools: bool,
        system_message_behavior: str,
        run: str | None,
        refresh: bool,
        sampling: SamplingParams,
        item: Any,
    ) -> Iterator[chat.StreamItem]:
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
            "stream_chat_completion",
        )
        stream = self._open_stream(
            requests,
            stored=self._stored(run, refresh, requests, kind="chat"),
            finish=chat_finish(self.formatter),
        )
        return chat.finish_stream(stream.chunks(), requests[0].format, self.formatter)

    @llama_stack_spellings(batch=("dialogs", "messages_batch"), chat=True)
    @sampling_doc
    def stream_batch_chat_completion(
        self,
        dialogs: Sequence[Sequence[Any]],
        tools: Sequence[Any] | None = None,
        *,
        tool_choice: str = "auto",
        tool_prompt_format: str | None = None,
        sampling: SamplingParams | None = None,
        response_format: Any = None,
        constrain_tools: bool = False,
        preemptible: bool = True,
        system_message_behavior: str = "append",
        item: Any = None,
        run: str | None = None,
        refresh: bool = False,
    ) -> BatchStream:
        """``batch_chat_completion`` streamed: ``(row, StreamChunk)`` pairs of raw reply text; each row's last
        chunk's ``final`` is its ChatCompletion (equal to ``batch_chat_completion``'s).  See
        ``stream_batch_completion`` for ``cancel(row)``, ``preemptible`` and ``run=``."""
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
            "stream_batch_chat_completion",
        )
        return self._open_stream(
            requests,
            stored=self._stored(run, refresh, requests, kind="chat"),
            finish=chat_finish(self.formatter),
        )

    def _open_stream(
        self,
        requests: list[Request],
        *,
        stored: StoredCall | None = None,
        finish: Finish | None = None,
    ) -> BatchStream:
        """A stream over a call's requests (lengths and grammars checked now, before the first ``next``).  With
        ``stored``, its stored rows are replayed first and only the others run.  ``finish``: ``(request,
        Completion) -> final`` (a chat reply parsed); a stored call made that final already when the row ended."""
        check_lengths(self, [r.prompt for r in requests], [r.image_tiles for r in requests])
        todo, replays = requests, None
        if stored is not None:
            todo, replays = stored.todo, stored.replays(self.tokenizer)
        self._constrain(todo)
        rows = RowAccumulator(
            self.tokenizer, todo, stream=True, on_finish=stored.finish_row if stored is not None else None
        )
        if stored is not None and finish is not None:
            finish = stored.output  # the row's result as stored: parsed once, when the row ended
        return BatchStream(
            self._loop,
            self._calls,
            todo,
            rows,
            total=len(requests),
            replays=replays,
            on_close=stored.close if stored else None,
            partial=stored.partial if stored else None,
            finish=finish,
        )
