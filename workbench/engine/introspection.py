"""What an engine holds, in numbers and words: ``info()``, ``memory()``, its repr and HTML card, and
:func:`model_label` (its model id, or what the embedded default is)."""

from __future__ import annotations

from typing import Any

import torch

from workbench import runs
from workbench.engine.interfaces import ModelIdentity, Runner
from workbench.models.args import ModelArgs
from workbench.models.llama32_vision import is_cross_attention_vision
from workbench.reports import InfoReport, MemoryReport
from workbench.runtime.settings import Settings, default_model_name
from workbench.types import present


class IntrospectionMixin:
    """The Engine's introspection methods (they read its public runner, settings and compile state)."""

    runner: Runner
    settings: Settings
    args: ModelArgs
    model_id: str | None
    family: str
    load_seconds: float
    compile_seconds: float | None
    cuda_graphs: dict[str, Any] | None
    closed: bool
    max_batch_size: int
    max_seq_len: int

    def _vision_state(self) -> str | None:
        if self.args.vision_args is None and not is_cross_attention_vision(self.args):
            return None
        return "loaded" if getattr(self.runner, "vision_loaded", False) else "not loaded"

    def info(self) -> dict[str, Any]:
        """Model id, family, sizes, dtype, device, parallelism, quantization, memory and the run store's file.

        A dict of raw numbers (``info()["weights_bytes"]`` is an int) that displays with human sizes;
        ``.readable()`` gives the human strings.
        """
        memory = self.runner.memory()
        return InfoReport(
            {
                "model_id": self.model_id,
                "family": self.family,
                "checkpoint": str(self.settings.checkpoint_dir),
                "parameters": self.runner.parameter_count(),
                "dtype": self._compute_dtype(),
                "device": str(self.settings.device),
                "model_parallel_size": self.settings.model_parallel_size,
                "quantization": self.settings.quantization,
                "kernels": str(self.settings.kernels),  # what runs on this CPU and why (quantization.kernels)
                "vision": self._vision_state(),
                "max_batch_size": self.max_batch_size,
                "max_seq_len": self.max_seq_len,
                "weights_bytes": memory["weights_bytes"],
                "kv_cache_bytes": memory["kv_cache_bytes"],
                "load_seconds": round(self.load_seconds, 2),
                "compile_seconds": None if self.compile_seconds is None else round(self.compile_seconds, 2),
                "cuda_graphs": self.cuda_graphs,
                "run_store": str(runs.path()),  # where run="name" remembers rows ($WORKBENCH_STORE or the data folder)
            }
        )

    def _compute_dtype(self) -> str:
        """bf16 mode runs the whole model in bfloat16, whatever dtype was asked for at load."""
        dtype = torch.bfloat16 if self.settings.quantization == "bf16" else self.settings.dtype
        return str(dtype).replace("torch.", "")

    def memory(self) -> dict[str, Any]:
        """Bytes of parameters (by dtype and by module kind) and of the KV cache; ``packed_bytes``: extra
        weight copies kept for faster CPU kernels (the output projection's oneDNN-packed copy).

        A dict of raw byte counts that displays in KiB/MiB/GiB (``.readable()`` for the strings).
        """
        return MemoryReport(self.runner.memory())

    def __repr__(self) -> str:
        if self.closed:
            return f"Engine(model={model_label(self)!r}, family={self.family}, unloaded)"
        i = self.info()
        return (  # one field per line: notebooks wrap long lines mid-word
            f"Engine(model={model_label(self)!r},\n"
            f"       family={i['family']}, params={i['parameters'] / 1e6:.1f}M, dtype={i['dtype']},\n"
            f"       device={i['device']}, mp={i['model_parallel_size']}, quantization={i['quantization']},\n"
            f"       weights={_fmt_bytes(i['weights_bytes'])}, kv_cache={_fmt_bytes(i['kv_cache_bytes'])})"
        )

    def _repr_html_(self) -> str:
        return present("engine_html", self)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f}{unit}" if unit != "B" else f"{n}B"
        n /= 1024
    return f"{n}B"


def model_label(engine: ModelIdentity) -> str:
    """What the engine runs, in words: its model id, or what the embedded default is."""
    settings = engine.settings
    default = default_model_name(settings)
    if default:
        return f"embedded default: {default}"
    if engine.model_id:
        return str(engine.model_id)
    return f"{engine.family} checkpoint {settings.checkpoint_dir.name}"
