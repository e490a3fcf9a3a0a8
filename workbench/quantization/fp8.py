"""float8 (e4m3) weights with one scale per output row, and the two ways to multiply by them.

Format: ``W[n, :] ~= q[n, :] * scale[n]`` with ``q`` in ``torch.float8_e4m3fn`` ([..., N, K], the
``[out, in]`` orientation of ``nn.Linear``) and ``scale`` float32 ([..., N]).  The scale maps each
row's largest magnitude to 448, e4m3's largest finite value, so every row uses the full 4-bit
exponent range; a row's relative rounding error is at most 2**-4 (3 mantissa bits) for values
above the subnormal range.

Kernels:

* ``"scaled_mm"`` (CUDA GPUs with fp8 tensor cores, compute capability >= 8.9): activations are
  quantized per token to e4m3 with a scale capped at ``activation_scale_ub / 448`` (Meta's bound
  1200 keeps one outlier token from crushing the others' resolution) and ``torch._scaled_mm``
  multiplies with row-wise scales on both sides, bf16 out.  Checked once per device against the
  dequantizing path before it is trusted (:func:`scaled_mm_works`).
* ``"dequant"`` (everywhere else, CPU included): the weight is widened at use and the row scale is
  applied to the *output* (``y = (x @ q^T) * scale``, exact algebra, N multiplies per token instead
  of N*K).  On CPU torch's own fp8 -> float cast is scalar and ~6x slower than re-interpreting the
  e4m3 bits as float16 (:func:`e4m3_to_half_scaled`), so that is used.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
import torch.nn.functional as F

from workbench.errors import QuantizationError

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
ACTIVATION_SCALE_UB = 1200.0  # Meta's fp8_activation_scale_ub
_MIN_AMAX = 1e-12  # an all-zero row still gets a finite, positive scale
_HALF_BIAS = 256.0  # e4m3 bits placed in a float16 read 2**-8 of their value (exponent bias 15 vs 7)

Fp8Kernel = Literal["scaled_mm", "dequant"]


def quantize_rowwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [..., N, K] (any float dtype) -> (e4m3 ``q`` [..., N, K], float32 ``scale`` [..., N]).

    Stacks (experts) are quantized one matrix at a time so the float32 working copy stays the size
    of one matrix, not of the whole stack.
    """
    if w.dim() > 2:
        pairs = [quantize_rowwise(m) for m in w]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    w32 = w.float()  # [N, K]
    scale = w32.abs().amax(dim=-1).clamp(min=_MIN_AMAX) / FP8_MAX  # [N]
    q = (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # [N, K]
    return q, scale


def e4m3_to_half_scaled(q: torch.Tensor) -> torch.Tensor:
    """e4m3 codes -> float16 holding ``value / 256``, exactly, for every finite code.

    e4m3fn is ``s eeee mmm`` with exponent bias 7; shifting the 7 magnitude bits left by 7 makes a
    float16 ``s eeeee mmmmmmmmmm`` with the same exponent field read under bias 15, i.e. the value
    times 2**-8 — for subnormals too (both formats' subnormals scale the same way).  Integer ops only,
    so it is fast where the native cast is not (CPU).
    """
    u = q.view(torch.uint8).to(torch.int16)  # [..., N, K]
    magnitude = (u & 0x7F).bitwise_left_shift_(7)
    return magnitude.bitwise_or_((u & 0x80).bitwise_left_shift_(8)).view(torch.float16)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(``q`` [..., N, K], ``scale`` [..., N]) -> ``W`` [..., N, K] in ``dtype`` (products taken in float32)."""
    return (q.float() * scale.float()[..., None]).to(dtype)


def quantize_per_token(x: torch.Tensor, activation_scale_ub: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations ``x`` [M, K] -> (e4m3 [M, K], float32 scale [M, 1]); scales are capped at ub / 448."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()  # [M, 1]
    scale = amax.clamp(min=_MIN_AMAX, max=activation_scale_ub) / FP8_MAX
    xq = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # [M, K]
    return xq, scale


def linear(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    *,
    kernel: Fp8Kernel,
    activation_scale_ub: float = ACTIVATION_SCALE_UB,
) -> torch.Tensor:
    """``x`` [M, K] @ W^T for W = (``q`` [N, K], ``scale`` [N]) -> [M, N] in ``x.dtype``."""
    if kernel == "scaled_mm":
        return _scaled_mm_linear(x, q, scale, activation_scale_ub)
    w = e4m3_to_half_scaled(q).to(x.dtype)  # [N, K], value / 256 (exact in bf16/fp16/fp32)
    return F.linear(x, w) * (scale * _HALF_BIAS).to(x.dtype)  # [M, N]


def _scaled_mm_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, ub: float) -> torch.Tensor:
    m = x.shape[0]
    pad = -m % 16  # _scaled_mm wants every dimension a multiple of 16
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    xq, x_scale = quantize_per_token(x, ub)  # [M', K], [M', 1]
    y = torch._scaled_mm(xq, q.t(), scale_a=x_scale, scale_b=scale.float()[None, :], out_dtype=torch.bfloat16)
    return y[:m].to(x.dtype)  # [M, N]


# ------------------------------------------------------------------------------------------ capabilities
@functools.cache
def storage_supported(device: str) -> bool:
    """Whether float8 tensors can be created and widened on ``device`` (the minimum fp8_mixed needs)."""
    try:
        t = torch.tensor([1.5, -3.0], device=device).to(FP8_DTYPE)
        return bool((t.float() == torch.tensor([1.5, -3.0], device=device)).all())
    except (RuntimeError, TypeError):
        return False


def check_storage(device: torch.device | str) -> None:
    """Raise :class:`QuantizationError` when ``device`` cannot hold float8 weights."""
    if not storage_supported(str(device)):
        raise QuantizationError(
            f"fp8_mixed needs float8_e4m3fn tensors, which torch {torch.__version__} cannot create on device "
            f"{str(device)!r}; use quantization='int4_mixed' or 'bf16' on this device, or load on a CUDA GPU"
        )


@functools.cache
def scaled_mm_works(device: str) -> bool:
    """True on CUDA GPUs with fp8 tensor cores where row-wise ``torch._scaled_mm`` gives the right answer.

    The kernel's availability depends on the GPU, the torch build and the CUDA version, so instead of
    trusting a capability table it is run once on a small problem and compared with the dequantizing
    path; any error or mismatch selects ``"dequant"``.
    """
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability(dev) < (8, 9):
        return False
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(5, 64, generator=gen).to(device=dev, dtype=torch.bfloat16)  # [M, K]
        q, scale = quantize_rowwise(torch.randn(48, 64, generator=gen).to(dev))  # [N, K], [N]
        got = _scaled_mm_linear(x, q, scale, ACTIVATION_SCALE_UB).float()
        want = linear(x.float(), q, scale, kernel="dequant")
        return bool(torch.allclose(got, want, rtol=0.1, atol=0.1 * float(want.abs().mean())))
    except RuntimeError:
        return False


def pick_kernel(device: torch.device | str) -> Fp8Kernel:
    """``"scaled_mm"`` where it works (its output is bf16, cast to the model dtype), else ``"dequant"``."""
    return "scaled_mm" if scaled_mm_works(str(torch.device(device))) else "dequant"
