"""Fuzzing checkpoint validation: params.json values, shard contents, and the files around them.

Properties: any params.json dict gives ModelArgs or a ModelArgsError naming the field (never a
ZeroDivisionError or a NaN architecture); any shard is accepted only when the model params.json describes
has exactly the shard's shapes — checked against the model's own state_dict on the meta device — and is
otherwise refused with a CheckpointError naming the file, key and expected shape, before anything is built.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.checkpoints.factory import TINY_LLAMA3, TINY_LLAMA4, fuse_keys, shard_state_dict
from workbench.checkpoints.load import canonicalize
from workbench.checkpoints.validate import check_shard
from workbench.errors import CheckpointError, ModelArgsError
from workbench.formats.tokenizer import Tokenizer
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.transformer import Transformer

FUZZ = settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

numbers = st.one_of(
    st.integers(-3, 300),
    st.sampled_from([0, -1, 10**9, 10**30, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -1.0, 1e-40, 1e300]),
)
values = numbers | st.booleans() | st.none() | st.text(max_size=3) | st.lists(st.integers(), max_size=2)
FIELDS = [
    "dim",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "vocab_size",
    "multiple_of",
    "ffn_dim_multiplier",
    "ffn_exp",
    "norm_eps",
    "rope_theta",
    "rope_scaling_factor",
    "attention_chunk_size",
    "nope_layer_interval",
    "floor_scale",
    "attn_scale",
]
MOE_FIELDS = ["num_experts", "capacity_factor", "top_k", "interleave_moe_layer_step"]


@FUZZ
@given(
    st.sampled_from([TINY_LLAMA3, TINY_LLAMA4]),
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=3),
    st.dictionaries(st.sampled_from(MOE_FIELDS), values, max_size=2),
)
def test_any_params_give_model_args_or_a_named_error(base: dict, changes: dict, moe_changes: dict) -> None:
    params = {**base, **changes}
    if "moe_args" in base:
        params["moe_args"] = {**base["moe_args"], **moe_changes}
    try:
        args = ModelArgs.from_dict(params)
    except ModelArgsError as exc:
        named = list(changes) + [f"moe_args.{k}" for k in moe_changes] + ["head size", "feed-forward", "n_heads"]
        assert any(name in str(exc) for name in named), exc
        return
    for name in ("dim", "n_layers", "n_heads", "kv_heads", "rope_head_dim"):
        assert getattr(args, name) >= 1
    for name in ("norm_eps", "rope_theta", "floor_scale", "attn_scale"):
        assert math.isfinite(getattr(args, name))
    assert args.dense_hidden_dim() >= 1
    if args.moe_args is not None:
        assert args.moe_hidden_dim() >= 1


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"multiple_of": 0}, "multiple_of must be >= 1"),
        ({"ffn_dim_multiplier": -1.3}, "ffn_dim_multiplier must be > 0"),
        ({"norm_eps": math.nan}, "norm_eps must be a finite number"),
        ({"n_layers": 10**6}, "n_layers must be >= 1 and <= 4096"),
        ({"moe_args": {**TINY_LLAMA4["moe_args"], "capacity_factor": -1}}, "moe_args.capacity_factor must be >= 0"),
        ({"ffn_dim_multiplier": 1e-9}, "the dense feed-forward hidden size computed from dim=128"),
    ],
)
def test_impossible_values_are_named(change: dict, needle: str) -> None:
    with pytest.raises(ModelArgsError) as info:
        ModelArgs.from_dict({**TINY_LLAMA4, **change}, source="/ckpt/params.json")
    assert needle in str(info.value) and str(info.value).startswith("/ckpt/params.json: ")


# --- shards against params.json -------------------------------------------------------------------------------
def _meta_shard(params: dict, layout: str, n_shards: int = 1) -> dict[str, torch.Tensor]:
    """Shard 0 of a checkpoint with these params, as meta tensors (shapes only: nothing is allocated)."""
    ensure_model_parallel(1)
    args = ModelArgs.from_dict(params)
    full = Transformer(args, max_seq_len=8, device="meta").state_dict()
    shard = shard_state_dict(dict(full), n_shards)[0]
    return fuse_keys(shard, args) if layout == "fused" else shard


def _model_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in Transformer(args, max_seq_len=8, device="meta").state_dict().items()}


SHAPE_FIELDS = {
    "n_layers": st.integers(1, 6),
    "n_heads": st.sampled_from([1, 2, 4, 8]),
    "n_kv_heads": st.sampled_from([1, 2, 4, 8]),
    "dim": st.sampled_from([64, 96, 128, 256]),
    "vocab_size": st.sampled_from([128256, 128000, 202048]),
    "multiple_of": st.sampled_from([16, 32, 256]),
    "ffn_dim_multiplier": st.sampled_from([1.0, 1.2, 1.3, 2.0]),
    "head_dim": st.sampled_from([16, 32]),
}


@FUZZ
@given(
    st.sampled_from([("llama3", "modules"), ("llama4", "modules"), ("llama4", "fused")]),
    st.fixed_dictionaries({}, optional=SHAPE_FIELDS),
    st.sampled_from([2, 4, 8]),
    st.sampled_from([1, 2]),
)
def test_shards_are_accepted_exactly_when_the_model_matches(
    kind: tuple[str, str], changes: dict, experts: int, step: int
) -> None:
    family, layout = kind
    base = TINY_LLAMA3 if family == "llama3" else TINY_LLAMA4
    shard = _meta_shard(base, layout)
    params = {**base, **changes}
    if family == "llama4":
        params["moe_args"] = {**base["moe_args"], "num_experts": experts, "interleave_moe_layer_step": step}
    try:
        args = ModelArgs.from_dict(params)
    except ModelArgsError:
        return
    try:
        check_shard(shard, args, Path("consolidated.00.pth"), 1)
    except CheckpointError as exc:
        assert "params.json" in str(exc) and ("consolidated.00.pth" in str(exc))
        return
    # accepted: the model params.json describes has exactly the shard's (canonical) tensors
    canonical = {k: tuple(v.shape) for k, v in canonicalize(shard, args).items()}
    assert canonical == _model_shapes(args)


@FUZZ
@given(st.sampled_from(["modules", "fused"]), st.data())
def test_any_single_wrong_dimension_is_refused(layout: str, data: st.DataObject) -> None:
    shard = _meta_shard(TINY_LLAMA4, layout)
    args = ModelArgs.from_dict(TINY_LLAMA4)
    check_shard(shard, args, Path("consolidated.00.pth"), 1)  # the true params pass
    key = data.draw(st.sampled_from(sorted(k for k in shard if not k.endswith(("_extra_state", "rope.freqs")))))
    shape = list(shard[key].shape)
    axis = data.draw(st.integers(0, len(shape) - 1))
    shape[axis] += data.draw(st.integers(1, 64))
    shard[key] = torch.empty(shape, device="meta")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        check_shard(shard, args, Path("consolidated.00.pth"), 1)


@pytest.mark.parametrize(
    "change,needle",
    [
        (
            {"n_layers": 10**3},
            "says n_layers=1000 but consolidated.00.pth holds layers 0..3 (4 layers); n_layers=4 would fit",
        ),
        ({"n_kv_heads": 4}, "the shard fits n_kv_heads=2"),
        ({"moe_args": {**TINY_LLAMA4["moe_args"], "num_experts": 8}}, "the shard fits num_experts=4"),
        ({"moe_args": {**TINY_LLAMA4["moe_args"], "interleave_moe_layer_step": 1}}, "holds a dense feed-forward"),
    ],
)
def test_published_layout_contradictions_are_named(
    llama4_fused_dir: Path, tmp_path: Path, change: dict, needle: str
) -> None:
    folder = _copy_with_params(llama4_fused_dir, tmp_path, {**TINY_LLAMA4, **change})
    before = wb.current()
    with pytest.raises(CheckpointError) as info:
        wb.load(folder, max_seq_len=64, max_batch_size=2)
    assert needle in str(info.value) and "params.json" in str(info.value)
    assert wb.current() is before  # refused before anything was unloaded or built


@pytest.fixture(scope="module")
def llama4_fused_dir(make_checkpoint) -> Path:
    return make_checkpoint(TINY_LLAMA4, layout="fused")


def _copy_with_params(source: Path, tmp_path: Path, params: dict | None, skip: tuple[str, ...] = ()) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for item in source.iterdir():
        if item.name not in skip and item.name != "params.json":
            (folder / item.name).symlink_to(item)
    if params is not None:
        (folder / "params.json").write_text(json.dumps(params))
    return folder


# --- files that are not what they claim ----------------------------------------------------------------------------
def test_params_json_that_is_a_folder(llama3_dir: Path, tmp_path: Path) -> None:
    folder = _copy_with_params(llama3_dir, tmp_path, None)
    (folder / "params.json").mkdir()
    with pytest.raises(ModelArgsError, match="params.json is a folder, not a file"):
        wb.load(folder)


@pytest.mark.parametrize("content", [[1, 2], {"w": [1.0]}, {3: torch.zeros(2)}, torch.zeros(3)])
def test_shard_that_is_not_a_dict_of_tensors(llama3_dir: Path, tmp_path: Path, content: Any) -> None:
    folder = _copy_with_params(llama3_dir, tmp_path, TINY_LLAMA3, skip=("consolidated.00.pth",))
    torch.save(content, folder / "consolidated.00.pth")
    needle = r"consolidated\.00\.pth.*(not a dict of parameter name|must map parameter)"
    with pytest.raises(CheckpointError, match=needle):
        wb.load(folder, max_seq_len=64, max_batch_size=2)


@pytest.mark.parametrize(
    "data,needle",
    [
        (bytes(range(256)) * 8, "holds binary data"),
        (b"", "holds no BPE ranks"),
        (b"QQ== 0\nQQ== 1\n", "token b'A' appears twice"),
        (b"not base64 at all\n", "is not a tiktoken BPE line"),
        (b"QQ== 0\n", "has no token for 255 single byte"),
    ],
)
def test_garbage_tokenizer_model(tmp_path: Path, data: bytes, needle: str) -> None:
    (tmp_path / "tokenizer.model").write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        Tokenizer(tmp_path / "tokenizer.model", "llama3")
    assert needle in str(info.value) and "tokenizer.model" in str(info.value)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tok") / "tokenizer.model"


@FUZZ
@given(
    st.binary(max_size=300)
    | st.lists(st.sampled_from([b"QQ== 0", b"QUI= 1", b"\n", b" ", b"x", b"\xff", b"=="]), max_size=8).map(b"".join)
)
def test_any_bytes_as_tokenizer_give_a_checkpoint_error(tokenizer_path: Path, data: bytes) -> None:
    tokenizer_path.write_bytes(data)
    with pytest.raises(CheckpointError, match="tokenizer.model"):
        Tokenizer(tokenizer_path, "llama3")
