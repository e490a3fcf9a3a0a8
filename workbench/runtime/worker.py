"""The worker side: one spawned process per rank that loads its slices and runs the Scheduler in step."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from dataclasses import dataclass, replace
from multiprocessing import connection as mp_connection
from typing import Any

import torch
import torch.distributed as dist

from workbench.checkpoints.load import check_vocab
from workbench.errors import WorkbenchError, WorkerError
from workbench.formats.tokenizer import Tokenizer
from workbench.generation import Scheduler
from workbench.generation.constraints import GrammarRuntime
from workbench.models.args import ModelArgs
from workbench.models.distributed import init_worker_group, shutdown_worker_group
from workbench.runtime.limits import COLLECTIVE_TIMEOUT_S, POLL_S
from workbench.runtime.loading import load_model_for_rank
from workbench.runtime.memory import model_memory
from workbench.runtime.settings import Settings
from workbench.runtime.token_ids import image_token, stop_token_reasons
from workbench.runtime.wire import exception_to_wire, images_from_wire


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one worker needs, pickled into the spawned process."""

    rank: int
    world_size: int
    store_port: int
    backend: str
    settings: Settings
    threads: int
    parent_pid: int


class _Cancelled(Exception):
    """Raised on every rank at the same forward pass when the kernel gave up on the request."""


class RanksDivergedError(WorkerError):
    """The ranks were about to run different forward passes (a bug: they must take identical steps)."""


class _CheckedModel:
    """The rank's model as the Scheduler sees it, with the collective cancel check before each forward."""

    def __init__(self, model: torch.nn.Module, worker: _Worker) -> None:
        self._model = model
        self._worker = worker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def forward_full(self, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self._worker.checkpoint("prefill", tokens)
        return self._model.forward_full(tokens, **kwargs)

    def forward_packed(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._worker.checkpoint("prefill", tokens)
        return self._model.forward_packed(tokens, *args, **kwargs)

    def hidden_packed(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._worker.checkpoint("prefill", tokens)
        return self._model.hidden_packed(tokens, *args, **kwargs)

    def forward_decode(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._worker.checkpoint("decode", tokens)
        return self._model.forward_decode(tokens, *args, **kwargs)


class _Worker:
    def __init__(self, spec: WorkerSpec, conn: mp_connection.Connection, cancel: Any) -> None:
        self.spec = spec
        self.conn = conn
        self.cancel = cancel  # shared int64: every request id <= value is cancelled
        self.rid = 0
        self.forwards = 0
        self.fault: dict[str, Any] | None = None
        self.ctrl: Any = None
        self.scheduler: Scheduler | None = None

    def send(self, *message: Any) -> None:
        self.conn.send(message)

    def parent_gone(self) -> bool:
        return os.getppid() != self.spec.parent_pid

    def start(self) -> None:

        spec = self.spec
        self.ctrl = init_worker_group(
            rank=spec.rank,
            world_size=spec.world_size,
            store_host="127.0.0.1",
            store_port=spec.store_port,
            backend=spec.backend,
            timeout_s=COLLECTIVE_TIMEOUT_S,
        )
        self.send("joined", spec.rank)
        settings = spec.settings
        if spec.backend == "nccl":
            settings = replace(settings, device=f"cuda:{spec.rank}")
        args = ModelArgs.from_checkpoint(settings.checkpoint_dir)
        tokenizer = Tokenizer.for_checkpoint(settings.checkpoint_dir, args.family)
        check_vocab(args, tokenizer.n_words, str(settings.checkpoint_dir / "params.json"))
        model = load_model_for_rank(settings, args, spec.rank)
        self.scheduler = Scheduler(
            _CheckedModel(model, self),
            stop_tokens=stop_token_reasons(tokenizer),
            decode_text=tokenizer.decode,
            max_batch_size=settings.max_batch_size,
            max_seq_len=settings.max_seq_len,
            grammars=GrammarRuntime(tokenizer),  # every rank computes the same masks from the same tokens
            image_token=image_token(tokenizer, args),
        )
        info = model_memory(model, self.scheduler.cache.nbytes())
        info["local_parameters"] = sum(p.numel() for p in model.parameters())
        info["pid"] = os.getpid()
        if spec.backend == "nccl":
            info["device_allocated_bytes"] = torch.cuda.memory_allocated(spec.rank)
        self.send("ready", spec.rank, info)

    def checkpoint(self, kind: str, tokens: torch.Tensor) -> None:
        """Called before every forward: the ranks agree (one MAX all-reduce) whether to stop here,
        and check that they are all about to run the same forward on the same tokens — a rank that
        sampled differently would otherwise silently mix its hidden states into the others'."""
        self.forwards += 1
        rows, width = tokens.shape[0], (tokens.shape[1] if tokens.dim() > 1 else 1)
        step = ((1 if kind == "prefill" else 2) * 1_000_003 + rows) * 1_000_003 + width
        checksum = int(tokens.sum())
        fault = self.fault
        if fault is not None and self.forwards == fault["at_forward"] and self.spec.rank in fault["ranks"]:
            self.fault = None  # fires once
            if fault["action"] == "exit":
                os._exit(17)
            if fault["action"] == "diverge":
                step += 1
            else:
                raise RuntimeError(f"injected fault on rank {self.spec.rank} at forward {self.forwards}")
        stop = self.cancel.value >= self.rid or self.parent_gone()
        votes = torch.tensor([1 if stop else 0, step, -step, checksum, -checksum], dtype=torch.int64)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.ctrl)
        stop_all, high, neg_low, sum_high, neg_sum_low = votes.tolist()
        if high != -neg_low or sum_high != -neg_sum_low:
            raise RanksDivergedError(
                f"model-parallel ranks diverged at forward {self.forwards} of request {self.rid} (rank "
                f"{self.spec.rank} was about to run {kind} of {rows}x{width} tokens, checksum {checksum}); this is a "
                "workbench bug — please report it. The request was stopped on every rank"
            )
        if stop_all:
            raise _Cancelled

    def run(self, kind: str, payload: Any) -> Any:
        assert self.scheduler is not None
        rank0 = self.spec.rank == 0
        if kind == "generate":
            payload = [
                r if r.image_tiles is None else replace(r, image_tiles=images_from_wire(r.image_tiles)) for r in payload
            ]
            for event in self.scheduler.generate(payload):
                if rank0:
                    self.send("event", self.rid, event)
            return None
        if kind == "step":
            add, cancel = payload
            add = [r if r.image_tiles is None else replace(r, image_tiles=images_from_wire(r.image_tiles)) for r in add]
            events = self.scheduler.step(add, cancel)
            return events if rank0 else None
        if kind == "logits":
            lists, images = payload if isinstance(payload, tuple) else (payload, None)
            out = self.scheduler.logits(
                lists, None if images is None else [None if i is None else images_from_wire(i) for i in images]
            )
            return (torch.cat(out), [t.shape[0] for t in out]) if rank0 else None
        if kind == "score":
            out = self.scheduler.score(*payload)
            return out if rank0 else None
        if kind == "load_vision":
            self.scheduler.model.ensure_vision()
            return None
        if kind == "compile_decode":
            self.scheduler.model.compile_decode(payload)
            return None
        if kind == "fault":
            self.fault = payload if self.spec.rank in payload["ranks"] else None
            return None
        raise WorkbenchError(f"unknown worker command {kind!r}")

    def serve(self) -> None:
        while True:
            if not self.conn.poll(POLL_S):
                if self.parent_gone():
                    return
                continue
            try:
                kind, rid, payload = self.conn.recv()
            except (EOFError, OSError):  # the kernel went away
                return
            if kind == "stop":
                return
            self.rid = rid
            if kind != "step":  # forwards are counted over a run of steps (the engine's loop), else per command
                self.forwards = 0
            try:
                status, result = "ok", self.run(kind, payload)
            except _Cancelled:
                status, result = "cancelled", None
            except Exception as exc:
                status, result = "error", exception_to_wire(exc)
            if kind not in ("fault", "step"):
                self.fault = None  # a test fault is armed for one call only (the steps of the engine's loop)
            self.send("end", rid, self.spec.rank, status, result)


def worker_main(spec: WorkerSpec, conn: mp_connection.Connection, cancel: Any) -> None:
    """Entry point of a spawned worker process."""

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel handles Ctrl-C and cancels us
    torch.set_num_threads(spec.threads)  # share the cores: N workers x all cores would oversubscribe them
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    worker = _Worker(spec, conn, cancel)
    try:
        worker.start()
    except BaseException as exc:
        with contextlib.suppress(Exception):
            conn.send(("failed", spec.rank, exception_to_wire(exc)))
        shutdown_worker_group()
        sys.exit(1)
    try:
        worker.serve()
    except (BrokenPipeError, EOFError, ConnectionError):
        pass  # the kernel went away mid-request
    finally:
        shutdown_worker_group()
