"""The kernel-resident engine singleton: ``load`` once per kernel, ``current``, ``unload``.

A Llama 4 Scout load takes minutes and most of the machine's memory, so a notebook must never hold
two engines or load the same one twice.  ``load`` returns the loaded engine when the *effective*
settings (after arguments, environment, checkpoints.toml and defaults are resolved) are unchanged,
and otherwise frees the old engine before loading the new one.

The singleton's state lives in a module object registered in ``sys.modules`` that no file backs,
so ``importlib.reload(workbench)``, ``importlib.reload(workbench.session)`` and IPython's
``%autoreload`` never reset it (autoreload skips modules without a file): a reloaded package still
finds the engine that is already loaded.  Settings are compared by a plain-data key, so even a
reloaded ``workbench.config`` (a new ``Settings`` class) recognises the loaded engine.
"""

from __future__ import annotations

import atexit
import gc
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

from workbench.checkpoints.load import check_vocab
from workbench.config import Settings, check_settings, resolve_settings, unknown_setting_error
from workbench.engine.engine import Engine
from workbench.engine.interfaces import Runner
from workbench.formats.tokenizer import Tokenizer
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.runtime import ParallelRunner
from workbench.runtime.loading import load_model_for_rank
from workbench.runtime.local import LocalRunner

__all__ = ["build_engine", "current", "load", "resolve_settings", "unload"]

_STATE_MODULE = "_workbench_kernel_state"


def _state() -> types.ModuleType:
    state = sys.modules.get(_STATE_MODULE)
    if state is None:
        state = types.ModuleType(_STATE_MODULE, "workbench's kernel-resident engine (survives package reloads)")
        state.engine = None
        state.loads = 0  # engines built through load(): lets tests and users see that nothing loaded twice
        sys.modules[_STATE_MODULE] = state
        atexit.register(_unload_at_exit)  # once per interpreter: the state module is created once
    return state


def _unload_at_exit() -> None:
    state = sys.modules.get(_STATE_MODULE)
    if state is not None and state.engine is not None:
        engine, state.engine = state.engine, None
        try:
            engine.close()
        except Exception:  # interpreter shutdown: nothing useful to report
            pass


def _usable(engine: Engine) -> bool:
    """False once the engine was closed or its model-parallel workers failed."""
    return not engine.closed and bool(getattr(engine.runner, "alive", True))


def _resident_bytes(engine: Engine) -> int:
    """Weights + KV cache of a loaded engine on the same kind of device (freed before the next load)."""
    try:
        memory = engine.memory()
        return int(memory["weights_bytes"]) + int(memory["kv_cache_bytes"])
    except Exception:  # a failed worker: nothing to count on
        return 0


def build_engine(settings: Settings) -> Engine:
    """Load the checkpoint described by ``settings`` (no singleton logic).

    The folder is checked against the settings first (:func:`~workbench.config.check_settings`),
    so a bad path or a model-parallel size that does not fit fails before any worker is spawned.
    """

    start = time.perf_counter()
    settings = check_settings(settings)
    args = ModelArgs.from_checkpoint(settings.checkpoint_dir)
    tokenizer = Tokenizer.for_checkpoint(settings.checkpoint_dir, args.family)
    check_vocab(args, tokenizer.n_words, str(settings.checkpoint_dir / "params.json"))
    runner: Runner
    if settings.model_parallel_size == 1:
        ensure_model_parallel(1)
        model = load_model_for_rank(settings, args, progress=None)
        runner = LocalRunner(model, tokenizer, settings=settings, args=args)
    else:
        runner = ParallelRunner(settings, args, tokenizer)
    return Engine(
        runner=runner,
        tokenizer=tokenizer,
        args=args,
        settings=settings,
        model_id=settings.model_id,
        load_seconds=time.perf_counter() - start,
    )


def load(
    checkpoint: str | Path | None = None,
    *,
    model: str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_batch_size: int | None = None,
    max_seq_len: int | None = None,
    model_parallel_size: int | None = None,
    quantization: str | None = None,
    batch_invariant: bool | None = None,
    load_vision: bool = False,
    compile: bool = False,
    cuda_graphs: bool = False,
    **unknown: Any,
) -> Engine:
    """Load the engine, or return the loaded one when the effective settings are the same.

    ``checkpoint`` is a folder or the name of a checkpoints.toml entry; unset keywords come from the
    environment (Llama Stack's variables), then checkpoints.toml, then defaults (see
    :mod:`workbench.config`).  ``model_parallel_size`` > 1 starts one worker process per rank
    (``0`` = one per checkpoint shard).  Other settings free the old engine first — its weights,
    KV cache and workers — so only one model is ever resident.  Bad settings raise before the old
    engine is touched.  A Llama 4 checkpoint's vision encoder is loaded at the first image, or at once with
    ``load_vision=True`` (which also works on the already loaded engine).  ``compile=True`` runs
    decode steps through ``torch.compile`` (see :meth:`Engine.compile_decode`; the compile time is in
    ``info()["compile_seconds"]``), also on the already loaded engine.  ``cuda_graphs=True`` decodes through
    CUDA graphs per batch/span bucket (see :meth:`Engine.use_cuda_graphs`; capture time in
    ``info()["cuda_graphs"]``); on a CPU the same fixed-shape steps run uncaptured.  ``batch_invariant=True``
    (also ``WORKBENCH_BATCH_INVARIANT=1`` or ``batch_invariant = true`` in checkpoints.toml) runs the
    batch-invariant kernels: a row's logits, log-probabilities and tokens do not depend on its neighbours (see
    docs/design/batch-invariance.md).
    """
    if unknown:
        raise unknown_setting_error(next(iter(unknown)))
    engine = _load(
        checkpoint,
        model=model,
        device=device,
        dtype=dtype,
        max_batch_size=max_batch_size,
        max_seq_len=max_seq_len,
        model_parallel_size=model_parallel_size,
        quantization=quantization,
        batch_invariant=batch_invariant,
    )
    if load_vision:
        engine.load_vision()
    if compile and engine.compile_seconds is None:
        engine.compile_decode()
    if cuda_graphs and engine.cuda_graphs is None:
        engine.use_cuda_graphs()
    return engine


def _load(checkpoint: str | Path | None, **kwargs: Any) -> Engine:
    settings = resolve_settings(checkpoint, **kwargs)
    state = _state()
    loaded = state.engine
    if loaded is not None and _usable(loaded) and loaded.settings.identity() == settings.identity():
        return loaded  # fast path: no filesystem access when nothing changed
    reclaimable = _resident_bytes(loaded) if loaded is not None and _usable(loaded) else 0
    # may resolve model_parallel_size=0; raises before unloading (the old engine's memory counts as free)
    settings = check_settings(settings, reclaimable_bytes=reclaimable)
    if loaded is not None and _usable(loaded) and loaded.settings.identity() == settings.identity():
        return loaded
    unload()
    engine = build_engine(settings)
    state.engine = engine
    state.loads += 1
    return engine


def current() -> Engine | None:
    """The loaded engine, or None (also after it was closed by hand)."""
    state = _state()
    if state.engine is not None and state.engine.closed:
        state.engine = None
    return state.engine


def unload() -> None:
    """Free the loaded engine: model weights, KV cache and worker processes.

    On CUDA the caching allocator's free blocks are returned to the driver too, so other
    processes (and ``nvidia-smi``) see the memory come back.
    """
    state = _state()
    engine, state.engine = state.engine, None
    if engine is not None:
        try:
            engine.close()
        finally:
            del engine
            gc.collect()
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
