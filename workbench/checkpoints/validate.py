"""Checking a checkpoint's tensors against its params.json *before* anything is built or allocated.

params.json alone can be well-typed and still wrong for its shards (``n_layers: 1000000`` next to a
two-layer shard, ``n_kv_heads`` or ``num_experts`` that contradict the fused tensors of a published
Llama 4 checkpoint).  Building the model first would allocate a million layers, or fail deep inside a
``view`` with a torch error.  Here shard 0 is opened memory-mapped (nothing is read but the header
and the tensor metadata), every known key — module names and the fused published names — is compared
with the shape params.json implies per shard, and the first contradiction is reported with the file,
the key, the expected shape and which params.json fields it follows from (and, where the shard
pins it down, the value that would fit).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.checkpoints.files import read_shard, shard_paths
from workbench.errors import CheckpointError, VocabMismatchError
from workbench.models.args import ModelArgs

_LAYER_RE = re.compile(r"^layers\.(\d+)\.")
_IGNORED_SUFFIXES = ("._extra_state", "rope.freqs")
_VISION_PREFIXES = ("vision_embeddings.", "vision_projection.", "vision_encoder.", "vision_model.")


@dataclass(frozen=True)
class _Want:
    shape: tuple[int | None, ...]  # None: not checked (a dim that does not split evenly is reported separately)
    why: str


def _per_shard(total: int, n: int, what: str, key: str) -> int:
    if total % n:
        raise CheckpointError(
            f"{what} ({total}) is not divisible by the {n} shards, so {key} cannot be split; "
            "check params.json and the shard count"
        )
    return total // n


def expected_shapes(args: ModelArgs, n_shards: int) -> dict[str, _Want]:
    """Per-shard shape of every key params.json implies, under module names and fused published names."""
    n, d, hd = n_shards, args.dim, args.rope_head_dim
    nh, kv = args.n_heads, args.kv_heads
    vocab = args.vocab_size
    want: dict[str, _Want] = {}

    def put(key: str, shape: tuple[int | None, ...], why: str) -> None:
        want[key] = _Want(shape, why)

    if vocab > 0:
        rows = _per_shard(vocab, n, "vocab_size", "tok_embeddings.weight")
        put("tok_embeddings.weight", (rows, d), f"vocab_size={vocab} / {n} shard(s) rows, dim={d} columns")
        put("output.weight", (rows, d), f"vocab_size={vocab} / {n} shard(s) rows, dim={d} columns")
    put("norm.weight", (d,), f"dim={d}")
    q_rows = _per_shard(nh * hd, n, "n_heads × head size", "attention.wq.weight")
    kv_rows = kv * hd // n if (kv * hd) % n == 0 and kv % n == 0 else None
    heads = f"head size {hd}" + ("" if args.head_dim is not None else " = dim/n_heads")
    dense = args.dense_hidden_dim()
    moe = args.moe_args
    expert = args.moe_hidden_dim() if moe is not None else 0
    for i in range(args.n_layers):
        p = f"layers.{i}."
        put(p + "attention.wq.weight", (q_rows, d), f"n_heads={nh} × {heads} / {n} shard(s) rows, dim={d} columns")
        put(p + "attention.wk.weight", (kv_rows, d), f"n_kv_heads={kv} × {heads} / {n} shard(s) rows, dim={d} columns")
        put(p + "attention.wv.weight", (kv_rows, d), f"n_kv_heads={kv} × {heads} / {n} shard(s) rows, dim={d} columns")
        put(p + "attention.wo.weight", (d, q_rows), f"dim={d} rows, n_heads={nh} × {heads} / {n} shard(s) columns")
        qkv = (nh + 2 * kv) * hd // n if kv_rows is not None else None
        put(
            p + "attention.wqkv.weight",
            (qkv, d),
            f"(n_heads={nh} + 2 × n_kv_heads={kv}) × {heads} / {n} shard(s) rows, dim={d} columns",
        )
        for norm in (
            "attention_norm.weight",
            "attention.wqkv.layer_norm_weight",
            "ffn_norm.weight",
            "feed_forward.mlp.layer_norm_weight",
            "feed_forward.norm.weight",
        ):
            put(p + norm, (d,), f"dim={d}")
        ff = p + "feed_forward."
        if args.is_moe_layer(i):
            assert moe is not None
            e = moe.num_experts
            f = _per_shard(expert, n, "the expert hidden size", ff + "experts.w1")
            fwhy = f"expert hidden size {expert} (from dim, ffn_exp, ffn_dim_multiplier, capacity_factor, multiple_of)"
            put(ff + "router_DE", (d, e), f"dim={d} × num_experts={e}")
            for w in ("w1", "w3"):
                put(ff + f"experts.{w}", (e, d, f), f"num_experts={e}, dim={d}, {fwhy} / {n} shard(s)")
                put(ff + f"shared_expert.{w}.weight", (f, d), f"{fwhy} / {n} shard(s) rows, dim={d} columns")
            put(ff + "experts.w2", (e, f, d), f"num_experts={e}, {fwhy} / {n} shard(s), dim={d}")
            put(ff + "shared_expert.w2.weight", (d, f), f"dim={d} rows, {fwhy} / {n} shard(s) columns")
            for fused in ("moe_w_in_eD_F", "moe_w_swiglu_eD_F"):
                put(ff + f"experts.{fused}", (e * d, f), f"num_experts={e} × dim={d} rows, {fwhy} / {n} shard(s)")
            put(ff + "experts.moe_w_out_eF_D", (e * f, d), f"num_experts={e} × {fwhy} / {n} shard(s) rows, dim={d}")
            put(ff + "w_in_shared_FD.weight", (f, d), f"{fwhy} / {n} shard(s) rows, dim={d} columns")
            put(ff + "w_swiglu_FD.weight", (f, d), f"{fwhy} / {n} shard(s) rows, dim={d} columns")
            put(ff + "w_out_shared_DF.weight", (d, f), f"dim={d} rows, {fwhy} / {n} shard(s) columns")
        else:
            h = _per_shard(dense, n, "the feed-forward hidden size", ff + "w1.weight")
            hwhy = f"feed-forward hidden size {dense} (from dim, ffn_dim_multiplier, multiple_of)"
            put(ff + "w1.weight", (h, d), f"{hwhy} / {n} shard(s) rows, dim={d} columns")
            put(ff + "w3.weight", (h, d), f"{hwhy} / {n} shard(s) rows, dim={d} columns")
            put(ff + "w2.weight", (d, h), f"dim={d} rows, {hwhy} / {n} shard(s) columns")
            put(ff + "mlp.fc1_weight", (2 * h, d), f"2 × {hwhy} / {n} shard(s) rows, dim={d} columns")
            put(ff + "mlp.fc2_weight", (d, h), f"dim={d} rows, {hwhy} / {n} shard(s) columns")
    return want


def check_shard(
    state: dict[str, torch.Tensor], args: ModelArgs, path: Path, n_shards: int, params: str = "params.json"
) -> None:
    """Raise :class:`CheckpointError` at the first key of ``state`` whose shape contradicts ``args``."""
    state = {k.removeprefix("text_model."): v for k, v in state.items()}  # Llama 3.2 Vision's text decoder
    layers = sorted({int(m.group(1)) for k in state if (m := _LAYER_RE.match(k))})
    if layers != list(range(args.n_layers)):
        held = (
            f"layers 0..{layers[-1]} ({len(layers)} layers)"
            if layers == list(range(len(layers))) and layers
            else f"layer indices {_ranges(layers)}"
        )
        fit = f"; n_layers={len(layers)} would fit" if layers == list(range(len(layers))) and layers else ""
        raise CheckpointError(
            f"{params} says n_layers={args.n_layers} but {path.name} holds {held}{fit}; use the params.json that "
            "belongs to these shards"
        )
    for i in layers:  # a layer's feed-forward kind must match interleave_moe_layer_step
        prefix = f"layers.{i}.feed_forward."
        has_experts = any(k.startswith((prefix + "experts.", prefix + "router_DE")) for k in state)
        has_dense = any(k.startswith((prefix + "w1.", prefix + "mlp.fc1")) for k in state)
        if args.is_moe_layer(i) and has_dense and not has_experts:
            raise CheckpointError(
                f"{params} makes layer {i} a mixture-of-experts layer (moe_args.interleave_moe_layer_step="
                f"{args.moe_args.interleave_moe_layer_step}) but {path.name} holds a dense feed-forward for it "
                f"({prefix}...); check interleave_moe_layer_step and moe_args"
            )
        if not args.is_moe_layer(i) and has_experts:
            step = args.moe_args.interleave_moe_layer_step if args.moe_args is not None else None
            raise CheckpointError(
                f"{params} makes layer {i} a dense layer "
                f"({'no moe_args' if step is None else f'moe_args.interleave_moe_layer_step={step}'}) but "
                f"{path.name} holds experts for it ({prefix}experts...); check moe_args"
            )
    want = expected_shapes(args, n_shards)
    for key, tensor in state.items():
        w = want.get(key)
        if w is None or key.endswith(_IGNORED_SUFFIXES) or key.startswith(_VISION_PREFIXES):
            continue
        got = tuple(tensor.shape)
        if len(got) != len(w.shape) or any(x is not None and x != g for x, g in zip(w.shape, got)):
            shown = tuple("?" if x is None else x for x in w.shape)
            vocab = key in ("tok_embeddings.weight", "output.weight") and len(got) == 2 and got[1] == args.dim
            raise (VocabMismatchError if vocab else CheckpointError)(
                f"{path.name}: {key} has shape {got} but {params} implies {shown} per shard ({w.why})"
                f"{_hint(key, got, args, n_shards)}; use the params.json that belongs to these shards"
            )


def _hint(key: str, got: tuple[int, ...], args: ModelArgs, n: int) -> str:
    """The params.json value the shard's shape points to, where one field explains the mismatch."""
    hd, d = args.rope_head_dim, args.dim
    if len(got) == 1 and key.endswith(("norm.weight", "layer_norm_weight")):
        return f"; the shard fits dim={got[0]}"
    if len(got) != 2 and not key.endswith(("experts.w1", "experts.w3", "experts.w2")):
        return ""
    if key in ("tok_embeddings.weight", "output.weight"):
        return f"; the shard fits dim={got[1]}" if got[1] != d else f"; the shard fits vocab_size={got[0] * n}"
    if key.endswith(("attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "attention.wqkv.weight")):
        if got[1] != d:
            return f"; the shard fits dim={got[1]}"
        if got[0] * n % hd:
            return ""
        heads = got[0] * n // hd
        if key.endswith("wqkv.weight"):
            extra = heads - args.n_heads
            return (
                f"; with n_heads={args.n_heads} the shard fits n_kv_heads={extra // 2}"
                if extra > 0 and extra % 2 == 0
                else ""
            )
        return f"; the shard fits {'n_heads' if key.endswith('wq.weight') else 'n_kv_heads'}={heads}"
    if key.endswith("router_DE"):
        return f"; the shard fits num_experts={got[1]}" if got[0] == d else f"; the shard fits dim={got[0]}"
    if key.endswith(("experts.w1", "experts.w3", "experts.w2")) and len(got) == 3:
        return f"; the shard fits num_experts={got[0]}"
    if key.endswith(("moe_w_in_eD_F", "moe_w_swiglu_eD_F")) and got[0] % d == 0:
        return f"; the shard fits num_experts={got[0] // d}"
    return ""


def _ranges(values: list[int]) -> str:
    if not values:
        return "none"
    shown = ", ".join(map(str, values[:8]))
    return shown + ("…" if len(values) > 8 else "")


def check_checkpoint(ckpt_dir: str | Path, args: ModelArgs) -> None:
    """Check shard 0 of the folder against ``args`` before anything is built (memory-mapped: no weights are read).

    A shard torch cannot open is left to the loader, which reports it with its context (the rank that
    failed); a shard that opens but holds something else than name -> tensor, or tensors whose shapes
    contradict params.json, is refused here.
    """
    ckpt_dir = Path(ckpt_dir)
    paths = shard_paths(ckpt_dir)
    if any(ckpt_dir.glob("int4_scales_*.pt")):  # packed shapes: the quantization loader refuses these with its reason
        return
    try:
        raw = torch.load(paths[0], map_location="cpu", mmap=True, weights_only=True)
    except Exception:  # unreadable: the loader says so, naming the rank
        return
    del raw
    state = read_shard(paths[0])
    check_shard(state, args, paths[0], len(paths), params=str(ckpt_dir / "params.json"))
