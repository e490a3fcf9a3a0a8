"""The replica pool: the Engine's batch APIs over N engine replicas on Ray (data parallelism).

``workbench.cluster.load(checkpoint, replicas=N, **load_kwargs)`` reserves one placement group per
replica (:mod:`.placement`), starts one :class:`~workbench.cluster.replica.Replica` actor in each, and
loads ``workbench.load(checkpoint, **load_kwargs)`` in every one of them.  The pool then offers the
engine's batch methods with the same signatures; a batch is cut into chunks that the replicas pull
(:mod:`.jobs`), and the rows come back in input order.

Chat calls are rendered and parsed here, in the driver, by the engine's own chat layer running over the
pool (``Engine.batch_chat_completion`` with the pool in the engine's place: it needs ``formatter``,
``tokenizer`` and ``batch_completion``), so the replicas only ever see token ids and every reply is
parsed exactly as one engine parses it.  Rows are what one engine gives: batching never changes a row,
and a seeded row's generator is seeded with the call's ``seed`` on whatever replica runs it.

It runs a little over 500 lines: the pool's batch methods keep the engine's signatures and docstrings,
and its replica life cycle (start, death, replacement, shutdown) reads best in one place.
"""

from __future__ import annotations

import inspect
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import workbench as wb

from ..engine.llama_stack import llama_stack_spellings
from ..errors import ConfigError, FormatError, InputError
from .connect import connect, disconnect, import_ray
from .jobs import Job, JobEngine, Replay, chunk_size, dispatch
from .placement import ReplicaResources, actor_options, release, reserve
from .replica import ReplicaSpec, remote_class

__all__ = ["ReplicaPool", "load"]

LOAD_TIMEOUT_S = float(os.environ.get("WORKBENCH_CLUSTER_LOAD_TIMEOUT", 3600))
STOP_TIMEOUT_S = 30.0


@dataclass
class _Slot:
    """One replica position: its placement group and the actor living in it now (replaced when it dies)."""

    index: int
    group: Any
    handle: Any = None
    state: str = "starting"  # starting | live | dead | failed | closed
    ready: Any = None  # the load() ref while starting
    info: dict[str, Any] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    inflight: int = 0
    starts: int = 0
    error: str | None = None


class ReplicaPool:
    """N engine replicas on Ray behind the Engine's batch APIs (build it with ``workbench.cluster.load``).

    ``batch_completion`` / ``batch_chat_completion`` (and ``completion`` / ``chat_completion``) take the
    engine's arguments and return its results; ``submit_...`` run them as a :class:`~workbench.cluster.jobs.Job`.
    ``tokenizer``, ``formatter``, ``max_seq_len``, ``settings``… are the replicas' (so ``workbench.tools`` and
    ``workbench.evals`` run on a pool unchanged).  ``shutdown()`` ends every replica.
    """

    def __init__(self, spec: ReplicaSpec, need: ReplicaResources, groups: list[Any], *, owns_ray: bool,
                 chunk_rows: int | None = None) -> None:
        if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int)
                                       or chunk_rows < 1):
            raise ConfigError(f"chunk_rows must be a positive integer or None, got {chunk_rows!r}")
        self._spec = spec
        self._need = need
        self._owns_ray = owns_ray
        self.chunk_rows = chunk_rows
        self._lock = threading.RLock()
        self._slots = [_Slot(i, g) for i, g in enumerate(groups)]
        self._jobs: dict[int, Job] = {}
        self.deaths = 0
        self.replacements = 0
        self.closed = False
        self._actor = remote_class()
        self.tokenizer: Any = None
        self.formatter: Any = None
        self.settings: Any = None

    # ----------------------------------------------------------------------------- start-up
    def _start(self, slot: _Slot) -> None:
        slot.handle = self._actor.options(**actor_options(slot.group, self._need)).remote(self._spec)
        slot.ready = slot.handle.load.remote()
        slot.state, slot.inflight, slot.starts = "starting", 0, slot.starts + 1

    def _start_all(self) -> None:
        import ray

        for slot in self._slots:
            self._start(slot)
        refs = {slot.ready: slot for slot in self._slots}
        try:
            infos = ray.get(list(refs), timeout=LOAD_TIMEOUT_S)
        except Exception as exc:
            self.shutdown()
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):  # the replica's own error (a bad checkpoint path...): as it was
                raise cause from exc
            raise
        for slot, info in zip(self._slots, infos):
            self._went_live(slot, info)
        head = self._slots[0]
        self.tokenizer, self.formatter = ray.get(head.handle.text_tools.remote())
        self.settings = head.info["settings"]

    def _went_live(self, slot: _Slot, info: dict[str, Any]) -> None:
        import ray

        slot.info, slot.state, slot.ready, slot.error = info, "live", None, None
        try:
            slot.pids = ray.get(slot.handle.pids.remote(), timeout=STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001  (it died at once: the next chunk finds out and replaces it)
            slot.pids = [info.get("pid")]

    # ----------------------------------------------------------------------------- what the engine offers
    @property
    def _head(self) -> dict[str, Any]:
        for slot in self._slots:
            if slot.info:
                return slot.info
        return {}

    @property
    def max_seq_len(self) -> int:
        return self._head["max_seq_len"]

    @property
    def max_batch_size(self) -> int:
        """One replica's batch size (the pool runs ``replicas`` of them at once)."""
        return self._head["max_batch_size"]

    @property
    def model_id(self) -> str | None:
        return self._head.get("model_id")

    @property
    def family(self) -> str:
        return self._head["family"]

    @property
    def args(self) -> Any:
        return self._head["args"]

    @property
    def live(self) -> int:
        """Replicas ready to take rows now."""
        self._poll_starts()
        return sum(s.state == "live" for s in self._slots)

    def wait_ready(self, timeout_s: float = LOAD_TIMEOUT_S) -> int:
        """Wait until no replacement is still loading (or ``timeout_s``); returns the live replicas."""
        import ray

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            refs = self._starting_refs()
            if not refs:
                break
            ready, _ = ray.wait(refs, num_returns=1, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            for ref in ready:
                self._finish_start(ref)
        return self.live

    def _poll_starts(self) -> None:
        """Take in replacements that finished loading while no job was running."""
        import ray

        refs = self._starting_refs()
        if refs:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                self._finish_start(ref)

    @property
    def replicas(self) -> list[dict[str, Any]]:
        """Each replica: index, state, node, host, pid, GPUs, and how often it was started."""
        self._poll_starts()
        return [{"index": s.index, "state": s.state, "node_id": s.info.get("node_id"), "host": s.info.get("host"),
                 "pid": s.info.get("pid"), "cuda_visible_devices": s.info.get("cuda_visible_devices"),
                 "starts": s.starts, "error": s.error} for s in self._slots]

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
        rows = list(contents)
        progress = kwargs.pop("progress", None)
        job = self._new_job("batch_completion", len(rows), progress)
        job._run(lambda: dispatch(self, job, "batch_completion", rows, kwargs))
        return self._started(job)

    @llama_stack_spellings(content="content")
    def completion(self, content: Any, **kwargs: Any) -> Any:
        """``Engine.completion`` on one replica."""
        _check_keywords("completion", (content,), kwargs)
        if isinstance(kwargs.get("response_format"), (list, tuple)):
            raise FormatError("completion takes one response_format (a list is for batch_completion)")
        return self.batch_completion([content], progress=False, **kwargs)[0]

    @llama_stack_spellings(batch=("dialogs", "messages_batch"), chat=True)
    def batch_chat_completion(self, dialogs: Sequence[Sequence[Any]], tools: Sequence[Any] | None = None,
                              **kwargs: Any) -> list[Any]:
        """``Engine.batch_chat_completion`` over the replicas: one ChatCompletion per dialog, in input order."""
        return self.submit_batch_chat_completion(dialogs, tools, **kwargs).result()

    @llama_stack_spellings(batch=("dialogs", "messages_batch"), chat=True)
    def submit_batch_chat_completion(self, dialogs: Sequence[Sequence[Any]], tools: Sequence[Any] | None = None,
                                     **kwargs: Any) -> Job:
        """Start ``batch_chat_completion`` as a job; bad dialogs, tools or formats raise here, before it runs.

        The prompts are rendered and the replies parsed here by the engine's own chat layer (with the pool in the
        engine's place), so the replicas only generate from token ids."""
        _check_keywords("batch_chat_completion", (dialogs, tools), kwargs)
        dialogs = list(dialogs) if isinstance(dialogs, (list, tuple)) else dialogs
        job = self._new_job("batch_chat_completion", len(dialogs) if isinstance(dialogs, list) else 0,
                            kwargs.get("progress"))
        view = JobEngine(self, job)
        job._run(lambda: wb.Engine.batch_chat_completion(view, dialogs, tools, **kwargs))

        def replies(done: list[int]) -> list[Any]:  # finished rows' Completions -> ChatCompletions, as the engine
            replay = Replay(self, [job._rows[i] for i in done])
            fmt = kwargs.get("response_format")
            subset = dict(kwargs, progress=False)
            if isinstance(fmt, (list, tuple)):
                subset["response_format"] = [fmt[i] for i in done]
            return wb.Engine.batch_chat_completion(replay, [dialogs[i] for i in done], tools, **subset)

        job._to_results = replies
        return self._started(job)

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
        import ray

        self._check_open()
        live = [s for s in self._slots if s.state == "live"]
        settings = ray.get([s.handle.set_quantization.remote(mode) for s in live])
        self._spec.load_kwargs["quantization"] = mode
        self.settings = settings[0]
        for slot, s in zip(live, settings):
            slot.info["settings"] = s

    def info(self) -> dict[str, Any]:
        """The first live replica's ``engine.info()``, plus the pool's replicas, deaths and replacements."""
        import ray

        slot = next((s for s in self._slots if s.state == "live"), None)
        base = ray.get(slot.handle.info.remote()) if slot is not None else {}
        return {**base, "replicas": len(self._slots), "live": self.live, "died": self.deaths,
                "replaced": self.replacements, "replica_list": self.replicas}

    # ----------------------------------------------------------------------------- jobs (used by jobs.py)
    def _check_open(self) -> None:
        if self.closed:
            raise ConfigError("this replica pool was shut down; start another with workbench.cluster.load(...)")

    def _new_job(self, kind: str, n_rows: int, progress: bool | None) -> Job:
        self._check_open()
        job = Job(self, kind, n_rows, progress)
        with self._lock:
            self._jobs = {k: j for k, j in self._jobs.items() if not j.done}
            self._jobs[job.id] = job
        return job

    def _started(self, job: Job) -> Job:
        """Wait until the job has rendered its prompts and sent rows out, so bad input raises in the caller."""
        job._dispatching.wait()
        if not job._began:
            job._finished.wait()
            if job._error is not None:
                raise job._error
        return job

    def _chunk_size(self, n_rows: int) -> int:
        return chunk_size(n_rows, max(1, self.live), self.max_batch_size, self.chunk_rows)

    def _slots_with_room(self, pipeline: int) -> list[_Slot]:
        with self._lock:
            live = [s for s in self._slots if s.state == "live" and s.inflight < pipeline]
        return sorted(live, key=lambda s: s.inflight)

    def _starting_refs(self) -> list[Any]:
        with self._lock:
            return [s.ready for s in self._slots if s.state == "starting" and s.ready is not None]

    def _finish_start(self, ref: Any) -> None:
        """A replacement's load() returned: it goes live, or is marked failed with its error."""
        import ray

        with self._lock:
            slot = next((s for s in self._slots if s.ready is ref), None)
            if slot is None or slot.state != "starting":
                return
            try:
                info = ray.get(ref)
            except Exception as exc:  # noqa: BLE001  (recorded; the job fails only when no replica is left)
                slot.state, slot.ready = "failed", None
                slot.error = f"{type(exc).__name__}: {str(exc)[:300]}"
                return
            self._went_live(slot, info)
            self.replacements += 1

    def _replica_died(self, slot: _Slot, handle: Any, exc: BaseException) -> None:
        """``handle`` (slot's actor) is gone: count it and start a replacement in the same placement group."""
        import ray

        with self._lock:
            if slot.handle is not handle or slot.state != "live" or self.closed:
                return  # already replaced (another job saw it first)
            slot.state, slot.error = "dead", f"{type(exc).__name__}"
            self.deaths += 1
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001  (already gone)
                pass
            self._start(slot)

    def _cancel_job(self, job_id: int) -> None:
        with self._lock:
            handles = [s.handle for s in self._slots if s.state == "live"]
        for handle in handles:
            try:
                handle.cancel.remote(job_id)
            except Exception:  # noqa: BLE001  (a dead replica has nothing to cancel)
                pass

    def _failure_summary(self) -> str:
        parts = [f"replica {s.index}: {s.state}" + (f" ({s.error})" if s.error else "") for s in self._slots]
        return f"{self.deaths} died, {self.replacements} replaced; " + ", ".join(parts)

    # ----------------------------------------------------------------------------- shutdown
    def pids(self) -> list[int]:
        """Every process of every replica (actor processes and their model-parallel workers), as last seen."""
        return sorted({p for s in self._slots for p in s.pids if p})

    def _local_pids(self) -> list[int]:
        """The replicas' processes on this machine (pids of other hosts mean nothing here)."""
        here = socket.gethostname()
        return sorted({p for s in self._slots if s.info.get("host") == here for p in s.pids if p})

    def shutdown(self) -> None:
        """End every replica and its model-parallel workers, free their placement groups, and stop Ray if this
        pool started it.  Waits until the replicas' processes on this machine have exited."""
        import ray

        if self.closed:
            return
        self.cancel()
        self.closed = True
        handles = [s.handle for s in self._slots if s.handle is not None]
        local = self._local_pids()
        closing = [h.close.remote() for h in handles]
        try:
            if closing:
                ray.wait(closing, num_returns=len(closing), timeout=STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001  (dead replicas answer with errors: they are gone already)
            pass
        for handle in handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        for slot in self._slots:
            slot.state = "closed"
        _wait_gone(local, STOP_TIMEOUT_S)
        release([s.group for s in self._slots])
        if self._owns_ray:
            disconnect()

    def __enter__(self) -> ReplicaPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        n = len(self._slots)
        if not self.closed:
            self._poll_starts()
        state = "shut down" if self.closed else f"{self.live}/{n} live"
        nodes = len({s.info.get("node_id") for s in self._slots if s.info})
        gpus = f"{self._need.gpus} GPU + " if self._need.gpus else ""
        mp = self._need.model_parallel_size
        model = self._head.get("model", self.model_id)  # what it runs in words (never a bare None)
        return (f"ReplicaPool(model={model!r}, replicas={n} ({state}) on {nodes} node(s),\n"
                f"            each {gpus}{self._need.cpus:g} CPU, model_parallel_size={mp},\n"
                f"            died={self.deaths}, replaced={self.replacements})")


def _check_keywords(method: str, positional: tuple, kwargs: dict[str, Any]) -> None:
    """The engine's own TypeError for a keyword its method does not take (checked before anything runs)."""
    inspect.signature(getattr(wb.Engine, method)).bind(None, *positional, **kwargs)


for _name in ("batch_completion", "completion", "batch_chat_completion", "chat_completion"):
    _engine_method = getattr(wb.Engine, _name)
    for _method in (getattr(ReplicaPool, _name), getattr(ReplicaPool, f"submit_{_name}", None)):
        if _method is not None:
            _method.__signature__ = inspect.signature(_engine_method)
            _method.__doc__ = (_method.__doc__ or "") + "\n\n" + (_engine_method.__doc__ or "")


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:
                break
            time.sleep(0.05)


def _model_parallel_size(checkpoint: Any, load_kwargs: dict[str, Any]) -> int:
    mp = load_kwargs.get("model_parallel_size")
    if mp is None:
        raw = os.environ.get("MODEL_PARALLEL_SIZE", "1").strip() or "1"
        if not raw.isdigit():
            raise ConfigError(f"MODEL_PARALLEL_SIZE={raw!r} is not a positive integer; set it to e.g. 2, or unset it")
        mp = int(raw)
    if mp == 0 and checkpoint is not None and Path(checkpoint).is_dir():
        mp = len(list(Path(checkpoint).glob("consolidated.*.pth")))  # one rank per saved shard
    if isinstance(mp, bool) or not isinstance(mp, int) or mp < 1:
        raise ConfigError(f"a replica pool needs a concrete model_parallel_size >= 1 (GPUs per replica), got {mp!r}")
    return mp


def load(checkpoint: str | Path | None = None, *, replicas: int = 1, address: str | None = None,
         cpus_per_replica: float | None = None, chunk_rows: int | None = None, placement_timeout_s: float = 120.0,
         threads: int | None = None, ray_init: dict[str, Any] | None = None,
         **load_kwargs: Any) -> ReplicaPool:
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
        mp = _model_parallel_size(checkpoint, load_kwargs)
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
        pool._start_all()
        return pool
    except BaseException:
        if started:
            disconnect()
        raise
