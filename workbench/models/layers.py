"""fairscale parallel layers that can be built on the meta device.

fairscale's constructors allocate (and, at model-parallel size > 1, build a full-size master
weight of) every parameter on the CPU.  These subclasses keep fairscale's forward passes (and so
its communication) but allocate only this rank's slice, on the device and dtype asked for —
``meta`` for construction before ``load_state_dict(assign=True)``.
"""

from __future__ import annotations

import torch
from fairscale.nn.model_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from fairscale.nn.model_parallel.utils import VocabUtility
from torch import nn

from ..distributed import model_parallel_rank, model_parallel_size
from ..errors import CheckpointError


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise CheckpointError(
            f"{what} ({numerator}) is not divisible by the model-parallel size ({denominator}); "
            "choose a model_parallel_size that divides it"
        )
    return numerator // denominator


class ColumnParallel(ColumnParallelLinear):
    """Y = X A^T with A split on the output dim; the weight is [out / mp, in]."""

    def __init__(self, in_features: int, out_features: int, *, gather_output: bool,
                 device: torch.device | str, dtype: torch.dtype, bias: bool = False) -> None:  # fmt: skip
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


class RowParallel(RowParallelLinear):
    """Y = X A^T with A split on the input dim (input already split); outputs are summed across ranks."""

    def __init__(self, in_features: int, out_features: int, *, device: torch.device | str,
                 dtype: torch.dtype, bias: bool = False) -> None:  # fmt: skip
        nn.Module.__init__(self)
        self.in_features = in_features
        self.out_features = out_features
        self.input_is_parallel = True
        self.input_size_per_partition = divide(in_features, model_parallel_size(), "input features")
        self.weight = nn.Parameter(
            torch.empty(out_features, self.input_size_per_partition, device=device, dtype=dtype), requires_grad=False
        )
        if bias:  # whole on every rank, added once after the sum over ranks
            self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self.master_weight = None


class VocabParallel(VocabParallelEmbedding):
    """Token embedding split on the vocabulary dim; each rank embeds the ids in its range."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:  # fmt: skip
        nn.Module.__init__(self)
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = None
        self.max_norm = None
        self.norm_type = 2.0
        self.scale_grad_by_freq = False
        self.sparse = False
        self._weight = None
        divide(num_embeddings, model_parallel_size(), "vocab_size")
        self.vocab_start_index, self.vocab_end_index = VocabUtility.vocab_range_from_global_vocab_size(
            num_embeddings, model_parallel_rank(), model_parallel_size()
        )
        self.num_embeddings_per_partition = self.vocab_end_index - self.vocab_start_index
        self.weight = nn.Parameter(
            torch.empty(self.num_embeddings_per_partition, embedding_dim, device=device, dtype=dtype),
            requires_grad=False,
        )

    def forward(self, input_: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if model_parallel_size() == 1:  # skip fairscale's masking copies on the common path
            return nn.functional.embedding(input_, self.weight)
        return super().forward(input_)
