"""Engine settings: resolving what the user asked for into one concrete, comparable record."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .errors import ConfigError

QUANTIZATION_MODES = (None, "bf16", "fp8_mixed", "int4_mixed")
DEFAULT_MAX_BATCH_SIZE = 16
DEFAULT_MAX_SEQ_LEN = 2048

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """Everything that decides what gets loaded; two equal Settings mean the same engine."""

    checkpoint_dir: Path
    model_id: str | None
    device: str
    dtype: torch.dtype
    max_batch_size: int
    max_seq_len: int
    model_parallel_size: int
    quantization: str | None

    def with_quantization(self, mode: str | None) -> Settings:
        return replace(self, quantization=check_quantization(mode, "quantization"))


def resolve_device(device: str | torch.device | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    name = str(device)
    if name.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(f"device={name!r} is not supported; use 'cpu' or 'cuda'")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but no CUDA GPU is visible to torch; use device='cpu'")
    return name


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """float32 on CPU (no native bf16 there), bfloat16 on CUDA, unless asked otherwise."""
    if dtype is None:
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ConfigError(f"dtype={dtype} is not supported; use float32, bfloat16 or float16")
        return dtype
    key = str(dtype).replace("torch.", "").lower()
    if key not in _DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[key]


def check_positive_int(value: object, name: str, source: str = "argument") -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} (from {source}) must be a positive integer")
    return value


def check_quantization(mode: object, name: str = "quantization", source: str = "argument") -> str | None:
    if mode in ("", "none", "None"):
        mode = None
    if mode not in QUANTIZATION_MODES:
        raise ConfigError(
            f"{name}={mode!r} (from {source}) is not a quantization mode; use one of "
            f"{', '.join(repr(m) for m in QUANTIZATION_MODES)}"
        )
    return mode  # type: ignore[return-value]
