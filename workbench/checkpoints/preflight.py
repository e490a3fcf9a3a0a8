"""Memory preflight: will the weights and the KV cache fit, decided *before* anything is allocated.

``max_batch_size=10**9`` or ``max_seq_len=10**12`` would otherwise reach the allocator and fail with
``DefaultCPUAllocator: can't allocate ...`` (or take the machine into swap).  The estimate is exact for
the KV cache (``2 × n_layers × max_batch_size × kv_heads × max_seq_len × head_dim`` elements in the
model's dtype) and the RoPE tables, and exact for unquantized weights (parameter count from the
shards' shapes × dtype size); for fp8/int4 modes it is a lower bound (every weight at the quantized
size), so only requests that certainly cannot fit are refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from workbench.errors import InsufficientMemoryError
from workbench.models.args import ModelArgs
from workbench.models.llama32_vision import cross_attention_layer_count, is_cross_attention_vision

_QUANTIZED_BYTES = {"fp8_mixed": 1.0, "int4_mixed": 0.5}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one load needs, in total over all ranks and per rank (ranks hold equal slices)."""

    weights_bytes: int
    kv_cache_bytes: int
    rope_bytes: int  # per rank: cos/sin tables over max_seq_len + 1 positions
    kv_bytes_per_token: int  # per batch row and position, all ranks
    ranks: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.rope_bytes * self.ranks

    @property
    def per_rank_bytes(self) -> int:
        return -(-self.total_bytes // self.ranks)


def model_dtype(settings) -> torch.dtype:  # noqa: ANN001  (config.Settings; avoids an import cycle)
    return torch.bfloat16 if settings.quantization == "bf16" else settings.dtype


def parameter_count(args: ModelArgs, mp: int = 1) -> int:
    """Parameters of the model over all ``mp`` ranks (KV projections repeated when ranks outnumber KV heads);
    the embedding and output count only when ``vocab_size`` is known."""
    d, hd = args.dim, args.rope_head_dim
    kv_heads_total = max(args.kv_heads // mp, 1) * mp
    total = d + 2 * max(args.vocab_size, 0) * d  # final norm, embedding, output
    for i in range(args.n_layers):
        total += 2 * d * args.n_heads * hd + 2 * d * kv_heads_total * hd + 2 * d  # wq, wo, wk, wv, two norms
        if args.is_moe_layer(i):
            assert args.moe_args is not None
            e, f = args.moe_args.num_experts, args.moe_hidden_dim()
            total += d * e + 3 * e * d * f + 3 * d * f  # router, routed experts, shared expert
        else:
            total += 3 * d * args.dense_hidden_dim()
    if is_cross_attention_vision(args):  # learnable embedding + gated cross-attention blocks (text decoder only)
        per_block = 2 * d * args.n_heads * hd + 2 * d * kv_heads_total * hd + 2 * d + 2 * hd + 2
        total += max(mp, 8) * d + cross_attention_layer_count(args) * (per_block + 3 * d * args.dense_hidden_dim())
    return total


def estimate_memory(settings, args: ModelArgs) -> MemoryEstimate:  # noqa: ANN001
    """Bytes of weights, KV cache and RoPE tables for ``settings`` (see the module docstring)."""
    dtype = model_dtype(settings)
    size = torch.empty((), dtype=dtype).element_size()
    per_param = min(size, _QUANTIZED_BYTES.get(settings.quantization or "", size))
    mp = max(settings.model_parallel_size, 1)
    n_params = parameter_count(args, mp)
    kv_heads_total = max(args.kv_heads // mp, 1) * mp  # ranks beyond the KV heads hold a repeated head each
    per_token = 2 * args.n_layers * kv_heads_total * args.rope_head_dim * size
    rope = 2 * (settings.max_seq_len + 1) * (args.rope_head_dim // 2) * 4  # float32 cos + sin
    return MemoryEstimate(
        weights_bytes=int(n_params * per_param),
        kv_cache_bytes=per_token * settings.max_batch_size * settings.max_seq_len,
        rope_bytes=rope,
        kv_bytes_per_token=per_token,
        ranks=mp,
    )


def available_memory(device: str, ranks: int) -> tuple[int, str]:
    """(bytes available to one rank, description): free memory of the smallest GPU used, or the host's
    available memory shared by all ranks on the CPU."""
    if device.startswith("cuda"):
        indices = [int(device.split(":")[1])] if ":" in device else list(range(ranks))
        free = min(torch.cuda.mem_get_info(i)[0] for i in indices)
        return free, f"free on {'each of GPUs ' + str(indices) if len(indices) > 1 else f'GPU {indices[0]}'}"
    return host_available_memory() // ranks, "available host memory" + (f" / {ranks} ranks" if ranks > 1 else "")


def host_available_memory() -> int:
    """``MemAvailable`` of /proc/meminfo (Linux), else the physical memory size."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2**62  # unknown: do not refuse


def check_memory(settings, args: ModelArgs, *, reclaimable_bytes: int = 0) -> MemoryEstimate:  # noqa: ANN001
    """Refuse settings whose weights + KV cache cannot fit the device, naming the numbers and the fix.

    ``reclaimable_bytes``: memory held by an engine that will be freed before this one loads.
    """
    est = estimate_memory(settings, args)
    avail, where = available_memory(settings.device, est.ranks)
    avail += reclaimable_bytes // est.ranks
    if est.per_rank_bytes <= avail:
        return est
    mp = est.ranks
    weights_rank = -(-est.weights_bytes // mp)
    batch_src = settings.source("max_batch_size").describe()
    seq_src = settings.source("max_seq_len").describe()
    need = (
        f"max_batch_size={settings.max_batch_size} (from {batch_src}) and max_seq_len={settings.max_seq_len} "
        f"(from {seq_src}) need {fmt_bytes(est.kv_cache_bytes)} of KV cache (keys and values: "
        f"2 × {args.n_layers} layers × "
        f"{settings.max_batch_size} rows × {settings.max_seq_len} positions × "
        f"{fmt_bytes(est.kv_bytes_per_token // args.n_layers // 2)}) plus "
        f"{fmt_bytes(est.weights_bytes)} of weights"
    )
    if mp > 1:
        need += f", {fmt_bytes(est.per_rank_bytes)} per rank of {mp}"
    rope_per_pos = 8 * (args.rope_head_dim // 2)
    room = avail - weights_rank - rope_per_pos
    if room <= 0:
        raise InsufficientMemoryError(
            f"{need}, but only {fmt_bytes(avail)} is {where}: the weights alone do not fit; use "
            "quantization='fp8_mixed' or 'int4_mixed', a larger model_parallel_size, or a device with more memory"
        )
    per_row_rank = est.kv_bytes_per_token * settings.max_seq_len // mp
    per_pos_rank = est.kv_bytes_per_token * settings.max_batch_size // mp + rope_per_pos
    fits_seq = room // per_pos_rank
    fits_batch = max(room - est.rope_bytes, 0) // per_row_rank if per_row_rank else 0
    fixes = []
    if fits_seq >= 2:
        fixes.append(f"max_seq_len <= {fits_seq} at this batch size")
    if fits_batch >= 1:
        fixes.append(f"max_batch_size <= {fits_batch} at this max_seq_len")
    fix = " or ".join(fixes) if fixes else "smaller max_batch_size and max_seq_len"
    raise InsufficientMemoryError(
        f"{need}, but only {fmt_bytes(avail)} is {where}; load with {fix} (rows beyond max_batch_size simply "
        "queue, so a smaller batch costs throughput, not results)"
    )


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
