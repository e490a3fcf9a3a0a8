"""Loading Meta's native checkpoints: ``consolidated.NN.pth`` shards + ``params.json``.

Pipeline per model-parallel rank:
1. pick the saved shards this rank needs (one to split, or several to merge);
2. ``torch.load(mmap=True, weights_only=True)`` each;
3. rename the fused names of published Llama 4 checkpoints to module names (per shard, since fused
   tensors hold this shard's slice of q/k/v or w1/w3);
4. cut or concatenate each tensor along its model-parallel dim for this rank (repeating KV heads
   when there are more ranks than KV heads);
5. build the model on the meta device and ``load_state_dict(assign=True)`` after a dtype cast.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from workbench.checkpoints.files import read_shard, shard_paths, source_shards_for_rank
from workbench.checkpoints.validate import check_shard
from workbench.errors import CheckpointError, VocabMismatchError
from workbench.models.args import ModelArgs
from workbench.models.llama32_vision import CrossAttentionTextModel, is_cross_attention_vision
from workbench.models.transformer import Transformer
from workbench.models.vision import VisionModel
from workbench.progress import progress_bar

# Tensors whose name ends like this are dropped: training-only state, or rebuilt at load.
_DROPPED_SUFFIXES = ("._extra_state", "rope.freqs")
_VISION_PREFIXES = ("vision_embeddings.", "vision_projection.", "vision_encoder.", "vision_model.")
TEXT_MODEL_PREFIX = "text_model."  # Llama 3.2 Vision's text decoder keys (stripped: see models.llama32_vision)


def canonicalize(state: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Rename fused Llama 4 keys of one shard to module names; drop training-only entries."""
    out: dict[str, torch.Tensor] = {}
    n_q, n_kv = args.n_heads, args.kv_heads
    for key, tensor in state.items():
        if key.endswith(_DROPPED_SUFFIXES) or key.startswith(_VISION_PREFIXES):
            continue
        key = key.removeprefix(TEXT_MODEL_PREFIX)  # Llama 3.2 Vision: the text decoder is the model
        if key.endswith("attention.wqkv.weight"):
            prefix = key[: -len("attention.wqkv.weight")]
            rows = tensor.shape[0]
            q_rows = rows * n_q // (n_q + 2 * n_kv)
            kv_rows = (rows - q_rows) // 2
            wq, wk, wv = tensor.split([q_rows, kv_rows, kv_rows], dim=0)
            out[prefix + "attention.wq.weight"] = wq
            out[prefix + "attention.wk.weight"] = wk
            out[prefix + "attention.wv.weight"] = wv
            continue
        if key.endswith("attention.wqkv.layer_norm_weight"):
            out[key.replace("attention.wqkv.layer_norm_weight", "attention_norm.weight")] = tensor
            continue
        renamed = _rename_feed_forward(key, tensor, args)
        if renamed is None:
            out[key] = tensor
        else:
            out.update(renamed)
    return out


def _rename_feed_forward(key: str, tensor: torch.Tensor, args: ModelArgs) -> dict[str, torch.Tensor] | None:
    if ".feed_forward." not in key:
        return None
    head, _, leaf = key.partition(".feed_forward.")
    ff = head + ".feed_forward."
    if leaf == "mlp.fc1_weight":
        w1, w3 = tensor.chunk(2, dim=0)
        return {ff + "w1.weight": w1, ff + "w3.weight": w3}
    if leaf == "mlp.fc2_weight":
        return {ff + "w2.weight": tensor}
    if leaf in ("mlp.layer_norm_weight", "norm.weight"):
        return {head + ".ffn_norm.weight": tensor}
    shared = {"w_in_shared_FD.weight": "w1", "w_swiglu_FD.weight": "w3", "w_out_shared_DF.weight": "w2"}
    if leaf in shared:
        return {ff + f"shared_expert.{shared[leaf]}.weight": tensor}
    assert args.moe_args is not None or not leaf.startswith("experts.moe_")
    if leaf in ("experts.moe_w_in_eD_F", "experts.moe_w_swiglu_eD_F"):
        name = "w1" if "in_eD" in leaf else "w3"
        return {ff + f"experts.{name}": tensor.view(args.moe_args.num_experts, args.dim, -1)}
    if leaf == "experts.moe_w_out_eF_D":
        return {ff + "experts.w2": tensor.view(args.moe_args.num_experts, -1, args.dim)}
    return None


# Model-parallel split dim of each canonical parameter (None: replicated).
_SPLIT_RULES: list[tuple[re.Pattern[str], int | None]] = [
    (re.compile(r"attention\.(wq|wk|wv)\.weight$"), 0),
    (re.compile(r"attention\.wo\.weight$"), 1),
    (re.compile(r"feed_forward\.(shared_expert\.)?(w1|w3)\.weight$"), 0),
    (re.compile(r"feed_forward\.(shared_expert\.)?w2\.weight$"), 1),
    (re.compile(r"feed_forward\.experts\.(w1|w3)$"), 2),
    (re.compile(r"feed_forward\.experts\.w2$"), 1),
    (re.compile(r"^tok_embeddings\.weight$"), 0),
    (re.compile(r"^output\.weight$"), 0),
    (re.compile(r"^learnable_embedding\.weight$"), 0),  # Llama 3.2 Vision: a vocab-parallel embedding
    # Llama 4 vision encoder, adapter and projection (Meta's reshard rules for vision_embeddings.*)
    (re.compile(r"\.attn\.(wq|wk|wv)\.(weight|bias)$"), 0),
    (re.compile(r"\.attn\.wo\.weight$"), 1),
    (re.compile(r"\.mlp\.c_fc\.(weight|bias)$"), 0),
    (re.compile(r"\.mlp\.c_proj\.weight$"), 1),
    (re.compile(r"conv1\._linear\.weight$"), 0),
    (re.compile(r"^vision_projection\.(weight|bias)$"), 0),  # (3.2 Vision's bias is split with its outputs)
]


def split_dim(key: str) -> int | None:
    key = key.removeprefix(TEXT_MODEL_PREFIX).removeprefix("vision_model.")
    for pattern, dim in _SPLIT_RULES:
        if pattern.search(key):
            return dim
    return None


def _take_part(tensor: torch.Tensor, dim: int, parts: int, index: int, unit: int) -> torch.Tensor:
    """Part ``index`` of ``parts`` along ``dim`` in whole units of ``unit`` rows (a head);
    when there are fewer units than parts, units are repeated (KV heads over more ranks)."""
    n_units = tensor.shape[dim] // unit
    if n_units % parts == 0:
        return tensor.chunk(parts, dim=dim)[index]
    if parts % n_units == 0:
        u = index * n_units // parts
        return tensor.narrow(dim, u * unit, unit)
    raise CheckpointError(f"cannot split {n_units} heads over {parts} ranks; pick a model_parallel_size that fits")


def reshard(
    shards: list[dict[str, torch.Tensor]], *, n_saved: int, mp_size: int, rank: int, args: ModelArgs
) -> dict[str, torch.Tensor]:
    """Merge or split the canonical ``shards`` (saved ranks of this rank's run) into rank ``rank``'s slice."""
    parts = max(mp_size // n_saved, 1)
    index = rank % parts
    head_dim = args.rope_head_dim
    out: dict[str, torch.Tensor] = {}
    for key, first in shards[0].items():
        dim = split_dim(key)
        if dim is None:
            out[key] = first
            continue
        tensor = first if len(shards) == 1 else torch.cat([s[key] for s in shards], dim=dim)
        if parts == 1:
            out[key] = tensor
            continue
        is_kv = key.endswith(("attention.wk.weight", "attention.wv.weight"))
        out[key] = _take_part(tensor, dim, parts, index, head_dim if is_kv else 1)
    return out


def _load_shard(path: Path) -> dict[str, torch.Tensor]:
    """One shard memory-mapped with ``weights_only=True``; it must map names to tensors (errors name the file)."""
    return read_shard(path)


def load_state_dict_for_rank(
    ckpt_dir: str | Path, args: ModelArgs, mp_size: int = 1, rank: int = 0, *, progress: bool | None = False
) -> dict[str, torch.Tensor]:
    """This rank's canonical state dict, memory-mapped where no copy is needed.

    ``progress``: a bar over the shards read (see :mod:`workbench.progress`; off by default, since
    model-parallel workers have no notebook to draw in).
    """
    paths = shard_paths(ckpt_dir)
    picked = source_shards_for_rank(len(paths), mp_size, rank)
    shards = []
    with progress_bar(len(picked), desc="loading shards", unit="shard", progress=progress) as bar:
        for i in picked:
            raw = _load_shard(paths[i])
            check_shard(raw, args, paths[i], len(paths))
            shards.append(canonicalize(raw, args))
            bar.update(1)
    return reshard(shards, n_saved=len(paths), mp_size=mp_size, rank=rank, args=args)


def build_vision(
    ckpt_dir: str | Path, args: ModelArgs, *, device: torch.device, dtype: torch.dtype, mp_size: int = 1, rank: int = 0
) -> torch.nn.Module:
    """This rank's slice of the Llama 4 vision encoder, adapter and projection (``vision_embeddings.*``,
    ``vision_projection.weight``), read from the shards on demand (the text model never holds them)."""
    if args.vision_args is None:
        raise CheckpointError(f"{ckpt_dir}: params.json has no vision_args, so the model has no vision encoder")
    paths = shard_paths(ckpt_dir)
    picked = source_shards_for_rank(len(paths), mp_size, rank)
    shards = [
        {k: v for k, v in _load_shard(paths[i]).items() if k.startswith(("vision_embeddings.", "vision_projection."))}
        for i in picked
    ]
    state = reshard(shards, n_saved=len(paths), mp_size=mp_size, rank=rank, args=args)
    model = VisionModel(args, device="meta", dtype=dtype)
    assign_state(model, state, ckpt_dir, mp_size, device, what="vision encoder")
    return model.eval()


def assign_state(
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    ckpt_dir: str | Path,
    mp_size: int,
    device: torch.device,
    what: str,
) -> None:
    """Check ``state`` against ``model``'s own keys and shapes (errors name the checkpoint and the fix), then
    assign it on ``device``."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointError(
            f"{ckpt_dir}: the checkpoint lacks {len(missing)} {what} tensors the params.json vision_args imply, e.g. "
            f"{missing[:4]}; this checkpoint cannot take images (use one with vision weights)"
        )
    for key, want in expected.items():
        got = state[key]
        if tuple(got.shape) != tuple(want.shape):
            raise CheckpointError(
                f"{ckpt_dir}: {key} has shape {tuple(got.shape)} but params.json implies {tuple(want.shape)} "
                f"at model_parallel_size={mp_size}; check vision_args in params.json"
            )
        state[key] = got.to(device=device, dtype=want.dtype)
    model.load_state_dict({k: state[k] for k in expected}, assign=True, strict=True)


def check_vocab(args: ModelArgs, n_words: int, source: str) -> ModelArgs:
    """Fill ``vocab_size=-1`` from the tokenizer, or fail when the two disagree."""
    if args.vocab_size == -1:
        args.vocab_size = n_words
    if args.vocab_size != n_words:
        raise VocabMismatchError(
            f"{source}: params.json says vocab_size={args.vocab_size} but the tokenizer has {n_words} tokens; "
            "use the tokenizer.model that belongs to this checkpoint (Llama 3: 128256, Llama 4: 202048)"
        )
    return args


def build_model(
    ckpt_dir: str | Path,
    args: ModelArgs,
    *,
    device: torch.device,
    dtype: torch.dtype,
    max_seq_len: int,
    mp_size: int = 1,
    rank: int = 0,
    progress: bool | None = False,
) -> Transformer:
    """Construct on the meta device, then assign this rank's weights cast to ``dtype`` on ``device``."""
    state = load_state_dict_for_rank(ckpt_dir, args, mp_size, rank, progress=progress)
    model_class = CrossAttentionTextModel if is_cross_attention_vision(args) else Transformer
    model = model_class(args, max_seq_len=max_seq_len, device="meta", dtype=dtype)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise CheckpointError(
            f"{ckpt_dir}: checkpoint keys do not match a {args.family} model with these params.json: "
            f"missing {missing[:6]}{'…' if len(missing) > 6 else ''} "
            f"(the shards hold {unexpected[:6]}{'…' if len(unexpected) > 6 else ''} instead); check that "
            "params.json belongs to these shards"
        )
    if unexpected:  # the reference loads non-strictly too; say what is ignored rather than fail
        warnings.warn(
            f"{ckpt_dir}: ignoring {len(unexpected)} checkpoint tensors the text model does not use: "
            f"{unexpected[:6]}{'…' if len(unexpected) > 6 else ''}",
            stacklevel=2,
        )
        for key in unexpected:
            del state[key]
    for key, want in expected.items():
        got = state[key]
        if tuple(got.shape) != tuple(want.shape):
            raise CheckpointError(
                f"{ckpt_dir}: {key} has shape {tuple(got.shape)} but params.json implies {tuple(want.shape)} "
                f"at model_parallel_size={mp_size}; check params.json and the shard count"
            )
        state[key] = got.to(device=device, dtype=dtype)
    model.load_state_dict(state, assign=True, strict=True)
    return model.eval()
