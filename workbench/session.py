"""The kernel-resident engine singleton: ``load`` once per kernel, ``current``, ``unload``.

The singleton's state lives in a module object registered in ``sys.modules`` that no file backs,
so ``importlib.reload(workbench)`` and IPython's ``%autoreload`` never reset it: a reloaded package
still finds the engine that is already loaded.
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

from .config import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_SEQ_LEN,
    Settings,
    check_positive_int,
    check_quantization,
    resolve_device,
    resolve_dtype,
)
from .engine import Engine

_STATE_MODULE = "_workbench_kernel_state"


def _state() -> types.ModuleType:
    state = sys.modules.get(_STATE_MODULE)
    if state is None:
        state = types.ModuleType(_STATE_MODULE, "workbench's kernel-resident engine (survives package reloads)")
        state.engine = None
        state.settings = None
        sys.modules[_STATE_MODULE] = state
        atexit.register(_unload_at_exit)
    return state


def _unload_at_exit() -> None:
    state = sys.modules.get(_STATE_MODULE)
    if state is not None and state.engine is not None:
        state.engine.close()
        state.engine = None


def resolve_settings(checkpoint: str | Path | None = None, *, model: str | None = None,
                     device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
                     max_batch_size: int | None = None, max_seq_len: int | None = None,
                     model_parallel_size: int | None = None, quantization: str | None = None) -> Settings:  # fmt: skip
    """Turn ``load`` arguments into concrete Settings (the embedded default model when no checkpoint)."""
    from .factory import default_checkpoint_dir

    ckpt = Path(checkpoint).expanduser() if checkpoint is not None else default_checkpoint_dir()
    dev = resolve_device(device)
    return Settings(
        checkpoint_dir=ckpt.resolve(),
        model_id=model,
        device=dev,
        dtype=resolve_dtype(dtype, dev),
        max_batch_size=check_positive_int(max_batch_size or DEFAULT_MAX_BATCH_SIZE, "max_batch_size"),
        max_seq_len=check_positive_int(max_seq_len or DEFAULT_MAX_SEQ_LEN, "max_seq_len"),
        model_parallel_size=check_positive_int(model_parallel_size or 1, "model_parallel_size"),
        quantization=check_quantization(quantization),
    )


def build_engine(settings: Settings) -> Engine:
    """Load the checkpoint described by ``settings`` (no singleton logic)."""
    from .checkpoint import check_vocab
    from .distributed import ensure_model_parallel
    from .loading import load_model_for_rank
    from .models.args import ModelArgs
    from .runner import LocalRunner
    from .tokenizer import Tokenizer

    start = time.perf_counter()
    args = ModelArgs.from_checkpoint(settings.checkpoint_dir)
    tokenizer = Tokenizer.for_checkpoint(settings.checkpoint_dir, args.family)
    check_vocab(args, tokenizer.n_words, str(settings.checkpoint_dir / "params.json"))
    ensure_model_parallel(1)
    runner = LocalRunner(load_model_for_rank(settings, args), tokenizer, settings=settings, args=args)
    return Engine(runner=runner, tokenizer=tokenizer, args=args, settings=settings, model_id=settings.model_id,
                  load_seconds=time.perf_counter() - start)  # fmt: skip


def load(checkpoint: str | Path | None = None, **kwargs: Any) -> Engine:
    """Load (or return the already loaded) engine; other settings free the old engine first."""
    settings = resolve_settings(checkpoint, **kwargs)
    state = _state()
    if state.engine is not None and state.settings == settings:
        return state.engine
    unload()
    engine = build_engine(settings)
    state.engine, state.settings = engine, settings
    return engine


def current() -> Engine | None:
    """The loaded engine, or None."""
    return _state().engine


def unload() -> None:
    """Free the loaded engine (model weights, KV cache, workers)."""
    state = _state()
    engine, state.engine, state.settings = state.engine, None, None
    if engine is not None:
        engine.close()
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
