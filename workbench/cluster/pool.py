"""The replica pool: the Engine's batch APIs over N engine replicas on Ray (data parallelism).

``workbench.cluster.load(checkpoint, replicas=N, **load_kwargs)`` reserves one placement group per
replica (:mod:`.placement`), starts one :class:`~workbench.cluster.replica.Replica` actor in each, and
loads ``workbench.load(checkpoint, **load_kwargs)`` in every one of them.  The pool then offers the
engine's batch methods with the same signatures; a batch is cut into chunks that the replicas pull
(:mod:`.jobs`), and the rows come back in input order.

Chat calls are rendered and parsed here, in the driver, by the engine's chat layer (``chat.prepare`` before the
job, ``chat.finish`` on its rows), so the replicas only ever see token ids and every reply is parsed exactly as
one engine parses it.  Rows are what one engine gives: batching never changes a row, and a seeded row's
generator is seeded with the call's ``seed`` on whatever replica runs it.  The replicas' life cycle (start,
death, replacement, shutdown) is the :class:`~.fleet.Fleet`'s.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import workbench as wb

from .. import runs
from ..config import resolve_model_parallel_size
from ..engine import chat
from ..engine.interfaces import ChatFormatter, TextTokenizer
from ..engine.llama_stack import llama_stack_spellings
from ..engine.prompts import check_lengths
from ..engine.remember import (
    StoredCall,
    chat_finish,
    chat_requests,
    check_run,
    engine_provenance,
    generation_call,
    row_items,
)
from ..errors import ConfigError, FormatError, InputError
from ..formats import Prompt
from ..generation import Request, SamplingParams
from ..runtime.settings import Settings
from ..structured import per_row_formats
from ..vision.images import is_image_item
from .connect import connect, disconnect, import_ray
from .fleet import LOAD_TIMEOUT_S, Fleet
from .jobs import Job, chunk_size
from .placement import ReplicaResources, reserve
from .replica import ReplicaSpec

__all__ = ["ReplicaPool", "load"]

# batch_chat_completion's keywords that shape the prompts and the reply formats (chat.prepare), not the sampling
CHAT_KEYWORDS = ("tool_choice", "tool_prompt_format", "response_format", "constrain_tools", "system_message_behavior")


class ReplicaPool:
    """N engine replicas on Ray behind the Engine's batch APIs (build it with ``workbench.cluster.load``).

    ``batch_completion`` / ``batch_chat_completion`` (and ``completion`` / ``chat_completion``) take the
    engine's arguments and return its results; ``submit_...`` run them as a :class:`~workbench.cluster.jobs.Job`.
    ``tokenizer``, ``formatter``, ``max_seq_len``, ``settings``… are the replicas'; ``batch_chat_completion`` is
    the one chat route (``engine.interfaces.ChatEngine``), so ``workbench.tools`` and ``workbench.evals`` run on a
    pool unchanged.  ``fleet`` holds the replicas themselves.  ``shutdown()`` ends
    every replica.
    """

    def __init__(
        self,
        spec: ReplicaSpec,
        need: ReplicaResources,
        groups: list[Any],
        *,
        owns_ray: bool,
        chunk_rows: int | None = None,
    ) -> None:
        if chunk_rows is not None and (
            isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1
        ):
            raise ConfigError(f"chunk_rows must be a positive integer or None, got {chunk_rows!r}")
        self.fleet = Fleet(spec, need, groups)
        self._owns_ray = owns_ray
        self.chunk_rows = chunk_rows
        self._lock = threading.RLock()
        self._jobs: dict[int, Job] = {}
        self.closed = False
        self.tokenizer: TextTokenizer | None = None
        self.formatter: ChatFormatter | None = None
        self.settings: Settings | None = None
        self._identity: runs.CheckpointIdentity | None = None  # the checkpoint's content hashes, at the first run=

    def start(self) -> None:
        """Start every replica and wait until they have loaded (``load`` does this); the pool then renders and
        parses with the first replica's tokenizer and formatter."""
        import ray

        self.fleet.start()
        head = self.fleet.slots[0]
        self.tokenizer, self.formatter = ray.get(head.handle.text_tools.remote())
        self.settings = head.info["settings"]

    # ----------------------------------------------------------------------------- what the engine offers
    @property
    def max_seq_len(self) -> int:
        return self.fleet.head["max_seq_len"]

    @property
    def max_batch_size(self) -> int:
        """One replica's batch size (the pool runs ``replicas`` of them at once)."""
        return self.fleet.head["max_batch_size"]

    @property
    def model_id(self) -> str | None:
        return self.fleet.head.get("model_id")

    @property
    def family(self) -> str:
        return self.fleet.head["family"]

    @property
    def args(self) -> Any:
        return self.fleet.head["args"]

    @property
    def live(self) -> int:
        """Replicas ready to take rows now."""
        return self.fleet.live

    @property
    def deaths(self) -> int:
        return self.fleet.deaths

    @property
    def replacements(self) -> int:
        return self.fleet.replacements

    def wait_ready(self, timeout_s: float = LOAD_TIMEOUT_S) -> int:
        """Wait until no replacement is still loading (or ``timeout_s``); returns the live replicas."""
        return self.fleet.wait_ready(timeout_s)

    @property
    def replicas(self) -> list[dict[str, Any]]:
        """Each replica: index, state, node, host, pid, GPUs, and how often it was started."""
        return self.fleet.describe()

    # ----------------------------------------------------------------------------- batch APIs
    # The keywords are the engine's own (the signatures are copied from wb.Engine below, so Shift+Tab shows them and
    # a keyword the engine gains later works here too); only ``progress`` is the pool's, and ``response_format``
    # lists are cut per chunk.  Llama Stack's spellings (sampling_params, tool_config, messages_batch...) are
    # translated to native keywords by the same decorator as the engine's.
    @llama_stack_spellings(batch=("contents", "content_batch"), content="contents")
    def batch_completion(self, contents: Sequence[Any], **kwargs: Any) -> list[Any]:
        """``Engine.batch_completion`` over the replicas: one Completion per prompt, in input order."""
        return self.submit_batch_completion(contents, **kwargs).result()

    @llama_stack_spellings(batch=("contents", "content_batch"), content="contents")
    def submit_batch_completion(self, contents: Sequence[Any], **kwargs: Any) -> Job:
        """Start ``batch_completion`` as a job and return at once (``job.result()``, ``job.cancel()``...)."""
        _check_keywords("batch_completion", (contents,), kwargs)
        if isinstance(contents, str):
            raise InputError("batch_completion takes a list of prompts; for one string use completion()")
        contents = list(contents)
        stored = self._stored(kwargs, contents, [{"prompt": c} for c in contents], "completion")
        return self._submit("batch_completion", contents, kwargs, stored=stored)

    @llama_stack_spellings(content="content")
    def completion(self, content: Any, **kwargs: Any) -> Any:
        """``Engine.completion`` on one replica."""
        _check_keywords("completion", (content,), kwargs)
        if isinstance(kwargs.get("response_format"), (list, tuple)):
            raise FormatError("completion takes one response_format (a list is for batch_completion)")
        return self.batch_completion([content], progress=False, **kwargs)[0]

    @llama_stack_spellings(batch=("dialogs", "messages_batch"), chat=True)
    def batch_chat_completion(
        self, dialogs: Sequence[Sequence[Any]], tools: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[Any]:
        """``Engine.batch_chat_completion`` over the replicas: one ChatCompletion per dialog, in input order."""
        return self.submit_batch_chat_completion(dialogs, tools, **kwargs).result()

    @llama_stack_spellings(batch=("dialogs", "messages_batch"), chat=True)
    def submit_batch_chat_completion(
        self, dialogs: Sequence[Sequence[Any]], tools: Sequence[Any] | None = None, **kwargs: Any
    ) -> Job:
        """Start ``batch_chat_completion`` as a job; bad dialogs, tools, formats or a prompt longer than
        ``max_seq_len`` raise here, before it runs.

        The pool's one chat route: the prompts are rendered once, here in the driver (``chat.prepare``: tools one
        for all or one per dialog, as the engine's), the replicas generate from their token ids, and the rows are
        parsed here (``chat.finish``, as the engine parses them) when the job's results are asked for.  Lengths
        are checked here too, so a :class:`~workbench.errors.PromptTooLongError` names rows of the whole call
        (the tool loop ends those dialogs and goes on)."""
        _check_keywords("batch_chat_completion", (dialogs, tools), kwargs)
        options = {name: kwargs.pop(name) for name in CHAT_KEYWORDS if name in kwargs}
        formatter = self.formatter
        assert formatter is not None, "the pool renders prompts once its replicas have loaded (load() starts them)"
        prompts, formats = chat.prepare(formatter, dialogs, tools, **options)
        check_lengths(self, [p.tokens if isinstance(p, Prompt) else p for p in prompts])
        given = chat_requests(dialogs, tools, options.get("tool_choice", "auto"), options.get("tool_prompt_format"))
        if any(f is not None for f in formats):
            kwargs["response_format"] = formats
        stored = self._stored(kwargs, prompts, given, "chat", formats=formats)

        def replies(rows: list[int], completions: list[Any]) -> list[Any]:  # as the engine parses them
            return chat.finish(completions, [formats[i] for i in rows], formatter)

        return self._submit("batch_chat_completion", prompts, kwargs, replies, stored=stored)

    @llama_stack_spellings(chat=True)
    def chat_completion(self, messages: Sequence[Any], tools: Sequence[Any] | None = None, **kwargs: Any) -> Any:
        """``Engine.chat_completion`` on one replica (streams are for one engine: ``workbench.load``)."""
        _check_keywords("chat_completion", (messages, tools), kwargs)
        if kwargs.pop("stream", False):
            raise InputError("a replica pool runs batches; stream one dialog with an engine (workbench.load) instead")
        if isinstance(kwargs.get("response_format"), (list, tuple)):
            raise FormatError("chat_completion takes one response_format (a list is for batch_chat_completion)")
        return self.batch_chat_completion([messages], tools, progress=False, **kwargs)[0]

    def cancel(self) -> bool:
        """Cancel every running job of this pool (each stops within a decode step on every replica)."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if not j.done]
        return any([j.cancel() for j in jobs])

    def set_quantization(self, mode: str | None, *, progress: bool | None = None) -> None:
        """Re-load every replica under another quantization mode (replacements load it too)."""
        self._check_open()
        self.settings = self.fleet.set_quantization(mode)

    def info(self) -> dict[str, Any]:
        """The first live replica's ``engine.info()``, plus the pool's replicas, deaths and replacements."""
        import ray

        live = self.fleet.live_slots()
        base = ray.get(live[0].handle.info.remote()) if live else {}
        return {
            **base,
            "replicas": len(self.fleet.slots),
            "live": self.live,
            "died": self.deaths,
            "replaced": self.replacements,
            "replica_list": self.replicas,
        }

    def pids(self) -> list[int]:
        """Every process of every replica (actor processes and their model-parallel workers), as last seen."""
        return self.fleet.pids()

    # ----------------------------------------------------------------------------- jobs
    def _check_open(self) -> None:
        if self.closed:
            raise ConfigError("this replica pool was shut down; start another with workbench.cluster.load(...)")

    def _submit(
        self,
        method: str,
        rows: list[Any],
        kwargs: dict[str, Any],
        to_results: Callable[[list[int], list[Any]], list[Any]] | None = None,
        *,
        stored: StoredCall | None = None,
    ) -> Job:
        """A job running ``method`` over ``rows`` on the replicas, started (its rows went out, or bad input raised).
        With ``stored`` (``run=``) only the rows the store did not hold go out, each with its own seed."""
        self._check_open()
        progress = kwargs.pop("progress", None)
        if stored is not None:
            rows = [rows[r.row] for r in stored.todo]
            kwargs["seed"] = list(stored.seeds)
            if isinstance(kwargs.get("response_format"), (list, tuple)):
                kwargs["response_format"] = [kwargs["response_format"][r.row] for r in stored.todo]
        job = Job(
            self.fleet,
            method,
            "batch_completion",
            rows,
            kwargs,
            progress,
            chunk_rows=self._chunk_size,
            to_results=to_results,
            stored=stored,
        )
        with self._lock:
            self._jobs = {k: j for k, j in self._jobs.items() if not j.done}
            self._jobs[job.id] = job
        return job.start()

    def _stored(
        self, kwargs: dict[str, Any], rows: list[Any], given: list[Any], kind: str, *, formats: list[Any] | None = None
    ) -> StoredCall | None:
        """``run=`` / ``refresh=`` taken out of ``kwargs``: the call's rows against the run store (looked up here,
        in the driver), keyed as an engine keys them; None without ``run``."""
        run, refresh = kwargs.pop("run", None), kwargs.pop("refresh", False)
        items = row_items(
            kwargs.pop("item", None), len(rows), "batch_chat_completion" if kind == "chat" else "batch_completion"
        )
        if not check_run(run, refresh):
            return None
        assert self.settings is not None and self.tokenizer is not None and self.formatter is not None
        params, seeds = SamplingParams.resolve(
            kwargs.get("sampling"), **{f.name: kwargs[f.name] for f in SamplingParams.keywords() if f.name in kwargs}
        ).split_seeds(len(rows))
        if formats is None:
            formats = per_row_formats(kwargs.get("response_format"), len(rows))
        prompts = [self._key_prompt(row, i) for i, row in enumerate(rows)]
        requests = [
            Request(
                i,
                ids,
                params if seeds is None else replace(params, seed=seeds[i]),
                row=i,
                format=formats[i],
                given=given[i],
                item=items[i],
            )
            for i, (ids, _) in enumerate(prompts)
        ]
        return generation_call(
            self.open_run(run),
            requests,
            kind=kind,
            max_seq_len=self.max_seq_len,
            refresh=refresh,
            finish=chat_finish(self.formatter) if kind == "chat" else None,
            images=[images for _, images in prompts],
        )

    def open_run(self, name: str) -> runs.Run:
        """The run ``name`` in the run store as this pool writes it (``Engine.open_run``'s provenance, with the
        replica count); the checkpoint is hashed at the first ``run=`` call and remembered."""
        assert self.settings is not None
        store = runs.store()
        if self._identity is None:
            self._identity = store.checkpoint_identity(self.settings.checkpoint_dir)
        provenance = engine_provenance(
            self.settings,
            self._identity,
            model=self.fleet.head.get("model", self.model_id),
            family=self.family,
            replicas=len(self.fleet.slots),
        )
        return store.open_run(name, provenance)

    def _key_prompt(self, row: Any, i: int) -> tuple[list[int], list[str]]:
        """A row's prompt ids as a replica's engine encodes them, and its images by content (the opened pictures:
        an engine keys its tiles, so image rows of a pool and of an engine are stored apart)."""
        if isinstance(row, str):
            return self.tokenizer.encode(row, bos=True), []
        if isinstance(row, (list, tuple)) and any(isinstance(c, str) or is_image_item(c) for c in row):
            row = self.formatter.encode_content(row)
        if isinstance(row, Prompt):
            return list(row.tokens), [runs.image_digest(p.image) for p in row.images]
        try:
            return [int(t) for t in row], []
        except (TypeError, ValueError):
            raise InputError(
                f"prompt row {i} is a {type(row).__name__}; give a string or a list of token ids"
            ) from None

    def _chunk_size(self, n_rows: int) -> int:
        return chunk_size(n_rows, max(1, self.live), self.max_batch_size, self.chunk_rows)

    # ----------------------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """End every replica and its model-parallel workers, free their placement groups, and stop Ray if this
        pool started it.  Waits until the replicas' processes on this machine have exited."""
        if self.closed:
            return
        self.cancel()
        self.closed = True
        self.fleet.shutdown()
        if self._owns_ray:
            disconnect()

    def __enter__(self) -> ReplicaPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        slots, need = self.fleet.slots, self.fleet.need
        state = "shut down" if self.closed else f"{self.live}/{len(slots)} live"
        nodes = len({s.info.get("node_id") for s in slots if s.info})
        gpus = f"{need.gpus} GPU + " if need.gpus else ""
        model = self.fleet.head.get("model", self.model_id)  # what it runs in words (never a bare None)
        return (
            f"ReplicaPool(model={model!r}, replicas={len(slots)} ({state}) on {nodes} node(s),\n"
            f"            each {gpus}{need.cpus:g} CPU, model_parallel_size={need.model_parallel_size},\n"
            f"            died={self.deaths}, replaced={self.replacements})"
        )


def _check_keywords(method: str, positional: tuple, kwargs: dict[str, Any]) -> None:
    """The engine's own TypeError for a keyword its method does not take (checked before anything runs)."""
    inspect.signature(getattr(wb.Engine, method)).bind(None, *positional, **kwargs)


for _name in ("batch_completion", "completion", "batch_chat_completion", "chat_completion"):
    _engine_method = getattr(wb.Engine, _name)
    for _method in (getattr(ReplicaPool, _name), getattr(ReplicaPool, f"submit_{_name}", None)):
        if _method is not None:
            _method.__signature__ = inspect.signature(_engine_method)
            _method.__doc__ = (_method.__doc__ or "") + "\n\n" + (_engine_method.__doc__ or "")


def load(
    checkpoint: str | Path | None = None,
    *,
    replicas: int = 1,
    address: str | None = None,
    cpus_per_replica: float | None = None,
    chunk_rows: int | None = None,
    placement_timeout_s: float = 120.0,
    threads: int | None = None,
    ray_init: dict[str, Any] | None = None,
    **load_kwargs: Any,
) -> ReplicaPool:
    """Start ``replicas`` engines, each ``workbench.load(checkpoint, **load_kwargs)`` in its own Ray actor.

    address: None joins the Ray this process runs (``ray.init`` done already) or starts a local one (stopped
        again by ``pool.shutdown()``); ``"auto"`` or ``"ray://head:10001"`` joins a cluster.
    load_kwargs: ``model``, ``device``, ``dtype``, ``max_batch_size``, ``max_seq_len``, ``model_parallel_size``,
        ``quantization``… as for ``workbench.load``.  ``device=None`` means "cuda" when the cluster has GPUs.
        On CUDA a replica reserves ``model_parallel_size`` GPUs in one bundle (one node); on CPU,
        ``cpus_per_replica`` CPUs (default: one per rank).
    threads: torch threads per rank on CPU (default: the replica's CPUs divided among its ranks).
    chunk_rows: rows sent to a replica at a time (default: two of its batches, fewer for short batches).
    placement_timeout_s: how long to wait for resources that exist but are busy; resources the cluster does
        not have fail at once.
    ray_init: keywords for a locally started ``ray.init`` (``num_cpus``, ``num_gpus``, ``runtime_env``...).

    The checkpoint must be readable at the same path on every node (a shared filesystem, or copied).
    """
    ray = import_ray()
    started = connect(address, **(ray_init or {}))
    try:
        device = load_kwargs.get("device")
        if device is None:
            device = "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
        load_kwargs["device"] = str(device)
        mp = resolve_model_parallel_size(checkpoint, load_kwargs.get("model_parallel_size"))
        load_kwargs["model_parallel_size"] = mp
        if checkpoint is not None and Path(str(checkpoint)).exists():
            checkpoint = str(Path(checkpoint).resolve())  # replicas may start in another working folder
        need = ReplicaResources.create(str(device), mp, cpus_per_replica)
        if threads is None:
            threads = max(1, int(need.cpus // mp)) if not need.gpus else 1
        elif isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads must be a positive integer (torch threads per rank), got {threads!r}")
        spec = ReplicaSpec(checkpoint=checkpoint, load_kwargs=load_kwargs, threads=threads)
        groups = reserve(replicas, need, timeout_s=placement_timeout_s)
        pool = ReplicaPool(spec, need, groups, owns_ray=started, chunk_rows=chunk_rows)
        pool.start()
        return pool
    except BaseException:
        if started:
            disconnect()
        raise
