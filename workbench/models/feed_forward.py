"""The feed-forward halves of the transformer blocks: the dense SwiGLU :class:`FeedForward` (Llama 3, and
Llama 4's dense layers) and Llama 4's :class:`MoE` (sigmoid top-k routing over :class:`Experts` plus a shared
expert).  Parameter names are Meta's (``feed_forward.w1/w2/w3``, ``feed_forward.experts.w1/w2/w3``,
``feed_forward.router_DE``, ``feed_forward.shared_expert.*``); column/row splits as fairscale's layers cut them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
import torch.nn.functional as F
from fairscale.nn.model_parallel.mappings import reduce_from_model_parallel_region
from torch import nn

from workbench.models.args import ModelArgs
from workbench.models.distributed import model_parallel_size
from workbench.models.layers import ColumnParallel, RowParallel, divide, linear

P = ParamSpec("P")
R = TypeVar("R")


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x); the sum over ranks is skipped for a MoE's shared expert."""

    def __init__(
        self, dim: int, hidden_dim: int, *, reduce: bool = True, device: torch.device | str, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.reduce = reduce
        self.w1 = ColumnParallel(dim, hidden_dim, gather_output=False, device=device, dtype=dtype)
        self.w3 = ColumnParallel(dim, hidden_dim, gather_output=False, device=device, dtype=dtype)
        self.w2 = RowParallel(hidden_dim, dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(self.w1(x)) * self.w3(x)
        if self.reduce:
            return self.w2(hidden)
        return linear(hidden, self.w2.weight)


_GROUPED_MM = hasattr(torch, "_grouped_mm")
# Below this many routed rows a CPU MoE layer loops over the used experts (bench/moe.py: the loop is
# faster at 1 token, 1.10 vs 1.38 ms with 4 experts and 1.28 vs 2.15 ms with 64, and even at 16).
CPU_GROUPED_MIN_ROWS = 64


def _times(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` for a weight stored ``[in, out]``; float32 activations on bf16 weights go through
    :func:`~workbench.models.layers.linear` (see :mod:`workbench.quantization.kernels`)."""
    return x @ w if x.dtype == w.dtype else linear(x, w.t())


def _grouped_ok(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """torch's grouped matmul wants float32/bfloat16 rows whose byte strides are multiples of 16."""
    if x.dtype not in (torch.float32, torch.bfloat16) or any(w.dtype != x.dtype for w in weights):
        return False
    if x.device.type == "cuda" and not torch.cuda.get_device_capability(x.device) >= (9, 0):
        return False
    align = 16 // x.element_size()
    return all(w.shape[-1] % align == 0 and w.shape[-2] % align == 0 for w in weights)


class Experts(nn.Module):
    """Routed experts as stacked weights: w1/w3 [E, D, F/mp], w2 [E, F/mp, D] (Meta's layout)."""

    def __init__(
        self, num_experts: int, dim: int, hidden_dim: int, *, device: torch.device | str, dtype: torch.dtype
    ) -> None:
        super().__init__()
        local_hidden = divide(hidden_dim, model_parallel_size(), "expert hidden size")
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, dim, local_hidden, device=device, dtype=dtype), False)
        self.w2 = nn.Parameter(torch.empty(num_experts, local_hidden, dim, device=device, dtype=dtype), False)
        self.w3 = nn.Parameter(torch.empty(num_experts, dim, local_hidden, device=device, dtype=dtype), False)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on its routed (already gate-scaled) tokens ``x`` [n, D]."""
        return _times(F.silu(_times(x, self.w1[e])) * _times(x, self.w3[e]), self.w2[e])

    def grouped(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor | None:
        """All experts in three grouped matmuls: ``x`` [n, D] sorted by expert, ``counts`` [E] rows each.

        The work grows with the routed tokens, not with the number of experts: each expert's weights
        are read only when it got tokens, and no per-expert Python loop or host sync runs.  Returns
        None where torch has no grouped-matmul kernel for these tensors (the caller loops instead).
        """
        if not _GROUPED_MM or not _grouped_ok(x, self.w1, self.w2):
            return None
        if x.dtype != torch.bfloat16 and torch.compiler.is_compiling():  # its meta kernel takes bf16 only
            return None
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)  # [E] end row of each expert's group
        hidden = F.silu(torch._grouped_mm(x, self.w1, offs=offsets)) * torch._grouped_mm(x, self.w3, offs=offsets)
        return torch._grouped_mm(hidden, self.w2, offs=offsets)  # [n, D]


def eager_in_compiled_graphs(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` as it is, but run eagerly (``torch.compiler.disable``) when a compiled graph calls it.

    ``torch.compiler.disable`` used as a decorator imports ``torch._dynamo`` when the module is imported: a
    second of CPU in every process that loads a model (rank workers, notebook kernels, Ray replicas), most of
    which never compile.  Here the disabled function is made the first time a compiled graph reaches it, when
    ``torch._dynamo`` is loaded anyway; the graphs torch.compile builds are the same.
    """
    disabled: Callable[P, R] | None = None

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        nonlocal disabled
        if not torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return run


@eager_in_compiled_graphs  # data-dependent group sizes: run eagerly inside a compiled step, no recompiles
def _per_expert(experts: nn.Module, routed_in: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each used expert on its rows of ``routed_in`` [n, D] (sorted by expert; ``counts`` [E])."""
    pieces = []
    start = 0
    for e, count in enumerate(counts.tolist()):
        if count:
            pieces.append(experts.expert(e, routed_in[start : start + count]))
            start += count
    return torch.cat(pieces)  # [n, D]


class MoE(nn.Module):
    """Sigmoid top-k routing; each routed token is scaled by its gate *before* the expert; + shared expert."""

    def __init__(self, args: ModelArgs, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        assert args.moe_args is not None
        self.top_k = args.moe_args.top_k
        self.mp_size = model_parallel_size()
        hidden = args.moe_hidden_dim()
        self.experts = Experts(args.moe_args.num_experts, args.dim, hidden, device=device, dtype=dtype)
        self.router_DE = nn.Parameter(
            torch.empty(args.dim, args.moe_args.num_experts, device=device, dtype=dtype), False
        )
        self.shared_expert = FeedForward(args.dim, hidden, reduce=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, dim = x.shape
        x_aD = x.reshape(-1, dim)  # [A, D]
        scores_aE = _times(x_aD, self.router_DE)  # [A, E]
        top_scores, top_experts = torch.topk(scores_aE, self.top_k, dim=1)  # [A, K]
        gates = torch.sigmoid(top_scores)  # [A, K]
        out_aD = self.shared_expert(x_aD)  # [A, D]
        flat_experts = top_experts.flatten()  # [A*K]
        order = torch.argsort(flat_experts, stable=True)  # assignments grouped by expert
        counts = torch.bincount(flat_experts, minlength=self.experts.num_experts)  # [E]
        routed_in = x_aD[order // self.top_k] * gates.flatten()[order, None]  # [A*K, D]
        grouped = getattr(self.experts, "grouped", None)
        if x.device.type == "cpu" and routed_in.shape[0] < CPU_GROUPED_MIN_ROWS:
            grouped = None  # few rows (decode): torch's CPU grouped kernel walks every empty group; the loop doesn't
        routed_sorted = grouped(routed_in, counts) if grouped is not None else None
        if routed_sorted is None:  # quantized experts, or no grouped kernel: one call per used expert
            routed_sorted = _per_expert(self.experts, routed_in, counts)
        routed_out = torch.empty_like(routed_sorted).index_copy_(0, order, routed_sorted)  # [A*K, D] (token, k) order
        out_aD = out_aD + routed_out.view(-1, self.top_k, dim).sum(dim=1)
        if self.mp_size > 1:
            out_aD = reduce_from_model_parallel_region(out_aD)
        return out_aD.view(bsz, seqlen, dim)
