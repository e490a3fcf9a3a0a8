"""Static KV cache: one preallocated key and value tensor per layer (gpt-fast style).

Rows are batch slots.  A prompt is prefilled into any slot at positions ``0..len-1``; decode steps
write one position per slot.  Positions past a slot's current length may hold stale values from an
earlier request: attention masks never look past a row's own position, so they are never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    keys: list[torch.Tensor]  # per layer [B, H_kv_local, S, D]
    values: list[torch.Tensor]  # per layer [B, H_kv_local, S, D]

    @classmethod
    def allocate(
        cls,
        n_layers: int,
        batch: int,
        kv_heads: int,
        seq_len: int,
        head_dim: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> KVCache:
        shape = (batch, kv_heads, seq_len, head_dim)
        return cls(
            keys=[torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)],
            values=[torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)],
        )

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    @property
    def seq_len(self) -> int:
        return self.keys[0].shape[2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)
