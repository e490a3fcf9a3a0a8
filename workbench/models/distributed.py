"""torch.distributed + fairscale model-parallel bootstrap.

fairscale's parallel layers ask for the model-parallel group even at size 1, and
``initialize_model_parallel`` raises if called twice, so every entry point goes through
:func:`ensure_model_parallel`, which is idempotent.  In the kernel process (size 1) a single-rank
gloo group over an in-memory store is used: no port, no file, no peers.  Model-parallel worker
processes (``workbench.runtime.worker``) join a real group with :func:`init_worker_group` instead.
"""

from __future__ import annotations

import contextlib
import io
from datetime import timedelta

import torch
import torch.distributed as dist
from fairscale.nn.model_parallel import initialize as fs_init

from workbench.errors import ConfigError


def ensure_model_parallel(size: int = 1, backend: str = "gloo") -> None:
    """Make sure torch.distributed and fairscale model parallelism are up with ``size`` ranks.

    With ``size == 1`` and no process group yet, a private single-rank group is created.  With a
    larger size the caller (a worker process) must have initialised the process group already.
    """
    if not dist.is_initialized():
        if size != 1:
            raise ConfigError(
                f"model_parallel_size={size} needs a process group; use workbench.load(..., "
                f"model_parallel_size={size}), which starts one worker per rank"
            )
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if fs_init.model_parallel_is_initialized():
        current = fs_init.get_model_parallel_world_size()
        if current != size:
            raise ConfigError(
                f"this process already runs model parallelism of size {current}, asked for {size}; "
                "unload the engine (workbench.unload()) or restart the kernel"
            )
        return
    with contextlib.redirect_stdout(io.StringIO()):  # fairscale prints three banner lines
        fs_init.initialize_model_parallel(size)


def init_worker_group(
    *, rank: int, world_size: int, store_host: str, store_port: int, backend: str, timeout_s: float
) -> dist.ProcessGroup:
    """Join the workers' process group through the kernel's TCPStore, set up fairscale, and return a
    gloo *control* group for the small CPU-side agreements between generation steps.

    The kernel hosts the store (it picked a free port by binding port 0), so there is no
    port race and no rank has to be the rendezvous server.  ``timeout_s`` bounds the rendezvous and
    every later collective, so a vanished peer turns into an error instead of a hang.
    """
    if dist.is_initialized():
        raise ConfigError(
            "this process already has a torch.distributed group; model-parallel workers need a fresh "
            "process (workbench starts them itself)"
        )
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(store_host, store_port, world_size, is_master=False, timeout=timeout)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    ensure_model_parallel(world_size, backend)
    # Control messages (cancel flags) stay on the CPU even when the model talks over NCCL.
    return dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD


def shutdown_worker_group() -> None:
    """Leave the process group (a worker's last act); errors are ignored since the peers may be gone."""
    with contextlib.suppress(Exception):
        fs_init.destroy_model_parallel()
    with contextlib.suppress(Exception):
        if dist.is_initialized():
            dist.destroy_process_group()


def model_parallel_rank() -> int:
    return fs_init.get_model_parallel_rank()


def model_parallel_size() -> int:
    return fs_init.get_model_parallel_world_size()
