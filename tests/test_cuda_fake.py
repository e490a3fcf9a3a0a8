"""The CUDA path without a GPU: load, prefill and decode on fake ``cuda`` tensors (``tests/_fake_cuda.py``).

For each family (Llama 3, Llama 4) and quantization mode (none, bf16, fp8_mixed, int4_mixed) a tiny checkpoint goes
through the real loading path for ``device="cuda"`` (settings and preflight, ``load_model_for_rank``: shard reading,
quantization — fp8/int4 assemble on the CPU and quantize onto the GPU —, the kernel self-tests) and then through
``LocalRunner.generate`` (scheduler, packed prefill, decode steps, greedy and sampled rows, logprobs) at batch sizes
1 and 3 (with prefix reuse: a held slot continued, a shared prefix copied between slots), through the fixed-shape
decode steps that CUDA graphs capture, and through ``logits`` (padded full forwards); the padded prefill image rows
take after cached prefixes runs, and Llama 4's vision encoder loads and encodes on the GPU. Asserted: every weight,
the KV cache and every forward's inputs and outputs are on ``cuda`` with the expected dtype and shape, and the GPU
kernels (``torch._scaled_mm``, ``torch._weight_int4pack_mm``, ``torch._grouped_mm``) are the ones chosen. A CPU
tensor meeting a CUDA one anywhere on the way raises ``FakeTensorDeviceMismatchError``.

What fake tensors do not reach (only a GPU run does — ``bench/gpu_session.sh``): values and numerics (every token
here is a stand-in, id 0; the CPU tests check values), CUDA graph capture and replay (``StaticDecode.capture``:
streams, graph pools), NCCL and the model-parallel workers (separate processes), kernel-specific limits a meta
kernel does not check (alignment, a dtype a CUDA kernel lacks), speed and memory, and what host reads steer:
scoring's chunks (``Scheduler.score``), merging image patches into a prompt (a boolean mask). Constrained (grammar)
rows are left out: a grammar's next token depends on the tokens before it, which are stand-ins here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from _fake_cuda import fake_cuda
from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError

from workbench.checkpoints.factory import TINY_LLAMA4_VISION
from workbench.checkpoints.load import check_vocab
from workbench.config import check_settings, resolve_settings
from workbench.formats.tokenizer import Tokenizer
from workbench.generation import Event, Request, SamplingParams
from workbench.generation.prefix_cache import MIN_SHARED_PREFIX
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.kv_cache import KVCache
from workbench.models.transformer import Transformer
from workbench.quantization import Fp8Weight, Int4Weight, QuantizedWeight, fp8, int4, quantization_plan, summary
from workbench.runtime.loading import load_model_for_rank
from workbench.runtime.local import LocalRunner

H100, A100 = (9, 0), (8, 0)
MAX_TOKENS = 3
MAX_SEQ_LEN = 64
SLOTS = 4
CUDA = torch.device("cuda", 0)


@dataclass
class Forward:
    """One call of a model forward: its name, token (and position) inputs and logits."""

    name: str
    tokens: torch.Tensor
    positions: torch.Tensor | None
    logits: torch.Tensor


class ForwardSpy:
    """Records every prefill and decode forward the scheduler makes on ``model`` (instance attributes shadow
    the methods, so the scheduler's ``self.model.forward_*`` calls go through here)."""

    def __init__(self, model: Transformer) -> None:
        self.calls: list[Forward] = []
        model.forward_packed = self._wrap("forward_packed", model.forward_packed, positions_at=None)
        model.forward_decode = self._wrap("forward_decode", model.forward_decode, positions_at=0)
        model.forward_decode_static = self._wrap("forward_decode_static", model.forward_decode_static, positions_at=0)

    def _wrap(self, name: str, forward: Any, positions_at: int | None) -> Any:
        def spy(tokens: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            logits = forward(tokens, *args, **kwargs)
            self.calls.append(Forward(name, tokens, None if positions_at is None else args[positions_at], logits))
            return logits

        return spy

    def take(self) -> list[Forward]:
        calls, self.calls = self.calls, []
        return calls


def _settings(ckpt: Path, mode: str | None) -> Any:
    return check_settings(
        resolve_settings(ckpt, device="cuda", quantization=mode, max_batch_size=SLOTS, max_seq_len=MAX_SEQ_LEN)
    )


def _requests(prompts: list[list[int]]) -> list[Request]:
    """One request per prompt: greedy, sampled (seeded), greedy with logprobs, in turn."""
    kinds = [
        SamplingParams.create(max_tokens=MAX_TOKENS),
        SamplingParams.create(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.9, top_k=50, seed=7),
        SamplingParams.create(max_tokens=MAX_TOKENS, logprobs=2),
    ]
    return [Request(i, prompt, kinds[i % len(kinds)]) for i, prompt in enumerate(prompts)]


def _waves(seed: int = 0) -> list[list[list[int]]]:
    """The prompts of two calls: one row, then three rows of different lengths — one continuing the first call's
    prompt (its slot's keys reused), two sharing a prefix (computed once, then copied to the other's slot)."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(1000, 60000) for _ in range(n)]

    first = ids(9)
    shared = ids(MIN_SHARED_PREFIX + 2)
    return [[first], [first + ids(4), shared + ids(3), shared + ids(6)]]


def _off_cuda(module: torch.nn.Module) -> list[str]:
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return [f"{name} on {t.device}" for name, t in tensors if t.device != CUDA]


def _check_weights(model: Transformer, args: ModelArgs, mode: str | None, capability: tuple[int, int]) -> None:
    """Every weight on the GPU; quantized weights in their format and the GPU kernel; the rest in bfloat16;
    the logical shapes those of the unquantized model."""
    assert not _off_cuda(model), f"weights left off the GPU: {_off_cuda(model)[:5]}"
    assert model.device == CUDA and model.dtype == torch.bfloat16  # resolve_dtype: bfloat16 on CUDA
    plan = quantization_plan(args, mode)
    rows = summary(model)
    assert len(rows) == 2 * len(plan)  # w13 and w2 of every target
    gpu_kernel = {"fp8": "scaled_mm" if capability >= (8, 9) else "dequant", "int4": "cuda"}
    wrong = [(r["name"], r["kernel"]) for r in rows if r["kernel"] != gpu_kernel[r["format"]]]
    assert not wrong, f"not the GPU kernel at capability {capability}: {wrong[:4]}"
    quantized = {name for name, m in model.named_modules() if isinstance(m, QuantizedWeight)}
    for name, module in model.named_modules():
        if isinstance(module, Fp8Weight):
            assert (module.weight.dtype, module.scale.dtype) == (fp8.FP8_DTYPE, torch.float32), name
            assert module.scale.shape == module.weight.shape[:-1], name
        elif isinstance(module, Int4Weight):
            assert module.packed.dtype == torch.int32, f"{name}: not the CUDA tile packing ({module.packed.dtype})"
            assert module.scales_and_zeros.dtype == int4.SCALE_DTYPE, name
            layout, matrices = module.layout, (module.shape[0] if len(module.shape) == 3 else 1)
            stored = module.packed.numel() * module.packed.element_size()
            assert stored == matrices * layout.n_padded * layout.k_padded // 2, f"{name}: not 4 bits per weight"
    floats = [(n, p.dtype) for n, p in model.named_parameters() if not any(n.startswith(q + ".") for q in quantized)]
    assert all(dtype == torch.bfloat16 for _, dtype in floats), [f for f in floats if f[1] != torch.bfloat16][:4]
    unquantized = Transformer(args, max_seq_len=8, device="meta")
    assert model.parameter_count() == unquantized.parameter_count()  # every quantized shape stands for its weight


def _check_cache(cache: KVCache, model: Transformer, args: ModelArgs) -> None:
    shape = (SLOTS, model.n_local_kv_heads(), MAX_SEQ_LEN, args.rope_head_dim)
    for t in cache.keys + cache.values:
        assert (t.device, t.dtype, tuple(t.shape)) == (CUDA, torch.bfloat16, shape), "KV cache: device, dtype, shape"


def _check_forwards(calls: list[Forward], requests: list[Request], vocab: int, static: bool) -> None:
    """Packed prefills (a shared prefix first, when there is one), then MAX_TOKENS - 1 decode steps of all rows;
    all on the GPU."""
    prefills = [c for c in calls if c.name == "forward_packed"]
    decode = calls[len(prefills) :]
    assert prefills and calls[: len(prefills)] == prefills
    for prefill in prefills:
        tokens, logits = prefill.tokens, prefill.logits
        assert (tokens.device, tokens.dtype, tokens.dim(), tokens.shape[0]) == (CUDA, torch.int64, 2, 1)
        assert (logits.device, logits.dtype, logits.shape[1]) == (CUDA, torch.float32, vocab)
    assert prefills[-1].logits.shape[0] == len(requests)
    assert [c.name for c in decode] == ["forward_decode_static" if static else "forward_decode"] * (MAX_TOKENS - 1)
    width = 1 << (len(requests) - 1).bit_length() if static else len(requests)  # static steps pad to a bucket
    for step in decode:
        assert (step.tokens.device, step.tokens.dtype, tuple(step.tokens.shape)) == (CUDA, torch.int64, (width,))
        assert step.positions is not None and step.positions.device == CUDA and step.positions.dtype == torch.int64
        assert step.positions.shape[0] == width
        assert (step.logits.device, step.logits.dtype, tuple(step.logits.shape)) == (
            CUDA,
            torch.float32,
            (width, vocab),
        )


def _check_events(events: list[Event], requests: list[Request]) -> None:
    """Each row: MAX_TOKENS tokens (the stand-in token 0 stops nothing), the last one out of tokens."""
    for request in requests:
        mine = [e for e in events if e.index == request.index]
        assert [e.token is not None for e in mine] == [True] * MAX_TOKENS
        assert mine[-1].stop_reason == "out_of_tokens"
        assert all((e.logprob is not None) == bool(request.params.logprobs) for e in mine)


def _float_moe_layers(args: ModelArgs, mode: str | None) -> list[int]:
    """Llama 4 MoE layers whose routed experts the mode leaves in float (they run as grouped GEMMs on a 9.0 GPU)."""
    quantized = {t.layer for t in quantization_plan(args, mode) if t.path == "feed_forward.experts"}
    return [layer for layer in range(args.n_layers) if args.is_moe_layer(layer) and layer not in quantized]


def _run(ckpt: Path, mode: str | None, capability: tuple[int, int], *, static: bool = False) -> None:
    grouped_mm = torch._grouped_mm
    grouped_calls = []

    def counted_grouped_mm(*args: Any, **kwargs: Any) -> torch.Tensor:
        grouped_calls.append(args[0].device)
        return grouped_mm(*args, **kwargs)

    with fake_cuda(capability) as fake, mock.patch("torch._grouped_mm", counted_grouped_mm):
        settings = _settings(ckpt, mode)
        args = ModelArgs.from_checkpoint(settings.checkpoint_dir)
        tokenizer = Tokenizer.for_checkpoint(settings.checkpoint_dir, args.family)
        check_vocab(args, tokenizer.n_words, str(settings.checkpoint_dir))
        ensure_model_parallel(1)
        with fake:
            model = load_model_for_rank(settings, args)
            _check_weights(model, args, mode, capability)
            runner = LocalRunner(model, tokenizer, settings=settings, args=args)
            _check_cache(runner.scheduler.cache, model, args)
            memory = runner.memory()  # engine.memory(): what the GPU holds, by kernel
            assert memory["kv_cache_bytes"] == sum(t.numel() * 2 for t in runner.scheduler.cache.keys) * 2
            assert set(memory["by_kernel"]) == {f"{r['format']}/{r['kernel']}" for r in summary(model)}
            if static:  # the fixed-shape steps CUDA graphs capture, run uncaptured (capture needs a device)
                runner.scheduler.use_static_decode(True, capture=False)
            spy = ForwardSpy(model)
            for prompts in _waves():  # batch sizes 1 and 3
                requests = _requests(prompts)
                events = list(runner.generate(requests))
                _check_events(events, requests)
                _check_forwards(spy.take(), requests, args.vocab_size, static)
            assert runner.scheduler.stats["reused_tokens"] > 0  # the prefix-copy path ran on the device too
            _check_cache(runner.scheduler.cache, model, args)
            rows = _waves(seed=5)[1]
            teacher_forced = runner.logits(rows)  # engine.logits: padded full forwards, logits copied to the host
            assert [(t.device.type, t.dtype, tuple(t.shape)) for t in teacher_forced] == [
                ("cpu", torch.float32, (len(r), args.vocab_size)) for r in rows
            ]
            runner.close()
        uses_grouped = capability >= (9, 0) and bool(args.moe_args and _float_moe_layers(args, mode))
        assert bool(grouped_calls) == uses_grouped, f"torch._grouped_mm calls: {len(grouped_calls)}"
        assert all(device == CUDA for device in grouped_calls)


@pytest.mark.parametrize("mode", [None, "bf16", "fp8_mixed", "int4_mixed"], ids=str)
@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_load_prefill_and_decode_on_an_h100(request, family, mode):
    """Every mode on an H100 (fp8 through ``torch._scaled_mm``, int4 through the tinygemm kernels, Llama 4's
    float experts through ``torch._grouped_mm``, its quantized experts through the per-expert loop)."""
    _run(request.getfixturevalue(f"{family}_dir"), mode, H100)


@pytest.mark.parametrize(("family", "mode"), [("llama3", "fp8_mixed"), ("llama4", None)])
def test_load_prefill_and_decode_on_an_a100(request, family, mode):
    """Compute capability 8.0: no fp8 tensor cores (fp8 weights widened on the GPU) and no grouped GEMM (Llama 4's
    float experts through the per-expert loop)."""
    _run(request.getfixturevalue(f"{family}_dir"), mode, A100)


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_fixed_shape_decode_steps_on_cuda(request, family):
    """The steps ``cuda_graphs=True`` captures, with their device buffers, padded widths and static outputs."""
    _run(request.getfixturevalue(f"{family}_dir"), None, H100, static=True)


def test_vision_encoder_loads_and_encodes_on_cuda(make_checkpoint):
    """Llama 4's vision weights load onto the GPU at the first image, in the text model's dtype, and encode host
    tiles there.  (Merging the patch embeddings into a prompt selects positions by a boolean mask: its size is
    data, so the image prefill itself needs a GPU run.)"""
    ckpt = make_checkpoint(TINY_LLAMA4_VISION)
    with fake_cuda() as fake:
        settings = _settings(ckpt, None)
        args = ModelArgs.from_checkpoint(settings.checkpoint_dir)
        ensure_model_parallel(1)
        with fake:
            model = load_model_for_rank(settings, args)
            assert not model.vision_loaded
            model.ensure_vision()
            assert model.vision_loaded and not _off_cuda(model), _off_cuda(model)[:5]
            vision = [*model.vision_embeddings.parameters(), *model.vision_projection.parameters()]
            assert vision and all(p.dtype == torch.bfloat16 for p in vision)
            tiles = torch.rand(3, 3, 56, 56)  # preprocessed tiles come from the host
            features = model.encode_images(tiles)
            tokens_per_tile = 4  # TINY_VISION_ARGS: 4x4 patches, pixel shuffle 0.5
            assert (features.device, features.dtype, tuple(features.shape)) == (
                CUDA,
                torch.bfloat16,
                (3, tokens_per_tile, args.dim),
            )


def test_padded_prefill_after_cached_prefixes_on_cuda(llama4_dir):
    """The padded prefill that image rows take (``forward_full`` with ``starts``): rows continue the prefixes their
    slots hold, with Llama 4's chunked masks across a chunk boundary; keys/values written into each row's slot."""
    with fake_cuda() as fake:
        settings = _settings(llama4_dir, None)
        args = ModelArgs.from_checkpoint(settings.checkpoint_dir)
        ensure_model_parallel(1)
        with fake:
            model = load_model_for_rank(settings, args)
            cache = model.new_cache(SLOTS, MAX_SEQ_LEN)
            starts, lengths = [30, 0, 5], [6, 9, 2]  # row 0 crosses the 32-token chunk boundary
            tokens = torch.zeros(len(starts), max(lengths), dtype=torch.long, device="cuda")  # [B, T], padded
            rows = torch.tensor([2, 0, 3], device="cuda")
            last = torch.tensor([n - 1 for n in lengths], device="cuda")
            logits = model.forward_full(tokens, cache=cache, cache_rows=rows, logit_index=last, starts=starts)
            assert (logits.device, logits.dtype, tuple(logits.shape)) == (
                CUDA,
                torch.float32,
                (len(starts), args.vocab_size),
            )
            _check_cache(cache, model, args)


def test_a_cpu_tensor_in_a_cuda_path_is_caught():
    """The harness itself: fake CUDA tensors index, and a CPU tensor meeting one raises, naming both devices."""
    with fake_cuda() as fake, fake:
        cache = torch.zeros(2, 3, 8, device="cuda")
        rows = torch.arange(2, device="cuda")
        cache[rows, :, 5] = torch.ones(2, 3, device="cuda")
        assert cache[0].device == CUDA
        with pytest.raises(FakeTensorDeviceMismatchError, match="cuda:0 and cpu"):
            cache[:, :, :4] + torch.ones(2, 3, 4)
        with pytest.raises(RuntimeError, match="device"):
            cache[torch.arange(2)] = torch.ones(2, 3, 8)  # values on the CPU
    assert not torch.cuda.is_available()  # nothing leaks out of the context
