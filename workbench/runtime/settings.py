"""The resolved settings of one engine — the record every runner, worker and loader is built from — and the
scalar checks shared by everything that builds one.

Resolution (arguments, environment, checkpoints.toml, defaults) lives in :mod:`workbench.config`, above
the engine; the record itself lives here, below the runners that consume it, so both can use it without
either importing the other.  Every value remembers its :class:`Source`, so an error raised long after
resolution (a shard check, a worker start-up) can still say where the value came from and how to fix it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from workbench.errors import ConfigError, QuantizationError
from workbench.quantization.kernels import KernelPlan, choose_kernels

QUANTIZATION_MODES = (None, "bf16", "fp8_mixed", "int4_mixed")

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


# --------------------------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class Source:
    """Where one setting came from, and how the user changes it there (used in every error message)."""

    kind: str  # "argument" | "environment" | "file" | "default" | "engine"
    detail: str = ""  # env var name, "[entry] in /path/checkpoints.toml", or the built-in default's name

    def describe(self) -> str:
        if self.kind == "environment":
            return f"environment variable {self.detail}"
        if self.kind == "file":
            return f"checkpoints.toml entry {self.detail}"
        if self.kind == "default":
            return "the built-in default"
        if self.kind == "engine":
            return self.detail
        return "argument"

    def fix(self, name: str) -> str:
        if self.kind == "environment":
            return f"fix or unset the environment variable {self.detail}"
        if self.kind == "file":
            key = "path" if name == "checkpoint" else name
            return f"edit `{key} = ...` in {self.detail}"
        return f"pass a valid {name}=... to workbench.load()"


ARGUMENT = Source("argument")
DEFAULT = Source("default")


def default_model_name(settings: Any) -> str | None:
    """The embedded default model's name when the settings load it, else None.  Settings resolution (the
    config layer, which knows the demo package) names it in the checkpoint's :class:`Source`, so the engine
    labels and routes the default without importing the demo package that ships it."""
    source = getattr(getattr(settings, "sources", None), "get", lambda _: None)("checkpoint")
    if getattr(source, "kind", None) == "default":
        return getattr(source, "detail", "") or None
    return None


def setting_problem(name: str, value: Any, source: Source, what: str) -> ConfigError:
    """The error for a bad setting: its name, value and where it came from, what is wrong, and the fix there."""
    return ConfigError(f"{name}={value!r} (from {source.describe()}) {what}; {source.fix(name)}")


# --------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings:
    """Everything that decides what gets loaded; two equal Settings mean the same engine.

    ``sources`` (not part of equality) maps each ``load()`` keyword to the :class:`Source` it came
    from, for error messages raised long after resolution (shard checks, worker start-up).
    """

    checkpoint_dir: Path
    model_id: str | None
    device: str
    dtype: torch.dtype
    max_batch_size: int
    max_seq_len: int
    model_parallel_size: int  # 0 until check_settings() replaces "auto" by the shard count
    quantization: str | None
    batch_invariant: bool = False  # the batch-invariant kernels (workbench.models.invariant)
    sources: dict[str, Source] = field(default_factory=dict, compare=False, repr=False)

    def with_quantization(self, mode: str | None) -> Settings:
        """These settings under another quantization mode.  A dtype nobody asked for follows the mode (see
        :func:`resolve_dtype`), so toggling a default-loaded engine to fp8_mixed stores its unquantized parts
        in bfloat16, as loading it that way would; an explicit dtype stays."""
        mode = check_quantization(mode, "quantization")
        sources = {**self.sources, "quantization": Source("engine", "engine.set_quantization()")}
        dtype = self.dtype
        if self.source("dtype").kind == "default":
            dtype = resolve_dtype(None, self.device, quantization=mode)
        return replace(self, quantization=mode, dtype=dtype, sources=sources)

    def with_batch_invariant(self, enabled: bool) -> Settings:
        """These settings with the batch-invariant kernels on or off (``engine.batch_invariant = ...``)."""
        sources = {**self.sources, "batch_invariant": Source("engine", "engine.batch_invariant")}
        return replace(self, batch_invariant=enabled, sources=sources)

    @property
    def kernels(self) -> KernelPlan:
        """The kernels a model loaded with these settings runs on this machine, and why (``str()``: one line,
        e.g. "AVX2: no native bf16 - bfloat16 weights, float32 arithmetic ...").  Decided from the CPU at
        load (:func:`workbench.quantization.kernels.choose_kernels`; ``$WORKBENCH_CPU_KERNELS`` forces one)."""
        weights = torch.bfloat16 if self.quantization == "bf16" else self.dtype
        return choose_kernels(self.device, self.quantization, weights, mp_size=max(self.model_parallel_size, 1))

    def identity(self) -> tuple[Any, ...]:
        """Plain-data key of the settings: equal keys mean the same engine.

        Comparing keys rather than Settings objects keeps the singleton working after
        ``importlib.reload(workbench.config)`` (a reloaded module defines a new ``Settings`` class,
        and dataclass equality requires the very same class).
        """
        return (
            str(self.checkpoint_dir),
            self.model_id,
            self.device,
            str(self.dtype),
            self.max_batch_size,
            self.max_seq_len,
            self.model_parallel_size,
            self.quantization,
            self.batch_invariant,
        )

    def source(self, name: str) -> Source:
        return self.sources.get(name, ARGUMENT)


# --------------------------------------------------------------------------------------------- scalar checks
def resolve_device(device: str | torch.device | None, source: Source = ARGUMENT) -> str:
    """'cuda' when a GPU is visible, else 'cpu'; an explicit device must exist."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    name = str(device)
    if name.split(":")[0] not in ("cpu", "cuda"):
        raise setting_problem("device", name, source, "is not supported: use 'cpu' or 'cuda'")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise setting_problem("device", name, source, "but no CUDA GPU is visible to torch: use device='cpu'")
    return name


def resolve_dtype(
    dtype: str | torch.dtype | None, device: str, source: Source = ARGUMENT, *, quantization: str | None = None
) -> torch.dtype:
    """The dtype of the weights a quantization mode leaves unquantized (all of them without one).

    Unless asked otherwise: bfloat16 under any quantization mode, on every device — as Llama Stack's
    meta-reference builds its quantized models — so memory falls from bf16 to fp8_mixed to int4_mixed;
    without quantization float32 on CPU (no native bf16 there: fp32 matmuls are faster) and bfloat16 on CUDA.
    """
    if dtype is None:
        if quantization is not None or device.startswith("cuda"):
            return torch.bfloat16
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise setting_problem("dtype", dtype, source, "is not supported: use float32, bfloat16 or float16")
        return dtype
    key = str(dtype).replace("torch.", "").lower()
    if key not in _DTYPES:
        raise setting_problem("dtype", dtype, source, f"is not one of {sorted(_DTYPES)}")
    return _DTYPES[key]


def check_positive_int(value: object, name: str, source: Source | str = ARGUMENT, *, allow_zero: bool = False) -> int:
    """An integer >= 1 (>= 0 with ``allow_zero``); digit strings (environment values) are accepted."""
    src = source if isinstance(source, Source) else Source("engine", source)
    if isinstance(value, str) and re.fullmatch(r"\+?[0-9]+", value.strip()):  # ASCII digits: "²" is no number
        value = int(value.strip())
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        what = (
            "must be an integer >= 0 (0 = one rank per checkpoint shard)"
            if allow_zero
            else ("must be a positive integer")
        )
        raise setting_problem(name, value, src, what)
    return value


def check_flag(value: object, name: str, source: Source | str = ARGUMENT) -> bool:
    """A boolean setting: True/False, or (environment values) 1/0, true/false, yes/no, on/off."""
    src = source if isinstance(source, Source) else Source("engine", source)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise setting_problem(name, value, src, "must be True or False (1/0 in the environment)")


def check_quantization(mode: object, name: str = "quantization", source: Source | str = ARGUMENT) -> str | None:
    """None (or 'none') for no quantization, else one of QUANTIZATION_MODES."""
    src = source if isinstance(source, Source) else Source("engine", source)
    if mode in ("", "none", "None"):
        mode = None
    if mode not in QUANTIZATION_MODES:
        problem = setting_problem(
            name, mode, src, f"is not a quantization mode: use one of {', '.join(repr(m) for m in QUANTIZATION_MODES)}"
        )
        raise QuantizationError(str(problem))
    return mode  # type: ignore[return-value]
