"""Kernels chosen by the CPU (workbench.quantization.kernels): the decision, what engine.settings reports, and
that every mode gives the same tokens and (to its tolerance) the same logits on the AVX2 path as on this
machine's default one.  The AVX2 path runs in a subprocess with ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2`` (torch reads them at import), which forces AVX2 kernels on an AVX-512 machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.errors import ConfigError
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.layers import NARROW_WEIGHT_MAX_ROWS, NARROW_WEIGHT_MIN_NUMEL, linear
from workbench.quantization.kernels import ENV, choose_kernels
from workbench.runtime.loading import load_model_for_rank
from workbench.session import resolve_settings

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
MODES = [None, "bf16", "fp8_mixed", "int4_mixed"]
PROMPTS = [[1, 5, 9, 13, 17, 21, 25, 29], [1, 40, 41, 42], [1, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 3]]
GREEDY_TOKENS = 6
# Max mean KL (nats) between the two paths' logits, and min top-1 agreement over the teacher-forced positions:
# float32 differs only in summation order; bf16 arithmetic vs float32 arithmetic on bf16 weights by bf16 rounding
# of the activations (the bf16 mode's own tolerance against float32, tests/test_quantization.py's BOUNDS).
BOUNDS = {None: (1e-6, 1.0), "bf16": (5e-3, 0.85), "fp8_mixed": (1e-2, 0.85), "int4_mixed": (1e-2, 0.85)}


# Greedy tokens must agree wherever the default path's choice is clear: a step whose top-1 logit leads the
# runner-up by less than this (a near-tie that bf16 rounding may flip) ends the comparison.
NEAR_TIE = {None: 1e-3, "bf16": 0.25, "fp8_mixed": 0.25, "int4_mixed": 0.25}


def collect(ckpts: dict[str, str]) -> dict:
    """Each mode of each checkpoint: teacher-forced logits, greedy tokens and their margins (plain forward passes,
    no KV cache) and the kernel plan it ran under.  Run in-process and in a subprocess with the AVX2 path forced."""
    ensure_model_parallel(1)
    result: dict = {"isa": torch.backends.cpu.get_cpu_capability()}
    for family, ckpt in ckpts.items():
        for mode in MODES:
            settings = resolve_settings(ckpt, max_batch_size=4, max_seq_len=64, device="cpu", quantization=mode)
            model = load_model_for_rank(settings, ModelArgs.from_checkpoint(ckpt))
            logits, greedy, margins = [], [], []
            for ids in PROMPTS:
                tokens = torch.tensor([ids])
                logits.append(model.forward_full(tokens)[0])  # [T, V]
                for _ in range(GREEDY_TOKENS):
                    top = model.forward_full(tokens)[0, -1].topk(2)
                    margins.append(float(top.values[0] - top.values[1]))
                    tokens = torch.cat([tokens, top.indices[:1].view(1, 1)], dim=1)
                greedy.append(tokens[0, len(ids) :].tolist())
            result[f"{family}/{mode}"] = {
                "logits": torch.cat(logits),
                "greedy": greedy,
                "margins": margins,
                "kernels": str(settings.kernels),
                "arithmetic": settings.kernels.arithmetic,
            }
    return result


SCRIPT = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from test_cpu_kernels import collect
torch.save(collect(json.loads(sys.argv[2])), sys.argv[3])
"""


@pytest.fixture(scope="module")
def both_paths(llama3_dir: Path, llama4_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """(this process's default path, the AVX2 path in a subprocess): :func:`collect` of both tiny families."""
    ckpts = {"llama3": str(llama3_dir), "llama4": str(llama4_dir)}
    out = tmp_path_factory.mktemp("isa") / "avx2.pt"
    env = {**os.environ, **AVX2, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop(ENV, None)
    argv = [sys.executable, "-c", SCRIPT, str(Path(__file__).parent), json.dumps(ckpts), str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return collect(ckpts), torch.load(out, weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama3", "llama4"])
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_gives_the_same_tokens_and_logits_on_the_avx2_path(both_paths, family, mode):
    default, avx2 = both_paths
    assert avx2["isa"] == "AVX2"
    here, there = default[f"{family}/{mode}"], avx2[f"{family}/{mode}"]
    for row, (ours, theirs) in enumerate(zip(here["greedy"], there["greedy"])):
        margins = here["margins"][row * GREEDY_TOKENS : (row + 1) * GREEDY_TOKENS]
        for step, (a, b, margin) in enumerate(zip(ours, theirs, margins)):
            if a != b:  # only at a near-tie, after which each path continues its own sequence
                assert margin < NEAR_TIE[mode], (row, step, a, b, margin)
                break
    p, q = torch.log_softmax(here["logits"], -1), torch.log_softmax(there["logits"], -1)
    kl = float((p.exp() * (p - q)).sum(-1).mean())
    top1 = float((here["logits"].argmax(-1) == there["logits"].argmax(-1)).float().mean())
    max_kl, min_top1 = BOUNDS[mode]
    assert kl <= max_kl and top1 >= min_top1, (kl, top1)
    if mode is None:
        torch.testing.assert_close(there["logits"], here["logits"], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_the_avx2_path_reports_bf16_weights_with_float32_arithmetic(both_paths):
    avx2 = both_paths[1]
    for mode in ("bf16", "int4_mixed"):
        assert avx2[f"llama4/{mode}"]["arithmetic"] == "float32"
        assert avx2[f"llama4/{mode}"]["kernels"].startswith(
            "AVX2: no native bf16 - bfloat16 weights, float32 arithmetic"
        )
    assert "int4 experts through torch's packed CPU kernel" in avx2["llama4/int4_mixed"]["kernels"]
    assert avx2["llama4/None"]["kernels"] == "AVX2: float32 weights and arithmetic"


@pytest.mark.parametrize("mode", ["bf16", "int4_mixed", "fp8_mixed"])
def test_without_native_bf16_bf16_weights_compute_in_float32(mode):
    plan = choose_kernels("cpu", mode, torch.bfloat16, isa="AVX2", choice="auto")
    assert plan.float32_arithmetic and plan.arithmetic == "float32" and plan.weights == "bfloat16"
    assert not plan.column_major_bf16 and not plan.one_row_as_two
    assert str(plan).startswith("AVX2: no native bf16 - bfloat16 weights, float32 arithmetic")
    legacy = choose_kernels("cpu", mode, torch.bfloat16, isa="AVX2", choice="legacy")
    assert legacy.arithmetic == "bfloat16" and legacy.column_major_bf16 and "legacy" in str(legacy)
    assert choose_kernels("cpu", mode, torch.bfloat16, isa="AVX2", choice="native").arithmetic == "bfloat16"
    parallel = choose_kernels("cpu", mode, torch.bfloat16, isa="AVX2", mp_size=2)  # fairscale needs one dtype
    assert parallel.arithmetic == "bfloat16" and "model-parallel" in str(parallel)


def test_float32_weights_and_other_devices_keep_their_dtype():
    assert str(choose_kernels("cpu", None, torch.float32, isa="AVX2")) == "AVX2: float32 weights and arithmetic"
    assert not choose_kernels("cpu", None, torch.float32, isa="AVX512").float32_arithmetic
    assert str(choose_kernels("meta", "bf16", torch.bfloat16)) == "meta: bfloat16 weights and arithmetic"


def test_the_choice_comes_from_the_environment_and_a_bad_one_names_the_fix(monkeypatch):
    monkeypatch.setenv(ENV, "float32")
    assert choose_kernels("cpu", "bf16", torch.bfloat16, isa="AVX512").arithmetic == "float32"
    settings = resolve_settings(None, quantization="bf16", device="cpu")
    assert settings.kernels.arithmetic == "float32" and "float32 arithmetic" in str(settings.kernels)
    monkeypatch.setenv(ENV, "fastest")
    with pytest.raises(ConfigError, match=f"{ENV}='fastest' is not a kernel choice; use one of auto, native"):
        choose_kernels("cpu", "bf16", torch.bfloat16)


def test_a_forced_float32_plan_keeps_bf16_weights_and_kv_cache_and_computes_in_float32(llama4_dir, monkeypatch):
    monkeypatch.setenv(ENV, "float32")
    ensure_model_parallel(1)
    settings = resolve_settings(llama4_dir, max_batch_size=2, max_seq_len=32, device="cpu", quantization="bf16")
    model = load_model_for_rank(settings, ModelArgs.from_checkpoint(llama4_dir))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # the memory saving stays
    assert model.new_cache(1, 8).keys[0].dtype == torch.bfloat16
    assert model.embed(torch.tensor([[1, 2]])).dtype == torch.float32  # activations float32
    out = model.forward_full(torch.tensor([[1, 5, 9]]))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


@pytest.mark.parametrize("rows", [1, NARROW_WEIGHT_MAX_ROWS, NARROW_WEIGHT_MAX_ROWS + 1, 40])
def test_linear_on_bf16_weights_matches_float32_products_to_bf16_precision(rows):
    gen = torch.Generator().manual_seed(0)
    for n in (48, NARROW_WEIGHT_MIN_NUMEL // 64):  # a small weight (always widened) and a large one
        w = (torch.randn(n, 64, generator=gen) * 0.1).bfloat16()
        x = torch.randn(rows, 64, generator=gen)
        got = linear(x, w)
        want = torch.nn.functional.linear(x, w.float())
        assert got.dtype == torch.float32 and got.shape == (rows, n)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        if rows > NARROW_WEIGHT_MAX_ROWS or n == 48:  # widened: exact float32 products
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
