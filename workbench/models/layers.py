"""fairscale parallel layers that can be built on the meta device.

fairscale's constructors allocate (and, at model-parallel size > 1, build a full-size master
weight of) every parameter on the CPU.  These subclasses keep fairscale's forward passes (and so
its communication) but allocate only this rank's slice, on the device and dtype asked for —
``meta`` for construction before ``load_state_dict(assign=True)``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from fairscale.nn.model_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from fairscale.nn.model_parallel.utils import VocabUtility
from torch import nn

from workbench.errors import CheckpointError
from workbench.models.distributed import model_parallel_rank, model_parallel_size

# Products of at most this many rows read a bf16 weight as it is stored (torch's bf16 kernels sum in float32);
# wider ones widen the weight to the activations' float32 first, because without native bf16 arithmetic
# torch's bf16 matrix products are several times slower than float32 ones (docs/benchmarks.md, CPU kernels).
NARROW_WEIGHT_MAX_ROWS = 8
# ... and only weights of at least this many elements: widening a small one costs less than torch's generic bf16
# product (the demo model's layers), and what reading half the bytes saves matters for large ones only.
NARROW_WEIGHT_MIN_NUMEL = 1 << 20


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, also for float32 activations on a weight stored in a narrower float type (bf16).

    Why: a model loaded in bf16 on a CPU without native bf16 arithmetic keeps its weights in bf16 (the
    memory saving) but computes in float32 (see :mod:`workbench.quantization.kernels`).  Decode-sized
    products (at most NARROW_WEIGHT_MAX_ROWS rows) on large weights run on the bf16 weight, reading half the
    bytes of a float32 one; the others (prefill, small weights) widen the weight and run torch's float32
    product.  The result is in the activations' dtype.
    """
    if x.dtype == weight.dtype:
        return nn.functional.linear(x, weight, bias)
    if x.numel() <= NARROW_WEIGHT_MAX_ROWS * x.shape[-1] and weight.numel() >= NARROW_WEIGHT_MIN_NUMEL:
        narrow_bias = None if bias is None else bias.to(weight.dtype)
        return nn.functional.linear(x.to(weight.dtype), weight, narrow_bias).to(x.dtype)
    wide_bias = None if bias is None else bias.to(x.dtype)
    return nn.functional.linear(x, weight.to(x.dtype), wide_bias)


def linear_one_row_as_two(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`linear` for a one-row bf16 product computed as a two-row one (the row twice), on CPUs with
    native bf16.

    Why: torch sends a one-row product to its matrix-vector kernel, which for bf16 does not use oneDNN's
    AVX-512-bf16/AMX kernels; two rows go to oneDNN's matrix product, which on such CPUs is about twice as
    fast for one row's weight read (docs/benchmarks.md, the bf16 batch-1 anomaly).  Same products per row.
    """
    if x.numel() != x.shape[-1] or x.dtype != weight.dtype:
        return linear(x, weight, bias)
    flat = x.reshape(1, -1)
    out = nn.functional.linear(torch.cat([flat, flat]), weight, bias)[:1]  # [1, N]
    return out.view(*x.shape[:-1], out.shape[-1])


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise CheckpointError(
            f"{what} ({numerator}) is not divisible by the model-parallel size ({denominator}); "
            "choose a model_parallel_size that divides it"
        )
    return numerator // denominator


class ColumnParallel(ColumnParallelLinear):
    """Y = X A^T with A split on the output dim; the weight is [out / mp, in]."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        gather_output: bool,
        device: torch.device | str,
        dtype: torch.dtype,
        bias: bool = False,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features = in_features
        self.out_features = out_features
        self.gather_output = gather_output
        self.output_size_per_partition = divide(out_features, model_parallel_size(), "output features")
        self.weight = nn.Parameter(
            torch.empty(self.output_size_per_partition, in_features, device=device, dtype=dtype), requires_grad=False
        )
        if bias:  # split like the output features
            self.bias = nn.Parameter(torch.empty(self.output_size_per_partition, device=device, dtype=dtype), False)
        else:
            self.register_parameter("bias", None)
        self.master_weight = None
        self.mp_size = model_parallel_size()  # read once: fairscale's lookups break torch.compile graphs
        self._packed: torch.Tensor | None = None  # oneDNN-blocked copy of the weight (pack_for_cpu)
        self._packed_of: tuple[weakref.ref, int] | None = None  # (the weight it was packed from, its version)
        self.one_row_as_two = False  # set by workbench.quantization.kernels on CPUs with native bf16

    def pack_for_cpu(self, batch_hint: int = 16) -> bool:
        """Keep a oneDNN-blocked copy of a float32 CPU weight for products of 2 or more rows.

        Why: torch's CPU ``linear`` goes through MKL, whose skinny products (a few rows against a tall
        matrix, i.e. batched decode against the output projection) reach about half of what oneDNN's
        prepacked kernels do on the same weight.  A one-row product stays on the plain weight (its
        column-major layout is already at memory speed).  Costs one more copy of this weight; the
        values are the same float32 products, summed in another order (differences ~1e-6 relative).
        Returns whether the packed path is on (off when oneDNN is missing or disagrees with ``linear``).
        """
        weight = self.weight
        if (
            weight.device.type != "cpu"
            or weight.dtype != torch.float32
            or self.mp_size != 1
            or not torch.backends.mkldnn.is_available()
            or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        ):
            return False
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)
            probe = torch.randn(3, self.in_features, generator=torch.Generator().manual_seed(0))  # [3, D]
            got = torch.ops.mkldnn._linear_pointwise(probe, packed, self.bias, "none", [], "")
        except RuntimeError:
            return False
        want = nn.functional.linear(probe, weight, self.bias)
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max())):
            return False
        # a weak reference: the packed copy must not keep a replaced (or unloaded) weight alive
        self._packed, self._packed_of = packed, (weakref.ref(weight), _version(weight))
        return True

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        """Moving or converting the module (``.to("meta")`` when the engine unloads) drops the packed copy."""
        self._packed = None
        return super()._apply(fn, recurse)

    @property
    def packed_bytes(self) -> int:
        """Bytes of the packed copy (counted apart from the weights by ``Engine.memory``)."""
        return 0 if self._packed is None else self._packed.numel() * self._packed.element_size()

    def _current_pack(self) -> torch.Tensor | None:
        """The packed copy, packed again first if the weight was replaced or edited in place since."""
        assert self._packed_of is not None
        source, version = self._packed_of
        if source() is not self.weight or version != _version(self.weight):
            self._packed = None
            self.pack_for_cpu()
        return self._packed

    def forward(self, input_: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self._packed is not None and input_.dtype == torch.float32 and input_.numel() >= 2 * self.in_features:
            packed = self._current_pack()
            if packed is not None:
                return torch.ops.mkldnn._linear_pointwise(input_, packed, self.bias, "none", [], "")  # [..., out]
        if self.mp_size == 1:  # fairscale's copy/gather are identities here
            product = linear_one_row_as_two if self.one_row_as_two else linear
            return product(input_, self.weight, self.bias)
        return super().forward(input_)


def _version(tensor: torch.Tensor) -> int:
    """In-place edits bump a tensor's version; inference tensors have none (and cannot be edited outside
    inference mode), so they read as -1."""
    try:
        return tensor._version
    except RuntimeError:
        return -1


class RowParallel(RowParallelLinear):
    """Y = X A^T with A split on the input dim (input already split); outputs are summed across ranks."""

    def __init__(
        self, in_features: int, out_features: int, *, device: torch.device | str, dtype: torch.dtype, bias: bool = False
    ) -> None:
        nn.Module.__init__(self)
        self.in_features = in_features
        self.out_features = out_features
        self.input_is_parallel = True
        self.mp_size = model_parallel_size()
        self.input_size_per_partition = divide(in_features, self.mp_size, "input features")
        self.weight = nn.Parameter(
            torch.empty(out_features, self.input_size_per_partition, device=device, dtype=dtype), requires_grad=False
        )
        if bias:  # whole on every rank, added once after the sum over ranks
            self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self.master_weight = None
        self.one_row_as_two = False  # set by workbench.quantization.kernels on CPUs with native bf16

    def forward(self, input_: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self.mp_size == 1:  # fairscale's all-reduce is an identity here
            product = linear_one_row_as_two if self.one_row_as_two else linear
            return product(input_, self.weight, self.bias)
        return super().forward(input_)


class VocabParallel(VocabParallelEmbedding):
    """Token embedding split on the vocabulary dim; each rank embeds the ids in its range."""

    def __init__(
        self, num_embeddings: int, embedding_dim: int, *, device: torch.device | str, dtype: torch.dtype
    ) -> None:
        nn.Module.__init__(self)
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = None
        self.max_norm = None
        self.norm_type = 2.0
        self.scale_grad_by_freq = False
        self.sparse = False
        self._weight = None
        self.mp_size = model_parallel_size()
        divide(num_embeddings, self.mp_size, "vocab_size")
        self.vocab_start_index, self.vocab_end_index = VocabUtility.vocab_range_from_global_vocab_size(
            num_embeddings, model_parallel_rank(), model_parallel_size()
        )
        self.num_embeddings_per_partition = self.vocab_end_index - self.vocab_start_index
        self.weight = nn.Parameter(
            torch.empty(self.num_embeddings_per_partition, embedding_dim, device=device, dtype=dtype),
            requires_grad=False,
        )
        self.out_dtype: torch.dtype | None = None  # activations' dtype when it differs from the weights' (kernels)

    def forward(self, input_: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self.mp_size == 1:  # skip fairscale's masking copies on the common path
            out = nn.functional.embedding(input_, self.weight)
        else:
            out = super().forward(input_)
        return out if self.out_dtype is None else out.to(self.out_dtype)
