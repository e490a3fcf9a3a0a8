"""``run="name"`` on the engine's methods: the rows of a call that the run store already holds come from there,
only the others are computed, and each computed row is written the moment it ends.

A row is keyed (:mod:`workbench.runs.keys`) by what decides its output: the prompt token ids as the engine runs
them (a chat row's tools, tool choice, call syntax and response-format instruction are rendered into them),
its images by content (their tiles), its resolved sampling (every keyword; ``max_tokens=None`` adds the
``max_seq_len`` that then bounds the row; an output format by its grammar, so ``constrain_tools`` and
``response_format`` are in it; the benchmark flag ``ignore_stop_tokens``) and, for chat rows, the prompt format
that parses the reply.  The engine half of the key (checkpoint content, load settings, numerics version) is the
run's :class:`~workbench.runs.Provenance`.

Stored rows come back in place, as they were first returned (``cached=True``); the rest run as one batch, where
a sampled row without a seed runs with a drawn one that the store records (so it can be replayed), and
re-running the call answers the same samples (``refresh=True`` draws new ones and replaces them).  Computed rows
reach the store through a :class:`RowWriter` from the accumulator's ``on_finish``: a row that ends after a quiet
spell is written at once, rows ending close together share one transaction at most :data:`GROUP_S` later, so a
killed process loses only the rows still running (and at most that fraction of a second).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from workbench.engine import chat
from workbench.engine.interfaces import ChatFormatter, TextTokenizer
from workbench.errors import InputError
from workbench.formats import ToolDefinition
from workbench.generation import Request, SamplingParams
from workbench.runs import (
    CheckpointIdentity,
    Provenance,
    RowRequest,
    Run,
    call_keywords,
    image_digest,
    settle_seed,
)
from workbench.runtime.settings import Settings
from workbench.structured import OutputFormat
from workbench.types import ChatCompletion, Completion, StreamChunk

# Rows ending within this many seconds of the last write share one transaction (a timer writes them).
GROUP_S = 0.2

Finish = Callable[[Request, Completion], Any]  # (request, Completion) -> what the call returns for the row


def engine_provenance(
    settings: Settings, identity: CheckpointIdentity | str, *, model: str | None, family: str, **extra: Any
) -> Provenance:
    """What a run records about the engine that writes it: the checkpoint identity and path, the load settings
    (all of them: the ones that change numbers are also in every key), model, family, device; ``extra``: more
    (a pool's replica count)."""
    load = {
        "dtype": str(settings.dtype).replace("torch.", ""),
        "quantization": settings.quantization,
        "device": settings.device,
        "model_parallel_size": settings.model_parallel_size,
        "max_batch_size": settings.max_batch_size,
        "max_seq_len": settings.max_seq_len,
    }
    return Provenance.of(settings, identity, model=model, family=family, load_settings=load, **extra)


# ---------------------------------------------------------------------------------------------- keys
def row_sampling(
    params: SamplingParams, fmt: OutputFormat | None, seed: int | None, max_seq_len: int
) -> dict[str, Any]:
    """One row's sampling as its key sees it (see the module docstring): every field of SamplingParams as
    :meth:`~workbench.generation.SamplingParams.key_fields` gives it (a field added later is in the key once
    set, and absent at its default, so keys stored before it still answer), the row's own seed."""
    sampling = params.key_fields()
    sampling["seed"] = seed
    if params.max_tokens is None:
        sampling["max_seq_len"] = max_seq_len  # the row runs until the context is full
    if fmt is not None:  # the format by its grammar's hash: a tool-call grammar is kilobytes, every row would hold it
        grammar = hashlib.sha256(fmt.grammar.encode("utf-8", "surrogatepass")).hexdigest()
        sampling["response_format"] = {"kind": fmt.kind, "grammar_sha256": grammar}
        if fmt.kind == "tool_call":
            sampling["constrain_tools"] = True
    return sampling


def tile_digests(tiles: Any) -> list[str]:
    """A row's images by content: its preprocessed tiles (a Llama 4 tile batch, or a 3.2 Vision image set)."""
    if tiles is None:
        return []
    if isinstance(tiles, torch.Tensor):
        return [image_digest(tiles.detach().float().cpu().contiguous().numpy())]
    parts = getattr(tiles, "tiles", None)
    if parts is None:
        return [image_digest(repr(tiles).encode())]
    return [image_digest(torch.as_tensor(t).detach().float().cpu().contiguous().numpy()) for t in parts] + [
        f"aspects:{list(tiles.aspects)}",
        f"spans:{list(tiles.spans)}",
    ]


def row_requests(
    requests: Sequence[Request], *, kind: str, max_seq_len: int, images: Sequence[list[str]] | None = None
) -> list[RowRequest]:
    """The :class:`~workbench.runs.RowRequest` (what the key is made of) of every request of a call (``images``:
    each row's images by content, default :func:`tile_digests` of its tiles; rows of one format and sampling
    share their sampling dict: a 10,000-row call holds a few, not 10,000)."""
    out = []
    shared: dict[tuple[int, int, Any], dict[str, Any]] = {}
    for r in requests:
        slot = (id(r.format), id(r.params), r.params.seed)
        if slot not in shared:
            shared[slot] = row_sampling(r.params, r.format, r.params.seed, max_seq_len)
        out.append(
            RowRequest(r.prompt, shared[slot], kind, tile_digests(r.image_tiles) if images is None else images[r.row])
        )
    return out


def check_run(run: str | None, refresh: bool) -> bool:
    """Whether a call goes through the run store: ``run`` names a run (the name checked now); ``refresh`` without
    a run is a mistake, said with the fix."""
    return bool(call_keywords(run, refresh))


def chat_finish(formatter: ChatFormatter) -> Finish:
    """``(request, Completion) -> ChatCompletion``: a row's reply parsed (with its format) as ``chat.finish`` does."""
    return lambda request, completion: chat.finish_row(completion, request.format, formatter)


def generation_call(
    run: Run,
    requests: Sequence[Request],
    *,
    kind: str,
    max_seq_len: int,
    refresh: bool,
    finish: Finish | None = None,
    images: Sequence[list[str]] | None = None,
) -> StoredCall:
    """A completion or chat call's requests against ``run``, keyed (:func:`row_requests`) and looked up now
    (stored ``parsed`` rebuilt with each row's format); with ``finish`` (chat rows: :func:`chat_finish`) the
    stored and returned result is what it makes of a row."""
    return StoredCall(
        run,
        requests,
        row_requests(requests, kind=kind, max_seq_len=max_seq_len, images=images),
        refresh=bool(refresh),
        finish=finish,
        stop=requests[0].params.stop if requests else (),
    )


# ---------------------------------------------------------------------------------------------- writing
class RowWriter:
    """Finished rows to the store as they come (see the module docstring).  ``close()`` writes what is left."""

    def __init__(self, run: Run, group_s: float = GROUP_S) -> None:
        self.run = run
        self.group_s = group_s
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._last = 0.0  # time.monotonic() of the last write
        self._timer: threading.Timer | None = None

    def add(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._rows.append(row)
            wait = self._last + self.group_s - time.monotonic()
            if wait > 0 and self._timer is None:
                self._timer = threading.Timer(wait, self.flush)
                self._timer.daemon = True
                self._timer.start()
        if wait <= 0:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            rows, self._rows = self._rows, []
            timer, self._timer = self._timer, None
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        if rows:
            self.run.put_many(rows)  # never raises: a failing store warns once and the call goes on
            self._last = time.monotonic()

    def close(self) -> None:
        self.flush()


# ---------------------------------------------------------------------------------------------- one call
class StoredCall:
    """One call's requests against a run.  Made, it has keyed and looked up every request: one the store holds
    has ``stored`` (its result, ``cached``); the others are :attr:`todo`, each with the sampling it runs and is
    stored with (a sampled row without a seed gets a drawn one, put into its ``params``).  Feed each computed
    row to :meth:`finish_row`; :meth:`results` gives every row in order; :meth:`close` writes what is still
    buffered.

    rows: each request's :class:`~workbench.runs.RowRequest` (what its key is made of); finish: ``(request,
    Completion) -> result`` for chat rows (the stored and returned result is the parsed reply); stop: the call's
    stop strings (a stored chat row's raw text, for streams, is its tokens' text cut at the first of them).  A
    request's ``given`` (the request as given) and ``item`` are stored with it."""

    def __init__(
        self,
        run: Run,
        requests: Sequence[Request],
        rows: Sequence[RowRequest],
        *,
        refresh: bool = False,
        finish: Finish | None = None,
        stop: Sequence[str] = (),
    ) -> None:
        self.run = run
        self.requests = list(requests)
        self.finish = finish
        self.stop = tuple(stop)
        for request, key in zip(self.requests, run.keys(rows)):
            request.key = key
        if not refresh:
            self._lookup()
        self.todo = [r for r in self.requests if r.stored is None]
        for request in self.todo:
            settled, drawn = settle_seed(rows[request.row].sampling)
            request.sampling_record, request.seed_drawn = settled, drawn
            if drawn:  # the row runs with the seed it is stored with
                request.params = dataclasses.replace(request.params, seed=settled["seed"])
        self.started = time.monotonic()
        self.writer = RowWriter(run)

    def _lookup(self) -> None:
        by_type: dict[int, tuple[Any, list[Request]]] = {}
        for r in self.requests:
            kind = r.format.model if r.format is not None else None  # a pydantic response_format rebuilds parsed
            by_type.setdefault(id(kind), (kind, []))[1].append(r)
        for kind, requests in by_type.values():
            # a row copied from another run's identical key answers this call's item
            answers = self.run.lookup(
                [r.key for r in requests],
                parsed_type=kind,
                requests=[r.given for r in requests],
                items=[r.item for r in requests],
            )
            used: set[str] = set()
            for r in requests:
                stored = answers.get(r.key.key)
                if stored is not None:  # a key repeated in one call (a greedy prompt twice): each row its own copy
                    r.stored = copy.deepcopy(stored.output) if r.key.key in used else stored.output
                    used.add(r.key.key)

    @property
    def seeds(self) -> list[int | None]:
        """The seed each request of ``todo`` runs with (drawn where the request had none and samples)."""
        return [r.params.seed for r in self.todo]  # type: ignore[misc]

    def finish_row(self, request: Request, completion: Any) -> None:
        """A computed request ended: keep its result (``request.result``) and write it."""
        request.result = self.finish(request, completion) if self.finish is not None else completion
        # a drawn seed is recorded with the row, so the row can be replayed
        self.writer.add(
            {
                "key": request.key,
                "request": request.given,
                "prompt_ids": request.prompt,
                "output": request.result,
                "sampling": request.sampling_record,
                "seed_drawn": request.seed_drawn,
                "timings": {"seconds": round(time.monotonic() - self.started, 4)},
                "item": request.item,
            }
        )

    def finished(self, j: int, completion: Any) -> None:
        """Computed row ``j`` (its place in ``todo``) ended: :meth:`finish_row` (a replica pool's chunks count
        rows by place)."""
        self.finish_row(self.todo[j], completion)

    def output(self, request: Request, completion: Completion) -> Any:
        """A computed request's result as :meth:`finish_row` kept it (``completion``: the row, already taken)."""
        return request.result

    def results(self) -> list[Any]:
        """Every row's result in call order (stored ones ``cached``)."""
        return [r.stored if r.stored is not None else r.result for r in self.requests]

    def so_far(self) -> list[Any]:
        """Every row's result in call order once it is known (stored, or computed and ended), else None."""
        return self.results()

    def partial(self, cut: Sequence[Completion]) -> list[Any]:
        """A cancelled call's rows in call order: stored and finished rows whole, ``cut[j]`` for the others."""
        out = self.so_far()
        for request, partial in zip(self.todo, cut):
            if out[request.row] is None:
                out[request.row] = partial
        return out

    def close(self) -> None:
        self.writer.close()

    def replays(self, tokenizer: TextTokenizer) -> dict[int, list[StreamChunk]]:
        """Each stored row as the chunks a stream of it sends (:func:`replay_chunks`)."""
        return {r.row: replay_chunks(tokenizer, r.stored, self.stop) for r in self.requests if r.stored is not None}


def raw_text(tokenizer: TextTokenizer, result: Any, stop: Sequence[str]) -> str:
    """The text a stream of ``result`` sent: a Completion's text; a chat reply's tokens decoded and cut at the
    first stop string, as the engine cut them."""
    if isinstance(result, Completion):
        return result.text
    text = tokenizer.decode(list(result.tokens))
    hits = [h for h in (text.find(s) for s in stop) if h >= 0]
    return text[: min(hits)] if hits else text


def replay_chunks(
    tokenizer: TextTokenizer, result: Completion | ChatCompletion, stop: Sequence[str] = ()
) -> list[StreamChunk]:
    """A stored result as a stream sends it: one chunk per token with its text (a token ending in half a UTF-8
    character sends nothing until the character is whole), the last chunk carrying ``final``."""
    text = raw_text(tokenizer, result, stop)
    tokens = list(result.tokens)
    chunks: list[StreamChunk] = []
    emitted, decoded, start = 0, "", 0
    for k in range(len(tokens) - 1):
        piece = tokenizer.decode(tokens[start : k + 1])
        if piece.endswith("\ufffd"):
            continue
        decoded, start = decoded + piece, k + 1
        upto = min(len(decoded), len(text))
        chunks.append(StreamChunk(token=tokens[k], text=text[emitted:upto]))
        emitted = max(emitted, upto)
    chunks.append(StreamChunk(token=tokens[-1] if tokens else None, text=text[emitted:], final=result))
    return chunks


# ---------------------------------------------------------------------------------------------- call values
def row_items(item: Any, rows: int, method: str) -> list[Any]:
    """A call's ``item=`` as one value per row: a batch method's list (or tuple) has one entry per row, any other
    value (opaque: a case id, whatever the tool loop passes) is every row's; a single-row method's value is its
    row's."""
    if "batch" not in method or not isinstance(item, (list, tuple)):
        return [item] * rows
    if len(item) != rows:
        raise InputError(
            f"{method} got {len(item)} items for {rows} rows; give one item for every row or a list "
            "with one entry per row (None: derived)"
        )
    return list(item)


def chat_request(messages: Any, tools: Any, tool_choice: Any, tool_prompt_format: Any) -> dict[str, Any]:
    """A chat row's request as given (what the store keeps for browsing): the dialog and the tool options
    that differ from the defaults; a checked tool (a ``ToolDefinition``, as the tool loop sends its toolbox's) by
    its name."""
    request: dict[str, Any] = {"messages": messages}
    if tools:
        request["tools"] = (
            [t.tool_name if isinstance(t, ToolDefinition) else t for t in tools]
            if isinstance(tools, (list, tuple))
            else tools
        )
    if tool_choice != "auto":
        request["tool_choice"] = tool_choice
    if tool_prompt_format is not None:
        request["tool_prompt_format"] = tool_prompt_format
    return request


def chat_requests(
    dialogs: Sequence[Any], tools: Any, tool_choice: Any, tool_prompt_format: Any
) -> list[dict[str, Any]]:
    """:func:`chat_request` of every dialog of a batch chat call, each with its own tools and tool choice
    (``tools`` / ``tool_choice`` one for all or one per dialog: :func:`workbench.engine.chat.dialog_offers`)."""
    offers = chat.dialog_offers(len(dialogs), tools, tool_choice)
    return [chat_request(d, t, c, tool_prompt_format) for d, (t, c) in zip(dialogs, offers)]
