"""Numerics parity (CPU, float32) of workbench's model against Meta's reference code (llama-models 0.3.0).

What is pinned here:
- full-sequence logits of tiny Llama 3 and Llama 4 (top-1 and top-2 MoE routing, NoPE layers, QK-norm,
  chunked local attention, attention-temperature tuning) equal the reference's within 1e-4;
- right-padded batches give each row its unpadded logits;
- fused key names and 2-shard checkpoints load to the same weights and logits as 1-shard module names;
- the Llama 4 features are really exercised: turning temperature tuning or chunking off changes exactly
  the positions it should, by far more than the parity tolerance.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from oracle import reference_greedy, reference_logits

from workbench.checkpoints.factory import TINY_LLAMA3, TINY_LLAMA4
from workbench.checkpoints.load import build_model
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel

PARITY_ATOL = 1e-4  # ours vs the reference, max abs diff of float32 logits
BATCH_ATOL = 1e-5  # a padded batch row vs the same sequence alone
SAME_ATOL = 1e-6  # the same weights loaded from another layout / shard count
FEATURE_MIN_EFFECT = 1e-2  # switching a Llama 4 feature off must move logits by at least this

LENGTHS = (1, 5, 17, 33, 80)  # 80 spans three 32-token chunks; 17 > floor_scale (16); 1 and 5 are short

TOP2_LLAMA4: dict[str, Any] = {**TINY_LLAMA4, "moe_args": {**TINY_LLAMA4["moe_args"], "top_k": 2}}

_MODELS: dict[tuple[str, tuple], torch.nn.Module] = {}


def ours(ckpt_dir: Path, *, keep: bool = True, **overrides: Any) -> torch.nn.Module:
    """Our float32 CPU model for ``ckpt_dir``; ``overrides`` replace ModelArgs fields.

    Kept for the rest of the module unless ``keep=False`` (one-off variants, to bound memory).
    """
    key = (str(ckpt_dir), tuple(sorted(overrides.items())))
    if key in _MODELS:
        return _MODELS[key]
    ensure_model_parallel(1)  # build_model expects the (single-rank) model-parallel group to exist
    args = dataclasses.replace(ModelArgs.from_checkpoint(ckpt_dir), **overrides)
    model = build_model(ckpt_dir, args, device=torch.device("cpu"), dtype=torch.float32, max_seq_len=256)
    if keep:
        _MODELS[key] = model
    return model


def sequences(vocab_size: int, lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in lengths]


def full_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    out = model.forward_full(torch.tensor([ids]))
    assert out.dtype == torch.float32 and out.shape == (1, len(ids), model.args.vocab_size)
    return out[0]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def temperature_scale(position: int, params: dict[str, Any]) -> float:
    """Meta's NoPE query scale at ``position`` (1.0 means tuning has no effect there)."""
    return 1.0 + params["attn_scale"] * torch.log(torch.tensor((position + 1) // params["floor_scale"] + 1.0)).item()


@pytest.fixture(scope="module")
def llama4_top2_dir(make_checkpoint) -> Path:
    return make_checkpoint(TOP2_LLAMA4)


def test_lengths_exercise_llama4_features() -> None:
    chunk = TINY_LLAMA4["attention_chunk_size"]
    assert min(LENGTHS) < chunk < max(LENGTHS)
    assert temperature_scale(max(LENGTHS) - 1, TINY_LLAMA4) > 1.1
    assert temperature_scale(14, TINY_LLAMA4) == 1.0 and temperature_scale(15, TINY_LLAMA4) > 1.0
    assert TINY_LLAMA4["nope_layer_interval"] <= TINY_LLAMA4["n_layers"] and TINY_LLAMA4["use_qk_norm"]


# ------------------------------------------------------------------------------------ reference parity
@pytest.mark.parametrize("family", ["llama3", "llama4_top1", "llama4_top2"])
def test_logits_match_reference(family: str, llama3_dir: Path, llama4_dir: Path, llama4_top2_dir: Path) -> None:
    ckpt = {"llama3": llama3_dir, "llama4_top1": llama4_dir, "llama4_top2": llama4_top2_dir}[family]
    model = ours(ckpt)
    seqs = sequences(model.args.vocab_size)
    for ids, ref in zip(seqs, reference_logits(ckpt, seqs)):
        assert ref.shape == (len(ids), model.args.vocab_size)
        diff = max_diff(full_logits(model, ids), ref)
        assert diff < PARITY_ATOL, f"{family}, {len(ids)} tokens: max |ours - reference| = {diff:.3g}"


def test_reference_reads_fused_and_module_layouts_alike(make_checkpoint, llama4_dir: Path) -> None:
    """Meta's load hooks on our fused layout give Meta's model the same weights as module names do."""
    fused = make_checkpoint(TINY_LLAMA4, layout="fused")
    seqs = sequences(TINY_LLAMA4["vocab_size"], (40,), seed=3)
    (a,), (b,) = reference_logits(fused, seqs), reference_logits(llama4_dir, seqs)
    assert max_diff(a, b) <= SAME_ATOL


def test_top1_and_top2_routing_differ(llama4_dir: Path, llama4_top2_dir: Path) -> None:
    """Same weights, different top_k: the routing really changes the output (so top-2 parity means something)."""
    (ids,) = sequences(TINY_LLAMA4["vocab_size"], (20,), seed=4)
    assert max_diff(full_logits(ours(llama4_dir), ids), full_logits(ours(llama4_top2_dir), ids)) > FEATURE_MIN_EFFECT


# ------------------------------------------------------------------------------------ Llama 4 features are live
def test_temperature_tuning_is_active(llama4_dir: Path) -> None:
    (ids,) = sequences(TINY_LLAMA4["vocab_size"], (80,), seed=1)
    (ref,) = reference_logits(llama4_dir, [ids])
    untuned = full_logits(ours(llama4_dir, keep=False, attn_temperature_tuning=False), ids)
    first_scaled = next(p for p in range(80) if temperature_scale(p, TINY_LLAMA4) > 1.0)
    assert first_scaled == 15
    assert max_diff(untuned[:first_scaled], ref[:first_scaled]) < PARITY_ATOL
    assert max_diff(untuned[first_scaled:], ref[first_scaled:]) > FEATURE_MIN_EFFECT


def test_chunked_attention_is_active(llama4_dir: Path) -> None:
    chunk = TINY_LLAMA4["attention_chunk_size"]
    (ids,) = sequences(TINY_LLAMA4["vocab_size"], (80,), seed=2)
    (ref,) = reference_logits(llama4_dir, [ids])
    unchunked = full_logits(ours(llama4_dir, keep=False, attention_chunk_size=None), ids)
    assert max_diff(unchunked[:chunk], ref[:chunk]) < PARITY_ATOL
    for start in range(chunk, 80, chunk):  # every later chunk sees less context than global attention gives
        assert max_diff(unchunked[start : start + chunk], ref[start : start + chunk]) > FEATURE_MIN_EFFECT


# ------------------------------------------------------------------------------------ batching
@pytest.mark.parametrize("family", ["llama3", "llama4_top2"])
def test_right_padded_batch_rows_match_unpadded(family: str, llama3_dir: Path, llama4_top2_dir: Path) -> None:
    model = ours({"llama3": llama3_dir, "llama4_top2": llama4_top2_dir}[family])
    seqs = sequences(model.args.vocab_size, (80, 33, 5, 1, 47), seed=5)
    width = max(map(len, seqs))
    pad_id = 7
    batch = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids in seqs])
    batched = model.forward_full(batch)
    assert batched.dtype == torch.float32 and batched.shape == (len(seqs), width, model.args.vocab_size)
    lengths = torch.tensor([len(ids) for ids in seqs])
    last = model.forward_full(batch, logit_index=lengths - 1)  # prefill's last-position-only logits
    assert last.shape == (len(seqs), model.args.vocab_size)
    for row, ids in enumerate(seqs):
        alone = full_logits(model, ids)
        diff = max_diff(batched[row, : len(ids)], alone)
        assert diff < BATCH_ATOL, f"{family}, row {row} ({len(ids)} tokens): {diff:.3g}"
        assert max_diff(last[row], alone[-1]) < BATCH_ATOL


# ------------------------------------------------------------------------------------ key layouts and shards
@pytest.mark.parametrize(
    ("family", "layout", "n_shards"),
    [("llama3", "modules", 2), ("llama4", "fused", 1), ("llama4", "modules", 2), ("llama4", "fused", 2)],
)
def test_layouts_and_shards_load_identically(
    family: str, layout: str, n_shards: int, make_checkpoint, llama3_dir: Path, llama4_dir: Path
) -> None:
    params, base = (TINY_LLAMA3, llama3_dir) if family == "llama3" else (TINY_LLAMA4, llama4_dir)
    other = make_checkpoint(params, n_shards=n_shards, layout=layout)
    assert len(list(other.glob("consolidated.*.pth"))) == n_shards
    base_model, other_model = ours(base), ours(other, keep=False)
    base_state, other_state = base_model.state_dict(), other_model.state_dict()
    assert base_state.keys() == other_state.keys()
    for key, tensor in base_state.items():
        assert torch.equal(tensor, other_state[key]), key
    for ids in sequences(params["vocab_size"], (33, 80), seed=6):
        assert max_diff(full_logits(other_model, ids), full_logits(base_model, ids)) <= SAME_ATOL


# ------------------------------------------------------------------------------------ the oracle's greedy loop
def test_reference_greedy_matches_cache_free_argmax(llama4_dir: Path) -> None:
    model = ours(llama4_dir)
    (prompt,) = sequences(TINY_LLAMA4["vocab_size"], (30,), seed=7)
    steps = 6  # crosses the 32-token chunk boundary
    expected, seq = [], list(prompt)
    for _ in range(steps):
        token = int(full_logits(model, seq)[-1].argmax())
        expected.append(token)
        seq.append(token)
    assert reference_greedy(llama4_dir, prompt, steps, stop_tokens=[]) == expected
    stop = expected[3]
    cut = expected.index(stop)
    assert reference_greedy(llama4_dir, prompt, steps, stop_tokens=[stop]) == expected[:cut]
    assert reference_greedy(llama4_dir, prompt, 2, stop_tokens=[]) == expected[:2]


# ------------------------------------------------------------------------------------ bfloat16 smoke
def test_llama4_bfloat16_runs_and_tracks_float32(llama4_dir: Path) -> None:
    """Temperature-tuned NoPE layers must keep q in the model dtype (float32 scales once promoted it)."""
    ensure_model_parallel(1)
    args = ModelArgs.from_checkpoint(llama4_dir)
    model = build_model(llama4_dir, args, device=torch.device("cpu"), dtype=torch.bfloat16, max_seq_len=256)
    (ids,) = sequences(args.vocab_size, (40,), seed=8)
    low = model.forward_full(torch.tensor([ids]))[0]
    assert low.dtype == torch.float32 and torch.isfinite(low).all()
    cos = torch.nn.functional.cosine_similarity(low, full_logits(ours(llama4_dir), ids), dim=-1)
    assert cos.min().item() > 0.99, cos.min().item()
