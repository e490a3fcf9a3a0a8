"""Model-parallel workers: one process per rank, driven from the kernel by request-numbered messages.

Why processes: fairscale's layers run one rank per process over torch.distributed, and a notebook
kernel must stay a plain Python process that survives re-run cells, errors and Ctrl-C.  So the
kernel keeps the tokenizer and the Engine, and :class:`ParallelRunner` — the Engine's runner — starts
``model_parallel_size`` workers with the ``spawn`` method (never ``fork``: the kernel holds torch
threads) and talks to them over one pipe per rank.

The protocol (start-up, requests, cancellation, failures) is described in :mod:`.wire`; this module is
its kernel side.

Time limits: ``WORKBENCH_WORKER_START_TIMEOUT`` (seconds for every rank to spawn, import and join,
default 180) and ``WORKBENCH_LOAD_TIMEOUT`` (seconds to load the slices, default 4 hours); the
liveness of every worker is watched throughout, so a crash is reported at once, not at the limit.

The kernel side: :class:`ParallelRunner` starts the workers, sends them commands and collects results.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import signal
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import timedelta
from multiprocessing import connection as mp_connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp  # also registers torch's tensor reductions for pipes

from workbench.errors import WorkbenchError, WorkerError
from workbench.formats.tokenizer import Tokenizer
from workbench.generation import Event, Request
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.transformer import Transformer
from workbench.runtime.limits import LOAD_TIMEOUT_S, POLL_S, START_TIMEOUT_S, STOP_TIMEOUT_S, SYNC_TIMEOUT_S
from workbench.runtime.memory import merge_memory
from workbench.runtime.settings import Settings
from workbench.runtime.wire import RemoteTraceback, images_to_wire
from workbench.runtime.worker import WorkerSpec, worker_main


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C until the block is done (so a command reaches every rank or none), then deliver it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    except ValueError:  # not allowed here (embedded interpreter)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "closed its connection"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with code {exitcode}"


def _stop_workers(procs: list[Any], conns: list[mp_connection.Connection], graceful: bool) -> None:
    """Stop worker processes: ask, then terminate, then kill; every step bounded in time."""
    if graceful:
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.send(("stop", 0, None))
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.close()


def logical_parameter_count(args: ModelArgs) -> int:
    """Parameters of the whole (unsharded) model, counted on a meta-device model: no memory used.

    Summing the ranks' slices would over-count what is replicated (norms, routers) or repeated
    (KV heads when there are more ranks than KV heads).
    """

    ensure_model_parallel(1)
    return sum(p.numel() for p in Transformer(args, max_seq_len=1, device="meta").parameters())


class ParallelRunner:
    """Runs the model in ``model_parallel_size`` worker processes; same interface as LocalRunner."""

    def __init__(
        self, settings: Settings, args: ModelArgs, tokenizer: Tokenizer, *, sync_timeout_s: float = SYNC_TIMEOUT_S
    ) -> None:
        self.settings = settings
        self.args = args
        self.tokenizer = tokenizer
        self.sync_timeout_s = sync_timeout_s
        self._parameters = logical_parameter_count(args)
        self._procs: list[Any] = []
        self._conns: list[mp_connection.Connection] = []
        self._store: Any = None
        self._cancel: Any = None
        self._finalizer: Any = None
        self._ready: list[dict[str, Any]] = []
        self._next_rid = 1
        self._sent = 0
        self._acked: list[int] = []
        self._broken: str | None = None
        self._launch(settings)

    # ----------------------------------------------------------------------------- public
    @property
    def alive(self) -> bool:
        """True while every worker runs and the pool is in step (False after a failure or close)."""
        return self._broken is None and bool(self._procs) and all(p.is_alive() for p in self._procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def generate(self, requests: Sequence[Request]) -> Iterator[Event]:
        """Events of rank 0, streamed as they are produced (the workers run the requests' wire copies: the
        consumer records the events on ``requests``); stopping early cancels on every rank."""
        if not requests:
            return
        if any(r.image_tiles is not None for r in requests):
            self._vision_loaded = True  # the ranks load it at this request's first prefill
        wire = [
            self._seeded(r.wire(None if r.image_tiles is None else images_to_wire(r.image_tiles))) for r in requests
        ]
        rid = self._send("generate", wire)
        yield from self._collect(rid, f"generating (request {rid})")

    def step(self, add: Sequence[Request] = (), cancel: Sequence[int] = ()) -> list[Event]:
        """One step of the running batch on every rank (the engine's loop): the same command, with the new
        requests' wire copies and the rows to cancel, goes to every rank, so they admit, cancel and decode the
        same rows in lockstep; rank 0's events come back.  A step that raises on the ranks drops their rows."""
        if any(r.image_tiles is not None for r in add):
            self._vision_loaded = True
        wire = [self._seeded(r.wire(None if r.image_tiles is None else images_to_wire(r.image_tiles))) for r in add]
        rid = self._send("step", (wire, list(cancel)))
        return self._payload(rid, f"running a step (request {rid})")

    def logits(self, token_lists: Sequence[Sequence[int]], images: Sequence[Any] | None = None) -> list[torch.Tensor]:
        lists = [list(t) for t in token_lists]
        if not lists:
            return []
        if images is not None and any(i is not None for i in images):
            self._vision_loaded = True
            rid = self._send("logits", (lists, [None if i is None else images_to_wire(i) for i in images]))
        else:
            rid = self._send("logits", lists)
        flat, lengths = self._payload(rid, f"scoring (request {rid})")
        return list(flat.split(lengths))

    def score(
        self, sequences: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Every rank scores (same forwards); rank 0's flat log-probs, greedy flags and per-row counts."""
        if not sequences:
            return torch.empty(0), torch.empty(0, dtype=torch.bool), []
        rid = self._send("score", ([list(s) for s in sequences], [int(s) for s in starts]))
        return self._payload(rid, f"scoring (request {rid})")

    def parameter_count(self) -> int:
        return self._parameters

    def load_vision(self) -> None:
        """Every rank loads its slice of the vision encoder now (instead of at the first image)."""
        rid = self._send("load_vision", None)
        results = self._collect(rid, f"loading the vision encoder (request {rid})")
        for _ in results:
            pass
        self._vision_loaded = True

    def compile_decode(self, enabled: bool = True) -> None:
        """Every rank compiles its decode step (lazily, on the next decode); ``enabled=False``: eager again."""
        rid = self._send("compile_decode", enabled)
        for _ in self._collect(rid, f"compiling the decode step (request {rid})"):
            pass

    @property
    def vision_loaded(self) -> bool:
        return getattr(self, "_vision_loaded", False)

    def memory(self) -> dict[str, Any]:
        """Bytes summed over ranks (what is resident in total), plus each rank's own numbers (``per_rank``)."""

        return merge_memory(self._ready)

    def reload(self, settings: Settings) -> None:
        """Restart the workers under ``settings`` (the old ones exit first: one copy of the model)."""
        self._shutdown(graceful=True)
        self.settings = settings
        self._broken = None
        self._vision_loaded = False
        self._launch(settings)

    def close(self) -> None:
        """Stop the workers (graceful, then terminate/kill); leaves no processes behind."""
        self._shutdown(graceful=self._broken is None)
        if self._broken is None:
            self._broken = "the engine was closed"

    # ----------------------------------------------------------------------------- start / stop
    def _launch(self, settings: Settings) -> None:
        ctx = torch_mp.get_context("spawn")
        world = settings.model_parallel_size
        backend = "nccl" if settings.device.startswith("cuda") else "gloo"
        self._store = dist.TCPStore(
            "127.0.0.1", 0, None, True, timeout=timedelta(seconds=START_TIMEOUT_S), wait_for_workers=False
        )
        self._cancel = ctx.Value("q", 0, lock=False)
        procs: list[Any] = []
        conns: list[mp_connection.Connection] = []
        self._procs, self._conns = procs, conns
        # A runner dropped without close() still stops its workers.  At interpreter exit the session's
        # atexit hook closes gracefully, and multiprocessing terminates any other daemonic workers.
        self._finalizer = weakref.finalize(self, _stop_workers, procs, conns, False)
        self._finalizer.atexit = False
        try:
            for rank in range(world):
                parent_end, child_end = ctx.Pipe(duplex=True)
                spec = WorkerSpec(
                    rank=rank,
                    world_size=world,
                    store_port=self._store.port,
                    backend=backend,
                    settings=settings,
                    threads=max(1, _cpu_count() // world),
                    parent_pid=os.getpid(),
                )
                proc = ctx.Process(
                    target=worker_main, args=(spec, child_end, self._cancel), name=f"workbench-rank{rank}", daemon=True
                )
                proc.start()
                child_end.close()  # only the worker holds it now: its death reads as EOF here
                procs.append(proc)
                conns.append(parent_end)
            self._await_ready(world)
        except BaseException:
            self._shutdown(graceful=False)
            raise
        self._sent, self._acked, self._next_rid = 0, [0] * world, 1

    def _await_ready(self, world: int) -> None:
        joined: set[int] = set()
        ready: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(ready) < world:
            stage = "start and join the process group" if len(joined) < world else "load its checkpoint slices"
            try:
                rank, message = self._recv(deadline, "starting up")
            except TimeoutError:
                waiting = sorted(set(range(world)) - (joined if len(joined) < world else set(ready)))
                raise self._fail(
                    f"model-parallel worker rank(s) {waiting} did not {stage} within the time limit; the workers were "
                    "stopped. Check that the machine is not overloaded and that 127.0.0.1 is reachable (firewall), "
                    "then run workbench.load(...) again"
                ) from None
            kind = message[0]
            if kind == "joined":
                joined.add(rank)
                if len(joined) == world:
                    deadline = time.monotonic() + LOAD_TIMEOUT_S
            elif kind == "ready":
                ready[rank] = message[2]
            elif kind == "failed":
                raise self._start_error(rank, message[2])
        self._ready = [ready[r] for r in range(world)]

    def _start_error(self, rank: int, info: dict[str, Any]) -> BaseException:
        """A worker's start-up exception, re-raised in the kernel: workbench errors keep their type."""
        original = None
        if info["pickled"] is not None:
            with contextlib.suppress(Exception):
                original = pickle.loads(info["pickled"])
        if isinstance(original, WorkbenchError) and not isinstance(original, WorkerError):
            with contextlib.suppress(Exception):
                error = type(original)(f"model-parallel worker rank {rank} could not load the model: {original}")
                self._fail(str(error))
                error.__cause__ = RemoteTraceback(info["traceback"])
                return error
        error = self._fail(
            f"model-parallel worker rank {rank} failed to start: {info['type']}: {info['message']}. The workers were "
            f"stopped; fix the cause and run workbench.load(...) again. Worker traceback:\n{info['traceback']}"
        )
        return error

    def _shutdown(self, graceful: bool) -> None:
        procs, conns = self._procs, self._conns
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _stop_workers(procs, conns, graceful)
        self._procs, self._conns = [], []
        self._ready = []  # their memory is returned: memory() and info() now report zero
        self._store = None

    def _fail(self, reason: str) -> WorkerError:
        """Stop the pool for good (until reload) and return the error that says why."""
        self._broken = reason
        self._shutdown(graceful=False)
        return WorkerError(reason)

    def _check_usable(self) -> None:
        if self._broken is not None or not self._procs:
            raise WorkerError(
                f"{self._broken or 'the workers did not start'} — this engine's model-parallel workers are stopped; "
                "run workbench.load(...) again to reload"
            )
        for rank, proc in enumerate(self._procs):
            if not proc.is_alive():
                raise self._died(rank, "idle between requests")

    def _died(self, rank: int, doing: str) -> WorkerError:
        proc = self._procs[rank]
        proc.join(1.0)
        how = _exit_description(proc.exitcode)
        hint = " (SIGKILL often means the out-of-memory killer: check `dmesg`)" if proc.exitcode == -9 else ""
        return self._fail(
            f"model-parallel worker rank {rank} (pid {proc.pid}) {how} while {doing}{hint}; the other workers were "
            f"stopped. Reload the engine with workbench.load(...) (same arguments)"
        )

    # ----------------------------------------------------------------------------- messaging
    def _recv(self, deadline: float | None, doing: str) -> tuple[int, tuple[Any, ...]]:
        """The next message from any rank.  A dead rank raises WorkerError; past ``deadline``, TimeoutError."""
        rank_of = {id(c): r for r, c in enumerate(self._conns)}
        sentinels = {p.sentinel: r for r, p in enumerate(self._procs)}
        while True:
            timeout = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            ready = mp_connection.wait([*self._conns, *sentinels], timeout)
            for obj in ready:  # messages first: a worker's last words come before its death
                if not isinstance(obj, int):
                    rank = rank_of[id(obj)]
                    try:
                        return rank, obj.recv()  # type: ignore[union-attr]
                    except (EOFError, OSError):
                        raise self._died(rank, doing) from None
            for obj in ready:
                if obj in sentinels and not self._conns[sentinels[obj]].poll(0):
                    raise self._died(sentinels[obj], doing)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError

    def _send(self, kind: str, payload: Any) -> int:
        """Settle earlier requests, then send one command to every rank (all or none, even on Ctrl-C)."""
        self._check_usable()
        self._settle()
        rid = self._next_rid
        blob = bytes(ForkingPickler.dumps((kind, rid, payload)))
        with _sigint_deferred():
            self._next_rid += 1
            self._sent = rid
            for rank, conn in enumerate(self._conns):
                try:
                    conn.send_bytes(blob)
                except OSError:
                    raise self._died(rank, f"receiving request {rid}") from None
        return rid

    def _settle(self) -> None:
        """Cancel every unfinished earlier request and wait until all ranks have ended it."""
        if all(acked >= self._sent for acked in self._acked):
            return
        self._cancel.value = max(self._cancel.value, self._sent)
        while any(acked < self._sent for acked in self._acked):
            try:  # the ranks stop at their next forward; allow sync_timeout_s of silence
                rank, message = self._recv(time.monotonic() + self.sync_timeout_s, "finishing an interrupted request")
            except TimeoutError:
                late = [r for r, acked in enumerate(self._acked) if acked < self._sent]
                raise self._fail(
                    f"model-parallel worker rank(s) {late} did not stop an interrupted request within "
                    f"{self.sync_timeout_s:.0f}s; the workers were stopped. Run workbench.load(...) again to reload"
                ) from None
            if message[0] == "end":
                self._acked[rank] = max(self._acked[rank], message[1])
            # events of abandoned requests are dropped

    def _payload(self, rid: int, doing: str) -> Any:
        """Wait for every rank to end ``rid`` (its events are not needed) and return rank 0's payload."""
        results = self._collect(rid, doing)
        while True:
            try:
                next(results)
            except StopIteration as done:
                return done.value

    def _collect(self, rid: int, doing: str) -> Iterator[Event]:
        """Yield rank 0's events of ``rid`` until every rank has ended it; return rank 0's payload."""
        world = len(self._conns)
        ends: dict[int, tuple[str, Any]] = {}
        finished = False
        try:
            while len(ends) < world:
                # The ranks run in lockstep, so once one has ended the others have at most some queued
                # messages left: from then on, sync_timeout_s of silence means a stuck rank.  Only time
                # spent waiting here counts, so a slow consumer is never mistaken for a stuck rank.
                deadline = time.monotonic() + self.sync_timeout_s if ends else None
                try:
                    rank, message = self._recv(deadline, doing)
                except TimeoutError:
                    stuck = sorted(set(range(world)) - set(ends))
                    failed = sorted(r for r, (status, _) in ends.items() if status == "error")
                    if not failed:
                        raise self._fail(
                            f"model-parallel worker rank(s) {stuck} did not finish request {rid} within "
                            f"{self.sync_timeout_s:.0f}s of rank(s) {sorted(ends)}; the workers were stopped. Run "
                            "workbench.load(...) again to reload"
                        ) from None
                    info = ends[failed[0]][1]
                    raise self._fail(
                        f"model-parallel worker rank {failed[0]} raised {info['type']}: {info['message']}, and rank(s) "
                        f"{stuck} were left waiting for it inside a collective operation; the workers were stopped. "
                        f"Run workbench.load(...) again to reload. Worker traceback:\n{info['traceback']}"
                    ) from None
                kind, msg_rid = message[0], message[1]
                if kind == "end":
                    self._acked[rank] = max(self._acked[rank], msg_rid)
                    if msg_rid == rid:
                        ends[rank] = (message[3], message[4])
                if kind == "event" and msg_rid == rid:
                    yield message[2]
            finished = True
        finally:
            if not finished:  # the consumer stopped early or was interrupted: stop every rank
                self._cancel.value = max(self._cancel.value, rid)
        for rank in sorted(ends):
            status, payload = ends[rank]
            if status == "error":
                raise self._remote_error(rank, payload)
        if any(status != "ok" for status, _ in ends.values()):
            raise WorkerError(f"request {rid} was cancelled by the workers unexpectedly; run it again")
        return ends[0][1]

    def _remote_error(self, rank: int, info: dict[str, Any]) -> BaseException:
        """An exception every rank raised: re-raised with its own type (the engine stays usable)."""
        error = None
        if info["pickled"] is not None:
            with contextlib.suppress(Exception):
                error = pickle.loads(info["pickled"])
        if not isinstance(error, Exception):
            error = WorkerError(
                f"model-parallel worker rank {rank} raised {info['type']}: {info['message']} (the request was "
                "abandoned on every rank; the engine is still usable)"
            )
        error.__cause__ = RemoteTraceback(f"raised on model-parallel worker rank {rank}:\n{info['traceback']}")
        return error

    @staticmethod
    def _seeded(request: Request) -> Request:
        """Give sampled rows without a seed a concrete one, so every rank draws the same tokens."""
        params = request.params
        if params.greedy or params.seed is not None:
            return request
        seed = random.SystemRandom().randrange(2**63)
        return replace(request, params=replace(params, seed=seed))

    # ----------------------------------------------------------------------------- test hooks
    def _inject_fault(self, at_forward: int, ranks: Sequence[int] | None = None, action: str = "raise") -> None:
        """Arm a failure for the next request: before forward ``at_forward``, ``ranks`` raise
        (``action="raise"``), exit (``"exit"``) or announce a different step (``"diverge"``)."""
        ranks = list(range(len(self._conns))) if ranks is None else list(ranks)
        rid = self._send("fault", {"at_forward": at_forward, "ranks": ranks, "action": action})
        for _ in self._collect(rid, "arming a test fault"):
            pass
