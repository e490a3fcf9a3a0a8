"""Batch-invariant forms of the transformer's kernels (``wb.load(..., batch_invariant=True)``).

Why: a float sum taken in another order gives other bits, and the CPU's matmul libraries pick the order
from the shapes they are given.  With MKL (float32) a row of ``x @ W^T`` has one value when ``x`` has 1
row, another from 2 to about 10 rows, and others again past 11 or 16 rows; oneDNN (bfloat16) switches
around 24-33 rows; on AVX2 every row count can differ.  SDPA splits keys and queries into blocks whose size
depends on the query length.  So a row's numbers moved with its neighbours, its prefix reuse and whether it
was prefilled, decoded or teacher-forced (docs/design/batch-invariance.md has the measurements).

The forms here make a row's numbers a function of its own tokens only:

* **row-wise modules** (every linear, the dense and quantized feed-forwards, one expert's SwiGLU, the
  router) always see products of exactly :data:`TILE` rows: the rows are cut into tiles of ``TILE``,
  the last one padded with zeros.  A product of one fixed shape is one code path, and a row's output
  depends only on its own input row and its place in the tile.  That the place does not matter either
  is a property of the kernel, checked at load by :func:`probe_rows` for every distinct module (a
  kernel where it fails refuses the mode, naming the module);
* **attention** (:class:`InvariantAttention`): keys and values are written to the KV cache first, then
  each row's queries are taken :data:`TILE` *positions* at a time — the query at position ``p`` always
  sits at row ``p % TILE`` of tile ``p // TILE`` and attends to keys ``0 .. TILE*(p//TILE+1)-1``
  (those past ``p``, or outside its chunk, masked to exactly zero weight).  Every product has a
  shape fixed by the tile's index, so prefill, chunked prefill, decode and teacher forcing sum each
  query's keys in one order, in float32;
* **MoE** (:class:`InvariantMoE`): the router and each expert run through the row tiles, so an
  expert's output for a token does not depend on how many other tokens were routed to it.

RMSNorm, RoPE, embeddings, top-k, the log-softmax and the samplers are per row already (reductions
over one row's own elements, vectorised the same way whatever the number of rows).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from fairscale.nn.model_parallel.mappings import reduce_from_model_parallel_region
from torch import nn

from workbench.errors import ConfigError, ImageError
from workbench.models.feed_forward import MoE
from workbench.models.transformer import Attention, StepContext, Transformer

TILE = 16  # rows per product; 16 passes the place-in-tile probe with MKL and oneDNN on AVX-512 and AVX2

Rows = Callable[..., torch.Tensor]


# --------------------------------------------------------------------------------------------- row tiles
def tiled(fn: Rows, x: torch.Tensor, *args: Any) -> torch.Tensor:
    """``fn(x, *args)`` for a row-wise ``fn``, computed as products of exactly :data:`TILE` rows.

    ``x`` [..., K] -> [..., N].  Rows are flattened, padded with zero rows to a multiple of ``TILE`` and
    given to ``fn`` one tile at a time; the padding's outputs are dropped.
    """
    shape = x.shape
    rows = x.reshape(-1, shape[-1])  # [M, K]
    m = rows.shape[0]
    pad = -m % TILE
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
    if rows.shape[0] == TILE:
        out = fn(rows, *args)
    else:
        out = torch.cat([fn(rows[i : i + TILE], *args) for i in range(0, rows.shape[0], TILE)])
    return out[:m].reshape(*shape[:-1], out.shape[-1])


def _tile_forward(module: nn.Module) -> None:
    """Make ``module``'s forward run through row tiles (an instance attribute: the class is untouched)."""
    plain = module.forward
    module.forward = functools.partial(tiled, plain)  # type: ignore[method-assign]
    module.rows_plain = plain  # what the probe calls


def _tile_method(obj: nn.Module, name: str) -> None:
    """Same for a method that takes the rows first (``matmul(x, index)``, ``expert(e, x)`` is reordered)."""
    plain = getattr(obj, name)
    if name == "expert":

        def expert(e: int, x: torch.Tensor) -> torch.Tensor:
            return tiled(lambda rows: plain(e, rows), x)

        obj.expert = expert  # type: ignore[method-assign]
    else:
        setattr(obj, name, functools.partial(tiled, plain))


# --------------------------------------------------------------------------------------------- attention
@functools.lru_cache(maxsize=4096)
def _tile_mask(tile: int, chunk: int | None, device: torch.device) -> torch.Tensor:
    """bool [TILE, S] (S = (tile+1)*TILE): which keys the query at each row of tile ``tile`` does *not* see."""
    query = torch.arange(tile * TILE, (tile + 1) * TILE, device=device)[:, None]  # [TILE, 1]
    key = torch.arange((tile + 1) * TILE, device=device)[None, :]  # [1, S]
    visible = key <= query
    if chunk is not None:
        visible &= key >= query - query % chunk
    return ~visible


def attend_row(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, chunk: int | None
) -> torch.Tensor:
    """Attention of one row's queries at positions ``start..start+L-1`` over its own keys.

    ``q`` [L, Hq, D]; ``keys``/``values`` [Hkv, S', D] holding at least positions ``0..start+L-1`` (what is
    past them is masked) -> [L, Hq, D] in ``q``'s dtype.  Queries go :data:`TILE` positions at a time in
    float32; each KV head's query heads are folded into the rows of one product ([Hkv, G*TILE, D]).
    """
    length, n_heads, dim = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    first, last = start // TILE, (start + length - 1) // TILE  # the tiles the row's queries fall in
    n_tiles, base, end = last - first + 1, first * TILE, (last + 1) * TILE
    # every tile's queries at once, [n_tiles, Hkv, G*TILE, D]: position p at row g*TILE + p % TILE
    qa = torch.zeros(n_tiles * TILE, n_heads, dim, dtype=torch.float32, device=q.device)
    qa[start - base : start - base + length] = q
    qa = qa.view(n_tiles, TILE, n_kv, group, dim).permute(0, 2, 3, 1, 4).reshape(n_tiles, n_kv, group * TILE, dim)
    qa.mul_(dim**-0.5)
    k, v = keys[:, :end].float(), values[:, :end].float()  # [Hkv, S, D]
    if k.shape[1] < end:  # the end of the cache (or of a teacher-forced row): masked zeros
        k = F.pad(k, (0, 0, 0, end - k.shape[1]))
        v = F.pad(v, (0, 0, 0, end - v.shape[1]))
    oa = torch.empty(n_tiles, n_kv, group * TILE, dim, dtype=torch.float32, device=q.device)
    for i in range(n_tiles):
        tile = first + i
        span = (tile + 1) * TILE  # keys 0..span-1: a shape fixed by the tile's index alone
        scores = torch.bmm(qa[i], k[:, :span].transpose(1, 2)).view(n_kv, group, TILE, span)
        scores.masked_fill_(_tile_mask(tile, chunk, q.device), float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(n_kv, group * TILE, span)
        torch.bmm(probs, v[:, :span], out=oa[i])  # [Hkv, G*TILE, D]
    out = oa.view(n_tiles, n_kv, group, TILE, dim).permute(0, 3, 1, 2, 4).reshape(n_tiles * TILE, n_heads, dim)
    return out[start - base : start - base + length].to(q.dtype)


def _row_starts(ctx: StepContext) -> list[int]:
    """The first query position of every row of this forward, read to the host once per forward."""
    starts = getattr(ctx, "invariant_starts", None)
    if starts is None:
        starts = ctx.positions[:, 0].tolist()
        ctx.invariant_starts = starts  # type: ignore[attr-defined]
    return starts


class InvariantAttention(Attention):
    """:class:`Attention` whose keys/values are written to the cache first and whose queries are attended
    :data:`TILE` positions at a time (:func:`attend_row`): one order of summation for every path."""

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.project_qkv(x, ctx)  # [B, T, H, D]
        chunk = getattr(ctx, "invariant_chunk", None) if self.use_rope else None
        if ctx.segments is not None:  # packed prefill: rows end to end in [1, N]
            assert ctx.cache is not None
            cache_k, cache_v = ctx.cache.keys[self.layer_id], ctx.cache.values[self.layer_id]
            outs = []
            for seg in ctx.segments:
                rows = slice(seg.offset, seg.offset + seg.length)
                end = seg.start + seg.length
                cache_k[seg.slot, :, seg.start : end] = xk[0, rows].transpose(0, 1).to(cache_k.dtype)
                cache_v[seg.slot, :, seg.start : end] = xv[0, rows].transpose(0, 1).to(cache_v.dtype)
                outs.append(attend_row(xq[0, rows], cache_k[seg.slot], cache_v[seg.slot], seg.start, chunk))
            return self.wo(torch.cat(outs).reshape(1, -1, self.n_local_heads * self.head_dim))
        starts = _row_starts(ctx)
        out = torch.empty_like(xq)  # [B, T, Hq, D]
        if ctx.cache is None:  # teacher-forced rows from position 0: the keys are the rows' own
            for b in range(bsz):
                out[b] = attend_row(xq[b], xk[b].transpose(0, 1), xv[b].transpose(0, 1), 0, chunk)
            return self.wo(out.reshape(bsz, seqlen, -1))
        cache_k, cache_v = ctx.cache.keys[self.layer_id], ctx.cache.values[self.layer_id]
        if ctx.decode:
            slots = list(range(bsz))
        else:
            assert ctx.cache_rows is not None
            slots = ctx.cache_rows.tolist()
        for b, slot in enumerate(slots):
            start = starts[b]
            end = min(start + seqlen, cache_k.shape[2])  # padding past the cache end is never written
            cache_k[slot, :, start:end] = xk[b, : end - start].transpose(0, 1).to(cache_k.dtype)
            cache_v[slot, :, start:end] = xv[b, : end - start].transpose(0, 1).to(cache_v.dtype)
            if end - start < seqlen:  # padding rows of a padded group past the cache: their own junk keys
                keys = torch.cat([cache_k[slot, :, :start], xk[b].transpose(0, 1).to(cache_k.dtype)], dim=1)
                values = torch.cat([cache_v[slot, :, :start], xv[b].transpose(0, 1).to(cache_v.dtype)], dim=1)
                out[b] = attend_row(xq[b], keys.to(xq.dtype), values.to(xq.dtype), start, chunk)
            else:
                out[b] = attend_row(xq[b], cache_k[slot].to(xq.dtype), cache_v[slot].to(xq.dtype), start, chunk)
        return self.wo(out.reshape(bsz, seqlen, -1))


# --------------------------------------------------------------------------------------------- MoE
class InvariantMoE(MoE):
    """:class:`MoE` with the router and every expert on row tiles; the sum over ranks in tiles too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, dim = x.shape
        x_aD = x.reshape(-1, dim)  # [A, D]
        routed = tiled(self.route, x_aD)  # [A, 2K]: gates, then expert ids (exact as floats)
        gates, top_experts = routed[:, : self.top_k], routed[:, self.top_k :].long()  # [A, K] each
        out_aD = self.shared_expert(x_aD)  # [A, D] (tiled)
        flat_experts = top_experts.flatten()  # [A*K]
        order = torch.argsort(flat_experts, stable=True)
        counts = torch.bincount(flat_experts, minlength=self.experts.num_experts).tolist()  # [E]
        routed_in = x_aD[order // self.top_k] * gates.flatten()[order, None]  # [A*K, D]
        pieces, begin = [], 0
        for e, count in enumerate(counts):
            if count:
                pieces.append(self.experts.expert(e, routed_in[begin : begin + count]))  # tiled
                begin += count
        routed_sorted = torch.cat(pieces)
        routed_out = torch.empty_like(routed_sorted).index_copy_(0, order, routed_sorted)
        out_aD = out_aD + routed_out.view(-1, self.top_k, dim).sum(dim=1)
        if self.mp_size > 1:
            out_aD = tiled(reduce_from_model_parallel_region, out_aD)
        return out_aD.view(bsz, seqlen, dim)

    def route(self, x: torch.Tensor) -> torch.Tensor:
        """One tile's router: [TILE, D] -> [TILE, 2K] (sigmoid gates, expert ids).  The sigmoid runs on the
        tile too: torch's CPU elementwise loops take the tail of a tensor through a scalar path whose
        ``exp`` may differ from the vector one in the last bit, so an element's bits depend on its place."""
        top_scores, top_experts = torch.topk(torch.mm(x, self.router_DE), self.top_k, dim=1)  # [TILE, K]
        return torch.cat([torch.sigmoid(top_scores), top_experts.to(top_scores.dtype)], dim=1)


# --------------------------------------------------------------------------------------------- install
def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*_: Any, **__: Any) -> Any:
        raise ConfigError(f"{what} cannot run with batch_invariant=True; load without batch_invariant to use it")

    return refuse


def _refuse_images() -> nn.Module:
    raise ImageError(
        "image prompts have no batch-invariant form yet (the vision encoder runs a call's images together); "
        "load without batch_invariant=True for images"
    )


def _is_row_wise(module: nn.Module) -> bool:
    """Modules whose output row depends on their input row alone: linears and whole feed-forwards."""
    names = {cls.__name__ for cls in type(module).__mro__}
    return bool(names & {"ColumnParallel", "RowParallel", "FeedForward", "QuantizedFeedForward"})


def make_batch_invariant(model: Transformer, *, probe: bool = True) -> Transformer:
    """Switch ``model`` (one rank's, freshly loaded) to the batch-invariant kernels, in place.

    Raises :class:`~workbench.errors.ConfigError` naming what cannot hold the guarantee: Llama 3.2 Vision's
    cross-attention layers, or a module whose kernel gives a row other bits at another place in a tile
    (:func:`probe_rows`).  Image prompts (Llama 4's encoder), ``compile=True`` and CUDA graphs refuse when
    used.
    """
    if type(model) is not Transformer:
        raise ConfigError(
            f"batch_invariant=True: {type(model).__name__} (Llama 3.2 Vision's cross-attention layers) has no "
            "batch-invariant form yet; load it without batch_invariant"
        )
    model.invariant_tile = TILE  # type: ignore[attr-defined]
    for module in model.modules():
        if isinstance(module, Attention):
            module.__class__ = InvariantAttention
        elif isinstance(module, MoE):
            module.__class__ = InvariantMoE
            _tile_method(module.experts, "expert")
    for module in list(model.modules()):
        if _is_row_wise(module):
            _tile_forward(module)
    model.compile_decode = _refuse("compile=True (torch.compile fuses the decode step)")  # type: ignore[method-assign]
    model.forward_decode_static = _refuse("cuda_graphs=True (fixed-shape decode steps)")  # type: ignore[method-assign]
    model.vision_loader = _refuse_images if model.vision_loader is not None else None
    _install_context(model)
    if probe:
        probe_model(model)
    return model


def _install_context(model: Transformer) -> None:
    """Attention needs the chunk size of local layers; :class:`StepContext` carries it as an attribute."""
    chunk = model.args.attention_chunk_size
    plain = model.run_layers
    plain_temperature = model.temperature_at
    table: dict[torch.device, torch.Tensor | None] = {}

    def temperature_at(positions: torch.Tensor) -> torch.Tensor | None:
        # a table by position, computed once: ``log`` over a [B, T] tensor would take some positions
        # through the scalar tail of the elementwise loop and others through the vector body
        device = positions.device
        if device not in table:
            every = torch.arange(model.max_seq_len + 1, device=device)[None]  # [1, S]
            scales = plain_temperature(every)
            table[device] = None if scales is None else scales[0, :, 0, 0]  # [S]
        scales = table[device]
        return None if scales is None else scales[positions][:, :, None, None]  # [B, T, 1, 1]

    def run_layers(h: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        ctx.invariant_chunk = chunk  # type: ignore[attr-defined]
        return plain(h, ctx)

    model.run_layers = run_layers  # type: ignore[method-assign]
    model.temperature_at = temperature_at  # type: ignore[method-assign]


# --------------------------------------------------------------------------------------------- probe
def probe_rows(fn: Rows, width: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``fn`` on a :data:`TILE`-row product gives every row the same bits at other places in the tile.

    Three rotations of one random tile put each row at three other places; a kernel whose edge rows sum in
    another order (MKL's float32 at 8 or 32 rows on AVX2, for one) fails.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(TILE, width, generator=gen).to(device=device, dtype=dtype)
    want = fn(x)
    for shift in (1, 5, 11):
        got = fn(torch.roll(x, shift, 0))
        if not torch.equal(got, torch.roll(want, shift, 0)):
            return False
    return True


def _describe(module: nn.Module) -> tuple[Any, ...]:
    weights = [(n, tuple(t.shape), tuple(t.stride()), str(t.dtype)) for n, t in module.named_buffers()]
    weights += [(n, tuple(t.shape), tuple(t.stride()), str(t.dtype)) for n, t in module.named_parameters()]
    return (type(module).__name__, tuple(weights))


def probe_model(model: Transformer) -> None:
    """Run :func:`probe_rows` once per distinct row-wise module (by type, weight shapes, strides, dtypes);
    raise ConfigError naming the first that fails."""
    seen: set[tuple[Any, ...]] = set()
    device, dtype = model.device, model.dtype
    checks: list[tuple[str, Rows, int]] = []
    for name, module in model.named_modules():
        plain = getattr(module, "rows_plain", None)
        if plain is not None:
            key = _describe(module)
            if key not in seen:
                seen.add(key)
                width = getattr(module, "input_size_per_partition", None) or getattr(module, "in_features", None)
                width = width or model.args.dim
                checks.append((name, plain, width))
        if isinstance(module, InvariantMoE):
            experts = module.experts
            key = ("experts", _describe(experts))
            if key not in seen:
                seen.add(key)
                expert_plain = type(experts).expert.__get__(experts)
                checks.append((f"{name}.experts", functools.partial(expert_plain, 0), model.args.dim))
                checks.append((f"{name}.router_DE", module.route, model.args.dim))
    with torch.inference_mode():
        for name, fn, width in checks:
            if not probe_rows(fn, width, dtype, device):
                raise ConfigError(
                    f"batch_invariant=True cannot hold on this machine: {name} gives a row other bits at another "
                    f"place in a {TILE}-row product (CPU capability {torch.backends.cpu.get_cpu_capability()}, "
                    f"{dtype}); load without batch_invariant"
                )
