"""Which kernels a loaded model runs, chosen at load from what this CPU can do.

Why: bf16 storage halves the weights' memory everywhere, but bf16 *arithmetic* is only fast on CPUs with
native bf16 (AVX-512-bf16, AMX).  Without it (AVX2: most laptops and many cloud CPUs) torch's bf16
matrix products and elementwise ops are several times slower than float32 ones, so a bf16 model there
ran up to 10x slower than the float32 one.  So on such a CPU the weights stay in bf16 (the memory saving
stays) and the activations are float32; each product reads the bf16 weight directly when it is
decode-sized, and widens it to float32 when it is prefill-sized (:func:`workbench.models.layers.linear`).
int4 experts run through torch's packed CPU kernel (:mod:`.int4`) whatever the ISA; the output
projection and sampling are float32 on every path.

The decision reads ``torch.backends.cpu.get_cpu_capability()``, which honours ``ATEN_CPU_CAPABILITY``
(so ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` reproduces an AVX2 machine on an AVX-512 one),
and can be forced with ``$WORKBENCH_CPU_KERNELS``:

``auto`` (default)  decide from the CPU
``native``          bf16 weights compute in bf16 (what ``auto`` picks with native bf16)
``float32``         bf16 weights, float32 arithmetic (what ``auto`` picks without)
``legacy``          the choice before kernels were chosen per CPU: bf16 arithmetic, tall bf16 weights
                    column-major, one-row bf16 products through torch's matrix-vector kernel (benchmarks'
                    "before")

``engine.settings.kernels`` (a :class:`KernelPlan`) says what runs and why; ``str()`` of it is one line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from workbench.errors import ConfigError
from workbench.models.layers import ColumnParallel, RowParallel, VocabParallel
from workbench.models.transformer import Transformer
from workbench.quantization import int4

ENV = "WORKBENCH_CPU_KERNELS"
CHOICES = ("auto", "native", "float32", "legacy")

__all__ = ["CHOICES", "ENV", "KernelPlan", "apply_plan", "choose_kernels", "cpu_isa", "native_bf16"]


@dataclass(frozen=True)
class KernelPlan:
    """What a model loaded with these settings computes with, and why."""

    device: str  # "cpu", "cuda", ...
    isa: str  # torch's CPU capability ("AVX2", "AVX512", ...); "" off the CPU
    native_bf16: bool  # the CPU has bf16 arithmetic (AVX-512-bf16 / AMX) as torch sees it
    choice: str  # one of CHOICES, as asked ($WORKBENCH_CPU_KERNELS or the argument)
    weights: str  # dtype of the unquantized weights ("float32", "bfloat16", ...)
    arithmetic: str  # dtype the activations (and so the products) are computed in
    column_major_bf16: bool  # tall bf16 weights stored column-major (a win for oneDNN's bf16 kernels only)
    one_row_as_two: bool  # one-row bf16 products computed as two rows (oneDNN instead of a slow gemv)
    int4: str | None  # int4 kernel of int4_mixed ("cpu" = torch's packed CPU kernel), None without int4
    reason: str  # why, in words

    @property
    def float32_arithmetic(self) -> bool:
        """Whether float32 activations run on weights stored narrower (bf16)."""
        return self.arithmetic != self.weights

    def __str__(self) -> str:
        return self.reason


def cpu_isa() -> str:
    """torch's CPU kernel level in this process ("AVX2", "AVX512", "DEFAULT", ...); honours ATEN_CPU_CAPABILITY."""
    return str(torch.backends.cpu.get_cpu_capability())


def native_bf16(isa: str | None = None) -> bool:
    """Whether bf16 arithmetic is native here: AVX-512 kernels on a CPU with AVX-512-bf16 or AMX."""
    isa = cpu_isa() if isa is None else isa
    if not isa.upper().startswith("AVX512"):
        return False
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def choose_kernels(
    device: str | torch.device,
    quantization: str | None,
    dtype: torch.dtype,
    *,
    choice: str | None = None,
    isa: str | None = None,
    mp_size: int = 1,
) -> KernelPlan:
    """The kernels for a model on ``device`` whose unquantized weights are ``dtype`` (bf16 under every
    quantization mode unless asked otherwise).  ``choice`` defaults to ``$WORKBENCH_CPU_KERNELS`` (else
    "auto"); ``isa`` to this process's CPU capability (tests pass "AVX2" to see that decision here)."""
    choice = _check_choice(os.environ.get(ENV, "auto") if choice is None else choice)
    dev = torch.device(device)
    weights = str(dtype).replace("torch.", "")
    int4 = _int4_kernel(dev) if quantization == "int4_mixed" else None
    int4_words = "; int4 experts through torch's packed CPU kernel" if int4 == "cpu" else ""
    if dev.type != "cpu":
        return KernelPlan(
            str(dev),
            "",
            False,
            choice,
            weights,
            weights,
            False,
            False,
            int4,
            f"{dev.type}: {weights} weights and arithmetic",
        )
    isa = cpu_isa() if isa is None else isa.upper()
    native = native_bf16(isa)
    narrow = dtype in (torch.bfloat16, torch.float16)
    if choice == "legacy":
        reason = f"{isa}: kernels as before they were chosen per CPU (legacy) - {weights} weights and arithmetic"
        return KernelPlan("cpu", isa, native, choice, weights, weights, narrow, False, int4, reason + int4_words)
    if not narrow:
        reason = f"{isa}: {weights} weights and arithmetic"
        return KernelPlan("cpu", isa, native, choice, weights, weights, False, False, int4, reason + int4_words)
    wide = choice == "float32" or (choice == "auto" and not native)
    if wide and mp_size > 1:  # fairscale's model-parallel layers need one dtype
        reason = f"{isa}: no native bf16, but model-parallel layers need one dtype - {weights} weights and arithmetic"
        return KernelPlan("cpu", isa, native, choice, weights, weights, False, False, int4, reason + int4_words)
    if wide:
        why = "no native bf16" if not native else "float32 arithmetic asked for"
        reason = (
            f"{isa}: {why} - {weights} weights, float32 arithmetic (decode-sized products read the {weights} "
            f"weights, prefill widens them; output projection and sampling float32)"
        )
        return KernelPlan("cpu", isa, native, choice, weights, "float32", False, False, int4, reason + int4_words)
    why = "native bf16" if native else "bf16 arithmetic asked for (no native bf16: slow here)"
    rows = ", one-row products as two rows" if native else ""
    reason = f"{isa}: {why} - {weights} weights and arithmetic{rows}"
    return KernelPlan("cpu", isa, native, choice, weights, weights, native, native, int4, reason + int4_words)


def apply_plan(model: Transformer, plan: KernelPlan) -> Transformer:
    """Set up ``model`` (already quantized, on its device) to run ``plan``: memory layouts of the weights,
    the activations' dtype, the one-row path.  Values of the weights are unchanged."""
    wide_dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    if plan.column_major_bf16:
        wide_dtypes += (torch.bfloat16, torch.float16)
    model.use_fast_layouts(dtypes=wide_dtypes)
    out_dtype = torch.float32 if plan.float32_arithmetic else None
    for module in model.modules():
        if isinstance(module, VocabParallel):
            module.out_dtype = out_dtype
        elif isinstance(module, (ColumnParallel, RowParallel)):
            module.one_row_as_two = plan.one_row_as_two
    return model


def _check_choice(choice: str) -> str:
    value = str(choice).strip().lower()
    if value not in CHOICES:
        raise ConfigError(
            f"{ENV}={choice!r} is not a kernel choice; use one of {', '.join(CHOICES)} "
            "(or unset it: auto decides from the CPU)"
        )
    return value


def _int4_kernel(device: torch.device) -> str:
    return int4.pick_kernel(device)
