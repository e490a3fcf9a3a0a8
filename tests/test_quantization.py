"""Quantization modes on tiny Llama 3 / Llama 4 checkpoints: formats, scheme, memory, accuracy, toggling,
pre-quantized fp8 checkpoints and model parallelism.

Accuracy bounds — derived from the quantization error, then given a safety margin.  The tiny random
models have next-token logits with a standard deviation of ~2 over a 128k/202k vocabulary; for a logit
perturbation ``d`` (per position, centred), KL(p || q) ~= Var_p(d) / 2, and with the top-1/top-2 gap
of such logits ~ Exponential(mean g ~= 0.4) the top-1 flip rate is ``1/2 - exp(l^2 s^2 / 2) * Phi_c(l s)``
with ``l = 1/g`` and ``s = sqrt(2) * std(d)``.  The relative RMS weight error (checked in
``test_weight_error_matches_the_format``) sets ``std(d)``:

* bf16: 2**-9 relative rounding of every weight and activation -> std(d) ~= 0.02 -> KL ~= 2e-4,
  ~3% flips.
* fp8 (e4m3, 3 mantissa bits): ~2.6% RMS on one feed-forward (Llama 3) / one MoE layer's experts
  (Llama 4) of the 3-4 layers -> std(d) ~= 0.04 -> KL ~= 1e-3, ~5% flips.
* int4 (group-wise, 16 levels over each group's range): ~10% RMS on every quantized feed-forward ->
  std(d) ~= 0.25 -> KL ~= 0.03, ~23% flips.

Llama 4's top-1 routing adds a non-perturbative term: where a token's two best router scores nearly
tie, any perturbation (even bf16 rounding, or a different all-reduce order) swaps its expert, which
costs KL ~0.2 at that position — one such position in ~100 adds 2e-3 to the mean.  Bounds (mean KL,
top-1): bf16 (5e-3, 0.85), fp8 (1e-2, 0.85), int4 (0.1, 0.6) — 3-10x the estimates above.
"""

from __future__ import annotations

import gc
import json
import shutil
import weakref
from pathlib import Path

import pytest
import torch

import workbench as wb
from workbench import bench
from workbench.checkpoints.factory import TINY_LLAMA3, TINY_LLAMA4, fuse_keys, random_state_dict, shard_state_dict
from workbench.errors import QuantizationError
from workbench.formats.tokenizer import bundled_tokenizer_path
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.feed_forward import Experts, FeedForward
from workbench.models.transformer import Transformer
from workbench.quantization import (
    Fp8Weight,
    QuantizedExperts,
    QuantizedFeedForward,
    QuantizedWeight,
    check_mode,
    fp8,
    int4,
    quantize_model,
    summary,
)
from workbench.reports import human_bytes
from workbench.runtime.loading import load_model_for_rank
from workbench.runtime.memory import model_memory
from workbench.session import build_engine, resolve_settings

PROMPTS = [
    "Hi",
    "The capital of France is",
    "Once upon a time " * 7,
    "def f(x):\n    return x * 2\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12",
    "Llamas are domesticated South American camelids. " * 2,
    "Q: What is 17 * 23?\nA:",
]
BOUNDS = {"bf16": (5e-3, 0.85), "fp8_mixed": (1e-2, 0.85), "int4_mixed": (0.1, 0.6)}  # (mean KL, top-1)
MAX_BF16_FRACTION = {"fp8": 0.55, "int4": 0.30}
SMALL = dict(max_batch_size=8, max_seq_len=128, device="cpu", dtype="float32")

# Which layers each mode quantizes (Meta's scheme), written out for the tiny models:
# Llama 3 has 3 dense layers; Llama 4 has 4 layers with MoE at 1 and 3 (interleave step 2).
EXPECTED = {
    ("llama3", "fp8_mixed"): {(1, "feed_forward")},
    ("llama3", "int4_mixed"): {(0, "feed_forward"), (1, "feed_forward"), (2, "feed_forward")},
    ("llama4", "fp8_mixed"): {(1, "experts")},  # layer 3 is the last layer
    ("llama4", "int4_mixed"): {(1, "experts"), (1, "shared_expert"), (3, "experts"), (3, "shared_expert")},
}


@pytest.fixture(scope="module")
def dirs(llama3_dir: Path, llama4_dir: Path) -> dict[str, Path]:
    return {"llama3": llama3_dir, "llama4": llama4_dir}


def settings_for(ckpt: Path, **kw):
    return resolve_settings(ckpt, **{**SMALL, **kw})


def load_model(ckpt: Path, mode: str | None = None, **kw) -> Transformer:
    ensure_model_parallel(1)
    return load_model_for_rank(settings_for(ckpt, quantization=mode, **kw), ModelArgs.from_checkpoint(ckpt))


def token_lists(ckpt: Path) -> list[list[int]]:
    from workbench.formats.tokenizer import Tokenizer

    args = ModelArgs.from_checkpoint(ckpt)
    tok = Tokenizer.for_checkpoint(ckpt, args.family)
    return [tok.encode(p, bos=True) for p in PROMPTS]


def logits_of(model: Transformer, seqs: list[list[int]]) -> torch.Tensor:
    """Teacher-forced logits of all sequences, concatenated: [sum(len), V] (right padding is causal-safe)."""
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
    out = model.forward_full(tokens)  # [B, T, V]
    return torch.cat([out[i, : len(s)] for i, s in enumerate(seqs)])


def kl_and_top1(ref: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    p, q = torch.log_softmax(ref, -1), torch.log_softmax(other, -1)
    kl = float((p.exp() * (p - q)).sum(-1).mean())
    return kl, float((ref.argmax(-1) == other.argmax(-1)).float().mean())


_MODELS: dict[tuple, Transformer] = {}
_LOGITS: dict[tuple, torch.Tensor] = {}


def cached_model(ckpt: Path, mode: str | None) -> Transformer:
    """One model per (checkpoint, mode) for the whole module; tests only read them."""
    key = (str(ckpt), mode)
    if key not in _MODELS:
        _MODELS[key] = load_model(ckpt, mode)
    return _MODELS[key]


def cached_logits(ckpt: Path, mode: str | None) -> torch.Tensor:
    key = (str(ckpt), mode)
    if key not in _LOGITS:
        _LOGITS[key] = logits_of(cached_model(ckpt, mode), token_lists(ckpt))
    return _LOGITS[key]


@pytest.fixture(scope="module", autouse=True)
def free_cached_models():
    yield
    _MODELS.clear()
    _LOGITS.clear()


# --------------------------------------------------------------------------------------------- errors
def test_unknown_mode_raises_quantization_error(dirs):
    assert check_mode("none") is None and check_mode("int4_mixed") == "int4_mixed"
    with pytest.raises(QuantizationError) as info:
        quantize_model(cached_model(dirs["llama3"], None), "int8")  # refused before anything changes
    assert "'int8'" in str(info.value) and "int4_mixed" in str(info.value)
    engine = build_engine(settings_for(dirs["llama3"]))
    with pytest.raises(QuantizationError, match="'fp4'"):
        engine.set_quantization("fp4")
    assert engine.settings.quantization is None and len(engine.completion("Hi", max_tokens=2).tokens) == 2


def test_fp8_on_a_device_without_float8_raises_and_keeps_the_model(dirs, monkeypatch):
    engine = build_engine(settings_for(dirs["llama3"]))
    before = engine.completion("Hi", max_tokens=3).tokens
    monkeypatch.setattr(fp8, "storage_supported", lambda device: False)
    with pytest.raises(QuantizationError) as info:
        engine.set_quantization("fp8_mixed")
    assert "float8" in str(info.value) and "'cpu'" in str(info.value) and "int4_mixed" in str(info.value)
    with pytest.raises(QuantizationError):
        quantize_model(load_model(dirs["llama3"]), "fp8_mixed")
    assert engine.settings.quantization is None and engine.completion("Hi", max_tokens=3).tokens == before


# --------------------------------------------------------------------------------------------- formats
def test_fp8_format():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8.FP8_DTYPE)
    finite = ~codes.float().isnan()
    # every finite e4m3 code decodes exactly through the float16 bit trick
    assert torch.equal(fp8.e4m3_to_half_scaled(codes).float()[finite] * 256, codes.float()[finite])
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 96, generator=gen) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different size
    w[5] = 0.0  # an all-zero row stays finite
    q, scale = fp8.quantize_rowwise(w)  # [N, K], [N]
    assert q.dtype == fp8.FP8_DTYPE and scale.shape == (64,) and torch.isfinite(scale).all()
    err = (fp8.dequantize(q, scale) - w).abs()
    # 3 mantissa bits: relative error <= 2**-4, plus half the subnormal step (2**-10 of the row's scale) near 0
    assert (err <= w.abs() * 2**-4 + scale[:, None] * 2**-10 + 1e-12).all()
    x = torch.randn(7, 96, generator=gen)
    want = x @ fp8.dequantize(q, scale).T
    torch.testing.assert_close(fp8.linear(x, q, scale, kernel="dequant"), want, rtol=1e-5, atol=1e-5)
    # the GPU path (per-token e4m3 activations, row-wise _scaled_mm) also runs on CPU: same up to fp8 rounding
    got = fp8.linear(x, q, scale, kernel="scaled_mm")
    assert float((got - want).norm() / want.norm()) < 0.05
    # per-token activation scales are capped at ub / 448: an outlier token saturates instead of
    # crushing the resolution of everything else
    xq, xs = fp8.quantize_per_token(torch.tensor([[5000.0, 1.0], [3.0, -1.0]]), fp8.ACTIVATION_SCALE_UB)
    assert xs[0, 0] == pytest.approx(1200 / 448) and xq[0, 0].float() == 448.0
    assert xs[1, 0] == pytest.approx(3 / 448)


@pytest.mark.parametrize(
    "k,group,k_padded",
    [
        (128, 128, 128),
        (448, 64, 448),
        (224, 128, 256),
        (176, 64, 192),
        (352, 128, 384),
        (64, 64, 64),
        (4096, 128, 4096),
    ],
)
def test_int4_group_size_rule(k, group, k_padded):
    layout = int4.plan_layout(40, k)
    assert (layout.group_size, layout.k_padded, layout.n_padded) == (group, k_padded, 48)


@pytest.mark.parametrize("n,k", [(40, 224), (64, 448), (16, 128)])
def test_int4_format_and_kernels_agree(n, k):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(n, k, generator=gen)
    layout = int4.plan_layout(n, k)
    codes, sz = int4.quantize_groupwise(w, layout)  # [N', K'], [G, N', 2]
    assert codes.max() <= 15 and sz.dtype == torch.bfloat16 and sz.shape == (layout.groups, layout.n_padded, 2)
    deq = int4.dequantize_codes(codes, sz, layout, torch.float32)[:n, :k]
    scale = sz[..., 0].float().t().repeat_interleave(layout.group_size, dim=1)[:n, :k]  # [N, K]
    # 16 levels spanning each group's range: error <= half a step (+ bf16 rounding of the stored zero)
    assert ((deq - w).abs() <= 0.5 * scale + 2**-8 * w.abs().amax()).all()
    x = torch.randn(5, k, generator=gen)
    want = x @ deq.T
    for kernel in ("dequant", int4.pick_kernel("cpu")):
        packed = int4.pack(codes, layout, kernel)
        assert packed.numel() * packed.element_size() == layout.n_padded * layout.k_padded // 2
        got = int4.linear(x, packed, sz, layout, kernel)
        assert got.shape == (5, n) and got.dtype == torch.float32
        assert float((got - want).norm() / want.norm()) < 1e-2, kernel  # bf16 activations inside the CPU kernel
        readback = int4.dequantize(packed, sz, layout, kernel)
        torch.testing.assert_close(readback, deq, rtol=1e-2, atol=1e-2)
    assert int4.pick_kernel("cpu") == "cpu"  # torch's CPU int4 kernel passes its self-check here


# --------------------------------------------------------------------------------------------- the scheme
def _quantized_sites(model: Transformer) -> set[tuple[int, str]]:
    sites = set()
    for i, layer in enumerate(model.layers):
        ff = layer.feed_forward
        if isinstance(ff, QuantizedFeedForward):
            sites.add((i, "feed_forward"))
        for name in ("experts", "shared_expert"):
            if isinstance(getattr(ff, name, None), (QuantizedExperts, QuantizedFeedForward)):
                sites.add((i, name))
    return sites


@pytest.mark.parametrize("family", ["llama3", "llama4"])
@pytest.mark.parametrize("mode", ["fp8_mixed", "int4_mixed"])
def test_scheme_memory_and_untouched_layers(dirs, family, mode):
    base = cached_model(dirs[family], None)
    quant = cached_model(dirs[family], mode)
    assert _quantized_sites(quant) == EXPECTED[(family, mode)]
    # everything not quantized is bit-identical to the unquantized model
    base_params = dict(base.named_parameters())
    remaining = dict(quant.named_parameters())
    assert remaining and all(torch.equal(t, base_params[n]) for n, t in remaining.items())
    assert quant.parameter_count() == base.parameter_count()
    fmt = "fp8" if mode == "fp8_mixed" else "int4"
    for layer, site in EXPECTED[(family, mode)]:
        path = f"layers.{layer}.feed_forward" + ("" if site == "feed_forward" else f".{site}")
        module = quant.get_submodule(path)
        stored = sum(b.numel() * b.element_size() for b in module.buffers())
        weights = [m for m in module.modules() if isinstance(m, QuantizedWeight)]
        assert {m.FORMAT for m in weights} == {fmt}
        bf16_bytes = sum(2 * m.logical_numel() for m in weights)
        assert bf16_bytes == 2 * sum(p.numel() for p in base.get_submodule(path).parameters())
        assert stored <= MAX_BF16_FRACTION[fmt] * bf16_bytes, (path, stored / bf16_bytes)
    # memory report: quantized buffers under their real formats, totals add up
    from workbench.runtime.memory import model_memory

    mem, base_mem = model_memory(quant, 0), model_memory(base, 0)
    rows = summary(quant)
    assert mem["quantized_bytes"] + mem["scale_bytes"] == sum(r["bytes"] for r in rows)
    assert mem["quantized_bf16_bytes"] == sum(r["bf16_bytes"] for r in rows)
    assert mem["weights_bytes"] == sum(t.numel() * t.element_size() for t in [*quant.parameters(), *quant.buffers()])
    label = "int4" if fmt == "int4" else "float8_e4m3fn"
    assert mem["by_dtype"][label] == mem["quantized_bytes"]
    assert (
        mem["weights_bytes"] < base_mem["weights_bytes"]
        and mem["by_kind"]["attention"] == base_mem["by_kind"]["attention"]
    )
    assert set(mem["by_kernel"]) == {f"{fmt}/{int4.pick_kernel('cpu') if fmt == 'int4' else 'dequant'}"}


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_weight_error_matches_the_format(dirs, family):
    """Relative RMS error of every quantized weight: the input of the accuracy bounds (module doc)."""
    base = cached_model(dirs[family], None)
    limits = {"fp8": 0.04, "int4": 0.12}  # e4m3: <= 2**-4/sqrt(3); int4: ~range/15/sqrt(12) ~ 0.1 for Gaussians
    for mode in ("fp8_mixed", "int4_mixed"):
        quant = cached_model(dirs[family], mode)
        for name, module in quant.named_modules():
            if not isinstance(module, (QuantizedFeedForward, QuantizedExperts)):
                continue
            orig = base.get_submodule(name)
            if isinstance(orig, Experts):  # stacks [E, in, out] -> [E, out, in]
                w13 = torch.cat([orig.w1.transpose(1, 2), orig.w3.transpose(1, 2)], dim=1)
                w2 = orig.w2.transpose(1, 2)
            else:
                assert isinstance(orig, FeedForward)
                w13, w2 = torch.cat([orig.w1.weight, orig.w3.weight]), orig.w2.weight
            for q, w in ((module.w13, w13), (module.w2, w2)):
                rel = float((q.dequantize() - w).norm() / w.norm())
                assert 0 < rel < limits[q.FORMAT], (name, q.FORMAT, rel)


@pytest.mark.parametrize("family", ["llama3", "llama4"])
@pytest.mark.parametrize("mode", ["bf16", "fp8_mixed", "int4_mixed"])
def test_logits_stay_close_to_the_unquantized_model(dirs, family, mode):
    ref = cached_logits(dirs[family], None)
    got = cached_logits(dirs[family], mode)
    assert ref.shape[0] > 100
    # Without native bf16 (quantization.kernels), bf16 weights multiply float32 activations; the tiny checkpoints'
    # weights are bf16 values, so bf16 mode's logits may then equal float32's exactly.  Other paths must differ.
    exact_ok = mode == "bf16" and settings_for(dirs[family], quantization=mode).kernels.float32_arithmetic
    assert exact_ok or not torch.equal(got, ref)
    kl, top1 = kl_and_top1(ref, got)
    max_kl, min_top1 = BOUNDS[mode]
    assert kl <= max_kl and top1 >= min_top1, (kl, top1)


def test_bf16_mode_runs_everything_in_bf16(dirs):
    model = cached_model(dirs["llama4"], "bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.new_cache(1, 8).keys[0].dtype == torch.bfloat16  # KV cache (activations) in bf16 too
    assert cached_logits(dirs["llama4"], "bf16").dtype == torch.float32  # logits are returned as float32


def test_fused_key_layout_quantizes_identically(dirs, make_checkpoint):
    fused = make_checkpoint(TINY_LLAMA4, layout="fused")
    for mode in ("fp8_mixed", "int4_mixed"):
        assert torch.equal(cached_logits(fused, mode), cached_logits(dirs["llama4"], mode))


# --------------------------------------------------------------------------------------------- toggling
@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_toggle_restores_logits_and_memory_without_leaks(dirs, family):
    engine = build_engine(settings_for(dirs[family]))
    seqs = token_lists(dirs[family])[:4]
    first_logits, first_memory = engine.logits(seqs), engine.memory()
    engine.set_quantization("bf16")
    bf16_logits, bf16_memory = engine.logits(seqs), engine.memory()
    assert bf16_memory["weights_bytes"] < 0.51 * first_memory["weights_bytes"]
    assert bf16_memory["kv_cache_bytes"] == first_memory["kv_cache_bytes"] // 2
    old = [weakref.ref(engine._runner.model)]
    sizes = {}
    for mode in ("fp8_mixed", "int4_mixed", "bf16"):
        engine.set_quantization(mode)
        sizes[mode] = engine.memory()["weights_bytes"]
        old.append(weakref.ref(engine._runner.model))
        assert engine.settings.quantization == mode
    gc.collect()
    assert all(ref() is None for ref in old[:-1])  # each toggle freed the previous model
    assert sizes["int4_mixed"] < sizes["fp8_mixed"] < first_memory["weights_bytes"]
    assert engine.memory() == bf16_memory
    for a, b in zip(engine.logits(seqs), bf16_logits):
        assert torch.equal(a, b)
    engine.set_quantization(None)
    assert engine.memory() == first_memory
    for a, b in zip(engine.logits(seqs), first_logits):
        assert torch.equal(a, b)
    engine.set_quantization(None)  # same mode: nothing reloaded
    assert engine.memory() == first_memory


# --------------------------------------------------------------------------------------------- default dtype
@pytest.mark.parametrize("which", ["demo", "tiny"])
def test_memory_falls_from_bf16_to_fp8_mixed_to_int4_mixed(dirs, which):
    """With no dtype asked for, every mode stores what it leaves unquantized in bfloat16 (Llama Stack's
    meta-reference does the same), so each mode takes less memory than the one before — on the CPU too,
    where the unquantized default is float32."""
    ckpt = None if which == "demo" else dirs["llama4"]  # None: the embedded demo model
    engine = build_engine(resolve_settings(ckpt, max_batch_size=2, max_seq_len=64, device="cpu"))
    sizes, parts, kv, packed = {}, {}, {}, {}
    try:
        for mode in (None, "bf16", "fp8_mixed", "int4_mixed"):
            engine.set_quantization(mode, progress=False)
            memory = engine.memory()
            sizes[mode], parts[mode], kv[mode] = memory["weights_bytes"], memory["by_part"], memory["kv_cache_bytes"]
            packed[mode] = memory["packed_bytes"]
            # the per-part table accounts for every byte of the weights
            assert sum(n for types in memory["by_part"].values() for n in types.values()) == memory["weights_bytes"]
            want = "float32" if mode is None else "bfloat16"
            assert engine.settings.dtype == getattr(torch, want) and engine.info()["dtype"] == want
            for part in ("embedding", "output", "attention", "norm", "router"):
                assert set(memory["by_part"][part]) == {want}, (mode, part, memory["by_part"][part])
    finally:
        engine.close()
    assert sizes[None] > sizes["bf16"] > sizes["fp8_mixed"] > sizes["int4_mixed"], sizes
    assert kv["bf16"] == kv["fp8_mixed"] == kv["int4_mixed"] == kv[None] // 2  # the KV cache is bf16 too
    assert {"float8_e4m3fn", "float32 scales"} <= set(parts["fp8_mixed"]["routed_experts"])
    assert {"int4", "bfloat16 scales"} <= set(parts["int4_mixed"]["routed_experts"])
    assert set(parts["int4_mixed"]["shared_expert"]) == {"int4", "bfloat16 scales"}
    # the float32 model also keeps a packed float32 copy of its output matrix for the CPU's batched-decode
    # kernel, beside the weights; no bfloat16 or quantized mode keeps one, so what the weights occupy falls more
    assert packed[None] == parts[None]["output"]["float32"] and packed["bf16"] == packed["int4_mixed"] == 0
    assert packed["fp8_mixed"] == 0
    if which == "demo":  # MoE at layers 1, 3, 5 of 6: fp8_mixed leaves the last one's experts in bfloat16
        experts, all_bf16 = parts["fp8_mixed"]["routed_experts"], parts["bf16"]["routed_experts"]["bfloat16"]
        assert experts["bfloat16"] * 3 == all_bf16  # one layer of three, as Llama Stack's fp8_mixed leaves it
        assert experts["float8_e4m3fn"] * 3 == all_bf16  # two layers at one byte a weight


def test_an_explicit_dtype_keeps_the_unquantized_parts_in_it(dirs):
    model = cached_model(dirs["llama4"], "int4_mixed")  # loaded with dtype="float32" (SMALL)
    parts = model_memory(model, 0)["by_part"]
    assert set(parts["embedding"]) == set(parts["attention"]) == {"float32"}
    assert set(parts["routed_experts"]) == {"int4", "bfloat16 scales"}


# --------------------------------------------------------------------------------------------- pre-quantized
def write_prequantized(
    folder: Path, params: dict, *, n_shards: int, layout: str = "modules", divisor: float = 400.0
) -> dict:
    """A checkpoint in Meta's pre-quantized fp8 format, written independently of workbench's quantizer.

    Quantized weights (Llama 3: layer 1's feed-forward; Llama 4: layer 1's routed experts) are stored as
    e4m3 codes with scales ``amax / divisor`` per output row — not workbench's 448, so a test can tell
    whether the file's scales were used.  Returns {(rank, key): (codes [E?, N, K], scale [E?, N])}.
    """
    folder.mkdir(parents=True, exist_ok=True)
    args = ModelArgs.from_dict(dict(params), source="test")
    llama4 = args.moe_args is not None
    state = {k: v.to(torch.bfloat16) for k, v in random_state_dict(args, seed=0).items()}
    written = {}
    for rank, shard in enumerate(shard_state_dict(state, n_shards)):
        scales = {}
        for w in ("w1", "w2", "w3"):
            key = f"layers.1.feed_forward.experts.{w}" if llama4 else f"layers.1.feed_forward.{w}.weight"
            tensor = shard[key].float()
            oriented = tensor.transpose(1, 2) if llama4 else tensor  # [E?, N, K]
            scale = oriented.abs().amax(-1) / divisor  # [E?, N]
            codes = (oriented / scale[..., None]).to(torch.float8_e4m3fn)
            shard[key] = (codes.transpose(1, 2) if llama4 else codes).contiguous()
            scales[key if llama4 else f"1_feed_forward.{w}_{rank}"] = scale.flatten() if llama4 else scale
            written[(rank, key)] = (codes, scale)
        torch.save(fuse_keys(shard, args) if layout == "fused" else shard, folder / f"consolidated.{rank:02d}.pth")
        torch.save(scales, folder / f"fp8_scales_{rank}.pt")
    (folder / "params.json").write_text(json.dumps(params))
    shutil.copyfile(bundled_tokenizer_path(args.family), folder / "tokenizer.model")
    return written


@pytest.mark.parametrize("family,layout", [("llama3", "modules"), ("llama4", "fused")])
def test_prequantized_fp8_checkpoint(tmp_path, dirs, family, layout):
    params = TINY_LLAMA3 if family == "llama3" else TINY_LLAMA4
    written = write_prequantized(tmp_path / "fp8", params, n_shards=1, layout=layout)
    path = "layers.1.feed_forward" + (".experts" if family == "llama4" else "")
    key = (lambda w: f"{path}.{w}") if family == "llama4" else (lambda w: f"{path}.{w}.weight")
    # fp8_mixed: the stored codes and the file's scales are used as they are (no re-quantization)
    model = load_model(tmp_path / "fp8", "fp8_mixed")
    module = model.get_submodule(path)
    assert isinstance(module.w13, Fp8Weight)
    (c1, s1), (c3, s3), (c2, s2) = (written[(0, key(w))] for w in ("w1", "w3", "w2"))
    assert torch.equal(module.w13.weight.view(torch.uint8), torch.cat([c1, c3], dim=-2).view(torch.uint8))
    assert torch.equal(module.w13.scale, torch.cat([s1, s3], dim=-1)) and torch.equal(module.w2.scale, s2)
    # other modes dequantize the codes with the scales: the model is the bf16 one up to fp8 rounding
    seqs = token_lists(dirs[family])[:5]
    original = logits_of(cached_model(dirs[family], None), seqs)
    for mode in (None, "fp8_mixed", "int4_mixed"):
        kl, top1 = kl_and_top1(original, logits_of(load_model(tmp_path / "fp8", mode), seqs))
        assert kl <= BOUNDS[mode or "fp8_mixed"][0] and top1 >= BOUNDS[mode or "fp8_mixed"][1], (mode, kl, top1)


def test_prequantized_two_shards_merged_into_one_rank(tmp_path, dirs):
    write_prequantized(tmp_path / "two", TINY_LLAMA3, n_shards=2)
    written = write_prequantized(tmp_path / "one", TINY_LLAMA3, n_shards=1)
    merged = load_model(tmp_path / "two", "fp8_mixed").get_submodule("layers.1.feed_forward")
    single = load_model(tmp_path / "one", "fp8_mixed").get_submodule("layers.1.feed_forward")
    # w1/w3 are cut on their rows, which the scales index: merging the shards is exact
    assert torch.equal(merged.w13.scale, single.w13.scale)
    assert torch.equal(merged.w13.weight.view(torch.uint8), single.w13.weight.view(torch.uint8))
    # w2 is cut on its inputs: each shard's rows have their own scale, so the merged rows are
    # dequantized per shard and re-quantized (scale = amax / 448 of the whole row)
    w2 = single.w2.dequantize()
    assert not torch.equal(merged.w2.scale, written[(0, "layers.1.feed_forward.w2.weight")][1])
    assert float((merged.w2.dequantize() - w2).norm() / w2.norm()) < 0.04
    kl, top1 = kl_and_top1(
        cached_logits(dirs["llama3"], None), logits_of(load_model(tmp_path / "two", None), token_lists(dirs["llama3"]))
    )
    assert kl <= BOUNDS["fp8_mixed"][0] and top1 >= BOUNDS["fp8_mixed"][1]


def test_scale_files_that_do_not_match_the_shards_are_refused(tmp_path, dirs):
    folder = tmp_path / "stale"
    shutil.copytree(dirs["llama3"], folder)
    torch.save({"1_feed_forward.w1_0": torch.ones(448)}, folder / "fp8_scales_0.pt")
    with pytest.raises(QuantizationError, match="not float8 e4m3 codes"):
        load_model(folder, None)
    torch.save({"1_attention.wq_0": torch.ones(128)}, folder / "fp8_scales_0.pt")
    with pytest.raises(QuantizationError, match="names no feed-forward"):
        load_model(folder, "fp8_mixed")
    (folder / "fp8_scales_0.pt").unlink()
    torch.save({}, folder / "int4_scales_0.pt")  # Meta's pre-quantized int4 format: refused up front
    with pytest.raises(QuantizationError, match="int4_mixed"):
        load_model(folder, "int4_mixed")


# --------------------------------------------------------------------------------------------- model parallel
@pytest.mark.parametrize(
    "family,modes", [("llama3", ("fp8_mixed", "int4_mixed")), ("llama4", ("fp8_mixed", "int4_mixed", "bf16"))]
)
def test_model_parallel_2_matches_1(dirs, family, modes):
    """Each rank quantizes its own slice.  Rows cut on the output dim (w1/w3) quantize exactly as in one
    process; w2 is cut on its inputs, so its row scales (fp8) and groups (int4) are a rank's own and
    the model differs from the one-process one by quantization noise — bounded like the modes themselves.
    (Unquantized mp=2 == mp=1 is tests/test_parallel.py's; bf16 is a plain dtype, run once, on the MoE
    model.)  Each mode is a fresh ``workbench.load``: every load starts two worker processes."""

    seqs = token_lists(dirs[family])[:5]
    try:
        for mode in modes:
            engine = wb.load(dirs[family], model_parallel_size=2, quantization=mode, **SMALL)
            assert engine.settings.model_parallel_size == 2 and engine.settings.quantization == mode
            got = torch.cat(engine.logits(seqs))
            want = logits_of(cached_model(dirs[family], mode), seqs)
            kl, top1 = kl_and_top1(want, got)
            max_kl, min_top1 = BOUNDS[mode]
            assert kl <= max_kl and top1 >= min_top1, (mode, kl, top1)
            assert engine.completion(PROMPTS[1], max_tokens=3).tokens
    finally:
        wb.unload()


# --------------------------------------------------------------------------------------------- benchmark API
def test_bench_quantization_table(dirs):
    engine = build_engine(settings_for(dirs["llama3"], quantization="bf16"))
    table = bench.quantization(engine, PROMPTS[:2], max_tokens=3)
    assert list(table.index) == ["none", "bf16", "fp8_mixed", "int4_mixed"]
    assert engine.settings.quantization == "bf16"  # restored
    none = table.loc["none"]
    assert none.top1_agreement == 1.0 and none.greedy_match == 1.0 and abs(none.mean_kl) < 1e-6
    assert none.weights_ratio == 1.0 and table.loc["bf16"].weights_ratio < 0.51
    assert table.loc["int4_mixed"].weights_bytes < table.loc["fp8_mixed"].weights_bytes
    assert table.loc["int4_mixed"].kernels == "int4/cpu" and table.loc["fp8_mixed"].kernels == "fp8/dequant"
    assert table.loc["fp8_mixed"].quantized_vs_bf16 <= MAX_BF16_FRACTION["fp8"]
    assert table.loc["int4_mixed"].quantized_vs_bf16 <= MAX_BF16_FRACTION["int4"]
    assert (table.decode_tok_s > 0).all() and (table.prefill_tok_s > 0).all()
    for mode, (max_kl, _) in BOUNDS.items():
        assert 0 < table.loc[mode].mean_kl <= max_kl
    # equal work in every mode, and the memory table says per part what each mode stores in which type
    assert (table.generated_tokens == 3 * 2).all() and (table.prompt_tokens == table.prompt_tokens.iloc[0]).all()
    parts = bench.memory_table(table)
    assert parts.loc["embedding", "none"].startswith("float32")
    assert parts.loc["embedding", "bf16"].startswith("bfloat16")
    assert parts.loc["embedding", "int4_mixed"].startswith("float32")  # the engine was loaded with dtype="float32"
    ffn = parts.loc["feed_forward", "int4_mixed"]
    assert ffn.startswith("int4") and "bfloat16 scales" in ffn
    assert list(parts.index)[-1] == "total" and list(parts.columns) == list(table.index)
    # what the weights occupy: their bytes plus the packed float32 copy a CPU kernel keeps (bfloat16: none)
    assert (table.resident_bytes == table.weights_bytes + table.packed_bytes).all()
    assert table.loc["none"].packed_bytes > 0 and table.loc["bf16"].packed_bytes == 0
    assert table.loc["none"].resident_ratio == 1.0
    assert table.loc["bf16"].resident_ratio < table.loc["bf16"].weights_ratio
    assert (
        parts.loc["output: CPU packed copy", "none"].startswith("float32")
        and parts.loc["output: CPU packed copy", "bf16"] == "-"
    )
    assert parts.loc["weights", "none"] == human_bytes(table.loc["none"].weights_bytes)
    assert parts.loc["total", "none"] == human_bytes(table.loc["none"].resident_bytes)
    # every cell displays whole (pandas cuts cells at 50 characters by default)
    long = "int4 1.0 MiB + bfloat16 scales 1.0 KiB + bfloat16 1.0 MiB + something else that is long"
    parts.loc["feed_forward", "int4_mixed"] = long
    assert long in repr(parts) and long in parts._repr_html_()
    # medians with their spread, from every repeat
    for speed in ("prefill_tok_s", "decode_tok_s"):
        assert (table[f"{speed}_min"] <= table[speed]).all() and (table[speed] <= table[f"{speed}_max"]).all()
