"""In-process model runner: owns the model and the scheduler when model_parallel_size == 1."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from workbench.formats.tokenizer import Tokenizer
from workbench.generation import Event, Request, Scheduler
from workbench.generation.constraints import GrammarRuntime
from workbench.models.args import ModelArgs
from workbench.models.transformer import Transformer
from workbench.runtime.loading import load_model_for_rank
from workbench.runtime.memory import model_memory
from workbench.runtime.settings import Settings
from workbench.runtime.token_ids import image_token, stop_token_reasons


class LocalRunner:
    """Runs the model in this process (model_parallel_size == 1)."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, *, settings: Settings, args: ModelArgs) -> None:
        self.tokenizer = tokenizer
        self.settings = settings
        self.args = args
        self._start(model)

    def _start(self, model: Transformer) -> None:
        self.model = model
        self.scheduler = Scheduler(
            model,
            stop_tokens=stop_token_reasons(self.tokenizer),
            decode_text=self.tokenizer.decode,
            max_batch_size=self.settings.max_batch_size,
            max_seq_len=self.settings.max_seq_len,
            grammars=GrammarRuntime(self.tokenizer),
            image_token=image_token(self.tokenizer, self.args),
        )

    def reload(self, settings: Settings) -> None:
        """Replace the model with one loaded under ``settings`` (old one freed first: one model resident)."""

        self.close()
        gc.collect()
        self.settings = settings
        self._start(load_model_for_rank(settings, self.args, progress=None))

    def generate(self, requests: Sequence[Request]) -> Iterator[Event]:
        return self.scheduler.generate(requests)

    def step(self, add: Sequence[Request] = (), cancel: Sequence[int] = ()) -> list[Event]:
        """One step of the running batch (:meth:`~workbench.generation.Scheduler.step`): the engine's loop."""
        return self.scheduler.step(add, cancel)

    def load_vision(self) -> None:
        """Load the vision encoder now instead of at the first image."""
        self.model.ensure_vision()

    @property
    def vision_loaded(self) -> bool:
        return self.model.vision_loaded

    def compile_decode(self, enabled: bool = True) -> None:
        self.model.compile_decode(enabled)

    def use_cuda_graphs(self, enabled: bool = True) -> dict[str, Any] | None:
        """Fixed-shape decode steps, captured as CUDA graphs on a GPU (uncaptured elsewhere); their info."""
        on_gpu = self.model.device.type == "cuda"
        static = self.scheduler.use_static_decode(enabled, capture=on_gpu)
        if static is None:
            return None
        info = static.info()
        if not on_gpu:
            info["fallback"] = "no CUDA device: the fixed-shape steps run uncaptured (same tokens)"
        return info

    def logits(self, token_lists: Sequence[Sequence[int]], images: Sequence[Any] | None = None) -> list[torch.Tensor]:
        return self.scheduler.logits(token_lists, images)

    def score(
        self, sequences: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        return self.scheduler.score(sequences, starts)

    def parameter_count(self) -> int:
        return self.model.parameter_count()

    def memory(self) -> dict[str, Any]:
        return model_memory(self.model, self.scheduler.cache.nbytes())

    @property
    def alive(self) -> bool:
        return self.model is not None

    def close(self) -> None:
        """Drop the model and cache *and* free their storage.

        Freeing the storage (parameters and buffers moved to the meta device) matters in a notebook:
        after an interrupted or failed cell, ``sys.last_traceback`` keeps the scheduler's and the
        model's frames alive, so merely dropping our references would not return the memory.
        """
        scheduler, model = self.scheduler, self.model
        self.scheduler = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]
        if scheduler is not None:
            scheduler.close()
        if model is not None:
            try:
                model.to("meta")
            except Exception:  # a quantized module that cannot move: dropping references must do
                pass
