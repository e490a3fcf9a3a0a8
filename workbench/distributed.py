"""torch.distributed + fairscale model-parallel bootstrap.

fairscale's parallel layers ask for the model-parallel group even at size 1, and
``initialize_model_parallel`` raises if called twice, so every entry point goes through
:func:`ensure_model_parallel`, which is idempotent.  In the kernel process (size 1) a single-rank
gloo group over an in-memory store is used: no port, no file, no peers.
"""

from __future__ import annotations

import contextlib
import io

import torch.distributed as dist
from fairscale.nn.model_parallel import initialize as fs_init

from .errors import ConfigError


def ensure_model_parallel(size: int = 1, backend: str = "gloo") -> None:
    """Make sure torch.distributed and fairscale model parallelism are up with ``size`` ranks.

    With ``size == 1`` and no process group yet, a private single-rank group is created.  With a
    larger size the caller (a worker process) must have initialised the process group already.
    """
    if not dist.is_initialized():
        if size != 1:
            raise ConfigError(
                f"model_parallel_size={size} needs a process group; use workbench.load(..., model_parallel_size={size}), "
                "which starts one worker per rank"
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


def model_parallel_rank() -> int:
    return fs_init.get_model_parallel_rank()


def model_parallel_size() -> int:
    return fs_init.get_model_parallel_world_size()
