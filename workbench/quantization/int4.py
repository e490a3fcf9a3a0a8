"""Group-wise asymmetric int4 weights and the matmuls that use them.

Format (torch's "tinygemm" convention, so its kernels run it as stored): a weight ``W`` [N, K] is cut
into groups of ``g`` consecutive input columns; each (row, group) has a ``scale`` and a ``zero`` and
holds codes ``q`` in 0..15 with ``W ~= (q - 8) * scale + zero``.  ``scale = (max - min) / 15`` and
``zero = min + 8 * scale``, so the 16 levels span exactly the group's range and the rounding error is
at most ``scale / 2`` per weight.  Scales and zeros are stored as bfloat16 ``[G, N, 2]`` (4 bytes per
group: at g=128 that is 0.25 bit per weight) and rounded *before* the codes are chosen, so the codes
are the best ones for the stored parameters.

Group size: 128, unless a smaller one (64, 32; the kernels take no others) stores the row in fewer
bytes.  K that no group size divides is zero-padded up to a multiple of the group (the padded
activations are zero, so what the padded codes hold never matters); the choice minimises
``K_padded / 2 + 4 * groups`` bytes per row.  Examples: K=128 -> 128, K=448 -> 64 (no padding),
K=224 -> 128 (padded to 256), K=176 -> 64 (padded to 192).  N is padded to a multiple of 16 (the
CPU packing needs it) and the extra outputs are dropped.

Kernels:

* ``"cpu"``: ``torch._weight_int4pack_mm_for_cpu`` on ``torch._convert_weight_to_int4pack_for_cpu``
  packing.  Activations enter the kernel as bf16 (its float32 path is 30-50x slower on AVX2 CPUs) and
  its output is cast back to the model dtype, so the rest of the model keeps computing in float32.
* ``"cuda"``: ``torch._weight_int4pack_mm`` on ``torch._convert_weight_to_int4pack`` (tensor-core
  tiles, Ampere and newer), bf16 activations.
* ``"dequant"``: our own nibble packing, widened to the activation dtype at use (any device).

Each kernel is run once per device on a small problem and compared with ``"dequant"`` before it is
used (:func:`pick_kernel`), so a torch build or GPU without it silently gets the portable path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

GROUP_SIZES = (128, 64, 32)  # preference order; the int4 kernels accept 32, 64, 128, 256
N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu needs N % 16 == 0 (CUDA: N % 8)
SCALE_DTYPE = torch.bfloat16
_MIN_RANGE = 1e-6

Int4Kernel = Literal["cpu", "cuda", "dequant"]


@dataclass(frozen=True)
class Int4Layout:
    """Shape facts of one quantized ``[n, k]`` matrix (``n`` outputs, ``k`` inputs)."""

    n: int
    k: int
    group_size: int
    n_padded: int
    k_padded: int

    @property
    def groups(self) -> int:
        return self.k_padded // self.group_size


def plan_layout(n: int, k: int) -> Int4Layout:
    """Pick the group size that stores a row of ``k`` inputs in the fewest bytes (ties: larger group)."""
    best: tuple[int, int, int] | None = None  # (bytes per row, group, padded k)
    for g in GROUP_SIZES:
        k_padded = -(-k // g) * g
        row_bytes = k_padded // 2 + (k_padded // g) * 4
        if best is None or row_bytes < best[0]:
            best = (row_bytes, g, k_padded)
    assert best is not None
    return Int4Layout(n=n, k=k, group_size=best[1], n_padded=-(-n // N_MULTIPLE) * N_MULTIPLE, k_padded=best[2])


def quantize_groupwise(w: torch.Tensor, layout: Int4Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [N, K] -> (codes uint8 [N', K'] in 0..15, scales_and_zeros bf16 [G, N', 2]) on ``w.device``."""
    n, k = w.shape
    assert (n, k) == (layout.n, layout.k), f"weight {tuple(w.shape)} does not match layout {layout}"
    w32 = w.float()  # [N, K]
    if layout.k_padded > k:  # repeat the row's last value: the last group's range is unchanged
        w32 = torch.cat([w32, w32[:, -1:].expand(n, layout.k_padded - k)], dim=1)  # [N, K']
    if layout.n_padded > n:
        w32 = F.pad(w32, (0, 0, 0, layout.n_padded - n))  # [N', K']
    groups = w32.view(layout.n_padded, layout.groups, layout.group_size)  # [N', G, g]
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # [N', G]
    scale = ((high - low).clamp(min=_MIN_RANGE) / 15).to(SCALE_DTYPE).float()  # [N', G], rounded as stored
    zero = (low + 8 * scale).to(SCALE_DTYPE).float()  # [N', G]
    codes = ((groups - zero[..., None]) / scale[..., None] + 8).round_().clamp_(0, 15)  # [N', G, g]
    codes = codes.to(torch.uint8).view(layout.n_padded, layout.k_padded)  # [N', K']
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(SCALE_DTYPE)
    return codes, scales_and_zeros  # [N', K'], [G, N', 2]


def _nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] -> uint8 [N, K/2], even columns in the high nibble (the CUDA kernel's input order)."""
    return (codes[:, ::2] << 4) | codes[:, 1::2]


def _unnibble(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_nibbles`: uint8 [N, K/2] -> codes uint8 [N, K]."""
    return torch.stack([packed >> 4, packed & 0x0F], dim=-1).flatten(-2)


def _inner_k_tiles(k_padded: int) -> int:
    return next(t for t in (8, 4, 2) if k_padded % (t * 16) == 0)


def pack(codes: torch.Tensor, layout: Int4Layout, kernel: Int4Kernel) -> torch.Tensor:
    """Codes [N', K'] -> the storage ``kernel`` multiplies by (a uint8 or int32 tensor, N'*K'/2 bytes)."""
    if kernel == "cpu":
        return torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)  # uint8 [N', K'/2]
    if kernel == "cuda":
        return torch._convert_weight_to_int4pack(_nibbles(codes).contiguous(), _inner_k_tiles(layout.k_padded))
    return _nibbles(codes).contiguous()  # uint8 [N', K'/2]


def dequantize_codes(
    codes: torch.Tensor, scales_and_zeros: torch.Tensor, layout: Int4Layout, dtype: torch.dtype
) -> torch.Tensor:
    """Codes [N', K'] + scales_and_zeros [G, N', 2] -> ``W`` [N', K'] in ``dtype`` (float32 arithmetic)."""
    sz = scales_and_zeros.float().transpose(0, 1)  # [N', G, 2]
    groups = codes.view(layout.n_padded, layout.groups, layout.group_size).float()  # [N', G, g]
    w = (groups - 8) * sz[..., 0:1] + sz[..., 1:2]
    return w.view(layout.n_padded, layout.k_padded).to(dtype)


def linear(
    x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, layout: Int4Layout, kernel: Int4Kernel
) -> torch.Tensor:
    """``x`` [M, K] @ W^T -> [M, N] in ``x.dtype``."""
    out_dtype = x.dtype
    if layout.k_padded > layout.k:
        x = F.pad(x, (0, layout.k_padded - layout.k))  # [M, K']
    if kernel == "cpu":
        y = torch._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16).contiguous(), packed, layout.group_size, scales_and_zeros
        )
    elif kernel == "cuda":
        y = torch._weight_int4pack_mm(x.to(torch.bfloat16).contiguous(), packed, layout.group_size, scales_and_zeros)
    else:
        y = F.linear(x, dequantize_codes(_unnibble(packed), scales_and_zeros, layout, x.dtype))
    if layout.n_padded > layout.n:
        y = y[:, : layout.n]
    return y.to(out_dtype)  # [M, N]


def dequantize(
    packed: torch.Tensor,
    scales_and_zeros: torch.Tensor,
    layout: Int4Layout,
    kernel: Int4Kernel,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The ``[N, K]`` weight a packed matrix stands for (for inspection and tests, not the forward pass).

    Kernel layouts are opaque (tiled), so for them the weight is read back through the kernel itself
    by multiplying the identity: ``I @ W^T = W^T``.
    """
    if kernel == "dequant":
        w = dequantize_codes(_unnibble(packed), scales_and_zeros, layout, torch.float32)
    else:
        eye = torch.eye(layout.k, device=packed.device)  # [K, K]
        w = linear(eye, packed, scales_and_zeros, layout, kernel).float().t()  # [N, K]
    return w[: layout.n, : layout.k].to(dtype)


# ------------------------------------------------------------------------------------------ capabilities
def _kernel_candidate(device: torch.device) -> Int4Kernel:
    if device.type == "cpu" and hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        return "cpu"
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 0):
        return "cuda"
    return "dequant"


@functools.cache
def _kernel_for(device: str) -> Int4Kernel:
    dev = torch.device(device)
    candidate = _kernel_candidate(dev)
    if candidate == "dequant":
        return candidate
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        layout = plan_layout(40, 96)  # padding on both dims, as real shapes may need
        codes, sz = quantize_groupwise(torch.randn(40, 96, generator=gen).to(dev), layout)
        x = torch.randn(3, 96, generator=gen).to(dev)  # [M, K]
        got = linear(x, pack(codes, layout, candidate), sz, layout, candidate).float()
        want = linear(x, pack(codes, layout, "dequant"), sz, layout, "dequant").float()
        ok = torch.allclose(got, want, rtol=0.02, atol=0.02 * float(want.abs().mean()))
    except (RuntimeError, NotImplementedError):
        ok = False
    return candidate if ok else "dequant"


def pick_kernel(device: torch.device | str) -> Int4Kernel:
    """The fastest int4 matmul that works on ``device``, verified once per device."""
    return _kernel_for(str(torch.device(device)))
