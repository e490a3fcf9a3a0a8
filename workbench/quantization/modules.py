"""Modules that replace feed-forwards and routed experts with quantized ones.

* :class:`Fp8Weight` / :class:`Int4Weight` hold one ``[N, K]`` matrix (``[out, in]``, the
  orientation of ``nn.Linear``) or a stack ``[E, N, K]`` of them, as buffers, and multiply by it
  (``matmul(x, index)``: ``x`` [M, K] -> [M, N], ``index`` picks a matrix from a stack).
* :class:`QuantizedFeedForward` replaces a :class:`~workbench.models.transformer.FeedForward` (a
  dense Llama feed-forward, or a Llama 4 shared expert) and :class:`QuantizedExperts` replaces
  :class:`~workbench.models.transformer.Experts`; both keep their parent's interface (``forward`` /
  ``expert(e, x)`` and ``num_experts``), so the transformer code is unchanged.

``w1`` and ``w3`` are stored fused as one ``w13`` [2F, D] (row-wise formats, so fusing changes no
number) to halve the matmul calls — per expert, that is most of a MoE layer's kernel launches.

Everything here is rank-local: a model-parallel rank quantizes exactly the slice it loaded (``w1``/``w3``
cut on their output dim, ``w2`` on its input dim) and the only communication is the same
all-reduce the unquantized feed-forward does.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from fairscale.nn.model_parallel.mappings import reduce_from_model_parallel_region
from torch import nn

from workbench.quantization import fp8, int4

Pair = tuple[torch.Tensor, torch.Tensor]  # (e4m3 q [..., N, K], float32 scale [..., N])


class QuantizedWeight(nn.Module):
    """Base class: a quantized matrix (or stack); see the subclasses for the formats."""

    FORMAT: ClassVar[str] = ""
    DTYPE_LABELS: ClassVar[dict[str, str]] = {}  # buffer -> dtype name for memory reports, when not its torch dtype
    SCALE_BUFFERS: ClassVar[tuple[str, ...]] = ()  # buffers that hold scales (reported apart from weights)

    kernel: str
    shape: tuple[int, ...]  # logical [E?, N, K]

    def matmul(self, x: torch.Tensor, index: int | None = None) -> torch.Tensor:
        raise NotImplementedError

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight this module stands for, ``[E?, N, K]`` (inspection and tests only)."""
        raise NotImplementedError

    def logical_numel(self) -> int:
        """Number of weights represented (not bytes stored): what ``parameter_count`` should count."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    def extra_repr(self) -> str:
        return f"shape={list(self.shape)}, kernel={self.kernel}"


class Fp8Weight(QuantizedWeight):
    """float8 e4m3 weight with a float32 scale per output row (see :mod:`workbench.quantization.fp8`)."""

    FORMAT = "fp8"
    SCALE_BUFFERS = ("scale",)

    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        *,
        kernel: fp8.Fp8Kernel,
        activation_scale_ub: float = fp8.ACTIVATION_SCALE_UB,
    ) -> None:
        super().__init__()
        assert q.dtype == fp8.FP8_DTYPE and scale.shape == q.shape[:-1], (q.dtype, q.shape, scale.shape)
        self.register_buffer("weight", q.contiguous())  # e4m3 [E?, N, K]
        self.register_buffer("scale", scale.float().contiguous())  # [E?, N]
        self.kernel = kernel
        self.activation_scale_ub = activation_scale_ub
        self.shape = tuple(q.shape)

    @classmethod
    def from_float(cls, w: torch.Tensor, *, device: torch.device, kernel: fp8.Fp8Kernel) -> Fp8Weight:
        """Quantize ``w`` [E?, N, K] (on any device) onto ``device``, one matrix at a time."""
        if w.dim() == 2:
            return cls(*fp8.quantize_rowwise(w.to(device)), kernel=kernel)
        pairs = [fp8.quantize_rowwise(m.to(device)) for m in w]
        return cls(torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs]), kernel=kernel)

    def matmul(self, x: torch.Tensor, index: int | None = None) -> torch.Tensor:
        q = self.weight if index is None else self.weight[index]  # [N, K]
        scale = self.scale if index is None else self.scale[index]  # [N]
        return fp8.linear(x, q, scale, kernel=self.kernel, activation_scale_ub=self.activation_scale_ub)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return fp8.dequantize(self.weight, self.scale, dtype)


class Int4Weight(QuantizedWeight):
    """Group-wise int4 weight in a kernel's packing (see :mod:`workbench.quantization.int4`)."""

    FORMAT = "int4"
    DTYPE_LABELS = {"packed": "int4"}
    SCALE_BUFFERS = ("scales_and_zeros",)

    def __init__(
        self,
        packed: torch.Tensor,
        scales_and_zeros: torch.Tensor,
        *,
        layout: int4.Int4Layout,
        kernel: int4.Int4Kernel,
        shape: tuple[int, ...],
    ) -> None:
        super().__init__()
        self.register_buffer("packed", packed)  # [E?, *kernel packing], N'*K'/2 bytes per matrix
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # bf16 [E?, G, N', 2]
        self.layout = layout
        self.kernel = kernel
        self.shape = shape

    @classmethod
    def from_float(cls, w: torch.Tensor, *, device: torch.device, kernel: int4.Int4Kernel) -> Int4Weight:
        """Quantize ``w`` [E?, N, K] (on any device) onto ``device``, one matrix at a time."""
        layout = int4.plan_layout(w.shape[-2], w.shape[-1])

        def one(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            codes, sz = int4.quantize_groupwise(m.to(device), layout)
            return int4.pack(codes, layout, kernel), sz

        if w.dim() == 2:
            packed, sz = one(w)
        else:
            pairs = [one(m) for m in w]
            packed, sz = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        return cls(packed, sz, layout=layout, kernel=kernel, shape=tuple(w.shape))

    def matmul(self, x: torch.Tensor, index: int | None = None) -> torch.Tensor:
        packed = self.packed if index is None else self.packed[index]
        sz = self.scales_and_zeros if index is None else self.scales_and_zeros[index]
        return int4.linear(x, packed, sz, self.layout, self.kernel)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if len(self.shape) == 2:
            return int4.dequantize(self.packed, self.scales_and_zeros, self.layout, self.kernel, dtype)
        return torch.stack(
            [
                int4.dequantize(p, sz, self.layout, self.kernel, dtype)
                for p, sz in zip(self.packed, self.scales_and_zeros)
            ]
        )


def make_weight(fmt: str, w: torch.Tensor, *, device: torch.device, kernel: str) -> QuantizedWeight:
    """Quantize a float ``w`` [E?, N, K] to ``fmt`` ("fp8" | "int4") on ``device`` with ``kernel``."""
    if fmt == "fp8":
        return Fp8Weight.from_float(w, device=device, kernel=kernel)  # type: ignore[arg-type]
    return Int4Weight.from_float(w, device=device, kernel=kernel)  # type: ignore[arg-type]


def fp8_from_pairs(first: Pair, second: Pair | None, *, device: torch.device, kernel: str) -> Fp8Weight:
    """An :class:`Fp8Weight` from already-quantized (q, scale) pairs (pre-quantized checkpoints),
    concatenated on the output dim when two are given (``w1`` and ``w3``)."""
    q, scale = first
    if second is not None:
        q = torch.cat([q.to(device), second[0].to(device)], dim=-2)
        scale = torch.cat([scale.to(device), second[1].to(device)], dim=-1)
    return Fp8Weight(q.to(device), scale.to(device), kernel=kernel)  # type: ignore[arg-type]


class QuantizedFeedForward(nn.Module):
    """SwiGLU ``w2(silu(w1 x) * w3 x)`` on quantized weights; all-reduced over ranks unless ``reduce`` is
    False (a MoE's shared expert, whose partial sum joins the routed experts' before one reduction)."""

    def __init__(self, w13: QuantizedWeight, w2: QuantizedWeight, *, hidden: int, reduce: bool) -> None:
        super().__init__()
        self.w13 = w13  # [2F, D] (F = this rank's hidden slice)
        self.w2 = w2  # [D, F]
        self.hidden = hidden
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # [A, D]
        h = self.w13.matmul(x2)  # [A, 2F]
        out = self.w2.matmul(F.silu(h[:, : self.hidden]) * h[:, self.hidden :])  # [A, D]
        out = out.view(*shape[:-1], out.shape[-1])  # [..., D]
        return reduce_from_model_parallel_region(out) if self.reduce else out


class QuantizedExperts(nn.Module):
    """Routed experts on quantized stacks: ``w13`` [E, 2F, D] and ``w2`` [E, D, F]."""

    def __init__(self, w13: QuantizedWeight, w2: QuantizedWeight, *, hidden: int) -> None:
        super().__init__()
        self.w13 = w13
        self.w2 = w2
        self.hidden = hidden
        self.num_experts = w13.shape[0]

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on its routed (already gate-scaled) tokens ``x`` [n, D] -> [n, D]."""
        h = self.w13.matmul(x, e)  # [n, 2F]
        return self.w2.matmul(F.silu(h[:, : self.hidden]) * h[:, self.hidden :], e)  # [n, D]
